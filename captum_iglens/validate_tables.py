"""Deprecated path of :mod:`captum_iglens.validate.tables` (an alias of that module)."""

from captum_iglens._utils.lazy import alias_module

alias_module(__name__, "captum_iglens.validate.tables")
