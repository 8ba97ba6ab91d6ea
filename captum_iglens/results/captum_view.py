"""IG-Lens results as Captum's ``LLMAttributionResult``, with what completeness needs.

The first segment of an IG-Lens path runs from the baseline ``b`` to ``h_{L_1}``; its
credit ``f(h_{L_1}) - f(b)`` holds ``-f(b)``, which with reference ids is ``-p(y | x')``,
the reference's own probability of the token. In a bar or heatmap of per-layer credits that
term makes the first layer look decisive. Here it is kept out of the layer columns:
``baseline_attr = -f(b)`` stands apart and the first column holds the rest of that
segment's credit (``f(h_{L_1})`` for the exact estimator), so each row still adds up:
``baseline_attr + token_attr.sum(-1) = delta_p`` (Proposition 1 of arXiv:2606.29693).
"""

from __future__ import annotations

from typing import Any, Optional, Union

import torch
from captum.attr import LLMAttributionResult
from torch import Tensor

from captum_iglens._utils.display import (
    DISPLAYS,
    START_GREY,
    row_normalised,
    spanned_labels,
    start_apart,
)
from captum_iglens.settings import DEFAULT_UNITS

__all__ = ["IGLensLLMAttributionResult", "split_baseline_readout"]


def split_baseline_readout(attributions: Tensor, p_baseline: Tensor) -> tuple[Tensor, Tensor]:
    """``(token_attr, baseline_attr)``: the first credit without ``-f(b)``, and ``-f(b)``.

    Args:
        attributions (Tensor): ``[T, k]`` IG-Lens credits.
        p_baseline (Tensor): ``[T]`` the readout at each path's start, ``f(b)``.

    Returns:
        ``token_attr`` ``[T, k]`` (column 0 is ``credit_0 + f(b)``, summed in float64 and
        rounded once to the credits' dtype) and ``baseline_attr = -f(b)`` ``[T]``.
    """
    token_attr = attributions.clone()
    first = attributions[:, 0].double() + p_baseline.double()
    token_attr[:, 0] = first.to(attributions.dtype)
    return token_attr, -p_baseline.to(attributions.dtype)


class IGLensLLMAttributionResult(LLMAttributionResult):
    """Captum's ``LLMAttributionResult`` with layer names as input tokens, plus completeness.

    ``input_tokens`` are layer names (``"emb"``, ``"L1"``, ...), ``output_tokens`` the
    explained tokens, ``token_attr`` the ``[T, k]`` IG-Lens credit per layer with the
    baseline's readout set apart (see the module docstring), ``seq_attr`` its ``[k]`` sum
    over tokens, ``output_probs`` the model's probability of each token; Captum's
    ``plot_token_attr()`` / ``plot_seq_attr()`` draw them, with axis labels and units, and
    ``display="row"`` scales each token's row to its own largest credit. A sub-layer
    attention column that also spans skipped blocks is drawn with them in its label
    (``"L1-24+L25.attn"``; ``input_tokens`` keep the node names).

    Attributes:
        p_baseline (Tensor): ``[T]`` the readout at each path's start ``f(b)``.
        baseline_attr (Tensor): ``[T]`` ``-f(b)``: the baseline's readout, kept out of the
            layer columns (with reference ids ``-p(y | x')``).
        convergence_delta (Tensor): ``[T]`` ``baseline_attr + token_attr.sum(-1) -
            (output_probs - p_baseline)``: each row's completeness error.
        baseline (str): What the paths started from (``"reference ids"``, ``"mean"``, ...).
        units (str): ``"probability"`` or ``"log-probability"`` (nats).
    """

    def __init__(
        self,
        *,
        p_baseline: Tensor,
        convergence_delta: Tensor,
        baseline: str,
        baseline_attr: Optional[Tensor] = None,
        units: str = DEFAULT_UNITS,
        **captum_fields: Any,
    ) -> None:
        """Captum's fields (keyword-only, as Captum takes them) plus the ones above.

        ``baseline_attr`` defaults to ``-p_baseline``; ``token_attr`` must then already
        exclude it (:func:`split_baseline_readout`).
        """
        super().__init__(**captum_fields)
        self.p_baseline = p_baseline
        self.baseline_attr = -p_baseline if baseline_attr is None else baseline_attr
        self.convergence_delta = convergence_delta
        self.baseline = baseline
        self.units = units

    @classmethod
    def from_result(cls, result: Any) -> IGLensLLMAttributionResult:
        """The view of an :class:`~captum_iglens.results.IGLensResult` (``explain``).

        Layer names as input tokens, answer tokens as output tokens, the credits with the
        baseline's readout set apart, the result's ``p_final``, delta and units.
        """
        p_baseline = result.p_baseline.detach().float().cpu()
        token_attr, baseline_attr = split_baseline_readout(
            result.attributions.detach().float().cpu(), p_baseline)
        return cls(input_tokens=list(result.layer_names), output_tokens=list(result.tokens),
                   seq_attr=token_attr.sum(0), token_attr=token_attr,
                   output_probs=result.p_final.detach().float().cpu(), p_baseline=p_baseline,
                   baseline_attr=baseline_attr, baseline=result.baseline, units=result.units,
                   convergence_delta=result.convergence_delta.detach().float().cpu())

    @property
    def delta_p(self) -> Optional[Tensor]:
        """``[T]`` ``output_probs - p_baseline``: ``baseline_attr`` + each row adds up to it."""
        return None if self.output_probs is None else self.output_probs - self.p_baseline

    def _apart(self) -> bool:
        """Whether the first column is drawn as the start (log units; module docstring)."""
        k = 0 if self.token_attr is None else self.token_attr.shape[-1]
        return start_apart(self.units, "credit", k)

    def _view(self, display: str) -> LLMAttributionResult:
        """A plain Captum result holding what is drawn (credits, or rows scaled to 1).

        In log units the start column is drawn as zeros (it is filled in afterwards, off
        the colour scale), so that Captum's scale and a row's largest value are the rises'.
        """
        if display not in ("credit", "row"):
            raise ValueError(f"display={display!r}: use 'credit' or 'row' (of {DISPLAYS}).")
        attr, seq = self.token_attr, self.seq_attr
        if attr is not None and self._apart():
            attr = attr.clone()
            attr[:, 0] = 0.0
            seq = attr.sum(0)
        if display == "row" and attr is not None:
            attr = row_normalised(attr)
            seq = attr.sum(0)
        return LLMAttributionResult(input_tokens=spanned_labels(self.input_tokens),
                                    output_tokens=list(self.output_tokens), seq_attr=seq,
                                    token_attr=attr, output_probs=self.output_probs)

    def _unit_words(self, display: str) -> str:
        if display == "row":
            return "credit / the row's largest |credit|"
        return "nats" if self.units == "log-probability" else "probability"

    def _start_words(self) -> str:
        first = spanned_labels(self.input_tokens)[0]
        return f"first: the start, log p at {first}, grey, off the colour scale"

    def plot_token_attr(self, show: bool = False, display: str = "credit"
                        ) -> Union[None, tuple[Any, Any]]:
        """Captum's token x layer heatmap, labelled: layers, answer tokens, units.

        In log-probability units the first column holds the logit lens's log-probability at
        the first chosen layer, a level (down to ``-52.6`` nats a cell at SmolLM2's L1), not a
        layer's rise: it is drawn as the start, grey and off the colour scale, its value
        written in its cells; the colours (and ``display="row"``'s scale) are the rises'.

        Args:
            show (bool, optional): Show with pyplot and return None. Default: False.
            display (str, optional): ``"credit"`` (default, Captum's shared colour scale)
                or ``"row"``: each row divided by its own largest ``|credit|``, so that a
                token of low probability keeps visible cells.

        Returns:
            ``(Figure, Axes)`` unless ``show``.

        Raises:
            ValueError: an unknown ``display``.
        """
        fig, ax = LLMAttributionResult.plot_token_attr(self._view(display), show=False)
        words = "the baseline's readout -f(b) is kept out; see baseline_attr"
        if self._apart():
            words = f"{self._start_words()}; -f(b): baseline_attr"
            _draw_start_column(ax, self.token_attr[:, 0])
        ax.set_xlabel(f"layer ({words})")
        ax.xaxis.set_label_position("top")
        ax.set_ylabel("answer token")
        colour_bar = next(a for a in fig.axes if a is not ax)
        colour_bar.set_ylabel(f"IG-Lens credit ({self._unit_words(display)})", rotation=-90,
                              va="bottom")
        return _shown(fig, ax, show)

    def plot_seq_attr(self, show: bool = False, display: str = "credit"
                      ) -> Union[None, tuple[Any, Any]]:
        """Captum's per-layer bars (credit summed over answer tokens), labelled.

        In log-probability units the first bar would be the sum of the lens's
        log-probabilities at the first chosen layer (``-163.2`` nats on SmolLM2 at L1 for
        "My favourite fruits are" -> " apples, pears, and bananas."; the largest rise is
        ``+43``), a level, not a rise: it is not drawn, its value is written in its place
        ("start"), and the axis is scaled to the rises.

        Args:
            show (bool, optional): Show with pyplot and return None. Default: False.
            display (str, optional): ``"credit"`` (default) or ``"row"`` (rows scaled to
                their largest ``|credit|`` before summing).

        Returns:
            ``(Figure, Axes)`` unless ``show``.
        """
        fig, ax = LLMAttributionResult.plot_seq_attr(self._view(display), show=False)
        ax.set_xlabel("layer")
        if self._apart():
            start = float(self.token_attr[:, 0].double().sum())
            ax.text(0, 0, f"start\n{start:.1f}\n(not drawn)", ha="center", va="bottom",
                    fontsize=8, color="0.3")
            first = spanned_labels(self.input_tokens)[0]
            ax.set_xlabel(f"layer (first: the start, the sum of log p at {first}, not drawn)")
        ax.xaxis.set_label_position("top")
        ax.set_ylabel(f"IG-Lens credit, summed over answer tokens ({self._unit_words(display)})")
        return _shown(fig, ax, show)

    def to_visualization_records(self, normalize: bool = True) -> list[Any]:
        """One ``captum.attr.visualization.VisualizationDataRecord`` per answer token.

        Each record's score is the token's ``delta_p`` (``baseline_attr`` plus its row), not
        the row alone (that is ``output_probs``, shown already as the record's probability).
        See :func:`~captum_iglens._utils.display.visualization_records`; feed them to
        ``captum.attr.visualization.visualize_text``.
        """
        from captum_iglens._utils.display import visualization_records

        attr = self.token_attr if self.token_attr is not None else torch.zeros(0, 0)
        return visualization_records(
            attr, list(self.input_tokens), list(self.output_tokens), self.output_probs,
            self.convergence_delta, normalize, baseline_attr=self.baseline_attr)


def _draw_start_column(ax: Any, start: Tensor) -> None:
    """Column 0 of Captum's heatmap as the start: grey (masked), its values written."""
    import numpy as np

    image = ax.images[0]
    data = np.ma.masked_array(np.asarray(image.get_array()), mask=False)
    data.mask = np.zeros(data.shape, dtype=bool)
    data.mask[:, 0] = True
    image.set_data(data)
    image.set_cmap(image.get_cmap().with_extremes(bad=START_GREY))
    for text in ax.texts:  # Captum wrote "0.0000" in the zeroed cells
        x, y = text.get_position()
        if x == 0:
            text.set_text(f"{float(start[int(y)]):.4f}")  # as Captum writes a cell
            text.set_color("black")


def _shown(fig: Any, ax: Any, show: bool) -> Union[None, tuple[Any, Any]]:
    if show:
        import matplotlib.pyplot as plt

        plt.show()
        return None
    return fig, ax
