"""The runners of :func:`~captum_iglens.compare_completeness`: one per compared method.

Each runner explains one prediction (one row, one position, one target) and returns a
:class:`~captum_iglens.results.MethodCompleteness`. The Captum runners use Captum's own
:class:`~captum.attr.LayerIntegratedGradients` and :class:`~captum.attr.LayerConductance`,
one decoder layer at a time, hooked on the residual stream itself
(:func:`~captum_iglens.lens.hooks.residual_tap`).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Callable, Optional

import torch
from captum.attr import LayerConductance, LayerIntegratedGradients
from torch import Tensor, nn

from captum_iglens._core.inputs import position_ids_from_mask
from captum_iglens._utils.progress import progress_bar
from captum_iglens._utils.typing import BaselineSpec
from captum_iglens.ig_lens import IGLens
from captum_iglens.lens.hooks import residual_tap
from captum_iglens.lens.state import forward_parameters
from captum_iglens.results import MethodCompleteness
from captum_iglens.settings import DEFAULT_METHOD

__all__ = ["COMPARE_METHODS", "COMPARE_RUNNERS", "DEFAULT_COMPARE_METHODS", "CompareContext",
           "target_probability_forward"]


def target_probability_forward(
    model: nn.Module, position: int, target: int, inputs_embeds: bool = False
) -> Callable[..., Tensor]:
    """A Captum forward function: the target token's probability at ``position``.

    The returned ``forward(x, attention_mask=None)`` runs ``model(input_ids=x)`` (or
    ``model(inputs_embeds=x)`` when ``inputs_embeds=True``) with ``use_cache=False``, the
    attention mask, and ``position_ids`` derived from the mask for models that take them
    (left padding), and returns ``softmax(logits[:, position])[:, target]`` in float32
    (probability units, shape ``[N]``). ``position`` must be non-negative; models that take
    ``logits_to_keep`` unembed only the positions from ``position`` on.
    """
    params = forward_parameters(model)
    key = "inputs_embeds" if inputs_embeds else "input_ids"

    def forward(x: Tensor, attention_mask: Optional[Tensor] = None) -> Tensor:
        kwargs: dict[str, Any] = {key: x, "use_cache": False}
        if attention_mask is not None:
            kwargs["attention_mask"] = attention_mask
            if "position_ids" in params:
                kwargs["position_ids"] = position_ids_from_mask(attention_mask)
        index = position
        if "logits_to_keep" in params:  # unembed only the positions from `position` on
            kwargs["logits_to_keep"] = x.shape[1] - position
            index = 0
        logits = model(**kwargs).logits[:, index]
        return torch.softmax(logits.float(), dim=-1)[:, target]

    return forward


@dataclass
class CompareContext:
    """What every runner shares: one row's ids, reference, mask, position, target, layers."""

    model: nn.Module
    lens: IGLens
    inputs: Tensor
    reference: Tensor
    mask: Tensor
    position: int
    target: int
    n_steps: int
    lens_baseline: BaselineSpec
    gradient_method: str
    captum_method: str
    internal_batch_size: Optional[int]
    f_input: float = float("nan")
    f_reference: float = float("nan")
    lens_cache: Optional[Any] = None


def _run_lens(ctx: CompareContext, estimator: str) -> tuple[Any, float]:
    start = time.perf_counter()
    out = ctx.lens.attribute_details(
        ctx.inputs, ctx.lens_baseline, ctx.target, ctx.mask, ctx.n_steps, estimator,
        positions=[ctx.position],
    )
    return out, time.perf_counter() - start


def _ig_lens(ctx: CompareContext, name: str, label: str) -> MethodCompleteness:
    estimator = DEFAULT_METHOD if name == "ig_lens" else ctx.gradient_method
    out, elapsed = _run_lens(ctx, estimator)
    if name == "ig_lens":
        ctx.lens_cache = out
    return MethodCompleteness(
        name, label, out.attributions[0, 0].detach().cpu().float(), float(out.delta_p[0, 0]),
        out.convergence_delta[0, :1].detach().cpu().float(), elapsed,
    )


def _logit_lens(ctx: CompareContext, name: str, label: str) -> MethodCompleteness:
    if ctx.lens_cache is not None:
        out, elapsed = ctx.lens_cache, float("nan")
    else:
        out, elapsed = _run_lens(ctx, DEFAULT_METHOD)
    return MethodCompleteness(
        name, label, out.lens_probs[0, 0].detach().cpu().float(), float(out.p_final[0, 0]),
        None, elapsed, None, is_credit=False,
    )


def _captum_layer(ctx: CompareContext, name: str, label: str) -> MethodCompleteness:
    """One Captum layer method, one decoder layer at a time, on the shared reference."""
    use_embeds = name == "layer_conductance"
    forward = target_probability_forward(ctx.model, ctx.position, ctx.target, use_embeds)
    x, xb = ctx.inputs, ctx.reference
    if use_embeds:
        embed = ctx.lens.spec.input_embeddings
        with torch.no_grad():
            x, xb = embed(x), embed(xb)  # type: ignore[misc]  # a causal LM has input embeddings
    per_layer, deltas, times, abs_sums, sizes = [], [], [], [], []
    start = time.perf_counter()
    for index in progress_bar(ctx.lens.layer_indices, desc=f"Captum {label}", unit="layer"):
        t0 = time.perf_counter()
        with residual_tap(ctx.lens.decoder_blocks, index) as layer:
            algo = (LayerConductance if use_embeds else LayerIntegratedGradients)(forward, layer)
            attr, delta = algo.attribute(
                x, baselines=xb, additional_forward_args=(ctx.mask,), n_steps=ctx.n_steps,
                method=ctx.captum_method, internal_batch_size=ctx.internal_batch_size,
                return_convergence_delta=True,
            )
        attr = (attr[0] if isinstance(attr, tuple) else attr).detach()
        per_layer.append(float(attr.double().sum()))
        abs_sums.append(float(attr.double().abs().sum()))
        sizes.append(int(attr.numel()))
        deltas.append(float(delta.detach().reshape(-1)[0]))
        times.append(time.perf_counter() - t0)
    elapsed = time.perf_counter() - start
    if use_embeds:
        with torch.no_grad():
            total = float(forward(x, ctx.mask)[0] - forward(xb, ctx.mask)[0])
    else:
        total = ctx.f_input - ctx.f_reference
    f64 = torch.float64
    return MethodCompleteness(
        name, label, torch.tensor(per_layer, dtype=f64), total, torch.tensor(deltas, dtype=f64),
        elapsed, times, abs_sums=torch.tensor(abs_sums, dtype=f64), n_terms=sizes,
    )


Runner = Callable[[CompareContext, str, str], MethodCompleteness]

#: Method name -> (column label, runner). Adding a method is one row here.
COMPARE_RUNNERS: dict[str, tuple[str, Runner]] = {
    "ig_lens": ("IG-Lens", _ig_lens),
    "ig_lens_gradient": ("IG-Lens (grad)", _ig_lens),
    "layer_integrated_gradients": ("LayerIG", _captum_layer),
    "layer_conductance": ("LayerCond", _captum_layer),
    "logit_lens": ("lens p", _logit_lens),
}

#: Method names accepted by :func:`~captum_iglens.compare_completeness` (``methods=``).
COMPARE_METHODS: tuple[str, ...] = tuple(COMPARE_RUNNERS)
DEFAULT_COMPARE_METHODS: tuple[str, ...] = (
    "ig_lens", "layer_integrated_gradients", "layer_conductance", "logit_lens",
)
