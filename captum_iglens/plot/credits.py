"""Figures and Captum visualization interop for IG-Lens results.

Everything here builds ``matplotlib.figure.Figure`` objects directly (no pyplot global
state), so it works under the Agg backend, in notebooks and in scripts alike.
"""

from __future__ import annotations

import textwrap
from typing import TYPE_CHECKING, Any, Optional

import numpy as np

from captum_iglens._utils.format import readout_name, total_symbol
from captum_iglens._utils.views import ResultView
from captum_iglens.plot.completeness import plot_completeness
from captum_iglens.plot.heatmap import (
    LENS_LABEL,
    _label,
    _map_in,
    _plain,
    _span_note,
    _token_pt,
    _units,
    draw_heatmap,
    draw_lens_terms,
    lens_terms,
    plot_heatmap,
    start_note,
)

if TYPE_CHECKING:  # pragma: no cover
    from matplotlib.figure import Figure


__all__ = ["plot_result", "plot_heatmap", "plot_completeness", "plot_top_k", "result_to_captum"]


def _new_figure(figsize: tuple[float, float]) -> Figure:
    from matplotlib.figure import Figure

    return Figure(figsize=figsize, layout="constrained")


def result_to_captum(result: ResultView) -> Any:
    """An :class:`~captum_iglens.results.IGLensLLMAttributionResult` view of a result.

    The layer names (``"emb"``, ``"L1"``, ...) stand in the place of Captum's input tokens and
    the answer tokens are the output tokens: ``token_attr`` is the ``[T, k]`` IG-Lens credit
    (in the result's units) with the baseline's readout ``-f(b)`` kept out of the first
    column (``baseline_attr``; ``baseline_attr + token_attr.sum(-1) = delta_p``),
    ``seq_attr`` the ``[k]`` per-layer credit summed over the answer tokens,
    ``output_probs`` the model's probability of each answer token (its ``p(y) - p(foil)``
    for a contrastive result). Captum's ``plot_token_attr()`` then draws the token x layer
    heatmap, ``plot_seq_attr()`` the per-layer totals, both labelled.
    """
    return result.to_captum()


_TITLE_PT = 9.0
_CAPTION_PT = 7.5
_MAX_FIG = 24.0  # inches, either side
_GRID_CELL_IN = 0.55  # width of one top-1 column


def _wrap(text: str, width_pt: float, fontsize: float, max_lines: int) -> list[str]:
    """Wrap ``text`` into at most ``max_lines`` lines no wider than ``width_pt`` points.

    The first try guesses the line length in characters; lines measured wider than
    ``width_pt`` make the next try shorter. Cut text ends with an ellipsis.
    """
    from matplotlib.font_manager import FontProperties
    from matplotlib.textpath import TextToPath

    measure, prop = TextToPath(), FontProperties(size=fontsize)
    chars = max(10, int(width_pt / (0.55 * fontsize)))
    while True:
        lines = textwrap.wrap(text, chars, max_lines=max_lines, placeholder=" …") or [""]
        widest = max(measure.get_text_width_height_descent(s, prop, ismath=False)[0]
                     for s in lines)
        if widest <= width_pt or chars <= 10:
            return lines
        chars = max(10, int(chars * 0.9 * width_pt / widest))


def _onset_words(result: ResultView) -> str:
    """The onset rule of ``result`` in words."""
    frac, total = f"{result.onset_frac:g}", total_symbol(result.units, result.contrastive)
    if getattr(result, "lens_change", None) is not None:  # lens terms: no layer's doing
        total = "(the block terms' sum, lens terms left out)"
    if result.onset_rule == "sustained":
        return f"first layer from which the cumulative credit stays at or beyond {frac}·{total}"
    if result.onset_rule == "mass":
        return f"first layer holding {frac} of the cumulative |credit|"
    return f"onset rule {result.onset_rule!r} at fraction {frac}"


def _sizes(
    result: ResultView, figsize: Optional[tuple[float, float]], max_legend: int
) -> tuple[tuple[float, float], list[float], float]:
    """Figure size, panel width ratios (the top-1 grid second, if shown) and row height (pt)."""
    n_tok, k = len(result.tokens), len(result.layer_indices)
    widths = [1.6 + _map_in(k) + 0.9, 5.0 + (0.9 if n_tok > min(max_legend, 10) else 0.0)]
    grid = _GRID_CELL_IN * k + 0.4
    width = min(_MAX_FIG, max(9.0, sum(widths)))
    height = min(_MAX_FIG, max(4.5, 0.22 * n_tok + 3.4))
    show_grid = bool(result.top_k_tokens) and n_tok > 0 and width + grid <= _MAX_FIG
    if figsize is not None:
        width, height = figsize
    row_pt = 72.0 * max(height - 3.4, 1.0) / max(n_tok, 1)
    if show_grid and _token_pt(row_pt) >= 5.0:
        widths.insert(1, grid)
        width += grid if figsize is None else 0.0
    return (width, height), widths, row_pt


def _title(fig: Figure, result: ResultView) -> None:
    """Prompt and answer on separate wrapped lines, inside the figure."""
    width_pt = 72.0 * fig.get_figwidth() * 0.96
    n_tok = len(result.tokens)
    head = f"answer ({n_tok} token{'s' if n_tok != 1 else ''})"
    if result.truncated:
        head += f" [truncated at {result.max_new_tokens or n_tok} tokens]"
    lines = _wrap(f"prompt: {_plain(result.prompt)}", width_pt, _TITLE_PT, 2)
    lines += _wrap(f"{head}: {_plain(result.answer)}", width_pt, _TITLE_PT, 4)
    fig.suptitle("\n".join(lines), x=0.01, ha="left", fontsize=_TITLE_PT, multialignment="left")


_EFFECT_WORDS = {
    "total": " Total effect: each block's exact share of p(y) - p(y | every gated update at "
             "the position at its reference), not the logit-lens readout's rise.",
    "atp": " Attribution patching: first-order estimates of single-block drops; they are not "
           "a decomposition and need not add up to delta p.",
}


def _caption(fig: Figure, result: ResultView, display: str = "credit") -> None:
    """The onset rule, the markers and the units, in words, at the foot of the figure."""
    onset = ("No onset: AtP estimates are not a decomposition." if result.effect == "atp"
             else f"□ onset ({result.onset_rule} rule): the {_onset_words(result)}.")
    text = (f"Credit in {_units(result)}. {onset} * the token is not the argmax of the "
            "explained forward.")
    if result.contrastive:
        text += (" Contrastive: every value is F = p(y) - p(foil) (log units: the log-ratio), "
                 "each answer token y against its foil ('vs').")
    if result.layer_indices and result.layer_indices[0] == 0:
        text += (" b→emb (left of the line): the move from the baseline to the embedding output,"
                 " f(h_0) - f(b), which no decoder block made.")
    text += _span_note(result) + start_note(result, display)
    text += _EFFECT_WORDS.get(getattr(result, "effect", "readout"), "")
    if lens_terms(result) is not None:
        text += (" A per-layer readout g_L: the credits are block terms g_L(h_L) - g_L(h_(L-1)); "
                 f"hatched panel: {LENS_LABEL}; credits plus lens terms add up to delta p.")
    if result.baseline_description:
        text += f" Baseline: {_plain(result.baseline_description)}."
    lines = _wrap(text, 72.0 * fig.get_figwidth() * 0.96, _CAPTION_PT, 4)
    fig.supxlabel("\n".join(lines), x=0.01, ha="left", fontsize=_CAPTION_PT,
                  multialignment="left")


def _trajectory(
    fig: Figure, ax: Any, result: ResultView, probs: np.ndarray, max_legend: int
) -> None:
    """One logit-lens line per token; a legend for a few tokens, else an index colour bar."""
    from matplotlib import colormaps
    from matplotlib.cm import ScalarMappable
    from matplotlib.colors import BoundaryNorm, ListedColormap

    n_tok = len(result.tokens)
    few = n_tok <= min(max_legend, 10)
    if few:
        colours = colormaps["tab10"](np.arange(n_tok))
    else:  # sequential by position: one shade per token, read off the colour bar
        colours = colormaps["viridis"](np.linspace(0.0, 0.92, max(n_tok, 1)))
    x = np.asarray(result.layer_indices)
    if result.granularity == "sublayer":
        x = x / 2  # L.attn at L - 0.5, L.mlp at L: the axis stays in blocks
    for t in range(n_tok):
        ax.plot(x, probs[t], marker=".", linewidth=1.1, color=colours[t],
                label=f"{t} {_label(result.tokens[t])}")
    if result.granularity == "sublayer":  # L.attn and L.mlp half a block apart: blocks
        ax.xaxis.get_major_locator().set_params(integer=True)
        ax.set_xlabel("decoder block (L.attn at L - 0.5, L.mlp at L)")
    elif len(x) <= 16:
        ax.set_xticks(x, labels=result.layer_names, fontsize=7)
        ax.set_xlabel("layer")
    else:
        ax.xaxis.get_major_locator().set_params(integer=True)
        ax.set_xlabel("hidden-state index (layer)")
    per_layer = lens_terms(result) is not None
    name = f"{readout_name(result)} g_L(h_L)" if per_layer else "logit-lens"
    ax.set_title(f"{name} trajectory per token", fontsize=9)
    _trajectory_axis(ax, result)
    if not n_tok:
        return
    if few:
        ax.legend(fontsize=7, loc="best", title="answer token", title_fontsize=7)
        return
    norm = BoundaryNorm(np.arange(n_tok + 1) - 0.5, n_tok)
    bar = fig.colorbar(ScalarMappable(norm=norm, cmap=ListedColormap(colours)), ax=ax,
                       label="answer token index", fraction=0.05, aspect=50)
    bar.set_ticks(np.arange(0, n_tok, -(-n_tok // 8)))  # type: ignore[arg-type]  # an int array
    bar.ax.invert_yaxis()  # index 0 on top, as in the heatmap


def _trajectory_axis(ax: Any, result: ResultView) -> None:
    """The trajectory's y label and, for probabilities, its range.

    The label names the readout: the logit lens's ``f``, or a per-layer lens's ``g_L``.
    """
    logit = lens_terms(result) is None
    name = readout_name(result)
    read, name_g = ("f(h_L)", name) if logit else ("g_L(h_L)", f"{name} g_L")
    if result.units == "probability":
        contrast = result.contrastive
        ax.set_ylabel(f"{name_g} p(y) - p(foil)" if contrast
                      else f"{name} probability {read}")
        ax.set_ylim(-1.02 if contrast else -0.02, 1.02)
    else:
        ax.set_ylabel(f"{name_g} log p(y) - log p(foil) (nats)" if result.contrastive
                      else f"{name_g} log-probability (nats)")


def plot_result(
    result: ResultView, max_legend: int = 10, figsize: Optional[tuple[float, float]] = None,
    display: str = "credit",
) -> Figure:
    """Token x layer heatmap of IG-Lens credit and the logit-lens trajectory per token.

    Title: the prompt (cut with an ellipsis) and the answer, wrapped to the figure width,
    marked when generation was truncated. Left: the ``[T, k]`` credits with a diverging
    colour map centred at 0 (symmetric limits; Captum's colours, red negative, green
    positive, as ``result.to_captum().plot_token_attr()`` draws them), every answer token
    labelled with its index (``*``: not the argmax of the explained forward), the onset
    layer of each token boxed. With a per-layer readout (``lens_change`` set) its lens terms
    come next, in a hatched panel of their own with a legend entry
    (:func:`~captum_iglens.plot.heatmap.draw_lens_terms`).
    Middle, when ``result.top_k_tokens`` is set and the grid stays readable (up to about
    16 layers): the logit lens's top-1 token per token and layer. Right: the
    logit-lens readout of each answer token over the chosen layers, coloured by token
    index, with a legend for a few tokens or a colour bar. A caption states the onset rule
    and the units. The figure grows with tokens and layers, up to 24 x 24 inches.

    Args:
        result (IGLensResult): What :func:`~captum_iglens.explain` returned.
        max_legend (int, optional): Up to this many tokens (at most 10) the trajectories get
            a legend; more get a sequential colour map and a colour bar of the token index.
            Default: 10.
        figsize (tuple, optional): Figure size in inches. Default: from the number of
            tokens and layers.
        display (str, optional): What the heatmap shows: ``"credit"`` (default, one colour
            scale for all tokens), ``"row"`` (each token's credits over its own largest, so
            that unlikely tokens keep visible cells) or ``"log-probability"`` (the change
            of ``log p`` over each segment, nats, from the logit-lens levels).

    Returns:
        matplotlib.figure.Figure

    Raises:
        ValueError: an unknown ``display``, or ``"log-probability"`` for a contrastive or
            log-unit result.
    """
    from captum_iglens._utils.display import display_attributions

    values, label = display_attributions(result, display)
    attr = values.numpy()
    probs = result.lens_probs.detach().float().cpu().numpy()
    size, widths, row_pt = _sizes(result, figsize, max_legend)
    with_grid, lens = len(widths) == 3, lens_terms(result) is not None
    if lens:  # a per-layer readout: its lens terms in a panel of their own, next to the map
        widths.insert(1, widths[0])
        size = size if figsize is not None else (min(_MAX_FIG, size[0] + widths[0]), size[1])
    fig = _new_figure(size)
    fig.get_layout_engine().set(wspace=0.06)  # type: ignore[union-attr, call-arg]  # constrained layout  # room between a colour bar and the next panel
    grid = fig.add_gridspec(1, len(widths), width_ratios=widths)
    ax_map = fig.add_subplot(grid[0])
    ax_traj = fig.add_subplot(grid[-1])
    k = max(len(result.layer_indices), 1)
    draw_heatmap(fig, ax_map, result, attr, row_pt, label, 72.0 * _map_in(k) / k,
                 log_view=display == "log-probability")
    if lens:
        draw_lens_terms(fig, fig.add_subplot(grid[1], sharey=ax_map), result, row_pt,
                        72.0 * _map_in(k) / k)
    ax_grid = fig.add_subplot(grid[1 + lens], sharey=ax_map) if with_grid else None
    _trajectory(fig, ax_traj, result, probs, max_legend)
    _title(fig, result)
    _caption(fig, result, display)
    if ax_grid is not None:  # last: its labels are fitted to the laid-out cells
        from captum_iglens.plot.top_k import top1_grid

        top1_grid(fig, ax_grid, result, _token_pt(row_pt), _GRID_CELL_IN)
    return fig


def plot_top_k(result: ResultView, **kwargs: Any) -> Figure:
    """The logit lens's top-K tokens at every layer: see :mod:`captum_iglens.plot.top_k`."""
    from captum_iglens.plot.top_k import plot_top_k as draw

    return draw(result, **kwargs)
