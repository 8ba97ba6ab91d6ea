"""IG-Lens results as Captum's ``LLMAttributionResult``, with what completeness needs."""

from __future__ import annotations

from typing import Any, Optional

from captum.attr import LLMAttributionResult
from torch import Tensor

__all__ = ["IGLensLLMAttributionResult"]


class IGLensLLMAttributionResult(LLMAttributionResult):
    """Captum's ``LLMAttributionResult`` with layer names as input tokens, plus completeness.

    ``input_tokens`` are layer names (``"emb"``, ``"L1"``, ...), ``output_tokens`` the
    explained tokens, ``token_attr`` the ``[T, k]`` IG-Lens credit (probability units),
    ``seq_attr`` its ``[k]`` sum over tokens, ``output_probs`` the model's probability of each
    token; Captum's ``plot_token_attr()`` / ``plot_seq_attr()`` draw them. Added:

    Attributes:
        p_baseline (Tensor): ``[T]`` the readout at each path's start ``f(b)``.
        convergence_delta (Tensor): ``[T]`` ``token_attr.sum(-1) - (output_probs -
            p_baseline)``: each row's completeness error.
        baseline (str): What the paths started from (``"reference ids"``, ``"mean"``, ...).
    """

    def __init__(
        self,
        *,
        p_baseline: Tensor,
        convergence_delta: Tensor,
        baseline: str,
        **captum_fields: Any,
    ) -> None:
        """Captum's fields (keyword-only, as Captum takes them) plus the three above."""
        super().__init__(**captum_fields)
        self.p_baseline = p_baseline
        self.convergence_delta = convergence_delta
        self.baseline = baseline

    @property
    def delta_p(self) -> Optional[Tensor]:
        """``[T]`` ``output_probs - p_baseline``: what each row of ``token_attr`` adds up to."""
        return None if self.output_probs is None else self.output_probs - self.p_baseline
