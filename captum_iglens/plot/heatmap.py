"""The token x layer heatmap of IG-Lens credit: colours, labels, and what is set apart.

:func:`draw_heatmap` draws the left panel of :func:`~captum_iglens.plot.credits.plot_result`
and the whole of :func:`plot_heatmap`. Colours are Captum's (red negative, white 0, green
positive). Two columns can hold more than one decoder block's doing, and say so:

- ``b→emb`` (layer 0 first): the move from the baseline to the embedding output, set apart
  by a line;
- in log-probability units (``units="log-probability"`` or
  ``display="log-probability"``), the first column: the move from the baseline's level to
  the logit lens's level at the first chosen layer. Unlike a probability, a log-probability
  is unbounded below, and the lens's level at an early layer can be tens of nats below
  anything a later layer moves (down to -52.6 nats a cell on SmolLM2 at L1), so on a
  shared colour scale it would look decisive. It is drawn as the start: grey, off the
  colour scale, its value written in each cell; the colours show the later columns' rises.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Optional

import numpy as np

from captum_iglens._utils.display import START_GREY, start_apart
from captum_iglens._utils.format import readout_name, readout_words
from captum_iglens._utils.views import ResultView

if TYPE_CHECKING:  # pragma: no cover
    from matplotlib.figure import Figure


__all__ = ["draw_heatmap", "draw_lens_terms", "lens_terms", "plot_heatmap", "start_note"]

_MAX_FIG = 24.0  # inches, either side
_COLUMN_IN = 0.32  # planned width of one heatmap column
_MAP_MAX_IN = 5.5  # widest heatmap panel: 61 sub-layer columns keep the figure ~13 in
_TICK_PT = 7.0  # layer labels
_LABEL_PITCH_PT = 1.4 * _TICK_PT  # fewest points between two labelled columns


def _map_in(k: int) -> float:
    """The planned width of the heatmap's data area for ``k`` columns, inches."""
    return min(_MAP_MAX_IN, max(1.5, _COLUMN_IN * k))


def _plain(text: str) -> str:
    """``text`` shown literally: newlines as ↵, no mathtext from ``$``."""
    return text.replace("\r\n", "\n").replace("\n", " ↵ ").replace("\t", " ").replace("$", r"\$")


def _label(token: str, limit: int = 14) -> str:
    """A token as a tick label: ``repr`` cut to ``limit`` characters."""
    text = repr(token)
    return _plain(text if len(text) <= limit else text[: limit - 1] + "…")


def _units(result: ResultView) -> str:
    return readout_words(result.units, result.contrastive)


def _token_label(result: ResultView, t: int, ok: bool) -> str:
    """Heatmap row label: index, token, ``*`` when not the argmax, and the foil if any."""
    text = f"{t} {_label(result.tokens[t])}{'' if ok else '*'}"
    if result.contrast_ids is None:
        return text
    foil = (result.contrast_tokens[t] if result.contrast_tokens is not None
            else f"id {result.contrast_ids[t]}")
    return f"{text} vs {_label(foil)}"


def _span_note(result: ResultView) -> str:
    """The caption's words for a sub-layer column that spans skipped blocks, or ``""``."""
    from captum_iglens._utils.display import layer_labels

    spans = [label for label in layer_labels(result.layer_indices, result.granularity)
             if "+" in label]
    if not spans:
        return ""
    blocks, attn = spans[0].split("+")
    return (f" {spans[0]}: the segment from the previous chosen layer to {attn}, blocks "
            f"{blocks[1:]} whole (skipped layers) and {attn.split('.')[0]}'s attention.")


def _layer_ticks(ax: Any, names: list[str], col_pt: float) -> int:
    """A tick per column; labels at least :data:`_LABEL_PITCH_PT` apart, the last one kept.

    Columns narrower than that (60 sub-layer columns) are labelled every ``n``-th from the
    last (at sub-layer granularity every ``L<l>.mlp`` and ``b→emb``), the others keep an
    unlabelled minor tick, so that the labels stay :data:`_TICK_PT` points and apart.
    Returns the step (1: every column labelled).
    """
    k = len(names)
    step = max(1, int(np.ceil(_LABEL_PITCH_PT / max(col_pt, 1e-9))))
    shown = [j for j in range(k) if (k - 1 - j) % step == 0 or "+" in names[j]]
    ax.set_xticks(shown, labels=[names[j] for j in shown], rotation=90, fontsize=_TICK_PT)
    ax.set_xticks([j for j in range(k) if j not in shown], minor=True)
    return step


def _start_cells(ax: Any, values: np.ndarray, row_pt: float) -> None:
    """The start column's values written in its cells (nats), where the rows have room."""
    if row_pt < 6.0:
        return
    size = float(np.clip(0.6 * row_pt, 5.0, 7.0))
    for t, value in enumerate(values):
        ax.text(0, t, f"{value:.1f}", ha="center", va="center", fontsize=size,
                color="black", clip_on=True)


_CREDIT_NAMES = {"total": "total-effect credit", "atp": "AtP estimate (not additive)"}


def credit_name(result: ResultView) -> str:
    """What a cell holds: IG-Lens's readout credit, a total-effect credit or an AtP estimate."""
    return _CREDIT_NAMES.get(getattr(result, "effect", "readout"), "IG-Lens credit")


def draw_heatmap(fig: Figure, ax: Any, result: ResultView, attr: np.ndarray, row_pt: float,
                 label: str = "", col_pt: float = 72.0 * _COLUMN_IN,
                 log_view: bool = False) -> None:
    """Credits with a diverging map centred at 0, every token labelled, onsets boxed.

    The colours are Captum's (red negative, white 0, green positive), as in
    ``result.to_captum().plot_token_attr()``. With layer 0 first, its column is labelled
    ``b→emb`` and a line sets it apart: its credit is the move from the baseline to
    ``h_0``, not a block's. In log units (the result's, or ``log_view`` for
    ``display="log-probability"``) the first column is the start (module docstring):
    grey, its values written, the colour limits from the other columns.
    """
    from matplotlib.colors import Normalize

    from captum_iglens._utils.display import credit_colormap, layer_labels

    k = len(result.layer_indices)
    apart = start_apart(result.units, "log-probability" if log_view else "credit", k)
    scaled = attr[:, 1:] if apart else attr
    limit = float(np.abs(scaled).max()) if scaled.size else 0.0
    limit = limit if limit > 0 else 1e-12
    shown = np.ma.masked_array(attr, mask=np.zeros_like(attr, dtype=bool)) if attr.size \
        else np.ma.masked_array(np.zeros((1, k)))
    if apart and attr.size:
        shown.mask[:, 0] = True  # type: ignore[index]  # a full [T, k] mask
    image = ax.imshow(  # Captum's colours: red negative, green positive
        shown, cmap=credit_colormap().with_extremes(bad=START_GREY),
        norm=Normalize(vmin=-limit, vmax=limit), aspect="auto", interpolation="nearest",
    )
    fig.colorbar(image, ax=ax, label=label or f"{credit_name(result)} ({_units(result)})")
    step = _layer_ticks(ax, layer_labels(result.layer_indices, result.granularity), col_pt)
    emb = bool(result.layer_indices) and result.layer_indices[0] == 0 and k > 1
    if emb or apart:
        ax.axvline(0.5, color="black", linewidth=1.2)
    if apart and attr.size:
        _start_cells(ax, attr[:, 0], row_pt)
    _token_ticks(ax, result, row_pt)
    ax.set_xlabel(_x_words(result, emb, apart, step))
    ax.set_ylabel("answer token")
    marks = "* not the argmax" if result.effect == "atp" else "□ onset, * not the argmax"
    ax.set_title(f"{credit_name(result)} per token and layer\n({marks})",
                 fontsize=9)
    _onset_boxes(ax, result, row_pt)


def lens_terms(result: ResultView) -> Optional[np.ndarray]:
    """``[T, k]`` float32 lens terms of a per-layer readout (``lens_change``); None: logit lens."""
    lens = getattr(result, "lens_change", None)
    return None if lens is None else lens.detach().float().cpu().numpy()


#: The legend entry of the lens terms (the panel's cells are hatched grey over their colour).
LENS_LABEL = "lens term g_L(h_(L-1)) - g_(L-1)(h_(L-1)): the readout's change, not a credit"


def draw_lens_terms(fig: Figure, ax: Any, result: ResultView, row_pt: float,
                    col_pt: float = 72.0 * _COLUMN_IN) -> None:
    """A per-layer readout's ``[T, k]`` lens terms, in a panel apart from the credits.

    Their own diverging colours (orange negative, purple positive, symmetric limits) under a
    grey hatch, a colour bar in the result's units and a legend entry: the change of readout
    at a fixed residual, which no block made. Credits and lens terms add up to ``delta_p``.
    """
    from matplotlib.colors import Normalize
    from matplotlib.patches import Patch, Rectangle

    from captum_iglens._utils.display import layer_labels

    values = lens_terms(result)
    k = len(result.layer_indices)
    values = values if values is not None and values.size else np.zeros((1, k))
    limit = float(np.abs(values).max()) or 1e-12
    image = ax.imshow(values, cmap="PuOr", norm=Normalize(vmin=-limit, vmax=limit),
                      aspect="auto", interpolation="nearest")
    ax.add_patch(Rectangle((-0.5, -0.5), k, values.shape[0], fill=False, hatch="///",
                           edgecolor="#707070", alpha=0.35, linewidth=0))
    fig.colorbar(image, ax=ax, label=f"lens term ({_units(result)})")
    _layer_ticks(ax, layer_labels(result.layer_indices, result.granularity), col_pt)
    _token_ticks(ax, result, row_pt)
    ax.set_xlabel("layer")
    # the legend sits between the title and the panel (below it, it met the x label)
    ax.set_title("lens terms per token and layer\n(apart from the credits)", fontsize=9,
                 pad=28)
    ax.legend(handles=[Patch(facecolor="#d0d0d0", edgecolor="#707070", hatch="///",
                             label=LENS_LABEL.replace(": ", ":\n", 1))],
              fontsize=6, loc="lower center", bbox_to_anchor=(0.5, 1.0), frameon=False,
              borderaxespad=0.2)


def _token_ticks(ax: Any, result: ResultView, row_pt: float) -> None:
    n_tok = len(result.tokens)
    flags = list(result.is_argmax) or [True] * n_tok
    labels = [_token_label(result, t, ok) for t, ok in zip(range(n_tok), flags, strict=True)]
    ax.set_yticks(range(n_tok), labels=labels, fontsize=_token_pt(row_pt))


def _x_words(result: ResultView, emb: bool, apart: bool, step: int) -> str:
    """The heatmap's x label: what is set apart, and how the labels are thinned."""
    words = "layer"
    if apart:
        words += " (first: the start, grey, nats written)"
    elif emb:
        words += " (b→emb: baseline to h_0, set apart)"
    if step > 1:
        words += ("; unlabelled ticks: each block's .attn" if result.granularity == "sublayer"
                  and step == 2 else f"; every {step}th column labelled")
    return words


def start_note(result: ResultView, display: str) -> str:
    """The caption's words for the start column of a log-unit heatmap, or ``""``."""
    from captum_iglens._utils.display import layer_labels

    if not start_apart(result.units, display, len(result.layer_indices)):
        return ""
    first = layer_labels(result.layer_indices, result.granularity)[0]
    lens = "logit lens" if lens_terms(result) is None else f"{readout_name(result)} g_L"
    return (f" Log units: the first column ({first}) is the start, the move from the "
            f"baseline's level to the {lens}'s level at {first.split('→')[-1]} (its "
            "nats written in its grey cells, off the colour scale: a log-probability is "
            "unbounded below, and an early layer's lens level would dwarf every rise); the "
            "colours show the rises of the later layers.")


def _onset_boxes(ax: Any, result: ResultView, row_pt: float) -> None:
    """A square around each token's onset cell."""
    k = len(result.layer_indices)
    cells = [(result.layer_indices.index(o), t) for t, o in enumerate(result.onset_layers)
             if o in result.layer_indices]
    if cells:
        col_pt = 72.0 * _map_in(k) / max(k, 1)
        side = float(np.clip(0.75 * min(row_pt, col_pt), 3.0, 9.0))
        cols, rows = zip(*cells, strict=True)
        ax.scatter(cols, rows, marker="s", s=side**2, facecolors="none", edgecolors="black",
                   linewidths=1.2)


def _token_pt(row_pt: float) -> float:
    """Font size of token labels for rows ``row_pt`` points high."""
    return float(np.clip(0.72 * row_pt, 3.0, 8.0))


def plot_heatmap(result: ResultView, figsize: Optional[tuple[float, float]] = None,
                 display: str = "credit") -> Figure:
    """The token x layer heatmap of IG-Lens credit alone, compact.

    The left panel of :func:`plot_result` (Captum's diverging colours centred at 0, every
    answer token labelled with its index, ``*`` where it is not the argmax, the onsets boxed,
    a colour bar in the result's units; in log units the start column set apart, see
    :func:`draw_heatmap`) without the trajectory, the title or the caption:
    about 0.16 inch per layer and 0.14 inch per token (at most 24 x 24 inches), small enough
    to embed one per record in a page (``iglens summarize --html``). A per-layer readout's
    lens terms get a panel of their own to the right (:func:`draw_lens_terms`).

    Args:
        result (IGLensResult): What :func:`~captum_iglens.explain` returned.
        figsize (tuple, optional): Figure size in inches. Default: from the number of
            tokens and layers.
        display (str, optional): ``"credit"``, ``"row"`` or ``"log-probability"``, as for
            :func:`plot_result`.

    Returns:
        matplotlib.figure.Figure
    """
    from captum_iglens._utils.display import display_attributions

    n_tok, k = len(result.tokens), len(result.layer_indices)
    panels = 1 if lens_terms(result) is None else 2  # a per-layer readout: its lens terms
    labels_in = 4.2 if result.contrastive else 3.2  # token labels and colour bar
    width, height = figsize or (min(_MAX_FIG, panels * (labels_in + 0.16 * k)),
                                min(_MAX_FIG, 1.3 + 0.14 * max(n_tok, 1)))
    from matplotlib.figure import Figure as NewFigure

    fig = NewFigure(figsize=(width, height), layout="constrained")
    row_pt = 72.0 * max(height - 1.3, 0.14) / max(n_tok, 1)
    col_pt = 72.0 * max(width / panels - labels_in, 0.16) / max(k, 1)
    values, label = display_attributions(result, display)
    draw_heatmap(fig, fig.add_subplot(1, panels, 1), result, values.numpy(), row_pt, label,
                 col_pt, log_view=display == "log-probability")
    if panels == 2:
        draw_lens_terms(fig, fig.add_subplot(1, 2, 2), result, row_pt, col_pt)
    return fig
