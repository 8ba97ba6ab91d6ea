"""The lens readout ``f_y(h) = softmax(unembed(final_norm(h)))[y]`` (DESIGN.md section 1).

The readout reproduces, from a *pre-final-norm* residual-stream vector, exactly what the
model itself does after its last decoder block: the final norm, any projection before the
unembedding (OPT's ``project_out``), the unembedding (``lm_head`` with its bias, if any) and
any transformation of the logits (Gemma-2/3 soft-capping, Cohere's ``logit_scale``,
Granite's ``logits_scaling``). Invariant R: ``f_y(h_n[pos])`` equals the model's own
``softmax(logits[pos])[y]``; :class:`~captum_iglens.IGLens` checks it on every call.

Every architecture-specific fact lives in :data:`FAMILIES`, one row per family.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Optional, Sequence

import torch
from torch import Tensor, nn

__all__ = [
    "FAMILIES",
    "ArchitectureLayout",
    "LensReadout",
    "UnknownArchitectureError",
    "resolve_decoder_blocks",
    "resolve_layout",
    "resolve_readout",
]


class UnknownArchitectureError(ValueError):
    """Raised when the decoder blocks or the final norm of a model cannot be located."""


def _softcap(cap: float) -> Callable[[Tensor], Tensor]:
    return lambda logits: cap * torch.tanh(logits / cap)


def _scale(factor: float) -> Callable[[Tensor], Tensor]:
    return lambda logits: logits * factor


@dataclass(frozen=True)
class ArchitectureLayout:
    """Where a family keeps its decoder blocks, final norm and pre-unembedding projection.

    Paths are dotted attribute paths relative to the ``*ForCausalLM`` model. ``final_norm``
    may name an attribute that is ``None`` on some configs (OPT-350m) only where
    ``norm_optional`` is set: the readout then has no final norm, which is what the model does
    too; for every other family a ``None`` norm is an error, never an identity fall-back.
    ``logit_transform`` builds the map the model applies to its logits after the
    unembedding, from the config (or returns ``None``).
    """

    blocks: str
    final_norm: str
    pre_unembed: tuple[str, ...] = ()
    logit_transform: Optional[Callable[[object], Optional[Callable[[Tensor], Tensor]]]] = (
        field(default=None, compare=False)
    )
    norm_optional: bool = False


def _gemma2_softcap(config: object) -> Optional[Callable[[Tensor], Tensor]]:
    cap = getattr(config, "final_logit_softcapping", None)
    return _softcap(float(cap)) if cap else None


def _cohere_scale(config: object) -> Optional[Callable[[Tensor], Tensor]]:
    scale = getattr(config, "logit_scale", None)
    return _scale(float(scale)) if scale is not None else None


def _granite_scale(config: object) -> Optional[Callable[[Tensor], Tensor]]:
    div = getattr(config, "logits_scaling", None)
    return _scale(1.0 / float(div)) if div else None


_LLAMA_LIKE = ArchitectureLayout(blocks="model.layers", final_norm="model.norm")

#: One row per family: ``config.model_type`` -> layout. Families not listed here are
#: located by :func:`resolve_layout` from the generic candidates below, and the run-time
#: check of Invariant R catches any post-processing that a generic layout would miss.
FAMILIES: dict[str, ArchitectureLayout] = {
    "llama": _LLAMA_LIKE,
    "mistral": _LLAMA_LIKE,
    "mixtral": _LLAMA_LIKE,
    "qwen2": _LLAMA_LIKE,
    "qwen3": _LLAMA_LIKE,
    "phi3": _LLAMA_LIKE,
    "olmo": _LLAMA_LIKE,
    "olmo2": _LLAMA_LIKE,
    "stablelm": _LLAMA_LIKE,
    "gemma": _LLAMA_LIKE,
    "gemma2": ArchitectureLayout("model.layers", "model.norm", (), _gemma2_softcap),
    "gemma3_text": ArchitectureLayout("model.layers", "model.norm", (), _gemma2_softcap),
    "cohere": ArchitectureLayout("model.layers", "model.norm", (), _cohere_scale),
    "granite": ArchitectureLayout("model.layers", "model.norm", (), _granite_scale),
    "phi": ArchitectureLayout("model.layers", "model.final_layernorm"),
    "gpt2": ArchitectureLayout("transformer.h", "transformer.ln_f"),
    "gptj": ArchitectureLayout("transformer.h", "transformer.ln_f"),
    "gpt_neo": ArchitectureLayout("transformer.h", "transformer.ln_f"),
    "falcon": ArchitectureLayout("transformer.h", "transformer.ln_f"),
    "bloom": ArchitectureLayout("transformer.h", "transformer.ln_f"),
    "mpt": ArchitectureLayout("transformer.blocks", "transformer.norm_f"),
    "gpt_neox": ArchitectureLayout("gpt_neox.layers", "gpt_neox.final_layer_norm"),
    # OPT-350m: do_layer_norm_before=False -> final_layer_norm is None; project_out maps
    # hidden_size -> word_embed_proj_dim before the (tied) head.
    "opt": ArchitectureLayout(
        "model.decoder.layers", "model.decoder.final_layer_norm", ("model.decoder.project_out",),
        norm_optional=True,
    ),
}

_GENERIC_BLOCKS = ("model.layers", "transformer.h", "transformer.blocks", "gpt_neox.layers",
                   "model.decoder.layers", "transformer.layers")
_GENERIC_NORMS = ("model.norm", "transformer.ln_f", "transformer.norm_f",
                  "gpt_neox.final_layer_norm", "model.final_layernorm",
                  "model.decoder.final_layer_norm", "transformer.norm")

_MISSING = object()


def _get_path(root: nn.Module, path: str) -> object:
    obj: object = root
    for part in path.split("."):
        obj = getattr(obj, part, _MISSING)
        if obj is _MISSING:
            return _MISSING
    return obj


def _model_type(model: nn.Module) -> str:
    return str(getattr(getattr(model, "config", None), "model_type", type(model).__name__))


def resolve_layout(model: nn.Module) -> ArchitectureLayout:
    """Return the :class:`ArchitectureLayout` of ``model``.

    Known families (``config.model_type`` in :data:`FAMILIES`) use their row; other models
    are matched against generic block / final-norm paths.

    Raises:
        UnknownArchitectureError: if no row fits, naming every path tried and how to pass
            ``readout=`` and ``decoder_blocks=`` to :class:`~captum_iglens.IGLens` instead.
    """
    model_type = _model_type(model)
    row = FAMILIES.get(model_type)
    candidates = [row] if row is not None else [
        ArchitectureLayout(b, n) for b in _GENERIC_BLOCKS for n in _GENERIC_NORMS
    ]
    for layout in candidates:
        blocks = _get_path(model, layout.blocks)
        norm = _get_path(model, layout.final_norm)
        if isinstance(blocks, nn.ModuleList) and len(blocks) > 0 and (
            isinstance(norm, nn.Module) or (norm is None and layout.norm_optional)
        ):
            return layout
    tried_blocks = [row.blocks] if row is not None else list(_GENERIC_BLOCKS)
    tried_norms = [row.final_norm] if row is not None else list(_GENERIC_NORMS)
    raise UnknownArchitectureError(
        f"Cannot locate the decoder blocks and final norm of a {type(model).__name__} "
        f"(model_type={model_type!r}). Tried decoder-block paths {tried_blocks} and final-norm "
        f"paths {tried_norms}. Pass IGLens(model, readout=..., decoder_blocks=...) with a "
        "readout that maps a pre-final-norm residual [..., d] to the model's logits [..., V] "
        "and the nn.ModuleList of decoder blocks."
    )


class LensReadout(nn.Module):
    """The logit lens of a causal LM: pre-final-norm residual -> the model's own logits.

    Args:
        final_norm (nn.Module or None): The model's final norm (``None`` only for
            architectures without one, such as OPT-350m).
        unembed (nn.Module): The unembedding (``model.get_output_embeddings()``), bias
            included.
        pre_unembed (sequence of nn.Module, optional): Modules applied between the final norm
            and the unembedding (OPT's ``project_out``).
        logit_transform (callable, optional): The map the model applies to its logits
            (soft-capping, scaling), in the model's dtype.
        name (str, optional): The architecture name, used in error messages.

    ``forward(h)`` maps ``h`` of shape ``[..., d]`` (any dtype the model runs in) to logits
    ``[..., V]`` in the model's dtype; :meth:`target_probs` returns float32 (float64 for a
    float64 model) probabilities.
    """

    def __init__(
        self,
        final_norm: Optional[nn.Module],
        unembed: nn.Module,
        pre_unembed: Sequence[nn.Module] = (),
        logit_transform: Optional[Callable[[Tensor], Tensor]] = None,
        name: str = "",
    ) -> None:
        super().__init__()
        self.final_norm = final_norm
        self.pre_unembed = nn.ModuleList(pre_unembed)
        self.unembed = unembed
        self.logit_transform = logit_transform
        self.name = name

    def forward(self, hidden: Tensor) -> Tensor:
        if self.final_norm is not None:
            hidden = self.final_norm(hidden)
        for module in self.pre_unembed:
            hidden = module(hidden)
        logits = self.unembed(hidden)
        if self.logit_transform is not None:
            logits = self.logit_transform(logits)
        return logits


def resolve_readout(model: nn.Module) -> LensReadout:
    """Build the :class:`LensReadout` of a Hugging Face causal LM.

    The unembedding comes from ``model.get_output_embeddings()``; the final norm, any
    pre-unembedding projection and the logit transform from :func:`resolve_layout`.

    Raises:
        UnknownArchitectureError: if the final norm or the unembedding cannot be located.
    """
    layout = resolve_layout(model)
    get_out = getattr(model, "get_output_embeddings", None)
    unembed = get_out() if callable(get_out) else None
    if not isinstance(unembed, nn.Module):
        raise UnknownArchitectureError(
            f"{type(model).__name__}.get_output_embeddings() returned {unembed!r}, not an "
            "unembedding module. Pass IGLens(model, readout=...) with your own readout."
        )
    norm = _get_path(model, layout.final_norm)
    pre = [m for m in (_get_path(model, p) for p in layout.pre_unembed) if isinstance(m, nn.Module)]
    config = getattr(model, "config", None)
    transform = layout.logit_transform(config) if layout.logit_transform is not None else None
    return LensReadout(
        norm if isinstance(norm, nn.Module) else None,
        unembed,
        pre,
        transform,
        name=_model_type(model),
    )


def resolve_decoder_blocks(model: nn.Module) -> nn.ModuleList:
    """Return the ``nn.ModuleList`` of decoder blocks of ``model`` (see :func:`resolve_layout`)."""
    blocks = _get_path(model, resolve_layout(model).blocks)
    assert isinstance(blocks, nn.ModuleList)
    return blocks
