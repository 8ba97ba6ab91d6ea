"""Invariant R, checked: the readout of ``h_n`` reproduces the model's own distribution."""

from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

from captum_iglens._utils.typing import Readout
from captum_iglens.lens.distribution import (
    ModelDistribution,
    distribution_tolerance,
    log_prob_errors,
)
from captum_iglens.lens.readout import (
    _HALF_TOL,
    _READOUT_TOL,
    ReadoutMismatchError,
    chunk_rows,
    pad_rows,
)

__all__ = ["check_distribution", "check_distribution_errors", "check_readout"]


def _distribution_errors(
    readout: Readout, hidden: Tensor, reference: Tensor, chunk: int, name: str
) -> Tensor:
    """``max_v |log_softmax(readout(h))_v - reference_v|`` per row of ``hidden [N, d]``: ``[N]``.

    Chunks of ``chunk`` rows keep memory at ``chunk x V`` (see :func:`log_prob_errors`).

    Raises:
        ReadoutMismatchError: the readout's vocabulary has another size than the model's.
    """
    out = []
    dummy = torch.zeros(hidden.shape[0], dtype=torch.long, device=hidden.device)
    with torch.no_grad():
        for start in range(0, hidden.shape[0], chunk):
            rows, _ = pad_rows(hidden[start:start + chunk], dummy[start:start + chunk])
            ref = reference[start:start + chunk]
            logits = readout(rows)[: ref.shape[0]]
            if logits.shape != ref.shape:
                raise ReadoutMismatchError(
                    f"Invariant R failed for architecture {name!r}: the lens readout gives "
                    f"{logits.shape[-1]} logits per position, the model {ref.shape[-1]}; pass "
                    "IGLens(model, readout=...) with the model's own logits map.")
            out.append(log_prob_errors(logits, ref))
    return torch.cat(out)


def check_distribution(
    readout: Readout,
    hidden: Tensor,
    reference: ModelDistribution,
    model_dtype: torch.dtype,
    chunk: Optional[int] = None,
    name: str = "",
) -> None:
    """Check the readout's whole next-token distribution of ``h_n`` against the model's own.

    Args:
        readout (callable): The readout (pre-final-norm residual ``[N, d]`` -> logits ``[N, V]``).
        hidden (Tensor): ``[B, P, d]`` the last block's residuals at the explained positions.
        reference (ModelDistribution): The model's own log-probabilities ``[B, P, V]``.
        model_dtype (torch.dtype): The model's dtype, for :func:`distribution_tolerance`.
        chunk (int, optional): Rows per readout call (default ``2**24 // V``).
        name (str): The architecture, for the message.

    Raises:
        ReadoutMismatchError: some log-probability differs by more than the tolerance.
    """
    batch, n_pos, d = hidden.shape
    vocab = reference.log_probs.shape[-1]
    err = _distribution_errors(readout, hidden.reshape(-1, d),
                               reference.log_probs.reshape(batch * n_pos, -1),
                               chunk_rows(chunk, vocab), name)
    check_distribution_errors(err, reference, model_dtype, d, name)


def check_readout(
    readout: Readout,
    node_probs: Tensor,
    model_probs: Tensor,
    model_dtype: torch.dtype,
    fallback_name: str = "",
    verify: bool = True,
    *,
    hidden: Optional[Tensor] = None,
    reference: Optional[ModelDistribution] = None,
    chunk: Optional[int] = None,
    final: Optional[Tensor] = None,
) -> None:
    """Check that the readout is finite and reproduces the model's output (Invariant R).

    Args:
        readout (callable): The readout, for its ``name`` in messages.
        node_probs (Tensor): ``[B, P, k + 1]`` readout values at the path nodes (checked to
            be finite); without ``final``, the last node is the probability ``f(h_n)``.
        model_probs (Tensor): ``[B, P]`` ``softmax(model logits)[target]``, or the model's
            probabilities shaped like ``final`` (``[B, P, 2]``: target and foil).
        model_dtype (torch.dtype): The model's dtype (sets the tolerance: 1e-9 in float64,
            1e-4 in float32, 2e-2 in half precision).
        fallback_name (str): Name used when the readout has none.
        verify (bool): Compare with the model (False: only the finite check).
        hidden (Tensor, optional): ``[B, P, d]`` the residuals ``h_n``; with ``reference``,
            the whole next-token distribution is compared (:func:`check_distribution`).
        reference (ModelDistribution, optional): The model's own distribution ``[B, P, V]``.
        chunk (int, optional): Rows per readout call for the distribution check.
        final (Tensor, optional): The readout's probabilities at ``h_n`` to compare with
            ``model_probs`` (same shape), when the node values are not probabilities
            (log units, contrastive targets). Default: ``node_probs[..., -1]``.

    Raises:
        FloatingPointError: NaN or inf in the readout of finite residuals.
        ReadoutMismatchError: ``|f(h_n) - p_model|`` above the tolerance, or another
            next-token distribution (see :func:`check_distribution`).
        ValueError: ``final`` (or the last node) not shaped like ``model_probs``.
    """
    name = getattr(readout, "name", "") or fallback_name
    if not bool(torch.isfinite(node_probs).all()):
        raise FloatingPointError(
            f"The lens readout (final norm + unembedding of {name!r}) returned NaN or inf "
            "for finite residuals; its weights are corrupt or it overflows in this dtype."
        )
    if not verify:
        return
    tol = _READOUT_TOL.get(model_dtype, _HALF_TOL)
    final = node_probs[..., -1] if final is None else final
    if final.shape != model_probs.shape:
        raise ValueError(f"final {tuple(final.shape)} and model_probs "
                         f"{tuple(model_probs.shape)} must have the same shape.")
    diff = (final - model_probs.to(final.device)).abs()
    err = float("inf") if not bool(torch.isfinite(diff).all()) else diff.max().item()
    if err > tol:
        raise ReadoutMismatchError(
            f"Invariant R failed for architecture {name!r}: the lens readout of the last "
            f"block's residual differs from the model's own probability by {err:.3g} "
            f"(tolerance {tol:g}). The resolved final norm / unembedding do not reproduce "
            "this model's logits; pass IGLens(model, readout=...) with a callable that maps "
            "a pre-final-norm residual [..., d] to the model's logits [..., V]."
        )
    if hidden is not None and reference is not None:
        check_distribution(readout, hidden, reference, model_dtype, chunk, name)


def check_distribution_errors(errors: Tensor, reference: ModelDistribution,
                              dtype: torch.dtype, hidden_size: int, name: str) -> None:
    """Refuse a readout whose distribution at ``h_n`` strays from the model's (Invariant R).

    Args:
        errors (Tensor): ``[B * P]`` ``max_v |log p_lens(h_n)_v - log p_model_v|`` in nats
            (:func:`~captum_iglens._core.estimators.read_nodes`).
        reference (ModelDistribution): The model's own distribution ``[B, P, V]``.
        dtype (torch.dtype): The model's dtype.
        hidden_size (int): ``d``.
        name (str): The architecture, for the message.

    Raises:
        ReadoutMismatchError: an error above
            :func:`~captum_iglens.lens.readout.distribution_tolerance`, naming the first worst row.
    """
    n_pos = reference.log_probs.shape[1]
    tol = distribution_tolerance(dtype, hidden_size, reference.logit_max.reshape(-1))
    ratio = errors.double() / tol
    worst = int(ratio.argmax())
    if bool(ratio[worst] > 1):
        row, col = divmod(worst, n_pos)
        raise ReadoutMismatchError(
            f"Invariant R failed for architecture {name!r}: the lens readout of the last "
            f"block's residual gives another next-token distribution than the model (row "
            f"{row}, explained position {col}: a log-probability differs by "
            f"{float(errors[worst]):.3g} nats, tolerance {float(tol[worst]):.3g}). The "
            "resolved final norm / unembedding / logit transform do not reproduce this "
            "model's logits; pass IGLens(model, readout=...) with a callable that maps a "
            "pre-final-norm residual [..., d] to the model's logits [..., V]."
        )
