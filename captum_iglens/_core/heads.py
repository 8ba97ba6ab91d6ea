"""Per-head credits of the attention segments of a sub-layer path (``heads=True``).

In Llama-like blocks the attention adds ``o_proj(concat_h z_h) = sum_h W_o[:, h] z_h (+ bias)``
to the residual, so the attention segment's displacement ``L.attn - h_{L-1}`` is a sum of one
vector per head, ``c_h = W_o[:, h] z_h``, plus a rest ``r`` (the output bias; with skipped
layers, the blocks in between; and the rounding of recomputing the sum). Each step
``a_{s-1} -> a_s`` of a uniform grid on the segment is credited its observed change
``f(a_s) - f(a_{s-1})`` (as the prediction-aware estimator does), and that change is
distributed over the pieces in proportion to ``grad f . c_h`` (the trapezoid of the
gradients at the step's two ends). The weights of a step add up to 1, so the head credits and
the rest add up to the segment's credit exactly at any ``n_steps`` (Proposition 1 of
arXiv:2606.29693 applied within a segment). Cost: ``n_steps + 1`` readouts with one backward
pass each per attention segment and explained position.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Callable, Iterator, Sequence

import torch
from torch import Tensor, nn

from captum_iglens._core.estimators import PathNodes
from captum_iglens.lens.hooks import held_hooks
from captum_iglens.lens.readout import Readout, pad_rows, readout_values
from captum_iglens.lens.sublayer import HeadSite, _projection

__all__ = ["capture_head_inputs", "head_credits"]


@contextmanager
def capture_head_inputs(blocks: nn.ModuleList, indices: Sequence[int], site: HeadSite,
                        store: dict[int, Tensor]) -> Iterator[dict[int, Tensor]]:
    """Record the input of block ``L``'s output projection (``[B, S, H * d_head]``).

    Args:
        blocks (nn.ModuleList): The decoder blocks.
        indices (sequence of int): Hidden-state indices ``L >= 1``.
        site (HeadSite): From :func:`head_site`.
        store (dict): Filled as ``{L: z}`` during the forward pass.

    Yields:
        dict: ``store``. Hooks are removed on exit, also after an error.
    """
    def hook_for(index: int) -> Callable[..., None]:
        def hook(_m: nn.Module, args: tuple, kwargs: dict) -> None:
            store[index] = args[0] if args else kwargs["input"]
        return hook

    with held_hooks() as hooks:
        for index in indices:
            hooks.pre(_projection(blocks[index - 1], site), hook_for(index))
        yield store


def head_pieces(blocks: nn.ModuleList, site: HeadSite, index: int, z: Tensor) -> Tensor:
    """``c_h = W_o[:, h] z_h`` for ``z [..., H * d_head]``: ``[..., H, d]`` float64."""
    weight = _projection(blocks[index - 1], site).weight.detach().double()
    d_model, width = weight.shape
    heads = site.n_heads
    per_head = z.double().reshape(*z.shape[:-1], heads, width // heads)
    return torch.einsum("...he,dhe->...hd", per_head, weight.view(d_model, heads, -1))


def _grid_gradients(readout: Readout, path: PathNodes, starts: Tensor, diffs: Tensor,
                    pieces: Tensor, n_steps: int, chunk: int) -> tuple[Tensor, Tensor]:
    """``f`` and ``grad f . piece`` at ``n_steps + 1`` points of each segment.

    Returns ``[N, n_steps + 1]`` values and ``[N, n_steps + 1, H + 1]`` projections.
    """
    n_seg, n_points = starts.shape[0], n_steps + 1
    alphas = torch.linspace(0, 1, n_points, dtype=starts.dtype, device=starts.device)
    seg_ids = path.row_ids(tuple(path.target.shape) + (n_seg // path.target.numel(),))
    values = torch.empty(n_seg * n_points, dtype=torch.float64, device=starts.device)
    proj = torch.empty(n_seg * n_points, pieces.shape[1], dtype=torch.float64,
                       device=starts.device)
    with torch.enable_grad():
        for begin in range(0, n_seg * n_points, chunk):
            rows = torch.arange(begin, min(begin + chunk, n_seg * n_points),
                                device=starts.device)
            seg, step = rows // n_points, rows % n_points
            points, ids = pad_rows(starts[seg] + alphas[step, None] * diffs[seg], seg_ids[seg])
            points.requires_grad_(True)
            out = readout_values(readout, points, ids, path.log)
            (grad,) = torch.autograd.grad(out.sum(), points)
            n_real = rows.shape[0]
            values[rows] = out[:n_real].detach().double()
            proj[rows] = torch.einsum("rhd,rd->rh", pieces[seg], grad[:n_real].double())
    return values.view(n_seg, n_points), proj.view(n_seg, n_points, -1)


def head_credits(readout: Readout, path: PathNodes, values: Tensor, segments: Sequence[int],
                 pieces: Tensor, n_steps: int, chunk: int) -> tuple[Tensor, Tensor]:
    """Split the credits of the attention segments over the heads.

    Args:
        readout (callable): The lens readout.
        path (PathNodes): The sub-layer paths, nodes ``[B, P, K + 1, d]``.
        values (Tensor): ``[B, P, K + 1]`` ``f`` at every node (as read out for the credits).
        segments (sequence of int): The ``A`` node positions ``m`` of the ``L.attn`` nodes;
            segment ``m`` runs from node ``m - 1`` to node ``m``.
        pieces (Tensor): ``[B, P, A, H, d]`` float64 head contributions ``c_h``.
        n_steps (int): Grid steps per segment (>= 1).
        chunk (int): Readout rows per chunk.

    Returns:
        (heads, rest): ``[B, P, A, H]`` and ``[B, P, A]`` in ``values``' dtype and units;
        ``heads.sum(-1) + rest`` is the attention credit ``values[..., m] - values[..., m-1]``
        up to one rounding of each.
    """
    nodes = path.nodes
    batch, n_pos, _, d = nodes.shape
    cols = torch.as_tensor(list(segments), device=nodes.device)
    starts, ends = nodes[:, :, cols - 1], nodes[:, :, cols]
    diffs = (ends - starts).reshape(-1, d)
    rest = diffs.double() - pieces.reshape(diffs.shape[0], -1, d).sum(1)
    pieces = torch.cat([pieces.reshape(diffs.shape[0], -1, d), rest[:, None]], dim=1)
    grid, proj = _grid_gradients(readout, path, starts.reshape(-1, d), diffs, pieces,
                                 n_steps, chunk)
    # the path's own node values at both ends: the steps then telescope to the credit
    grid[:, 0] = values[:, :, cols - 1].reshape(-1).double()
    grid[:, -1] = values[:, :, cols].reshape(-1).double()
    change = grid.diff(dim=-1)  # [N, n_steps]
    share = (proj[:, 1:] + proj[:, :-1]) / 2  # [N, n_steps, H + 1]
    total = share.sum(-1, keepdim=True)
    equal = torch.full_like(share, 1.0 / share.shape[-1])
    # exact: only a zero total has no proportions; its step is split evenly
    weights = torch.where(total != 0, share / total.where(total != 0, 1.0), equal)
    credit = (weights * change[..., None]).sum(1).to(values.dtype)
    credit = credit.view(batch, n_pos, len(segments), -1)
    return credit[..., :-1], credit[..., -1]
