"""Read a benchmark run's cell files back without loading any model.

``iglens benchmark --tables-only`` writes the tables from the cell and lens files already in
an output folder: cells measured on other machines or in other sessions (the committed run
under ``benchmarks/benchmark_run/``), whose models and fitted lenses this machine may not
have. A cell file is used only when its stored fingerprint digest is what today's code gives
for its (family, task): the analysis code's and the pre-registration's hashes, the settings,
the task's pairs; only the weights digest is taken as recorded (reading it would need the
model). A lens file is used only when its digest is today's for its cell, its recorded lens,
the addendum and the lens-row code. The fingerprint vouches for a file's inputs, not for its
numbers: every cell's scores, curves, magnitude and verdicts are recomputed from the
measurements stored beside it (``.measurements.json.gz``) by today's analysis, and every lens
file's from its stored rows and those measurements (:func:`verify_cell`, a few seconds a cell);
a file whose recorded numbers are not what its measurements give, that lacks its
measurements, or that is not a cell file at all is named and left out, never tabulated.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, Mapping, Optional, Sequence

import numpy as np

from captum_iglens.validate.benchmark import runner
from captum_iglens.validate.benchmark.decide import analysis_version
from captum_iglens.validate.benchmark.fingerprint import fingerprint_digest, fingerprint_entries
from captum_iglens.validate.pairs import PromptPair

__all__ = ["REL", "first_difference", "read_cells", "verify_cell", "verify_lens_cell"]


#: Relative tolerance between a recorded number and its re-analysis. Every stored number is
#: a mean, a bootstrap quantile or an infidelity of float64 values that the same code sums in
#: the same order; across CPUs only the SIMD width of numpy's pairwise summation may differ, a
#: few float64 ulps per addition over at most 50,000 resampled terms: 50,000 * 2.2e-16 =
#: 1.1e-11 relative.
REL = 1e-10
#: The parts of a cell file that are computed from its measurements.
CELL_RESULTS = ("scores", "curves", "magnitude", "hypotheses")
#: The parts of a lens file that are computed from its rows and the cell's measurements.
LENS_RESULTS = ("scores", "magnitude", "hypotheses")
_CELL_KEYS = ("family", "task", "seeds", "fingerprint", *CELL_RESULTS)
#: Every key a cell file holds (anything else would be carried into benchmark.json unchecked).
_CELL_ALL_KEYS = frozenset((*_CELL_KEYS, "counts", "clusters", "check_errors",
                            "predictor_errors"))
#: Every key a lens file with status "ok" holds.
_LENS_OK_KEYS = frozenset(("family", "task", "kind", "name", "fingerprint", "status", "rows",
                           "lens_change", *LENS_RESULTS))


def first_difference(stored: Any, fresh: Any, where: str = "") -> Optional[str]:
    """Where two result trees first differ (None when every number agrees within :data:`REL`).

    Args:
        stored (any): Recorded JSON values (dicts, lists, numbers, strings, None).
        fresh (any): The same recomputed.
        where (str, optional): The path of ``stored`` in its file, for the message.

    Returns:
        str or None: ``"path: recorded X, recomputed Y"`` for the first difference (a key of
        ``stored`` missing from ``fresh`` or the reverse, a length, a string, a number beyond
        :data:`REL` relative or 1e-14 absolute), or None.
    """
    if isinstance(stored, dict):
        return _mapping_difference(stored, fresh, where)
    if isinstance(stored, list):
        if not isinstance(fresh, (list, tuple)) or len(stored) != len(fresh):
            return f"{where}: recorded {len(stored)} values, recomputed {fresh!r:.60}"
        for i, (a, b) in enumerate(zip(stored, fresh, strict=True)):
            found = first_difference(a, b, f"{where}[{i}]")
            if found:
                return found
        return None
    return _leaf_difference(stored, fresh, where)


def _mapping_difference(stored: Mapping[str, Any], fresh: Any, where: str) -> Optional[str]:
    if not isinstance(fresh, dict):
        return f"{where}: recorded a mapping, recomputed {type(fresh).__name__}"
    for key in sorted(set(stored) ^ set(fresh)):
        side = "recorded only" if key in stored else "recomputed only"
        return f"{where}/{key}: {side}"
    for key, value in stored.items():
        found = first_difference(value, fresh[key], f"{where}/{key}")
        if found:
            return found
    return None


def _leaf_difference(stored: Any, fresh: Any, where: str) -> Optional[str]:
    differ = f"{where}: recorded {stored!r}, recomputed {fresh!r}"
    if any(isinstance(v, (bool, int, str, dict, list)) or v is None for v in (stored, fresh)):
        # counts (n, tokens, clusters) are exact: 24.0000000001 is not 24
        return None if stored == fresh and type(stored) is type(fresh) else differ
    try:
        a, b = float(stored), float(fresh)
    except (TypeError, ValueError):
        return differ
    if math.isnan(a) or math.isnan(b):
        return None if math.isnan(a) and math.isnan(b) else differ
    return None if math.isclose(a, b, rel_tol=REL, abs_tol=1e-14) else differ


def _as_json(value: Any) -> Any:
    """A result tree as its file would hold it (numpy scalars and arrays as JSON values)."""
    return json.loads(json.dumps(runner._lists(value), allow_nan=True,
                                 default=lambda o: o.tolist()))


def verify_cell(cell: Any, cell_file: Path, n_boot: int, seed: int, family: str, task: str,
                pairs: Sequence[PromptPair]) -> tuple[Optional[str], Optional[dict[str, Any]]]:
    """Recompute a cell's results from its stored measurements and compare them.

    Args:
        cell (any): The cell file's content.
        cell_file (Path): Its path (its measurements lie beside it).
        n_boot (int): Resamples of the tables' 95% intervals (the run's ``--n-boot``).
        seed (int): The run's first seed (the robustness seeds follow it).
        family (str): The family the file is read for (as its file name says).
        task (str): The task it is read for.
        pairs (sequence of PromptPair): The task's pairs before filtering.

    Returns:
        (str or None, dict or None): why the cell cannot be used (not a cell file, another
        family or task, its seeds not the run's, its measurements missing, unreadable or of
        other pairs, or the first recorded number its measurements do not give), or None;
        and the measurements as arrays when read.
    """
    try:
        return _verify_cell(cell, cell_file, n_boot, seed, family, task, pairs)
    except Exception as err:  # a malformed file is named, never a crash
        return f"could not be checked ({type(err).__name__}: {err})", None


def _verify_cell(cell: Any, cell_file: Path, n_boot: int, seed: int, family: str, task: str,
                 pairs: Sequence[PromptPair]
                 ) -> tuple[Optional[str], Optional[dict[str, Any]]]:
    from captum_iglens.validate.benchmark.analysis import analyse
    from captum_iglens.validate.benchmark.decide import load_preregistration
    from captum_iglens.validate.benchmark.lens_rows import read_measurements

    prereg = load_preregistration()
    shape = _cell_shape_problem(cell, family, task, prereg, seed)
    if shape:
        return shape, None
    heavy = Path(cell_file).with_suffix(".measurements.json.gz")
    try:
        data = read_measurements(cell_file)
    except Exception as err:  # gzip, zlib and JSON errors alike
        return (f"its measurements {heavy.name} could not be read "
                f"({type(err).__name__}: {err})", None)
    ids = {p.id for p in pairs}
    strays = [i for i in data["pair_ids"] if i not in ids]
    if strays:
        return (f"its measurements {heavy.name} are of pairs not in the task "
                f"({len(strays)}, the first {strays[0]!r})", None)
    fresh = analyse(data, prereg, n_boot, cell["seeds"])
    for part in CELL_RESULTS:
        found = first_difference(cell[part], _as_json(fresh[part]), part)
        if found:
            return (f"its recorded numbers are not its measurements re-analysed by today's "
                    f"code ({found})", data)
    found = first_difference(_recorded(cell), _as_json(_derived(data, len(pairs))), "")
    if found:
        return f"its recorded counts are not its measurements' ({found.lstrip('/')})", data
    return None, data


def _cell_shape_problem(cell: Any, family: str, task: str, prereg: Any,
                        seed: int) -> Optional[str]:
    """Why ``cell`` is not a cell file of (family, task) with the run's seeds, or None."""
    if not isinstance(cell, dict) or any(k not in cell for k in _CELL_KEYS) or any(
            not isinstance(cell[k], dict) for k in CELL_RESULTS):
        got = sorted(cell) if isinstance(cell, dict) else type(cell).__name__
        return (f"not a cell file (a cell holds {', '.join(_CELL_KEYS)}, the last four "
                f"mappings; found {got})")
    extra = sorted(set(cell) - _CELL_ALL_KEYS)
    if extra:
        return f"keys a cell file does not hold: {', '.join(map(str, extra))}"
    if (cell["family"], cell["task"]) != (family, task):
        return f"a cell of {cell['family']} / {cell['task']}, not of {family} / {task}"
    missing = [h["id"] for h in prereg.hypotheses if h["id"] not in cell["hypotheses"]]
    if missing:
        return f"no verdict for {', '.join(missing)}"
    if cell["seeds"] != runner.seeds_of(prereg, seed):
        return f"seeds {cell['seeds']}, not the run's {runner.seeds_of(prereg, seed)}"
    return None


def _recorded(cell: Mapping[str, Any]) -> dict[str, Any]:
    """What a cell file records about its measurements beside the results."""
    counts = cell.get("counts")
    counts = counts if isinstance(counts, dict) else {}
    funnel = [counts.get(k) for k in ("given", "aligned", "answered", "used")]
    steps = [int(v) for v in funnel if isinstance(v, int)]
    ordered = len(steps) == 4 and steps == sorted(steps, reverse=True)
    return {"count keys": sorted(map(str, counts)),
            "given": counts.get("given"), "used": counts.get("used"),
            "given >= aligned >= answered >= used": ordered,
            **{k: cell.get(k) for k in ("clusters", "check_errors", "predictor_errors")}}


def _derived(data: Mapping[str, Any], given: int) -> dict[str, Any]:
    """The same, read off the measurements and the task's ``given`` pairs.

    The pairs aligned and answered before the cell's ``--max-pairs`` cut need the model's
    tokenizer and answers: they are only checked to lie between the pairs given and used.
    """
    return {"count keys": ["aligned", "answered", "given", "used"],
            "given": given, "used": len(data["pair_ids"]),
            "given >= aligned >= answered >= used": True,
            "clusters": {k: len(set(np.asarray(v).tolist()))
                         for k, v in data["clusters"].items()},
            "check_errors": data["check_errors"],
            "predictor_errors": data["predictor_errors"]}


def verify_lens_cell(found: Any, cell: Mapping[str, Any], data: Mapping[str, Any], kind: str,
                     n_boot: int) -> Optional[str]:
    """Recompute a lens file's results from its rows and the cell's measurements.

    Args:
        found (any): The lens file's content (its fingerprint already matched).
        cell (mapping): Its cell (verified).
        data (mapping): The cell's measurements as arrays.
        kind (str): The lens kind.
        n_boot (int): Resamples of the tables' 95% intervals.

    Returns:
        str or None: why the lens file cannot be used (not a lens file of this cell and kind,
        "n/a" with a fitted lens recorded or "ok" without, or the first recorded number its
        rows do not give), or None.
    """
    try:
        return _verify_lens_cell(found, cell, data, kind, n_boot)
    except Exception as err:  # a malformed file is named, never a crash
        return f"could not be checked ({type(err).__name__}: {err})"


def _verify_lens_cell(found: Any, cell: Mapping[str, Any], data: Mapping[str, Any], kind: str,
                      n_boot: int) -> Optional[str]:
    from captum_iglens.validate.benchmark.addendum import lens_predictor, load_lens_addendum
    from captum_iglens.validate.benchmark.lens_rows import _not_available, score_rows

    addendum = load_lens_addendum()
    name = lens_predictor(addendum, kind)["name"]
    ids = [h["id"] for h in addendum.hypotheses if h["predictor"] == name]
    head = {"family": cell["family"], "task": cell["task"], "kind": kind, "name": name}
    if not isinstance(found, dict) or any(found.get(k) != v for k, v in head.items()) \
            or not isinstance(found.get("hypotheses"), dict) \
            or any(not isinstance(found["hypotheses"].get(i), dict) for i in ids):
        return (f"not the {kind} lens file of {cell['family']} / {cell['task']} (its family, "
                f"task, kind or name differ, or a verdict of {', '.join(ids)} is missing)")
    lens = found["fingerprint"].get("lens")
    if found.get("status") == "n/a":  # exactly what run_lens_cell writes without a lens
        expected = {**head, "fingerprint": found["fingerprint"],
                    **_not_available(addendum, name, str(found.get("message")))}
        diff = None if lens is None else "fingerprint/lens: recorded, with status n/a"
        diff = diff or first_difference(found, expected)
        return f"not an n/a lens file as the benchmark writes one ({diff})" if diff else None
    if found.get("status") != "ok" or not isinstance(lens, dict) \
            or set(found) != _LENS_OK_KEYS \
            or any(not isinstance(found.get(k), dict) for k in ("rows", *LENS_RESULTS)):
        return (f"not a {kind} lens file (status {found.get('status')!r}, no lens recorded, "
                "no rows, or keys a lens file does not hold)")
    rows = {g: np.asarray(v, np.float64) for g, v in found["rows"].items()}
    fresh = score_rows(data, rows, name, addendum, n_boot, cell["seeds"])
    for part in LENS_RESULTS:
        diff = first_difference(found[part], _as_json(fresh[part]), part)
        if diff:
            return ("its recorded numbers are not its rows re-scored against the cell's "
                    f"measurements ({diff})")
    return None


def _lens_fingerprint_matches(found: Any, cell: Mapping[str, Any], kind: str,
                              addendum: Any) -> bool:
    """Whether a lens file's stored fingerprint is today's for its cell and recorded lens."""
    from captum_iglens.validate.benchmark.lens_rows import lens_fingerprint

    stored = found.get("fingerprint") if isinstance(found, dict) else None
    if not isinstance(stored, dict) or not stored \
            or not (stored.get("lens") is None or isinstance(stored.get("lens"), dict)):
        return False
    try:
        again = lens_fingerprint(cell, kind, stored.get("lens"), addendum)
    except (TypeError, ValueError, AttributeError):  # a malformed recorded lens
        return False
    return again["digest"] == stored.get("digest")


def _read(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError):  # RecursionError: absurdly nested JSON
        return None


def _cell_mismatch(stored: Mapping[str, Any], expected: Mapping[str, Any]) -> str:
    """Which fingerprint entries differ (the digest alone says only that one does)."""
    keys = [k for k in expected if k != "weights" and stored.get(k) != expected[k]]
    return ", ".join(keys) or "digest"


def read_cells(out_dir: Path, cells_wanted: Sequence[tuple[str, str, Sequence[PromptPair]]],
               settings: Mapping[str, Any], lens_kinds: Sequence[str] = (),
               progress: bool = False
               ) -> tuple[list[dict[str, Any]], list[dict[str, Any]], list[str], list[str]]:
    """The cells (and lens files) of ``out_dir/cells`` that today's code would reuse.

    Args:
        out_dir (Path): The benchmark's output folder.
        cells_wanted (sequence of (str, str, sequence of PromptPair)): ``(family, task,
            pairs)`` in table order: the family as its cell file names it (a model name in
            lower case, or a folder's name), the task's name and its pairs before filtering.
        settings (mapping): ``pairs``, ``n_boot``, ``seed``, ``captum_steps`` as the run
            used them (they are part of the fingerprint).
        lens_kinds (sequence of str, optional): Lens addendum kinds to read beside each cell.
        progress (bool, optional): A progress bar over the cells. Default: False.

    Returns:
        (list, list, list of str, list of str): the cells in ``cells_wanted`` order, their
        lens files, one line for every file used, and one for every file left out (missing,
        not a cell or lens file, another fingerprint, no readable measurements, or recorded
        numbers that its measurements do not give).
    """
    from tqdm.auto import tqdm

    from captum_iglens.validate.benchmark.addendum import load_lens_addendum
    from captum_iglens.validate.benchmark.lens_rows import lens_path

    analysis = analysis_version()
    addendum = load_lens_addendum()
    cells: list[dict[str, Any]] = []
    lens_cells: list[dict[str, Any]] = []
    used: list[str] = []
    left_out: list[str] = []
    for family, task, pairs in tqdm(cells_wanted, desc="re-analyse", unit="cell",
                                    disable=not progress):
        path = runner.cell_path(out_dir, family, task)
        cell = _read(path)
        stored = cell.get("fingerprint") if isinstance(cell, dict) else None
        if not isinstance(stored, dict) or not stored:
            left_out.append(f"{family} / {task}: no readable cell file with a fingerprint "
                            f"at {path}")
            continue
        expected = fingerprint_entries(family, task, stored.get("weights"), analysis,
                                              settings, pairs)
        digest = stored.get("digest")
        if digest != fingerprint_digest(stored):  # edited after it was written
            left_out.append(f"{family} / {task}: {path.name}'s fingerprint does not match "
                            "its own digest")
            continue
        if fingerprint_digest(expected) != digest:
            left_out.append(f"{family} / {task}: {path.name} was made with another "
                            f"{_cell_mismatch(stored, expected)}")
            continue
        problem, data = verify_cell(cell, path, int(settings["n_boot"]),
                                    int(settings["seed"]), family, task, pairs)
        if problem:
            left_out.append(f"{family} / {task}: {path.name}: {problem}")
            continue
        used.append(f"{family} / {task}: read {path} (weights {stored['weights']} as "
                    "recorded; its numbers re-analysed from its measurements agree)")
        cells.append(cell)
        for kind in lens_kinds:
            lpath = lens_path(out_dir, family, task, kind)
            found = _read(lpath)
            if not _lens_fingerprint_matches(found, cell, kind, addendum):
                left_out.append(f"{family} / {task} / {kind} lens: no file with today's "
                                f"fingerprint at {lpath}")
                continue
            problem = verify_lens_cell(found, cell, data or {}, kind,
                                       int(settings["n_boot"]))
            if problem:
                left_out.append(f"{family} / {task} / {kind} lens: {lpath.name}: {problem}")
                continue
            used.append(f"{family} / {task} / {kind} lens: " + (
                "its numbers re-scored from its rows agree" if found["status"] == "ok" else
                "n/a (no fitted lens), as the benchmark writes it"))
            lens_cells.append(found)
    return cells, lens_cells, used, left_out
