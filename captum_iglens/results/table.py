"""The text table of an explained answer: at most 100 columns, zeros as zeros, a legend."""

from __future__ import annotations

import textwrap
from typing import Any

from captum_iglens._utils.format import readout_words, shorten, total_symbol
from captum_iglens._utils.views import ResultView

__all__ = ["format_explanation", "format_number"]

_CELL = 9  # width of one number
_TOKEN = 2 * _CELL + 1  # width of one token's column


def format_number(value: float, signed: bool = True, digits: int = 5) -> str:
    """``value`` with ``digits`` decimals; ``"0"`` where it rounds to zero (never ``-0.0``)."""
    text = f"{value:+.{digits}f}" if signed else f"{value:.{digits}f}"
    return "0" if float(text) == 0.0 else text


def _row_names(result: ResultView) -> tuple[str, str, str]:
    """Names of the level column, the total row and the final-value row.

    The level column names its readout: ``lens`` for the logit lens, ``g_L`` for a
    per-layer lens (whose lens terms have a ``lens`` row of their own).
    """
    total = total_symbol(result.units, result.contrastive)
    read = "lens" if _lens_terms(result) is None else "g_L"
    if result.contrastive:
        return f"{read} F", total, "F"
    if result.units == "probability":
        return f"{read} p", total, "p"
    return f"{read} lp", total, "log p"


#: The credit column's name per ``effect``: IG-Lens credits, total-effect shares, AtP estimates.
_CREDIT_NAMES = {"readout": "IG", "total": "total", "atp": "AtP"}


def _credit_name(result: ResultView) -> str:
    """The credit column's title: what its numbers are (``"IG"`` for readout credits)."""
    return _CREDIT_NAMES.get(result.effect, "IG")


def _head(result: ResultView, cols: list[int], w: int = 6) -> list[str]:
    """Token labels (with the foils under them when contrastive) and the column names.

    ``w`` is the width of the row-name column (8 for sub-layer names such as ``L30.attn``).
    """
    def label(t: int) -> str:
        mark = "" if not result.is_argmax or result.is_argmax[t] else "*"
        return shorten(repr(result.tokens[t]) + mark, _TOKEN)

    def foil(t: int) -> str:
        ids = result.contrast_ids or []
        text = repr(result.contrast_tokens[t]) if result.contrast_tokens else f"id {ids[t]}"
        return shorten(text, _TOKEN)

    head = f"{'layer':>{w}} |" + "".join(f" {label(t):>{_TOKEN}} |" for t in cols)
    lines = [head]
    if result.contrastive:
        lines.append(f"{'vs':>{w}} |" + "".join(f" {foil(t):>{_TOKEN}} |" for t in cols))
    level, credit = _row_names(result)[0], _credit_name(result)
    lines.append(f"{'':>{w}} |" + "".join(f" {credit:>{_CELL}} {level:>{_CELL}} |" for _ in cols))
    return lines + ["-" * len(head)]


def _block(result: ResultView, cols: list[int]) -> list[str]:
    from captum_iglens._utils.display import layer_labels

    names = layer_labels(result.layer_indices, result.granularity)
    _, total, final = _row_names(result)
    w = max([6, *(len(name) for name in names)])
    lines = _head(result, cols, w)
    rule, signed = lines[-1], result.contrastive
    for j, name in enumerate(names):
        cells = "".join(
            f" {format_number(float(result.attributions[t, j])):>{_CELL}}"
            f" {format_number(float(result.lens_probs[t, j]), signed=signed):>{_CELL}} |"
            for t in cols
        )
        lines.append(f"{name:>{w}} |" + cells)
        if j == 0 and result.layer_indices[0] == 0 and len(names) > 1:
            lines.append(rule.replace("-", "·"))  # the move to h_0, apart from the blocks
    lines.append(rule)
    lens = _lens_terms(result)
    if lens is not None:  # the readout's changes, apart from the block terms above
        lines.append(f"{'':>{w}} |" + "".join(f" {'lens term':>{_CELL}} {'':>{_CELL}} |"
                                              for _ in cols))
        for j, name in enumerate(names):
            lines.append(f"{name:>{w}} |" + "".join(
                f" {format_number(float(lens[t, j])):>{_CELL}} {'':>{_CELL}} |" for t in cols))
        lines.append(rule)
    sums = [("sum", [float(result.attributions[t].sum()) for t in cols])]
    if lens is not None:
        sums.append(("lens", [float(lens[t].sum()) for t in cols]))
    for key, values in (
        *sums,
        (total, [float(result.delta_p[t]) for t in cols]),
        (final, [float(result.p_final[t]) for t in cols]),
    ):
        lines.append(f"{key:>{w}} |" + "".join(
            f" {format_number(v, digits=6):>{_TOKEN}} |" for v in values))
    # AtP's estimates do not add up, so no cumulative-credit onset is read from them
    onsets = ["n/a" if (o := result.onset_layers[t]) is None or result.effect == "atp" else
              names[result.layer_indices.index(o)] for t in cols]
    lines.append(f"{'onset':>{w}} |" + "".join(f" {o:>{_TOKEN}} |" for o in onsets))
    return lines + [""]


def _lens_terms(result: ResultView) -> Any:
    """``[T, k]`` lens terms of a per-layer readout, or None (the logit lens)."""
    return getattr(result, "lens_change", None)


def _onset_rule(result: ResultView, total: str) -> str:
    """The onset rule in words; ``total`` names what the credits add up to."""
    if result.effect == "atp":
        return "n/a: AtP estimates are not a decomposition, so no cumulative-credit onset"
    if _lens_terms(result) is not None:  # the lens terms are no layer's doing: left out
        total = "sum (the block terms' sum, lens terms left out)"
    return (f"first layer from which the cumulative credit stays at or beyond "
            f"{result.onset_frac:g}·{total}" if result.onset_rule == "sustained" else
            f"first layer holding {result.onset_frac:g} of the cumulative |credit|")


def _rule_name(result: ResultView) -> str:
    """`` (sustained rule)``; nothing where the onset is n/a (AtP)."""
    return "" if result.effect == "atp" else f" ({result.onset_rule} rule)"


def _contrast_legend(result: ResultView) -> list[str]:
    """The legend of a contrastive table: every value is ``F``, the foil under each token."""
    f, unit = (("log p(token) - log p(foil)", "nats") if result.units != "probability"
               else ("p(token) - p(foil)", "probability"))
    credit = {"total": "total-effect credit", "atp": "AtP estimate (not additive)"}.get(
        result.effect, "IG-Lens credit")
    level = ("logit-lens F(h_L)" if _lens_terms(result) is None
             else f"the {_lens_kind(result)} lens's F through g_L(h_L)")
    text = (f"Contrastive: every value is F = {f} ({unit}): why "
            f"the token rather than its foil, named under it ('vs'). {_credit_name(result)}: "
            f"the layer's {credit} to F; {_row_names(result)[0]}: {level} at that layer (a "
            "level, not a credit); sum: the credits' sum; ΔF: F minus F at the baseline, "
            "what the credits add up to; F: "
            f"the model's own F; onset: {_onset_rule(result, 'ΔF')}{_rule_name(result)}.")
    return textwrap.wrap(text, 100)


def _emb_legend(result: ResultView) -> list[str]:
    """What the ``b→emb`` row is, when layer 0 is chosen."""
    if not result.layer_indices or result.layer_indices[0] != 0:
        return []
    return textwrap.wrap(
        "b→emb (above the dotted line): the move from the baseline b to h_0, the embedding "
        "output: f(h_0) - f(b), which no decoder block made; the rows below it are the "
        "blocks' credits.", 100)


def _legend(result: ResultView) -> list[str]:
    if result.contrastive:
        return _contrast_legend(result) + _emb_legend(result) + _argmax_legend(result)
    unit = readout_words(result.units, False)
    lens, total, p = _row_names(result)
    credit, start, adds = (f"the layer's IG-Lens credit ({unit})", "the readout at the baseline",
                           "what the credits add up to")
    if result.effect == "total":
        credit = (f"the block's total-effect credit ({unit}), its exact share of {total}")
        start, adds = "F(0), every chosen update at the token at its reference", adds
    elif result.effect == "atp":
        credit = (f"the block's AtP estimate ({unit}) of the drop when its update alone goes to "
                  "its reference (first-order, not additive)")
        start, adds = ("F(0), every chosen update at the token at its reference",
                       "which the estimates need not add up to")
    readout, lens_words = "logit-lens readout f(h_L)", ""
    if _lens_terms(result) is not None:
        readout = f"the {_lens_kind(result)} lens's readout g_L(h_L)"
        credit = f"the layer's block term g_L(h_L) - g_L(h_(L-1)) ({unit})"
        adds = "what the credits and the lens terms add up to (sum + lens)"
        lens_words = ("; lens term (rows below the credits): g_L(h_(L-1)) - g_(L-1)(h_(L-1)), "
                      "the change of readout at a fixed residual (the baseline read at layer "
                      "0 first), no block's doing; lens: their sum")
    text = (f"{_credit_name(result)}: {credit}; {lens}: {readout} of the "
            f"token at that layer ({unit}; a level, not a credit); sum: the credits' sum"
            f"{lens_words}; "
            f"{total}: {p} minus {start} ({unit}), {adds}; {p}: the "
            f"model's own {'probability' if p == 'p' else 'log-probability'} of the token; "
            f"onset: {_onset_rule(result, total)}{_rule_name(result)}.")
    return textwrap.wrap(text, 100) + _emb_legend(result) + _argmax_legend(result)


def _lens_kind(result: ResultView) -> str:
    """The per-layer readout's kind and, for a fitted lens, its digest, in words."""
    found = getattr(result, "lens", None) or {}
    kind = str(found.get("kind") or "per-layer")
    return f"{kind} ({found['digest']})" if found.get("digest") else kind


def _argmax_legend(result: ResultView) -> list[str]:
    if result.is_argmax and not all(result.is_argmax):
        return textwrap.wrap("*: not the argmax of the explained forward (a given answer, or "
                             "generation and the teacher-forced forward differ).", 100)
    return []


def _completeness_lines(result: ResultView, total: str, kind: str) -> list[str]:
    """The completeness line; attribution patching's says its gap is not an error."""
    n_tok = len(result.tokens)
    if result.effect == "atp":
        return textwrap.wrap(
            "attribution patching (first-order estimates, not a decomposition): max |sum - "
            f"{total}| = {result.completeness_error:.3e} is the estimates' gap, not an error "
            f"({result.units}{kind})", 100)
    what = "total effect (gated block updates), " if result.effect == "total" else ""
    terms = "sum + lens" if _lens_terms(result) is not None else "sum"
    return textwrap.wrap(
        f"{what}completeness: max |{terms} - {total}| = {result.completeness_error:.3e} over "
        f"{n_tok} token{'' if n_tok == 1 else 's'} ({result.method}, {result.units}{kind})",
        100)


def format_explanation(result: ResultView, tokens_per_block: int = 4) -> str:
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
    total, kind = _row_names(result)[1], ", contrastive" if result.contrastive else ""
    lines += _completeness_lines(result, total, kind)
    lines += textwrap.wrap(f"baseline: {base}", 100)
    return "\n".join(lines)
