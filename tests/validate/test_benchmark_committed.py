"""The committed benchmark tables are the committed cells, re-analysed by today's code.

``benchmarks/benchmark_run/cells/`` holds each real cell's scores, verdicts and, beside them,
the raw measurements they were computed from. ``iglens benchmark --tables-only`` re-analyses
every cell's measurements (and re-scores every lens file's rows) with the package's code and
leaves out any file whose recorded numbers differ; the committed tables must be what it writes,
byte for byte, with nothing left out: a change to the analysis that would move a published
number fails here instead of leaving the README's tables stale. No model is loaded (about
half a minute on a 2-core CPU).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

CELLS = Path(__file__).resolve().parents[2] / "benchmarks" / "benchmark_run" / "cells"
CELL_FILES = sorted(p for p in CELLS.glob("*.json") if "__lens-" not in p.name)


def test_the_committed_run_has_cells() -> None:
    assert len(CELL_FILES) >= 6, f"no benchmark cells under {CELLS}"


def test_the_committed_tables_are_the_committed_cells_tabulated(tmp_path, capsys) -> None:
    """benchmark.md is what ``--tables-only`` writes from the committed cell and lens files
    (no model loaded), byte for byte: no table was edited by hand or left stale, every cell
    file carries today's fingerprint (analysis code, pre-registration, settings, pairs), and
    every recorded score and verdict is what its stored measurements give when re-analysed.
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


def test_a_cell_with_another_tasks_measurements_and_numbers_is_left_out(tmp_path,
                                                                         capsys) -> None:
    """Numbers and measurements copied together from another task's cell agree with each
    other; the measurements' pairs are not the task's, so the cell is still left out."""
    from captum_iglens.cli import main

    (tmp_path / "cells").mkdir()
    for name in ("smollm2__ioi", "smollm2__factual"):
        for suffix in (".json", ".measurements.json.gz"):
            shutil.copy(CELLS / f"{name}{suffix}", tmp_path / "cells")
    ioi = json.loads((CELLS / "smollm2__ioi.json").read_text())
    factual = json.loads((CELLS / "smollm2__factual.json").read_text())
    swapped = {**factual, "task": "ioi", "fingerprint": ioi["fingerprint"]}
    (tmp_path / "cells" / "smollm2__ioi.json").write_text(json.dumps(swapped))
    shutil.copy(CELLS / "smollm2__factual.measurements.json.gz",
                tmp_path / "cells" / "smollm2__ioi.measurements.json.gz")
    run = ioi["fingerprint"]["settings"]
    argv = ["benchmark", "--families", "SmolLM2-135M", "--tasks", "ioi,factual",
            "--max-pairs", str(run["pairs"]), "--n-boot", str(run["n_boot"]),
            "--captum-steps", str(run["captum_steps"]), "--out", str(tmp_path),
            "--tables-only", "--no-progress"]
    assert main(argv) == 0
    err = capsys.readouterr().err
    assert "smollm2 / ioi: smollm2__ioi.json: its measurements" in err
    assert "are of pairs not in the task" in err and "smollm2 / factual: read" in err
    table = (tmp_path / "benchmark.md").read_text()
    assert "smollm2 / ioi |" not in table.split("## Left out")[0]
