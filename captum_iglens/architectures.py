"""Deprecated path of :mod:`captum_iglens.lens.architectures` and :mod:`~.lens.context`."""

import warnings

from captum_iglens.lens.architectures import *  # noqa: F403
from captum_iglens.lens.architectures import __all__ as _layout_names
from captum_iglens.lens.context import *  # noqa: F403
from captum_iglens.lens.context import __all__ as _context_names

__all__ = [*_layout_names, *_context_names]

warnings.warn("captum_iglens.architectures moved to captum_iglens.lens.architectures and "
              "captum_iglens.lens.context; import it from there (this alias will be removed)",
              DeprecationWarning, stacklevel=2)
