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

from captum_iglens._utils.typing import Readout, is_int
from captum_iglens.lens.architectures import locate_parts
from captum_iglens.lens.distribution import (
    ModelDistribution,
    distribution_tolerance,
    wide_log_softmax,
)

__all__ = [
    "LensReadout",
    "ModelDistribution",
    "ReadoutMismatchError",
    "chunk_rows",
    "distribution_tolerance",
    "lens_values",
    "readout_probs",
    "readout_top_k",
    "readout_values",
    "resolve_readout",
    "target_log_probs",
]


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
    if not is_int(internal_batch_size) or internal_batch_size < 1:
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
    return lens_values(wide_log_softmax(readout(points)), ids, log)


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


