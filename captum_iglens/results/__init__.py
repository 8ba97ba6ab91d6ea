"""Result objects: what IG-Lens and the comparison hand back, with shape checks and export.

- :class:`IGLensOutput`: one :meth:`~captum_iglens.IGLens.attribute_details` pass.
- :class:`IGLensResult`: every answer token of one prompt, with table, JSON and plots.
- :class:`CompletenessReport` / :class:`MethodCompleteness`: the Captum side by side;
  :class:`CompletenessBatch`: one report per row and position.
- :class:`IGLensLLMAttributionResult`: Captum's LLM result, with the convergence delta.
"""

from captum_iglens.results.captum_view import IGLensLLMAttributionResult
from captum_iglens.results.completeness import (
    CAPTUM_LAYER_METHODS,
    CompletenessReport,
    MethodCompleteness,
)
from captum_iglens.results.completeness_batch import CompletenessBatch
from captum_iglens.results.explanation import IGLensResult
from captum_iglens.results.output import IGLensOutput

__all__ = [
    "CAPTUM_LAYER_METHODS",
    "CompletenessBatch",
    "CompletenessReport",
    "IGLensLLMAttributionResult",
    "IGLensOutput",
    "IGLensResult",
    "MethodCompleteness",
]
