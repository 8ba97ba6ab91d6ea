"""captum_iglens: IG-Lens, exact additive probability attribution across decoder layers.

IG-Lens (arXiv:2606.29693) splits the change in a predicted token's probability into
per-layer credits that add up to it exactly, with Captum's ``Attribution`` API.
"""

from captum_iglens.compare import CompletenessReport, compare_completeness
from captum_iglens.ig_lens import METHODS, IGLens, IGLensOutput, ReadoutMismatchError
from captum_iglens.llm_attr import LLMIGLensAttribution
from captum_iglens.onset import onset_layer_indices
from captum_iglens.readout import (
    FAMILIES,
    LensReadout,
    UnknownArchitectureError,
    resolve_decoder_blocks,
    resolve_readout,
)
from captum_iglens.result import IGLensResult
from captum_iglens.text import explain, explain_ids, target_token_id

__version__ = "0.1.0"

__all__ = [
    "FAMILIES",
    "METHODS",
    "CompletenessReport",
    "IGLens",
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
    "resolve_readout",
    "target_token_id",
]
