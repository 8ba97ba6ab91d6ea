"""One attribution's inputs, parsed and checked once at the boundary.

:meth:`PathRequest.parse` runs every check of the token ids, positions, reference ids,
forward arguments, padding and sequence length; the stages after it (capture, baseline,
estimators) trust what it holds and check nothing again.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

import torch
from torch import Tensor

from captum_iglens._core.baselines import check_reference_ids, is_reference_ids
from captum_iglens._core.inputs import (
    check_explained,
    check_not_padding,
    check_sequence_length,
    check_token_ids,
    forward_kwargs,
    normalise_positions,
    warn_if_unmasked_padding,
)
from captum_iglens._utils.typing import BaselineSpec, PositionSpec, TargetSpec
from captum_iglens.lens.architectures import unwrap_model
from captum_iglens.lens.context import context_length, max_sequence_length
from captum_iglens.lens.readout import ModelDistribution
from captum_iglens.lens.spec import LensSpec
from captum_iglens.lens.state import forward_parameters

__all__ = ["Forward", "PathRequest", "Recorded"]


@dataclass(frozen=True)
class PathRequest:
    """The checked inputs of one attribution.

    Attributes:
        input_ids (Tensor): ``[B, S]`` int64 token ids, all inside the vocabulary.
        positions (list[int]): The ``P`` explained positions (non-negative, distinct).
        single (bool): One int position was asked for (results drop the ``P`` axis).
        forward_kwargs (dict): The keyword arguments of the model's forward (attention
            mask, position ids derived from it, ``logits_to_keep`` where supported).
        mask (Tensor, optional): ``[B, S]`` attention mask (1 = real token).
        explained (Tensor, optional): ``[B, P]`` bool, the pairs to read out (``None``: all).
        reference_ids (Tensor, optional): ``[B, S]`` reference token ids (the baseline is
            then their last-block residual).
        logit_positions (tuple of int, optional): The positions whose logits the forward
            returns, in order (``logits_to_keep`` set by the lens); ``None``: all ``S``.
    """

    input_ids: Tensor
    positions: list[int]
    single: bool
    forward_kwargs: dict[str, Any]
    mask: Optional[Tensor]
    explained: Optional[Tensor]
    reference_ids: Optional[Tensor]
    logit_positions: Optional[tuple[int, ...]] = None

    @property
    def seq_len(self) -> int:
        """``S``."""
        return int(self.input_ids.shape[1])

    @property
    def position_ids(self) -> Optional[Tensor]:
        """``[B, S]`` the forward's position ids (``None``: the model's own ``0..S-1``)."""
        return self.forward_kwargs.get("position_ids")

    @classmethod
    def parse(cls, spec: LensSpec, inputs: Tensor, positions: PositionSpec,
              baselines: BaselineSpec, additional_forward_args: Any,
              explained: Optional[Tensor] = None) -> PathRequest:
        """Check the arguments of :meth:`~captum_iglens.IGLens.attribute_details` once.

        Raises:
            ValueError, TypeError: bad token ids, positions, reference ids, forward
                arguments or ``explained``; an explained position that is padding; a
                sequence longer than the model can position (see
                :mod:`captum_iglens._core.inputs`).
        """
        model, vocab = spec.model, spec.vocab_size
        inputs = check_token_ids(inputs, vocab)
        reference = (check_reference_ids(baselines, inputs, vocab)
                     if is_reference_ids(baselines) else None)
        pos_list, single = normalise_positions(positions, inputs.shape[1])
        params = forward_parameters(model)
        kwargs, mask = forward_kwargs(params, inputs, additional_forward_args)
        check_sequence_length(max_sequence_length(model), inputs, kwargs,
                              context=context_length(model))
        explained = check_explained(explained, inputs.shape[0], len(pos_list))
        check_not_padding(mask, pos_list, explained)
        config = getattr(unwrap_model(model), "config", None)
        warn_if_unmasked_padding(inputs, pos_list, getattr(config, "pad_token_id", None), mask)
        kept = _keep_explained_logits(kwargs, params, pos_list, inputs)
        return cls(input_ids=inputs, positions=pos_list, single=single, forward_kwargs=kwargs,
                   mask=mask, explained=explained, reference_ids=reference,
                   logit_positions=kept)


@dataclass(frozen=True)
class Forward:
    """A teacher-forced request: the model runs over ``inputs`` (as ``IGLens.attribute``).

    Attributes:
        inputs (Tensor): ``[B, S]`` int64 token ids.
        target: Target ids (``None``: the model's argmax at each explained position).
        positions: The explained positions (an int drops the ``P`` axis of the result).
        additional_forward_args: Attention mask, keyword dict or Captum-style tuple.
        contrast: Foil ids, or ``None``.
        explained (Tensor, optional): ``[B, P]`` bool, the pairs read out (ragged rows).
    """

    inputs: Tensor
    target: TargetSpec = None
    positions: PositionSpec = -1
    additional_forward_args: Any = None
    contrast: TargetSpec = None
    explained: Optional[Tensor] = None

    def parse(self, spec: LensSpec, baselines: BaselineSpec) -> PathRequest:
        """This request checked once (:meth:`PathRequest.parse`)."""
        return PathRequest.parse(spec, self.inputs, self.positions, baselines,
                                 self.additional_forward_args, self.explained)


@dataclass(frozen=True)
class Recorded:
    """Residuals recorded by another pass (generation, a document chunk): no forward here.

    Attributes:
        states (dict[int, Tensor]): ``{l: h_l}``, ``[B, P, d]`` at the explained positions
            (``[B, S, d]`` for those :func:`layers_to_record` needs whole).
        distribution (ModelDistribution): The model's own distribution ``[B, P, V]`` there.
        positions (list[int]): The ``P`` explained columns.
        target: Target ids ``[B, P]``.
        seq_len (int): ``S``.
        contrast: Foil ids ``[B, P]``, or ``None``.
        mask (Tensor, optional): ``[B, S]`` attention mask.
        explained (Tensor, optional): ``[B, P]`` bool, the pairs read out.
        start (str or Tensor, optional): The path start, in place of ``settings.baselines``
            (a document chunk's running mean ``[1, P, d]``); ``None``: the settings'.
        start_name (str, optional): What the output records as its baseline with ``start``.
    """

    states: dict[int, Tensor] = field(repr=False)
    distribution: ModelDistribution = field(repr=False)
    positions: list[int]
    target: TargetSpec
    seq_len: int
    contrast: TargetSpec = None
    mask: Optional[Tensor] = None
    explained: Optional[Tensor] = None
    start: Optional[BaselineSpec] = None
    start_name: Optional[str] = None


#: The forward arguments that make a causal LM return logits at some positions only.
KEEP_ARGUMENTS = ("logits_to_keep", "num_logits_to_keep")


def _keep_explained_logits(kwargs: dict[str, Any], params: Any, positions: list[int],
                           inputs: Tensor) -> Optional[tuple[int, ...]]:
    """Let the model unembed the explained positions only; the positions it will return.

    A ``logits_to_keep`` / ``num_logits_to_keep`` the caller passed is replaced: only the
    explained positions' logits are needed (for the readout check), and which logits the
    model returns changes none of them. Forwards that take neither get none.
    """
    for name in KEEP_ARGUMENTS:
        kwargs.pop(name, None)
    if len(positions) < inputs.shape[1] and "logits_to_keep" in params:
        kwargs["logits_to_keep"] = torch.tensor(positions, device=inputs.device)
        return tuple(positions)
    return None
