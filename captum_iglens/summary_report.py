"""The printed report of :class:`~captum_iglens.summary.RunSummary`, line by line."""

from __future__ import annotations

import math
import textwrap
from typing import Any

from captum_iglens.results._format import fmt, shorten

__all__ = ["WIDTH", "record_label", "report_lines"]

#: Columns of the printed report.
WIDTH = 100


def record_label(entry: dict) -> str:
    """How the report names a record: its ``id``, else ``#<index>``."""
    if entry.get("id") is not None:
        return str(entry["id"])
    return f"#{entry.get('index', '?')}"


def report_lines(s: Any) -> list[str]:
    """The lines of a :class:`~captum_iglens.summary.RunSummary`'s report.

    Counts, settings, the per-layer table, completeness, slowest and failed records.
    """
    lines = _head_lines(s) + [""] + _layer_lines(s) + [_completeness_line(s)]
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
        return ["no record was explained: no per-layer credit"]
    pct = f"{100 * s.confidence:g}%"
    ci_note = (f"{pct} CI: percentile bootstrap resampling records, their tokens pooled "
               f"({s.n_boot} resamples, seed {s.seed})" if s.n_ok > 1
               else "no CI: it needs at least 2 records")
    lines = [f"Per-layer mean credit over {_plural(s.n_tokens, 'token')} of "
             f"{_plural(s.n_ok, 'record')}", ci_note,
             f"  {'layer':<8}{'mean':>12}{pct + ' CI low':>14}{pct + ' CI high':>14}"
             f"{'onsets':>9}{'share':>8}"]
    total = max(s.n_tokens, 1)
    for name, mean, low, high, count in zip(s.layer_names, s.mean_credit, s.ci_low, s.ci_high,
                                            s.onset_counts, strict=True):
        share = count / total
        lines.append(f"  {shorten(name, 8):<8}{fmt(mean, '+.4g'):>12}{fmt(low, '+.4g'):>14}"
                     f"{fmt(high, '+.4g'):>14}{count:>9}{100 * share:>7.1f}% "
                     f"{'#' * round(20 * share)}")
    lines.append(f"  {'sum':<8}{fmt(math.fsum(s.mean_credit), '+.4g'):>12}   mean delta_p "
                 f"{fmt(s.mean_delta_p, '+.4g')}")
    return lines


def _completeness_line(s: Any) -> str:
    worst = ""
    if s.worst is not None and s.n_tokens:
        worst = f" (worst: record {_name(s.worst)}, token {s.worst['token']})"
    return (f"Completeness: max |sum of credits - delta_p| = "
            f"{s.max_abs_convergence_delta:.3g} over {_plural(s.n_tokens, 'token')}{worst}")


def _slow_lines(s: Any) -> list[str]:
    if not s.slowest:
        return []
    lines = ["", f"Slowest records ({s.total_seconds:.1f} s over all records):"]
    for r in s.slowest:
        lines.append(f"  {shorten(_name(r), 40):<40} {r['seconds']:>9.2f} s  {r['tokens']:>6} "
                     f"token{'s' if r['tokens'] != 1 else ''}")
    return lines


def _failure_lines(s: Any) -> list[str]:
    if not s.failures:
        return []
    lines = ["", f"Failed records ({len(s.failures)}):"]
    for f in s.failures:
        message = " ".join(str(f["error"]).split())
        lines.append(f"  {shorten(_name(f), 24):<24} {f['error_type']}: {message}")
    return lines


def _plural(n: int, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else 's'}"


def _name(entry: dict) -> str:
    return record_label(entry)
