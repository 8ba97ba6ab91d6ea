"""IGLensOutput: everything one IG-Lens pass computes, before any text-level packaging."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

from torch import Tensor

from captum_iglens.settings import (
    DEFAULT_BASELINE,
    DEFAULT_EFFECT,
    DEFAULT_GRANULARITY,
    DEFAULT_METHOD,
    DEFAULT_N_STEPS,
    DEFAULT_UNITS,
)

__all__ = ["IGLensOutput"]


@dataclass(frozen=True)
class IGLensOutput:
    """Everything one IG-Lens pass computes, for ``B`` inputs, ``P`` positions, ``k`` layers.

    All probabilities are in probability units (not logits), float32 (float64 for a float64
    model), on the readout's device. The readout ``f`` is the target's probability (or
    log-probability, ``units``); for a contrastive target (``contrast`` set) it is
    ``F = f_target - f_foil``, so ``attributions``, ``lens_probs``, ``p_final``,
    ``p_baseline`` and the delta are then values and changes of ``F``.

    Attributes:
        attributions (Tensor): ``[B, P, k]`` IG-Lens credit per chosen layer.
        convergence_delta (Tensor): ``[B, P]`` ``attributions.sum(-1) - delta_p``.
        lens_probs (Tensor): ``[B, P, k]`` logit-lens readout ``f(h_L)`` per chosen layer
            (contrastive: ``p(y) - p(foil)`` there).
        p_final (Tensor): ``[B, P]`` ``f(h_n)``, the model's own probability (Invariant R);
            contrastive: the model's ``p(y) - p(foil)``.
        p_baseline (Tensor): ``[B, P]`` ``f(b)``.
        target (Tensor): ``[B, P]`` int64 target token ids.
        positions (list[int]): the ``P`` explained positions (non-negative).
        layer_indices (tuple[int, ...]): the ``k`` hidden-state indices ``L_1..L_k``.
        baseline (str): What the path started from (``"mean"``, ``"zero"``, ``"embedding"``,
            ``"tensor"`` or ``"reference ids"``).
        model_argmax (Tensor, optional): ``[B, P]`` int64, the model's own top token at each
            explained position (``target == model_argmax`` where the target is greedy).
        units (str): ``"probability"`` or ``"log-probability"`` (nats): the units of
            ``attributions``, ``lens_probs``, ``p_final``, ``p_baseline`` and the delta.
        top_k_probs (Tensor, optional): ``[B, P, k, K]`` the levels' readout's top-K probabilities
            at each chosen layer (``g_L`` under a per-layer lens; ``top_k=K``).
        top_k_ids (Tensor, optional): ``[B, P, k, K]`` their token ids.
        contrast (Tensor, optional): ``[B, P]`` int64 foil token ids of a contrastive target
            (``attribute(..., contrast=...)``); ``None`` when not contrastive.
        granularity (str): ``"block"`` (``layer_indices`` are hidden-state indices) or
            ``"sublayer"`` (they are sub-layer node indices: ``2L - 1`` for ``L.attn``,
            ``2L`` for ``L.mlp`` = ``h_L``, 0 for the embedding; names from
            :func:`~captum_iglens._utils.format.layer_names`).
        head_credits (Tensor, optional): ``[B, P, A, H]`` credit of each head ``H`` in the
            attention segment of each of the ``A`` chosen blocks ``L >= 1`` (``heads=True``).
        head_rest (Tensor, optional): ``[B, P, A]`` what the heads do not hold: the output
            projection's bias, the path before the segment's block (the move from the
            baseline for the first chosen block, skipped blocks between chosen layers), and
            rounding;
            ``head_credits.sum(-1) + head_rest`` is the attention credit.
        effect (str): ``"readout"`` (IG-Lens's readout credits), ``"total"`` (total-effect
            credits of the gated blocks: they add up to ``p_final - p_baseline`` =
            ``F(1) - F(0)``) or ``"atp"`` (attribution patching's first-order estimates:
            ``convergence_delta`` is then their gap to ``delta_p``, not a completeness
            error; they are not a decomposition).
        method (str): The estimator that made the credits (``"atp"`` for attribution
            patching).
        n_steps (int): Its steps per segment (1 for attribution patching).
        lens_change (Tensor, optional): ``[B, P, k]`` with a per-layer readout ``g_L``
            (``IGLens(model, lens=...)``): the lens term of each segment,
            ``g_{L_j}(h_{L_{j-1}}) - g_{L_{j-1}}(h_{L_{j-1}})``; ``attributions`` are then the
            block terms and ``attributions.sum(-1) + lens_change.sum(-1) = p_final -
            p_baseline`` (``p_baseline = g_0(b)``, ``lens_probs`` ``g_L(h_L)``). ``None`` for
            the logit lens (the default), whose lens terms are zero.
        lens (dict, optional): Which per-layer readout made them
            (:func:`~captum_iglens.lens.layer_readout.lens_identity`); None for the logit lens.

    Raises:
        ValueError: on construction, if the shapes do not agree.
    """

    attributions: Tensor
    convergence_delta: Tensor
    lens_probs: Tensor
    p_final: Tensor
    p_baseline: Tensor
    target: Tensor
    positions: list[int]
    layer_indices: tuple[int, ...]
    baseline: str = DEFAULT_BASELINE
    model_argmax: Optional[Tensor] = None
    units: str = DEFAULT_UNITS
    top_k_probs: Optional[Tensor] = None
    top_k_ids: Optional[Tensor] = None
    contrast: Optional[Tensor] = None
    granularity: str = DEFAULT_GRANULARITY
    head_credits: Optional[Tensor] = None
    head_rest: Optional[Tensor] = None
    effect: str = DEFAULT_EFFECT
    method: str = DEFAULT_METHOD
    n_steps: int = DEFAULT_N_STEPS
    lens_change: Optional[Tensor] = None
    lens: Optional[dict[str, Any]] = None

    def __post_init__(self) -> None:
        """Check that every tensor has the shape the others imply."""
        batch, n_pos = self.p_final.shape
        expected = {
            "attributions": (batch, n_pos, len(self.layer_indices)),
            "lens_probs": (batch, n_pos, len(self.layer_indices)),
            "convergence_delta": (batch, n_pos),
            "p_baseline": (batch, n_pos),
            "target": (batch, n_pos),
        }
        if self.contrast is not None:
            expected["contrast"] = (batch, n_pos)
        for name, shape in expected.items():
            got = tuple(getattr(self, name).shape)
            if got != shape:
                raise ValueError(f"IGLensOutput.{name} has shape {got}, expected {shape}.")
        if len(self.positions) != n_pos:
            raise ValueError(f"{len(self.positions)} positions for {n_pos} explained columns.")

    @property
    def is_decomposition(self) -> bool:
        """Whether the credits add up to ``delta_p`` by construction (not for ``"atp"``)."""
        return self.effect != "atp"

    @property
    def delta_meaning(self) -> str:
        """What ``convergence_delta`` is, in words (for tables and JSON)."""
        if self.is_decomposition:
            return "sum of credits - delta_p (completeness error)"
        return ("sum of first-order estimates - delta_p: attribution patching is an estimate, "
                "not a decomposition; this gap is not an error")

    @property
    def delta_p(self) -> Tensor:
        """``[B, P]`` ``p_final - p_baseline``, the total change the credits add up to."""
        return self.p_final - self.p_baseline
