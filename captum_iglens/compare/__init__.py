"""IG-Lens beside Captum's layer methods on the same inputs, with completeness.

The public names of ``captum_iglens.compare`` are imported on first use (PEP 562)
from :mod:`captum_iglens.compare.driver`.
"""

from captum_iglens._utils.lazy import lazy_exports

__all__ = [
    'COMPARE_METHODS', 'COMPARE_RUNNERS', 'CompletenessBatch', 'CompletenessReport',
    'MethodCompleteness', 'compare_completeness', 'input_baseline_ids', 'residual_tap',
    'target_probability_forward',
]

__getattr__, __dir__ = lazy_exports(__name__, "captum_iglens.compare.driver", __all__)
