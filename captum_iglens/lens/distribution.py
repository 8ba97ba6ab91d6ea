"""The model's own next-token distribution, and how far a readout may stray from it.

The run-time readout check (:func:`~captum_iglens.lens.readout_check.check_readout`) compares the
readout's log-probabilities of ``h_n`` over the whole vocabulary with the model's own, so that
a readout missing a logit transform is caught at low-probability targets too.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

__all__ = [
    "ModelDistribution",
    "distribution_tolerance",
    "log_prob_errors",
    "wide_dtype",
    "wide_log_softmax",
]

#: The readout runs the model's own final norm, head and transform on the model's own ``h_n``:
#: only kernel choices differ (rows per call, ``logits_to_keep``). Measured on CPU, in units of
#: ``eps(dtype) * (1 + max |logit|)``: 0 (bitwise equal) on the 40 tiny families and
#: SmolLM2-135M in float32, float16 and bfloat16; with another kernel forced (float64-
#: accumulated head, 3-row chunks) at most 4.7 (float32, d=64; allowed 40), 14.5 (SmolLM2
#: float32, d=576; allowed 104), 0.57 / 0.64 (float16 tiny / SmolLM2; allowed 8), 0.27 / 0.32
#: (bfloat16; allowed 8). Skipping Cohere2's ``logit_scale=0.25`` is off by 4.3 nats: 1.6e7
#: units in float32, 250 in bfloat16.
_OUTPUT_ULPS = 8.0
_ACCUMULATION_ULPS = 4.0

#: ``torch.get_float32_matmul_precision()`` -> unit roundoff of float32 matmul inputs.
_MATMUL_EPS = {"high": 2.0**-10, "medium": 2.0**-7}


def wide_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype IG-Lens reads probabilities in: float64 for float64, else float32."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def wide_log_softmax(logits: Tensor) -> Tensor:
    """``log_softmax(logits)`` over the last (vocabulary) dimension, in :func:`wide_dtype`.

    Args:
        logits (Tensor): ``[..., V]`` logits of any float dtype (a half-precision model's
            too: they are widened before the softmax, so small probabilities keep their
            digits).

    Returns:
        Tensor: ``[..., V]`` log-probabilities, float32 (float64 for float64 logits), on
        the logits' device; in the autograd graph when the logits are.
    """
    return torch.log_softmax(logits.to(wide_dtype(logits.dtype)), dim=-1)


@dataclass
class ModelDistribution:
    """The model's own next-token distribution at the explained positions.

    Attributes:
        log_probs (Tensor): ``[B, P, V]`` ``log_softmax(model logits)`` in float32 (float64
            for a float64 model).
        logit_max (Tensor): ``[B, P]`` float32, the largest finite ``|logit|`` of each row
            (the scale of the rounding error of its logits).
    """

    log_probs: Tensor
    logit_max: Tensor

    @classmethod
    def from_logits(cls, logits: Tensor) -> ModelDistribution:
        """From the model's logits ``[B, P, V]`` (any float dtype) at the explained positions."""
        logit_max = logits.detach().abs().nan_to_num_(0.0, 0.0, 0.0).amax(-1).float()
        return cls(wide_log_softmax(logits), logit_max)


def log_prob_errors(logits: Tensor, reference: Tensor) -> Tensor:
    """``max_v |log_softmax(logits)_v - reference_v|`` per row: ``[N]`` float32 on the CPU.

    Args:
        logits (Tensor): ``[N, V]`` a readout's logits (any float dtype).
        reference (Tensor): ``[N, V]`` the model's log-probabilities (float32 or float64).

    Equal entries (``-inf`` included) count as equal, NaN as ``inf``.
    """
    mine = torch.log_softmax(logits.to(reference.dtype), dim=-1)
    ref = reference.to(mine.device)
    diff = torch.where(mine == ref, 0.0, (mine - ref).abs())
    return torch.nan_to_num(diff, nan=float("inf")).amax(-1).float().cpu()


def distribution_tolerance(model_dtype: torch.dtype, hidden_size: int, logit_max: Tensor
                           ) -> Tensor:
    """Per-row tolerance (nats, float64 on CPU) of the whole-distribution readout check.

    ``(8 * eps(dtype) + 4 * sqrt(d) * eps_acc) * (1 + max |logit|)``: a few ulps of the logits'
    dtype (output rounding) plus the accumulation error of a length-``d`` dot product, with
    ``eps_acc`` the float32 unit roundoff (float64 for float64 models; TF32's or bfloat16's
    when ``torch.set_float32_matmul_precision`` lowered it). Each log-probability moves by at
    most ``|dz_i| + |d logsumexp|``, both bounded by that error of the logits.

    Args:
        model_dtype (torch.dtype): The model's dtype (non-float dtypes count as float32).
        hidden_size (int): ``d``, the residual width.
        logit_max (Tensor): ``[N]`` the largest finite ``|logit|`` of each row.
    """
    dtype = model_dtype if model_dtype.is_floating_point else torch.float32
    eps = torch.finfo(dtype).eps
    eps_acc = torch.finfo(torch.float64 if dtype == torch.float64 else torch.float32).eps
    eps_acc = max(eps_acc, _MATMUL_EPS.get(torch.get_float32_matmul_precision(), 0.0))
    unit = _OUTPUT_ULPS * eps + _ACCUMULATION_ULPS * math.sqrt(hidden_size) * eps_acc
    return unit * (1.0 + logit_max.double().cpu())
