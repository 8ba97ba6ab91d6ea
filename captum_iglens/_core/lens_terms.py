"""Credits through a per-layer readout: block terms and lens terms (the readout seam).

With a readout ``g_L`` per layer the path ``g_0(b) -> g_1(h_1) -> ... -> g_n(h_n)``
telescopes into a block term ``g_L(h_L) - g_L(h_{L-1})`` per segment and a lens term
``g_L(h_{L-1}) - g_{L-1}(h_{L-1})`` where the readout changes; the estimators split the block
terms as they split the logit lens's segments (Section 3 of arXiv:2606.29693, per segment).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Optional

import torch
from torch import Tensor

from captum_iglens._core.estimators import ESTIMATORS, PathNodes
from captum_iglens.lens.layer_readout import is_per_layer
from captum_iglens.lens.readout import readout_probs
from captum_iglens.lens.spec import LensSpec

__all__ = ["estimate_with_lens"]


def estimate_with_lens(spec: LensSpec, path: PathNodes, probs: Tensor, method: str,
                       n_steps: int, chunk: int) -> tuple[Tensor, Optional[Tensor], Tensor]:
    """The credits of ``method`` through ``spec``'s readout seam, and the lens terms.

    With the logit lens (the default :class:`~captum_iglens.lens.layer_readout.LogitLens`)
    this is the estimator's row called once, unchanged: ``(credits, None, probs)``. With a
    per-layer readout ``g_L`` (``spec.lens``; the baseline is read at layer 0, node ``j`` at
    its hidden-state index ``L_j``, and ``g_n`` is the model's own readout) segment ``j`` is
    estimated through one readout, ``g_{L_j}``, from ``g_{L_j}(h_{L_{j-1}})`` to
    ``g_{L_j}(h_{L_j})`` (the block term), and the change of readout at its start,
    ``g_{L_j}(h_{L_{j-1}}) - g_{L_{j-1}}(h_{L_{j-1}})``, is its lens term: block terms plus
    lens terms add up to ``f(h_n) - g_0(b)`` (exactly for the exact estimator, up to the
    float32 rounding of each term). Any registered estimator works segment by segment.

    Args:
        spec (LensSpec): The lens (``spec.lens``, ``spec.layer_indices``; block nodes).
        path (PathNodes): ``[B, P, k + 1, d]`` nodes.
        probs (Tensor): ``[B, P, k + 1]`` ``f`` at every node through the model's readout
            (:func:`read_nodes`; its last entry is the checked ``f(h_n)``).
        method (str): A key of :data:`ESTIMATORS`.
        n_steps (int): Its steps per segment.
        chunk (int): Readout rows per chunk.

    Returns:
        (credits, lens_change, values): ``[B, P, k]`` block terms; ``[B, P, k]`` lens terms
        (``None`` for the logit lens); ``[B, P, k + 1]`` each node read at its own layer
        (``g_0(b)``, ``g_{L_j}(h_{L_j})``, ``f(h_n)``; ``probs`` for the logit lens).
    """
    row = ESTIMATORS[method]
    if not is_per_layer(spec.lens):
        return row.estimate(spec.readout, path, probs, method, n_steps, chunk), None, probs
    batch, n_pos, n_nodes, d = path.nodes.shape
    layers = (0, *spec.layer_indices)
    ids = path.row_ids((batch, n_pos))

    def read(node: int, layer: int) -> Tensor:
        points = path.nodes[:, :, node].reshape(-1, d)
        return readout_probs(spec.readout_at(layer), points, ids, chunk, path.log).view(
            batch, n_pos)

    own = [read(j, layers[j]) for j in range(n_nodes - 1)] + [probs[..., -1]]
    credits, changes = [], []
    for j in range(1, n_nodes):
        start = own[j - 1] if layers[j] == layers[j - 1] else read(j - 1, layers[j])
        segment = replace(path, nodes=path.nodes[:, :, j - 1:j + 1])
        credits.append(row.estimate(spec.readout_at(layers[j]), segment,
                                    torch.stack([start, own[j]], dim=-1), method, n_steps,
                                    chunk))
        changes.append((start.double() - own[j - 1].double()).to(probs.dtype))
    return torch.cat(credits, dim=-1), torch.stack(changes, dim=-1), torch.stack(own, dim=-1)
