"""What an :class:`~captum_iglens.IGLens` shows of its :class:`LensSpec`, and two read-outs.

:class:`LensViews` is the part of ``IGLens`` that is not Captum's ``attribute`` surface: the
lens's parts and settings, read from its frozen :class:`~captum_iglens.lens.spec.LensSpec`,
the grid profile inside each path segment (:meth:`LensViews.path_probabilities`) and the
onset layers of computed credits (:meth:`LensViews.onset_layers`).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Optional

from torch import Tensor

from captum_iglens._core.estimators import grid_probs
from captum_iglens._core.onset import onset_layer_indices
from captum_iglens._core.pipeline import readout_chunk
from captum_iglens._core.sublayer_path import capture_granular
from captum_iglens._utils.typing import BaselineSpec, PositionSpec, TargetSpec, is_int
from captum_iglens.lens.spec import LensSpec
from captum_iglens.settings import (
    DEFAULT_BASELINE,
    DEFAULT_N_STEPS,
    DEFAULT_ONSET_FRAC,
    DEFAULT_ONSET_RULE,
)

__all__ = ["LensViews"]


class LensViews:
    """The parts, settings and grid read-outs of a lens that holds ``self.spec``."""

    spec: LensSpec

    # The lens's parts and settings, read from its LensSpec (see lens/spec.py).
    model = property(lambda self: self.spec.model, doc="The causal LM (wrappers stripped).")
    decoder_blocks = property(lambda self: self.spec.decoder_blocks, doc="Its decoder blocks.")
    readout = property(lambda self: self.spec.readout,
                       doc="Residual ``[..., d]`` -> logits ``[..., V]`` (final norm, head).")
    layer_indices = property(lambda self: self.spec.layer_indices,
                             doc="The chosen hidden-state indices ``L_1 < ... < L_k = n``.")
    units = property(lambda self: self.spec.units, doc="The decomposed readout's units.")
    granularity = property(lambda self: self.spec.granularity, doc="``block`` or ``sublayer``.")
    effect = property(lambda self: self.spec.effect, doc="``readout``, ``total`` or ``atp``.")
    heads = property(lambda self: self.spec.heads, doc="Per-head attention credits.")
    half_site = property(lambda self: self.spec.half_site, doc="Where ``L.attn`` lives.")
    head_site = property(lambda self: self.spec.head_site, doc="Where the heads meet.")
    num_layers = property(lambda self: self.spec.num_layers, doc="``n``, the decoder blocks.")
    node_indices = property(lambda self: self.spec.node_indices,
                            doc="The credited nodes (sub-layer nodes ``2L - 1``, ``2L``).")

    @property
    def check_readout(self) -> bool:
        """Check on every call that the readout of ``h_n`` is the model's distribution."""
        return self.spec.check_readout

    @check_readout.setter
    def check_readout(self, value: bool) -> None:
        self.spec = replace(self.spec, check_readout=bool(value))


    def path_probabilities(
        self,
        inputs: Tensor,
        baselines: BaselineSpec = DEFAULT_BASELINE,
        target: TargetSpec = None,
        additional_forward_args: Any = None,
        n_steps: int = DEFAULT_N_STEPS,
        internal_batch_size: Optional[int] = None,
        *,
        positions: PositionSpec = -1,
        contrast: TargetSpec = None,
    ) -> Tensor:
        """The readout ``f`` on a uniform grid of ``n_steps + 1`` points along each segment.

        The per-step profile inside segments: ``[B, P, k, n_steps + 1]`` (in the lens's
        units, float32; with ``contrast`` (keyword-only, as for :meth:`attribute`) values of
        ``F = f_y - f_foil``), point ``s`` of segment ``j`` at ``h_{L_{j-1}} + s / n_steps *
        (h_{L_j} - h_{L_{j-1}})``. Summing the observed changes along the last dimension gives
        the prediction-aware credits; this costs ``T * k * (n_steps + 1)`` readouts, which
        :meth:`attribute` avoids.

        Raises:
            ValueError: ``n_steps < 1``; and as :meth:`attribute`.
        """
        if not is_int(n_steps) or n_steps < 1:
            raise ValueError(f"n_steps must be an int >= 1, got {n_steps!r}")
        cap = capture_granular(self.spec, inputs, target, positions, baselines,
                               additional_forward_args, contrast)
        path = replace(cap.path, log=self.units == "log-probability")
        return grid_probs(self.readout, path, n_steps, readout_chunk(self.spec,
                                                                 internal_batch_size))

    def onset_layers(
        self, attributions: Tensor, frac: float = DEFAULT_ONSET_FRAC, rule: str = DEFAULT_ONSET_RULE
    ) -> Tensor:
        """Onset layer ``L*`` per explained prediction (see :func:`onset_layer_indices`).

        Args:
            attributions (Tensor): ``[..., k]`` credits from :meth:`attribute`.
            frac (float, optional): Fraction in ``(0, 1]``. Default: 0.5.
            rule (str, optional): ``"sustained"`` (default: the first layer from which the
                cumulative credit stays at or beyond ``frac * delta_p``) or ``"mass"`` (the
                first layer holding ``frac`` of the cumulative ``|credit|``).

        Returns:
            Tensor: ``[...]`` int64 hidden-state indices (values of ``node_indices``: sub-layer
            node indices with ``granularity="sublayer"``).
        """
        return onset_layer_indices(attributions, self.node_indices, frac, rule)
