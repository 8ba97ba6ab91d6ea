"""The family table: one row per transformers family, holding every fact IG-Lens reads.

One :class:`ArchitectureLayout` row per ``config.model_type`` in :data:`FAMILIES`: where the
family keeps its parts, its logit transform, its half-block residual (sub-layer nodes), its
head split, whether its generation can be recorded and whether its KV cache can carry a
document; :func:`~captum_iglens.lens.registry.register_family` takes such a row whole. Also
the rules that build each family's logit transform or half-block site from its config, and
the generic paths and config attributes that :mod:`captum_iglens.lens.architectures` uses for
families outside the table.
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
    "UNCACHED_DOCUMENTS",
    "UNRECORDED_GENERATION",
    "ArchitectureLayout",
    "ConfigRule",
    "HalfBlockSite",
    "HiddenDivisor",
    "LogitScale",
    "LogitTransform",
    "SoftCap",
    "SiteRule",
    "family_row",
    "site_of",
]

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
class HalfBlockSite:
    """How to read ``L.attn`` (after attention, before the MLP) of one family.

    Attributes:
        kind (str): ``"input"`` (the input of ``module``) or ``"parallel"`` (the block's
            input plus the first output of ``module``, its attention).
        module (str): Attribute name of the submodule in the decoder block.
    """

    kind: str
    module: str


#: A half-block site, or a rule that picks it from the config (``None``: not defined).
SiteRule = Callable[[object], Optional[HalfBlockSite]]


@dataclass(frozen=True)
class _Switched:
    """Parallel or sequential by a config flag: ``(flag, parallel module, sequential norm)``.

    ``also`` names a second flag that makes the block parallel too (Falcon's
    ``new_decoder_architecture``); ``default`` is the flag's value when the config lacks it.
    """

    flag: str
    attention: str
    norm: str
    default: bool = False
    also: Optional[str] = None

    def __call__(self, config: object) -> HalfBlockSite:
        parallel = bool(getattr(config, self.also, False)) if self.also else False
        if parallel or getattr(config, self.flag, self.default):
            return HalfBlockSite("parallel", self.attention)
        return HalfBlockSite("input", self.norm)


@dataclass(frozen=True)
class _PreNormOnly:
    """Sequential when ``flag`` is true (pre-norm OPT), undefined otherwise (post-norm)."""

    flag: str
    module: str

    def __call__(self, config: object) -> Optional[HalfBlockSite]:
        return HalfBlockSite("input", self.module) if getattr(config, self.flag, True) else None


@dataclass(frozen=True)
class ArchitectureLayout:
    """One family's row: where it keeps its parts and every fact IG-Lens reads about it.

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
        half_block (HalfBlockSite or callable, optional): Where ``L.attn`` lives, for
            ``granularity="sublayer"`` (a rule ``config -> HalfBlockSite or None`` where a
            config flag decides); ``None``: sub-layer credits are refused for the family.
        heads (tuple of str, optional): ``(attention, projection)``: the block's attention
            adds ``<attention>.<projection>`` (an ``nn.Linear``) of the concatenated heads to
            the residual as it is, so ``heads=True`` can split its credit; ``None``: refused.
        unrecorded (str, optional): Why the residuals recorded while the family generates are
            not its plain forward over the same tokens (answers are then teacher-forced);
            ``None``: recordable.
        uncached (str, optional): Why its KV cache cannot carry a document from one chunk to
            the next (documents are then re-run per chunk); ``None``: cached.
    """

    blocks: str
    final_norm: str
    pre_unembed: tuple[str, ...] = ()
    logit_transform: Optional[ConfigRule] = field(default=None, compare=False)
    norm_optional: bool = False
    hidden_divisor: Optional[str] = None
    max_length: Optional[str] = None
    refusal: Optional[str] = None
    half_block: Optional[HalfBlockSite | SiteRule] = field(default=None, compare=False)
    heads: Optional[tuple[str, str]] = None
    unrecorded: Optional[str] = None
    uncached: Optional[str] = None


def site_of(row: ArchitectureLayout, config: object) -> Optional[HalfBlockSite]:
    """The half-block site ``row`` names for a model of ``config`` (``None``: undefined)."""
    site = row.half_block
    if site is None or isinstance(site, HalfBlockSite):
        return site
    return site(config)


def _llama(transform: Optional[ConfigRule] = None, **extra: Any) -> ArchitectureLayout:
    return ArchitectureLayout("model.layers", "model.norm", (), transform, **extra)


def _text_tower(transform: Optional[ConfigRule] = None, **extra: Any) -> ArchitectureLayout:
    """A multimodal model whose text tower is ``model.language_model`` (no pixels passed)."""
    return ArchitectureLayout("model.language_model.layers", "model.language_model.norm", (),
                              transform, **extra)


def _gpt(blocks: str = "transformer.h", norm: str = "transformer.ln_f",
         **extra: Any) -> ArchitectureLayout:
    return ArchitectureLayout(blocks, norm, **extra)


_ALTUP = ("Gemma-3n's decoder blocks carry a stacked AltUp residual [n_copies, B, S, d], not a "
          "[B, S, d] residual stream, so there is no single residual for a lens readout")
# transformers' RecurrentGemma resets its recurrent state only for a prompt pass of more
# than one token: a one-token prompt continues the state a previous generate call left (6%
# of the credits off on a tiny model).
_UNRECORDED_RECURRENT = "a one-token prompt pass continues the previous call's recurrent state"
_UNCACHED_RECURRENT = ("its recurrent state restarts at every pass of more than one token, and "
                       "its forward hands back no cache")

# Half-block sites (see captum_iglens.lens.sublayer): the MLP's pre-norm of sequential
# blocks, the pre-feed-forward norm of sandwich-norm blocks, the attention of parallel ones.
_POST_ATTN = HalfBlockSite("input", "post_attention_layernorm")
_PRE_FF = HalfBlockSite("input", "pre_feedforward_layernorm")
_LN_2 = HalfBlockSite("input", "ln_2")
_PARALLEL_SELF_ATTN = HalfBlockSite("parallel", "self_attn")
_PARALLEL_ATTN = HalfBlockSite("parallel", "attn")
_O_PROJ = ("self_attn", "o_proj")

#: One row per family: ``config.model_type`` -> its :class:`ArchitectureLayout`. Each
#: transform follows what the family's own ``forward`` does (transformers 5.24): e.g.
#: Gemma3ForConditionalGeneration does not soft-cap although its text config names a cap.
#: Families not listed here are located by :func:`resolve_layout` from generic candidates;
#: one whose config names a logit transform is refused, and the run-time readout check
#: compares the whole next-token distribution. Hybrids (Falcon-H1, GraniteMoeHybrid,
#: RecurrentGemma), whose mixer is not always attention, and post-norm OPT have no
#: half-block site.
FAMILIES: dict[str, ArchitectureLayout] = {
    **dict.fromkeys(("llama", "mistral", "mixtral", "qwen2", "qwen3", "phi3", "olmo", "gemma"),
                    _llama(half_block=_POST_ATTN, heads=_O_PROJ)),
    "olmo2": _llama(half_block=HalfBlockSite("input", "mlp")),  # its MLP has no pre-norm
    "stablelm": _llama(half_block=_Switched("use_parallel_residual", "self_attn",
                                            "post_attention_layernorm")),
    **dict.fromkeys(("gemma2", "gemma3_text", "gemma4_text", "vaultgemma"),
                    _llama(_softcap(), half_block=_PRE_FF)),
    "nanochat": _llama(_softcap(), half_block=_POST_ATTN),
    "beam": _llama(_softcap(wide=True), half_block=_PRE_FF),  # soft-caps in float32
    "recurrent_gemma": ArchitectureLayout("model.layers", "model.final_norm", (),
                                          _softcap("logits_soft_cap"),
                                          unrecorded=_UNRECORDED_RECURRENT,
                                          uncached=_UNCACHED_RECURRENT),
    **dict.fromkeys(("cohere", "cohere2", "cohere2_moe"),
                    _llama(_times("logit_scale"), half_block=_PARALLEL_SELF_ATTN)),
    **dict.fromkeys(("granite", "granite_swa", "granitemoe", "granitemoe_swa",
                     "granitemoeshared"),
                    _llama(_divided("logits_scaling"), half_block=_POST_ATTN)),
    "granitemoehybrid": _llama(_divided("logits_scaling")),
    "hyperclovax": _llama(_times("logits_scaling"),  # multiplies, unlike Granite
                          half_block=_POST_ATTN),
    "minicpm3": _llama(hidden_divisor="logits_scaling"),
    "falcon_h1": ArchitectureLayout("model.layers", "model.final_layernorm", (),
                                    _times("lm_head_multiplier")),
    # Their text configs name a transform that their own forward does not apply (Aya Vision's
    # forward applies its text config's logit_scale from transformers 5.25 on).
    "gemma3": _text_tower(half_block=_PRE_FF),
    "cohere2_vision": _text_tower(),
    "aya_vision": _text_tower(_since("5.25", _times("logit_scale", text=True))),
    "hyperclovax_vision_v2": _text_tower(_times("logits_scaling", text=True)),
    **dict.fromkeys(("gemma4", "gemma4_unified", "paligemma"), _text_tower(_softcap(text=True))),
    **dict.fromkeys(("gemma3n", "gemma3n_text"), _llama(refusal=_ALTUP)),
    "phi": ArchitectureLayout("model.layers", "model.final_layernorm",
                              half_block=_PARALLEL_SELF_ATTN),
    "gpt2": _gpt(half_block=_LN_2),
    # GPT-J and CodeGen index a fixed sinusoid table of max_position_embeddings rows.
    **dict.fromkeys(("gptj", "codegen"), _gpt(max_length="max_position_embeddings",
                                              half_block=_PARALLEL_ATTN)),
    "gpt_bigcode": _gpt(half_block=_LN_2),
    "gpt_neo": _gpt(half_block=_LN_2),
    "falcon": _gpt(half_block=_Switched("parallel_attn", "self_attention",
                                        "post_attention_layernorm", default=True,
                                        also="new_decoder_architecture")),
    # BLOOM's attention output already includes the residual: the input of its
    # post-attention norm is that sum.
    "bloom": _gpt(half_block=_POST_ATTN),
    "mpt": _gpt("transformer.blocks", "transformer.norm_f", max_length="max_seq_len",
                half_block=HalfBlockSite("input", "norm_2")),
    "gpt_neox": ArchitectureLayout(
        "gpt_neox.layers", "gpt_neox.final_layer_norm",
        half_block=_Switched("use_parallel_residual", "attention", "post_attention_layernorm")),
    # OPT-350m: do_layer_norm_before=False -> final_layer_norm is None; project_out maps
    # hidden_size -> word_embed_proj_dim before the (tied) head. Pre-norm OPT reads L.attn at
    # the input of final_layer_norm (the MLP's pre-norm); post-norm OPT has no site.
    "opt": ArchitectureLayout(
        "model.decoder.layers", "model.decoder.final_layer_norm", ("model.decoder.project_out",),
        norm_optional=True, half_block=_PreNormOnly("do_layer_norm_before", "final_layer_norm"),
    ),
}

#: The built-in families whose generation is not recorded (``model_type`` -> why): a view of
#: the rows' ``unrecorded``; code reads the row (:func:`family_row`), so registered families
#: count too.
UNRECORDED_GENERATION = {k: r.unrecorded for k, r in FAMILIES.items() if r.unrecorded}
#: The built-in families whose documents are re-run per chunk (``model_type`` -> why): a view
#: of the rows' ``uncached``.
UNCACHED_DOCUMENTS = {k: r.uncached for k, r in FAMILIES.items() if r.uncached}


def family_row(model_type: str) -> Optional[ArchitectureLayout]:
    """The row of ``config.model_type`` (registered families included), else ``None``."""
    return FAMILIES.get(model_type)


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
