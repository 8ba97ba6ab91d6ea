"""The causal validation of onset layers: ablation, patching, statistics, reports.

The public names of ``captum_iglens.validate`` are imported on first use (PEP 562)
from :mod:`captum_iglens.validate.driver`.
"""

from captum_iglens._utils.lazy import lazy_exports

__all__ = [
    'INTERVENTIONS', 'METRICS', 'PREDICTORS', 'ValidationResult', 'donor_sets', 'load_prompts',
    'max_reference_positions', 'prompt_lengths', 'reference_shortfall', 'validate',
]

__getattr__, __dir__ = lazy_exports(__name__, "captum_iglens.validate.driver", __all__)
