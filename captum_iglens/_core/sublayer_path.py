"""Sub-layer paths: every chosen block becomes two nodes, ``L.attn`` and ``L.mlp`` (= ``h_L``).

IG-Lens's telescoping (Proposition 1 of arXiv:2606.29693) holds for any sequence of residual
states, so inserting the half-block residual ``L.attn`` (after the block's attention, before
its MLP; where it lives per family: :mod:`captum_iglens.lens.sublayer`) between ``h_{L_{j-1}}``
and ``h_{L_j}`` splits the block's credit into an attention credit
``f(L.attn) - f(h_{L_{j-1}})`` and an MLP credit ``f(h_L) - f(L.attn)``, which add up to
the block-granularity credit, and all of them still add up to ``delta_p``.

Node indices: ``0`` stays the embedding output (one node); block ``L >= 1`` gives ``2L - 1``
(``L.attn``) and ``2L`` (``L.mlp``), so the indices are increasing along the path and the
onset rule, tables and plots treat them as they treat hidden-state indices.
"""

from __future__ import annotations

from contextlib import ExitStack
from dataclasses import replace
from typing import Any, Sequence

import torch
from torch import Tensor

from captum_iglens._core.capture import PathCapture, capture_path
from captum_iglens._core.heads import capture_head_inputs, head_credits, head_pieces
from captum_iglens._core.pipeline import (
    capture_lens_path,
    output_from_path,
    readout_chunk,
)
from captum_iglens._core.request import Forward
from captum_iglens._utils.typing import BaselineSpec
from captum_iglens.lens.spec import LensSpec
from captum_iglens.lens.sublayer import capture_half_residuals
from captum_iglens.results import IGLensOutput
from captum_iglens.settings import AttributionSettings

__all__ = ["capture_granular", "capture_sublayer_path", "sublayer_output"]


class _FirstWrite(dict):
    """Keeps the first value written under each key: a reference-ids forward runs second."""

    def __setitem__(self, key: Any, value: Any) -> None:
        if key not in self:
            super().__setitem__(key, value.detach())


def _interleave(nodes: Tensor, half: dict[int, Tensor], layer_indices: Sequence[int],
                positions: list[int]) -> Tensor:
    """``[B, P, k + 1, d]`` block nodes -> ``[B, P, k' + 1, d]`` with ``L.attn`` before ``h_L``."""
    parts = [nodes[:, :, :1]]
    for j, index in enumerate(layer_indices):
        if index:
            attn = half[index][:, positions].to(device=nodes.device, dtype=nodes.dtype)
            parts.append(attn[:, :, None])
        parts.append(nodes[:, :, 1 + j:2 + j])
    return torch.cat(parts, dim=2)


def capture_sublayer_path(spec: LensSpec, source: Forward, *,
                          baselines: BaselineSpec) -> tuple[PathCapture, dict[int, Tensor]]:
    """The sub-layer path of ``spec`` on ``inputs``, from the same single forward pass.

    The path is ``b -> [emb] -> L_1.attn -> h_{L_1} -> L_2.attn -> h_{L_2} -> ...``. When the
    chosen layers skip blocks, the segment ``h_{L_{j-1}} -> L_j.attn`` spans the blocks in
    between as well as ``L_j``'s attention (its "attention" credit includes them).

    ``source`` is the teacher-forced request (targets, positions, foils, ``explained``),
    ``spec`` a :class:`~captum_iglens.lens.spec.LensSpec` built with
    ``granularity="sublayer"``, ``baselines`` the path start.

    Returns:
        (capture, head_inputs): the :class:`PathCapture` with nodes ``[B, P, k' + 1, d]``
        (``k' = 2k``, or ``2k - 1`` with the embedding chosen) and, with ``spec.heads``, the
        inputs of each chosen block's attention output projection ``{L: [B, S, H * d_head]}``
        (empty otherwise).

    Raises:
        As :func:`~captum_iglens._core.capture.capture_path`.
    """
    request = source.parse(spec, baselines)
    half: dict[int, Tensor] = _FirstWrite()
    head_inputs: dict[int, Tensor] = _FirstWrite()
    chosen = [index for index in spec.layer_indices if index]
    with ExitStack() as stack:
        stack.enter_context(capture_half_residuals(spec.decoder_blocks, chosen,
                                                   spec.half_site, half))  # type: ignore[arg-type]  # a sub-layer spec
        if spec.heads:
            stack.enter_context(capture_head_inputs(spec.decoder_blocks, chosen,
                                                    spec.head_site, head_inputs))  # type: ignore[arg-type]  # heads=True
        cap = capture_path(spec, request, target=source.target, baselines=baselines,
                           contrast=source.contrast)
    nodes = _interleave(cap.path.nodes, half, spec.layer_indices, cap.positions)
    return replace(cap, path=replace(cap.path, nodes=nodes)), dict(head_inputs)


def sublayer_output(spec: LensSpec, source: Forward, *, settings: AttributionSettings,
                    top_k: int = 0) -> tuple[IGLensOutput, bool]:
    """:func:`~captum_iglens._core.entry.attribute` for a sub-layer lens, head credits included.

    Returns:
        (output, single): the :class:`~captum_iglens.results.IGLensOutput` (credits
        ``[B, P, k']``; with ``spec.heads`` also ``head_credits [B, P, A, H]`` and
        ``head_rest [B, P, A]`` for the ``A`` chosen blocks ``L >= 1``) and whether one int
        position was given.

    Raises:
        ValueError: head credits of a ragged batch (``explained``).
        RuntimeError: head credits inside ``torch.inference_mode()`` (they need gradients).
    """
    if spec.heads and source.explained is not None:
        raise ValueError("heads=True is not available for ragged batches (explained=...): "
                         "explain those rows one at a time.")
    if spec.heads and torch.is_inference_mode_enabled():
        raise RuntimeError("heads=True needs one backward pass per grid step, which "
                           "torch.inference_mode() forbids: call it outside inference mode "
                           "(torch.no_grad() is fine).")
    cap, head_inputs = capture_sublayer_path(spec, source, baselines=settings.baselines)
    out = output_from_path(spec, cap, settings=settings, top_k=top_k)
    if spec.heads:
        chunk = readout_chunk(spec, settings.internal_batch_size)
        credits, rest = _heads_of(spec, cap, out, head_inputs, settings.n_steps, chunk)
        out = replace(out, head_credits=credits, head_rest=rest)
    return out, cap.single


def _heads_of(spec: LensSpec, cap: PathCapture, out: Any, head_inputs: dict[int, Tensor],
              n_steps: int, chunk: int) -> tuple[Tensor, Tensor]:
    """Head credits ``[B, P, A, H]`` and rests ``[B, P, A]`` of the attention segments."""
    nodes = spec.node_indices
    segments = [m + 1 for m, index in enumerate(nodes) if index % 2]
    device = cap.path.nodes.device
    pieces = torch.stack([
        head_pieces(spec.decoder_blocks, spec.head_site, (index + 1) // 2,  # type: ignore[arg-type]  # heads=True
                    head_inputs[(index + 1) // 2][:, cap.positions])
        for index in nodes if index % 2], dim=2)
    values = torch.cat([out.p_baseline[..., None], out.lens_probs], dim=-1)
    path = replace(cap.path, log=spec.units == "log-probability")
    return head_credits(spec.readout, path, values, segments, pieces.to(device), n_steps,
                        chunk)


def capture_granular(spec: LensSpec, source: Forward, *, baselines: BaselineSpec) -> PathCapture:
    """:func:`~captum_iglens._core.pipeline.capture_lens_path`, sub-layer nodes included."""
    if spec.granularity != "sublayer":
        return capture_lens_path(spec, source.inputs, source.target, source.positions,
                                 baselines, source.additional_forward_args, source.contrast)
    return capture_sublayer_path(spec, source, baselines=baselines)[0]
