"""References ``r_L`` of the total-effect gates: block ``L``'s update at ``i`` when ``g = 0``.

* ``"zero"``: ``r_L = 0`` (the update removed; with every block gated ``F(0) = f(h_0[i])``).
* ``"mean"``: the causal running mean of the update ``u_L = h_L - h_{L-1}`` over the earlier
  positions ``q < i`` of ``i``'s own document (packed documents told apart by restarting
  ``position_ids``), padding and the document's first position left out: the first position
  is an attention sink whose update can be hundreds of times larger than elsewhere, which is
  why the block ablation's reference set
  (:func:`captum_iglens.validate.ablation.mean_updates`) leaves position 0 out too. Nothing at
  or after ``i`` is read.
* reference token ids ``x'`` (shaped like the inputs): ``r_L = u_L(x')[i]``, the update the
  corrupted prompt's clean forward makes at ``i``.
"""

from __future__ import annotations

from typing import Optional, Sequence

import torch
from torch import Tensor

from captum_iglens._core.baselines import document_starts

__all__ = ["REFERENCE_DESCRIPTIONS", "TOTAL_REFERENCES", "causal_update_mean",
           "reference_updates", "running_update_mean", "sequence_references"]

#: Named references of the total-effect gates (reference token ids are the third kind).
TOTAL_REFERENCES: tuple[str, ...] = ("mean", "zero")

#: What each reference is, in words, for tables and JSON.
REFERENCE_DESCRIPTIONS: dict[str, str] = {
    "mean": "every gated block's update at the position set to its causal running mean over "
            "the earlier positions of the document (first position, the attention sink, left "
            "out)",
    "zero": "every gated block's update at the position removed",
    "reference ids": "every gated block's update at the position set to the reference "
                     "prompt's update there",
}


def running_update_mean(updates: Tensor, mask: Optional[Tensor],
                        position_ids: Optional[Tensor]) -> tuple[Tensor, Tensor]:
    """The ``"mean"`` reference at every position: mean update over the earlier positions.

    Args:
        updates (Tensor): ``[B, S, k, d]`` block updates ``u_L`` of the clean forward.
        mask (Tensor, optional): ``[B, S]`` attention mask (1: real token).
        position_ids (Tensor, optional): ``[B, S]`` (where they restart, a document begins).

    Returns:
        (mean, count): ``[B, S, k, d]`` in ``updates``'s dtype (accumulated in float64; 0
        where no earlier position counts) and ``[B, S]`` float64 how many positions each
        mean averages (padding, each document's first position and everything at or after
        the position left out).
    """
    batch, seq_len = updates.shape[:2]
    starts = document_starts(position_ids, (batch, seq_len), updates.device)
    weight = (torch.ones(batch, seq_len, dtype=torch.float64, device=updates.device)
              if mask is None else mask.to(device=updates.device, dtype=torch.float64))
    cols = torch.arange(seq_len, device=updates.device).expand(batch, seq_len)
    first_real = (weight > 0).long().argmax(-1, keepdim=True)
    weight = weight * (cols != starts) * (cols != first_real)  # sinks and padding out
    # running sums over the columns (float64), read at [start, i): sum(< i) - sum(< start)
    zero = updates.new_zeros(batch, 1, *updates.shape[2:], dtype=torch.float64)
    total = torch.cat([zero, (updates.double() * weight[..., None, None]).cumsum(1)], dim=1)
    count = torch.cat([weight.new_zeros(batch, 1), weight.cumsum(1)], dim=1)
    index = (slice(None), slice(None), *([None] * (updates.dim() - 2)))
    cols_start = starts.expand(batch, seq_len)
    n = count[:, :seq_len] - count.gather(1, cols_start)
    ends = [t.gather(1, i[index].expand(-1, -1, *updates.shape[2:]))
            for t, i in ((total, cols), (total, cols_start))]
    mean = (ends[0] - ends[1]) / n.clamp(min=1)[index]
    return mean.to(updates.dtype), n


def causal_update_mean(updates: Tensor, positions: Sequence[int], mask: Optional[Tensor],
                       position_ids: Optional[Tensor]) -> Tensor:
    """The mean update over the earlier positions of each explained position's document.

    Args:
        updates (Tensor): ``[B, S, k, d]`` block updates ``u_L`` of the clean forward.
        positions (sequence of int): The ``P`` explained positions.
        mask (Tensor, optional): ``[B, S]`` attention mask (1: real token).
        position_ids (Tensor, optional): ``[B, S]`` (where they restart, a document begins).

    Returns:
        Tensor: ``[B, P, k, d]`` in ``updates``'s dtype (accumulated in float64).

    Raises:
        ValueError: an explained position with no earlier position of its document but the
            first, naming it and what to use instead.
    """
    mean, count = running_update_mean(updates, mask, position_ids)
    pos = list(positions)
    empty = (count[:, pos] == 0).nonzero()
    if empty.numel():
        b, j = empty[0].tolist()
        raise ValueError(
            f"The 'mean' reference at position {positions[j]} of row {b} averages the block "
            "updates of the earlier positions of its document, leaving out the first (the "
            "attention sink), and there are none: explain a later position, or use "
            "baselines='zero' or reference token ids.")
    return mean[:, pos]


def reference_updates(baselines: object, updates: Tensor, reference: Optional[Tensor],
                      positions: Sequence[int], mask: Optional[Tensor],
                      position_ids: Optional[Tensor]) -> tuple[Tensor, str]:
    """``r_L`` at every explained position: ``[B, P, k, d]``, and the reference's name.

    Args:
        baselines: ``"zero"``, ``"mean"`` or reference token ids (already captured).
        updates (Tensor): ``[B, S, k, d]`` clean updates ``u_L``.
        reference (Tensor, optional): ``[B, P, k, d]`` updates of the reference ids at the
            explained positions.
        positions (sequence of int): The ``P`` explained positions.
        mask (Tensor, optional): ``[B, S]`` attention mask.
        position_ids (Tensor, optional): ``[B, S]`` position ids.

    Raises:
        ValueError: another baseline (``"embedding"`` or a residual tensor has no meaning
            as a block update), or the ``"mean"`` reference's error.
    """
    if reference is not None:
        return reference, "reference ids"
    if isinstance(baselines, str) and baselines == "zero":
        return updates.new_zeros(updates.shape[0], len(positions), *updates.shape[2:]), "zero"
    if isinstance(baselines, str) and baselines == "mean":
        return causal_update_mean(updates, positions, mask, position_ids), "mean"
    raise ValueError(
        f"baselines={baselines!r} is not a reference of the total effect: a gate sets each "
        f"block's update to its reference, one of {TOTAL_REFERENCES} or the update of "
        "reference token ids (an integer tensor shaped like inputs); residual-space "
        "baselines ('embedding', tensors) belong to effect='readout'.")


def sequence_references(baselines: object, updates: Tensor, reference: Optional[Tensor],
                        mask: Optional[Tensor], position_ids: Optional[Tensor]
                        ) -> tuple[Tensor, Tensor]:
    """``r_L[q]`` at every position ``q``, for ``scope="sequence"``, and where it is defined.

    Args:
        baselines: ``"zero"``, ``"mean"`` or reference token ids (already captured).
        updates (Tensor): ``[B, S, k, d]`` clean updates.
        reference (Tensor, optional): ``[B, S, k, d]`` updates of the reference ids.
        mask (Tensor, optional): ``[B, S]`` attention mask.
        position_ids (Tensor, optional): ``[B, S]`` position ids.

    Returns:
        (refs, defined): ``[B, S, k, d]`` and ``[B, S]`` bool. Positions where ``defined``
        is False (padding; for ``"mean"`` each document's first two positions, which have
        no earlier position but the attention sink) keep their clean updates: their gates
        are held at 1.

    Raises:
        ValueError: as :func:`reference_updates`.
    """
    real = (torch.ones(updates.shape[:2], dtype=torch.bool, device=updates.device)
            if mask is None else mask.to(updates.device).bool())
    if reference is not None:
        return reference, real
    if isinstance(baselines, str) and baselines == "zero":
        return torch.zeros_like(updates), real
    if isinstance(baselines, str) and baselines == "mean":
        mean, count = running_update_mean(updates, mask, position_ids)
        return mean, real & (count > 0)
    reference_updates(baselines, updates, None, [], mask, position_ids)  # raises ValueError
    raise AssertionError("reference_updates refuses every other baseline")
