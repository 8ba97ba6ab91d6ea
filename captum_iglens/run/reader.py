"""Reading a results file back: every record, checked line by line, from one run."""

from __future__ import annotations

import warnings
from collections import Counter
from pathlib import Path
from typing import Any, Mapping, Sequence, Union

from captum_iglens.run.results_file import NotAResultsFile, RunMismatchError, _json

__all__ = ["check_one_run", "load_results"]

_STATUSES = ("ok", "error")


def load_results(path: Union[str, Path]) -> tuple[list[dict], list[dict], int]:
    """Read a results ``.jsonl`` file of ``iglens run``.

    Blank lines are ignored. A line that is not a complete JSON object is a torn write
    (a run killed mid-write): it is skipped with a warning and never read as data. Only the
    last line should be torn; a torn line followed by more lines (a resumed run) is
    skipped too, with a warning that says so.

    Args:
        path (str or Path): The results file (UTF-8 JSON lines).

    Returns:
        (records, errors, torn): the ``"ok"`` lines and the ``"error"`` lines as dicts, in
        file order, and the number of torn lines skipped.

    Raises:
        OSError: the file cannot be read.
        NotAResultsFile: (a ValueError) the file is one JSON document over several lines
            (the ``--json`` of ``iglens explain``), no line is a JSON object and not every
            line starts as one (the file never was a results file), or the first complete line
            is not a result line.
        ValueError: a later complete JSON line that is not a result line (no object, or a
            ``status`` other than ``"ok"`` / ``"error"``), or a file without any result
            line.
    """
    raw = Path(path).read_bytes()
    lines = raw.split(b"\n")
    parsed = [(n, line, _json(line)) for n, line in enumerate(lines, 1) if line.strip()]
    if len(parsed) > 1 and isinstance(_json(raw), dict):  # JSON lines never parse whole
        raise NotAResultsFile(
            f"{path} is one JSON document over {len(parsed)} lines (the --json output of "
            "'iglens explain'?), not the JSON lines of 'iglens run': give the --output file "
            "of a run")
    _check_is_results(parsed, path)
    records: list[dict] = []
    errors: list[dict] = []
    torn = 0
    for n, line, entry in parsed:
        if entry is None:
            torn += 1
            warnings.warn(_torn_message(path, n, line, last=n == parsed[-1][0]), stacklevel=2)
            continue
        _check_entry(entry, path, n)
        (records if entry["status"] == "ok" else errors).append(entry)
    if not records and not errors:
        raise ValueError(f"{path}: no result line (expected the JSON lines of 'iglens run')")
    _warn_duplicate_ids(records + errors, path)
    return records, errors, torn


def _check_is_results(parsed: list[tuple[int, bytes, Any]], path: Union[str, Path]) -> None:
    """Refuse a file that is not a results file before any torn-line warning.

    A run killed in its first write leaves lines that start as JSON objects; a file none of
    whose lines parses, some not even starting as an object, never was a results file.

    Raises:
        NotAResultsFile: no line parses and some line does not start with ``{``, or the
            first complete JSON line is not a result line.
    """
    complete = [(n, entry) for n, _, entry in parsed if entry is not None]
    if not complete and any(not line.lstrip().startswith(b"{") for _, line, _ in parsed):
        raise NotAResultsFile(
            f"{path} is not a results file of 'iglens run': none of its {len(parsed)} "
            "non-blank lines parses as a JSON record (give the --output file of a run)")
    if complete:
        try:
            _check_entry(complete[0][1], path, complete[0][0])
        except ValueError as err:
            raise NotAResultsFile(str(err)) from None


def _torn_message(path: Union[str, Path], n: int, line: bytes, last: bool) -> str:
    where = ("the torn last line" if last else
             "a torn line followed by more lines (was the run resumed after a kill?)")
    return (f"{path}: skipped line {n}, {where}: {len(line)} bytes that are not a complete "
            "JSON object")


def _check_entry(entry: Any, path: Union[str, Path], n: int) -> None:
    """Raise ValueError unless ``entry`` is an object with status ``"ok"`` or ``"error"``."""
    if not isinstance(entry, dict):
        raise ValueError(f"{path}, line {n}: expected a JSON object, got "
                         f"{type(entry).__name__} (is this a results file of 'iglens run'?)")
    if entry.get("status") not in _STATUSES:
        raise ValueError(f"{path}, line {n}: 'status' is {entry.get('status')!r}, expected "
                         "'ok' or 'error' (is this a results file of 'iglens run'?)")


def _warn_duplicate_ids(entries: list[dict], path: Union[str, Path]) -> None:
    counts = Counter(repr(entry.get("id")) for entry in entries if entry.get("id") is not None)
    repeated = [key for key, count in counts.items() if count > 1]
    if repeated:
        warnings.warn(f"{path}: ids appear more than once ({', '.join(repeated[:5])}"
                      f"{' ...' if len(repeated) > 5 else ''}): each line is summarized as its "
                      "own record", stacklevel=3)


def check_one_run(records: Sequence[Mapping[str, Any]]) -> None:
    """Refuse to pool records that different runs (fingerprints) produced.

    Records without a fingerprint (files from before fingerprints) form a group of their own.

    Raises:
        RunMismatchError: naming each run's model, digest and first ids, and how to pool
            them anyway.
    """
    groups: dict[str, list[str]] = {}
    models: dict[str, str] = {}
    for record in records:
        run = record.get("run")
        digest = str(run.get("digest")) if isinstance(run, Mapping) else "none recorded"
        groups.setdefault(digest, []).append(repr(record.get("id")))
        models.setdefault(digest, str(run.get("model")) if isinstance(run, Mapping) else "?")
    if len(groups) <= 1:
        return
    parts = [f"run {digest} (model {models[digest]}): ids {', '.join(ids[:4])}"
             + (f" and {len(ids) - 4} more" if len(ids) > 4 else "")
             for digest, ids in groups.items()]
    raise RunMismatchError(
        f"the records come from {len(groups)} different runs (model, weights or settings): "
        f"{'; '.join(parts)}. Their numbers are not one population: summarize each run's "
        "file on its own, or pool them anyway with --allow-mixed-runs (mixed_runs=True).")
