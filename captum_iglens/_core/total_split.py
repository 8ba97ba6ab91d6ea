"""Total-effect estimators: from ``F`` and ``dF/dg`` at path points to per-block credits.

The gates move together, ``g = a * 1`` with ``a`` from 0 to 1, so ``dg_L / da = 1`` for every
gated block and integrated gradients along that line credit block ``L`` with
``int_0^1 dF/dg_L (a 1) da``; the credits add up to ``F(1) - F(0)``.

* **Exact step split** (``method="prediction_aware"``, the default): on the grid
  ``a_t = t / T`` each step's *observed* change ``dF_t = F(a_{t+1}) - F(a_t)`` is split among
  the blocks as its trapezoid Riemann term ``R_{t,L} = (G_L(a_t) + G_L(a_{t+1})) / 2 * da``
  plus the step's leftover ``e_t = dF_t - sum_L R_{t,L}`` shared in proportion to
  ``|G_L|`` (the step's averaged gradient), equally when every ``G_L`` is 0. Each step's
  credits add up to ``dF_t``, so the credits add up to ``F(1) - F(0)`` at any ``T``; the
  shares ``|G_L| / sum |G|`` lie in ``[0, 1]``, so a step whose gradients cancel (``sum G``
  near 0) cannot blow up the split as a proportional rule ``dF_t G_L / sum G`` would. The
  leftover is the trapezoid's error, ``O(da^3)`` per step, so the credits converge to IG.
* **Gradient estimators** (Captum's ``riemann_*`` and ``gausslegendre``, with Captum's own
  step sizes and alphas): ``sum_s w_s G_L(a_s)``; their convergence delta is the
  discretisation error.
* **Attribution patching** (``effect="atp"``): ``G_L(1) = grad_{h_L[i]} F . (u_L[i] - r_L)``,
  a first-order estimate of what removing block ``L``'s update alone changes; its sum is
  not ``F(1) - F(0)``.
"""

from __future__ import annotations

import torch
from torch import Tensor

from captum_iglens._core.estimators import is_exact
from captum_iglens._utils.captum_compat import approximation_parameters

__all__ = ["exact_split", "gradient_credits", "path_points", "split_steps"]


def path_points(method: str, n_steps: int, effect: str) -> tuple[Tensor, Tensor]:
    """The gate values ``a`` at which ``F`` and ``dF/dg`` are read, and their weights.

    Returns:
        (alphas, weights): float64 ``[N]``. Exact split: ``a_t = t / T``, ``t = 0..T``
        (weights unused, zeros). Gradient estimators: Captum's alphas then ``0`` and ``1``
        (the ends, weight 0). ``"atp"``: ``[1, 0]`` (weights ``[1, 0]``).
    """
    if effect == "atp":
        return torch.tensor([1.0, 0.0], dtype=torch.float64), torch.tensor(
            [1.0, 0.0], dtype=torch.float64)
    if is_exact(method):
        alphas = torch.linspace(0.0, 1.0, n_steps + 1, dtype=torch.float64)
        return alphas, torch.zeros_like(alphas)
    step_sizes_fn, alphas_fn = approximation_parameters(method)
    alphas = torch.tensor([*alphas_fn(n_steps), 0.0, 1.0], dtype=torch.float64)
    weights = torch.tensor([*step_sizes_fn(n_steps), 0.0, 0.0], dtype=torch.float64)
    return alphas, weights


def split_steps(change: Tensor, grads: Tensor, alphas: Tensor) -> Tensor:
    """Split each grid step's ``change`` among ``m`` parts: trapezoid term plus leftover by ``|G|``.

    Args:
        change (Tensor): ``[T, ...]`` what step ``t`` must be split into (``F(a_{t+1}) -
            F(a_t)``, or a node's step credit for its heads).
        grads (Tensor): ``[T + 1, ..., m]`` the parts' gradients at the grid points.
        alphas (Tensor): ``[T + 1]`` increasing, ``a_0 = 0`` and ``a_T = 1``.

    Returns:
        Tensor: ``[T, ..., m]`` float64 step credits; each step's add up to its ``change``
        up to float64 rounding.
    """
    wide_g = grads.double()
    step = (alphas[1:] - alphas[:-1]).to(wide_g)
    step = step.view(-1, *([1] * (grads.dim() - 1)))
    riemann = (wide_g[1:] + wide_g[:-1]) / 2 * step                  # [T, ..., m]
    leftover = change.double() - riemann.sum(-1)                    # [T, ...]
    weight = riemann.abs()
    total = weight.sum(-1, keepdim=True)
    share = torch.where(total > 0, weight / total.clamp(min=torch.finfo(total.dtype).tiny),
                        torch.full_like(weight, 1.0 / grads.shape[-1]))
    return riemann + leftover[..., None] * share


def exact_split(values: Tensor, grads: Tensor, alphas: Tensor) -> Tensor:
    """Split each grid step's observed change of ``F`` among the ``k`` gated blocks.

    Args:
        values (Tensor): ``[T + 1]`` ``F(a_t)``.
        grads (Tensor): ``[T + 1, k]`` ``dF/dg_L`` at ``a_t``.
        alphas (Tensor): ``[T + 1]`` increasing, ``a_0 = 0`` and ``a_T = 1``.

    Returns:
        Tensor: ``[k]`` credits in ``values``'s dtype; they add up to ``F(a_T) - F(a_0)``
        up to the rounding of the sums (accumulated in float64).
    """
    wide_v = values.double()
    return split_steps(wide_v[1:] - wide_v[:-1], grads, alphas).sum(0).to(values.dtype)


def gradient_credits(grads: Tensor, weights: Tensor) -> Tensor:
    """``sum_s w_s dF/dg_L(a_s)``: ``[k]`` from ``grads [N, k]`` and ``weights [N]``."""
    return (grads.double() * weights.to(grads.device)[:, None]).sum(0).to(grads.dtype)
