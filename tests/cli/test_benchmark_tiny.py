"""``iglens benchmark`` on a tiny configuration: a tiny llama, a dozen pairs, resumable."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from captum_iglens.cli import main
from captum_iglens.validate.benchmark import runner
from captum_iglens.validate.benchmark.decide import load_preregistration


def _greedy(model, tok, text: str) -> str:
    ids = torch.tensor([tok(text).input_ids])
    with torch.no_grad():
        return tok.convert_ids_to_tokens(int(model(ids).logits[0, -1].argmax()))


@pytest.fixture
def pairs_file(tiny_folder, tmp_path):
    """Pairs the tiny model answers right: the answer is its greedy word after the clean
    prompt, the foil another word; the first two pairs are a mirrored couple."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(tiny_folder).eval()
    tok = AutoTokenizer.from_pretrained(tiny_folder)
    rng = np.random.default_rng(0)
    rows = []
    while len(rows) < 12:
        words = [f"w{int(i)}" for i in rng.integers(0, 100, 6)]
        other = list(words)
        other[2] = f"w{int(rng.integers(0, 100))}"
        clean, corrupted = " ".join(words), " ".join(other)
        answer, foil = _greedy(model, tok, clean), _greedy(model, tok, corrupted)
        if answer == foil or answer.startswith("<") or foil.startswith("<"):
            continue
        rows.append({"id": f"p{len(rows)}", "category": "tiny", "clean": clean,
                     "corrupted": corrupted, "answer": f" {answer}", "foil": f" {foil}"})
        if len(rows) == 1:  # its mirror: patch(A) = reverse-patch(B)
            rows.append({"id": "p1", "category": "tiny", "clean": corrupted,
                         "corrupted": clean, "answer": f" {foil}", "foil": f" {answer}"})
    path = tmp_path / "tiny_pairs.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def test_benchmark_writes_the_table_and_resumes(tiny_folder, pairs_file, tmp_path, capsys):
    out = tmp_path / "bench"
    argv = ["benchmark", "--model", str(tiny_folder), "--task", str(pairs_file),
            "--out", str(out), "--n-boot", "50", "--no-progress"]
    assert main(argv) == 0
    cell_file = runner.cell_path(out, tiny_folder.name, "tiny_pairs")
    cell = json.loads(cell_file.read_text())
    assert cell["counts"] == {"given": 12, "aligned": 12, "answered": 12, "used": 12}
    assert cell["clusters"] == 11  # the mirrored couple is one cluster
    table = (out / "benchmark.md").read_text()
    for entry in load_preregistration().data["predictors"]:
        assert f"| {entry['name']} |" in table
    assert "not scored" in table  # AtP and the others: listed, not filled in
    assert "| B7 the readout credit agrees with patching better" in table
    credit = cell["scores"]["patch"]["readout credit"]
    assert credit["n"] <= 12 and credit["low"] <= credit["mean"] <= credit["high"]
    hyp = cell["hypotheses"]
    assert set(hyp) == {h["id"] for h in load_preregistration().hypotheses}
    # B7 (credit vs last layer under patching) is scored; 12 pairs are below the minimum
    assert hyp["B7"]["verdict"] == "n/a" and "fewer than 20 tokens" in hyp["B7"]["reason"]
    assert hyp["B1"] == {"verdict": "n/a", "reason": "not scored by this version",
                         "statement": hyp["B1"]["statement"]}  # AtP: not yet
    assert len(cell["per_pair_rho"]["patch"]["readout credit"]) == 12
    assert cell["fingerprint"]["analysis"]["preregistration_sha256"] == (
        load_preregistration().sha256)
    capsys.readouterr()
    before = cell_file.read_text()
    assert main(argv) == 0
    assert "reused" in capsys.readouterr().err and cell_file.read_text() == before
    # another seed is another fingerprint: the cell runs again
    assert main([*argv, "--seed", "1"]) == 0
    assert json.loads(cell_file.read_text())["fingerprint"]["settings"]["seed"] == 1


def test_hypothesis_verdicts_decide_what_is_scored() -> None:
    rng = np.random.default_rng(1)
    prereg = load_preregistration()
    clusters = np.arange(60) // 2
    better = {"patch": {"readout credit": 0.5 + 0.1 * rng.standard_normal(60),
                        "last layer always": 0.1 * rng.standard_normal(60)}}
    found = runner.hypothesis_verdicts(better, clusters, prereg)
    assert found["B7"]["verdict"] == "supported" and found["B7"]["n_clusters"] == 30
    worse = {"patch": {"readout credit": better["patch"]["last layer always"],
                       "last layer always": better["patch"]["readout credit"]}}
    assert runner.hypothesis_verdicts(worse, clusters, prereg)["B7"]["verdict"] == "reversed"


def test_a_planted_predictor_scores_one_and_a_shuffled_one_chance() -> None:
    rng = np.random.default_rng(0)
    drops = rng.standard_normal((400, 12))
    clusters = np.arange(400) // 2
    planted = runner._summary(runner._rho(drops, drops), clusters, 200, 0, 2.8)
    assert planted["mean"] == pytest.approx(1.0, abs=1e-12) and planted["n"] == 400
    shuffled = rng.permuted(drops, axis=1)
    chance = runner._summary(runner._rho(shuffled, drops), clusters, 200, 0, 2.8)
    assert chance["low"] < 0 < chance["high"] and abs(chance["mean"]) < 0.05
    assert 0 < chance["mde"] < 0.2
