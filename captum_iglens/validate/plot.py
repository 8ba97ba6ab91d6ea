"""The figure of a causal validation: per-token correlations and mean profiles per block."""

from __future__ import annotations

from typing import Any, Optional

import numpy as np

from captum_iglens.validate.stats import PREDICTORS

__all__ = ["plot_validation"]


def _finite(values: np.ndarray) -> np.ndarray:
    return values[np.isfinite(values)]


#: Median lines of the box plots: black on every box face (matplotlib's default median
#: colour is C1, the face colour of the second view).
MEDIAN_COLOUR = "black"


def _boxes(ax: Any, metrics: dict, views: list[str]) -> None:
    """Per-token Spearman rho of every predictor, one box colour per view.

    Medians are black lines on every face; the legend sits above the axes, off the whiskers.
    """
    width = 0.8 / max(len(views), 1)
    for j, view in enumerate(views):
        data = [_finite(metrics[view][p]["spearman"]) for p in PREDICTORS]
        where = np.arange(len(PREDICTORS)) + (j - (len(views) - 1) / 2) * width
        box = ax.boxplot(data, positions=where, widths=width * 0.9, patch_artist=True,
                         showfliers=False,
                         medianprops={"color": MEDIAN_COLOUR, "linewidth": 1.5})
        for patch in box["boxes"]:
            patch.set_facecolor(f"C{j}")
        ax.plot([], [], color=f"C{j}", lw=6, label=view)
    ax.axhline(0, color="0.5", lw=0.8)
    ax.set_xticks(range(len(PREDICTORS)), PREDICTORS, rotation=30, ha="right")
    ax.set_ylabel("Spearman rho(predictor, drop) per token")
    ax.legend(loc="lower left", bbox_to_anchor=(0.0, 1.01), borderaxespad=0.0, fontsize=7,
              ncol=min(len(views), 3), title="black line: median", title_fontsize=7)


def plot_validation(result: Any, path: Optional[str] = None) -> Any:
    """Draw :class:`~captum_iglens.validate.report.ValidationResult`'s figure.

    Left: per-token Spearman rho of every predictor, one box per view (ablation views, or
    patching views without ablation). Middle: mean IG-Lens credit, direct effect and drop
    of each ablation kind per block. Right (with patching): mean contrastive credit and
    mean recovery per block. Probability units.

    Args:
        result (ValidationResult): The validation.
        path (str, optional): Save the figure there (PNG, PDF, SVG, ...).

    Returns:
        matplotlib ``Figure`` (built without pyplot's global state).
    """
    from matplotlib.figure import Figure

    part = result.analysis if result.analysis is not None else result.patching
    panels = 1 + (result.analysis is not None) + (result.patching is not None)
    fig = Figure(figsize=(6 * panels, 5), layout="constrained")
    axes = list(np.atleast_1d(fig.subplots(1, panels)))
    _boxes(axes[0], part["metrics"], list(part["views"]))
    layers = result.layer_indices
    if result.analysis is not None:
        ax = axes[1]
        ax.plot(layers, result.credits.mean(0), "k-o", ms=3, label="IG-Lens credit")
        ax.plot(layers, result.direct.mean(0), "k--", label="direct effect")
        for j, (kind, drops) in enumerate(result.drops.items()):
            ax.plot(layers, drops.mean(0), color=f"C{j}", label=f"{kind} drop")
        ax.set_xlabel("decoder block")
        ax.set_ylabel("mean over tokens (probability)")
        ax.legend(fontsize=8)
    if result.patching is not None:
        ax, patch = axes[-1], result.patching
        ax.plot(layers, patch["credits"].mean(0), "k-o", ms=3, label="contrastive credit")
        for j, (kind, drops) in enumerate(patch["drops"].items()):
            ax.plot(layers, drops.mean(0), color=f"C{j + 4}", label=kind)
        ax.set_xlabel("decoder block")
        ax.set_ylabel("mean over pairs (F = p(y) - p(foil))")
        ax.legend(fontsize=8)
    fig.suptitle(f"IG-Lens credit vs causal interventions ({result.settings.get('model')})")
    if path is not None:
        fig.savefig(path, dpi=120)
    return fig
