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
while IG-Lens's credits add up to it. Each method is one runner in :data:`COMPARE_RUNNERS`
(:mod:`captum_iglens.compare.runners`). A batch of rows and several positions give one
report per prediction (:class:`~captum_iglens.results.CompletenessBatch`); every report has
``.passed`` and ``.assert_complete()`` for test suites.
"""

from __future__ import annotations

from typing import Any, Optional, Sequence, Union

import torch
from torch import Tensor, nn

from captum_iglens._core.baselines import describe_input_baseline, input_baseline_ids
from captum_iglens._core.inputs import check_token_ids, normalise_positions, position_ids_from_mask
from captum_iglens._core.targets import normalise_target
from captum_iglens._utils.typing import BaselineSpec, LayerSpec, PositionSpec, TargetSpec, is_int
from captum_iglens.compare.runners import (
    COMPARE_METHODS,
    COMPARE_RUNNERS,
    DEFAULT_COMPARE_METHODS,
    CompareContext,
    target_probability_forward,
)
from captum_iglens.ig_lens import IGLens
from captum_iglens.lens.architectures import strip_parallel, vocab_size
from captum_iglens.lens.hooks import residual_tap
from captum_iglens.lens.state import forward_parameters, input_device, model_state_preserved
from captum_iglens.results import CompletenessBatch, CompletenessReport, MethodCompleteness
from captum_iglens.text.prompts import decode_token

__all__ = [
    "COMPARE_METHODS",
    "COMPARE_RUNNERS",
    "CompletenessBatch",
    "CompletenessReport",
    "MethodCompleteness",
    "compare_completeness",
    "input_baseline_ids",
    "residual_tap",
    "target_probability_forward",
]


def _check_settings(methods: Sequence[str], n_steps: int) -> None:
    unknown = [m for m in methods if m not in COMPARE_RUNNERS]
    if unknown or not methods:
        raise ValueError(f"Unknown methods {unknown}: use some of {COMPARE_METHODS}.")
    if not is_int(n_steps) or n_steps < 2:
        raise ValueError(f"n_steps must be an int >= 2, got {n_steps!r}")


def _mask(additional_forward_args: Any, inputs: Tensor) -> Tensor:
    """The attention mask: ``None`` (ones), a ``[B, S]`` tensor or a Captum 1-tuple."""
    mask = additional_forward_args
    if isinstance(mask, (tuple, list)):
        if len(mask) != 1:
            raise ValueError(
                f"additional_forward_args has {len(mask)} elements: compare_completeness "
                "passes only the attention mask to each method's forward (Captum's forward "
                "here is target_probability_forward(x, attention_mask)); give the mask "
                "[B, S] alone or as (mask,).")
        mask = mask[0]
    mask = torch.ones_like(inputs) if mask is None else mask
    if not isinstance(mask, Tensor) or mask.shape != inputs.shape:
        raise ValueError("additional_forward_args must be an attention mask shaped like inputs")
    return mask.to(inputs.device)


def _targets(model: nn.Module, inputs: Tensor, mask: Tensor, positions: list[int],
             target: TargetSpec, vocab: Optional[int]) -> tuple[Tensor, str]:
    """Target ids ``[B, P]`` (checked like IGLens's against ``vocab``) and their source."""
    batch, n_pos = inputs.shape[0], len(positions)
    default = torch.zeros(batch, n_pos, dtype=torch.long)
    if target is None:
        kwargs: dict[str, Any] = {"attention_mask": mask, "use_cache": False}
        if "position_ids" in forward_parameters(model):
            kwargs["position_ids"] = position_ids_from_mask(mask)
        with torch.no_grad():
            logits = model(input_ids=inputs, **kwargs).logits
        default = logits[:, positions].argmax(-1).reshape(batch, n_pos).cpu()
    tgt = normalise_target(target, batch, n_pos, default, vocab or 1)
    return tgt, "model argmax" if target is None else "given"


def _row(spec: Any, row: int, batch: int) -> Any:
    """Row ``row`` of a per-row tensor (``[B, ...]``), anything else as it is."""
    if isinstance(spec, Tensor) and batch > 1 and spec.dim() >= 2 and spec.shape[0] == batch:
        return spec[row:row + 1]
    return spec


def compare_completeness(
    model: nn.Module,
    inputs: Tensor,
    target: TargetSpec = None,
    position: PositionSpec = -1,
    layers: LayerSpec = None,
    baselines: Union[None, int, Tensor] = None,
    n_steps: int = 20,
    additional_forward_args: Any = None,
    methods: Optional[Sequence[str]] = None,
    lens_baseline: Optional[BaselineSpec] = None,
    gradient_method: str = "gausslegendre",
    captum_method: str = "gausslegendre",
    internal_batch_size: Optional[int] = None,
    tokenizer: Any = None,
    *,
    rtol: Optional[float] = None,
    atol: Optional[float] = None,
) -> Union[CompletenessReport, CompletenessBatch]:
    r"""Run IG-Lens and Captum's layer methods on the same predictions and compare completeness.

    All methods explain the probability (not the logit) of the same ``target`` token at the
    same ``position`` of the same ``inputs``, over the same decoder layers and, by default,
    against one reference ``x'``: ``"ig_lens"`` (exact estimator), ``"ig_lens_gradient"``
    (IG-Lens with ``gradient_method``), ``"layer_integrated_gradients"`` and
    ``"layer_conductance"`` (Captum's own classes, **one decoder layer at a time**: with a
    list of layers Captum's hooks cut the earlier layers out; LayerConductance runs on
    ``inputs_embeds``), and ``"logit_lens"`` (levels ``f(h_L)``, no sum). Captum's forward
    returns ``softmax(logits[:, position])[:, target]`` (:func:`target_probability_forward`);
    each Captum run hooks the residual stream itself (:func:`residual_tap`). Every
    (row, position) pair is one prediction, compared on its own.

    **Reference** (:func:`input_baseline_ids`): the first attended position, padding and every
    special token (the chat template's markers) stay, every other position becomes a single
    space token (with a tokenizer; else the config's BOS id). A zero-embedding pad token would
    start Captum's path in the pre-norm's ``1/sqrt(eps)`` regime (refused); BOS everywhere
    (a stack of attention sinks) converges badly. IG-Lens starts at the reference's last-block
    residual, so every method's total is ``F(x) - F(x')`` (Proposition 1 of arXiv:2606.29693).

    Args:
        model (nn.Module): A Hugging Face causal LM (eval mode is used and restored).
        inputs (Tensor): Token ids ``[B, S]`` (int64); left-pad a batch and pass its mask.
        target (int, sequence or Tensor, optional): Target ids: an int, ``[B]`` or ``[B, P]``.
            Default ``None``: the model's argmax at each position, recorded in each report
            as ``target_source="model argmax"`` and said in its table header.
        position (int or sequence of int, optional): Explained positions (negative count
            from the end). Default: -1.
        layers (optional): As for :class:`~captum_iglens.IGLens`. Default: all blocks.
        baselines (int or Tensor, optional): The reference: a filler token id (first attended
            position, padding and special tokens kept) or ids ``[B, S]`` used as given.
            Default: ``None``, the space token as filler.
        n_steps (int, optional): Integration steps per Captum layer run. Default: 20.
        additional_forward_args (Tensor or tuple, optional): The attention mask ``[B, S]``,
            alone or as Captum's 1-tuple ``(mask,)``. Default: ones.
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
        rtol (float, optional): Keyword-only. The completeness tolerance of each report's
            ``.passed`` / ``.assert_complete()`` is ``atol + rtol * |total|``. With both
            ``None`` (default) it is the bound derived from float rounding of the credits,
            ``u (k sum|c| + |total|)``.
        atol (float, optional): Keyword-only. See ``rtol``.

    Returns:
        CompletenessReport for one row and an int ``position`` (per method the per-layer
        credit ``[k]``, its sum, its total, the gap ``|sum - total|``, Captum's convergence
        delta per layer run and the wall time; ``passed``, ``assert_complete()``,
        ``to_dict()``, ``format_table()``, ``plot()``); otherwise a
        :class:`~captum_iglens.results.CompletenessBatch` of ``B * P`` such reports.

    Raises:
        ValueError: ``inputs`` not ``[B, S]``, an unknown method, a bad position or target,
            a reference token with a zero embedding, ``n_steps < 2``, a forward-argument
            tuple with more than the mask.
        TypeError: a float or boolean target or position, non-integer ids.
        RuntimeError: called inside ``torch.inference_mode()`` (Captum needs autograd).

    Examples::

        >>> from captum_iglens import compare_completeness
        >>> ids = tokenizer("The capital of France is", return_tensors="pt").input_ids
        >>> report = compare_completeness(model, ids, layers=[0, 10, 20, 30], n_steps=16)
        >>> print(report)                         # one table, one column per method
        >>> report.assert_complete()              # IG-Lens adds up within float rounding
        >>> batch = compare_completeness(model, ids, position=[-2, -1], n_steps=16)
        >>> batch.passed, batch.gaps("layer_integrated_gradients")   # [1, 2]
    """
    if torch.is_inference_mode_enabled():
        raise RuntimeError(
            "compare_completeness runs Captum's gradient methods, which need autograd, but "
            "torch.inference_mode() is on: call it outside inference_mode (torch.no_grad() "
            "is fine; Captum turns gradients on where it needs them).")
    model = strip_parallel(model)
    methods = tuple(DEFAULT_COMPARE_METHODS if methods is None else methods)
    _check_settings(methods, n_steps)
    inputs = check_token_ids(inputs, vocab_size(model)).to(input_device(model))
    positions, single = normalise_positions(position, inputs.shape[1])
    mask = _mask(additional_forward_args, inputs)
    lens = IGLens(model, layers=layers)
    reference = input_baseline_ids(model, inputs, baselines, tokenizer=tokenizer,
                                   attention_mask=mask)
    settings = dict(n_steps=n_steps, gradient_method=gradient_method,
                    captum_method=captum_method, internal_batch_size=internal_batch_size)
    batch = inputs.shape[0]
    with model_state_preserved(model):
        targets, source = _targets(model, inputs, mask, positions, target,
                                   lens.spec.vocab_size)
        reports = [
            _compare_one(lens, inputs[b:b + 1], reference[b:b + 1], mask[b:b + 1], pos,
                         int(targets[b, j]), _row(lens_baseline, b, batch), methods, settings,
                         tokenizer)
            for b in range(batch) for j, pos in enumerate(positions)
        ]
    for b, rep in enumerate(reports):
        rep.row, rep.target_source = b // len(positions), source
        rep.rtol, rep.atol = rtol, atol
    if batch == 1 and single:
        return reports[0]
    return CompletenessBatch(reports, batch, positions)


def _compare_one(
    lens: IGLens, inputs: Tensor, reference: Tensor, mask: Tensor, pos: int, tgt: int,
    lens_baseline: Optional[BaselineSpec], methods: Sequence[str], settings: dict[str, Any],
    tokenizer: Any,
) -> CompletenessReport:
    """Every method on one prediction: row ``inputs [1, S]``, position ``pos``, ``tgt``."""
    model = lens.model
    forward = target_probability_forward(model, pos, tgt)
    with torch.no_grad():
        f_x, f_b = float(forward(inputs, mask)[0]), float(forward(reference, mask)[0])
    ctx = CompareContext(model, lens, inputs, reference, mask, pos, tgt, settings["n_steps"],
                         reference if lens_baseline is None else lens_baseline,
                         settings["gradient_method"], settings["captum_method"],
                         settings["internal_batch_size"], f_x, f_b)
    report = CompletenessReport(
        layer_indices=list(lens.layer_indices), position=pos, target_id=tgt,
        target_token=decode_token(tokenizer, tgt) if tokenizer is not None else "",
        input_ids=inputs[0].tolist(), baseline_ids=reference[0].tolist(),
        f_input=f_x, f_baseline=f_b, n_steps=settings["n_steps"],
        lens_baseline=_baseline_name(lens_baseline),
        baseline_description=describe_input_baseline(reference, inputs, tokenizer),
        model_name=lens.spec.display_name,
    )
    for name in methods:
        label, runner = COMPARE_RUNNERS[name]
        report.methods[name] = runner(ctx, name, label)
    return report


def _baseline_name(lens_baseline: Optional[BaselineSpec]) -> str:
    if lens_baseline is None:
        return "reference ids"
    return lens_baseline if isinstance(lens_baseline, str) else "tensor"
