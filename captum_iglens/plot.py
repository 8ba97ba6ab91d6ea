"""Figures and Captum visualization interop for IG-Lens results.

Everything here builds ``matplotlib.figure.Figure`` objects directly (no pyplot global
state), so it works under the Agg backend, in notebooks and in scripts alike.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Optional

import numpy as np

if TYPE_CHECKING:  # pragma: no cover
    from captum.attr import LLMAttributionResult
    from matplotlib.figure import Figure

    from captum_iglens.results import CompletenessReport, IGLensResult

__all__ = ["plot_result", "plot_completeness", "result_to_captum"]


def _new_figure(figsize: tuple[float, float]) -> Figure:
    from matplotlib.figure import Figure

    return Figure(figsize=figsize, layout="constrained")


def result_to_captum(result: IGLensResult) -> LLMAttributionResult:
    """An :class:`~captum.attr.LLMAttributionResult` view of an IG-Lens result.

    The layer names (``"emb"``, ``"L1"``, ...) stand in the place of Captum's input tokens and
    the answer tokens are the output tokens: ``token_attr`` is the ``[T, k]`` IG-Lens credit
    (probability units), ``seq_attr`` the ``[k]`` per-layer credit summed over the answer
    tokens, ``output_probs`` the model's probability of each answer token. Captum's
    ``plot_token_attr()`` then draws the token x layer heatmap, ``plot_seq_attr()`` the
    per-layer totals.
    """
    from captum.attr import LLMAttributionResult

    token_attr = result.attributions.detach().float().cpu()
    return LLMAttributionResult(
        input_tokens=list(result.layer_names),
        output_tokens=list(result.tokens),
        seq_attr=token_attr.sum(0),
        token_attr=token_attr,
        output_probs=result.p_final.detach().float().cpu(),
    )


def plot_result(
    result: IGLensResult, max_legend: int = 12, figsize: Optional[tuple[float, float]] = None
) -> Figure:
    """Token x layer heatmap of IG-Lens credit and the logit-lens trajectory per token.

    Left: the ``[T, k]`` credits (probability units) with a diverging colour map centred at 0
    (symmetric limits), the onset layer of each token marked with a black square. Right: the
    logit-lens probability ``f(h_L)`` of each answer token over the chosen layers.

    Args:
        result (IGLensResult): What :func:`~captum_iglens.explain` returned.
        max_legend (int, optional): Tokens named in the trajectory legend. Default: 12.
        figsize (tuple, optional): Figure size in inches. Default: from the table size.

    Returns:
        matplotlib.figure.Figure
    """
    from matplotlib.colors import Normalize

    attr = result.attributions.detach().float().cpu().numpy()
    probs = result.lens_probs.detach().float().cpu().numpy()
    n_tok, k = attr.shape if attr.ndim == 2 else (0, len(result.layer_indices))
    names = result.layer_names
    if figsize is None:
        figsize = (max(10.0, 0.35 * k + 7.0), max(3.5, 0.32 * n_tok + 1.8))
    fig = _new_figure(figsize)
    ax_map, ax_traj = fig.subplots(1, 2, gridspec_kw={"width_ratios": [max(k, 4), max(6, k // 2)]})
    fig.get_layout_engine().set(wspace=0.1)  # room between the colour bar and the right panel
    limit = float(np.abs(attr).max()) if attr.size else 0.0
    limit = limit if limit > 0 else 1e-12
    image = ax_map.imshow(
        attr if attr.size else np.zeros((1, k)), cmap="RdBu_r",
        norm=Normalize(vmin=-limit, vmax=limit), aspect="auto", interpolation="nearest",
    )
    fig.colorbar(image, ax=ax_map, label="IG-Lens credit (probability)")
    ax_map.set_xticks(range(k), labels=names, rotation=90, fontsize=7)
    ax_map.set_yticks(range(n_tok), labels=[repr(t) for t in result.tokens], fontsize=8)
    ax_map.set_xlabel("layer")
    ax_map.set_title("IG-Lens credit per token and layer (□ = onset)")
    for t, onset in enumerate(result.onset_layers):
        if onset in result.layer_indices:
            j = result.layer_indices.index(onset)
            ax_map.scatter([j], [t], marker="s", s=60, facecolors="none", edgecolors="black",
                           linewidths=1.5)
    x = np.asarray(result.layer_indices)
    for t in range(n_tok):
        label = repr(result.tokens[t]) if t < max_legend else None
        ax_traj.plot(x, probs[t], marker=".", linewidth=1.2, label=label)
    ax_traj.set_xlabel("hidden-state index (layer)")
    ax_traj.set_ylabel("logit-lens probability f(h_L)")
    ax_traj.set_ylim(-0.02, 1.02)
    ax_traj.set_title("logit-lens trajectory per token")
    if n_tok:
        ax_traj.legend(fontsize=7, loc="upper left")
    fig.suptitle(f"answer: {result.answer!r}", fontsize=9)
    return fig


def plot_completeness(
    report: CompletenessReport, ax: Any = None, title: Optional[str] = None
) -> Figure:
    """Grouped bars of per-layer credit, one bar per credit method.

    Each method's own total change is a dashed horizontal line in the same colour
    (probability units). The logit-lens levels, when present, are drawn as a line on a
    second axis.

    Returns:
        matplotlib.figure.Figure (the figure of ``ax`` when one is given).
    """
    methods = [m for m in report.methods.values() if m.is_credit]
    levels = [m for m in report.methods.values() if not m.is_credit]
    k = len(report.layer_indices)
    if ax is None:
        fig = _new_figure((max(9.0, 0.6 * k * max(len(methods), 1) + 5.0), 4.5))
        ax = fig.add_subplot(1, 1, 1)
    else:
        fig = ax.figure
    colours = ["#d62728", "#1f77b4", "#2ca02c", "#9467bd", "#8c564b"]
    width = 0.8 / max(len(methods), 1)
    x = np.arange(k)
    for i, m in enumerate(methods):
        colour = colours[i % len(colours)]
        values = m.per_layer.detach().double().cpu().numpy()
        ax.bar(x - 0.4 + width * (i + 0.5), values, width, color=colour,
               label=f"{m.label} (sum {m.layer_sum:+.4f})")
        ax.axhline(m.total, color=colour, linestyle="--", linewidth=1.2,
                   label=f"{m.label} total {m.total:+.4f}")
    ax.axhline(0.0, color="black", linewidth=0.6)
    ax.set_xticks(x, labels=report.layer_names)
    ax.set_xlabel("layer")
    ax.set_ylabel("credit (probability)")
    if levels:
        twin = ax.twinx()
        for m in levels:
            twin.plot(x, m.per_layer.detach().float().cpu().numpy(), color="grey", marker="o",
                      linewidth=1.0, label=f"{m.label} (level)")
        twin.set_ylabel("logit-lens probability", color="grey")
        twin.set_ylim(-0.02, 1.02)
        twin.legend(fontsize=7, loc="lower left", bbox_to_anchor=(1.08, 0.0))
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.08, 1.0))
    ax.set_title(title or (
        f"Completeness on target {report.target_token!r} (id {report.target_id}): "
        "per-layer credit vs each method's own total"
    ), fontsize=9)
    return fig
