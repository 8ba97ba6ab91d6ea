"""IG-Lens side by side with Captum's layer methods: who adds up to what.

:func:`compare_completeness` runs, on the same token ids, explained position, target token,
reference and decoder layers:

- IG-Lens (arXiv:2606.29693), one path through the residual stream whose per-layer credits
  telescope to its total;
- Captum's :class:`~captum.attr.LayerIntegratedGradients`, one decoder layer at a time;
- Captum's :class:`~captum.attr.LayerConductance`, one decoder layer at a time, through an
  ``inputs_embeds`` forward;
- the logit-lens probability per layer (levels, for reference).

By default every method uses one reference ``x'``; IG-Lens then starts at ``h_n(x')`` and all
methods decompose the same total ``F(x) - F(x')``. In a pre-norm residual transformer every
block output is a full cut of the network, so each Captum layer total is (up to
discretisation) that whole change: summed over ``k`` layers they give about ``k`` times it,
while IG-Lens's credits add up to it. Each method is one runner in :data:`COMPARE_RUNNERS`.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Callable, Optional, Sequence, Union

import torch
from captum.attr import LayerConductance, LayerIntegratedGradients
from torch import Tensor, nn

from captum_iglens._inputs import (
    LayerSpec,
    check_token_ids,
    forward_parameters,
    is_int,
    normalise_positions,
    position_ids_from_mask,
)
from captum_iglens._progress import progress_bar
from captum_iglens._targets import normalise_target
from captum_iglens.architectures import (
    display_name,
    input_embeddings,
    strip_parallel,
    vocab_size,
)
from captum_iglens.baselines import BaselineSpec, describe_input_baseline, input_baseline_ids
from captum_iglens.ig_lens import IGLens
from captum_iglens.residual import input_device, model_state_preserved, residual_tap
from captum_iglens.results import CompletenessReport, MethodCompleteness

__all__ = [
    "COMPARE_METHODS",
    "COMPARE_RUNNERS",
    "CompletenessReport",
    "MethodCompleteness",
    "compare_completeness",
    "input_baseline_ids",
    "residual_tap",
    "target_probability_forward",
]


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
class _Context:
    """What every runner shares: the same ids, reference, mask, position, target, layers."""

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


def _run_lens(ctx: _Context, estimator: str) -> tuple[Any, float]:
    start = time.perf_counter()
    out = ctx.lens.attribute_details(
        ctx.inputs, ctx.lens_baseline, ctx.target, ctx.mask, ctx.n_steps, estimator,
        positions=[ctx.position],
    )
    return out, time.perf_counter() - start


def _ig_lens(ctx: _Context, name: str, label: str) -> MethodCompleteness:
    estimator = "prediction_aware" if name == "ig_lens" else ctx.gradient_method
    out, elapsed = _run_lens(ctx, estimator)
    if name == "ig_lens":
        ctx.lens_cache = out
    return MethodCompleteness(
        name, label, out.attributions[0, 0].detach().cpu().float(), float(out.delta_p[0, 0]),
        out.convergence_delta[0, :1].detach().cpu().float(), elapsed,
    )


def _logit_lens(ctx: _Context, name: str, label: str) -> MethodCompleteness:
    if ctx.lens_cache is not None:
        out, elapsed = ctx.lens_cache, float("nan")
    else:
        out, elapsed = _run_lens(ctx, "prediction_aware")
    return MethodCompleteness(
        name, label, out.lens_probs[0, 0].detach().cpu().float(), float(out.p_final[0, 0]),
        None, elapsed, None, is_credit=False,
    )


def _captum_layer(ctx: _Context, name: str, label: str) -> MethodCompleteness:
    """One Captum layer method, one decoder layer at a time, on the shared reference."""
    use_embeds = name == "layer_conductance"
    forward = target_probability_forward(ctx.model, ctx.position, ctx.target, use_embeds)
    x, xb = ctx.inputs, ctx.reference
    if use_embeds:
        embed = input_embeddings(ctx.model)
        with torch.no_grad():
            x, xb = embed(x), embed(xb)
    per_layer, deltas, times = [], [], []
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
        attr = attr[0] if isinstance(attr, tuple) else attr
        per_layer.append(float(attr.detach().double().sum()))
        deltas.append(float(delta.detach().reshape(-1)[0]))
        times.append(time.perf_counter() - t0)
    elapsed = time.perf_counter() - start
    if use_embeds:
        with torch.no_grad():
            total = float(forward(x, ctx.mask)[0] - forward(xb, ctx.mask)[0])
    else:
        total = ctx.f_input - ctx.f_reference
    return MethodCompleteness(
        name, label, torch.tensor(per_layer, dtype=torch.float64), total,
        torch.tensor(deltas, dtype=torch.float64), elapsed, times,
    )


Runner = Callable[[_Context, str, str], MethodCompleteness]

#: Method name -> (column label, runner). Adding a method is one row here.
COMPARE_RUNNERS: dict[str, tuple[str, Runner]] = {
    "ig_lens": ("IG-Lens", _ig_lens),
    "ig_lens_gradient": ("IG-Lens (grad)", _ig_lens),
    "layer_integrated_gradients": ("LayerIG", _captum_layer),
    "layer_conductance": ("LayerCond", _captum_layer),
    "logit_lens": ("lens p", _logit_lens),
}

#: Method names accepted by :func:`compare_completeness` (``methods=``).
COMPARE_METHODS: tuple[str, ...] = tuple(COMPARE_RUNNERS)
DEFAULT_COMPARE_METHODS: tuple[str, ...] = (
    "ig_lens", "layer_integrated_gradients", "layer_conductance", "logit_lens",
)


def _check_settings(methods: Sequence[str], n_steps: int, inputs: object) -> None:
    unknown = [m for m in methods if m not in COMPARE_RUNNERS]
    if unknown or not methods:
        raise ValueError(f"Unknown methods {unknown}: use some of {COMPARE_METHODS}.")
    if not is_int(n_steps) or n_steps < 2:
        raise ValueError(f"n_steps must be an int >= 2, got {n_steps!r}")
    if isinstance(inputs, Tensor) and inputs.dim() == 2 and inputs.shape[0] != 1:
        raise ValueError(f"inputs must be token ids of shape [1, S], got {tuple(inputs.shape)}")


def _mask(additional_forward_args: Optional[Tensor], inputs: Tensor) -> Tensor:
    mask = torch.ones_like(inputs) if additional_forward_args is None else additional_forward_args
    if not isinstance(mask, Tensor) or mask.shape != inputs.shape:
        raise ValueError("additional_forward_args must be an attention mask shaped like inputs")
    return mask.to(inputs.device)


def _target(model: nn.Module, inputs: Tensor, mask: Tensor, pos: int, target: Any) -> int:
    """The target id: checked like IGLens's (no floats, bools or text), argmax by default."""
    default = torch.zeros(1, 1, dtype=torch.long)
    if target is None:
        kwargs: dict[str, Any] = {"attention_mask": mask, "use_cache": False}
        if "position_ids" in forward_parameters(model):
            kwargs["position_ids"] = position_ids_from_mask(mask)
        with torch.no_grad():
            logits = model(input_ids=inputs, **kwargs).logits
        default = logits[:, pos].argmax(-1).reshape(1, 1).cpu()
    return int(normalise_target(target, 1, 1, default, vocab_size(model) or 1)[0, 0])


def compare_completeness(
    model: nn.Module,
    inputs: Tensor,
    target: Optional[int] = None,
    position: int = -1,
    layers: LayerSpec = None,
    baselines: Union[None, int, Tensor] = None,
    n_steps: int = 20,
    additional_forward_args: Optional[Tensor] = None,
    methods: Optional[Sequence[str]] = None,
    lens_baseline: Optional[BaselineSpec] = None,
    gradient_method: str = "gausslegendre",
    captum_method: str = "gausslegendre",
    internal_batch_size: Optional[int] = None,
    tokenizer: Any = None,
) -> CompletenessReport:
    r"""Run IG-Lens and Captum's layer methods on the same prediction and compare completeness.

    All methods explain the probability (not the logit) of the same ``target`` token at the
    same ``position`` of the same ``inputs``, over the same decoder layers and, by default,
    against one reference ``x'``: ``"ig_lens"`` (exact estimator), ``"ig_lens_gradient"``
    (IG-Lens with ``gradient_method``), ``"layer_integrated_gradients"`` and
    ``"layer_conductance"`` (Captum, **one decoder layer at a time**: with a list of layers
    Captum's hooks cut the earlier layers out; LayerConductance runs on ``inputs_embeds``),
    and ``"logit_lens"`` (levels ``f(h_L)``, no sum). Captum's forward returns
    ``softmax(logits[:, position])[:, target]`` (:func:`target_probability_forward`); each
    Captum run hooks the residual stream itself (:func:`residual_tap`).

    **Reference** (:func:`input_baseline_ids`): the first attended position, padding and every
    special token (the chat template's markers) stay, every other position becomes a single
    space token (with a tokenizer; else the config's BOS id). A zero-embedding pad token would
    start Captum's path in the pre-norm's ``1/sqrt(eps)`` regime (refused); BOS everywhere
    (a stack of attention sinks) converges badly. IG-Lens starts at the reference's last-block
    residual, so every method's total is ``F(x) - F(x')``.

    Args:
        model (nn.Module): A Hugging Face causal LM (eval mode is used and restored).
        inputs (Tensor): Token ids ``[1, S]`` (one sequence).
        target (int, optional): Target token id. Default: the model's argmax at ``position``.
        position (int, optional): Explained position (negative counts from the end).
            Default: -1.
        layers (optional): As for :class:`~captum_iglens.IGLens`. Default: all blocks.
        baselines (int or Tensor, optional): The reference: a filler token id (first attended
            position, padding and special tokens kept) or ids ``[1, S]`` used as given.
            Default: ``None``, the space token as filler.
        n_steps (int, optional): Integration steps per Captum layer run. Default: 20.
        additional_forward_args (Tensor, optional): Attention mask ``[1, S]``. Default: ones.
        methods (sequence of str, optional): Subset of :data:`COMPARE_METHODS`, in run order.
            Default: IG-Lens, LayerIntegratedGradients, LayerConductance, logit lens.
        lens_baseline (str or Tensor, optional): IG-Lens's baseline. Default: ``None``, the
            shared reference ``x'``; a residual-space name (``"mean"``, ...) or tensor gives
            IG-Lens a total of its own.
        gradient_method (str, optional): Estimator of ``"ig_lens_gradient"``.
            Default: "gausslegendre".
        captum_method (str, optional): Captum's approximation method. Default: "gausslegendre".
        internal_batch_size (int, optional): Passed to Captum (steps per forward chunk).
        tokenizer (optional): For the default reference and to print the target token.

    Returns:
        CompletenessReport: per method the per-layer credit ``[k]``, its sum, its total, the
        completeness gap ``|sum - total|``, Captum's convergence delta per layer run and the
        wall time; ``to_dict()``, ``format_table()``, ``plot()``.

    Raises:
        ValueError: ``inputs`` not ``[1, S]``, an unknown method, a bad position or target,
            a reference token with a zero embedding, ``n_steps < 2``.
        TypeError: a float or boolean target or position, non-integer ids.
        RuntimeError: called inside ``torch.inference_mode()`` (Captum needs autograd).

    Examples::

        >>> from captum_iglens import compare_completeness
        >>> ids = tokenizer("The capital of France is", return_tensors="pt").input_ids
        >>> report = compare_completeness(model, ids, layers=[0, 10, 20, 30], n_steps=16)
        >>> print(report)                         # one table, one column per method
        >>> report["ig_lens"].completeness_gap    # <= 1e-6
    """
    if torch.is_inference_mode_enabled():
        raise RuntimeError(
            "compare_completeness runs Captum's gradient methods, which need autograd, but "
            "torch.inference_mode() is on: call it outside inference_mode (torch.no_grad() "
            "is fine; Captum turns gradients on where it needs them).")
    model = strip_parallel(model)
    methods = tuple(DEFAULT_COMPARE_METHODS if methods is None else methods)
    _check_settings(methods, n_steps, inputs)
    inputs = check_token_ids(inputs, vocab_size(model)).to(input_device(model))
    (pos,), _ = normalise_positions(position, inputs.shape[1])
    mask = _mask(additional_forward_args, inputs)
    lens = IGLens(model, layers=layers)
    reference = input_baseline_ids(model, inputs, baselines, tokenizer=tokenizer,
                                   attention_mask=mask)
    with model_state_preserved(model):
        tgt = _target(model, inputs, mask, pos, target)
        forward = target_probability_forward(model, pos, tgt)
        with torch.no_grad():
            f_x, f_b = float(forward(inputs, mask)[0]), float(forward(reference, mask)[0])
        ctx = _Context(model, lens, inputs, reference, mask, pos, tgt, n_steps,
                       reference if lens_baseline is None else lens_baseline,
                       gradient_method, captum_method, internal_batch_size, f_x, f_b)
        report = CompletenessReport(
            layer_indices=list(lens.layer_indices), position=pos, target_id=tgt,
            target_token=tokenizer.decode([tgt]) if tokenizer is not None else "",
            input_ids=inputs[0].tolist(), baseline_ids=reference[0].tolist(),
            f_input=f_x, f_baseline=f_b, n_steps=n_steps,
            lens_baseline=_baseline_name(lens_baseline),
            baseline_description=describe_input_baseline(reference, inputs, tokenizer),
            model_name=display_name(model),
        )
        for name in methods:
            label, runner = COMPARE_RUNNERS[name]
            report.methods[name] = runner(ctx, name, label)
    return report


def _baseline_name(lens_baseline: Optional[BaselineSpec]) -> str:
    if lens_baseline is None:
        return "reference ids"
    return lens_baseline if isinstance(lens_baseline, str) else "tensor"
