"""Rounding bounds of the lens readout, for :func:`~captum_iglens.testing.assert_readout_exact`.

Two float32 readouts of the same residual (the lens's chunk, the model's own forward) differ
by rounding only. A long dot product of ``n`` terms run in blocked BLAS kernels errs by about
``sqrt(n) u sum|t_i|`` (Higham and Mary, SIAM J. Sci. Comput. 41(5), 2019); the bound used is
``eps sqrt(n) M`` with ``M`` the sum of |terms| carried through the readout to each
probability (:func:`readout_prob_magnitude`), for each of the two computations compared.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

__all__ = ["logit_magnitude", "readout_prob_magnitude", "readout_tolerance", "reduction_length"]


def reduction_length(module: nn.Module) -> int:
    """The longest dot product of ``module``: the largest input width of its linear maps."""
    longest = 1
    for sub in module.modules():
        weight = getattr(sub, "weight", None)
        if not isinstance(weight, Tensor) or weight.dim() != 2 or isinstance(sub, nn.Embedding):
            continue
        # nn.Linear stores [out, in]; transformers' Conv1D stores [in, out] and has nf.
        longest = max(longest, weight.shape[0] if hasattr(sub, "nf") else weight.shape[1])
    return longest


def _norm_magnitude(norm: nn.Module, x: Tensor) -> Tensor:
    """Sum of |terms| of a final norm's output ``[..., d]`` (float64).

    LayerNorm rounds ``x - mean`` relative to ``|x| + |mean|``; a Llama-style RMSNorm
    relative to ``|x|``; any other norm is taken at ``|output|``.
    """
    out = norm(x).double().abs()
    weight = getattr(norm, "weight", None)
    if not isinstance(weight, Tensor) or weight.shape != x.shape[-1:]:
        return out
    x = x.double()
    gamma = weight.detach().double().abs()
    if isinstance(norm, nn.LayerNorm):
        mu = x.mean(-1, keepdim=True)
        scale = torch.sqrt(((x - mu) ** 2).mean(-1, keepdim=True) + norm.eps)
        beta = norm.bias.detach().double().abs() if norm.bias is not None else 0.0
        return gamma * (x.abs() + mu.abs()) / scale + beta
    name = type(norm).__name__
    if name.endswith("RMSNorm") and "Gemma" not in name:
        eps = getattr(norm, "variance_epsilon", getattr(norm, "eps", 0.0))
        return gamma * x.abs() / torch.sqrt((x * x).mean(-1, keepdim=True) + eps)
    return out


def logit_magnitude(readout: nn.Module, hidden: Tensor) -> tuple[Tensor, Tensor]:
    """The logits of ``hidden`` and the sum of |terms| of each, ``[..., V]``, float64.

    Each linear map adds ``|W| |input| + |b|``; an elementwise logit transform ``t``
    (soft-cap, scale) maps a magnitude ``Z`` to ``|t'(z)| Z + |t(z)|``.
    """
    norm = getattr(readout, "final_norm", None)
    with torch.no_grad():
        n = norm(hidden) if norm is not None else hidden
        mag = _norm_magnitude(norm, hidden) if norm is not None else hidden.double().abs()
        for module in [*getattr(readout, "pre_unembed", []), readout.unembed]:
            mag = mag @ module.weight.detach().double().abs().T
            if getattr(module, "bias", None) is not None:
                mag = mag + module.bias.detach().double().abs()
            n = module(n)
        z = n.double()
        transform = getattr(readout, "logit_transform", None)
        if transform is not None:
            raw = n
            z = transform(raw).double()
            slope = torch.func.jvp(transform, (raw,), (torch.ones_like(raw),))[1]
            mag = slope.double().abs() * mag + z.abs()
    return z, mag


def readout_prob_magnitude(readout: nn.Module, hidden: Tensor) -> Tensor:
    """Sum of |terms| of every probability ``softmax(readout(hidden))``, ``[..., V]``, float64.

    An error ``dz`` of the logits moves ``p_v`` by ``p_v (dz_v - sum_u p_u dz_u)``: the
    magnitude is ``p_v (Z_v + sum_u p_u Z_u)``, plus ``p_v`` for the softmax's own rounding.
    ``readout`` is a :class:`~captum_iglens.lens.readout.LensReadout` (final norm, optional
    projections, unembedding, optional logit transform).
    """
    z, z_abs = logit_magnitude(readout, hidden.detach())
    p = torch.softmax(z, -1)
    return p * (z_abs + (p * z_abs).sum(-1, keepdim=True)) + p


def readout_tolerance(readout: nn.Module, hidden: Tensor) -> Tensor:
    """Bound ``[..., V]`` on two readouts of ``hidden`` (the lens's, the model's own forward).

    ``eps sqrt(n) (M + M)``: ``eps`` of the residual's dtype, ``n`` the readout's longest dot
    product, ``M`` from :func:`readout_prob_magnitude` (one per computation compared).
    """
    eps = torch.finfo(hidden.dtype).eps if hidden.is_floating_point() else 2.0**-23
    mag = readout_prob_magnitude(readout, hidden)
    return eps * math.sqrt(reduction_length(readout)) * 2 * mag
