"""The text table of an explained answer: at most 100 columns, zeros as zeros, a legend."""

from __future__ import annotations

import textwrap
from typing import TYPE_CHECKING

from captum_iglens.results._format import shorten

if TYPE_CHECKING:  # pragma: no cover
    from captum_iglens.results.explanation import IGLensResult

__all__ = ["format_explanation", "format_number"]

_CELL = 9  # width of one number
_TOKEN = 2 * _CELL + 1  # width of one token's column


def format_number(value: float, signed: bool = True, digits: int = 5) -> str:
    """``value`` with ``digits`` decimals; ``"0"`` where it rounds to zero (never ``-0.0``)."""
    text = f"{value:+.{digits}f}" if signed else f"{value:.{digits}f}"
    return "0" if float(text) == 0.0 else text


def _block(result: IGLensResult, cols: list[int]) -> list[str]:
    names, units_p = result.layer_names, "lens p" if result.units == "probability" else "lens lp"

    def label(t: int) -> str:
        mark = "" if not result.is_argmax or result.is_argmax[t] else "*"
        return shorten(repr(result.tokens[t]) + mark, _TOKEN)

    head = f"{'layer':>6} |" + "".join(f" {label(t):>{_TOKEN}} |" for t in cols)
    sub = f"{'':>6} |" + "".join(f" {'IG':>{_CELL}} {units_p:>{_CELL}} |" for _ in cols)
    lines = [head, sub, "-" * len(head)]
    for j, name in enumerate(names):
        cells = "".join(
            f" {format_number(float(result.attributions[t, j])):>{_CELL}}"
            f" {format_number(float(result.lens_probs[t, j]), signed=False):>{_CELL}} |"
            for t in cols
        )
        lines.append(f"{name:>6} |" + cells)
    lines.append("-" * len(head))
    for key, values in (
        ("sum", [float(result.attributions[t].sum()) for t in cols]),
        ("Δp", [float(result.delta_p[t]) for t in cols]),
        ("p" if result.units == "probability" else "log p",
         [float(result.p_final[t]) for t in cols]),
    ):
        lines.append(f"{key:>6} |" + "".join(
            f" {format_number(v, digits=6):>{_TOKEN}} |" for v in values))
    onsets = [names[result.layer_indices.index(result.onset_layers[t])] for t in cols]
    lines.append(f"{'onset':>6} |" + "".join(f" {o:>{_TOKEN}} |" for o in onsets))
    return lines + [""]


def _legend(result: IGLensResult) -> list[str]:
    unit = "probability" if result.units == "probability" else "log-probability, nats"
    rule = (f"first layer from which the cumulative credit stays at or beyond "
            f"{result.onset_frac:g}·Δp" if result.onset_rule == "sustained" else
            f"first layer holding {result.onset_frac:g} of the cumulative |credit|")
    lens, p = ("lens p", "p") if result.units == "probability" else ("lens lp", "log p")
    text = (f"IG: the layer's IG-Lens credit ({unit}); {lens}: logit-lens readout f(h_L) of the "
            f"token at that layer ({unit}; a level, not a credit); sum: the credits' sum; Δp: "
            f"{p} minus the readout at the baseline, what the credits add up to; {p}: the "
            f"model's own {'probability' if p == 'p' else 'log-probability'} of the token; "
            f"onset: {rule} ({result.onset_rule} rule).")
    lines = textwrap.wrap(text, 100)
    if result.is_argmax and not all(result.is_argmax):
        lines += textwrap.wrap("*: not the argmax of the explained forward (a given answer, or "
                               "generation and the teacher-forced forward differ).", 100)
    return lines


def format_explanation(result: IGLensResult, tokens_per_block: int = 4) -> str:
    """The layer x token table of ``result``, blocks of ``tokens_per_block`` tokens.

    Four tokens per block keep every line within 100 columns.
    """
    lines: list[str] = []
    for begin in range(0, len(result.tokens), tokens_per_block):
        lines += _block(result, list(range(begin, min(begin + tokens_per_block,
                                                       len(result.tokens)))))
    lines += _legend(result)
    if result.truncated:
        lines.append(f"answer truncated: generation stopped at max_new_tokens="
                     f"{result.max_new_tokens} before an end token.")
    base = result.baseline_description or result.baseline
    lines.append(f"completeness: max |sum - Δp| = {result.completeness_error:.3e} over "
                 f"{len(result.tokens)} token{'' if len(result.tokens) == 1 else 's'} "
                 f"({result.method}, {result.units})")
    lines += textwrap.wrap(f"baseline: {base}", 100)
    return "\n".join(lines)
