"""The benchmark's interventions on one model: rows of changed block updates, in three units.

Every intervention of the pre-registration is a set of *rows* at the explained position
``i`` (the last prompt token): a row replaces some blocks' updates ``u_L[i]`` (zero, the
other prompts' mean, a donor's, or the other run's) and reads the next-token distribution
at ``i``; the rows of one prompt are one batched single-token forward over the clean KV
cache (:meth:`~captum_iglens.validate.ablation.BlockAblation.run_plan`). The units
(:data:`UNITS`) are read from the same rows:

* ablation and the curves (answer ``y`` alone): ``p(y)``, ``log p(y)`` and the logit
  difference ``logit(y) - mean_v logit(v) = log p(y) - mean_v log p(v)`` (the softmax's
  normaliser cancels, so the full distribution gives it); a row whose distribution
  underflows to 0 somewhere has no logit difference (NaN);
* patching (answer and foil): ``p(y) - p(foil)``, ``log p(y) - log p(foil)``, and the logit
  difference, which equals the log-probability one (the normaliser cancels).

A drop is ``value(clean row) - value(changed row)``; a patching recovery ``value(patched)
- value(corrupted)``.
"""

from __future__ import annotations

from typing import Optional, Sequence

import numpy as np
import torch
from torch import Tensor

from captum_iglens.validate.ablation import BlockAblation, ResidualTrace
from captum_iglens.validate.ablation_rows import RowPlan

__all__ = ["UNITS", "answer_units", "contrast_units", "joint_masks", "masked_rows",
           "random_subsets"]

#: The metric units of the pre-registration (``metric_units``), in its order.
UNITS: tuple[str, ...] = ("probability", "log-probability", "logit difference")


def masked_rows(ablation: BlockAblation, trace: ResidualTrace, pos: int, mask: Tensor,
                repl: Optional[Tensor], ids: Tensor) -> Tensor:
    """Probabilities of ``ids`` at ``pos`` with the masked blocks' updates replaced, per row.

    Args:
        ablation (BlockAblation): On the model.
        trace (ResidualTrace): The clean forward of the sequence.
        pos (int): The explained position.
        mask (Tensor): ``[R, n]`` bool: row ``r`` replaces block ``L``'s update where
            ``mask[r, L - 1]``.
        repl (Tensor, optional): ``[R, n, d]`` replacement updates; ``None``: zeros (the
            update removed).
        ids (Tensor): ``[T]`` int64 token ids read.

    Returns:
        Tensor: ``[1 + R, T]`` probabilities, CPU (float32; float64 for a float64 model);
        row 0 the clean run, row ``1 + r`` mask row ``r`` (a row that replaces nothing
        copies the clean row).
    """
    mask = torch.as_tensor(mask, dtype=torch.bool)
    n_rows, n = mask.shape
    d = trace.hidden.shape[-1]
    if repl is None:
        repl = torch.zeros(n_rows, n, d, dtype=trace.hidden.dtype)
    changed = torch.nonzero(mask.any(1)).reshape(-1)
    if changed.numel() == 0:
        clean = ablation.run_plan(trace, pos, _clean_plan(trace, pos), ids)
        return clean[:1].expand(1 + n_rows, -1).clone()
    sub = mask[changed]
    first = sub.float().argmax(1)  # first changed block (0-based)
    start = torch.cat([torch.tensor([n + 1]), first + 1])
    rows = torch.arange(1, 1 + changed.numel())
    layers = {}
    for layer in range(1, n + 1):
        hit = sub[:, layer - 1]
        if bool(hit.any()):
            layers[layer] = (rows[hit], repl[changed[hit], layer - 1].to(trace.hidden))
    probs = ablation.run_plan(trace, pos, RowPlan(1 + changed.numel(), start, layers), ids)
    out = probs[:1].expand(1 + n_rows, -1).clone()
    out[1 + changed] = probs[1:]
    return out


def _clean_plan(trace: ResidualTrace, pos: int) -> RowPlan:
    """A plan of the clean row and one row that changes nothing effective (h_n := h_n)."""
    n = trace.hidden.shape[1] - 1
    return RowPlan(2, torch.tensor([n + 1, n]),
                   {n: (torch.tensor([1]), trace.updates[pos, n - 1][None].clone())})


def answer_units(probs: Tensor, y: int) -> dict[str, np.ndarray]:
    """The three units of ``y`` from full next-token distributions ``[R, V]`` (float64).

    Returns:
        dict: unit -> ``[R]`` float64: ``p(y)``, ``log p(y)``, ``log p(y) - mean_v log p(v)``
        (NaN where some ``p(v)`` underflowed to 0).
    """
    p = probs.double()
    with np.errstate(divide="ignore"):
        logp = torch.log(p)
    finite = torch.isfinite(logp).all(1)
    diff = logp[:, y] - torch.where(finite[:, None], logp, 0.0).mean(1)
    diff = torch.where(finite, diff, torch.nan)
    return {"probability": p[:, y].numpy(), "log-probability": logp[:, y].numpy(),
            "logit difference": diff.numpy()}


def contrast_units(probs: Tensor) -> dict[str, np.ndarray]:
    """The three units of the contrast from ``[R, 2]`` probabilities of ``(y, foil)``.

    Returns:
        dict: unit -> ``[R]`` float64: ``p(y) - p(foil)``, ``log p(y) - log p(foil)`` and
        the logit difference (the same number as the log-probability one).
    """
    p = probs.double()
    logd = (torch.log(p[:, 0]) - torch.log(p[:, 1])).numpy()
    return {"probability": (p[:, 0] - p[:, 1]).numpy(), "log-probability": logd,
            "logit difference": logd.copy()}


def joint_masks(scores: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Deletion and keep masks of a ranking: ``[n + 1, n]`` bool each.

    Row ``k`` of the deletion mask ablates the ``k`` blocks ``scores`` ranks highest (ties
    broken by block order); row ``k`` of the keep mask ablates every other block.
    NaN scores rank lowest.
    """
    scores = np.asarray(scores, np.float64)
    n = scores.shape[0]
    order = np.argsort(-np.nan_to_num(scores, nan=-np.inf), kind="stable")
    top = np.zeros((n + 1, n), bool)
    for k in range(1, n + 1):
        top[k, order[:k]] = True
    return top, ~top


def random_subsets(n: int, count: int, rng: np.random.Generator) -> np.ndarray:
    """``[count, n]`` bool: each block in with probability 1/2 (the magnitude metric's)."""
    return rng.random((count, n)) < 0.5


def vocab_ids(ablation: BlockAblation, trace: ResidualTrace) -> Tensor:
    """All token ids of the readout's vocabulary (``[V]`` int64)."""
    with torch.no_grad():
        width = ablation.readout(trace.hidden[-1:, -1].to(ablation._device())).shape[-1]
    return torch.arange(width)


def row_units(ablation: BlockAblation, trace: ResidualTrace, pos: int, masks: np.ndarray,
              repl: Optional[Tensor], y: int, foil: Optional[int] = None,
              vocab: Optional[Tensor] = None) -> dict[str, np.ndarray]:
    """Each unit's value of the clean row and of every mask row: ``[1 + R]`` per unit.

    ``foil`` given: the contrast units (:func:`contrast_units`), else the answer units
    (:func:`answer_units`, the full distribution: ``vocab`` or :func:`vocab_ids`).
    """
    mask = torch.as_tensor(np.asarray(masks, bool))
    if foil is not None:
        return contrast_units(masked_rows(ablation, trace, pos, mask, repl,
                                          torch.tensor([y, foil])))
    ids = vocab if vocab is not None else vocab_ids(ablation, trace)
    return answer_units(masked_rows(ablation, trace, pos, mask, repl, ids), y)


def stack_units(rows: Sequence[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    """Unit -> ``[N, ...]`` from a list of per-token unit dicts."""
    return {u: np.stack([r[u] for r in rows]) for u in UNITS}


def eye_masks(n: int) -> np.ndarray:
    """``[n, n]`` bool: row ``L - 1`` changes block ``L`` alone (the single-block rows)."""
    return np.eye(n, dtype=bool)
