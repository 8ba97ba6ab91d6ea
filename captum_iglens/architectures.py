"""Where a causal LM keeps its decoder blocks, final norm, unembedding and logit transform.

Every architecture-specific fact of the package lives here, one row per family in
:data:`FAMILIES` (keyed by ``config.model_type``). The lens readout (:mod:`captum_iglens.readout`),
the residual-stream capture (:mod:`captum_iglens.residual`) and the Captum comparison all
locate model parts through this module.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Optional

import torch
from torch import Tensor, nn

__all__ = [
    "FAMILIES",
    "ArchitectureLayout",
    "ModelParts",
    "UnknownArchitectureError",
    "display_name",
    "input_embeddings",
    "locate_parts",
    "model_type",
    "resolve_decoder_blocks",
    "resolve_layout",
    "vocab_size",
]

LogitTransform = Callable[[Tensor], Tensor]


class UnknownArchitectureError(ValueError):
    """Raised when the decoder blocks or the final norm of a model cannot be located."""


def _softcap(cap: float) -> LogitTransform:
    return lambda logits: cap * torch.tanh(logits / cap)


def _scale(factor: float) -> LogitTransform:
    return lambda logits: logits * factor


@dataclass(frozen=True)
class ArchitectureLayout:
    """Where a family keeps its decoder blocks, final norm and pre-unembedding projection.

    Attributes:
        blocks (str): Dotted attribute path (relative to the ``*ForCausalLM`` model) of the
            ``nn.ModuleList`` of decoder blocks.
        final_norm (str): Dotted path of the final norm.
        pre_unembed (tuple of str): Paths of modules applied between the final norm and the
            unembedding (OPT's ``project_out``), skipped where the attribute is ``None``.
        logit_transform (callable, optional): Builds, from the config, the map the model
            applies to its logits after the unembedding (or returns ``None``).
        norm_optional (bool): The final norm may be ``None`` (OPT-350m); for every other
            family a ``None`` norm is an error, never an identity fall-back.
    """

    blocks: str
    final_norm: str
    pre_unembed: tuple[str, ...] = ()
    logit_transform: Optional[Callable[[object], Optional[LogitTransform]]] = field(
        default=None, compare=False
    )
    norm_optional: bool = False


def _gemma2_softcap(config: object) -> Optional[LogitTransform]:
    cap = getattr(config, "final_logit_softcapping", None)
    return _softcap(float(cap)) if cap else None


def _cohere_scale(config: object) -> Optional[LogitTransform]:
    scale = getattr(config, "logit_scale", None)
    return _scale(float(scale)) if scale is not None else None


def _granite_scale(config: object) -> Optional[LogitTransform]:
    div = getattr(config, "logits_scaling", None)
    return _scale(1.0 / float(div)) if div else None


_LLAMA_LIKE = ArchitectureLayout(blocks="model.layers", final_norm="model.norm")

#: One row per family: ``config.model_type`` -> layout. Families not listed here are
#: located by :func:`resolve_layout` from generic candidates, and the run-time readout check
#: catches any post-processing that a generic layout would miss.
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


def model_type(model: nn.Module) -> str:
    """``config.model_type`` of a Hugging Face model, else its class name."""
    return str(getattr(getattr(model, "config", None), "model_type", type(model).__name__))


def resolve_layout(model: nn.Module) -> ArchitectureLayout:
    """Return the :class:`ArchitectureLayout` of ``model``.

    Known families (``config.model_type`` in :data:`FAMILIES`) use their row; other models
    are matched against generic block / final-norm paths.

    Raises:
        UnknownArchitectureError: if no row fits, naming every path tried and how to pass
            ``readout=`` and ``decoder_blocks=`` to :class:`~captum_iglens.IGLens` instead.
    """
    kind = model_type(model)
    row = FAMILIES.get(kind)
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
        f"(model_type={kind!r}). Tried decoder-block paths {tried_blocks} and final-norm "
        f"paths {tried_norms}. Pass IGLens(model, readout=..., decoder_blocks=...) with a "
        "readout that maps a pre-final-norm residual [..., d] to the model's logits [..., V] "
        "and the nn.ModuleList of decoder blocks."
    )


def resolve_decoder_blocks(model: nn.Module) -> nn.ModuleList:
    """Return the ``nn.ModuleList`` of decoder blocks of ``model`` (see :func:`resolve_layout`).

    Raises:
        UnknownArchitectureError: as :func:`resolve_layout`.
    """
    blocks = _get_path(model, resolve_layout(model).blocks)
    assert isinstance(blocks, nn.ModuleList)
    return blocks


@dataclass(frozen=True)
class ModelParts:
    """The modules after the last decoder block, located in one model.

    Attributes:
        final_norm (nn.Module or None): The final norm (``None`` only for OPT-350m-style
            layouts, which have none).
        pre_unembed (tuple of nn.Module): Projections before the unembedding.
        unembed (nn.Module): ``model.get_output_embeddings()``, bias included.
        logit_transform (callable or None): Soft-capping or scaling applied to the logits.
        name (str): The architecture name, for error messages.
    """

    final_norm: Optional[nn.Module]
    pre_unembed: tuple[nn.Module, ...]
    unembed: nn.Module
    logit_transform: Optional[LogitTransform]
    name: str


def locate_parts(model: nn.Module) -> ModelParts:
    """Locate the final norm, pre-unembedding projections, unembedding and logit transform.

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
    pre = tuple(
        m for m in (_get_path(model, p) for p in layout.pre_unembed) if isinstance(m, nn.Module)
    )
    config = getattr(model, "config", None)
    transform = layout.logit_transform(config) if layout.logit_transform is not None else None
    return ModelParts(
        norm if isinstance(norm, nn.Module) else None, pre, unembed, transform, model_type(model)
    )


def display_name(model: nn.Module) -> str:
    """The model's name for results: the last part of ``config._name_or_path``.

    A local folder's path would reveal the user's directory layout in shared result files,
    so only its last component is kept; without a name, ``config.model_type``.
    """
    raw = str(getattr(getattr(model, "config", None), "_name_or_path", "") or "")
    if not raw:
        return model_type(model)
    parts = [p for p in raw.replace("\\", "/").split("/") if p]
    local = raw.startswith(("/", ".", "~")) or len(parts) > 2
    return parts[-1] if local and parts else raw


def input_embeddings(model: nn.Module) -> Optional[nn.Module]:
    """``model.get_input_embeddings()``, or ``None`` where the model has none."""
    get_in = getattr(model, "get_input_embeddings", None)
    emb = get_in() if callable(get_in) else None
    return emb if isinstance(emb, nn.Module) else None


def vocab_size(model: nn.Module) -> Optional[int]:
    """Size of the input vocabulary, read from shapes (valid on ``meta`` parameters too).

    The embedding's ``num_embeddings`` where there is one, else ``config.vocab_size``;
    ``None`` when neither is known.
    """
    size = getattr(input_embeddings(model), "num_embeddings", None)
    if size is None:
        size = getattr(getattr(model, "config", None), "vocab_size", None)
    return int(size) if size is not None else None
