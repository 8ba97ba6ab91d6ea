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
from typing import Any, Optional, Sequence

import torch
from torch import Tensor

from captum_iglens._core.capture import PathCapture, capture_path
from captum_iglens._core.heads import capture_head_inputs, head_credits, head_pieces
from captum_iglens._core.pipeline import (
    capture_lens_path,
    check_estimator,
    output_from_path,
    readout_chunk,
    run_lens,
)
from captum_iglens.lens.sublayer import capture_half_residuals
from captum_iglens.settings import GRANULARITIES

__all__ = ["capture_granular", "capture_sublayer_path", "check_granularity", "run_granular",
           "sublayer_node_indices", "sublayer_output"]


def check_granularity(granularity: object, heads: object) -> None:
    """Refuse an unknown granularity, or head credits without sub-layer nodes.

    Raises:
        ValueError: ``granularity`` not in :data:`~captum_iglens.settings.GRANULARITIES`,
            or ``heads=True`` with ``granularity="block"``.
        TypeError: ``heads`` not a bool.
    """
    if granularity not in GRANULARITIES:
        raise ValueError(f"granularity={granularity!r}: use one of {GRANULARITIES}.")
    if not isinstance(heads, bool):
        raise TypeError(f"heads must be True or False, got {heads!r}.")
    if heads and granularity != "sublayer":
        raise ValueError("heads=True splits the attention credit of sub-layer paths over the "
                         "heads: pass granularity='sublayer' with it.")


def sublayer_node_indices(layer_indices: Sequence[int]) -> tuple[int, ...]:
    """The node indices of a sub-layer path: ``0 -> (0,)``, ``L -> (2L - 1, 2L)``."""
    out: list[int] = []
    for index in layer_indices:
        out.extend((0,) if index == 0 else (2 * index - 1, 2 * index))
    return tuple(out)


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


def capture_sublayer_path(
    lens: Any, inputs: Tensor, target: Any, positions: Any, baselines: Any,
    additional_forward_args: Any, contrast: Any = None, explained: Optional[Tensor] = None,
) -> tuple[PathCapture, dict[int, Tensor]]:
    """The sub-layer path of ``lens`` on ``inputs``, from the same single forward pass.

    The path is ``b -> [emb] -> L_1.attn -> h_{L_1} -> L_2.attn -> h_{L_2} -> ...``. When the
    chosen layers skip blocks, the segment ``h_{L_{j-1}} -> L_j.attn`` spans the blocks in
    between as well as ``L_j``'s attention (its "attention" credit includes them).

    Arguments are those of :func:`~captum_iglens._core.capture.capture_path`, with ``lens`` an
    :class:`~captum_iglens.IGLens` built with ``granularity="sublayer"``.

    Returns:
        (capture, head_inputs): the :class:`PathCapture` with nodes ``[B, P, k' + 1, d]``
        (``k' = 2k``, or ``2k - 1`` with the embedding chosen) and, with ``lens.heads``, the
        inputs of each chosen block's attention output projection ``{L: [B, S, H * d_head]}``
        (empty otherwise).

    Raises:
        As :func:`~captum_iglens._core.capture.capture_path`.
    """
    half: dict[int, Tensor] = _FirstWrite()
    head_inputs: dict[int, Tensor] = _FirstWrite()
    chosen = [index for index in lens.layer_indices if index]
    with ExitStack() as stack:
        stack.enter_context(capture_half_residuals(lens.decoder_blocks, chosen,
                                                   lens.half_site, half))
        if lens.heads:
            stack.enter_context(capture_head_inputs(lens.decoder_blocks, chosen,
                                                    lens.head_site, head_inputs))
        cap = capture_path(lens.model, lens.decoder_blocks, lens.readout, lens.layer_indices,
                           inputs, target, positions, baselines, additional_forward_args,
                           contrast, explained)
    nodes = _interleave(cap.path.nodes, half, lens.layer_indices, cap.positions)
    cap.path = replace(cap.path, nodes=nodes)
    return cap, dict(head_inputs)


def sublayer_output(lens: Any, inputs: Tensor, baselines: Any, target: Any,
                    additional_forward_args: Any, n_steps: int, method: str, chunk: int,
                    positions: Any, top_k: int = 0, contrast: Any = None,
                    explained: Optional[Tensor] = None) -> tuple[Any, bool]:
    """:func:`~captum_iglens._core.pipeline.run_lens` for a sub-layer lens, head credits included.

    Returns:
        (output, single): the :class:`~captum_iglens.results.IGLensOutput` (credits
        ``[B, P, k']``; with ``lens.heads`` also ``head_credits [B, P, A, H]`` and
        ``head_rest [B, P, A]`` for the ``A`` chosen blocks ``L >= 1``) and whether one int
        position was given.

    Raises:
        ValueError: head credits of a ragged batch (``explained``).
        RuntimeError: head credits inside ``torch.inference_mode()`` (they need gradients).
    """
    if lens.heads and explained is not None:
        raise ValueError("heads=True is not available for ragged batches (explained=...): "
                         "explain those rows one at a time.")
    if lens.heads and torch.is_inference_mode_enabled():
        raise RuntimeError("heads=True needs one backward pass per grid step, which "
                           "torch.inference_mode() forbids: call it outside inference mode "
                           "(torch.no_grad() is fine).")
    cap, head_inputs = capture_sublayer_path(lens, inputs, target, positions, baselines,
                                             additional_forward_args, contrast, explained)
    out = output_from_path(lens, cap, method, n_steps, chunk, top_k)
    if lens.heads:
        out.head_credits, out.head_rest = _heads_of(lens, cap, out, head_inputs, n_steps,
                                                    chunk)
    return out, cap.single


def _heads_of(lens: Any, cap: PathCapture, out: Any, head_inputs: dict[int, Tensor],
              n_steps: int, chunk: int) -> tuple[Tensor, Tensor]:
    """Head credits ``[B, P, A, H]`` and rests ``[B, P, A]`` of the attention segments."""
    nodes = lens.node_indices
    segments = [m + 1 for m, index in enumerate(nodes) if index % 2]
    device = cap.path.nodes.device
    pieces = torch.stack([
        head_pieces(lens.decoder_blocks, lens.head_site, (index + 1) // 2,
                    head_inputs[(index + 1) // 2][:, cap.positions])
        for index in nodes if index % 2], dim=2)
    values = torch.cat([out.p_baseline[..., None], out.lens_probs], dim=-1)
    path = replace(cap.path, log=lens.units == "log-probability")
    return head_credits(lens.readout, path, values, segments, pieces.to(device), n_steps,
                        chunk)


def run_granular(lens: Any, inputs: Tensor, baselines: Any, target: Any,
                 additional_forward_args: Any, n_steps: int, method: str,
                 internal_batch_size: Optional[int], positions: Any, top_k: int = 0,
                 contrast: Any = None, explained: Optional[Tensor] = None) -> tuple[Any, bool]:
    """:func:`~captum_iglens._core.pipeline.run_lens`, or :func:`sublayer_output` for sub-layers."""
    if lens.granularity != "sublayer":
        return run_lens(lens, inputs, baselines, target, additional_forward_args, n_steps,
                        method, internal_batch_size, positions, top_k, contrast, explained)
    check_estimator(method, n_steps)
    return sublayer_output(lens, inputs, baselines, target, additional_forward_args, n_steps,
                           method, readout_chunk(lens, internal_batch_size), positions, top_k,
                           contrast, explained)


def capture_granular(lens: Any, inputs: Tensor, target: Any, positions: Any, baselines: Any,
                     additional_forward_args: Any, contrast: Any = None) -> PathCapture:
    """:func:`~captum_iglens._core.pipeline.capture_lens_path`, sub-layer nodes included."""
    if lens.granularity != "sublayer":
        return capture_lens_path(lens, inputs, target, positions, baselines,
                                 additional_forward_args, contrast)
    return capture_sublayer_path(lens, inputs, target, positions, baselines,
                                 additional_forward_args, contrast)[0]
