"""IG-Lens estimators: the credit of each segment of the path, as a registry.

The path runs through the nodes ``b = h_{L_0}, h_{L_1}, ..., h_{L_k}``; segment ``j`` is the
straight line ``h_{L_{j-1}} -> h_{L_j}`` and its credit approximates the integral of
``grad f`` along it (arXiv:2606.29693). ``f`` is the readout of :class:`PathNodes`: the
target's probability (or log-probability), or with a foil the contrast ``F = f_y - f_foil``.
Every estimator takes the same :class:`PathNodes` and returns credits ``[B, P, k]``:

- ``prediction_aware`` (default; IDGI-style): each grid step is credited its observed change
  ``f(h(a_s)) - f(h(a_{s-1}))``; for a scalar readout the interior points cancel exactly, so
  a segment's credit *is* its endpoint difference: no backward pass, any ``n_steps``.
- Captum's approximation rules (``riemann_left/right/middle/trapezoid``, ``gausslegendre``):
  ``(h_end - h_start) . sum_s w_s grad f(h(a_s))``, the paper's reference variant; the
  convergence delta is their discretisation error and shrinks as ``n_steps`` grows.

Adding an estimator is one function and one row of :data:`ESTIMATORS`.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Callable, Optional

import torch
from torch import Tensor

from captum_iglens._captum_compat import CAPTUM_APPROXIMATION_METHODS, approximation_parameters
from captum_iglens._progress import progress_bar
from captum_iglens.readout import Readout, pad_rows, readout_probs, readout_values

__all__ = [
    "CONVERGENCE_WARNING",
    "ESTIMATORS",
    "METHODS",
    "UNITS",
    "PathNodes",
    "final_probs",
    "grid_probs",
    "node_probs",
    "warn_if_not_converged",
]


@dataclass(frozen=True)
class PathNodes:
    """The nodes of IG-Lens paths for ``B`` inputs and ``P`` positions, and their readout.

    Attributes:
        nodes (Tensor): ``[B, P, k + 1, d]``: the baseline, then the residuals at the ``k``
            chosen layers (model dtype).
        target (Tensor): ``[B, P]`` int64 target ids.
        log (bool): Read out log-probabilities (nats) instead of probabilities.
        contrast (Tensor, optional): ``[B, P]`` int64 foil ids: the readout is then
            ``F = f_target - f_foil`` (see :func:`~captum_iglens.readout.lens_values`).
    """

    nodes: Tensor
    target: Tensor
    log: bool = False
    contrast: Optional[Tensor] = None

    @property
    def ids(self) -> Tensor:
        """``[B, P]`` target ids, or ``[B, P, 2]`` (target, foil) ids when contrastive."""
        if self.contrast is None:
            return self.target
        return torch.stack([self.target, self.contrast], dim=-1)

    def row_ids(self, grid: tuple[int, ...]) -> Tensor:
        """The ids of every point of a ``[B, P, ...]`` grid, flattened: ``[N]`` or ``[N, 2]``."""
        ids = self.ids
        pair = tuple(ids.shape[2:])
        ids = ids.reshape(*ids.shape[:2], *([1] * (len(grid) - 2)), *pair)
        return ids.expand(*grid, *pair).reshape(-1, *pair)


def node_probs(readout: Readout, path: PathNodes, chunk: int) -> Tensor:
    """``f`` at every node: ``[B, P, k + 1]`` (float32; float64 models: float64).

    Probabilities, or log-probabilities in nats when ``path.log``; with ``path.contrast``
    their difference ``F = f_target - f_foil``.
    """
    batch, n_pos, n_nodes, d = path.nodes.shape
    ids = path.row_ids((batch, n_pos, n_nodes))
    probs = readout_probs(readout, path.nodes.reshape(-1, d), ids, chunk, path.log)
    return probs.view(batch, n_pos, n_nodes)


def final_probs(readout: Readout, path: PathNodes, values: Tensor, chunk: int) -> Tensor:
    """The readout's probabilities at ``h_n``, for the check against the model's own.

    Args:
        readout (callable): The lens readout.
        path (PathNodes): The paths.
        values (Tensor): ``[B, P, k + 1]`` :func:`node_probs` of ``path``.
        chunk (int): Rows per readout call.

    Returns:
        Tensor: ``[B, P]`` the target's probability, or ``[B, P, 2]`` the target's and the
        foil's when contrastive (read out again: ``F`` alone does not give them).
    """
    if path.contrast is None:
        last = values[..., -1]
        return last.exp() if path.log else last
    batch, n_pos, _, d = path.nodes.shape
    h_n = path.nodes[:, :, -1].reshape(-1, d)
    ids = torch.cat([path.target.reshape(-1), path.contrast.reshape(-1)])
    probs = readout_probs(readout, torch.cat([h_n, h_n]), ids, chunk)
    return probs.view(2, batch, n_pos).permute(1, 2, 0)


def grid_probs(readout: Readout, path: PathNodes, n_steps: int, chunk: int) -> Tensor:
    """``f`` on ``n_steps + 1`` uniform points of every segment: ``[B, P, k, n_steps + 1]``."""
    nodes = path.nodes
    alphas = torch.linspace(0, 1, n_steps + 1, dtype=nodes.dtype, device=nodes.device)
    start, end = nodes[:, :, :-1, None], nodes[:, :, 1:, None]
    grid = start + alphas[:, None] * (end - start)  # [B, P, k, n_steps + 1, d]
    ids = path.row_ids(tuple(grid.shape[:-1]))
    probs = readout_probs(readout, grid.reshape(-1, grid.shape[-1]), ids, chunk, path.log)
    return probs.view(grid.shape[:-1])


def _prediction_aware(
    readout: Readout, path: PathNodes, probs: Tensor, method: str, n_steps: int, chunk: int
) -> Tensor:
    # Interior grid points cancel exactly: the credit of a segment is its endpoint
    # difference; differences taken in float64 are exact for float32 probabilities.
    wide = probs.double()
    return (wide[..., 1:] - wide[..., :-1]).to(probs.dtype)


def _gradient(
    readout: Readout, path: PathNodes, probs: Tensor, method: str, n_steps: int, chunk: int
) -> Tensor:
    """Riemann / Gauss-Legendre IG along each segment, with Captum's step rules."""
    if n_steps < 2:
        raise ValueError(f"method={method!r} needs n_steps >= 2, got {n_steps}.")
    step_sizes_fn, alphas_fn = approximation_parameters(method)
    nodes, out_dtype = path.nodes, probs.dtype
    batch, n_pos, n_nodes, d = nodes.shape
    starts = nodes[:, :, :-1].reshape(-1, d)
    diffs = (nodes[:, :, 1:] - nodes[:, :, :-1]).reshape(-1, d)
    seg_ids = path.row_ids((batch, n_pos, n_nodes - 1))
    alphas = torch.tensor(alphas_fn(n_steps), dtype=nodes.dtype, device=nodes.device)
    steps = torch.tensor(step_sizes_fn(n_steps), dtype=out_dtype, device=nodes.device)
    n_rows = starts.shape[0] * n_steps
    credits = torch.zeros(starts.shape[0], dtype=out_dtype, device=nodes.device)
    bar = progress_bar(total=n_rows, desc=f"IG-Lens {method} readouts", unit="row")
    with torch.enable_grad(), bar:
        for begin in range(0, n_rows, chunk):
            rows = torch.arange(begin, min(begin + chunk, n_rows), device=nodes.device)
            seg, step = rows // n_steps, rows % n_steps
            points, ids = pad_rows(starts[seg] + alphas[step, None] * diffs[seg], seg_ids[seg])
            points.requires_grad_(True)
            values = readout_values(readout, points, ids, path.log)
            (grad,) = torch.autograd.grad(values.sum(), points)
            grad = grad[: rows.shape[0]]  # rows are independent: padding adds nothing
            contrib = (grad.to(out_dtype) * diffs[seg].to(out_dtype)).sum(-1) * steps[step]
            credits.index_add_(0, seg, contrib)
            bar.update(int(rows.shape[0]))
    return credits.view(batch, n_pos, n_nodes - 1)


Estimator = Callable[[Readout, PathNodes, Tensor, str, int, int], Tensor]

#: ``method`` name -> estimator ``(readout, path, node_probs, method, n_steps, chunk) ->
#: credits [B, P, k]``.
ESTIMATORS: dict[str, Estimator] = {
    "prediction_aware": _prediction_aware,
    **{name: _gradient for name in CAPTUM_APPROXIMATION_METHODS},
}

#: Estimator names accepted by :meth:`~captum_iglens.IGLens.attribute`.
METHODS: tuple[str, ...] = tuple(ESTIMATORS)

#: Readouts IG-Lens can decompose: probability (the paper's) or log-probability (nats).
UNITS: tuple[str, ...] = ("probability", "log-probability")

#: A gradient estimate whose ``|sum - delta_p|`` exceeds this (in the readout's units) has
#: not converged: the caller is warned.
CONVERGENCE_WARNING = 1e-3


def warn_if_not_converged(credits: Tensor, delta_p: Tensor, method: str, n_steps: int) -> None:
    """Warn when a gradient estimate's ``|sum - delta_p|`` exceeds the threshold."""
    if method == "prediction_aware":
        return
    err = float((credits.double().sum(-1) - delta_p.double()).abs().max())
    if err > CONVERGENCE_WARNING:
        warnings.warn(
            f"IG-Lens's {method} estimate has not converged: max |sum of credits - Δp| = "
            f"{err:.3g} (n_steps={n_steps}, {credits.shape[-1]} segments). Raise n_steps, "
            "choose more layers (shorter segments), or use method='prediction_aware', which "
            "is exact at any n_steps.",
            stacklevel=4,
        )
