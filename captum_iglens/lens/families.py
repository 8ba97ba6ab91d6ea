"""The family table: where each transformers family keeps its parts, and its logit transform.

One :class:`ArchitectureLayout` row per ``config.model_type`` in :data:`FAMILIES`; the rules
that build each family's logit transform from its config; the generic paths and config
attributes that :mod:`captum_iglens.lens.architectures` uses for families outside the table.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Optional

import torch
from torch import Tensor, nn

__all__ = [
    "FAMILIES",
    "GENERIC_BLOCKS",
    "GENERIC_NORMS",
    "POSITION_TABLES",
    "SOFTCAP_ATTRIBUTES",
    "TRANSFORM_ATTRIBUTES",
    "UNRECORDED_GENERATION",
    "ArchitectureLayout",
    "ConfigRule",
    "HiddenDivisor",
    "LogitScale",
    "LogitTransform",
    "SoftCap",
]

#: Families whose ``generate`` passes are not the model's plain forward over the same tokens,
#: so their answers are explained by teacher forcing, not from the recorded passes
#: (``config.model_type`` -> why). transformers' RecurrentGemma resets its recurrent state only
#: for a prompt pass of more than one token: a one-token prompt continues the state a previous
#: ``generate`` call left (6% of the credits off on a tiny model).
UNRECORDED_GENERATION = {
    "recurrent_gemma": "a one-token prompt pass continues the previous call's recurrent state",
}

LogitTransform = Callable[[Tensor], Tensor]
ConfigRule = Callable[[object], Optional[LogitTransform]]


def _config_value(config: object, name: str, text: bool) -> object:
    if text and callable(getattr(config, "get_text_config", None)):
        config = config.get_text_config()  # type: ignore[attr-defined]
    return getattr(config, name, None)


@dataclass(frozen=True)
class SoftCap:
    """``tanh(logits / cap) * cap`` (in float32 if ``wide``): a picklable logit transform."""

    cap: float
    wide: bool = False

    def __call__(self, logits: Tensor) -> Tensor:
        """The soft-capped logits ``[..., V]`` (float32 if ``wide``, else their dtype)."""
        c = self.cap
        return torch.tanh((logits.float() if self.wide else logits) / c) * c


@dataclass(frozen=True)
class LogitScale:
    """``logits * factor`` (or ``logits / factor`` with ``divide``): a picklable transform."""

    factor: float
    divide: bool = False

    def __call__(self, logits: Tensor) -> Tensor:
        """The scaled logits ``[..., V]``, same dtype."""
        return logits / self.factor if self.divide else logits * self.factor


def _softcap(name: str = "final_logit_softcapping", text: bool = False,
             wide: bool = False) -> ConfigRule:
    """``tanh(logits / cap) * cap`` with ``cap = config.<name>`` (float32 logits if ``wide``)."""
    def rule(config: object) -> Optional[LogitTransform]:
        cap = _config_value(config, name, text)
        return SoftCap(float(cap), wide) if cap else None  # type: ignore[arg-type]
    return rule


def _times(name: str, text: bool = False) -> ConfigRule:
    """``logits * config.<name>`` (Cohere's ``logit_scale``, Falcon-H1's multiplier)."""
    def rule(config: object) -> Optional[LogitTransform]:
        value = _config_value(config, name, text)
        return None if value is None else LogitScale(float(value))  # type: ignore[arg-type]
    return rule


def _divided(name: str, text: bool = False) -> ConfigRule:
    """``logits / config.<name>`` (Granite's ``logits_scaling``)."""
    def rule(config: object) -> Optional[LogitTransform]:
        value = _config_value(config, name, text)
        return LogitScale(float(value), divide=True) if value else None  # type: ignore[arg-type]
    return rule


def _since(version: str, rule: ConfigRule) -> ConfigRule:
    """``rule`` where the installed transformers is ``version`` or newer, else no transform.

    For a family whose own ``forward`` gained a logit transform in a transformers release
    (AyaVisionForConditionalGeneration multiplies by its text config's ``logit_scale`` from
    5.25 on): the readout follows the model's forward of the installed release.
    """
    def versioned(config: object) -> Optional[LogitTransform]:
        import transformers
        from packaging.version import Version

        return rule(config) if Version(transformers.__version__) >= Version(version) else None
    return versioned


class HiddenDivisor(nn.Module):
    """``hidden / divisor`` before the unembedding (MiniCPM3's ``logits_scaling``)."""

    def __init__(self, divisor: float) -> None:
        """Hold ``divisor`` (a float from the config)."""
        super().__init__()
        self.divisor = divisor

    def forward(self, hidden: Tensor) -> Tensor:
        """``hidden / divisor``, same shape and dtype as ``hidden`` ``[..., d]``."""
        return hidden / self.divisor


@dataclass(frozen=True)
class ArchitectureLayout:
    """Where a family keeps its decoder blocks, final norm and pre-unembedding projection.

    Attributes:
        blocks (str): Dotted attribute path (relative to the model) of the ``nn.ModuleList``
            of decoder blocks.
        final_norm (str): Dotted path of the final norm.
        pre_unembed (tuple of str): Paths of modules applied between the final norm and the
            unembedding (OPT's ``project_out``), skipped where the attribute is ``None``.
        logit_transform (callable, optional): Builds, from the config, the map the model's
            own ``forward`` applies to its logits after the unembedding (or returns ``None``).
        norm_optional (bool): The final norm may be ``None`` (OPT-350m); for every other
            family a ``None`` norm is an error, never an identity fall-back.
        hidden_divisor (str, optional): Config attribute by which the model divides the
            normed hidden state before the unembedding (MiniCPM3).
        max_length (str, optional): Config attribute of a fixed-size position table that is
            not a learned embedding next to the blocks (GPT-J's sinusoids, MPT's ALiBi).
        refusal (str, optional): Why the package refuses this family.
    """

    blocks: str
    final_norm: str
    pre_unembed: tuple[str, ...] = ()
    logit_transform: Optional[ConfigRule] = field(default=None, compare=False)
    norm_optional: bool = False
    hidden_divisor: Optional[str] = None
    max_length: Optional[str] = None
    refusal: Optional[str] = None


def _llama(transform: Optional[ConfigRule] = None, **extra: Any) -> ArchitectureLayout:
    return ArchitectureLayout("model.layers", "model.norm", (), transform, **extra)


def _text_tower(transform: Optional[ConfigRule] = None) -> ArchitectureLayout:
    """A multimodal model whose text tower is ``model.language_model`` (no pixels passed)."""
    return ArchitectureLayout("model.language_model.layers", "model.language_model.norm", (),
                              transform)


_ALTUP = ("Gemma-3n's decoder blocks carry a stacked AltUp residual [n_copies, B, S, d], not a "
          "[B, S, d] residual stream, so there is no single residual for a lens readout")

#: One row per family: ``config.model_type`` -> layout. Each transform follows what the
#: family's own ``forward`` does (transformers 5.24): e.g. Gemma3ForConditionalGeneration does
#: not soft-cap although its text config names a cap. Families not listed here are located by
#: :func:`resolve_layout` from generic candidates; one whose config names a logit transform is
#: refused, and the run-time readout check compares the whole next-token
#: distribution.
FAMILIES: dict[str, ArchitectureLayout] = {
    **dict.fromkeys(("llama", "mistral", "mixtral", "qwen2", "qwen3", "phi3", "olmo", "olmo2",
                     "stablelm", "gemma"), _llama()),
    **dict.fromkeys(("gemma2", "gemma3_text", "gemma4_text", "vaultgemma", "nanochat"),
                    _llama(_softcap())),
    "beam": _llama(_softcap(wide=True)),  # soft-caps in float32
    "recurrent_gemma": ArchitectureLayout("model.layers", "model.final_norm", (),
                                          _softcap("logits_soft_cap")),
    **dict.fromkeys(("cohere", "cohere2", "cohere2_moe"), _llama(_times("logit_scale"))),
    **dict.fromkeys(("granite", "granite_swa", "granitemoe", "granitemoe_swa",
                     "granitemoeshared", "granitemoehybrid"), _llama(_divided("logits_scaling"))),
    "hyperclovax": _llama(_times("logits_scaling")),  # multiplies, unlike Granite
    "minicpm3": _llama(hidden_divisor="logits_scaling"),
    "falcon_h1": ArchitectureLayout("model.layers", "model.final_layernorm", (),
                                    _times("lm_head_multiplier")),
    # Their text configs name a transform that their own forward does not apply (Aya Vision's
    # forward applies its text config's logit_scale from transformers 5.25 on).
    **dict.fromkeys(("gemma3", "cohere2_vision"), _text_tower()),
    "aya_vision": _text_tower(_since("5.25", _times("logit_scale", text=True))),
    "hyperclovax_vision_v2": _text_tower(_times("logits_scaling", text=True)),
    **dict.fromkeys(("gemma4", "gemma4_unified", "paligemma"), _text_tower(_softcap(text=True))),
    **dict.fromkeys(("gemma3n", "gemma3n_text"), _llama(refusal=_ALTUP)),
    "phi": ArchitectureLayout("model.layers", "model.final_layernorm"),
    "gpt2": ArchitectureLayout("transformer.h", "transformer.ln_f"),
    # GPT-J and CodeGen index a fixed sinusoid table of max_position_embeddings rows.
    **dict.fromkeys(("gptj", "codegen"), ArchitectureLayout(
        "transformer.h", "transformer.ln_f", max_length="max_position_embeddings")),
    "gpt_bigcode": ArchitectureLayout("transformer.h", "transformer.ln_f"),
    "gpt_neo": ArchitectureLayout("transformer.h", "transformer.ln_f"),
    "falcon": ArchitectureLayout("transformer.h", "transformer.ln_f"),
    "bloom": ArchitectureLayout("transformer.h", "transformer.ln_f"),
    "mpt": ArchitectureLayout("transformer.blocks", "transformer.norm_f", max_length="max_seq_len"),
    "gpt_neox": ArchitectureLayout("gpt_neox.layers", "gpt_neox.final_layer_norm"),
    # OPT-350m: do_layer_norm_before=False -> final_layer_norm is None; project_out maps
    # hidden_size -> word_embed_proj_dim before the (tied) head.
    "opt": ArchitectureLayout(
        "model.decoder.layers", "model.decoder.final_layer_norm", ("model.decoder.project_out",),
        norm_optional=True,
    ),
}

GENERIC_BLOCKS = ("model.layers", "transformer.h", "transformer.blocks", "gpt_neox.layers",
                   "model.decoder.layers", "transformer.layers", "model.language_model.layers")
GENERIC_NORMS = ("model.norm", "transformer.ln_f", "transformer.norm_f",
                  "gpt_neox.final_layer_norm", "model.final_layernorm",
                  "model.decoder.final_layer_norm", "transformer.norm",
                  "model.language_model.norm")

#: Config attributes through which transformers families transform their logits (or the
#: normed hidden state right before the unembedding). A family outside :data:`FAMILIES` that
#: sets one is refused: only its own ``forward`` says how (Granite divides by
#: ``logits_scaling``, HyperCLOVA X multiplies).
TRANSFORM_ATTRIBUTES = ("final_logit_softcapping", "logits_soft_cap", "output_logit_soft_cap",
                         "logit_scale", "logits_scaling", "output_multiplier",
                         "lm_head_multiplier", "logits_mup_width_multiplier")
SOFTCAP_ATTRIBUTES = ("final_logit_softcapping", "logits_soft_cap", "output_logit_soft_cap")

#: Names of learned absolute position tables (``nn.Embedding``) next to the decoder blocks.
POSITION_TABLES = ("wpe", "embed_positions", "position_embeddings")
