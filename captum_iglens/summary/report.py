"""The printed report of :class:`~captum_iglens.summary.pool.RunSummary`, line by line."""

from __future__ import annotations

import math
import textwrap
from typing import Any, Sequence

from captum_iglens._utils.format import fmt, shorten, total_symbol
from captum_iglens.settings import settings_from_record

__all__ = ["ATP_ONSET_NOTE", "WIDTH", "column_format", "has_onsets", "record_label",
           "record_name", "report_lines"]

#: Columns of the printed report.
WIDTH = 100


#: Why a summary of attribution-patching records pools no onset layer.
ATP_ONSET_NOTE = ("onsets: n/a for AtP (first-order estimates, not a decomposition): no "
                  "onset layer is pooled")


def has_onsets(record: dict) -> bool:
    """Whether a result record's onset layers mean something (not for ``effect="atp"``)."""
    return settings_from_record(record).effect != "atp"


def record_label(entry: dict) -> str:
    """A record in a list of ids: its ``id``, else ``#<index>``."""
    if entry.get("id") is not None:
        return str(entry["id"])
    return f"#{entry.get('index', '?')}"


def record_name(entry: dict) -> str:
    """A record in a sentence: ``record id '3'``, or ``record #3 (index)`` without an id."""
    if entry.get("id") is not None:
        return f"record id '{entry['id']}'"
    return f"record #{entry.get('index', '?')} (index)"


def column_format(values: Sequence[float]) -> str:
    """One format spec for a column of signed numbers, so that its rows line up.

    Fixed point with 4 to 6 decimals, enough for 3 significant digits of the smallest
    non-zero magnitude; scientific (``+.3e``) where that would need more than 6 decimals or
    a magnitude reaches 10,000. NaN (shown as ``-``) is ignored.
    """
    sizes = [abs(v) for v in values if v is not None and math.isfinite(v) and v != 0.0]
    if not sizes:
        return "+.4f"
    if min(sizes) < 1e-4 or max(sizes) >= 1e4:
        return "+.3e"
    return f"+.{max(4, 2 - math.floor(math.log10(min(sizes))))}f"


def report_lines(s: Any) -> list[str]:
    """The lines of a :class:`~captum_iglens.summary.pool.RunSummary`'s report.

    Counts, settings, the per-layer table, completeness, slowest batches, failed records.
    """
    lines = _head_lines(s) + [""] + _layer_lines(s) + _completeness_lines(s)
    return lines + _slow_lines(s) + _failure_lines(s)


def _head_lines(s: Any) -> list[str]:
    docs = f" ({s.n_documents} in document mode)" if s.n_documents else ""
    lines = [f"IG-Lens run: {_plural(s.n_ok, 'record')} explained, {s.n_failed} failed, "
             f"{_plural(s.n_tokens, 'token')}{docs}"]
    if s.torn:
        lines.append(f"skipped {_plural(s.torn, 'torn line')} (a run killed mid-write)")
    shown = [f"{name.replace('_', ' ')} {', '.join(str(v) for v in values)}"
             for name, values in s.settings.items() if values]
    lines += textwrap.wrap(" | ".join(shown), WIDTH) if shown else []
    mixed = [name for name, values in s.settings.items() if len(values) > 1]
    if mixed:
        lines.append(f"note: the records differ in {', '.join(mixed)}; they are pooled anyway")
    if s.layers:
        lines.append(f"{s.credit_words}, {len(s.layers)} layers")
    return lines


def _layer_lines(s: Any) -> list[str]:
    if not s.layers:
        return ["no record was explained: no per-layer credit"]  # of any effect
    pct = f"{100 * s.confidence:g}%"
    ci_note = (f"{pct} CI: percentile bootstrap resampling records, their tokens pooled "
               f"({s.n_boot} resamples, seed {s.seed})" if s.n_ok > 1
               else "no CI: it needs at least 2 records")
    total_sum = math.fsum(s.mean_credit)
    lens = getattr(s, "mean_lens_change", None)
    spec = column_format([*s.mean_credit, *s.ci_low, *s.ci_high, total_sum, s.mean_delta_p,
                          *(lens or [])])
    lines = [f"Per-layer mean {getattr(s, 'credit_name', 'credit')} over "
             f"{_plural(s.n_tokens, 'token')} of "
             f"{_plural(s.n_ok, 'record')} ({_unit(s)})", ci_note,
             f"  {'layer':<8}{'mean':>12}{pct + ' CI low':>14}{pct + ' CI high':>14}"
             f"{'onsets':>9}{'share':>8}" + (f"{'lens term':>12}" if lens else "")]
    total, atp = max(s.n_tokens, 1), getattr(s, "effect", "readout") == "atp"
    for j, (name, mean, low, high, count) in enumerate(zip(
            s.layer_names, s.mean_credit, s.ci_low, s.ci_high, s.onset_counts, strict=True)):
        share = count / total
        lens_cell = f"{fmt(lens[j], spec):>12}" if lens else ""
        onset = f"{'n/a':>9}{'n/a':>8}" if atp else f"{count:>9}{100 * share:>7.1f}%"
        lines.append(f"  {shorten(name, 8):<8}{fmt(mean, spec):>12}{fmt(low, spec):>14}"
                     f"{fmt(high, spec):>14}{onset}{lens_cell} "
                     f"{'' if atp else '#' * round(20 * share)}".rstrip())
    lens_sum = f" + mean lens terms {fmt(math.fsum(lens), spec)}" if lens else ""
    lines.append(f"  {'sum':<8}{fmt(total_sum, spec):>12}{lens_sum}   mean "
                 f"{total_symbol(s.units, s.contrastive)} {fmt(s.mean_delta_p, spec)}")
    if atp:
        lines.append(f"  {ATP_ONSET_NOTE}")
    if lens:
        lines.append("  lens term: the readout's change at a fixed residual, g_L(h_(L-1)) - "
                     "g_(L-1)(h_(L-1)); no block's doing")
    return lines


def _unit(s: Any) -> str:
    return "probability" if s.units == "probability" else "nats"


def _completeness_lines(s: Any) -> list[str]:
    worst = ""
    if s.worst is not None and s.n_tokens:
        worst = f" (worst: {record_name(s.worst)}, token {s.worst['token']})"
    effect = getattr(s, "effect", "readout")
    total = total_symbol(s.units, s.contrastive)
    if effect == "atp":
        text = (f"Attribution patching (first-order estimates, not a decomposition): max |sum "
                f"- {total}| = {s.max_abs_convergence_delta:.3g} {_unit(s)} over "
                f"{_plural(s.n_tokens, 'token')} is the estimates' gap, not an error{worst}")
        return textwrap.wrap(text, WIDTH, subsequent_indent="  ")
    what = "Total effect (gated block updates): completeness" if effect == "total" \
        else "Completeness"
    terms = "sum of credits + lens terms" if getattr(s, "mean_lens_change", None) \
        else "sum of credits"
    text = (f"{what}: max |{terms} - {total}| = "
            f"{s.max_abs_convergence_delta:.3g} {_unit(s)} over "
            f"{_plural(s.n_tokens, 'token')}{worst}")
    return textwrap.wrap(text, WIDTH, subsequent_indent="  ")


def _slow_lines(s: Any) -> list[str]:
    if not s.slowest_batches:
        return []
    lines = ["", f"Slowest batches ({s.total_seconds:.1f} s over all records; the records of a "
             "batch share its time):"]
    for b in s.slowest_batches:
        who = (record_name({"id": b["ids"][0], "index": b["indices"][0]}) if b["records"] == 1
               else _ids_words(b, WIDTH - 38))
        lines.append(f"  {b['seconds']:>9.2f} s {_plural(b['records'], 'record'):>11} "
                     f"{_plural(b['tokens'], 'token'):>11}  {shorten(who, WIDTH - 38)}")
    return lines


def _ids_words(batch: dict, width: int) -> str:
    """``ids 'a', 'b' and 3 more`` of a batch, within ``width`` characters when it can.

    A record without an id is named ``#<index>``.
    """
    names = [f"'{i}'" if i is not None else f"#{n}"
             for i, n in zip(batch["ids"], batch["indices"], strict=True)]
    for shown in range(len(names), 0, -1):
        rest = len(names) - shown
        text = "ids " + ", ".join(names[:shown]) + (f" and {rest} more" if rest else "")
        if len(text) <= width or shown == 1:
            return text
    return "ids"


def _failure_lines(s: Any) -> list[str]:
    if not s.failures:
        return []
    lines = ["", f"Failed records ({len(s.failures)}):"]
    for f in s.failures:
        message = " ".join(str(f["error"]).split())
        lines.append(f"  {shorten(record_name(f), 30):<30} {f['error_type']}: {message}")
    return lines


def _plural(n: int, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else 's'}"
