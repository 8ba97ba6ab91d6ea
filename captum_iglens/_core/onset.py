"""Onset layer: from which chosen layer on a token's probability change has been produced.

Two rules, both on a token's IG-Lens credits ``c_1..c_k`` (chosen layers ``L_1..L_k``) with
cumulative sums ``C_j = c_1 + ... + c_j`` and total ``C_k = delta_p``:

- ``"sustained"`` (default): the first layer ``L_j`` from which the cumulative credit stays
  at or beyond ``frac * delta_p`` for every later layer (``s * C_j' >= s * frac * delta_p``
  for all ``j' >= j``, ``s`` the sign of ``delta_p``). When ``delta_p > 0`` it is never a
  layer with negative credit: the crossing layer raises the cumulative sum.
- ``"mass"``: the first layer at which the cumulative ``|c|`` reaches ``frac`` of the total
  ``|c|`` mass (it can sit on a layer that lowers the probability).

Where every credit is zero (``delta_p = 0`` and no mass) the onset is the first chosen layer.

The sustained rule is :func:`sustained_columns`, on any cumulative curve: the causal
validation applies the same function to ablation drops and lens levels.
"""

from __future__ import annotations

from typing import Sequence

import torch
from torch import Tensor

from captum_iglens.settings import DEFAULT_ONSET_FRAC, DEFAULT_ONSET_RULE
from captum_iglens.settings import ONSET_RULES as SETTINGS_ONSET_RULES

__all__ = ["ONSET_RULES", "onset_layer_indices", "sustained_columns"]

#: Onset rules accepted by :func:`onset_layer_indices` (:data:`captum_iglens.settings.ONSET_RULES`).
ONSET_RULES: tuple[str, ...] = SETTINGS_ONSET_RULES


def sustained_columns(cumulative: Tensor, frac: float, scale: Tensor) -> Tensor:
    """The sustained rule: the first column from which a cumulative curve stays past ``frac``.

    For ``C_1..C_k`` with end ``C_k`` and ``s`` its sign: the first ``j`` with
    ``s C_j' >= s frac C_k - 1e-12 scale`` for every ``j' >= j`` (the relative slack keeps
    a column that reaches the threshold up to float64 rounding). A NaN entry fails.

    Args:
        cumulative (Tensor): ``[..., k]`` float64 cumulative values.
        frac (float): Fraction in ``(0, 1]`` (not checked here).
        scale (Tensor): ``[..., 1]`` the magnitude the slack is relative to (the credits'
            ``sum |c|``; ``max |C|`` where only the curve is known).

    Returns:
        Tensor: ``[...]`` int64 columns (0-based); ``k - 1`` at the latest.
    """
    total = cumulative[..., -1:]
    sign = torch.where(total < 0, -1.0, 1.0).to(cumulative.dtype)
    ok = sign * cumulative >= sign * frac * total - 1e-12 * scale
    # the first index from which ok holds to the end: 1 + the last index where it fails
    failing = (~ok).to(torch.int64)
    n = cumulative.shape[-1]
    positions = torch.arange(1, n + 1, dtype=torch.int64, device=cumulative.device)
    return (failing * positions).amax(-1).clamp(max=n - 1)


def _sustained(credits: Tensor, frac: float) -> Tensor:
    return sustained_columns(credits.cumsum(-1), frac, credits.abs().sum(-1, keepdim=True))


def _mass(credits: Tensor, frac: float) -> Tensor:
    cumulative = credits.abs().cumsum(-1)
    total = cumulative[..., -1:]
    reached = cumulative >= frac * total * (1 - 1e-12)
    return reached.to(torch.int64).argmax(-1)


def onset_layer_indices(
    attributions: Tensor, layer_indices: Sequence[int], frac: float = DEFAULT_ONSET_FRAC,
    rule: str = DEFAULT_ONSET_RULE,
) -> Tensor:
    """The onset layer of each explained prediction (see the module docstring for the rules).

    Args:
        attributions (Tensor): ``[..., k]`` IG-Lens credits (probability units).
        layer_indices (sequence of int): The ``k`` hidden-state indices of the last dimension.
        frac (float, optional): Fraction in ``(0, 1]``. Default: 0.5.
        rule (str, optional): ``"sustained"`` (default) or ``"mass"``.

    Returns:
        Tensor: ``[...]`` int64 hidden-state indices (values of ``layer_indices``).

    Raises:
        ValueError: ``frac`` outside ``(0, 1]``, an unknown rule, or a last dimension that
            is not ``k``.
    """
    if not 0.0 < frac <= 1.0:
        raise ValueError(f"onset fraction must be in (0, 1], got {frac}")
    if rule not in ONSET_RULES:
        raise ValueError(f"Unknown onset rule {rule!r}: use one of {ONSET_RULES}.")
    if attributions.shape[-1] != len(layer_indices):
        raise ValueError(
            f"attributions has {attributions.shape[-1]} layers in its last dimension, "
            f"but {len(layer_indices)} layer indices were given."
        )
    credits = attributions.detach().double()
    first = _sustained(credits, frac) if rule == "sustained" else _mass(credits, frac)
    indices = torch.as_tensor(list(layer_indices), dtype=torch.int64, device=first.device)
    return indices[first]
