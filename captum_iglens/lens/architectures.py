"""Where a causal LM keeps its decoder blocks, final norm, unembedding and logit transform.

Every architecture-specific fact of the package is looked up here, from one row per family
in :data:`FAMILIES` (keyed by ``config.model_type``, in :mod:`captum_iglens.lens.families`). The
lens readout (:mod:`captum_iglens.lens.readout`), the residual-stream capture
(:mod:`captum_iglens.lens.hooks`) and the Captum comparison all locate model parts through this
module. Models wrapped by ``torch.compile`` or an adapter are inspected through
:func:`unwrap_model`; the longest input a model can position is :func:`max_sequence_length`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from torch import nn

from captum_iglens.lens.families import (
    FAMILIES,
    GENERIC_BLOCKS,
    GENERIC_NORMS,
    SOFTCAP_ATTRIBUTES,
    TRANSFORM_ATTRIBUTES,
    ArchitectureLayout,
    HiddenDivisor,
    LogitTransform,
)

__all__ = [
    "FAMILIES",
    "ArchitectureLayout",
    "ModelParts",
    "UnknownArchitectureError",
    "strip_parallel",
    "display_name",
    "input_embeddings",
    "locate_parts",
    "model_type",
    "resolve_decoder_blocks",
    "resolve_layout",
    "unwrap_model",
    "vocab_size",
]

class UnknownArchitectureError(ValueError):
    """Raised when the decoder blocks or the final norm of a model cannot be located."""


def unwrap_model(model: nn.Module) -> nn.Module:
    """The model inside compile and adapter wrappers (``model`` itself when it wraps none).

    ``torch.compile(model)`` (``_orig_mod``), PEFT adapters (``get_base_model()``) and
    ``functools``-style wrappers (``__wrapped__``) hide ``forward``'s signature behind
    ``(*args, **kwargs)`` and the model's parts behind other attribute paths. The package keeps
    *calling* the wrapper (so compiled code and adapters run) but inspects the inner model.
    """
    inner = strip_parallel(model)
    for _ in range(8):  # wrappers of wrappers; never loops on a self-reference
        nxt = getattr(inner, "_orig_mod", None)
        if not isinstance(nxt, nn.Module):
            get_base = getattr(inner, "get_base_model", None)
            nxt = get_base() if callable(get_base) else getattr(inner, "__wrapped__", None)
        if not isinstance(nxt, nn.Module) or nxt is inner:
            break
        inner = nxt
    return inner


#: Multi-device wrappers whose ``module`` is the model: IG-Lens runs the inner model itself.
PARALLEL_WRAPPERS: tuple[type, ...] = (nn.DataParallel, nn.parallel.DistributedDataParallel)


def strip_parallel(model: nn.Module) -> nn.Module:
    """The model inside ``nn.DataParallel`` / ``DistributedDataParallel`` (else ``model``).

    These wrappers exist to split a training batch across devices and to synchronise
    gradients; attribution needs neither, and their ``forward(*inputs, **kwargs)`` hides the
    model's signature (a left-padded row then lost its ``position_ids``), their replicas do
    not run the hooks that capture the residual stream, and they have no ``generate``. Every
    entry point (``IGLens``, ``explain``, ``compare_completeness``, ``run_records``,
    ``validate``) runs the wrapped model itself, on the device it lives on.
    """
    inner = model
    while isinstance(inner, PARALLEL_WRAPPERS):
        inner = inner.module  # type: ignore[assignment]  # a wrapper's .module is an nn.Module
    return inner


_MISSING = object()


def _get_path(root: nn.Module, path: str) -> object:
    obj: object = root
    for part in path.split("."):
        obj = getattr(obj, part, _MISSING)
        if obj is _MISSING:
            return _MISSING
    return obj


def model_type(model: nn.Module) -> str:
    """``config.model_type`` of a Hugging Face model (wrappers unwrapped), else its class name."""
    inner = unwrap_model(model)
    return str(getattr(getattr(inner, "config", None), "model_type", type(inner).__name__))


def _fits(model: nn.Module, layout: ArchitectureLayout) -> bool:
    blocks = _get_path(model, layout.blocks)
    norm = _get_path(model, layout.final_norm)
    return isinstance(blocks, nn.ModuleList) and len(blocks) > 0 and (
        isinstance(norm, nn.Module) or (norm is None and layout.norm_optional))


_DECODER_ONLY = ("IG-Lens explains decoder-only causal language models (Llama, GPT-2, Qwen, "
                 "Gemma, ...), whose residual stream at a position ends in the next-token "
                 "prediction")


def _not_a_model(obj: object) -> str:
    """What a non-module passed as the model is, and what to pass instead."""
    name = type(obj).__name__
    if all(callable(getattr(obj, attr, None)) for attr in ("encode", "decode")):
        return (f"IGLens(model) takes the model, got a tokenizer ({name}): are the arguments "
                "swapped? Build the lens from the model alone, IGLens(model), and give the "
                "tokenizer to explain(model, tokenizer, prompt) or use it to make the token "
                "ids that IGLens.attribute takes.")
    return (f"IGLens(model) takes a causal LM (an nn.Module such as "
            f"AutoModelForCausalLM.from_pretrained(...)), got {name}.")


def _stripped(layout: ArchitectureLayout) -> Optional[ArchitectureLayout]:
    """The layout one level down (``model.layers`` -> ``layers``): a base model's paths."""
    parts = [path.split(".", 1) for path in (layout.blocks, layout.final_norm)]
    if any(len(p) != 2 for p in parts) or parts[0][0] != parts[1][0]:
        return None
    return ArchitectureLayout(parts[0][1], parts[1][1], norm_optional=layout.norm_optional)


def _wrong_model(inner: nn.Module, kind: str,
                 candidates: list[ArchitectureLayout]) -> Optional[str]:
    """The mistake behind a model whose parts cannot be located, where it is a known one.

    A base model without its language-model head (``IGLens(model.model)``), an
    encoder-decoder model (T5, BART) and an encoder (BERT, RoBERTa) are each named, with
    what to pass instead; None for a model the generic message (pass ``readout=`` and
    ``decoder_blocks=``) fits.
    """
    name, config = type(inner).__name__, getattr(inner, "config", None)
    if getattr(config, "is_encoder_decoder", False):
        return (f"{name} (model_type={kind!r}) is an encoder-decoder model: {_DECODER_ONLY}. "
                "Load a decoder-only model with AutoModelForCausalLM.")
    if kind in _ENCODER_TYPES or name.endswith(("ForMaskedLM", "ForSequenceClassification")):
        return (f"{name} (model_type={kind!r}) is an encoder (a bidirectional, masked-language "
                f"model), not a causal LM: {_DECODER_ONLY}. Load a decoder-only model with "
                "AutoModelForCausalLM.")
    base = [lay for lay in map(_stripped, candidates) if lay is not None and _fits(inner, lay)]
    if base:
        head = getattr(inner, "get_output_embeddings", None)
        if not callable(head) or head() is None:
            return (f"{name} (model_type={kind!r}) is a base model without its language-model "
                    "head: IG-Lens reads the next-token probability through the final norm and "
                    "the unembedding (lm_head). Pass the causal LM that holds both, "
                    "IGLens(model) rather than IGLens(model.model), e.g. "
                    "AutoModelForCausalLM.from_pretrained(...).")
    return None


#: Encoder (bidirectional) families of transformers, refused by name.
_ENCODER_TYPES = frozenset((
    "albert", "bert", "big_bird", "camembert", "convbert", "data2vec-text", "deberta",
    "deberta-v2", "distilbert", "electra", "ernie", "esm", "flaubert", "funnel", "ibert",
    "layoutlm", "longformer", "megatron-bert", "mobilebert", "modernbert", "mpnet", "nezha",
    "nystromformer", "rembert", "roberta", "roberta-prelayernorm", "roc_bert", "roformer",
    "squeezebert", "xlm", "xlm-roberta", "xlm-roberta-xl", "xmod", "yoso"))


def resolve_layout(model: nn.Module) -> ArchitectureLayout:
    """Return the :class:`ArchitectureLayout` of ``model`` (wrappers unwrapped).

    Known families (``config.model_type`` in :data:`FAMILIES`) use their row; other models
    are matched against generic block / final-norm paths (text towers of multimodal models,
    ``model.language_model``, included).

    Raises:
        UnknownArchitectureError: if the family is refused (its row says why), or no row fits,
            naming every path tried and how to pass ``readout=`` and ``decoder_blocks=`` to
            :class:`~captum_iglens.IGLens` instead.
    """
    if not isinstance(model, nn.Module):
        raise TypeError(_not_a_model(model))
    inner, kind = unwrap_model(model), model_type(model)
    row = FAMILIES.get(kind)
    if row is not None and row.refusal:
        raise UnknownArchitectureError(
            f"{type(inner).__name__} (model_type={kind!r}) is not supported: {row.refusal}.")
    candidates = [row] if row is not None else [
        ArchitectureLayout(b, n) for b in GENERIC_BLOCKS for n in GENERIC_NORMS
    ]
    for layout in candidates:
        if _fits(inner, layout):
            return layout
    mistake = _wrong_model(inner, kind, candidates)
    if mistake:
        raise UnknownArchitectureError(mistake)
    tried_blocks = [row.blocks] if row is not None else list(GENERIC_BLOCKS)
    tried_norms = [row.final_norm] if row is not None else list(GENERIC_NORMS)
    raise UnknownArchitectureError(
        f"Cannot locate the decoder blocks and final norm of a {type(inner).__name__} "
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
    blocks = _get_path(unwrap_model(model), resolve_layout(model).blocks)
    assert isinstance(blocks, nn.ModuleList)
    return blocks


@dataclass(frozen=True)
class ModelParts:
    """The modules after the last decoder block, located in one model.

    Attributes:
        final_norm (nn.Module or None): The final norm (``None`` only for OPT-350m-style
            layouts, which have none).
        pre_unembed (tuple of nn.Module): Projections (or MiniCPM3's division) before the
            unembedding.
        unembed (nn.Module): ``model.get_output_embeddings()``, bias included.
        logit_transform (callable or None): Soft-capping or scaling applied to the logits.
        name (str): The architecture name, for error messages.
    """

    final_norm: Optional[nn.Module]
    pre_unembed: tuple[nn.Module, ...]
    unembed: nn.Module
    logit_transform: Optional[LogitTransform]
    name: str


def _refuse_unknown_transform(model: nn.Module, kind: str) -> None:
    """Refuse a family outside the table whose config names a logit transform."""
    config = getattr(model, "config", None)
    configs = [config]
    if callable(getattr(config, "get_text_config", None)):
        configs.append(config.get_text_config())  # type: ignore[union-attr]
    for cfg in configs:
        for name in TRANSFORM_ATTRIBUTES:
            value = getattr(cfg, name, None)
            if value is None or value is False or value == 0 or (
                    value == 1 and name not in SOFTCAP_ATTRIBUTES):
                continue
            raise UnknownArchitectureError(
                f"{type(model).__name__} (model_type={kind!r}) is not in the family table and "
                f"its config sets {name}={value!r}: the model transforms its logits in a way "
                "only its own forward defines, and a readout without it would be silently "
                "wrong. Pass IGLens(model, readout=...) with a readout that maps a "
                "pre-final-norm residual [..., d] to the model's own logits [..., V]."
            )


def locate_parts(model: nn.Module) -> ModelParts:
    """Locate the final norm, pre-unembedding projections, unembedding and logit transform.

    Raises:
        UnknownArchitectureError: if the final norm or the unembedding cannot be located, or
            the family is outside :data:`FAMILIES` and its config names a logit transform.
    """
    layout, inner, kind = resolve_layout(model), unwrap_model(model), model_type(model)
    if kind not in FAMILIES:
        _refuse_unknown_transform(inner, kind)
    get_out = getattr(inner, "get_output_embeddings", None)
    unembed = get_out() if callable(get_out) else None
    if not isinstance(unembed, nn.Module):
        raise UnknownArchitectureError(
            f"{type(inner).__name__}.get_output_embeddings() returned {unembed!r}, not an "
            "unembedding module. Pass IGLens(model, readout=...) with your own readout."
        )
    norm = _get_path(inner, layout.final_norm)
    pre = tuple(
        m for m in (_get_path(inner, p) for p in layout.pre_unembed) if isinstance(m, nn.Module)
    )
    config = getattr(inner, "config", None)
    if layout.hidden_divisor is not None:
        pre += (HiddenDivisor(float(getattr(config, layout.hidden_divisor))),)
    transform = layout.logit_transform(config) if layout.logit_transform is not None else None
    return ModelParts(norm if isinstance(norm, nn.Module) else None, pre, unembed, transform, kind)


#: Config attributes that name the context length a model was trained for.
CONTEXT_ATTRIBUTES = ("max_position_embeddings", "n_positions", "max_seq_len", "seq_length")


def display_name(model: nn.Module) -> str:
    """The model's name for results: the last part of ``config._name_or_path``.

    A local folder's path would reveal the user's directory layout in shared result files,
    so only its last component is kept; without a name, ``config.model_type``.
    """
    config = getattr(unwrap_model(model), "config", None)
    raw = str(getattr(config, "_name_or_path", "") or "")
    if not raw:
        return model_type(model)
    parts = [p for p in raw.replace("\\", "/").split("/") if p]
    local = raw.startswith(("/", ".", "~")) or len(parts) > 2
    return parts[-1] if local and parts else raw


def input_embeddings(model: nn.Module) -> Optional[nn.Module]:
    """``model.get_input_embeddings()`` (wrappers unwrapped), or ``None`` where there is none."""
    get_in = getattr(unwrap_model(model), "get_input_embeddings", None)
    emb = get_in() if callable(get_in) else None
    return emb if isinstance(emb, nn.Module) else None


def vocab_size(model: nn.Module) -> Optional[int]:
    """Size of the input vocabulary, read from shapes (valid on ``meta`` parameters too).

    The embedding's ``num_embeddings`` where there is one, else ``config.vocab_size``;
    ``None`` when neither is known.
    """
    size = getattr(input_embeddings(model), "num_embeddings", None)
    if size is None:
        size = getattr(getattr(unwrap_model(model), "config", None), "vocab_size", None)
    return int(size) if size is not None else None
