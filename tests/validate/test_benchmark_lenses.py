"""The lens addendum's rows (``iglens benchmark --lenses``) on a tiny random llama.

A planted lens predictor equal to the drops scores rho 1 (and decides L1 "supported" on
enough synthetic tokens); the logit lens passed as the "lens" gives the readout credit rows
of the cell exactly (the same IGLens calls); a computed lens file is reused; a family
without a fitted lens reads n/a with the ``iglens fit-lens`` command; the cells of a run
without ``--lenses`` keep their fingerprint.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from captum_iglens.cli import main
from captum_iglens.lens.fit import fit_tuned_lens, lens_cache_path
from captum_iglens.validate.benchmark import lens_rows, runner
from captum_iglens.validate.benchmark.addendum import load_lens_addendum

TUNED = "readout credit (tuned lens)"
#: rho is a ratio of float64 sums of ranks of at most a few dozen blocks.
RHO_TOL = 64 * np.finfo(np.float64).eps


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch):
    monkeypatch.setenv("CAPTUM_IGLENS_CACHE", str(tmp_path / "cache"))


def _greedy(model, tok, text: str) -> str:
    ids = torch.tensor([tok(text).input_ids])
    with torch.no_grad():
        return tok.convert_ids_to_tokens(int(model(ids).logits[0, -1].argmax()))


@pytest.fixture(scope="module")
def loaded(tiny_folder):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    return (AutoModelForCausalLM.from_pretrained(tiny_folder).eval(),
            AutoTokenizer.from_pretrained(tiny_folder))


@pytest.fixture(scope="module")
def pairs_file(loaded, tmp_path_factory):
    """Six pairs the tiny model answers right (as tests/cli/test_benchmark_tiny.py)."""
    model, tok = loaded
    rng = np.random.default_rng(0)
    rows = []
    while len(rows) < 6:
        words = [f"w{int(i)}" for i in rng.integers(0, 100, 6)]
        other = list(words)
        other[2] = f"w{int(rng.integers(0, 100))}"
        clean, corrupted = " ".join(words), " ".join(other)
        answer, foil = _greedy(model, tok, clean), _greedy(model, tok, corrupted)
        if answer == foil or answer.startswith("<") or foil.startswith("<"):
            continue
        rows.append({"id": f"p{len(rows)}", "category": "tiny", "clean": clean,
                     "corrupted": corrupted, "answer": f" {answer}", "foil": f" {foil}"})
    path = tmp_path_factory.mktemp("pairs") / "tiny_pairs.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def cell(loaded, pairs_file, tmp_path_factory):
    """One measured cell written as ``iglens benchmark`` writes it: (cell, file, pairs)."""
    from captum_iglens.validate.pairs import load_pairs

    model, tok = loaded
    pairs = load_pairs(pairs_file)
    out = tmp_path_factory.mktemp("bench")
    found = runner.run_cell(model, tok, "tiny", "t", pairs, None, 20, 0, progress=False,
                            captum_steps=2, n_boot_decide=100)
    found["fingerprint"] = runner.cell_fingerprint(model, "tiny", "t", pairs, {})
    path = runner.cell_path(out, "tiny", "t")
    path.parent.mkdir(parents=True, exist_ok=True)
    runner.write_cell(path, found)
    return found, path, pairs


def test_the_logit_lens_as_the_lens_gives_the_readout_credit_rows(loaded, cell) -> None:
    model, tok = loaded
    found, path, pairs = cell
    data = lens_rows.read_measurements(path)
    rows = lens_rows.credit_rows(model, tok, lens_rows.pairs_of_cell(data, pairs), "logit")
    for group in ("zero", "mean", "patch"):
        stored = np.asarray(data["predictors"][group]["readout credit"])
        assert stored.shape == rows["credits"][group].shape == (6, 3)
        # exact: the same IGLens calls on the same ids, float32 values stored as float64
        assert np.array_equal(rows["credits"][group], stored), group
        assert not rows["lens_change"][group].any()  # the logit lens has no lens terms
    # scored as a lens row, it reproduces the readout credit's own scores
    scored = lens_rows.score_rows(data, rows["credits"], TUNED, load_lens_addendum(), 20,
                                  found["seeds"], 100)
    for kind, unit in (("mean", "probability"), ("patch", "logit difference")):
        mine = scored["scores"][kind][unit]["decided"]
        assert abs(mine[TUNED]["mean"] - mine["readout credit"]["mean"]) <= RHO_TOL
        assert abs(mine[TUNED]["mean"]
                   - found["scores"][kind][unit]["decided"]["readout credit"]["mean"]) <= RHO_TOL
    assert scored["hypotheses"]["L1"]["verdict"] == "n/a"  # 6 tokens: below the minimum
    assert set(scored["hypotheses"]) == {"L1"}


def test_a_planted_lens_equal_to_the_drops_scores_rho_one(cell) -> None:
    found, path, _ = cell
    data = lens_rows.read_measurements(path)
    planted = {"zero": data["drops"]["zero"]["probability"],
               "mean": data["drops"]["mean"]["probability"],
               "patch": data["drops"]["patch"]["logit difference"]}
    scored = lens_rows.score_rows(data, planted, TUNED, load_lens_addendum(), 20,
                                  found["seeds"], 100)
    for kind, unit in (("zero", "probability"), ("mean", "probability"),
                       ("patch", "logit difference")):
        s = scored["scores"][kind][unit]["decided"][TUNED]
        assert abs(s["mean"] - 1.0) <= RHO_TOL and s["n"] == 6, (kind, s)
    # the infidelity of a lens row is scored on the stored subsets too
    assert scored["magnitude"][TUNED]["n"] == 6


def _synthetic(n_tok: int = 60, n: int = 8, seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    drops = {u: rng.standard_normal((n_tok, n))
             for u in ("probability", "log-probability", "logit difference")}
    return {"n": n, "drops": {"mean": drops},
            "predictors": {g: {"readout credit": rng.standard_normal((n_tok, n))}
                           for g in ("zero", "mean", "patch")},
            "clusters": {"prompt": np.repeat(np.arange(n_tok // 3), 3),
                         "pair": np.repeat(np.arange(n_tok // 3), 3)},
            "nonmonotonic": np.zeros(n_tok, bool)}


def test_a_planted_lens_is_supported_and_a_shuffled_one_is_not() -> None:
    add = load_lens_addendum()
    data = _synthetic()
    planted = {g: data["drops"]["mean"]["probability"] for g in ("zero", "mean", "patch")}
    scored = lens_rows.score_rows(data, planted, TUNED, add, 200, [0, 1, 2], 8000)
    l1 = scored["hypotheses"]["L1"]
    assert l1["verdict"] == "supported" and not l1["unstable"], l1
    assert set(l1["seed_verdicts"]) == {"0", "1", "2"} and l1["n_tokens"] == 60
    shuffled = {g: np.random.default_rng(5).standard_normal((60, 8)) for g in planted}
    other = lens_rows.score_rows(data, shuffled, TUNED, add, 200, [0], 8000)
    assert other["hypotheses"]["L1"]["verdict"] == "not supported"


def test_resume_skips_a_computed_lens_file(loaded, cell, tmp_path, monkeypatch) -> None:
    model, tok = loaded
    found, path, pairs = cell
    corpus = torch.randint(3, 100, (4, 8), generator=torch.Generator().manual_seed(0))
    lens = fit_tuned_lens(model, corpus, steps=3, progress=False)
    args = (model, tok, found, path, pairs, "tuned", "tiny-llama", tmp_path, 20)
    first, reused = lens_rows.run_lens_cell(*args, n_boot_decide=100, lens=lens)
    assert not reused and first["status"] == "ok"
    assert first["fingerprint"]["lens"]["digest"] == lens.identity()["digest"]
    file = lens_rows.lens_path(tmp_path, "tiny", "t", "tuned")
    assert file.name == "tiny__t__lens-tuned.json" and file.exists()
    before = file.read_text()

    def refuse(*_a, **_k):
        raise AssertionError("a matching lens file was computed again")

    monkeypatch.setattr(lens_rows, "credit_rows", refuse)
    again, reused = lens_rows.run_lens_cell(*args, n_boot_decide=100, lens=lens)
    assert reused and again == first and file.read_text() == before
    other = fit_tuned_lens(model, corpus, steps=6, progress=False)  # another digest
    with pytest.raises(AssertionError, match="computed again"):
        lens_rows.run_lens_cell(*args, n_boot_decide=100, lens=other)


def test_no_fitted_lens_reads_na_with_the_fit_command(loaded, cell, tmp_path) -> None:
    model, tok = loaded
    found, path, pairs = cell
    got, _ = lens_rows.run_lens_cell(model, tok, found, path, pairs, "jacobian", "my-model",
                                     tmp_path, 20)
    assert got["status"] == "n/a" and "rows" not in got
    assert "iglens fit-lens --kind jacobian --model my-model" in got["message"]
    assert got["hypotheses"]["L2"]["verdict"] == "n/a"
    assert "iglens fit-lens" in got["hypotheses"]["L2"]["reason"]


def test_cli_lenses_adds_the_block_and_keeps_the_cells(loaded, tiny_folder, pairs_file,
                                                       tmp_path, capsys) -> None:
    model, _ = loaded
    out = tmp_path / "bench"
    argv = ["benchmark", "--families", str(tiny_folder), "--tasks", str(pairs_file),
            "--out", str(out), "--n-boot", "20", "--captum-steps", "2", "--no-progress"]
    assert main(argv) == 0
    cell_file = runner.cell_path(out, tiny_folder.name, "tiny_pairs")
    plain = json.loads(cell_file.read_text())
    # the settings (and so the fingerprint) of a run without --lenses are today's
    assert set(plain["fingerprint"]["settings"]) == {"pairs", "n_boot", "seed", "captum_steps"}
    from captum_iglens.validate.pairs import load_pairs

    expected = runner.cell_fingerprint(model, tiny_folder.name, "tiny_pairs",
                                       load_pairs(pairs_file), plain["fingerprint"]["settings"])
    assert plain["fingerprint"]["digest"] == expected["digest"]
    saved = json.loads((out / "benchmark.json").read_text())
    assert "lens_addendum" not in saved and "Lens addendum" not in (
        out / "benchmark.md").read_text()
    corpus = torch.randint(3, 100, (4, 8), generator=torch.Generator().manual_seed(0))
    lens = fit_tuned_lens(model, corpus, steps=3, progress=False)
    lens.save(lens_cache_path(lens.digest, "tuned", {"steps": 3}))
    before = cell_file.read_text()
    capsys.readouterr()
    assert main([*argv, "--lenses", "tuned,jacobian"]) == 0
    err = capsys.readouterr().err
    assert "reused" in err and cell_file.read_text() == before  # the cell is not re-run
    assert f"iglens fit-lens --kind jacobian --model {tiny_folder}" in err
    # computing a lens file is said, even with --no-progress; a rerun reuses it
    assert "tuned lens: computed from the cell's stored measurements" in err
    table = (out / "benchmark.md").read_text()
    block = table[table.index("## Lens addendum"):]
    assert "| readout credit (tuned lens) |" in block and "n/a (no fitted lens)" in block
    assert "| L1 " in block and "| L2 " in block
    tuned = json.loads(lens_rows.lens_path(out, tiny_folder.name, "tiny_pairs",
                                           "tuned").read_text())
    assert tuned["fingerprint"]["cell"] == plain["fingerprint"]["digest"]
    assert np.asarray(tuned["rows"]["zero"]).shape == (6, 3)
    saved = json.loads((out / "benchmark.json").read_text())
    assert {c["kind"]: c["status"] for c in saved["lens_addendum"]["cells"]} == {
        "tuned": "ok", "jacobian": "n/a"}
    capsys.readouterr()
    assert main([*argv, "--lenses", "tuned", "--reuse-only"]) == 0
    err = capsys.readouterr().err
    assert "tuned lens: reused" in err and "computed" not in err
    assert main([*argv, "--lenses", "logit"]) == 2
    # a lens file whose recorded numbers its rows do not give is left out, never tabulated
    tuned_file = lens_rows.lens_path(out, tiny_folder.name, "tiny_pairs", "tuned")
    edited = json.loads(tuned_file.read_text())
    edited["magnitude"]["readout credit (tuned lens)"]["mean"] = -0.78
    tuned_file.write_text(json.dumps(edited))
    for mode in ("--reuse-only", "--tables-only"):
        capsys.readouterr()
        assert main([*argv, "--lenses", "tuned", mode]) == 0
        err = capsys.readouterr().err
        assert "recorded -0.78" in err and "left out" in err, (mode, err)
        l1 = next(line for line in (out / "benchmark.md").read_text().splitlines()
                  if line.startswith("| L1 "))
        assert l1.endswith("| not run or left out |"), l1
    # a file of another task or kind, an "n/a" file hiding a fitted lens, malformed rows
    good = json.loads(json.dumps(tuned))
    for edit, says in ((lambda t: t.__setitem__("task", "elsewhere"), "not the tuned lens"),
                       (lambda t: t.__setitem__("kind", "jacobian"), "not the tuned lens"),
                       (lambda t: t.__setitem__("status", "n/a"), "not an n/a lens file"),
                       (lambda t: t.__setitem__("rows", []), "not a tuned lens file"),
                       (lambda t: t["hypotheses"].__setitem__("L1", "n/a"), "not the tuned")):
        edited = json.loads(json.dumps(good))
        edit(edited)
        tuned_file.write_text(json.dumps(edited))
        capsys.readouterr()
        assert main([*argv, "--lenses", "tuned", "--tables-only"]) == 0
        err = capsys.readouterr().err
        assert says in err and "(left out)" in err, (says, err)
    # an "n/a" file forged over a fitted one (its fingerprint redone without the lens): only
    # exactly what the benchmark writes without a lens passes, and nothing of it is drawn
    from captum_iglens.validate.benchmark.addendum import load_lens_addendum

    cell = json.loads(cell_file.read_text())
    forged = {k: good[k] for k in ("family", "task", "kind", "name")}
    forged["fingerprint"] = lens_rows.lens_fingerprint(cell, "tuned", None, load_lens_addendum())
    forged.update(lens_rows._not_available(load_lens_addendum(), good["name"], "no lens"))
    tuned_file.write_text(json.dumps(forged))
    assert main([*argv, "--lenses", "tuned", "--tables-only"]) == 0
    assert "n/a (no fitted lens), as the benchmark writes it" in capsys.readouterr().err
    for extra in ({"scores": good["scores"]}, {"hypotheses": {"L1": {
            **forged["hypotheses"]["L1"], "value": 0.9, "unstable": True}}}):
        tuned_file.write_text(json.dumps({**forged, **extra}))
        assert main([*argv, "--lenses", "tuned", "--tables-only"]) == 0
        err = capsys.readouterr().err
        assert "not an n/a lens file as the benchmark writes one" in err, err


def test_a_jacobian_lens_gives_its_own_rows_and_l2(loaded, cell, tmp_path) -> None:
    from captum_iglens.lens.fit import fit_jacobian_lens

    model, tok = loaded
    found, path, pairs = cell
    corpus = torch.randint(3, 100, (2, 8), generator=torch.Generator().manual_seed(0))
    lens = fit_jacobian_lens(model, corpus, dim_batch=32, progress=False)
    got, _ = lens_rows.run_lens_cell(model, tok, found, path, pairs, "jacobian", "tiny",
                                     tmp_path, 20, n_boot_decide=100, lens=lens)
    assert got["status"] == "ok" and set(got["hypotheses"]) == {"L2"}
    assert got["fingerprint"]["lens"]["kind"] == "jacobian"
    credits = np.asarray(got["rows"]["zero"])
    stored = lens_rows.read_measurements(path)["predictors"]["zero"]["readout credit"]
    # another readout: other block terms, and lens terms that are not all zero
    assert np.abs(credits - stored).max() > 0 and np.abs(got["lens_change"]["zero"]).max() > 0
    name = "readout credit (Jacobian lens)"
    assert got["scores"]["mean"]["probability"]["decided"][name]["n"] == 6


def test_the_figure_marks_a_missing_value_na_not_blank() -> None:
    """imshow leaves NaN blank, which on the diverging map reads as rho near 0."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from captum_iglens.validate.benchmark.tables import mark_missing

    grid = np.array([[0.5, np.nan], [np.nan, -0.2], [0.0, 0.1]])
    fig, ax = plt.subplots()
    try:
        ax.imshow(grid, vmin=-1, vmax=1)
        mark_missing(ax, grid)
        marked = sorted((int(t.get_position()[1]), int(t.get_position()[0]))
                        for t in ax.texts if t.get_text() == "n/a")
    finally:
        plt.close(fig)
    assert marked == [(0, 1), (1, 0)]  # (row, column) of each NaN, and only those
