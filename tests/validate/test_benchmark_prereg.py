"""The benchmark's pre-registration: the verdict code reads exactly the shipped file."""

from __future__ import annotations

import hashlib
import json
from importlib import resources
from pathlib import Path

import numpy as np
import pytest

from captum_iglens.validate.benchmark import decide as decide_module
from captum_iglens.validate.benchmark.decide import (
    analysis_version,
    decide,
    load_preregistration,
    required_resamples,
)

_FILE = resources.files("captum_iglens.validate.benchmark") / "prereg.json"


def test_the_loader_reads_exactly_the_shipped_file() -> None:
    raw = _FILE.read_bytes()
    prereg = load_preregistration()
    assert prereg.sha256 == hashlib.sha256(raw).hexdigest()
    assert prereg.to_dict() == json.loads(raw)
    with pytest.raises(TypeError):  # frozen: the rules cannot be edited after loading
        prereg.data["statistics"]["alpha"] = 0.5  # type: ignore[index]


def test_the_file_states_what_the_issue_asks_for() -> None:
    prereg = load_preregistration()
    assert len(prereg.data["predictors"]) >= 10
    assert {t["name"] for t in prereg.data["tasks"]} == {"ioi", "factual", "packaged"}
    assert {f["name"] for f in prereg.data["families"] if f["required"]} == {
        "SmolLM2-135M", "Qwen2.5-Coder-0.5B", "Gemma-3-270m"}
    assert {u["name"] for u in prereg.data["metric_units"]} == {
        "probability", "log-probability", "logit difference"}
    names = {p["name"] for p in prereg.data["predictors"]}
    for h in prereg.hypotheses:
        assert h["direction"] in ("greater", "less")
        assert h["predictor"] in names
    # enough resamples that the Bonferroni-corrected bound holds min_tail_draws draws
    assert prereg.n_cells == len(prereg.hypotheses) * 9
    assert prereg.statistics["n_boot"] >= required_resamples(prereg)
    assert required_resamples(prereg) * prereg.alpha_corrected >= (
        prereg.statistics["min_tail_draws"])


def _cell(shift: float, n_clusters: int = 30, per: int = 4, seed: int = 0):
    rng = np.random.default_rng(seed)
    values = shift + rng.standard_normal(n_clusters * per)
    return values, np.repeat(np.arange(n_clusters), per)


def test_decide_by_construction() -> None:
    prereg = load_preregistration()
    assert decide(*_cell(1.0), prereg).verdict == "supported"
    assert decide(*_cell(0.0), prereg).verdict == "not supported"
    assert decide(*_cell(-1.0), prereg).verdict == "reversed"
    assert decide(*_cell(-1.0), prereg, direction="less").verdict == "supported"
    cell = decide(*_cell(1.0), prereg)
    assert cell.low < cell.value < cell.high and cell.mde > 0
    assert (cell.n_tokens, cell.n_clusters) == (120, 30)
    # fewer clusters than the file's minimum: n/a, never supported
    few = decide(*_cell(1.0, n_clusters=3, per=40), prereg)
    assert few.verdict == "n/a" and "clusters" in few.reason
    # fewer resamples than the corrected level needs: n/a
    assert decide(*_cell(1.0), prereg, n_boot=1000).verdict == "n/a"


def test_changing_the_file_changes_the_decision(tmp_path: Path) -> None:
    data = json.loads(_FILE.read_bytes())
    data["statistics"]["min_clusters"] = 31
    path = tmp_path / "prereg.json"
    path.write_text(json.dumps(data), encoding="utf-8")
    other = load_preregistration(path)
    assert other.sha256 != load_preregistration().sha256
    assert decide(*_cell(1.0), load_preregistration()).verdict == "supported"
    assert decide(*_cell(1.0), other).verdict == "n/a"


def test_analysis_version_hashes_the_verdict_module() -> None:
    version = analysis_version()
    source = Path(decide_module.__file__).read_bytes()
    assert version["verdict_module_sha256"] == hashlib.sha256(source).hexdigest()
    assert version["preregistration_sha256"] == load_preregistration().sha256
    assert load_preregistration().data["analysis_code"]["verdict_module"].endswith(
        "benchmark/decide.py")


def test_another_bootstrap_seed_moves_no_verdict() -> None:
    prereg = load_preregistration()
    for shift in (1.0, 0.0, -1.0):
        values, clusters = _cell(shift)
        verdicts = {decide(values, clusters, prereg, seed=s).verdict for s in (0, 1, 2)}
        assert len(verdicts) == 1, (shift, verdicts)
