"""The HTML page of ``iglens summarize --html``: one self-contained file.

The page holds the printed report, the summary figure, every record's answer with its
tokens coloured by onset layer, every failure, and per record (up to a cap) a section with
its token x layer heatmap drawn by :func:`captum_iglens.plot.credits.plot_heatmap`. Figures are
inline base64 PNGs of at most 256 colours (a 64-token answer over 30 layers: about 20 KB);
there are no external assets, scripts or fonts. All text from the results file is escaped
with :func:`html.escape`.
"""

from __future__ import annotations

import html
from typing import Any, Optional, Sequence

from captum_iglens._utils.format import layer_names, shorten, total_symbol
from captum_iglens.summary.plot import figure_png_base64, plot_summary
from captum_iglens.summary.pool import RunSummary
from captum_iglens.summary.report import ATP_ONSET_NOTE, record_name

__all__ = ["DEFAULT_MAX_RECORDS", "render_html", "write_html"]

#: Records that get a heatmap section by default; the rest are listed without one.
DEFAULT_MAX_RECORDS = 200
_HEATMAP_DPI = 72
_LIST_PROMPT_CHARS = 300  # a prompt (or a document's text) in the lists
_SECTION_PROMPT_CHARS = 3000  # in a record's own section
_STYLE = """
body { font-family: sans-serif; margin: 1.5em; max-width: 1400px; color: #222; }
pre { background: #f6f8fa; padding: 0.8em; overflow-x: auto; font-size: 13px; }
.answer { white-space: pre-wrap; font-family: monospace; margin: 0.2em 0 0.8em 0; }
.tok { border-radius: 3px; padding: 0 1px; }
.legend .tok { padding: 0 6px; margin-right: 4px; }
.note { color: #8a4b00; }
.prompt { color: #555; white-space: pre-wrap; }
img { max-width: 100%; }
section { border-top: 1px solid #ddd; margin-top: 1.2em; }
"""


def _esc(value: Any) -> str:
    return html.escape(str(value), quote=True)


def _anchor(position: int) -> str:
    """The id of the section of the record at ``position`` (0-based, file order)."""
    return f"rec-{position}"


def _layer_colours(layers: Sequence[int]) -> dict[int, tuple[str, str]]:
    """Per hidden-state index (background, text) colours, viridis from first to last."""
    from matplotlib import colormaps
    from matplotlib.colors import to_hex

    cmap = colormaps["viridis"]
    out = {}
    for j, layer in enumerate(layers):
        rgba = cmap(j / max(len(layers) - 1, 1))
        light = 0.299 * rgba[0] + 0.587 * rgba[1] + 0.114 * rgba[2] > 0.5
        out[int(layer)] = (to_hex(rgba), "#000" if light else "#fff")
    return out


def _legend(summary: RunSummary, colours: dict[int, tuple[str, str]]) -> str:
    if summary.effect == "atp":  # no onset layer: the tokens are left grey
        return f'<p class="legend">{_esc(ATP_ONSET_NOTE)}; the tokens are not coloured.</p>'
    spans = "".join(
        f'<span class="tok" style="background:{bg};color:{fg}">{_esc(name)}</span>'
        for (bg, fg), name in zip(colours.values(), summary.layer_names, strict=True))
    return f'<p class="legend">Tokens are coloured by their onset layer: {spans}</p>'


def _token_span(token: dict, colours: dict[int, tuple[str, str]], summary: RunSummary) -> str:
    layer = token.get("onset_layer") if summary.effect != "atp" else None
    bg, fg = colours.get(int(layer), ("#ccc", "#000")) if layer is not None else ("#ccc", "#000")
    onset = "n/a" if layer is None else layer_names([int(layer)], summary.granularity)[0]
    final = ("F" if summary.contrastive else "p" if summary.units == "probability"
             else "log p")
    tip = (f"onset {onset}, {final} {token.get('p_final', float('nan')):.4g}, "
           f"{total_symbol(summary.units, summary.contrastive)} "
           f"{token.get('delta_p', float('nan')):.4g}")
    if summary.contrastive and token.get("contrast_token") is not None:
        tip += f", foil {token['contrast_token']!r}"
    return (f'<span class="tok" style="background:{bg};color:{fg}" title="{_esc(tip)}">'
            f"{_esc(token['token'])}</span>")


def _answer_item(position: int, record: dict, summary: RunSummary,
                 colours: dict[int, tuple[str, str]], linked: bool) -> str:
    label = _esc(record_name(record))
    head = f'<a href="#{_anchor(position)}">{label}</a>' if linked else label
    tokens = "".join(_token_span(t, colours, summary) for t in record["tokens"])
    prompt = shorten(str(record.get("prompt") or ""), _LIST_PROMPT_CHARS)
    return (f'<li>{head} <span class="prompt">prompt: {_esc(prompt)}</span>'
            f'<div class="answer">{tokens}</div></li>')


def _failure_item(failure: dict) -> str:
    prompt = failure.get("prompt")
    shown = (f' <span class="prompt">(prompt: {_esc(shorten(str(prompt), _LIST_PROMPT_CHARS))})'
             "</span>" if prompt is not None else "")
    return (f"<li>{_esc(record_name(failure))}: <b>{_esc(failure['error_type'])}</b>: "
            f"{_esc(failure['error'])}{shown}</li>")


def _failure_items(summary: RunSummary) -> str:
    if not summary.failures:
        return "<p>None.</p>"
    return f"<ul>{''.join(_failure_item(f) for f in summary.failures)}</ul>"


def _heatmap_section(position: int, record: dict) -> str:
    """A record's section: id, prompt, answer and its heatmap (or why there is none)."""
    from captum_iglens.plot.credits import plot_heatmap
    from captum_iglens.results import IGLensResult

    try:
        image = figure_png_base64(plot_heatmap(IGLensResult.from_dict(record)), _HEATMAP_DPI)
        body = (f'<img src="data:image/png;base64,{image}" alt="token x layer heatmap of '
                f'{_esc(record_name(record))}">')
    except (KeyError, TypeError, ValueError) as err:
        body = f'<p class="note">No heatmap: {_esc(type(err).__name__)}: {_esc(err)}</p>'
    seconds = record.get("seconds")
    timing = (f", {seconds:.2f} s, its share of its batch's time"
              if isinstance(seconds, (int, float)) else "")
    name = record_name(record)
    return (f'<section id="{_anchor(position)}"><h3>{_esc(name[0].upper() + name[1:])} '
            f"(input index {_esc(record.get('index', '?'))}{timing})</h3>"
            f'<p class="prompt">prompt: '
            f'{_esc(shorten(str(record.get("prompt") or ""), _SECTION_PROMPT_CHARS))}</p>'
            f'<p class="answer">answer: {_esc(record.get("answer", ""))}</p>{body}'
            '<p><a href="#answers">back to the answers</a></p></section>')


def _figures(summary: RunSummary) -> str:
    if not summary.layers:
        return '<p class="note">No record was explained: no figure.</p>'
    image = figure_png_base64(plot_summary(summary))
    lens = "" if summary.mean_lens_change is None else (
        '<p class="note">A per-layer readout: the credits are block terms g_L(h_L) - '
        "g_L(h_(L-1)); its lens terms g_L(h_(L-1)) - g_(L-1)(h_(L-1)) (the readout's change "
        "at a fixed residual, no block's doing) are the grey hatched bars, and add up with "
        f"the credits to the mean Δ: sum of mean lens terms "
        f"{_esc(f'{sum(summary.mean_lens_change):.4g}')}.</p>")
    return (f'<img src="data:image/png;base64,{image}" alt="per-layer mean '
            f'{_esc(summary.credit_name)} with its confidence band, and the onset-layer '
            'histogram">' + lens)


def render_html(
    summary: RunSummary, records: Sequence[dict], max_records: int = DEFAULT_MAX_RECORDS,
    source: str = "",
) -> str:
    """The page as one string.

    Args:
        summary (RunSummary): The run's summary (its failures are listed).
        records (sequence of dict): The ``"ok"`` lines the summary was made from, in file
            order.
        max_records (int, optional): Heatmap sections for the first this many records
            (>= 0); the page says how many were left out. Default: 200.
        source (str, optional): The results file, named in the title. Default: "".

    Returns:
        str: a complete HTML5 document.
    """
    colours = _layer_colours(summary.layers)
    shown = min(len(records), max(max_records, 0))
    cap = ""
    if shown < len(records):
        cap = (f'<p class="note">Heatmaps of the first {shown} of {len(records)} records only '
               "(--html-max-records); the others are listed without a link.</p>")
    answers = "".join(_answer_item(p, r, summary, colours, p < shown)
                      for p, r in enumerate(records))
    sections = "".join(_heatmap_section(p, r) for p, r in enumerate(records[:shown]))
    title = f"IG-Lens run summary ({summary.credit_name})" + (f": {source}" if source else "")
    return (
        f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8"><title>{_esc(title)}'
        f"</title><style>{_STYLE}</style></head><body>"
        f'<h1 id="top">{_esc(title)}</h1><h2 id="report">Report</h2>'
        f"<pre>{_esc(summary.format())}</pre><h2 id=\"figures\">Figures</h2>"
        f"{_figures(summary)}<h2 id=\"answers\">Answers ({len(records)})</h2>"
        f"{_legend(summary, colours) if summary.layers else ''}{cap}<ol>{answers}</ol>"
        f'<h2 id="failures">Failed records ({len(summary.failures)})</h2>'
        f"{_failure_items(summary)}<h2 id=\"records\">Records: {_esc(summary.credit_name)} "
        f"per token and layer</h2>{cap}{sections}"
        '<p><a href="#top">back to the top</a></p></body></html>\n'
    )


def write_html(
    path: str, summary: RunSummary, records: Sequence[dict],
    max_records: int = DEFAULT_MAX_RECORDS, source: Optional[str] = None,
) -> None:
    """Write :func:`render_html` to ``path`` (UTF-8).

    Args:
        path (str): The page to write.
        summary (RunSummary): The run's summary.
        records (sequence of dict): Its ``"ok"`` lines, in file order.
        max_records (int, optional): Records with a heatmap section. Default: 200.
        source (str, optional): The results file, named in the title. Default: None.

    Raises:
        OSError: ``path`` cannot be written.
    """
    page = render_html(summary, records, max_records, source or "")
    with open(path, "w", encoding="utf-8") as handle:
        handle.write(page)
