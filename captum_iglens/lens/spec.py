"""The lens specification: what IG-Lens needs from a model, resolved once.

:class:`LensSpec` is built once by :meth:`LensSpec.from_model` (the body of
``IGLens(model, ...)``) and handed to every stage of the computation, which reads the
model's parts and facts from it instead of inspecting the model again.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from typing import Optional, Sequence, Union

import torch
from torch import nn

from captum_iglens._utils.typing import LayerSpec, Readout
from captum_iglens.lens.architectures import (
    display_name,
    input_embeddings,
    model_type,
    resolve_decoder_blocks,
    strip_parallel,
    vocab_size,
)
from captum_iglens.lens.changes import ModelStructure
from captum_iglens.lens.families import ArchitectureLayout, family_row
from captum_iglens.lens.layer_readout import LayerReadout, LogitLens, at_layer, is_per_layer
from captum_iglens.lens.layers import resolve_layer_indices
from captum_iglens.lens.readout import resolve_readout
from captum_iglens.lens.state import execution_device, model_dtype
from captum_iglens.lens.sublayer import HalfBlockSite, HeadSite, half_block_site, head_site
from captum_iglens.settings import (
    DEFAULT_EFFECT,
    DEFAULT_GRANULARITY,
    DEFAULT_LENS,
    DEFAULT_UNITS,
    EFFECTS,
    GRANULARITIES,
    UNITS,
)

__all__ = ["LensSpec", "check_granularity", "sublayer_node_indices"]


@dataclass(frozen=True)
class LensSpec:
    """A causal LM's parts and the chosen path nodes, resolved and checked once.

    Attributes:
        model (nn.Module): The causal LM (``DataParallel``/DDP wrappers stripped).
        decoder_blocks (nn.ModuleList): Its ``n`` decoder blocks.
        readout (callable): Pre-final-norm residual ``[..., d]`` -> logits ``[..., V]``.
        layer_indices (tuple of int): The chosen hidden-state indices ``0 <= L_1 < ... <
            L_k = n`` (Section 3 of arXiv:2606.29693).
        structure (ModelStructure): The blocks, where their list sits in the model, the
            final norm and head as built, to notice a model changed after the lens was
            built (relative to the model, so that copies of the lens pass).
        units (str): ``"probability"`` or ``"log-probability"`` (nats).
        check_readout (bool): Check the readout against the model on every call.
        granularity (str): ``"block"`` or ``"sublayer"``.
        heads (bool): Split sub-layer attention credits over the heads.
        half_site (HalfBlockSite, optional): Where ``L.attn`` lives (sub-layer only).
        head_site (HeadSite, optional): Where the heads meet (``heads=True`` only).
        effect (str): What a credit measures: ``"readout"``, ``"total"`` or ``"atp"``.
        lens (LayerReadout): The readout seam ``lens(h, layer)``: by default
            :class:`~captum_iglens.lens.layer_readout.LogitLens` of ``readout`` (every layer
            read by the model's own readout); a per-layer readout otherwise (see
            :meth:`readout_at`).
    """

    model: nn.Module = field(repr=False)
    decoder_blocks: nn.ModuleList = field(repr=False)
    readout: Readout = field(repr=False)
    layer_indices: tuple[int, ...]
    structure: ModelStructure = field(repr=False, compare=False)
    units: str = DEFAULT_UNITS
    check_readout: bool = True
    granularity: str = DEFAULT_GRANULARITY
    heads: bool = False
    half_site: Optional[HalfBlockSite] = None
    head_site: Optional[HeadSite] = None
    effect: str = DEFAULT_EFFECT
    lens: LayerReadout = field(default=None, repr=False, compare=False)  # type: ignore[assignment]

    def __post_init__(self) -> None:
        """Default the seam to the model's own readout at every layer."""
        if self.lens is None:
            object.__setattr__(self, "lens", LogitLens(self.readout))

    @property
    def per_layer(self) -> bool:
        """Whether layers are read by a per-layer readout (not the logit lens)."""
        return is_per_layer(self.lens)

    def readout_at(self, layer: int) -> Readout:
        """The readout of hidden-state index ``layer``: ``h -> lens(h, layer)``.

        The last layer ``n`` is always read by the model's own :attr:`readout` (Invariant R
        is checked on it), whatever the seam.
        """
        if layer == self.num_layers or not self.per_layer:
            return self.readout
        return at_layer(self.lens, layer, self.vocab_size)

    @classmethod
    def from_model(
        cls,
        model: nn.Module,
        layers: LayerSpec = None,
        readout: Optional[Readout] = None,
        decoder_blocks: Optional[nn.ModuleList] = None,
        check_readout: bool = True,
        units: str = DEFAULT_UNITS,
        granularity: str = DEFAULT_GRANULARITY,
        heads: bool = False,
        effect: str = DEFAULT_EFFECT,
        lens: Union[None, str, LayerReadout] = None,
    ) -> LensSpec:
        """Locate the blocks and readout, resolve the layers and check every setting.

        Arguments are those of :class:`~captum_iglens.IGLens`; ``lens`` is a per-layer
        readout ``lens(h, layer) -> logits`` (:class:`~captum_iglens.lens.layer_readout.
        LayerReadout`; default: the model's own readout at every layer) or a name:
        ``"logit"`` (the default), ``"tuned"`` or ``"jacobian"`` (the newest lens of that
        kind fitted for this model, :func:`~captum_iglens.lens.fit.named_lens`).

        Raises:
            UnknownArchitectureError: the decoder blocks or final norm cannot be located.
            ValueError: a layer out of range, given twice or not a decoder block; unknown
                ``units``, ``granularity`` or ``effect``; ``heads=True`` without sub-layer
                nodes; a per-layer ``lens`` with sub-layer nodes or another effect than
                ``"readout"``.
            TypeError: a layer of another type; a ``lens`` that is not callable.
            SublayerUnsupportedError: sub-layer nodes (or heads) for a family whose
                half-block residual (or head split) is not known.
        """
        check_granularity(granularity, heads)
        if units not in UNITS:
            raise ValueError(f"units={units!r}: use one of {UNITS}.")
        if effect not in EFFECTS:
            raise ValueError(f"effect={effect!r}: use one of {EFFECTS}.")
        if isinstance(lens, str):
            lens = _named_lens(model, lens)
        if lens is not None:
            _check_lens(lens, granularity, effect)
            _check_lens_digest(lens, model)
        model = strip_parallel(model)
        blocks = decoder_blocks if decoder_blocks is not None else resolve_decoder_blocks(model)
        located = readout is None
        readout = resolve_readout(model) if readout is None else readout
        sub = granularity == "sublayer"
        return cls(
            model=model, decoder_blocks=blocks, readout=readout,
            layer_indices=resolve_layer_indices(layers, blocks, input_embeddings(model)),
            structure=ModelStructure.of(model, blocks, readout, located=located),
            units=units, check_readout=check_readout, granularity=granularity, heads=heads,
            half_site=half_block_site(model, blocks) if sub else None,
            head_site=head_site(model, blocks) if heads else None, effect=effect,
            lens=lens,  # type: ignore[arg-type]
        )

    @property
    def num_layers(self) -> int:
        """``n``, the number of decoder blocks."""
        return len(self.decoder_blocks)

    @property
    def node_indices(self) -> tuple[int, ...]:
        """The credited nodes: ``layer_indices``, or the sub-layer node indices.

        With ``granularity="sublayer"``: 0 for the embedding, ``2L - 1`` for ``L.attn`` and
        ``2L`` for ``L.mlp``; :func:`~captum_iglens._utils.format.layer_names` names them.
        """
        if self.granularity == "sublayer":
            return sublayer_node_indices(self.layer_indices)
        return self.layer_indices

    @cached_property
    def vocab_size(self) -> Optional[int]:
        """``V``, the vocabulary size (``None`` when the config does not say; read once)."""
        return vocab_size(self.model)

    @cached_property
    def model_type(self) -> str:
        """``config.model_type`` (wrappers unwrapped), else the class name (read once)."""
        return model_type(self.model)

    @cached_property
    def family(self) -> Optional[ArchitectureLayout]:
        """The family's row in :data:`~captum_iglens.lens.families.FAMILIES` (read once).

        ``None`` for a family outside the table.
        """
        return family_row(self.model_type)

    @cached_property
    def input_embeddings(self) -> Optional[nn.Module]:
        """``model.get_input_embeddings()``, or ``None`` where there is none (read once)."""
        return input_embeddings(self.model)

    @property
    def readout_device(self) -> Optional[torch.device]:
        """Where the readout computes (read on each access: the model may have moved)."""
        return execution_device(self.readout) if isinstance(self.readout, nn.Module) else None

    @property
    def dtype(self) -> torch.dtype:
        """The model's floating-point dtype (read on each access: the model may be cast)."""
        return model_dtype(self.model)

    @cached_property
    def display_name(self) -> str:
        """The model's name for results and reports (never a local path; read once)."""
        return display_name(self.model)

    @property
    def recordable(self) -> bool:
        """Whether residuals recorded while generating can serve the path (block nodes)."""
        return self.granularity == "block" and self.effect == DEFAULT_EFFECT


def _named_lens(model: nn.Module, name: str) -> Optional[LayerReadout]:
    """``"logit"`` -> None (the default seam); a fitted kind -> its cached lens."""
    if name == DEFAULT_LENS:
        return None
    from captum_iglens.lens.fit import named_lens

    return named_lens(model, name)


def _check_lens(lens: object, granularity: str, effect: str) -> None:
    """Refuse a per-layer readout that is not callable, or where it is not defined yet."""
    if not callable(lens):
        raise TypeError(f"lens must be callable as lens(hidden, layer) -> logits, got "
                        f"{type(lens).__name__}.")
    if is_per_layer(lens) and (granularity != "block" or effect != DEFAULT_EFFECT):
        raise ValueError("A per-layer readout (lens=...) reads block nodes h_L: use "
                         "granularity='block' and effect='readout' with it.")


def _check_lens_digest(lens: object, model: nn.Module) -> None:
    """Refuse a fitted lens (one that carries a weights digest) of another model.

    Raises:
        LensDigestError: ``lens.digest`` is not ``model``'s weights digest.
    """
    digest = getattr(lens, "digest", "")
    if not digest:
        return
    from captum_iglens.lens.translators import LensDigestError
    from captum_iglens.lens.weights import weights_digest

    mine = weights_digest(model)
    if digest != mine:
        raise LensDigestError(
            f"This lens was fitted on the model with weights digest {digest}, not on this one "
            f"({mine}): its translators and readout belong to that model. Fit one for this "
            "model (iglens fit-lens) or load the right model.")


def check_granularity(granularity: object, heads: object) -> None:
    """Refuse an unknown granularity, or head credits without sub-layer nodes.

    Raises:
        ValueError: ``granularity`` not in :data:`~captum_iglens.settings.GRANULARITIES`,
            or ``heads=True`` with ``granularity="block"``.
        TypeError: ``heads`` not a bool.
    """
    if granularity not in GRANULARITIES:
        raise ValueError(f"granularity={granularity!r}: use one of {GRANULARITIES}.")
    if not isinstance(heads, bool):
        raise TypeError(f"heads must be True or False, got {heads!r}.")
    if heads and granularity != "sublayer":
        raise ValueError("heads=True splits the attention credit of sub-layer paths over the "
                         "heads: pass granularity='sublayer' with it.")


def sublayer_node_indices(layer_indices: Sequence[int]) -> tuple[int, ...]:
    """The node indices of a sub-layer path: ``0 -> (0,)``, ``L -> (2L - 1, 2L)``."""
    out: list[int] = []
    for index in layer_indices:
        out.extend((0,) if index == 0 else (2 * index - 1, 2 * index))
    return tuple(out)
