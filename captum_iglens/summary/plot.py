"""The figure of ``iglens summarize``: per-layer mean credit with its CI, and the onsets.

Built on ``matplotlib.figure.Figure`` directly (no pyplot global state), so it works under
the Agg backend, headless, like :mod:`captum_iglens.plot.credits`.
"""

from __future__ import annotations

import base64
import io
from typing import TYPE_CHECKING, Any, Optional

import numpy as np

from captum_iglens.summary.report import ATP_ONSET_NOTE

if TYPE_CHECKING:  # pragma: no cover
    from matplotlib.figure import Figure

    from captum_iglens.summary.pool import RunSummary

__all__ = ["figure_png_base64", "plot_summary"]


def plot_summary(summary: RunSummary, path: Optional[str] = None) -> Figure:
    """Per-layer mean credit with its CI band (left) and the onset-layer histogram (right).

    The credit is named by the run's effect (:attr:`~captum_iglens.summary.pool.RunSummary.
    credit_name`: readout credit, total effect, or AtP estimate (not additive)) in the
    legend, the axis label and the title; a per-layer readout's mean lens terms
    (``mean_lens_change``) are grey hatched bars of their own, with a legend entry. Left: the
    ``[k]`` mean credits over all tokens
    against the layers, a shaded band from
    ``ci_low`` to ``ci_high`` (absent with fewer than 2 records), and 0 marked. Right: the
    number of tokens whose onset is each layer (for AtP records a note instead: their
    first-order estimates do not add up, so no onset is pooled).

    Args:
        summary (RunSummary): What :func:`~captum_iglens.summary.pool.summarize` returned.
        path (str, optional): Also save the figure here (PNG, PDF, SVG, ...; 120 dpi).
            Default: None.

    Returns:
        matplotlib.figure.Figure

    Raises:
        ValueError: a summary without explained records (nothing to draw).
        OSError: ``path`` cannot be written.
    """
    from matplotlib.figure import Figure

    if not summary.layers:
        raise ValueError("no record was explained: there is no per-layer credit to plot")
    k = len(summary.layers)
    fig = Figure(figsize=(min(24.0, max(9.0, 0.45 * k + 5.0)), 4.2), layout="constrained")
    ax_mean, ax_onset = fig.subplots(1, 2, gridspec_kw={"width_ratios": [3, 2]})
    x = np.arange(k)
    _mean_panel(ax_mean, summary, x)
    if summary.effect == "atp":  # first-order estimates: their onsets mean nothing
        ax_onset.text(0.5, 0.5, ATP_ONSET_NOTE.replace(": ", ":\n", 1), ha="center",
                      va="center", fontsize=8, wrap=True, transform=ax_onset.transAxes)
        ax_onset.set_title("onset layer: n/a for AtP", fontsize=9)
    else:
        ax_onset.bar(x, summary.onset_counts, color="#4c72b0")
        ax_onset.set_ylabel("tokens")
        ax_onset.yaxis.get_major_locator().set_params(integer=True)
        ax_onset.set_title(f"onset layer ({_rule(summary)}), {summary.n_tokens} tokens",
                           fontsize=9)
    for ax in (ax_mean, ax_onset):
        ax.set_xticks(x, labels=summary.layer_names, rotation=90 if k > 12 else 0, fontsize=7)
        ax.set_xlabel("layer")
    fig.suptitle(f"IG-Lens run ({summary.credit_name}): {summary.n_ok} records explained, "
                 f"{summary.n_failed} failed", x=0.01, ha="left", fontsize=9)
    if path is not None:
        fig.savefig(path, dpi=120)
    return fig


def _mean_panel(ax: Any, summary: RunSummary, x: np.ndarray) -> None:
    """The mean credit line, its CI band and the zero line."""
    mean = np.asarray(summary.mean_credit, dtype=np.float64)
    low = np.asarray(summary.ci_low, dtype=np.float64)
    high = np.asarray(summary.ci_high, dtype=np.float64)
    ax.axhline(0.0, color="grey", linewidth=0.8)
    if np.isfinite(low).all() and np.isfinite(high).all():
        ax.fill_between(x, low, high, color="#dd8452", alpha=0.3, linewidth=0,
                        label=f"{100 * summary.confidence:g}% CI (records resampled)")
    name = summary.credit_name
    lens = getattr(summary, "mean_lens_change", None)
    if lens is not None:  # a per-layer readout: its lens terms apart, grey and hatched
        ax.bar(x, np.asarray(lens, dtype=np.float64), width=0.6, color="#d0d0d0",
               edgecolor="#707070", hatch="///", linewidth=0.6,
               label="mean lens term g_L(h_(L-1)) - g_(L-1)(h_(L-1)) (not a credit)")
    ax.plot(x, mean, marker="o", color="#c44e52", linewidth=1.4, label=f"mean {name}")
    ax.set_ylabel(summary.credit_words)
    ax.set_title(f"mean {name} per layer over {summary.n_tokens} tokens", fontsize=9)
    ax.legend(fontsize=7, loc="best")


def _rule(summary: RunSummary) -> str:
    rules = summary.settings.get("onset_rule") or ["?"]
    return "rules " + ", ".join(map(str, rules)) if len(rules) > 1 else f"{rules[0]} rule"


def figure_png_base64(fig: Figure, dpi: int = 100, colours: Optional[int] = 256) -> str:
    """``fig`` as a base64 PNG, for a ``data:image/png;base64,`` URL.

    With ``colours`` the PNG is a palette image of at most that many colours (median cut,
    no dithering): about a third of the bytes of the full-colour PNG of a heatmap, with
    no visible loss.

    Args:
        fig (Figure): A matplotlib figure.
        dpi (int, optional): Resolution. Default: 100.
        colours (int, optional): Palette size (2 to 256); ``None`` keeps full colour.
            Default: 256.

    Returns:
        str: ASCII base64 of the PNG bytes.
    """
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=dpi)
    if colours is not None:
        from PIL import Image

        image = Image.open(io.BytesIO(buffer.getvalue())).convert("RGB")
        palette = image.quantize(colors=colours, method=Image.Quantize.MEDIANCUT,
                                 dither=Image.Dither.NONE)
        buffer = io.BytesIO()
        palette.save(buffer, format="png", optimize=True)
    return base64.b64encode(buffer.getvalue()).decode("ascii")
