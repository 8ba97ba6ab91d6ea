"""Deprecated path of :mod:`captum_iglens.lens.hooks` (an alias of that module)."""

from captum_iglens._lazy import alias_module

alias_module(__name__, "captum_iglens.lens.hooks")
