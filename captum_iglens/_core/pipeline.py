"""From a captured path to an :class:`IGLensOutput`: readout, Invariant R, estimator.

:class:`~captum_iglens.IGLens` is the Captum surface; this is the computation behind it:
``f`` at every node of the path (arXiv:2606.29693), the readout check against the model's
own distribution, the chosen estimator's credits, and the convergence delta
``sum_j IGL_j - (f(h_n) - f(b))``.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Optional, TypeVar

import torch
from torch import Tensor

from captum_iglens._core.capture import PathCapture, capture_path
from captum_iglens._core.estimators import (
    ESTIMATORS,
    PathNodes,
    read_nodes,
    warn_if_not_converged,
)
from captum_iglens._core.lens_terms import estimate_with_lens
from captum_iglens._core.request import PathRequest
from captum_iglens._utils.typing import BaselineSpec, PositionSpec, TargetSpec, is_int
from captum_iglens.lens.layer_readout import lens_identity
from captum_iglens.lens.readout import chunk_rows, readout_top_k
from captum_iglens.lens.readout_check import check_distribution_errors, check_readout
from captum_iglens.lens.spec import LensSpec
from captum_iglens.results import IGLensOutput
from captum_iglens.settings import AttributionSettings

__all__ = ["capture_lens_path", "check_distribution_errors", "check_estimator",
           "convergence_delta", "delta_of", "output_from_path", "readout_chunk"]


def check_estimator(method: str, n_steps: object) -> None:
    """Refuse an unknown estimator, a bad ``n_steps`` or gradients under inference mode.

    Raises:
        ValueError: ``method`` not in :data:`~captum_iglens._core.estimators.METHODS`, or
            ``n_steps`` not a positive int.
        RuntimeError: a gradient estimator inside ``torch.inference_mode()``.
    """
    if method not in ESTIMATORS:
        raise ValueError(f"Unknown method {method!r}: use one of {tuple(ESTIMATORS)}.")
    least = ESTIMATORS[method].min_steps
    if not is_int(n_steps) or n_steps < least:
        raise ValueError(f"n_steps must be an int >= {least} for method={method!r}, got "
                         f"{n_steps!r}.")
    if not ESTIMATORS[method].exact and torch.is_inference_mode_enabled():
        raise RuntimeError(
            f"method={method!r} integrates gradients, which torch.inference_mode() forbids: "
            "call attribute outside inference mode (torch.no_grad() is fine), or use the "
            "default method='prediction_aware', which needs no gradient."
        )


def convergence_delta(attributions: Tensor, p_final: Tensor, p_base: Tensor) -> Tensor:
    """``attributions.sum(-1) - (p_final - p_base)``: ``[...]`` in the credits' dtype."""
    return attributions.sum(-1) - (p_final - p_base).to(attributions.dtype)


def _top_k(spec: LensSpec, path: PathNodes, k: int, chunk: int) -> tuple[Tensor, Tensor]:
    """The ``k`` most probable tokens at every chosen layer: ``[B, P, k_layers, k]``.

    Each node is read through the readout of its levels (``lens_probs``): the logit lens
    ``f`` by default, ``g_{L_j}`` under a per-layer lens (the model's own readout for the
    last node, as for its level).
    """
    layers = path.nodes[:, :, 1:]
    if not spec.per_layer:
        probs, ids = readout_top_k(spec.readout, layers.reshape(-1, layers.shape[-1]), k, chunk)
        return probs.view(*layers.shape[:-1], k), ids.view(*layers.shape[:-1], k)
    last = layers.shape[2] - 1
    reads = [readout_top_k(spec.readout if j == last else spec.readout_at(layer),
                           layers[:, :, j].reshape(-1, layers.shape[-1]), k, chunk)
             for j, layer in enumerate(spec.layer_indices)]
    shape = (*layers.shape[:2], k)
    return (torch.stack([p.view(shape) for p, _ in reads], dim=2),
            torch.stack([i.view(shape) for _, i in reads], dim=2))


#: A tensor field of an output, or one that may be absent: kept as it is by :func:`_spread`.
_MaybeTensor = TypeVar("_MaybeTensor", Tensor, Optional[Tensor])


def _spread(flat: _MaybeTensor, explained: Tensor, fill: float) -> _MaybeTensor:
    """``flat [1, N, ...]`` back to ``[B, P, ...]``, ``fill`` where ``explained`` is False."""
    if flat is None:
        return None
    out = flat.new_full((*explained.shape, *flat.shape[2:]), fill)
    out[explained.to(flat.device)] = flat[0]
    return out


def _ragged_output(spec: LensSpec, cap: PathCapture, *, settings: AttributionSettings,
                   top_k: int) -> IGLensOutput:
    """Only ``cap.explained`` pairs read out; the others hold NaN (ids: -1)."""
    mask = cap.explained
    assert mask is not None
    flat = output_from_path(spec, cap.select(mask), settings=settings, top_k=top_k)
    nan = float("nan")
    return replace(
        flat,
        attributions=_spread(flat.attributions, mask, nan),
        convergence_delta=_spread(flat.convergence_delta, mask, nan),
        lens_probs=_spread(flat.lens_probs, mask, nan),
        p_final=_spread(flat.p_final, mask, nan),
        p_baseline=_spread(flat.p_baseline, mask, nan),
        target=cap.path.target,
        positions=cap.positions,
        model_argmax=_spread(flat.model_argmax, mask, -1),
        top_k_probs=_spread(flat.top_k_probs, mask, nan),
        top_k_ids=_spread(flat.top_k_ids, mask, -1),
        contrast=cap.path.contrast,
        lens_change=_spread(flat.lens_change, mask, nan),
    )


def output_from_path(spec: LensSpec, cap: PathCapture, *, settings: AttributionSettings,
                     top_k: int = 0) -> IGLensOutput:
    """Read out ``cap``'s path, check Invariant R, run the estimator, package the output.

    With ``cap.explained`` (a ragged batch), only those (row, position) pairs are read out
    and checked; the other entries of the output's ``[B, P, ...]`` tensors are NaN (-1 for
    token ids; ``target`` and ``contrast`` keep the ids given).

    Args:
        spec (LensSpec): The lens (its model, readout, layers, units and
            whether the readout is checked).
        cap (PathCapture): The captured path (:func:`~captum_iglens._core.capture.capture_path`);
            not changed.
        settings (AttributionSettings): Keyword-only: the estimator (``method``, checked
            with :func:`check_estimator`), its ``n_steps`` and the readout chunk
            (``internal_batch_size``); the baseline is the capture's.
        top_k (int, optional): Record the ``top_k`` most probable tokens of each level's
            readout (the logit lens, or ``g_L`` under a per-layer lens). Default: 0.

    Returns:
        IGLensOutput: ``[B, P, k]`` credits and the rest, in the lens's units.

    Raises:
        ReadoutMismatchError: the readout does not reproduce the model (Invariant R).
    """
    if cap.explained is not None:
        return _ragged_output(spec, cap, settings=settings, top_k=top_k)
    method, n_steps = settings.method, settings.n_steps
    chunk = readout_chunk(spec, settings.internal_batch_size)
    readout = spec.readout
    path = replace(cap.path, log=spec.units == "log-probability")
    # the model's [B, P, V] distribution is not needed past the check: a capture handed
    # over (no other name holds it) is freed with it; the caller's capture is not changed
    dist, cap = cap.reference, replace(cap, reference=None)
    checked = spec.check_readout and dist is not None
    reference = (dist.log_probs.reshape(-1, dist.log_probs.shape[-1])
                 if checked and dist is not None else None)
    nodes = read_nodes(readout, path, chunk, reference)
    del reference  # a view of the model's [B, P, V] distribution
    probs = nodes.values
    name = getattr(readout, "name", "") or type(spec.model).__name__
    check_readout(readout, probs, cap.model_probs, spec.dtype, name,
                  verify=spec.check_readout, final=nodes.final)
    if checked and dist is not None:
        assert nodes.errors is not None  # read_nodes with a reference
        check_distribution_errors(nodes.errors, dist, spec.dtype, path.nodes.shape[-1], name)
    del dist
    credits, lens_change, probs = estimate_with_lens(spec, path, probs, method, n_steps, chunk)
    p_base, p_final = probs[..., 0], probs[..., -1]
    # the credits add up to f(h_n) - g_0(b) less the lens terms (none for the logit lens)
    p_start = p_base if lens_change is None else p_base + lens_change.sum(-1)
    warn_if_not_converged(credits, p_final - p_start, method, n_steps)
    top_probs, top_ids = _top_k(spec, path, top_k, chunk) if top_k else (None, None)
    return IGLensOutput(
        attributions=credits,
        convergence_delta=convergence_delta(credits, p_final, p_start),
        lens_probs=probs[..., 1:],
        p_final=p_final,
        p_baseline=p_base,
        target=cap.path.target,
        positions=cap.positions,
        layer_indices=spec.node_indices,
        baseline=cap.baseline,
        model_argmax=cap.model_argmax,
        units=spec.units,
        top_k_probs=top_probs,
        top_k_ids=top_ids,
        contrast=path.contrast,
        granularity=spec.granularity,
        lens_change=lens_change,
        lens=None if lens_change is None else lens_identity(spec.lens),
        method=method,
        n_steps=int(n_steps),
    )


def readout_chunk(spec: LensSpec, internal_batch_size: Optional[int]) -> int:
    """Readout rows per chunk for ``spec`` (see :func:`~captum_iglens.lens.readout.chunk_rows`)."""
    return chunk_rows(internal_batch_size, spec.vocab_size or 1)


def capture_lens_path(
    spec: LensSpec, inputs: Tensor, target: TargetSpec, positions: PositionSpec,
    baselines: BaselineSpec, additional_forward_args: Any, contrast: TargetSpec = None,
    explained: Optional[Tensor] = None,
) -> PathCapture:
    """The path of ``spec`` (its model, blocks, readout and chosen layers) on ``inputs``.

    See :func:`~captum_iglens._core.capture.capture_path`.
    """
    request = PathRequest.parse(spec, inputs, positions, baselines, additional_forward_args,
                                explained)
    return capture_path(spec, request, target=target, baselines=baselines, contrast=contrast)


def delta_of(attributions: Tensor, out: IGLensOutput, single: bool) -> Tensor:
    """``attributions.sum(-1) - (f(h_n) - f(b))`` against ``out``'s path ends.

    Args:
        attributions (Tensor): ``[B, k]`` (``single``) or ``[B, P, k]`` credits.
        out (IGLensOutput): The lens's output on the same inputs.
        single (bool): One int position was given.

    Returns:
        Tensor: ``[B]`` (``single``) or ``[B, P]``.

    Raises:
        ValueError: ``attributions`` of another shape.
    """
    k = len(out.layer_indices)
    attr = attributions[:, None] if single else attributions
    if tuple(attr.shape) != (*out.p_final.shape, k):
        expected = [attr.shape[0]] if single else list(out.p_final.shape)
        raise ValueError(
            f"attributions has shape {tuple(attributions.shape)}, expected "
            f"{[*expected, k]}: one credit per chosen layer ({k}) per explained position."
        )
    delta = convergence_delta(attr.to(out.p_final.device), out.p_final, out.p_baseline)
    return delta[:, 0] if single else delta
