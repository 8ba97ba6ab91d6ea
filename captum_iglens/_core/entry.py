"""The one entry into the computation: :func:`attribute` ``(spec, source, settings)``.

Every caller (:class:`~captum_iglens.IGLens`, the text layer, the validation) names *what*
is attributed as a source and *how* as one
:class:`~captum_iglens.settings.AttributionSettings`; this module picks the route:

* :class:`Forward`: a teacher-forced request, the model run over token ids here. The
  readout credits of arXiv:2606.29693 (Section 3) at block or sub-layer granularity, or,
  for a lens built with ``effect="total"`` / ``"atp"``, the gated total-effect path
  (:func:`~captum_iglens._core.total_effect.run_total`).
* :class:`Recorded`: residuals recorded elsewhere, by generation's own passes
  (:mod:`captum_iglens.text.recorded`) or one cached pass of a document chunk
  (:mod:`captum_iglens.text.document_pass`): read out, no forward.

``method`` and ``n_steps`` are checked here, once, against the estimator registry
(:func:`~captum_iglens._core.pipeline.check_estimator`).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Union

from torch import Tensor

from captum_iglens._core.capture import paths_from_states, recorded_layers
from captum_iglens._core.estimators import grid_probs, warn_if_not_converged
from captum_iglens._core.inputs import check_top_k, single_position
from captum_iglens._core.pipeline import (
    capture_lens_path,
    check_estimator,
    delta_of,
    output_from_path,
    readout_chunk,
)
from captum_iglens._core.request import Forward, Recorded
from captum_iglens._core.sublayer_path import capture_granular, sublayer_output
from captum_iglens._core.total_effect import check_gate_options, run_total
from captum_iglens._utils.typing import BaselineSpec
from captum_iglens.lens.changes import check_unchanged
from captum_iglens.lens.spec import LensSpec
from captum_iglens.results import IGLensOutput
from captum_iglens.settings import (
    CAPTUM_METHODS,
    DEFAULT_EFFECT,
    DEFAULT_METHOD,
    AttributionSettings,
)

__all__ = ["Forward", "Recorded", "Source", "attribute", "check_estimator", "delta_of",
           "grid_profile", "layers_to_record"]


Source = Union[Forward, Recorded]


def layers_to_record(spec: LensSpec, baselines: BaselineSpec) -> tuple[set[int], set[int]]:
    """The hidden-state indices a :class:`Recorded` source needs, and those needed whole.

    See :func:`~captum_iglens._core.capture.recorded_layers`.
    """
    return recorded_layers(spec.layer_indices, baselines)


def attribute(spec: LensSpec, source: Source, *, settings: AttributionSettings,
              top_k: int = 0) -> tuple[IGLensOutput, bool]:
    """Credits of ``spec``'s chosen layers for ``source`` under ``settings``.

    Args:
        spec (LensSpec): The lens (model, blocks, readout, layers, units, granularity,
            effect).
        source (Forward or Recorded): What is attributed.
        settings (AttributionSettings): ``method``, ``n_steps``, ``baselines``,
            ``internal_batch_size``, and for a total-effect or AtP lens ``scope`` and
            ``grad_drop`` (the lens's own ``units``, ``granularity`` and ``effect``
            decide, not the settings').
        top_k (int, optional): The levels' readout's top tokens per layer. Default: 0.

    Returns:
        (output, single): the :class:`~captum_iglens.results.IGLensOutput` (``[B, P, ...]``,
        ``method`` and ``n_steps`` recorded) and whether one int position was asked for.

    Raises:
        ValueError: an unknown estimator or bad ``n_steps``
            (:func:`~captum_iglens._core.pipeline.check_estimator`), ``top_k`` negative or
            above the vocabulary, a recording for a sub-layer or total-effect lens, a
            ``scope`` or ``grad_drop`` the lens cannot honour, a ``method`` or ``n_steps``
            given to an AtP lens (first-order: it takes neither)
            (:func:`~captum_iglens._core.total_effect.check_gate_options`); and as
            :meth:`~captum_iglens.IGLens.attribute`.
        RuntimeError: a gradient estimator under ``torch.inference_mode()``.
        ModelChangedError: the model changed since the lens was built
            (:func:`~captum_iglens.lens.changes.check_unchanged`).
    """
    method, n_steps = settings.method, settings.n_steps
    check_estimator(method, n_steps)
    check_top_k(top_k, spec.vocab_size)
    check_unchanged(spec)
    check_gate_options(spec, settings.scope, settings.grad_drop, method, n_steps)
    if isinstance(source, Recorded):
        return _recorded(spec, source, settings, top_k), False
    if spec.effect != DEFAULT_EFFECT:
        if spec.effect == "total" and method not in (DEFAULT_METHOD, *CAPTUM_METHODS):
            raise ValueError(
                f"method={method!r} is a readout estimator: the total effect's gates are "
                f"integrated by the exact step split ({DEFAULT_METHOD!r}) or by one of "
                f"Captum's rules {CAPTUM_METHODS}.")
        out, single = run_total(spec, source.inputs, settings.baselines, source.target,
                                source.additional_forward_args, n_steps, method,
                                settings.internal_batch_size, source.positions, top_k,
                                source.contrast, source.explained, settings.scope,
                                settings.grad_drop)
        if spec.effect == "total":  # a gradient rule's discretisation error, as for readouts
            done = ~out.p_final.isnan()
            warn_if_not_converged(out.attributions[done], out.delta_p[done], method, n_steps)
        return out, single
    if spec.granularity == "sublayer":
        return sublayer_output(spec, source, settings=settings, top_k=top_k)
    # the capture is handed over, not kept: its [B, P, V] distribution is freed after the check
    out = output_from_path(spec, capture_lens_path(
        spec, source.inputs, source.target, source.positions, settings.baselines,
        source.additional_forward_args, source.contrast, source.explained),
        settings=settings, top_k=top_k)
    return out, single_position(source.positions)


def _recorded(spec: LensSpec, source: Recorded, settings: AttributionSettings,
              top_k: int) -> IGLensOutput:
    """Read out recorded residuals: the block-readout path only."""
    if not spec.recordable or spec.effect != DEFAULT_EFFECT:
        raise ValueError("A recording holds the block outputs only: explain a sub-layer or "
                         "total-effect lens with one teacher-forced forward (Forward), not "
                         "from a recording.")
    start = settings.baselines if source.start is None else source.start
    cap = paths_from_states(
        source.states, source.distribution, layer_indices=spec.layer_indices,
        positions=source.positions, mask=source.mask, target=source.target,
        contrast=source.contrast, baselines=start, explained=source.explained,
        seq_len=source.seq_len)
    if source.start_name is not None:
        cap = replace(cap, baseline=source.start_name)
    return output_from_path(spec, cap, settings=settings, top_k=top_k)


def grid_profile(spec: LensSpec, source: Forward, *, settings: AttributionSettings) -> Tensor:
    """The readout ``f`` on a uniform grid of ``n_steps + 1`` points along each segment.

    ``[B, P, k, n_steps + 1]`` in the lens's units (float32): point ``s`` of segment ``j``
    at ``h_{L_{j-1}} + s / n_steps * (h_{L_j} - h_{L_{j-1}})`` (see
    :meth:`~captum_iglens.IGLens.path_probabilities`).

    Raises:
        ValueError: ``n_steps < 1``; and as :func:`attribute`.
    """
    check_estimator(DEFAULT_METHOD, settings.n_steps)  # a grid of n_steps >= 1 points
    cap = capture_granular(spec, source, baselines=settings.baselines)
    path = replace(cap.path, log=spec.units == "log-probability")
    return grid_probs(spec.readout, path, settings.n_steps,
                      readout_chunk(spec, settings.internal_batch_size))

