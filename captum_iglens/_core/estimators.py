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

Adding an estimator is one function and one :func:`register_estimator` call (its row in
:data:`ESTIMATORS`); the ``method`` names users and the CLI see read that registry.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Optional

import torch
from torch import Tensor

from captum_iglens._utils.captum_compat import (
    CAPTUM_APPROXIMATION_METHODS,
    approximation_parameters,
)
from captum_iglens._utils.progress import progress_bar
from captum_iglens._utils.typing import Readout
from captum_iglens.lens.distribution import wide_log_softmax
from captum_iglens.lens.readout import (
    ReadoutMismatchError,
    lens_values,
    pad_rows,
    readout_probs,
    readout_values,
)
from captum_iglens.settings import BUILTIN_MIN_STEPS, DEFAULT_METHOD
from captum_iglens.settings import METHODS as SETTINGS_METHODS
from captum_iglens.settings import UNITS as SETTINGS_UNITS

if TYPE_CHECKING:
    pass

__all__ = [
    "CONVERGENCE_WARNING",
    "COST_CLASSES",
    "ESTIMATORS",
    "EstimatorRow",
    "METHODS",
    "UNITS",
    "is_exact",
    "register_estimator",
    "PathNodes",
    "NodeValues",
    "grid_probs",
    "node_probs",
    "read_nodes",
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
            ``F = f_target - f_foil`` (see :func:`~captum_iglens.lens.readout.lens_values`).
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


def _shared_start(nodes: Tensor) -> bool:
    """Whether every position of each row starts from the same baseline vector (bitwise).

    ``"zero"`` and ``[d]`` / ``[B, d]`` baseline tensors: ``f(b)`` then needs one readout
    per row, not one per position.
    """
    base = nodes[:, :, 0]
    return base.shape[1] > 1 and torch.equal(base, base[:, :1].expand_as(base))


def _row_start_values(readout: Readout, path: PathNodes) -> Tensor:
    """``f`` at a shared baseline, read out once per row: ``[B, P]``."""
    batch, n_pos = path.target.shape
    rows, _ = pad_rows(path.nodes[:, 0, 0], path.target[:, 0])
    with torch.no_grad():
        logits = readout(rows)[:batch]
    log_probs = wide_log_softmax(logits)
    ids = path.row_ids((batch, n_pos))
    ids = ids.view(batch, n_pos, *ids.shape[1:])
    # each row's one distribution, viewed (not copied) once per position
    return torch.stack([lens_values(log_probs[r].expand(n_pos, -1), ids[r], path.log)
                        for r in range(batch)])


@dataclass
class NodeValues:
    """The readout at every node of the paths, and what the readout check compares.

    Attributes:
        values (Tensor): ``[B, P, k + 1]`` ``f`` at every node (float32; float64 models:
            float64), in the path's units (see :func:`node_probs`).
        final (Tensor, optional): The readout's probabilities at ``h_n``: ``[B, P]`` of the
            target, ``[B, P, 2]`` of target and foil when contrastive (``None`` unchecked).
        errors (Tensor, optional): ``[B * P]`` float32 on the CPU: ``max_v |log p_lens(h_n)_v
            - log p_model_v|`` against the model's own distribution (``None`` unchecked).
    """

    values: Tensor
    final: Optional[Tensor] = None
    errors: Optional[Tensor] = None


def _distribution_errors(log_probs: Tensor, reference: Tensor) -> Tensor:
    """``max_v |log_probs_v - reference_v|`` per row: ``[N]`` float32 on the CPU.

    Equal entries (``-inf`` included) count as equal, NaN as ``inf`` (as
    :func:`~captum_iglens.lens.distribution.log_prob_errors`, without a second log-softmax).
    """
    ref = reference.to(device=log_probs.device, dtype=log_probs.dtype)
    diff = (log_probs - ref).abs_()  # in place: one [N, V] temporary
    diff.masked_fill_(log_probs == ref, 0.0)
    return diff.nan_to_num_(nan=float("inf")).amax(-1).float().cpu()


def _read_final(readout: Readout, path: PathNodes, chunk: int,
                reference: Optional[Tensor]) -> NodeValues:
    """``h_n`` read out once: ``f`` there, and with ``reference [N, V]`` what the check needs.

    Raises:
        ReadoutMismatchError: the readout gives another number of logits than the model.
    """
    batch, n_pos, _, d = path.nodes.shape
    hidden = path.nodes[:, :, -1].reshape(-1, d)
    ids = path.row_ids((batch, n_pos))
    pair = ids.reshape(ids.shape[0], -1)
    values, final, errors = [], [], []
    with torch.no_grad():
        for start in range(0, hidden.shape[0], chunk):
            rows, _ = pad_rows(hidden[start:start + chunk], pair[start:start + chunk])
            n_real = min(chunk, hidden.shape[0] - start)
            logits = readout(rows)[:n_real]
            log_probs = wide_log_softmax(logits)
            del logits
            values.append(lens_values(log_probs, ids[start:start + n_real], path.log))
            if reference is None:
                continue
            ref = reference[start:start + n_real]
            if log_probs.shape != ref.shape:
                raise ReadoutMismatchError(
                    f"Invariant R failed for architecture {getattr(readout, 'name', '')!r}: "
                    f"the lens readout gives {log_probs.shape[-1]} logits per position, the "
                    f"model {ref.shape[-1]}; pass IGLens(model, readout=...) with the model's "
                    "own logits map.")
            final.append(log_probs.gather(-1, pair[start:start + n_real]).exp())
            errors.append(_distribution_errors(log_probs, ref))
    out = NodeValues(torch.cat(values).view(batch, n_pos))
    if reference is not None:
        probs = torch.cat(final).view(batch, n_pos, -1)
        out.final = probs if path.contrast is not None else probs[..., 0]
        out.errors = torch.cat(errors)
    return out


def read_nodes(readout: Readout, path: PathNodes, chunk: int,
               reference: Optional[Tensor] = None) -> NodeValues:
    """``f`` at every node, each node read out once, and the readout check's numbers.

    A baseline shared by a row's positions (:func:`_shared_start`) is read out once per
    row; ``h_n`` once for ``f``, the target's (and foil's) probability and, with
    ``reference``, the whole-distribution comparison with the model.

    Args:
        readout (callable): The lens readout.
        path (PathNodes): The paths ``[B, P, k + 1, d]``.
        chunk (int): Rows per readout call.
        reference (Tensor, optional): ``[B * P, V]`` the model's own log-probabilities at
            the explained positions (rows in ``B, P`` order): also compute ``final`` and
            ``errors``.

    Returns:
        NodeValues: values ``[B, P, k + 1]`` (and ``final``, ``errors`` with ``reference``).

    Raises:
        ReadoutMismatchError: (with ``reference``) another vocabulary size than the model's.
    """
    batch, n_pos, _, d = path.nodes.shape
    out = _read_final(readout, path, chunk, reference)
    first = 1 if _shared_start(path.nodes) else 0
    parts = [_row_start_values(readout, path)[..., None]] if first else []
    inner = path.nodes[:, :, first:-1]
    if inner.shape[2]:
        probs = readout_probs(readout, inner.reshape(-1, d),
                              path.row_ids(tuple(inner.shape[:-1])), chunk, path.log)
        parts.append(probs.view(batch, n_pos, -1))
    parts.append(out.values[..., None])
    out.values = torch.cat(parts, dim=-1)
    return out


def node_probs(readout: Readout, path: PathNodes, chunk: int) -> Tensor:
    """``f`` at every node: ``[B, P, k + 1]`` (float32; float64 models: float64).

    Probabilities, or log-probabilities in nats when ``path.log``; with ``path.contrast``
    their difference ``F = f_target - f_foil``. See :func:`read_nodes`.
    """
    return read_nodes(readout, path, chunk).values


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
    least = ESTIMATORS[method].min_steps if method in ESTIMATORS else 2
    if n_steps < least:
        raise ValueError(f"method={method!r} needs n_steps >= {least}, got {n_steps}.")
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


#: Cost classes of an estimator: ``"nodes"`` reads the ``k + 1`` path nodes out once each
#: (no backward pass, independent of ``n_steps``); ``"gradient"`` reads ``k * n_steps`` grid
#: points out and back-propagates through each; ``"grid"`` reads ``k * (n_steps + 1)``
#: points out without a backward pass.
COST_CLASSES: tuple[str, ...] = ("nodes", "gradient", "grid")


@dataclass(frozen=True)
class EstimatorRow:
    """An estimator and its facts, each read where it matters (none restated elsewhere).

    Attributes:
        estimate (Estimator): ``(readout, path, node_probs, method, n_steps, chunk) ->
            credits [B, P, k]``.
        exact (bool): The credits add up to ``delta_p`` at any ``n_steps`` and need no
            gradient (no backward pass; allowed under ``torch.inference_mode``; never warned
            about convergence).
        min_steps (int): The smallest ``n_steps`` accepted (checked by
            :func:`~captum_iglens._core.pipeline.check_estimator` and the CLI).
        cost (str): One of :data:`COST_CLASSES`.
    """

    estimate: Estimator
    exact: bool
    min_steps: int = 1
    cost: str = "nodes"


#: ``method`` name -> :class:`EstimatorRow` (the one registry; see :func:`register_estimator`).
ESTIMATORS: dict[str, EstimatorRow] = {
    DEFAULT_METHOD: EstimatorRow(_prediction_aware, exact=True,
                                 min_steps=BUILTIN_MIN_STEPS[DEFAULT_METHOD], cost="nodes"),
    **{name: EstimatorRow(_gradient, exact=False, min_steps=BUILTIN_MIN_STEPS[name],
                          cost="gradient") for name in CAPTUM_APPROXIMATION_METHODS},
}

#: Estimator names accepted by :meth:`~captum_iglens.IGLens.attribute`: live (a registered
#: estimator appears at once; see :func:`~captum_iglens.settings.methods`).
METHODS = SETTINGS_METHODS

#: Readouts IG-Lens can decompose: probability (the paper's) or log-probability (nats).
UNITS: tuple[str, ...] = SETTINGS_UNITS


def register_estimator(name: str, estimate: Estimator, *, exact: bool, min_steps: int = 1,
                       cost: Optional[str] = None) -> None:
    """Add an estimator under ``name`` for ``IGLens.attribute(method=name)``.

    After the call ``name`` is in :data:`METHODS`, :func:`~captum_iglens.settings.methods`
    and the CLI's ``--method`` choices.

    Args:
        name (str): The new ``method`` name.
        estimate (Estimator): ``(readout, path, node_probs, method, n_steps, chunk) ->
            credits [B, P, k]`` in the readout's units (probability or nats).
        exact (bool): Whether its credits add up to ``delta_p`` at any ``n_steps`` without
            gradients (then it is never warned about convergence).
        min_steps (int, optional): The smallest ``n_steps`` it accepts. Default: 1.
        cost (str, optional): One of :data:`COST_CLASSES`. Default: ``"nodes"`` if
            ``exact`` else ``"gradient"``.

    Raises:
        ValueError: ``name`` is already registered, ``min_steps < 1`` or an unknown ``cost``.
    """
    if name in ESTIMATORS:
        raise ValueError(f"An estimator named {name!r} exists: choose another name.")
    if int(min_steps) < 1:
        raise ValueError(f"min_steps must be >= 1, got {min_steps!r}.")
    cost = ("nodes" if exact else "gradient") if cost is None else cost
    if cost not in COST_CLASSES:
        raise ValueError(f"cost={cost!r}: use one of {COST_CLASSES}.")
    ESTIMATORS[name] = EstimatorRow(estimate, exact=exact, min_steps=int(min_steps), cost=cost)


def is_exact(method: str) -> bool:
    """Whether ``method``'s credits add up exactly at any ``n_steps`` (no gradient)."""
    row = ESTIMATORS.get(method)
    return row is not None and row.exact


#: A gradient estimate whose ``|sum - delta_p|`` exceeds this (in the readout's units) has
#: not converged: the caller is warned.
CONVERGENCE_WARNING = 1e-3


def warn_if_not_converged(credits: Tensor, delta_p: Tensor, method: str, n_steps: int) -> None:
    """Warn when a gradient estimate's ``|sum - delta_p|`` exceeds the threshold."""
    if is_exact(method):
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
