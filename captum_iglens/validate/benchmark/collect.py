"""Read a benchmark run's cell files back without loading any model.

``iglens benchmark --tables-only`` writes the tables from the cell and lens files already in
an output folder: cells measured on other machines or in other sessions (the committed run
under ``benchmarks/benchmark_run/``), whose models and fitted lenses this machine may not
have. A cell file is used only when its stored fingerprint digest is what today's code gives
for its (family, task): the analysis code's and the pre-registration's hashes, the settings,
the task's pairs; only the weights digest is taken as recorded (reading it would need the
model). A lens file is used only when its digest is today's for its cell, its recorded lens,
the addendum and the lens-row code. Anything else is named and left out, never tabulated.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Mapping, Sequence

from captum_iglens.validate.benchmark import runner
from captum_iglens.validate.benchmark.decide import analysis_version
from captum_iglens.validate.pairs import PromptPair

__all__ = ["read_cells"]


def _read(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def _cell_mismatch(stored: Mapping[str, Any], expected: Mapping[str, Any]) -> str:
    """Which fingerprint entries differ (the digest alone says only that one does)."""
    keys = [k for k in expected if k != "weights" and stored.get(k) != expected[k]]
    return ", ".join(keys) or "digest"


def read_cells(out_dir: Path, cells_wanted: Sequence[tuple[str, str, Sequence[PromptPair]]],
               settings: Mapping[str, Any], lens_kinds: Sequence[str] = ()
               ) -> tuple[list[dict[str, Any]], list[dict[str, Any]], list[str]]:
    """The cells (and lens files) of ``out_dir/cells`` that today's code would reuse.

    Args:
        out_dir (Path): The benchmark's output folder.
        cells_wanted (sequence of (str, str, sequence of PromptPair)): ``(family, task,
            pairs)`` in table order: the family as its cell file names it (a model name in
            lower case, or a folder's name), the task's name and its pairs before filtering.
        settings (mapping): ``pairs``, ``n_boot``, ``seed``, ``captum_steps`` as the run
            used them (they are part of the fingerprint).
        lens_kinds (sequence of str, optional): Lens addendum kinds to read beside each cell.

    Returns:
        (list, list, list of str): the cells in ``cells_wanted`` order, their lens files, and
        one line for every file left out (missing, unreadable or another fingerprint) or used.
    """
    from captum_iglens.validate.benchmark.addendum import load_lens_addendum
    from captum_iglens.validate.benchmark.lens_rows import lens_fingerprint, lens_path

    analysis = analysis_version()
    addendum = load_lens_addendum()
    cells: list[dict[str, Any]] = []
    lens_cells: list[dict[str, Any]] = []
    notes: list[str] = []
    for family, task, pairs in cells_wanted:
        path = runner.cell_path(out_dir, family, task)
        cell = _read(path)
        stored = (cell or {}).get("fingerprint") or {}
        if not stored:
            notes.append(f"{family} / {task}: no readable cell file at {path} (left out)")
            continue
        expected = runner.fingerprint_entries(family, task, stored.get("weights"), analysis,
                                              settings, pairs)
        digest = stored.get("digest")
        if digest != runner.fingerprint_digest(stored):  # edited after it was written
            notes.append(f"{family} / {task}: {path.name}'s fingerprint does not match its "
                         "own digest (left out)")
            continue
        if runner.fingerprint_digest(expected) != digest:
            notes.append(f"{family} / {task}: {path.name} was made with another "
                         f"{_cell_mismatch(stored, expected)} (left out)")
            continue
        notes.append(f"{family} / {task}: read {path} (weights {stored['weights']} as "
                     "recorded)")
        cells.append(cell)
        for kind in lens_kinds:
            lpath = lens_path(out_dir, family, task, kind)
            found = _read(lpath)
            lstored = (found or {}).get("fingerprint") or {}
            again = lens_fingerprint(cell, kind, lstored.get("lens"), addendum)
            if not lstored or again["digest"] != lstored.get("digest"):
                notes.append(f"{family} / {task} / {kind} lens: no file with today's "
                             f"fingerprint at {lpath} (left out)")
                continue
            lens_cells.append(found)
    return cells, lens_cells, notes
