"""IG-Lens: exact additive probability attribution across decoder layers.

D. A. Nguyen, "IG-Lens: Exact Additive Probability Attribution Across Transformer Layers
via Telescoping Integrated Gradients", arXiv:2606.29693 (2026).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Callable, Literal, Optional, Union, overload

from captum.attr import GradientAttribution
from captum.log import log_usage
from torch import Tensor, nn

from captum_iglens._core.baselines import BASELINES
from captum_iglens._core.entry import Forward, attribute, delta_of, grid_profile
from captum_iglens._core.estimators import METHODS
from captum_iglens._core.onset import onset_layer_indices
from captum_iglens._utils.typing import BaselineSpec, LayerSpec, PositionSpec, TargetSpec
from captum_iglens.lens.layer_readout import LayerReadout
from captum_iglens.lens.readout import ReadoutMismatchError
from captum_iglens.lens.spec import LensSpec
from captum_iglens.results import IGLensOutput
from captum_iglens.settings import (
    DEFAULT_BASELINE,
    DEFAULT_EFFECT,
    DEFAULT_GRANULARITY,
    DEFAULT_METHOD,
    DEFAULT_N_STEPS,
    DEFAULT_ONSET_FRAC,
    DEFAULT_ONSET_RULE,
    DEFAULT_UNITS,
    AttributionSettings,
    call_settings,
)

__all__ = ["BASELINES", "METHODS", "IGLens", "IGLensOutput", "ReadoutMismatchError"]


def _spec_view(name: str, doc: str) -> property:
    """A read-only property showing the lens's ``spec.<name>``."""
    return property(lambda self: getattr(self.spec, name), doc=doc)


class IGLens(GradientAttribution):
    r"""IG-Lens attributes the probability of a predicted token to the decoder layers.

    For chosen hidden-state indices ``0 <= L_1 < ... < L_k = n`` and a baseline ``b`` in
    residual space, IG-Lens integrates the gradient of the lens readout
    ``f_y(h) = softmax(unembed(final_norm(h)))[y]`` along the single piecewise-linear path
    ``b -> h_{L_1} -> ... -> h_{L_k}`` and credits layer ``L_j`` with its segment. By the
    gradient theorem the credits telescope (Proposition 1 of the paper)::

        sum_j IGL_j = f_y(h_n) - f_y(b) = delta_p

    so the per-layer credits add up to the change of the target token's *probability*.
    With ``contrast=`` (foil ids) the readout is ``F = f_y - f_foil`` ("why this token rather
    than that one"), and the credits add up to the change of ``F`` the same way.
    Captum's LayerIntegratedGradients gives every layer its own baseline; its per-layer
    totals do not add up this way.

    What IG-Lens measures is a conditional marginal: the extra probability the final norm and
    unembedding read out of ``h_L`` beyond the previous chosen layer, not block ``L``'s total
    causal effect (ablation measures that; ``effect="total"`` splits it exactly).
    The default estimator, ``"prediction_aware"`` (IDGI-style), credits each segment its
    observed change in ``f`` (``T * (k + 1)`` readouts, no backward pass); the gradient
    estimators (Captum's ``riemann_*``, ``gausslegendre``) are the paper's reference variant.

    Examples::

        >>> from captum_iglens import IGLens
        >>> lens = IGLens(model)                    # all decoder blocks
        >>> ids = tokenizer("The capital of France is", return_tensors="pt").input_ids
        >>> attr, delta = lens.attribute(ids, return_convergence_delta=True)
        >>> attr.shape                              # [B, k]: one credit per layer
        >>> lens.onset_layers(attr)                 # first layer from which half is held
    """

    def __init__(
        self,
        model: nn.Module,
        layers: LayerSpec = None,
        readout: Optional[Callable[[Tensor], Tensor]] = None,
        decoder_blocks: Optional[nn.ModuleList] = None,
        check_readout: bool = True,
        units: str = DEFAULT_UNITS,
        granularity: str = DEFAULT_GRANULARITY,
        heads: bool = False,
        effect: str = DEFAULT_EFFECT,
        lens: Union[None, str, LayerReadout] = None,
    ) -> None:
        r"""Build IG-Lens for a causal LM and its chosen layers.

        Args:
            model (nn.Module): A Hugging Face causal LM (``*ForCausalLM``) or any model whose
                decoder blocks and readout are given explicitly.
            layers (int, nn.Module, sequence of them, or "all", optional): The chosen
                layers. Modules are decoder blocks (Captum style, as in
                ``LayerIntegratedGradients(forward, layer)``; block ``i`` of
                ``model.model.layers`` is hidden-state index ``i + 1``) or the input
                embedding (index 0); ints are hidden-state indices ``0..n`` (negative ints
                count from ``n + 1``). The last block ``n`` is always included.
                ``None`` or ``"all"`` (default) takes all ``n`` blocks.
            readout (callable, optional): Maps a pre-final-norm residual ``[..., d]`` to the
                model's logits ``[..., V]``. Default: the model's final norm and unembedding
                (:func:`~captum_iglens.lens.readout.resolve_readout`).
            decoder_blocks (nn.ModuleList, optional): The decoder blocks, for models that
                :func:`~captum_iglens.lens.architectures.resolve_layout` does not know.
            check_readout (bool, optional): Verify on every call that the readout of the
                last block's residual is the model's own probability (default True).
            units (str, optional): The readout ``f`` decomposed: ``"probability"`` (default,
                the paper's) or ``"log-probability"`` (credits, levels and deltas in nats).
            granularity (str, optional): ``"block"`` (default: one path node ``h_L`` per
                chosen block) or ``"sublayer"``: every chosen block ``L >= 1`` becomes two
                nodes, ``L.attn`` (after its attention, before its MLP) and ``L.mlp``
                (``h_L``); credits ``[B, P, 2k]`` (``2k - 1`` with the embedding), named
                ``"L3.attn"``, ``"L3.mlp"``, a block's two adding up to its block credit
                (Proposition 1 of arXiv:2606.29693 on a finer path). About twice the readouts.
            heads (bool, optional): With ``granularity="sublayer"``, also split each
                attention credit over the heads (:mod:`captum_iglens._core.heads`, exact at
                any ``n_steps``, one backward per step): ``attribute_details`` then fills
                ``head_credits`` and ``head_rest``. Llama-like families only. Default: False.
            effect (str, optional): What a credit measures. ``"readout"`` (default, the
                paper's: what the final norm and unembedding read out of ``h_L`` beyond the
                previous chosen layer); ``"total"``: each chosen block's exact share of the
                change of ``p(y)`` when every chosen update at the explained position goes to
                its reference (``baselines``: ``"mean"``, ``"zero"`` or reference ids), adding
                up to ``F(1) - F(0)``; ``"atp"``: attribution patching (not additive). See
                :mod:`captum_iglens._core.total_effect` (sub-layer and head gates too).
            lens (str or LayerReadout, optional): ``"logit"`` (default), ``"tuned"``,
                ``"jacobian"`` (fitted: :mod:`captum_iglens.lens.fit`) or a per-layer readout.

        Raises:
            UnknownArchitectureError: the decoder blocks or final norm cannot be located.
            ValueError: a layer out of range, given twice, or not a decoder block; an unknown
                ``granularity`` or ``effect``; ``heads=True`` without sub-layers.
            TypeError: a layer of another type (e.g. a string other than ``"all"``).
            SublayerUnsupportedError: sub-layers (or heads) for a family whose half-block
                residual (or head split) is not known, naming what to use instead.
        """
        self.spec = LensSpec.from_model(model, layers, readout, decoder_blocks, check_readout,
                                        units, granularity, heads, effect, lens)
        GradientAttribution.__init__(self, self.spec.model)

    @classmethod
    def get_name(cls) -> str:
        """``"IG-Lens"``."""
        return "IG-Lens"

    # The lens's parts and settings, read from its frozen LensSpec (lens/spec.py).
    model = _spec_view("model", "The causal LM (wrappers stripped).")
    decoder_blocks = _spec_view("decoder_blocks", "Its decoder blocks.")
    readout = _spec_view("readout", "Residual ``[..., d]`` -> logits ``[..., V]``.")
    layer_indices = _spec_view("layer_indices", "The chosen indices ``L_1 < ... < L_k = n``.")
    units = _spec_view("units", "The decomposed readout's units.")
    granularity = _spec_view("granularity", "``block`` or ``sublayer``.")
    effect = _spec_view("effect", "``readout``, ``total`` or ``atp``.")
    heads = _spec_view("heads", "Per-head attention credits.")
    half_site = _spec_view("half_site", "Where ``L.attn`` lives.")
    head_site = _spec_view("head_site", "Where the heads meet.")
    num_layers = _spec_view("num_layers", "``n``, the decoder blocks.")
    node_indices = _spec_view("node_indices", "The credited nodes (sub-layers: ``2L - 1, 2L``).")

    @property
    def check_readout(self) -> bool:
        """Check on every call that the readout of ``h_n`` is the model's distribution."""
        return self.spec.check_readout

    @check_readout.setter
    def check_readout(self, value: bool) -> None:
        self.spec = replace(self.spec, check_readout=bool(value))

    @overload
    def attribute(
        self, inputs: Tensor, baselines: BaselineSpec = ..., target: TargetSpec = ...,
        additional_forward_args: Any = ..., n_steps: int = ..., method: str = ...,
        internal_batch_size: Optional[int] = ..., *,
        return_convergence_delta: Literal[True], positions: PositionSpec = ...,
        contrast: TargetSpec = ..., settings: Optional[AttributionSettings] = ...,
    ) -> tuple[Tensor, Tensor]: ...

    @overload
    def attribute(
        self, inputs: Tensor, baselines: BaselineSpec = ..., target: TargetSpec = ...,
        additional_forward_args: Any = ..., n_steps: int = ..., method: str = ...,
        internal_batch_size: Optional[int] = ...,
        return_convergence_delta: Literal[False] = ..., *, positions: PositionSpec = ...,
        contrast: TargetSpec = ..., settings: Optional[AttributionSettings] = ...,
    ) -> Tensor: ...

    @log_usage()
    def attribute(
        self,
        inputs: Tensor,
        baselines: BaselineSpec = DEFAULT_BASELINE,
        target: TargetSpec = None,
        additional_forward_args: Any = None,
        n_steps: int = DEFAULT_N_STEPS,
        method: str = DEFAULT_METHOD,
        internal_batch_size: Optional[int] = None,
        return_convergence_delta: bool = False,
        *,
        positions: PositionSpec = -1,
        contrast: TargetSpec = None,
        settings: Optional[AttributionSettings] = None,
    ) -> Union[Tensor, tuple[Tensor, Tensor]]:
        r"""Attribute the target token's probability to the chosen decoder layers.

        The positional order is Captum's (``LayerIntegratedGradients.attribute``), so a
        Captum call runs unchanged; ``positions`` is keyword-only.

        Args:
            inputs (Tensor): Token ids ``[B, S]`` (int64). Left-pad batches and pass the
                attention mask in ``additional_forward_args``.
            baselines (str or Tensor, optional): Where the path starts. ``"mean"``
                (default; the causal mean of ``h_1``, the first block's output, whichever
                layers are chosen: at position ``p`` over the non-padded positions ``<= p``
                of ``p``'s own document, packed documents told apart by restarting
                ``position_ids``; nothing after ``p`` is read), ``"zero"``,
                ``"embedding"`` (``h_0`` at the same position); a floating tensor in residual
                space of shape ``[d]``, ``[B, d]``, ``[B, P, d]`` or ``[B, S, d]``; or
                integer *reference token ids* ``[B, S]`` as Captum users pass them to the
                layer methods: the path then starts at the reference's last-block residual at
                each explained position, so the credits add up to ``F(x) - F(x')``.
            target (int, sequence or Tensor, optional): Target token ids, ``[B]`` (same id at
                every position) or ``[B, P]``, or an int for all. ``None`` (default) takes the
                model's argmax next token at each explained position.
            additional_forward_args (Tensor, tuple or dict, optional): An attention mask
                ``[B, S]``, a dict of keyword arguments, or a Captum-style tuple whose first
                element is the attention mask (every family); further elements follow the
                forward's parameters after ``input_ids``, ``attention_mask`` left out. With a
                mask, ``position_ids`` are derived from it (left padding).
            n_steps (int, optional): Steps per segment for the gradient estimators (>= 2).
                The prediction-aware credits do not depend on it. Default: 50.
            method (str, optional): ``"prediction_aware"`` (default, exact, no backward pass)
                or one of Captum's ``riemann_left``, ``riemann_right``, ``riemann_middle``,
                ``riemann_trapezoid``, ``gausslegendre``.
            internal_batch_size (int, optional): Residual vectors per readout chunk. Results
                do not depend on it. Default: ``None``, chunks of ``2**24 // V`` rows.
            return_convergence_delta (bool, optional): Also return the delta. Default: False.
            positions (int or sequence of int, optional): Keyword-only. The positions whose
                next-token prediction is explained; negative values count from the end.
                Default: -1.
            contrast (int, sequence or Tensor, optional): Keyword-only. Foil token ids, in
                any form ``target`` takes (an int, ``[B]`` or ``[B, P]``): the readout is then
                ``F = p(y) - p(foil)`` ("why y rather than the foil"; with
                ``units="log-probability"``, ``log p(y) - log p(foil)`` in nats, the logit
                difference), and the credits add up to the change of ``F``. Default: None.
            settings (AttributionSettings, optional): Keyword-only: ``baselines``,
                ``n_steps``, ``method`` and ``internal_batch_size`` in one object
                (:class:`~captum_iglens.settings.AttributionSettings`), instead of those
                arguments (given both, ``ValueError``). Default: None.

        Returns:
            **attributions** or 2-element tuple of **attributions**, **delta**:
            - **attributions** (*Tensor*): ``[B, k]`` for an int ``positions``, else
              ``[B, P, k]``; in the units of ``F`` (probability by default); float32
              (float64 for a float64 model).
            - **delta** (*Tensor*): ``attributions.sum(-1) - delta_p``, ``[B]`` or ``[B, P]``
              (a per-layer ``lens``: plus the lens terms, ``attribute_details().lens_change``).

        Raises:
            ValueError: empty inputs, token, target or contrast ids outside the vocabulary,
                a target or contrast of the wrong shape, a contrast equal to the target at
                some position (``F`` is identically 0 there), positions outside the sequence
                or on padding, a baseline of the wrong shape, an unknown method, an input
                longer than the model's position table, or a decoder block whose output is
                not a ``[B, S, d]`` residual stream.
            TypeError: text or float targets or contrasts, non-integer positions.
            FloatingPointError: NaN or inf in a residual (the first such hidden-state index
                and its block's module path are named) or in the readout.
            ReadoutMismatchError: the readout of ``h_n`` is not the model's own probability.

        Examples::

            >>> lens = IGLens(model, layers=[model.model.layers[i] for i in (9, 19, 29)])
            >>> attr, delta = lens.attribute(ids, "mean", None, mask,
            ...     return_convergence_delta=True, positions=[-2, -1])
            >>> attr.shape, delta.shape                  # [B, 2, 3], [B, 2]
            >>> ref = torch.where(special, ids, space_id)  # Captum-style reference ids
            >>> attr = lens.attribute(ids, ref, target)    # adds up to F(x) - F(x')
            >>> attr = lens.attribute(ids, target=paris, contrast=lyon)  # p(Paris) - p(Lyon)
        """
        chosen = call_settings(settings, self.spec, baselines=baselines, n_steps=n_steps,
                               method=method, internal_batch_size=internal_batch_size)
        source = Forward(inputs, target, positions, additional_forward_args, contrast)
        out, single = attribute(self.spec, source, settings=chosen)
        attributions, delta = out.attributions, out.convergence_delta
        if single:
            attributions, delta = attributions[:, 0], delta[:, 0]
        return (attributions, delta) if return_convergence_delta else attributions

    def attribute_future(self) -> Callable:
        """Not implemented for IG-Lens (as for Captum's layer methods): NotImplementedError."""
        raise NotImplementedError("attribute_future is not implemented for IGLens")

    def attribute_details(
        self,
        inputs: Tensor,
        baselines: BaselineSpec = DEFAULT_BASELINE,
        target: TargetSpec = None,
        additional_forward_args: Any = None,
        n_steps: int = DEFAULT_N_STEPS,
        method: str = DEFAULT_METHOD,
        internal_batch_size: Optional[int] = None,
        *,
        positions: PositionSpec = -1,
        top_k: int = 0,
        contrast: TargetSpec = None,
        explained: Optional[Tensor] = None,
        settings: Optional[AttributionSettings] = None,
    ) -> IGLensOutput:
        """Like :meth:`attribute`, returning an :class:`~captum_iglens.results.IGLensOutput`.

        It holds the credits, the logit-lens levels, ``p_final``, ``p_baseline``, the targets
        (and foils), the delta, ``method`` and ``n_steps``, the ``P`` dimension kept. Same
        arguments and errors as :meth:`attribute`, plus (keyword-only) ``top_k``: the levels'
        readout's ``top_k`` most probable tokens per chosen layer (``out.top_k_ids`` /
        ``out.top_k_probs``, ``[B, P, k, top_k]``, probabilities; default 0) and
        ``explained``: a ``[B, P]`` bool tensor for a ragged batch; only its True pairs are
        read out and checked, the others' credits, levels, ``p_final``, ``p_baseline`` and
        delta are NaN, their ``model_argmax`` and ``top_k_ids`` -1 (default ``None``: all).

        Raises:
            ValueError: ``top_k`` negative or above the vocabulary, ``explained`` not
                ``[B, P]`` or all False; and as :meth:`attribute`.
            TypeError: ``explained`` not a bool tensor.
        """
        chosen = call_settings(settings, self.spec, baselines=baselines, n_steps=n_steps,
                               method=method, internal_batch_size=internal_batch_size)
        source = Forward(inputs, target, positions, additional_forward_args, contrast,
                         explained)
        return attribute(self.spec, source, settings=chosen, top_k=top_k)[0]

    def has_convergence_delta(self) -> bool:
        """True: the delta is ``sum of credits - delta_p`` per explained prediction."""
        return True

    @log_usage()
    def compute_convergence_delta(
        self,
        attributions: Tensor,
        start_point: Optional[BaselineSpec],
        end_point: Tensor,
        target: TargetSpec = None,
        additional_forward_args: Any = None,
        *,
        positions: PositionSpec = -1,
        internal_batch_size: Optional[int] = None,
        contrast: TargetSpec = None,
    ) -> Tensor:
        """``attributions.sum(-1) - (f(h_n) - f(b))`` per explained prediction.

        Captum's argument order: ``start_point`` is the baseline, ``end_point`` the inputs;
        ``attributions`` (``[B, k]`` or ``[B, P, k]``) from :meth:`attribute`; the other
        arguments as passed to it (``start_point`` ``None``: ``"mean"``; with ``contrast``,
        ``f`` is ``F``).

        Returns:
            Tensor: ``[B]`` or ``[B, P]``, in the units of ``f``.

        Raises:
            ValueError: ``attributions`` of another shape; and as :meth:`attribute`.
        """
        base = DEFAULT_BASELINE if start_point is None else start_point
        ends = AttributionSettings(baselines=base, n_steps=2,  # the path's ends only
                                   internal_batch_size=internal_batch_size)
        source = Forward(end_point, target, positions, additional_forward_args, contrast)
        out, single = attribute(self.spec, source, settings=ends)
        return delta_of(attributions, out, single)

    def path_probabilities(
        self, inputs: Tensor, baselines: BaselineSpec = DEFAULT_BASELINE,
        target: TargetSpec = None, additional_forward_args: Any = None,
        n_steps: int = DEFAULT_N_STEPS, internal_batch_size: Optional[int] = None, *,
        positions: PositionSpec = -1, contrast: TargetSpec = None,
    ) -> Tensor:
        """``f`` at ``n_steps + 1`` uniform points of each segment: ``[B, P, k, n_steps + 1]``.

        In the lens's units (float32; with ``contrast``, ``F = f_y - f_foil``): point ``s`` of
        segment ``j`` at ``h_{L_{j-1}} + s / n_steps * (h_{L_j} - h_{L_{j-1}})``; its observed
        changes sum to the prediction-aware credits (``T * k * (n_steps + 1)`` readouts,
        :func:`~captum_iglens._core.entry.grid_profile`). Raises ``ValueError`` for
        ``n_steps < 1`` and as :meth:`attribute`.
        """
        grid = AttributionSettings(baselines=baselines, n_steps=n_steps,
                                   internal_batch_size=internal_batch_size)
        source = Forward(inputs, target, positions, additional_forward_args, contrast)
        return grid_profile(self.spec, source, settings=grid)

    def onset_layers(self, attributions: Tensor, frac: float = DEFAULT_ONSET_FRAC,
                     rule: str = DEFAULT_ONSET_RULE) -> Tensor:
        """Onset layer ``L*`` of ``attributions [..., k]``: ``[...]`` int64 ``node_indices``.

        ``rule``: ``"sustained"`` (default; cumulative credit at or past ``frac * delta_p``
        from there on, ``frac`` default 0.5) or ``"mass"`` (see ``onset_layer_indices``).
        """
        return onset_layer_indices(attributions, self.node_indices, frac, rule)
