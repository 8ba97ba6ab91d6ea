"""What the plots and the text table read of a result: the result objects' shapes, as protocols.

``results`` draws itself through ``plot`` (``IGLensResult.plot()``) and prints itself through
``results.table``, so ``plot``, ``results.table`` and the display helpers must not import the
result classes: they name the parts they read here, below them all.
:class:`~captum_iglens.results.IGLensResult`, :class:`~captum_iglens.results.CompletenessReport`
and :class:`~captum_iglens.results.MethodCompleteness` satisfy these protocols (the type
checker verifies it where a result is passed to a plot or the table).
"""

from __future__ import annotations

from typing import Any, Mapping, Optional, Protocol

from torch import Tensor

__all__ = ["MethodView", "ReportView", "ResultView"]


class ResultView(Protocol):
    """What a credit plot reads of an :class:`~captum_iglens.results.IGLensResult`."""

    @property
    def prompt(self) -> str: ...  # noqa: D102
    @property
    def answer(self) -> str: ...  # noqa: D102
    @property
    def tokens(self) -> list[str]: ...  # noqa: D102
    @property
    def token_ids(self) -> list[int]: ...  # noqa: D102
    @property
    def layer_indices(self) -> list[int]: ...  # noqa: D102
    @property
    def layer_names(self) -> list[str]: ...  # noqa: D102
    @property
    def granularity(self) -> str: ...  # noqa: D102
    @property
    def units(self) -> str: ...  # noqa: D102
    @property
    def attributions(self) -> Tensor: ...  # noqa: D102
    @property
    def lens_probs(self) -> Tensor: ...  # noqa: D102
    @property
    def p_baseline(self) -> Tensor: ...  # noqa: D102
    @property
    def p_final(self) -> Tensor: ...  # noqa: D102
    @property
    def delta_p(self) -> Tensor: ...  # noqa: D102
    @property
    def onset_layers(self) -> list[Optional[int]]: ...  # noqa: D102
    @property
    def onset_frac(self) -> float: ...  # noqa: D102
    @property
    def onset_rule(self) -> str: ...  # noqa: D102
    @property
    def method(self) -> str: ...  # noqa: D102
    @property
    def baseline(self) -> str: ...  # noqa: D102
    @property
    def effect(self) -> str: ...  # noqa: D102
    @property
    def baseline_description(self) -> str: ...  # noqa: D102
    @property
    def is_argmax(self) -> list[bool]: ...  # noqa: D102
    @property
    def truncated(self) -> bool: ...  # noqa: D102
    @property
    def max_new_tokens(self) -> Optional[int]: ...  # noqa: D102
    @property
    def contrastive(self) -> bool: ...  # noqa: D102
    @property
    def contrast_ids(self) -> Optional[list[int]]: ...  # noqa: D102
    @property
    def contrast_tokens(self) -> Optional[list[str]]: ...  # noqa: D102
    @property
    def top_k_ids(self) -> Optional[Tensor]: ...  # noqa: D102
    @property
    def top_k_probs(self) -> Optional[Tensor]: ...  # noqa: D102
    @property
    def top_k_tokens(self) -> Optional[list]: ...  # noqa: D102

    @property
    def completeness_error(self) -> float: ...  # noqa: D102

    def to_captum(self) -> Any:
        """The result as Captum's ``LLMAttributionResult``."""


class MethodView(Protocol):
    """What the completeness plot reads of one method's row (``MethodCompleteness``)."""

    @property
    def name(self) -> str: ...  # noqa: D102
    @property
    def label(self) -> str: ...  # noqa: D102
    @property
    def per_layer(self) -> Tensor: ...  # noqa: D102
    @property
    def is_credit(self) -> bool: ...  # noqa: D102
    @property
    def total(self) -> float: ...  # noqa: D102
    @property
    def layer_sum(self) -> float: ...  # noqa: D102


class ReportView(Protocol):
    """What the completeness plot reads of a ``CompletenessReport``."""

    @property
    def layer_indices(self) -> list[int]: ...  # noqa: D102
    @property
    def layer_names(self) -> list[str]: ...  # noqa: D102
    @property
    def target_id(self) -> int: ...  # noqa: D102
    @property
    def target_token(self) -> str: ...  # noqa: D102
    @property
    def f_input(self) -> float: ...  # noqa: D102
    @property
    def f_baseline(self) -> float: ...  # noqa: D102
    @property
    def shared_reference(self) -> bool: ...  # noqa: D102
    @property
    def methods(self) -> Mapping[str, MethodView]: ...  # noqa: D102
