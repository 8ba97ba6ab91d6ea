"""The lens readout ``f_y(h) = softmax(unembed(final_norm(h)))[y]`` (arXiv:2606.29693).

The readout reproduces, from a *pre-final-norm* residual-stream vector, exactly what the
model itself does after its last decoder block: the final norm, any projection before the
unembedding (OPT's ``project_out``), the unembedding (``lm_head`` with its bias, if any) and
any transformation of the logits (Gemma-2/3 soft-capping, Cohere's ``logit_scale``,
Granite's ``logits_scaling``). Invariant R: ``f_y(h_n[pos])`` equals the model's own
``softmax(logits[pos])[y]``; :func:`check_readout` verifies it on every IG-Lens call, for the
explained target and for the whole next-token distribution (so a readout that misses a logit
transform is caught at low-probability targets too).

Readout evaluations are chunked (``internal_batch_size`` rows at a time) and only the
target column of the ``[rows, V]`` probabilities is kept (with the foil's, for contrastive
targets), so memory never grows with tokens x layers x steps x vocabulary.

A contrastive readout (``contrast=`` of :meth:`~captum_iglens.IGLens.attribute`) decomposes
``F(h) = f_y(h) - f_foil(h)``: row ids are then ``[N, 2]`` (target, foil) instead of ``[N]``;
:func:`lens_values` is the one place that turns log-softmax rows into ``F``.
"""

from __future__ import annotations

from typing import Callable, Optional, Sequence

import torch
from torch import Tensor, nn

from captum_iglens.lens.architectures import locate_parts
from captum_iglens.lens.distribution import (
    ModelDistribution,
    distribution_tolerance,
    log_prob_errors,
)

__all__ = [
    "LensReadout",
    "ModelDistribution",
    "ReadoutMismatchError",
    "check_distribution",
    "check_distribution_errors",
    "check_readout",
    "chunk_rows",
    "distribution_tolerance",
    "lens_values",
    "readout_probs",
    "readout_top_k",
    "readout_values",
    "resolve_readout",
    "target_log_probs",
]

Readout = Callable[[Tensor], Tensor]

#: Readout chunks are padded to at least this many rows: BLAS takes a different matrix kernel
#: for 1-3 rows, whose rounding would make results depend on ``internal_batch_size``.
_MIN_CHUNK_ROWS = 8

#: Invariant R tolerance on probabilities, per model dtype (other dtypes: half precision).
_READOUT_TOL = {torch.float64: 1e-9, torch.float32: 1e-4}
_HALF_TOL = 2e-2


class ReadoutMismatchError(RuntimeError):
    """Invariant R failed: the lens readout of ``h_n`` is not the model's own probability."""


class LensReadout(nn.Module):
    """The logit lens of a causal LM: pre-final-norm residual -> the model's own logits.

    Args:
        final_norm (nn.Module or None): The model's final norm (``None`` only for
            architectures without one, such as OPT-350m).
        unembed (nn.Module): The unembedding (``model.get_output_embeddings()``), bias
            included.
        pre_unembed (sequence of nn.Module, optional): Modules applied between the final norm
            and the unembedding (OPT's ``project_out``).
        logit_transform (callable, optional): The map the model applies to its logits
            (soft-capping, scaling), in the model's dtype.
        name (str, optional): The architecture name, used in error messages.

    ``forward(h)`` maps ``h`` of shape ``[..., d]`` (any dtype the model runs in) to logits
    ``[..., V]`` in the model's dtype.
    """

    def __init__(
        self,
        final_norm: Optional[nn.Module],
        unembed: nn.Module,
        pre_unembed: Sequence[nn.Module] = (),
        logit_transform: Optional[Callable[[Tensor], Tensor]] = None,
        name: str = "",
    ) -> None:
        """Hold the modules after the last decoder block (see the class docstring)."""
        super().__init__()
        self.final_norm = final_norm
        self.pre_unembed = nn.ModuleList(pre_unembed)
        self.unembed = unembed
        self.logit_transform = logit_transform
        self.name = name

    def forward(self, hidden: Tensor) -> Tensor:
        """Logits ``[..., V]`` (model dtype) of pre-final-norm residuals ``[..., d]``."""
        if self.final_norm is not None:
            hidden = self.final_norm(hidden)
        for module in self.pre_unembed:
            hidden = module(hidden)
        logits = self.unembed(hidden)
        if self.logit_transform is not None:
            logits = self.logit_transform(logits)
        return logits


def resolve_readout(model: nn.Module) -> LensReadout:
    """Build the :class:`LensReadout` of a Hugging Face causal LM.

    Raises:
        UnknownArchitectureError: if the final norm or the unembedding cannot be located.
        ValueError: a dynamically quantized unembedding (its scale depends on the call's
            other rows, so the readout cannot be exact).
    """
    parts = locate_parts(model)
    if "quantized.dynamic" in type(parts.unembed).__module__:
        raise ValueError(
            f"The unembedding is dynamically quantized ({type(parts.unembed).__name__}): it "
            "picks its activation scale from all rows of each call, so no readout of one "
            "residual can equal the model's own logits. Quantize the decoder blocks only "
            "(leave lm_head out of quantize_dynamic's qconfig_spec) or keep a float head.")
    return LensReadout(
        parts.final_norm, parts.unembed, parts.pre_unembed, parts.logit_transform, parts.name
    )


def chunk_rows(internal_batch_size: Optional[int], vocab: int) -> int:
    """Residual rows per readout chunk: ``internal_batch_size``, or ``2**24 // V`` rows.

    Raises:
        ValueError: if ``internal_batch_size`` is not an int >= 1.
    """
    if internal_batch_size is None:
        return max(1, (1 << 24) // max(vocab, 1))
    if isinstance(internal_batch_size, bool) or not isinstance(internal_batch_size, int) or (
        internal_batch_size < 1
    ):
        raise ValueError(f"internal_batch_size must be an int >= 1, got {internal_batch_size!r}")
    return int(internal_batch_size)


def pad_rows(points: Tensor, targets: Tensor) -> tuple[Tensor, Tensor]:
    """Pad ``points [N, d]`` and ``targets [N, ...]`` to at least 8 rows (last row repeated).

    Returns new leaf tensors; the caller keeps the first ``N`` results (rows are
    independent, so the padding changes nothing but the BLAS kernel choice).
    """
    short = _MIN_CHUNK_ROWS - points.shape[0]
    if short <= 0:
        return points.detach(), targets
    return (torch.cat([points, points[-1:].expand(short, -1)]).detach(),
            torch.cat([targets, targets[-1:].expand(short, *targets.shape[1:])]))


def lens_values(log_probs: Tensor, ids: Tensor, log: bool = False) -> Tensor:
    """The readout ``F`` of log-softmax rows ``log_probs [N, V]``: ``[N]``.

    Args:
        log_probs (Tensor): ``[N, V]`` log-probabilities (float32 or float64).
        ids (Tensor): ``[N]`` target ids, or ``[N, 2]`` (target, foil) ids for a
            contrastive readout.
        log (bool): Log-probabilities (nats) instead of probabilities.

    Returns:
        Tensor: ``p(y)`` (``log p(y)`` with ``log``); contrastive: ``p(y) - p(foil)``
        (``log p(y) - log p(foil)``, the logit difference).
    """
    picked = log_probs.gather(-1, ids.reshape(ids.shape[0], -1).to(log_probs.device))
    values = picked if log else picked.exp()
    return values[:, 0] if values.shape[1] == 1 else values[:, 0] - values[:, 1]


def readout_values(readout: Readout, points: Tensor, ids: Tensor, log: bool = False) -> Tensor:
    """``F(points)`` (see :func:`lens_values`): ``[N]`` (float32; float64 models: float64).

    The readout runs in the model's dtype; the log-softmax in float32 or wider.
    """
    logits = readout(points)
    out_dtype = torch.float64 if logits.dtype == torch.float64 else torch.float32
    return lens_values(torch.log_softmax(logits.to(out_dtype), dim=-1), ids, log)


def target_log_probs(readout: Readout, points: Tensor, targets: Tensor) -> Tensor:
    """``log f_target(points)``: ``[N]`` log-probabilities (float32; float64 models: float64).

    The readout runs in the model's dtype; the log-softmax in float32 or wider.
    """
    return readout_values(readout, points, targets, log=True)


def readout_probs(
    readout: Readout, points: Tensor, targets: Tensor, chunk: int, log: bool = False
) -> Tensor:
    """``F(points)`` for ``points [N, d]`` in chunks of ``chunk`` rows: ``[N]``.

    ``targets`` are ``[N]`` ids (``F = f_target``) or ``[N, 2]`` (target, foil) ids
    (``F = f_target - f_foil``); probabilities, or log-probabilities (nats) with
    ``log=True`` (see :func:`lens_values`).
    """
    out = []
    with torch.no_grad():
        for start in range(0, points.shape[0], chunk):
            rows, tgt = pad_rows(points[start:start + chunk], targets[start:start + chunk])
            n_real = min(chunk, points.shape[0] - start)
            out.append(readout_values(readout, rows, tgt, log)[:n_real])
    return torch.cat(out)


def readout_top_k(readout: Readout, points: Tensor, k: int, chunk: int) -> tuple[Tensor, Tensor]:
    """The logit lens's ``k`` most probable tokens at each of ``points [N, d]``.

    Returns:
        (probs, ids): ``[N, k]`` float32 probabilities (descending) and int64 token ids.
    """
    probs, ids = [], []
    with torch.no_grad():
        for start in range(0, points.shape[0], chunk):
            rows, _ = pad_rows(points[start:start + chunk],
                               torch.zeros(min(chunk, points.shape[0] - start),
                                           dtype=torch.long, device=points.device))
            n_real = min(chunk, points.shape[0] - start)
            top = torch.softmax(readout(rows)[:n_real].float(), dim=-1).topk(k, dim=-1)
            probs.append(top.values)
            ids.append(top.indices)
    return torch.cat(probs), torch.cat(ids)


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
