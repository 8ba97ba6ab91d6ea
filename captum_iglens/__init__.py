"""captum_iglens: IG-Lens, exact additive probability attribution across decoder layers.

IG-Lens (arXiv:2606.29693) splits the change in a predicted token's probability into
per-layer credits that add up to it exactly, with Captum's ``Attribution`` API.
"""

from typing import TYPE_CHECKING, Any

#: Public name -> the module that defines it. Imported on first use (PEP 562), so that
#: ``iglens --help`` and ``iglens summarize`` start without importing torch or Captum.
_EXPORTS = {
    "FAMILIES": "captum_iglens.lens.architectures",
    "UnknownArchitectureError": "captum_iglens.lens.architectures",
    "resolve_decoder_blocks": "captum_iglens.lens.architectures",
    "resolve_layout": "captum_iglens.lens.architectures",
    "BASELINES": "captum_iglens._core.baselines",
    "compare_completeness": "captum_iglens.compare.driver",
    "ESTIMATORS": "captum_iglens._core.estimators",
    "METHODS": "captum_iglens._core.estimators",
    "register_estimator": "captum_iglens._core.estimators",
    "register_family": "captum_iglens.lens.registry",
    "LensSpec": "captum_iglens.lens.spec",
    "IGLens": "captum_iglens.ig_lens",
    "LLMIGLensAttribution": "captum_iglens.llm_attr",
    "onset_layer_indices": "captum_iglens._core.onset",
    "LensReadout": "captum_iglens.lens.readout",
    "LayerReadout": "captum_iglens.lens.layer_readout",
    "LogitLens": "captum_iglens.lens.layer_readout",
    "JacobianLens": "captum_iglens.lens.translators",
    "LensDigestError": "captum_iglens.lens.translators",
    "TunedLens": "captum_iglens.lens.translators",
    "load_lens": "captum_iglens.lens.translators",
    "fit_jacobian_lens": "captum_iglens.lens.fit",
    "fit_tuned_lens": "captum_iglens.lens.fit",
    "load_tuned_lens_folder": "captum_iglens.lens.fit",
    "ReadoutMismatchError": "captum_iglens.lens.readout",
    "resolve_readout": "captum_iglens.lens.readout",
    "CompletenessBatch": "captum_iglens.results",
    "CompletenessReport": "captum_iglens.results",
    "IGLensLLMAttributionResult": "captum_iglens.results",
    "IGLensOutput": "captum_iglens.results",
    "IGLensResult": "captum_iglens.results",
    "explain": "captum_iglens.text.explain_prompt",
    "explain_ids": "captum_iglens.text.explain_prompt",
    "target_token_id": "captum_iglens.text.explain_prompt",
}

if TYPE_CHECKING:  # the names as a type checker and an IDE see them
    from captum_iglens._core.baselines import BASELINES
    from captum_iglens._core.estimators import ESTIMATORS, METHODS, register_estimator
    from captum_iglens._core.onset import onset_layer_indices
    from captum_iglens.compare.driver import compare_completeness
    from captum_iglens.ig_lens import IGLens
    from captum_iglens.lens.architectures import (
        FAMILIES,
        UnknownArchitectureError,
        resolve_decoder_blocks,
        resolve_layout,
    )
    from captum_iglens.lens.fit import fit_jacobian_lens, fit_tuned_lens, load_tuned_lens_folder
    from captum_iglens.lens.layer_readout import LayerReadout, LogitLens
    from captum_iglens.lens.readout import LensReadout, ReadoutMismatchError, resolve_readout
    from captum_iglens.lens.registry import register_family
    from captum_iglens.lens.spec import LensSpec
    from captum_iglens.lens.translators import JacobianLens, LensDigestError, TunedLens, load_lens
    from captum_iglens.llm_attr import LLMIGLensAttribution
    from captum_iglens.results import (
        CompletenessBatch,
        CompletenessReport,
        IGLensLLMAttributionResult,
        IGLensOutput,
        IGLensResult,
    )
    from captum_iglens.text.explain_prompt import explain, explain_ids, target_token_id


def __getattr__(name: str) -> Any:
    """Import a public name's module on first use (PEP 562)."""
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'captum_iglens' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    """The public names, loaded or not."""
    return sorted(set(globals()) | set(_EXPORTS))


__version__ = "0.3.0.dev0"

__all__ = [
    "BASELINES",
    "ESTIMATORS",
    "FAMILIES",
    "METHODS",
    "CompletenessBatch",
    "CompletenessReport",
    "IGLens",
    "IGLensLLMAttributionResult",
    "IGLensOutput",
    "IGLensResult",
    "JacobianLens",
    "LLMIGLensAttribution",
    "LayerReadout",
    "LensDigestError",
    "LensReadout",
    "LensSpec",
    "LogitLens",
    "ReadoutMismatchError",
    "TunedLens",
    "UnknownArchitectureError",
    "compare_completeness",
    "explain",
    "explain_ids",
    "fit_jacobian_lens",
    "fit_tuned_lens",
    "load_lens",
    "load_tuned_lens_folder",
    "onset_layer_indices",
    "register_estimator",
    "register_family",
    "resolve_decoder_blocks",
    "resolve_layout",
    "resolve_readout",
    "target_token_id",
]
