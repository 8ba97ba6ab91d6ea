"""Type aliases of the public arguments, in one place (a leaf: torch and numpy only)."""

from __future__ import annotations

from typing import Callable, Sequence, TypeGuard, Union

import numpy as np
from torch import Tensor, nn

__all__ = ["BaselineSpec", "LayerSpec", "PositionSpec", "Readout", "TargetSpec", "is_int"]

#: The chosen layers: decoder blocks, the input embedding, hidden-state indices or ``"all"``.
LayerSpec = Union[None, str, int, nn.Module, Sequence[Union[int, nn.Module]]]
#: Target (or foil) token ids: one for all, one per row, ``[B]`` or ``[B, P]``.
TargetSpec = Union[None, int, Sequence[int], Tensor]
#: Explained positions: one int, a sequence, or a tensor of column indices.
PositionSpec = Union[int, Sequence[int], Tensor]
#: A named baseline (``"mean"``, ``"zero"``, ``"embedding"``) or a residual tensor.
BaselineSpec = Union[str, Tensor]
#: A map from pre-final-norm residuals ``[..., d]`` to logits ``[..., V]``.
Readout = Callable[[Tensor], Tensor]


def is_int(value: object) -> TypeGuard[Union[int, np.integer]]:
    """An int (numpy ints included), not a bool."""
    return isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_))
