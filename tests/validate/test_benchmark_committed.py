"""The committed benchmark cells are what today's analysis code makes of their measurements.

``benchmarks/benchmark_run/cells/`` holds each real cell's scores, verdicts and, beside them,
the raw measurements they were computed from. Re-analysing the measurements with the package's
``analyse`` (the same pre-registration, bootstrap resamples and seeds) must give back every
stored score and every verdict: a change to the analysis that would move a published number
fails here instead of leaving the README's tables stale. No model is loaded; the decisions'
50,000 bootstrap resamples make it about half a minute a cell on a 2-core CPU, hence ``slow``.
"""

from __future__ import annotations

import gzip
import json
import math
import shutil
from pathlib import Path
from typing import Any

import pytest

from captum_iglens.validate.benchmark.analysis import analyse
from captum_iglens.validate.benchmark.decide import load_preregistration
from captum_iglens.validate.benchmark.runner import _arrays

CELLS = Path(__file__).resolve().parents[2] / "benchmarks" / "benchmark_run" / "cells"
CELL_FILES = sorted(p for p in CELLS.glob("*.json") if "__lens-" not in p.name)

# Every stored number is a mean, a bootstrap quantile or an infidelity of float64 values
# that the same code sums in the same order; across CPUs only the SIMD width of numpy's
# pairwise summation may differ, a few float64 ulps per addition over at most 50,000
# resampled terms: 50,000 * 2.2e-16 = 1.1e-11 relative.
REL = 1e-10


def _same(stored: Any, fresh: Any, where: str) -> None:
    if isinstance(stored, dict):
        assert isinstance(fresh, dict), where
        missing = set(stored) - set(fresh)
        assert not missing, f"{where}: {sorted(missing)} not recomputed"
        for key, value in stored.items():
            _same(value, fresh[key], f"{where}/{key}")
    elif isinstance(stored, list):
        assert len(stored) == len(fresh), where
        for i, (a, b) in enumerate(zip(stored, fresh, strict=True)):
            _same(a, b, f"{where}[{i}]")
    elif isinstance(stored, bool) or stored is None or isinstance(stored, str):
        assert stored == fresh, f"{where}: stored {stored!r}, recomputed {fresh!r}"
    elif isinstance(stored, (int, float)):
        a, b = float(stored), float(fresh)
        if math.isnan(a):
            assert math.isnan(b), f"{where}: stored NaN, recomputed {b}"
        else:
            assert math.isclose(a, b, rel_tol=REL, abs_tol=1e-14), (
                f"{where}: stored {a!r}, recomputed {b!r}")
    else:  # pragma: no cover - a new type in the cell files
        raise TypeError(f"{where}: unexpected {type(stored).__name__}")


def test_the_committed_run_has_cells() -> None:
    assert len(CELL_FILES) >= 6, f"no benchmark cells under {CELLS}"


def test_the_committed_tables_are_the_committed_cells_tabulated(tmp_path, capsys) -> None:
    """benchmark.md is what ``--tables-only`` writes from the committed cell and lens files
    (no model loaded), byte for byte: no table was edited by hand or left stale, and every
    cell file carries today's fingerprint (analysis code, pre-registration, settings, pairs).
    """
    from captum_iglens.cli import main
    from captum_iglens.validate.benchmark.families import FAMILY_MODELS

    families = [m for m in FAMILY_MODELS.values() if any(
        json.loads(p.read_text())["family"] == m for p in CELL_FILES)]
    settings = {json.dumps(json.loads(p.read_text())["fingerprint"]["settings"],
                           sort_keys=True) for p in CELL_FILES}
    assert len(settings) == 1, f"the committed cells ran with different settings: {settings}"
    run = json.loads(settings.pop())
    shutil.copytree(CELLS, tmp_path / "cells")
    argv = ["benchmark", "--families", ",".join(families), "--tasks", "ioi,factual,packaged",
            "--max-pairs", str(run["pairs"]), "--n-boot", str(run["n_boot"]), "--seed",
            str(run["seed"]), "--captum-steps", str(run["captum_steps"]),
            "--lenses", "tuned,jacobian", "--out", str(tmp_path), "--tables-only",
            "--no-progress"]
    assert main(argv) == 0
    err = capsys.readouterr().err
    assert "left out" not in err, err
    assert err.count(": read ") == len(CELL_FILES)
    committed = (CELLS.parent / "benchmark.md").read_text(encoding="utf-8")
    assert (tmp_path / "benchmark.md").read_text(encoding="utf-8") == committed


@pytest.mark.slow
@pytest.mark.parametrize("path", CELL_FILES, ids=[p.stem for p in CELL_FILES])
def test_a_committed_cell_is_its_measurements_reanalysed(path: Path) -> None:
    cell = json.loads(path.read_text(encoding="utf-8"))
    with gzip.open(path.with_suffix(".measurements.json.gz"), "rt", encoding="utf-8") as fh:
        data = json.load(fh)["measurements"]
    settings = cell["fingerprint"]["settings"]
    found = analyse(_arrays(data), load_preregistration(), int(settings["n_boot"]),
                    cell["seeds"])
    for part in ("scores", "curves", "magnitude", "hypotheses"):
        _same(cell[part], found[part], f"{path.stem}/{part}")
