"""Offline model loading: the embedded SmolLM2, named offline models, folders, GGUF.

The public names of ``captum_iglens.models`` are imported on first use (PEP 562)
from :mod:`captum_iglens.models.loading`.
"""

from captum_iglens._utils.lazy import lazy_exports

__all__ = [
    'DEFAULT_MODEL', 'CacheError', 'cache_root', 'default_gguf_path', 'load_model',
    'model_names',
]

__getattr__, __dir__ = lazy_exports(__name__, "captum_iglens.models.loading", __all__)
