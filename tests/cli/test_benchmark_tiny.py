"""``iglens benchmark`` on a tiny configuration: a tiny llama, a dozen pairs, resumable."""

from __future__ import annotations

import gzip
import json

import numpy as np
import pytest
import torch

from captum_iglens.cli import main
from captum_iglens.validate.benchmark import cost as bench_cost
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
    argv = ["benchmark", "--families", str(tiny_folder), "--tasks", str(pairs_file),
            "--out", str(out), "--n-boot", "50", "--captum-steps", "4", "--no-progress"]
    assert main(argv) == 0
    cell_file = runner.cell_path(out, tiny_folder.name, "tiny_pairs")
    cell = json.loads(cell_file.read_text())
    assert cell["counts"] == {"given": 12, "aligned": 12, "answered": 12, "used": 12}
    assert cell["clusters"] == {"pair": 11, "prompt": 12}  # the mirrored couple: one cluster
    assert cell["check_errors"]["benchmark rows"] < 1e-5
    prereg = load_preregistration()
    names = [p["name"] for p in prereg.data["predictors"]]
    table = (out / "benchmark.md").read_text()
    for name in names:  # every predictor in every table (7 interventions), with a CI and n
        assert table.count(f"| {name} |") == 8
    for kind in ("zero", "mean", "resample", "patch", "reverse patch"):
        unit = "logit difference" if "patch" in kind else "probability"
        for name in names:
            s = cell["scores"][kind][unit]["decided"][name]
            assert s["n"] >= 10 and s["low"] <= s["mean"] <= s["high"], (kind, name, s)
    for stat in ("comprehensiveness", "sufficiency"):
        assert set(cell["curves"][stat]) == set(names)
    assert set(cell["magnitude"]) == set(names)
    assert "not scored" not in table and "not measured" not in table
    hyp = cell["hypotheses"]
    assert set(hyp) == {h["id"] for h in prereg.hypotheses}
    # 12 pairs are below the pre-registered minimum: n/a, never "supported"
    assert all(h["verdict"] == "n/a" for h in hyp.values())
    assert "fewer than 20 tokens" in hyp["B7"]["reason"]
    assert set(hyp["B1"]["seed_verdicts"]) == {"0", "1", "2"}
    assert cell["fingerprint"]["analysis"]["preregistration_sha256"] == prereg.sha256
    assert (out / "benchmark.png").stat().st_size > 0
    heavy = json.loads(gzip.open(cell_file.with_suffix(".measurements.json.gz")).read())
    assert np.asarray(heavy["measurements"]["drops"]["zero"]["probability"]).shape == (12, 3)
    capsys.readouterr()
    before = cell_file.read_text()
    assert main(argv) == 0
    assert "reused" in capsys.readouterr().err and cell_file.read_text() == before
    # another seed is another fingerprint: the cell runs again
    assert main([*argv, "--seed", "1"]) == 0
    again = json.loads(cell_file.read_text())
    assert again["fingerprint"]["settings"]["seed"] == 1 and again["seeds"] == [1, 2]


def test_max_pairs_and_the_cost_model(tiny_folder, pairs_file, tmp_path, capsys):
    argv = ["benchmark", "--model", str(tiny_folder), "--task", str(pairs_file),
            "--max-pairs", "5", "--out", str(tmp_path / "b"), "--cost", "--no-progress"]
    assert main(argv) == 0
    cost = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert cost["counts"]["used"] == 5
    expected = bench_cost.cost_model(3, 5, cost["seq_len"], 3)
    assert cost["cached_rows"] == expected["cached_rows"] > 0
    assert bench_cost.cost_model(3, 10, 6, 3)["sequence_forwards"] == (
        2 * expected["sequence_forwards"])
    assert not (tmp_path / "b").exists()  # --cost writes nothing


def test_the_default_families_are_the_required_ones() -> None:
    assert runner.required_families() == ["smollm2", "qwen2.5-coder-0.5b-instruct",
                                          "gemma-3-270m"]
    assert runner.family_runs_task("qwen2.5-coder-1.5b-instruct", "ioi")
    assert not runner.family_runs_task("qwen2.5-coder-1.5b-instruct", "factual")


def test_the_cost_model_counts_the_cached_rows_exactly(tiny_folder, pairs_file, monkeypatch):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from captum_iglens.validate.ablation import BlockAblation
    from captum_iglens.validate.pairs import load_pairs

    model = AutoModelForCausalLM.from_pretrained(tiny_folder).eval()
    tok = AutoTokenizer.from_pretrained(tiny_folder)
    rows = []
    original = BlockAblation.run_plan

    def counting(self, trace, pos, plan, ids):
        rows.append(plan.n_rows)
        return original(self, trace, pos, plan, ids)

    monkeypatch.setattr(BlockAblation, "run_plan", counting)
    pairs = load_pairs(pairs_file)[:6]
    cell = runner.run_cell(model, tok, "tiny", "t", pairs, None, 20, 0, progress=False,
                           captum_steps=2, n_boot_decide=100)
    # a random subset that holds no block is the clean row (1/8 of them at 3 blocks)
    empty = sum(int((~np.asarray(d["masks"]).any(-1)).sum())
                for d in cell["measurements"]["subsets"].values())
    assert sum(rows) == bench_cost.cost_model(3, 6, 6, 3)["cached_rows"] - empty


def test_no_progress_silences_every_bar(tiny_folder, pairs_file, tmp_path, capsys):
    argv = ["benchmark", "--model", str(tiny_folder), "--task", str(pairs_file),
            "--max-pairs", "3", "--captum-steps", "2", "--n-boot", "20"]
    assert main([*argv, "--out", str(tmp_path / "a")]) == 0
    shown = capsys.readouterr().err
    assert "measure" in shown and "curves" in shown  # the bars draw without the flag
    assert main([*argv, "--out", str(tmp_path / "b"), "--no-progress"]) == 0
    quiet = capsys.readouterr().err
    assert "measure" not in quiet and "curves" not in quiet and "it/s" not in quiet


def test_reuse_only_tabulates_the_cells_there_and_runs_none(tiny_folder, pairs_file,
                                                             tmp_path, capsys):
    other = tmp_path / "other_pairs.jsonl"  # a second task that has no cell yet
    other.write_text(pairs_file.read_text(), encoding="utf-8")
    out = tmp_path / "bench"
    argv = ["benchmark", "--model", str(tiny_folder), "--max-pairs", "3",
            "--captum-steps", "2", "--n-boot", "20", "--out", str(out), "--no-progress"]
    assert main([*argv, "--task", str(pairs_file)]) == 0
    ran = (out / "benchmark.md").read_text()
    (out / "benchmark.md").unlink()
    capsys.readouterr()
    assert main([*argv, "--task", f"{pairs_file},{other}", "--reuse-only"]) == 0
    err = capsys.readouterr().err
    assert "reused" in err and "other_pairs: no cell with this fingerprint" in err
    assert not runner.cell_path(out, tiny_folder.name, "other_pairs").exists()
    table = (out / "benchmark.md").read_text()  # the same cell, the same tables ...
    assert table.startswith(ran.rstrip("\n") + "\n\n## Left out of these tables\n")
    assert "other_pairs: no cell with this fingerprint" in table  # ... and what they lack
    # other settings are another fingerprint: nothing matches, a clear error
    assert main([*argv[:-3], "--out", str(out), "--seed", "5", "--task", str(pairs_file),
                 "--reuse-only", "--no-progress"]) == 1
    assert "no cell in" in capsys.readouterr().err


def test_tables_only_tabulates_the_files_with_todays_fingerprint_and_loads_no_model(
        tiny_folder, pairs_file, tmp_path, capsys, monkeypatch):
    out = tmp_path / "bench"
    argv = ["benchmark", "--model", str(tiny_folder), "--task", str(pairs_file),
            "--max-pairs", "3", "--captum-steps", "2", "--n-boot", "20", "--out", str(out),
            "--no-progress"]
    assert main(argv) == 0
    ran = (out / "benchmark.md").read_text()
    (out / "benchmark.md").unlink()
    import captum_iglens.cli.benchmark as bench_cli

    def no_load(*_args, **_kwargs):
        raise AssertionError("--tables-only loaded a model")

    monkeypatch.setattr(bench_cli, "load", no_load)
    capsys.readouterr()
    assert main([*argv, "--tables-only"]) == 0
    assert "read" in capsys.readouterr().err
    assert (out / "benchmark.md").read_text() == ran  # the same file, the same tables
    # a cell whose analysis hash is not today's is named and left out, never tabulated
    cell_file = runner.cell_path(out, tiny_folder.name, "tiny_pairs")
    cell = json.loads(cell_file.read_text())
    today = cell["fingerprint"]
    other = json.loads(json.dumps(today))
    other["analysis"]["verdict_module_sha256"] = "0" * 64
    other["digest"] = runner.fingerprint_digest(other)
    cell_file.write_text(json.dumps({**cell, "fingerprint": other}))
    assert main([*argv, "--tables-only"]) == 1
    err = capsys.readouterr().err
    assert "was made with another analysis" in err and "--tables-only: no cell in" in err
    # an entry edited after the file was written: its digest no longer matches, left out
    edited = json.loads(json.dumps(today))
    edited["analysis"]["verdict_module_sha256"] = "0" * 64
    cell_file.write_text(json.dumps({**cell, "fingerprint": edited}))
    assert main([*argv, "--tables-only"]) == 1
    assert "does not match its own digest" in capsys.readouterr().err
    # other settings than the cell's: another fingerprint, left out
    cell_file.write_text(json.dumps(cell))
    assert main([*argv, "--tables-only"]) == 0
    assert main([*argv[:-1], "--seed", "3", "--no-progress", "--tables-only"]) == 1
    assert "was made with another settings" in capsys.readouterr().err


def test_tables_only_excludes_cost_and_reuse_only(tiny_folder, pairs_file, tmp_path, capsys):
    argv = ["benchmark", "--model", str(tiny_folder), "--task", str(pairs_file),
            "--out", str(tmp_path / "b"), "--tables-only"]
    assert main([*argv, "--reuse-only"]) == 2
    assert "--reuse-only and --tables-only: give one of them" in capsys.readouterr().err


def test_tables_only_recomputes_every_number_and_leaves_out_what_differs(
        tiny_folder, pairs_file, tmp_path, capsys):
    """The fingerprint vouches for a cell's inputs; its numbers are re-analysed from the
    measurements stored beside it: an edited score or verdict, a deleted verdict, missing or
    garbled measurements and a file that is no cell are named and left out (in benchmark.md
    too), never tabulated, and never a crash."""
    out = tmp_path / "bench"
    argv = ["benchmark", "--model", str(tiny_folder), "--task", str(pairs_file),
            "--max-pairs", "3", "--captum-steps", "2", "--n-boot", "20", "--out", str(out),
            "--no-progress"]
    assert main(argv) == 0
    cell_file = runner.cell_path(out, tiny_folder.name, "tiny_pairs")
    heavy = cell_file.with_suffix(".measurements.json.gz")
    cell = json.loads(cell_file.read_text())
    garbled = {"a score": lambda c: c["scores"]["mean"]["probability"]["all"][
                   "readout credit"].__setitem__("mean", 0.9876),
               "a verdict": lambda c: c["hypotheses"]["B2"].__setitem__("verdict", "reversed"),
               "a deleted verdict": lambda c: c["hypotheses"].pop("B4"),
               "the seeds": lambda c: c.__setitem__("seeds", [5, 1, 2]),
               "no scores": lambda c: c.pop("scores"),
               "the pairs used": lambda c: c["counts"].__setitem__("used", 30),
               "the pairs given": lambda c: c["counts"].__setitem__("given", 999),
               "the family": lambda c: c.__setitem__("family", "gpt-5"),
               "hypotheses as a number": lambda c: c.__setitem__("hypotheses", 5),
               "an extra key": lambda c: c.__setitem__("note", "carried into the JSON"),
               "an extra count": lambda c: c["counts"].__setitem__("extra", 1),
               "the clusters": lambda c: c["clusters"].__setitem__("pair", 3)}
    expect = {"a score": "recorded 0.9876", "a verdict": "recorded 'reversed'",
              "a deleted verdict": "no verdict for B4", "the seeds": "seeds [5, 1, 2]",
              "no scores": "not a cell file", "the pairs used": "recorded counts",
              "the pairs given": "given: recorded 999", "the family": "a cell of gpt-5",
              "hypotheses as a number": "not a cell file",
              "an extra key": "keys a cell file does not hold: note",
              "an extra count": "count keys",
              "the clusters": "clusters/pair: recorded 3"}
    for what, edit in garbled.items():
        edited = json.loads(json.dumps(cell))
        edit(edited)
        cell_file.write_text(json.dumps(edited))
        capsys.readouterr()
        assert main([*argv, "--tables-only"]) == 1, what
        err = capsys.readouterr().err
        assert expect[what] in err and "(left out)" in err, (what, err)
        assert "--tables-only: no cell in" in err
    for text in ("[1, 2]", "[" * 200_000):  # JSON but not a cell; nested past recursion
        cell_file.write_text(text)
        assert main([*argv, "--tables-only"]) == 1
        assert "no readable cell file" in capsys.readouterr().err
    cell_file.write_text(json.dumps(cell))
    saved = heavy.read_bytes()
    import gzip as gz

    midway = bytearray(gz.compress(gz.decompress(saved)))
    midway[len(midway) // 2] ^= 0xFF  # a stream corrupted half way: a zlib error
    stray = json.loads(gz.decompress(saved))
    stray["measurements"]["pair_ids"][0] = "another task's pair"
    for broken in (b"not gzip", bytes(midway), gz.compress(json.dumps(stray).encode()),
                   None):
        if broken is None:
            heavy.unlink()
        else:
            heavy.write_bytes(broken)
        assert main([*argv, "--tables-only"]) == 1
        err = capsys.readouterr().err
        assert "its measurements" in err and "(left out)" in err, err
    heavy.write_bytes(saved)
    assert main([*argv, "--tables-only"]) == 0
    assert "Left out" not in (out / "benchmark.md").read_text()
    # a second task without its cell: the table is written, and says what it lacks
    argv2 = [*argv, "--task", "packaged", "--tables-only"]
    assert main(argv2) == 0
    table = (out / "benchmark.md").read_text()
    left = table[table.index("## Left out of these tables"):]
    assert f"{tiny_folder.name} / packaged: no readable cell file" in left
    assert json.loads((out / "benchmark.json").read_text())["left_out"]
    # --reuse-only does not reuse an edited cell either
    edited = json.loads(json.dumps(cell))
    edited["hypotheses"]["B2"]["verdict"] = "reversed"
    cell_file.write_text(json.dumps(edited))
    capsys.readouterr()
    assert main([*argv, "--reuse-only"]) == 1
    err = capsys.readouterr().err
    assert "recorded 'reversed'" in err and "(not reused)" in err


def test_a_family_named_twice_is_a_usage_error(capsys):
    assert main(["benchmark", "--families", "SmolLM2-135M,smollm2", "--out", "x",
                 "--tables-only"]) == 2
    assert "a family is named twice" in capsys.readouterr().err


def test_tables_only_reads_and_creates_nothing_else(tiny_folder, pairs_file, tmp_path, capsys):
    missing = tmp_path / "nowhere"
    argv = ["benchmark", "--model", str(tiny_folder), "--task", str(pairs_file),
            "--tables-only", "--no-progress"]
    assert main([*argv, "--out", str(missing)]) == 1
    assert "no folder" in capsys.readouterr().err and not missing.exists()
    a_file = tmp_path / "a_file.md"
    a_file.write_text("x")
    assert main([*argv, "--out", str(a_file)]) == 2
    assert "a file, not a folder" in capsys.readouterr().err
