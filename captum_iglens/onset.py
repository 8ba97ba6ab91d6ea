"""Onset layer: where the bulk of a token's probability change is produced (DESIGN.md s. 1)."""

from __future__ import annotations

from typing import Sequence

import torch
from torch import Tensor

__all__ = ["onset_layer_indices"]


def onset_layer_indices(
    attributions: Tensor, layer_indices: Sequence[int], frac: float = 0.5
) -> Tensor:
    """The earliest chosen layer at which cumulative ``|IGL|`` reaches ``frac`` of the total.

    Args:
        attributions (Tensor): ``[..., k]`` IG-Lens credits (probability units).
        layer_indices (sequence of int): The ``k`` hidden-state indices of the last dimension.
        frac (float, optional): Mass fraction in ``(0, 1]``. Default: 0.5.

    Returns:
        Tensor: ``[...]`` int64 hidden-state indices. Where all credits are zero the onset is
        the first chosen layer.

    Raises:
        ValueError: if ``frac`` is outside ``(0, 1]`` or the last dimension is not ``k``.
    """
    if not 0.0 < frac <= 1.0:
        raise ValueError(f"onset fraction must be in (0, 1], got {frac}")
    if attributions.shape[-1] != len(layer_indices):
        raise ValueError(
            f"attributions has {attributions.shape[-1]} layers in its last dimension, "
            f"but {len(layer_indices)} layer indices were given."
        )
    mass = attributions.detach().abs().double()
    cumulative = mass.cumsum(-1)
    total = cumulative[..., -1:]
    # A small relative slack keeps a layer that reaches the threshold up to rounding.
    reached = cumulative >= frac * total * (1 - 1e-12)
    first = reached.to(torch.int64).argmax(-1)
    indices = torch.as_tensor(list(layer_indices), dtype=torch.int64, device=first.device)
    return indices[first]
