"""Test tolerances that follow from floating-point arithmetic, not from one machine's output.

Two float32 computations of the same quantity in different orders (another chunk size,
batch shape, BLAS kernel or thread count) differ by rounding only, and rounding is bounded
by the size of what is computed. ``u = eps / 2`` is the unit roundoff (float32:
``eps = 2**-23 ~ 1.19e-7``).

* A sum of ``n`` terms ``t_i``, in any order, has error ``<= (n - 1) u sum|t_i|`` (Higham,
  *Accuracy and Stability of Numerical Algorithms*, 2nd ed., section 4.2). Used as it is for
  short sums: the ``k`` credits of a completeness check (:func:`completeness_tol`).
* Long dot products (hidden size, MLP width) run in blocked / pairwise BLAS kernels whose
  rounding errors are independent in practice; their error is then ``~ sqrt(n) u sum|t_i|``
  (Higham and Mary, "A new approach to probabilistic rounding error analysis", SIAM J. Sci.
  Comput. 41(5), 2019). :func:`f32_tol` uses ``eps sqrt(n) sum|t_i|``: ``sqrt(n)`` covers
  ``log2(n)`` plus the block length of pairwise kernels too, and ``eps = 2u`` gives a factor
  2 for the terms a first-order analysis drops.
* A forward pass composes such dot products with pointwise ops. To first order its float32
  result is the exact result for weights and intermediate values each perturbed by a
  relative amount ``<= sqrt(n) u`` (backward error), so its error is at most
  ``sqrt(n) u S`` with the sensitivity ``S = sum |x * dy/dx|`` over every weight and
  intermediate value ``x`` of the computation (:func:`sensitivity`): the "sum of |terms|"
  of the whole computation, carried to the output.

Comparing two float32 evaluations, pass both magnitudes: each is within its own bound of the
exact value. The softmax normaliser sums ``V`` positive terms (relative error
``<= log2(V) u`` in a pairwise sum, below the ``sqrt(n)`` of the dot products here).

These are bounds, not estimates: observed differences sit 100 to 2000 times below them.
Never tighten one to what a machine shows; each test instead checks that the errors it
exists to catch (a wrong mask, a dropped soft-cap, a lost chunk row) stand far above it.
Where two computations run the *same* operations on the same values and shapes (a copy, a
wrapper making the very same call, accelerate moving weights), the tests assert equality:
IEEE arithmetic is deterministic, and no tolerance is needed. Half-precision copies of a
model are compared with :func:`quantization_tol`, a statistical bound: the worst case is
as large as the credits themselves.
"""

from __future__ import annotations

import inspect
import math
from contextlib import contextmanager
from typing import Callable, Iterable, Iterator, Optional, Union

import torch
from torch import Tensor, nn

# One copy of each helper: the package's (captum_iglens.testing), re-exported for the tests.
from captum_iglens.results._bounds import completeness_bound as completeness_tol  # noqa: F401
from captum_iglens.testing._bounds import (  # noqa: F401
    logit_magnitude,
    readout_prob_magnitude,
    reduction_length,
)

EPS32 = torch.finfo(torch.float32).eps  # 2**-23 ~ 1.19e-7

Number = Union[float, Tensor]


def f32_tol(*magnitudes: Number, n_terms: int = 1, eps: float = EPS32) -> Number:
    """``eps * sqrt(n_terms) * sum(|magnitudes|)``: the rounding bound of float32 results.

    Args:
        magnitudes: the "sum of |terms|" of each computation being compared (floats or
            tensors that broadcast together), e.g. :func:`sensitivity` of both results.
        n_terms: length of the longest dot product / sum inside the computation (1 for
            a single rounding).
        eps: machine epsilon of the dtype the computation rounds in (default float32).

    Returns a float or a tensor of the broadcast shape.
    """
    total: Number = 0.0
    for mag in magnitudes:
        total = total + (mag.detach().double().abs() if isinstance(mag, Tensor) else abs(mag))
    return eps * math.sqrt(max(n_terms, 1)) * total


@contextmanager
def _recorded_activations(module: nn.Module) -> Iterator[dict[int, Tensor]]:
    """Record every grad-carrying tensor entering or leaving a leaf module of ``module``
    (by id: a block's output is the next block's input)."""
    acts: dict[int, Tensor] = {}

    def keep(tensors: Iterable[object]) -> None:
        for t in tensors:
            if isinstance(t, Tensor) and t.is_floating_point() and t.requires_grad:
                acts[id(t)] = t

    def hook(_m: nn.Module, args: tuple, output: object) -> None:
        keep(args)
        keep(output if isinstance(output, (tuple, list)) else (output,))

    leaves = [m for m in module.modules() if next(m.children(), None) is None]
    handles = [m.register_forward_hook(hook) for m in leaves]
    try:
        yield acts
    finally:
        for handle in handles:
            handle.remove()


@contextmanager
def _differentiable_eval(module: nn.Module) -> Iterator[list[Tensor]]:
    """``module`` in eval mode with every floating-point parameter requiring grad; modes
    and ``requires_grad`` flags are restored on exit. Yields the parameters."""
    params = [p for p in module.parameters() if p.is_floating_point()]
    flags = [p.requires_grad for p in params]
    modes = [(m, m.training) for m in module.modules()]
    module.eval()
    try:
        for p in params:
            p.requires_grad_(True)
        with torch.enable_grad():
            yield params
    finally:
        for p, flag in zip(params, flags, strict=True):
            p.requires_grad_(flag)
        for m, mode in modes:
            m.training = mode


def sensitivity(
    module: nn.Module,
    fn: Callable[[], Tensor],
    inputs: Iterable[Tensor] = (),
    order: int = 1,
) -> Tensor:
    """``S_i = |y_i| + sum |x * dy_i/dx|`` for each output ``y_i`` of ``fn()``.

    ``x`` runs over every floating-point parameter of ``module``, every tensor entering or
    leaving one of its leaf modules during ``fn()`` (norm outputs, logits, projections,
    attention outputs, the residual stream fed to each norm) and the given ``inputs``
    (which must require grad). This is the first-order effect of perturbing each of them by
    a relative amount 1: multiplied by the relative rounding ``eps sqrt(n)`` of
    :func:`f32_tol` it bounds the rounding error of ``y_i``. Parameter gradients are
    computed with ``torch.autograd.grad``: ``.grad`` is never touched.

    ``order=2`` gives ``sqrt(y_i^2 + sum (x * dy_i/dx)^2)`` instead: the scale of the
    error when each rounding is independent (:func:`quantization_tol`).

    ``module`` runs in eval mode with gradients enabled; its modes and ``requires_grad``
    flags are restored. Returns ``[N]`` float64 for the ``N`` elements of ``fn()``.
    """
    with _differentiable_eval(module) as params, _recorded_activations(module) as acts:
        out = fn().reshape(-1)
        wrt = params + list(acts.values()) + list(inputs)
        total = out.detach().double().abs() ** order
        # One backward pass per output, batched (vmap over rows of the identity) in groups
        # that keep the per-output gradients of everything in ``wrt`` under ~256 MB.
        size = sum(x.numel() for x in wrt)
        eye = torch.eye(out.numel(), dtype=out.dtype, device=out.device)
        start = 0
        for rows in eye.split(max(1, (1 << 26) // max(size, 1))):
            grads = torch.autograd.grad(out, wrt, grad_outputs=rows, is_grads_batched=True,
                                        retain_graph=True, allow_unused=True)
            for x, g in zip(wrt, grads, strict=True):
                if g is not None:
                    terms = (x.detach() * g).abs().flatten(1).double()
                    total[start:start + len(rows)] += (terms ** order).sum(1)
            start += len(rows)
    return total ** (1 / order)


def _target_probs(logits: Tensor, target: Optional[Tensor]) -> Tensor:
    """``softmax(logits)`` at ``target`` (all of it for ``target=None``), as IG-Lens takes it:
    a float32 (or float64) log-softmax, exponentiated."""
    log_probs = torch.log_softmax(logits.to(torch.promote_types(logits.dtype, torch.float32)),
                                  dim=-1)
    if target is None:
        return log_probs.exp()
    return log_probs.gather(-1, target[..., None].to(log_probs.device))[..., 0].exp()


def readout_sensitivity(readout: nn.Module, hidden: Tensor,
                        target: Optional[Tensor] = None) -> Tensor:
    """:func:`sensitivity` of ``f = softmax(readout(hidden))[target]`` over the readout alone
    (final norm, head and their inputs and outputs), for pre-final-norm residuals
    ``hidden [..., d]``. The bound for two readouts of the *same* residual: another row
    count or chunk, or the model's own final norm and head in a forward pass of the same
    shapes. ``target`` is ``hidden.shape[:-1]`` or one dimension less (one target for all
    nodes of a path); returns ``hidden.shape[:-1]`` (``+ (V,)`` for ``target=None``)."""
    hidden = hidden.detach()
    if target is not None and target.dim() == hidden.dim() - 2:
        target = target[..., None].expand(hidden.shape[:-1])
    sens = sensitivity(readout, lambda: _target_probs(readout(hidden), target))
    shape = target.shape if target is not None else None
    return sens.view(shape) if shape is not None else sens.view(*hidden.shape[:-1], -1)


def _forward_kwargs(model: nn.Module, mask: Optional[Tensor]) -> dict:
    """The forward arguments IG-Lens passes: no cache; the mask and, for models that take
    them, position ids derived from it (left padding)."""
    kwargs: dict = {"use_cache": False}
    if mask is not None:
        kwargs["attention_mask"] = mask
        if "position_ids" in inspect.signature(model.forward).parameters:
            kwargs["position_ids"] = (mask.long().cumsum(-1) - 1).clamp(min=0)
    return kwargs


def _residuals(lens: object, inputs: Tensor, indices: set[int],
               mask: Optional[Tensor]) -> dict[int, Tensor]:
    """``{l: h_l [B, S, d]}`` from one forward pass (in the graph when gradients are on):
    ``h_0`` is the input of the first block, ``h_l`` the output of block ``l``."""
    model, blocks = lens.model, lens.decoder_blocks
    states: dict[int, Tensor] = {}

    def pre_hook(_m: nn.Module, args: tuple, kwargs: dict) -> None:
        states[0] = args[0] if args else kwargs["hidden_states"]

    def make_hook(index: int) -> Callable:
        def hook(_m: nn.Module, _a: tuple, output: object) -> None:
            states[index] = output if isinstance(output, Tensor) else output[0]
        return hook

    handles = [blocks[0].register_forward_pre_hook(pre_hook, with_kwargs=True)] if 0 in indices \
        else []
    handles += [blocks[i - 1].register_forward_hook(make_hook(i)) for i in indices if i > 0]
    try:
        model(inputs, **_forward_kwargs(model, mask))
    finally:
        for handle in handles:
            handle.remove()
    return states


def _nodes(lens: object, inputs: Tensor, positions: list[int],
           baselines: Union[str, Tensor], mask: Optional[Tensor]) -> Tensor:
    """``[b, h_{L_1}, ..., h_{L_k}]`` at ``positions``: ``[B, P, k + 1, d]``, with the
    baseline built as IG-Lens builds it (captum_iglens._core.baselines): "zero", "embedding"
    (``h_0`` there), "mean" (masked mean of ``h_1`` over positions ``<= p``), reference ids
    (their ``h_n`` there) or a residual-space tensor."""
    from captum_iglens._core.baselines import MEAN_BASELINE_LAYER

    indices = list(lens.layer_indices)
    last = len(lens.decoder_blocks)
    pos = [p % inputs.shape[1] for p in positions]
    states = _residuals(lens, inputs, set(indices) | {0, MEAN_BASELINE_LAYER}, mask)
    hidden = torch.stack([states[i][:, pos] for i in indices], dim=2)  # [B, P, k, d]
    if isinstance(baselines, Tensor) and not baselines.is_floating_point():
        base = _residuals(lens, baselines, {last}, mask)[last][:, pos]
    elif isinstance(baselines, Tensor):
        base = baselines.to(hidden.dtype)
        base = base[:, None] if base.dim() == 2 else base
        base = base[:, pos] if base.dim() == 3 and base.shape[1] == inputs.shape[1] else base
        base = base.expand_as(hidden[:, :, 0])
    elif baselines == "zero":
        base = torch.zeros_like(hidden[:, :, 0])
    elif baselines == "embedding":
        base = states[0][:, pos]
    else:
        # causal: position p averages the attended positions 0..p only
        first = states[MEAN_BASELINE_LAYER]
        weights = (torch.ones(first.shape[:2], dtype=first.dtype) if mask is None
                   else mask.to(first.dtype))[..., None]
        base = torch.stack([(first[:, :p + 1] * weights[:, :p + 1]).sum(1)
                            / weights[:, :p + 1].sum(1).clamp(min=1) for p in pos], dim=1)
    return torch.cat([base[:, :, None], hidden], dim=2)


def lens_nodes(lens: object, inputs: Tensor, positions: list[int],
               baselines: Union[str, Tensor] = "mean", mask: Optional[Tensor] = None) -> Tensor:
    """The path nodes ``[b, h_{L_1}, ..., h_{L_k}]`` of ``lens`` (an ``IGLens``) at
    ``positions``: ``[B, P, k + 1, d]``, detached, from an eval-mode forward pass."""
    modes = [(m, m.training) for m in lens.model.modules()]
    lens.model.eval()
    try:
        with torch.no_grad():
            return _nodes(lens, inputs, positions, baselines, mask)
    finally:
        for m, mode in modes:
            m.training = mode


def node_sensitivity(
    lens: object,
    inputs: Tensor,
    positions: list[int],
    target: Tensor,
    baselines: Union[str, Tensor] = "mean",
    mask: Optional[Tensor] = None,
    order: int = 1,
) -> Tensor:
    """:func:`sensitivity` of the readout ``f`` at every path node over the *whole model*:
    the bound for two forward passes that run in different orders (a left-padded batch
    against its rows one at a time). ``[B, P, k + 1]``."""
    batch = inputs.shape[0]
    tgt = torch.as_tensor(target).expand(batch, len(positions))

    def forward() -> Tensor:
        nodes = _nodes(lens, inputs, positions, baselines, mask)
        return _target_probs(lens.readout(nodes), tgt[:, :, None].expand(nodes.shape[:3]))

    sens = sensitivity(lens.model, forward, order=order)
    return sens.view(batch, len(positions), len(lens.layer_indices) + 1)


def quantization_tol(l2: Number, eps: float) -> Number:
    """Six standard deviations of the first-order error of a computation whose weights and
    intermediate values are each rounded once, independently, to a format with machine
    epsilon ``eps`` (a float16 / bfloat16 copy of a float32 model, accumulating in float32
    as CPU kernels do). Each rounding is uniform within ``+-u |x|`` (``u = eps / 2``,
    variance ``u^2 x^2 / 3``), so the error has standard deviation
    ``u / sqrt(3) * sqrt(sum (x dy/dx)^2)``: ``l2`` from :func:`sensitivity` with
    ``order=2``. (The worst case, all roundings aligned, is the ``order=1`` sum, as large as
    the credits themselves in bfloat16.)"""
    return 6 * (eps / 2) / math.sqrt(3) * l2


def credit_sensitivity(nodes: Tensor) -> Tensor:
    """Sensitivity ``[..., k]`` of the prediction-aware credits ``f(node_j) - f(node_{j-1})``
    from node sensitivities ``[..., k + 1]``."""
    return nodes[..., 1:] + nodes[..., :-1]


def _segment_points(nodes: Tensor, method: str, n_steps: int) -> tuple[Tensor, Tensor, Tensor]:
    """Captum's quadrature for ``method``: points ``[..., k, n_steps, d]``, the segment
    vectors ``[..., k, n_steps, d]`` and the step weights ``[n_steps]`` (float64)."""
    from captum.attr._utils.approximation_methods import approximation_parameters

    step_sizes, alphas = approximation_parameters(method)
    alpha = torch.tensor(alphas(n_steps), dtype=nodes.dtype)
    weights = torch.tensor(step_sizes(n_steps), dtype=torch.float64)
    start, diff = nodes[..., :-1, None, :], (nodes[..., 1:, :] - nodes[..., :-1, :])[..., None, :]
    points = start + alpha[:, None] * diff
    return points, diff.expand_as(points), weights


def _norm_terms(norm: nn.Module, x: Tensor, d: Tensor) -> tuple[Tensor, ...]:
    """For a final norm at points ``x`` and directions ``d`` (float64): the output ``n``, its
    directional derivative ``n'``, their sums of absolute terms, and the map ``v -> J^T v``
    (the backward pass). LayerNorm (``g (x - mean) / s + b``) or a Llama-style RMSNorm
    (``g x / r``)."""
    gamma = norm.weight.detach().double()
    dim = x.shape[-1]
    if isinstance(norm, nn.LayerNorm):
        beta = norm.bias.detach().double() if norm.bias is not None else torch.zeros_like(gamma)
        mu = x.mean(-1, keepdim=True)
        c, dc = x - mu, d - d.mean(-1, keepdim=True)
        scale = torch.sqrt((c * c).mean(-1, keepdim=True) + norm.eps)
        x_abs = (x.abs() + mu.abs()) / scale  # x - mean rounds relative to |x| + |mean|
        d_abs = d.abs() + d.mean(-1, keepdim=True).abs()
    elif type(norm).__name__.endswith("RMSNorm") and "Gemma" not in type(norm).__name__:
        beta = torch.zeros_like(gamma)
        c, dc = x, d
        eps = getattr(norm, "variance_epsilon", getattr(norm, "eps", 0.0))
        scale = torch.sqrt((x * x).mean(-1, keepdim=True) + eps)
        x_abs, d_abs = x.abs() / scale, d.abs()
    else:
        raise NotImplementedError(f"no closed form for {type(norm).__name__}")
    xh = c / scale
    n = gamma * xh + beta
    nd = gamma / scale * (dc - xh * (xh * dc).sum(-1, keepdim=True) / dim)
    n_abs = gamma.abs() * x_abs + beta.abs()
    nd_abs = gamma.abs() / scale * (d_abs + xh.abs() * (xh * dc).abs().sum(-1, keepdim=True) / dim)

    def backward(v: Tensor) -> Tensor:
        gv = gamma * v
        if isinstance(norm, nn.LayerNorm):
            gv = gv - gv.mean(-1, keepdim=True)
        return (gv - xh * (xh * gamma * v).sum(-1, keepdim=True) / dim) / scale

    return n, nd, n_abs, nd_abs, backward


def head_gradient_magnitude(readout: nn.Module, nodes: Tensor, target: Tensor, method: str,
                            n_steps: int) -> Tensor:
    """Sum of |terms| of a gradient estimator's credits, ``[..., k]``, for path ``nodes
    [..., k + 1, d]`` and a readout made of a final norm (LayerNorm or Llama RMSNorm) and a
    linear head (Llama, SmolLM2, GPT-2, GPT-NeoX), in float64.

    A credit is ``sum_s w_s f'(x_s)`` over Captum's quadrature points ``x_s`` of its
    segment, with the directional derivative ``f' = grad f . d`` along the segment vector
    ``d``. With ``n`` the norm's output, ``z = W n + b``, ``p = softmax(z)`` and
    ``z' = W n'``, ``f' = p_y (z'_y - sum_v p_v z'_v)``. Every sum in it is bounded by the
    same sum of absolute values, whichever order forward and backward pass take: ``A = |W|
    |n'|abs`` for ``z'``, ``Z = |W| |n|abs + |b|`` for the logits (whose errors move ``p``,
    hence ``f'`` by ``|f'|abs (Z_y + sum p Z)``), and ``|grad f| . |d|`` for the last dot
    product; ``|n|abs``, ``|n'|abs`` carry the norm's own sums (mean, variance). Per point::

        S = p_y (A_y + sum_v p_v A_v) + p_y (|z'_y| + sum_v p_v |z'_v|) (Z_y + sum_v p_v Z_v)
            + sum_i |grad_i d_i|

    and the credit's magnitude is ``sum_s |w_s| S_s``. (:func:`sensitivity` gives the same
    to within a factor 1.5 through double backward, at 100 times the cost.)
    """
    if list(getattr(readout, "pre_unembed", [])) or getattr(readout, "logit_transform", None):
        raise NotImplementedError("a readout with projections or a logit transform")
    head = readout.unembed
    w = head.weight.detach().double()
    bias = head.bias.detach().double().abs() if head.bias is not None else 0.0
    points, d, weights = _segment_points(nodes.detach().double(), method, n_steps)
    n, nd, n_abs, nd_abs, backward = _norm_terms(readout.final_norm, points, d)
    p = torch.softmax(n @ w.T + (head.bias.detach().double() if head.bias is not None else 0),
                      -1)
    y = target.to(torch.long)[..., None, None, None].expand(*points.shape[:-1], 1)
    p_y = p.gather(-1, y)[..., 0]

    def at_y_plus_mean(t: Tensor) -> Tensor:
        return t.gather(-1, y)[..., 0] + (p * t).sum(-1)

    g_z = (-p_y[..., None] * p).scatter_add(-1, y, p_y[..., None])  # d p_y / d z
    grad = backward(g_z @ w)
    mag = (p_y * at_y_plus_mean(nd_abs @ w.abs().T)
           + p_y * at_y_plus_mean((nd @ w.T).abs()) * at_y_plus_mean(n_abs @ w.abs().T + bias)
           + (grad * d).abs().sum(-1))
    return (mag * weights.abs()).sum(-1)
