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

from dataclasses import dataclass, field, replace
from typing import Any, Optional, Union

from torch import Tensor

from captum_iglens._core.capture import paths_from_states, recorded_layers
from captum_iglens._core.estimators import grid_probs
from captum_iglens._core.inputs import check_top_k, single_position
from captum_iglens._core.pipeline import (
    capture_lens_path,
    check_estimator,
    delta_of,
    output_from_path,
    readout_chunk,
)
from captum_iglens._core.sublayer_path import capture_granular, sublayer_output
from captum_iglens._core.total_effect import run_total
from captum_iglens._utils.typing import BaselineSpec, PositionSpec, TargetSpec
from captum_iglens.lens.changes import check_unchanged
from captum_iglens.lens.readout import ModelDistribution
from captum_iglens.lens.spec import LensSpec
from captum_iglens.results import IGLensOutput
from captum_iglens.settings import DEFAULT_EFFECT, DEFAULT_METHOD, AttributionSettings

__all__ = ["Forward", "Recorded", "Source", "attribute", "check_estimator", "delta_of",
           "grid_profile", "layers_to_record"]


@dataclass(frozen=True)
class Forward:
    """A teacher-forced request: the model runs over ``inputs`` (as ``IGLens.attribute``).

    Attributes:
        inputs (Tensor): ``[B, S]`` int64 token ids.
        target: Target ids (``None``: the model's argmax at each explained position).
        positions: The explained positions (an int drops the ``P`` axis of the result).
        additional_forward_args: Attention mask, keyword dict or Captum-style tuple.
        contrast: Foil ids, or ``None``.
        explained (Tensor, optional): ``[B, P]`` bool, the pairs read out (ragged rows).
    """

    inputs: Tensor
    target: TargetSpec = None
    positions: PositionSpec = -1
    additional_forward_args: Any = None
    contrast: TargetSpec = None
    explained: Optional[Tensor] = None


@dataclass(frozen=True)
class Recorded:
    """Residuals recorded by another pass (generation, a document chunk): no forward here.

    Attributes:
        states (dict[int, Tensor]): ``{l: h_l}``, ``[B, P, d]`` at the explained positions
            (``[B, S, d]`` for those :func:`layers_to_record` needs whole).
        distribution (ModelDistribution): The model's own distribution ``[B, P, V]`` there.
        positions (list[int]): The ``P`` explained columns.
        target: Target ids ``[B, P]``.
        seq_len (int): ``S``.
        contrast: Foil ids ``[B, P]``, or ``None``.
        mask (Tensor, optional): ``[B, S]`` attention mask.
        explained (Tensor, optional): ``[B, P]`` bool, the pairs read out.
        start (str or Tensor, optional): The path start, in place of ``settings.baselines``
            (a document chunk's running mean ``[1, P, d]``); ``None``: the settings'.
        start_name (str, optional): What the output records as its baseline with ``start``.
    """

    states: dict[int, Tensor] = field(repr=False)
    distribution: ModelDistribution = field(repr=False)
    positions: list[int]
    target: TargetSpec
    seq_len: int
    contrast: TargetSpec = None
    mask: Optional[Tensor] = None
    explained: Optional[Tensor] = None
    start: BaselineSpec = None
    start_name: Optional[str] = None


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
            ``internal_batch_size`` (the lens's own ``units``, ``granularity`` and
            ``effect`` decide, not the settings').
        top_k (int, optional): The logit lens's top tokens recorded per layer. Default: 0.

    Returns:
        (output, single): the :class:`~captum_iglens.results.IGLensOutput` (``[B, P, ...]``,
        ``method`` and ``n_steps`` recorded) and whether one int position was asked for.

    Raises:
        ValueError: an unknown estimator or bad ``n_steps``
            (:func:`~captum_iglens._core.pipeline.check_estimator`), ``top_k`` negative or
            above the vocabulary, a recording for a
            sub-layer or total-effect lens; and as :meth:`~captum_iglens.IGLens.attribute`.
        RuntimeError: a gradient estimator under ``torch.inference_mode()``.
        ModelChangedError: the model changed since the lens was built
            (:func:`~captum_iglens.lens.changes.check_unchanged`).
    """
    method, n_steps = settings.method, settings.n_steps
    check_estimator(method, n_steps)
    check_top_k(top_k, spec.vocab_size)
    check_unchanged(spec)
    if isinstance(source, Recorded):
        return _recorded(spec, source, settings, top_k), False
    if spec.effect != DEFAULT_EFFECT:
        return run_total(spec, source.inputs, settings.baselines, source.target,
                         source.additional_forward_args, n_steps, method,
                         settings.internal_batch_size, source.positions, top_k,
                         source.contrast, source.explained)
    chunk = readout_chunk(spec, settings.internal_batch_size)
    if spec.granularity == "sublayer":
        return sublayer_output(spec, source.inputs, settings.baselines, source.target,
                               source.additional_forward_args, n_steps, method, chunk,
                               source.positions, top_k, source.contrast, source.explained)
    # the capture is handed over, not kept: its [B, P, V] distribution is freed after the check
    out = output_from_path(spec, capture_lens_path(
        spec, source.inputs, source.target, source.positions, settings.baselines,
        source.additional_forward_args, source.contrast, source.explained),
        method, n_steps, chunk, top_k)
    return out, single_position(source.positions)


def _recorded(spec: LensSpec, source: Recorded, settings: AttributionSettings,
              top_k: int) -> IGLensOutput:
    """Read out recorded residuals: the block-readout path only."""
    if not spec.recordable or spec.effect != DEFAULT_EFFECT:
        raise ValueError("A recording holds the block outputs only: explain a sub-layer or "
                         "total-effect lens with one teacher-forced forward (Forward), not "
                         "from a recording.")
    start = settings.baselines if source.start is None else source.start
    cap = paths_from_states(source.states, source.distribution, spec.layer_indices,
                            source.positions, source.mask, source.target, source.contrast,
                            start, source.explained, source.seq_len)
    if source.start_name is not None:
        cap = replace(cap, baseline=source.start_name)
    chunk = readout_chunk(spec, settings.internal_batch_size)
    return output_from_path(spec, cap, settings.method, settings.n_steps, chunk, top_k)


def grid_profile(spec: LensSpec, source: Forward, *, settings: AttributionSettings) -> Tensor:
    """The readout ``f`` on a uniform grid of ``n_steps + 1`` points along each segment.

    ``[B, P, k, n_steps + 1]`` in the lens's units (float32): point ``s`` of segment ``j``
    at ``h_{L_{j-1}} + s / n_steps * (h_{L_j} - h_{L_{j-1}})`` (see
    :meth:`~captum_iglens.IGLens.path_probabilities`).

    Raises:
        ValueError: ``n_steps < 1``; and as :func:`attribute`.
    """
    check_estimator(DEFAULT_METHOD, settings.n_steps)  # a grid of n_steps >= 1 points
    cap = capture_granular(spec, source.inputs, source.target, source.positions,
                           settings.baselines, source.additional_forward_args, source.contrast)
    path = replace(cap.path, log=spec.units == "log-probability")
    return grid_probs(spec.readout, path, settings.n_steps,
                      readout_chunk(spec, settings.internal_batch_size))

