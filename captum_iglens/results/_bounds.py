"""Completeness tolerances derived from floating-point rounding, not fixed constants.

With unit roundoff ``u = eps / 2`` of the credits' dtype (float32: ``eps = 2**-23``), the
prediction-aware credits are endpoint differences taken in float64 and rounded once
(``<= u |c_j|`` each); a sum of ``k`` of them, in any order, errs by at most
``(k - 1) u sum|c_j|`` (Higham, *Accuracy and Stability of Numerical Algorithms*, 2nd ed.,
section 4.2); ``delta_p`` is rounded once (``<= u |delta_p|``). Hence::

    |sum_j c_j - delta_p| <= u (k sum_j |c_j| + |delta_p|)

(plus ``O(u^2)``). This grows with the credits, so 30 float32 layers with large credits
cannot promise 1e-6, while a wrong credit (a dropped segment, a shifted position) stands
orders of magnitude above it.
"""

from __future__ import annotations

from typing import Optional, Sequence

import torch
from torch import Tensor

__all__ = ["bound_words", "completeness_bound", "isclose_bound", "worst_layer"]


def completeness_bound(attributions: Tensor, delta_p: Tensor) -> Tensor:
    """Rounding bound on ``|attributions.sum(-1) - delta_p|``, float64, shaped like ``delta_p``.

    Args:
        attributions (Tensor): ``[..., k]`` credits (their dtype sets ``u``; float64 values
            are bounded as float64).
        delta_p (Tensor): ``[...]`` what they add up to.

    Returns:
        Tensor: ``u (k sum|c_j| + |delta_p|)`` per prediction (float64).
    """
    dtype = attributions.dtype if attributions.is_floating_point() else torch.float32
    u = torch.finfo(dtype).eps / 2
    k = attributions.shape[-1]
    mags = k * attributions.detach().double().abs().sum(-1)
    return u * (mags + delta_p.detach().double().abs())


def isclose_bound(
    attributions: Tensor, delta_p: Tensor, rtol: Optional[float], atol: Optional[float]
) -> Tensor:
    """The bound a completeness check uses: derived, or the caller's ``atol + rtol |delta_p|``.

    With ``rtol`` and ``atol`` both ``None`` it is :func:`completeness_bound`; otherwise
    ``torch.isclose``'s ``atol + rtol * |delta_p|`` (a ``None`` counts as 0).

    Raises:
        ValueError: a negative tolerance.
    """
    if rtol is None and atol is None:
        return completeness_bound(attributions, delta_p)
    rtol, atol = float(rtol or 0.0), float(atol or 0.0)
    if rtol < 0 or atol < 0:
        raise ValueError(f"rtol and atol must be >= 0, got rtol={rtol}, atol={atol}")
    return atol + rtol * delta_p.detach().double().abs()


def worst_layer(credits: Tensor, levels: Optional[Tensor], names: Sequence[str]) -> str:
    """Which layer of one prediction's credits ``[k]`` is most wrong, in words.

    With the path's readout levels ``[k + 1]`` (``f(b), f(h_L1), ..., f(h_Lk)``), each
    credit is compared with its own segment's change of the readout (what the exact
    estimator credits): the layer that differs most is named, with both numbers. Without
    levels the layer holding the largest ``|credit|`` is named.
    """
    credits = credits.detach().double().reshape(-1)
    if levels is not None and bool(torch.isfinite(levels).all()):
        change = levels.detach().double().reshape(-1).diff()
        err = (credits - change).abs()
        j = int(err.argmax())
        start = "f(b)" if j == 0 else f"f(h_{names[j - 1]})"
        return (f"layer {names[j]}: its credit {float(credits[j]):+.6g} differs from its "
                f"segment's change of the lens readout, {start} -> f(h_{names[j]}) = "
                f"{float(change[j]):+.6g}, by {float(err[j]):.3e}")
    j = int(credits.abs().argmax())
    return (f"layer {names[j]} holds the largest credit, {float(credits[j]):+.6g} (no lens "
            "levels to compare each segment with)")


def bound_words(rtol: Optional[float], atol: Optional[float], dtype: torch.dtype) -> str:
    """How a completeness bound was set, for failure messages."""
    if rtol is None and atol is None:
        return f"derived from {dtype} rounding, u (k sum|c| + |total|)"
    return f"atol={float(atol or 0):g} + rtol={float(rtol or 0):g} * |total|"
