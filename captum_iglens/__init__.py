"""captum_iglens: IG-Lens, exact additive probability attribution across decoder layers.

IG-Lens (arXiv:2606.29693) splits the change in a predicted token's probability into
per-layer credits that add up to it exactly, with Captum's ``Attribution`` API.
"""

from captum_iglens.architectures import (
    FAMILIES,
    UnknownArchitectureError,
    resolve_decoder_blocks,
    resolve_layout,
)
from captum_iglens.baselines import BASELINES
from captum_iglens.compare import compare_completeness
from captum_iglens.estimators import ESTIMATORS, METHODS
from captum_iglens.ig_lens import IGLens
from captum_iglens.llm_attr import LLMIGLensAttribution
from captum_iglens.onset import onset_layer_indices
from captum_iglens.readout import LensReadout, ReadoutMismatchError, resolve_readout
from captum_iglens.results import (
    CompletenessReport,
    IGLensLLMAttributionResult,
    IGLensOutput,
    IGLensResult,
)
from captum_iglens.text import explain, explain_ids, target_token_id

__version__ = "0.1.0"

__all__ = [
    "BASELINES",
    "ESTIMATORS",
    "FAMILIES",
    "METHODS",
    "CompletenessReport",
    "IGLens",
    "IGLensLLMAttributionResult",
    "IGLensOutput",
    "IGLensResult",
    "LLMIGLensAttribution",
    "LensReadout",
    "ReadoutMismatchError",
    "UnknownArchitectureError",
    "compare_completeness",
    "explain",
    "explain_ids",
    "onset_layer_indices",
    "resolve_decoder_blocks",
    "resolve_layout",
    "resolve_readout",
    "target_token_id",
]
