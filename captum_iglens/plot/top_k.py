"""The top-K tokens of the levels' readout at every chosen layer, labels fitted to cells.

:func:`plot_top_k` draws, for each of a few answer tokens, a layers x ranks grid: the
``K`` most probable tokens the logit lens (a per-layer lens: its ``g_L``) reads out of each
chosen layer, shaded by their probability, the answer token in bold green. It works at any
number of layers (one row each, the figure grows up to 24 inches and the font shrinks) and
any ``K``; every label is cut, with an ellipsis, to the width of its own cell rather than at
the panel's edge.
:func:`top1_grid` is the top-1 column panel of :func:`~captum_iglens.plot.credits.plot_result`.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any, Optional, Sequence

import numpy as np

from captum_iglens._utils.format import readout_name
from captum_iglens._utils.views import ResultView

if TYPE_CHECKING:  # pragma: no cover
    from matplotlib.figure import Figure


__all__ = ["fit_label", "plot_top_k", "text_width_pt", "top1_grid"]

_HIT = "#1a7f37"
_MAX_FIG = 24.0
_CELL_IN = 0.85  # width of one rank column
_ROW_IN = 0.2  # height of one layer row
_SLACK = 0.97  # labels measured per character are fitted to 97% of their room


def _plain(text: str) -> str:
    return text.replace("$", r"\$")


@functools.lru_cache(maxsize=16)
def _advances(fontsize: float, bold: bool) -> tuple[Any, dict[str, float]]:
    """The font of a label and its cache of character advance widths (points)."""
    from matplotlib.font_manager import FontProperties, findfont, get_font

    prop = FontProperties(size=fontsize, weight="bold" if bold else "normal")
    return get_font(findfont(prop)), {}


def text_width_pt(text: str, fontsize: float, bold: bool = False) -> float:
    """The width of ``text`` in points: the sum of its characters' advance widths.

    Each character is loaded from the font once (unhinted advance at ``fontsize``, 72 dpi)
    and cached; kerning is left out, which errs on the wide side for the label fonts.
    """
    from matplotlib.ft2font import LoadFlags

    font, cache = _advances(fontsize, bold)
    total = 0.0
    for char in text:
        width = cache.get(char)
        if width is None:
            font.set_size(fontsize, 72)  # the font object is shared: set its size each time
            glyph = font.load_char(ord(char), flags=LoadFlags.NO_HINTING)
            width = cache[char] = glyph.linearHoriAdvance / 65536.0
        total += width
    return total


def fit_label(token: str, width_pt: float, fontsize: float, bold: bool = False) -> str:
    """``repr(token)`` cut with an ellipsis until it is at most ``width_pt`` points wide.

    Widths are summed per character (:func:`text_width_pt`, each character measured once
    per font), so that fitting the hundreds of labels of a top-K figure costs no
    layout of whole strings (each took ~3 ms, ~15 tries a label: 22 s a figure).
    """
    text = repr(token)
    shown = _plain(text)
    if text_width_pt(shown, fontsize, bold) <= width_pt * _SLACK:
        return shown
    ellipsis = text_width_pt("…", fontsize, bold)
    budget, used, keep = width_pt * _SLACK - ellipsis, 0.0, 0
    for char in text[:-1]:
        used += text_width_pt(_plain(char), fontsize, bold)
        if used > budget:
            break
        keep += 1
    return _plain(text[:max(keep, 0)] + "…") if keep else _plain(text[:1])


def _cell_pt(fig: Any, ax: Any, columns: int, fallback_in: float, layout: bool = True) -> float:
    """The width of one column of ``ax`` in points, after the layout has run.

    With ``layout=False`` the layout that ran last is read (one run for several panels).
    """
    try:
        if layout:
            fig.get_layout_engine().execute(fig)
        width_in = ax.get_position().width * fig.get_figwidth()
    except Exception:  # no layout engine or renderer: the planned width
        width_in = fallback_in * columns
    return 72.0 * width_in / max(columns, 1)


def _is_answer(result: ResultView, t: int, j: int, r: int) -> bool:
    ids = result.top_k_ids
    if ids is not None:
        return int(ids[t, j, r]) == int(result.token_ids[t])
    return result.top_k_tokens[t][j][r] == result.tokens[t]  # type: ignore[index]  # checked by plot_top_k


def _cell_texts(ax: Any, result: ResultView, t_rows: Sequence[tuple[int, int]],
                ranks: int, cell_pt: float, fontsize: float, column: Any) -> None:
    """One fitted label per cell; ``column(i, r)`` gives the x of row ``i``'s rank ``r``."""
    for i, (t, j) in enumerate(t_rows):
        for r in range(ranks):
            hit = _is_answer(result, t, j, r)
            label = fit_label(result.top_k_tokens[t][j][r], cell_pt - 3.0, fontsize, hit)  # type: ignore[index]  # checked by plot_top_k
            text = ax.text(*column(i, r), label, ha="center", va="center", clip_on=True,
                           fontsize=fontsize, color=_HIT if hit else "black",
                           fontweight="bold" if hit else "normal")
            text.set_in_layout(False)


def _reader(result: ResultView) -> str:
    """``"logit-lens"``, or a per-layer lens's ``"<kind> lens g_L"``: whose top tokens."""
    name = readout_name(result)
    return name if getattr(result, "lens_change", None) is None else f"{name} g_L"


def top1_grid(fig: Any, ax: Any, result: ResultView, fontsize: float, cell_in: float) -> None:
    """The levels' readout's top-1 token per answer token (rows) and layer (columns)."""
    from captum_iglens._utils.display import layer_labels

    n_tok, k = len(result.tokens), len(result.layer_indices)
    ax.set_xlim(-0.5, k - 0.5)
    names = layer_labels(result.layer_indices, result.granularity)
    ax.set_xticks(range(k), labels=names, rotation=90, fontsize=7)
    ax.tick_params(left=False, labelleft=False)
    ax.set_xlabel("layer")
    ax.set_title(f"{_reader(result)} top-1 token\n(bold green = the answer token)", fontsize=9)
    cells = [(t, j) for t in range(n_tok) for j in range(k)]
    cell_pt = _cell_pt(fig, ax, k, cell_in)
    _cell_texts(ax, result, cells, 1, cell_pt, fontsize,
                lambda i, r: (cells[i][1], cells[i][0]))


def _check(result: ResultView, top_k: Optional[int]) -> int:
    if not result.top_k_tokens or not result.tokens:
        raise ValueError("The result holds no top-k tokens: explain(..., top_k=5) or "
                         "iglens --top-k 5 records them.")
    available = len(result.top_k_tokens[0][0])
    if top_k is None:
        return available
    if not 1 <= top_k <= available:
        raise ValueError(f"top_k must be in 1..{available} (the tokens recorded), got {top_k}")
    return top_k


def plot_top_k(
    result: ResultView,
    tokens: Optional[Sequence[int]] = None,
    top_k: Optional[int] = None,
    max_panels: int = 4,
    figsize: Optional[tuple[float, float]] = None,
) -> Figure:
    """The levels' readout's top-``K`` tokens at every chosen layer, a panel per answer token.

    Each panel is a layers x ranks grid (``[k, K]``), shaded by the probability the lens
    gives each token (0 to 1, one colour bar), its label fitted to the cell (cut with an
    ellipsis), the answer token in bold green. Layers read top (first chosen) to bottom.

    Args:
        result (IGLensResult): With ``top_k_tokens`` (``explain(..., top_k=K)``).
        tokens (sequence of int, optional): Answer-token indices, one panel each. Default:
            the first ``max_panels``.
        top_k (int, optional): Ranks shown (``<= K`` recorded). Default: all recorded.
        max_panels (int, optional): Panels when ``tokens`` is not given. Default: 4.
        figsize (tuple, optional): Inches. Default: from panels, ranks and layers (<= 24).

    Returns:
        matplotlib.figure.Figure

    Raises:
        ValueError: no top-k tokens recorded, ``top_k`` out of range, or a token index
            outside the answer.
    """
    from matplotlib.colors import Normalize
    from matplotlib.figure import Figure

    from captum_iglens._utils.display import layer_labels

    ranks = _check(result, top_k)
    chosen = list(range(min(len(result.tokens), max_panels))) if tokens is None else list(tokens)
    if not chosen or not all(0 <= t < len(result.tokens) for t in chosen):
        raise ValueError(f"tokens must be indices in 0..{len(result.tokens) - 1}, got {chosen}")
    k = len(result.layer_indices)
    width = min(_MAX_FIG, 1.6 + len(chosen) * (_CELL_IN * ranks + 0.3))
    height = min(_MAX_FIG, 1.8 + _ROW_IN * k)
    fig = Figure(figsize=figsize or (width, height), layout="constrained")
    axes = fig.subplots(1, len(chosen), sharey=True, squeeze=False)[0]
    fontsize = float(np.clip(0.62 * 72.0 * (fig.get_figheight() - 1.8) / max(k, 1), 3.0, 8.0))
    probs = (result.top_k_probs.detach().float().cpu().numpy() if result.top_k_probs is not None
             else np.zeros((len(result.tokens), k, ranks)))
    image = None
    for ax, t in zip(axes, chosen, strict=True):
        image = ax.imshow(probs[t, :, :ranks], cmap="Blues", norm=Normalize(0.0, 1.0),
                          aspect="auto", interpolation="nearest", alpha=0.6)
        ax.set_xticks(range(ranks), labels=[f"#{r + 1}" for r in range(ranks)], fontsize=7)
        ax.set_title(f"answer token {t}: {fit_label(result.tokens[t], 72 * _CELL_IN * ranks, 8)}",
                     fontsize=8)
    names = layer_labels(result.layer_indices, result.granularity)
    axes[0].set_yticks(range(k), labels=names, fontsize=fontsize)
    axes[0].set_ylabel("layer")
    fig.colorbar(image, ax=list(axes), label=f"{_reader(result)} probability")  # type: ignore[arg-type]  # one panel per token: set
    fig.suptitle(f"{_reader(result)} top-{ranks} tokens at each layer (bold green = the answer "
                 f"token); {len(chosen)} of {len(result.tokens)} answer tokens", fontsize=9)
    _cell_pt(fig, axes[0], ranks, _CELL_IN)  # one layout for every panel, before any label
    for ax, t in zip(axes, chosen, strict=True):
        cell_pt = _cell_pt(fig, ax, ranks, _CELL_IN, layout=False)
        rows = [(t, j) for j in range(k)]
        _cell_texts(ax, result, rows, ranks, cell_pt, fontsize, lambda i, r: (r, i))
    return fig
