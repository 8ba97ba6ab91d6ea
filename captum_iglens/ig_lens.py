"""IG-Lens: exact additive probability attribution across decoder layers.

D. A. Nguyen, "IG-Lens: Exact Additive Probability Attribution Across Transformer Layers
via Telescoping Integrated Gradients", arXiv:2606.29693 (2026).
"""

from __future__ import annotations

from typing import Any, Callable, Literal, Optional, Union, overload

from captum.attr import GradientAttribution
from captum.log import log_usage
from torch import Tensor, nn

from captum_iglens._core.baselines import BASELINES
from captum_iglens._core.estimators import (
    METHODS,
)
from captum_iglens._core.inputs import check_top_k
from captum_iglens._core.lens_views import LensViews
from captum_iglens._core.pipeline import delta_of, run_lens
from captum_iglens._core.sublayer_path import run_granular
from captum_iglens._core.total_effect import run_total
from captum_iglens._utils.typing import BaselineSpec, LayerSpec, PositionSpec, TargetSpec
from captum_iglens.lens.changes import check_unchanged
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
    DEFAULT_UNITS,
)

__all__ = ["BASELINES", "METHODS", "IGLens", "IGLensOutput", "ReadoutMismatchError"]


class IGLens(LensViews, GradientAttribution):
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

    What IG-Lens measures is a conditional marginal: the extra probability that the final
    norm and unembedding can read out of ``h_L`` beyond the previous chosen layer. It is not
    the total causal effect of block ``L`` through the blocks above it; ablating the block
    measures that, and ``effect="total"`` splits it exactly (``effect="atp"``: attribution
    patching's first-order estimate).

    The default estimator, ``"prediction_aware"`` (IDGI-style), credits each segment its
    observed change in ``f``: the whole token x layer map costs ``T * (k + 1)`` readouts and
    no backward pass. The gradient estimators (Captum's ``riemann_*`` and ``gausslegendre``)
    are the paper's reference variant; their convergence delta is the discretisation error.

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
            units (str, optional): The readout ``f`` that is decomposed: ``"probability"``
                (default, the paper's) or ``"log-probability"`` (nats). The telescoping holds
                for any scalar readout of ``h``; credits, levels and deltas are then in nats.
            granularity (str, optional): ``"block"`` (default: one path node ``h_L`` per
                chosen block) or ``"sublayer"``: every chosen block ``L >= 1`` becomes two
                nodes, ``L.attn`` (the residual after its attention, before its MLP) and
                ``L.mlp`` (``h_L``), so the path is ``b -> L_1.attn -> h_{L_1} -> L_2.attn
                -> ...`` and the credits are ``[B, P, 2k]`` (``2k - 1`` with the embedding,
                which stays one node), named ``"L3.attn"``, ``"L3.mlp"``. The attention and
                MLP credits of a block add up to its block-granularity credit and all of them
                to ``delta_p`` (Proposition 1 of arXiv:2606.29693 on a finer path). When the
                chosen layers skip blocks, the segment before ``L.attn`` spans the blocks in
                between too. Costs about twice the readouts of ``"block"``.
            heads (bool, optional): With ``granularity="sublayer"``, also split each
                attention credit over the heads (:mod:`captum_iglens._core.heads`: each grid step's
                observed change in ``f`` shared in proportion to ``grad f . c_h``; exact at any
                ``n_steps``; one backward pass per step, ``n_steps + 1`` steps per attention
                segment). ``attribute_details`` then fills ``head_credits`` and
                ``head_rest``. Llama-like families only. Default: False.
            effect (str, optional): What a credit measures. ``"readout"`` (default, the
                paper's: what the final norm and unembedding read out of ``h_L`` beyond the
                previous chosen layer). ``"total"``: each chosen block's exact share of the
                change of the model's own ``p(y)`` at the explained position ``i`` when every
                chosen block's update there goes to its reference: gates
                ``h_L[i] = h_{L-1}[i] + r_L + g_L (u_L[i] - r_L)`` (``u_L`` computed from the
                gated stream) integrated along ``g = a * 1``; the credits add up to
                ``F(1) - F(0)``. ``baselines`` then names the reference ``r_L``: ``"mean"``
                (the causal running mean of the update over the earlier positions of the
                document, its first position left out), ``"zero"`` (``F(0) = f(h_0[i])`` with
                every block chosen) or reference token ids (their update at ``i``); and
                ``method`` the estimator (``"prediction_aware"``: each step's observed change
                split among the blocks, exact at any ``n_steps``; Captum's rules: integrated
                gradients with a discretisation error). ``"atp"``: attribution patching's
                first-order estimate ``grad_{h_L[i]} F . (u_L[i] - r_L)`` per block (one
                backward per position), reported with its gap to ``delta_p``: not a
                decomposition. See :mod:`captum_iglens._core.total_effect`. Decoder blocks
                only (no embedding); with ``granularity="sublayer"`` each sequential
                block's attention and MLP updates are gated separately (``2k`` credits,
                :mod:`captum_iglens._core.sublayer_gates`); no head gates yet.
            lens (LayerReadout, optional): A per-layer readout ``lens(h, layer) -> logits``
                (block nodes; see :mod:`captum_iglens.lens.layer_readout`, and ``lens_change``
                of :class:`IGLensOutput`), or a name: ``"logit"``, ``"tuned"``, ``"jacobian"``
                (a fitted lens from the cache, :mod:`captum_iglens.lens.fit`; refused with a
                message to run ``iglens fit-lens`` when none is fitted). Default: None (the
                logit lens).

        Raises:
            UnknownArchitectureError: the decoder blocks or final norm cannot be located.
            ValueError: a layer out of range, given twice, or not a decoder block; an
                unknown ``granularity`` or ``effect``; ``heads=True`` without
                ``granularity="sublayer"``.
            TypeError: a layer of another type (e.g. a string other than ``"all"``).
            SublayerUnsupportedError: ``granularity="sublayer"`` (or ``heads=True``) for a
                family whose half-block residual (or head split) is not known; the message
                names the family and what to use instead.
        """
        self.spec = LensSpec.from_model(model, layers, readout, decoder_blocks, check_readout,
                                        units, granularity, heads, effect, lens)
        GradientAttribution.__init__(self, self.spec.model)

    @classmethod
    def get_name(cls) -> str:
        """``"IG-Lens"``."""
        return "IG-Lens"

    @property
    def _run(self) -> Callable[..., tuple[IGLensOutput, bool]]:
        """The pipeline of this effect and granularity (block readout: every release's)."""
        if self.spec.effect != DEFAULT_EFFECT:
            return run_total
        return run_lens if self.granularity == "block" else run_granular

    # ------------------------------------------------------------------ public API
    @overload
    def attribute(
        self, inputs: Tensor, baselines: BaselineSpec = ..., target: TargetSpec = ...,
        additional_forward_args: Any = ..., n_steps: int = ..., method: str = ...,
        internal_batch_size: Optional[int] = ..., *,
        return_convergence_delta: Literal[True], positions: PositionSpec = ...,
        contrast: TargetSpec = ...,
    ) -> tuple[Tensor, Tensor]: ...

    @overload
    def attribute(
        self, inputs: Tensor, baselines: BaselineSpec = ..., target: TargetSpec = ...,
        additional_forward_args: Any = ..., n_steps: int = ..., method: str = ...,
        internal_batch_size: Optional[int] = ...,
        return_convergence_delta: Literal[False] = ..., *, positions: PositionSpec = ...,
        contrast: TargetSpec = ...,
    ) -> Tensor: ...

    @log_usage()
    def attribute(  # type: ignore[override]
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
                element is the attention mask, for every family (GPT-2, Bloom, Falcon and
                GPT-J included, whose second forward parameter is the KV cache); further
                elements follow the forward's parameters after ``input_ids`` with
                ``attention_mask`` left out. With a mask, ``position_ids`` are derived from
                it for models that take them (left padding).
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

        Returns:
            **attributions** or 2-element tuple of **attributions**, **delta**:
            - **attributions** (*Tensor*): ``[B, k]`` for an int ``positions``, else
              ``[B, P, k]``; in the units of ``F`` (probability by default); float32
              (float64 for a float64 model).
            - **delta** (*Tensor*): ``attributions.sum(-1) - delta_p``, ``[B]`` or ``[B, P]``
              (the same as :meth:`compute_convergence_delta`).

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
        check_unchanged(self.spec)
        out, single = self._run(
            self.spec, inputs, baselines, target, additional_forward_args, n_steps, method,
            internal_batch_size, positions, contrast=contrast,
        )
        attributions, delta = out.attributions, out.convergence_delta
        if single:
            attributions, delta = attributions[:, 0], delta[:, 0]
        return (attributions, delta) if return_convergence_delta else attributions

    def attribute_future(self) -> Callable:
        """Not implemented for IG-Lens (as for Captum's layer methods).

        Raises:
            NotImplementedError: always.
        """
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
    ) -> IGLensOutput:
        """Like :meth:`attribute`, returning an :class:`~captum_iglens.results.IGLensOutput`.

        It holds the credits, the logit-lens probabilities, ``p_final``, ``p_baseline``, the
        targets (and foils, ``out.contrast``) and the delta, all with the ``P`` dimension
        kept; with ``contrast`` the levels are values of ``F = p(y) - p(foil)``. Same
        arguments and errors as :meth:`attribute`, plus ``top_k`` (keyword-only): the logit
        lens's ``top_k`` most probable tokens at each chosen layer (``out.top_k_ids`` /
        ``out.top_k_probs``, ``[B, P, k, top_k]``; always probabilities; default 0, none),
        and ``explained`` (keyword-only): a ``[B, P]`` bool tensor for a ragged batch, rows
        whose answers have other lengths. Only the True (row, position) pairs are read out
        (the readouts are most of the cost) and checked; the others may be padding, their
        credits, levels, ``p_final``, ``p_baseline`` and delta are NaN and their
        ``model_argmax`` and ``top_k_ids`` -1. Default ``None``: every pair.

        Raises:
            ValueError: ``top_k`` negative or above the vocabulary, ``explained`` not
                ``[B, P]`` or all False; and as :meth:`attribute`.
            TypeError: ``explained`` not a bool tensor.
        """
        check_top_k(top_k, self.spec.vocab_size)
        check_unchanged(self.spec)
        out, _ = self._run(
            self.spec, inputs, baselines, target, additional_forward_args, n_steps, method,
            internal_batch_size, positions, int(top_k), contrast, explained,
        )
        return out

    def has_convergence_delta(self) -> bool:
        """True: the delta is ``sum of credits - delta_p`` per explained prediction."""
        return True

    @log_usage()
    def compute_convergence_delta(  # type: ignore[override]
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

        Captum's argument order: ``start_point`` is the baseline, ``end_point`` the inputs.

        Args:
            attributions (Tensor): ``[B, k]`` or ``[B, P, k]`` from :meth:`attribute`.
            start_point (str or Tensor, optional): ``baselines`` as passed to
                :meth:`attribute` (``None``: ``"mean"``).
            end_point (Tensor): ``inputs`` as passed to :meth:`attribute`.
            target: As passed to :meth:`attribute`.
            additional_forward_args: As passed to :meth:`attribute`.
            positions: As passed to :meth:`attribute`.
            internal_batch_size: As passed to :meth:`attribute`.
            contrast: As passed to :meth:`attribute` (``f`` is then ``F``).

        Returns:
            Tensor: ``[B]`` or ``[B, P]``, in the units of ``f``.

        Raises:
            ValueError: ``attributions`` of another shape; and as :meth:`attribute`.
        """
        base = DEFAULT_BASELINE if start_point is None else start_point
        check_unchanged(self.spec)
        out, single = self._run(self.spec, end_point, base, target, additional_forward_args, 2,
                                DEFAULT_METHOD, internal_batch_size, positions,
                                contrast=contrast)
        return delta_of(attributions, out, single)
