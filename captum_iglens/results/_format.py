"""Moved to :mod:`captum_iglens._format` (a leaf outside ``results``); kept for old imports."""

from captum_iglens._format import *  # noqa: F401,F403
from captum_iglens._format import __all__  # noqa: F401
