"""The figure of a :class:`~captum_iglens.results.CompletenessReport` (``iglens compare``).

Built on ``matplotlib.figure.Figure`` directly (no pyplot global state), like
:mod:`captum_iglens.plot.credits`, which re-exports :func:`plot_completeness`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Optional, Sequence

import numpy as np

from captum_iglens._utils.views import MethodView, ReportView

if TYPE_CHECKING:  # pragma: no cover
    from matplotlib.figure import Figure


__all__ = ["plot_completeness"]

_COLOURS = ["#d62728", "#1f77b4", "#2ca02c", "#9467bd", "#8c564b"]
_LEVEL_COLOUR = "#555555"


def plot_completeness(
    report: ReportView, ax: Any = None, title: Optional[str] = None
) -> Figure:
    """Grouped bars of per-layer credit, one bar per credit method, and their totals.

    With one reference ``x'`` for every method (``report.shared_reference``, the default
    of :func:`~captum_iglens.compare_completeness`) all of them decompose the same total,
    ``F(x) - F(x')``: it is drawn once, a black dashed line labelled as every method's total.
    Otherwise (IG-Lens with a baseline of its own) the Captum methods' ``F(x) - F(x')`` and
    IG-Lens's own ``Δp = f(h_n) - f(b)`` are drawn once each. The logit-lens levels
    (the target's probability read out at each layer: levels, not credits) get a panel of
    their own under the bars, sharing the layer axis, with their own probability axis; when
    ``ax`` is given they are drawn on ``ax`` itself (the same probability axis as the
    credits), a grey line with markers. Values are in probability units.

    Args:
        report (CompletenessReport): What :func:`~captum_iglens.compare_completeness`
            returned.
        ax (matplotlib.axes.Axes, optional): Draw into this axes. Default: a new figure.
        title (str, optional): Title of the credit panel. Default: the target and what
            the lines are.

    Returns:
        matplotlib.figure.Figure (the figure of ``ax`` when one is given).
    """
    methods = [m for m in report.methods.values() if m.is_credit]
    levels = [m for m in report.methods.values() if not m.is_credit]
    fig, ax, ax_level = _axes(report, ax, bool(levels), len(methods))
    x = np.arange(len(report.layer_indices))
    _bars(ax, methods, x)
    _totals(ax, report, methods)
    ax.set_ylabel("credit (probability)")
    if ax_level is not None:
        _levels(ax_level, levels, x, same_axis=ax_level is ax)
    bottom = ax_level if ax_level is not None else ax
    bottom.set_xticks(x, labels=report.layer_names)
    bottom.set_xlabel("layer")
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    shared = ("per-layer credit and F(x) - F(x'), the total every method decomposes"
              if report.shared_reference else "per-layer credit vs each method's own total")
    ax.set_title(title or (f"Completeness on target {report.target_token!r} "
                           f"(id {report.target_id}):\n{shared}"), fontsize=9)
    return fig


def _axes(report: ReportView, ax: Any, with_levels: bool,
          n_methods: int) -> tuple[Figure, Any, Any]:
    """The figure, the credit axes and the level axes (``None`` without levels)."""
    if ax is not None:
        return ax.figure, ax, ax if with_levels else None
    from matplotlib.figure import Figure

    k = len(report.layer_indices)
    width = max(9.0, 0.6 * k * max(n_methods, 1) + 5.0)
    fig = Figure(figsize=(width, 6.2 if with_levels else 4.5), layout="constrained")
    if not with_levels:
        return fig, fig.add_subplot(1, 1, 1), None
    top, bottom = fig.subplots(2, 1, sharex=True, gridspec_kw={"height_ratios": [3, 1.3]})
    return fig, top, bottom


def _bars(ax: Any, methods: Sequence[MethodView], x: np.ndarray) -> None:
    """One bar per method and layer, grouped by layer, and the zero line."""
    width = 0.8 / max(len(methods), 1)
    for i, m in enumerate(methods):
        values = m.per_layer.detach().double().cpu().numpy()
        ax.bar(x - 0.4 + width * (i + 0.5), values, width, color=_COLOURS[i % len(_COLOURS)],
               label=f"{m.label} (sum {m.layer_sum:+.4f})")
    ax.axhline(0.0, color="black", linewidth=0.6)


def _totals(ax: Any, report: ReportView,
            methods: Sequence[MethodView]) -> None:
    """Each distinct total once, dashed: ``F(x) - F(x')`` and, apart, IG-Lens's own ``Δp``.

    With one shared reference every method decomposes ``F(x) - F(x')`` (one black line).
    Otherwise the Captum methods still share it, and the IG-Lens estimators share their own
    ``Δp = f(h_n) - f(b)`` (one line in the colour of the first of them).
    """
    own = [] if report.shared_reference else [
        m for m in methods if m.name.startswith("ig_lens")]
    shared = [m for m in methods if m not in own]
    if shared:
        total = report.f_input - report.f_baseline
        whose = ("every method's" if not own
                 else "the total of " + ", ".join(m.label for m in shared))
        ax.axhline(total, color="black", linestyle="--", linewidth=1.2,
                   label=f"total F(x) - F(x') = {total:+.4f}, {whose}")
    if own:
        colour = _COLOURS[methods.index(own[0]) % len(_COLOURS)]
        ax.axhline(own[0].total, color=colour, linestyle="--", linewidth=1.2,
                   label=f"total Δp = f(h_n) - f(b) = {own[0].total:+.4f}, the total of "
                         + ", ".join(m.label for m in own))


def _levels(ax: Any, levels: Sequence[MethodView], x: np.ndarray,
            same_axis: bool) -> None:
    """The logit-lens levels: on their own probability axis, or on the credit axis."""
    for m in levels:
        ax.plot(x, m.per_layer.detach().double().cpu().numpy(), color=_LEVEL_COLOUR,
                marker="o", linewidth=1.0,
                label=f"{m.label}: logit-lens p at the layer (a level, not a credit)")
    if same_axis:
        ax.set_ylabel("credit; logit-lens level p (probability)")
        return
    ax.set_ylabel("logit-lens p\n(level, probability)")
    ax.set_ylim(-0.02, 1.02)
    ax.axhline(0.0, color="black", linewidth=0.6)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
