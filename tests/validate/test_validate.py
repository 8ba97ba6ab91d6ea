"""The causal validation: its metrics and bootstrap, the packaged prompts, an end-to-end run
on the embedded SmolLM2 and the ``iglens validate`` command."""

from __future__ import annotations

import hashlib
import json
from importlib import resources

import numpy as np
import pytest
import torch
from scipy import stats

from captum_iglens.cli import main
from captum_iglens.models import loading as models
from captum_iglens.run.fingerprint import weights_digest
from captum_iglens.validate.driver import donor_sets, load_prompts, validate
from captum_iglens.validate.patching import load_pairs
from captum_iglens.validate.stats import (
    MEANS,
    METRICS,
    PREDICTORS,
    analyse,
    cluster_bootstrap,
    half_point,
    nonmonotonic,
    onset_gain,
    profile_free_spearman,
    token_metrics,
)
from captum_iglens.validate.verdict import PRE_STATED, decision_views, verdict


def test_a_predictor_equal_to_the_drop_is_perfect() -> None:
    drops = np.random.default_rng(0).standard_normal((40, 30))
    m = token_metrics(drops.copy(), half_point(drops.cumsum(1)), drops)
    assert np.allclose(m["spearman"], 1.0)
    # exact: means of 0/1 indicators of 40 rows are exact in float64
    assert m["top1"].mean() == 1.0 and m["top3"].mean() == 1.0
    assert np.allclose(m["pct_top"], 100 * (1 - 0.5 / 30))  # the largest of 30
    assert np.all(m["onset_dist"] == 0)
    reverse = token_metrics(-drops, np.zeros(40, dtype=int), drops)
    # exact: a mean of all-zero indicators
    assert np.allclose(reverse["spearman"], -1.0) and reverse["top1"].mean() == 0.0


def test_spearman_is_scipys_and_constant_rows_give_nan() -> None:
    rng = np.random.default_rng(1)
    scores, drops = rng.standard_normal((5, 12)), rng.standard_normal((5, 12))
    scores[2] = 0.7  # constant predictor row
    rho = token_metrics(scores, np.zeros(5, dtype=int), drops)["spearman"]
    for t in (0, 1, 3, 4):
        assert rho[t] == pytest.approx(stats.spearmanr(scores[t], drops[t]).statistic)
    assert np.isnan(rho[2])
    one = token_metrics(scores[:1], np.zeros(1, dtype=int), drops[:1])["spearman"]
    assert one.shape == (1,) and one[0] == pytest.approx(rho[0])


def test_cluster_bootstrap_resamples_prompts() -> None:
    values = np.concatenate([np.full(10, 1.0), np.full(10, 3.0), [np.nan]])[:, None]
    groups = [np.arange(10), np.arange(10, 21)]
    table = cluster_bootstrap(values, np.array([False]), groups, n_boot=500, seed=3)
    stat, low, high = table[0]
    # exact: means of constant 1.0 / 3.0 values are exact
    assert stat == 2.0 and low == 1.0 and high == 3.0  # one prompt resampled twice: 1 or 3
    again = cluster_bootstrap(values, np.array([False]), groups, n_boot=500, seed=3)
    assert np.array_equal(table, again)
    assert np.isnan(cluster_bootstrap(values, np.array([True]), [], 10)).all()
    rates = cluster_bootstrap(np.array([[1.0], [0.0], [0.0], [1.0]]), np.array([True]),
                              [np.array([0, 1]), np.array([2, 3])], 100)
    # exact: a mean of 0/1 indicators
    assert rates[0, 0] == 0.5


def test_half_point_is_the_sustained_onset_rule() -> None:
    cumulative = np.array([[0.1, 0.6, 0.4, 0.7, 1.0],     # crosses 0.5 at 1, dips, back at 3
                           [-0.1, -0.3, -0.6, -0.8, -1.0],  # negative total
                           [0.0, 0.0, 0.0, 0.0, 0.0]])    # nothing: the first block
    assert half_point(cumulative).tolist() == [3, 2, 0]


def test_nonmonotonic_trajectories() -> None:
    lens = np.array([[0.0, 0.2, 0.5, 0.9], [0.0, 0.6, 0.3, 0.9], [0.0, 0.5, 0.48, 0.9]])
    assert nonmonotonic(lens, 0.05).tolist() == [False, True, False]


def test_profile_free_spearman_keeps_only_the_token_specific_part() -> None:
    """Drops = a layer profile shared by every token + a token-specific part. The profile
    alone ranks the blocks well (high rho) but carries nothing token-specific (rho_tok n/a:
    its residual ranks are 0); the token-specific part alone has rho_tok near 1."""
    rng = np.random.default_rng(4)
    n_tok, n = 60, 20
    prompt = np.repeat(np.arange(12), 5)
    profile = np.linspace(0, 3, n)
    own = 0.3 * rng.standard_normal((n_tok, n))
    drops = profile + own
    shared = np.broadcast_to(profile, (n_tok, n)).copy()
    assert np.median(token_metrics(shared, np.zeros(n_tok, int), drops)["spearman"]) > 0.9
    assert np.isnan(profile_free_spearman(shared, drops, prompt)).all()
    assert np.median(profile_free_spearman(own, drops, prompt)) > 0.8
    noise = rng.standard_normal((n_tok, n))
    assert abs(np.median(profile_free_spearman(noise, drops, prompt))) < 0.15
    assert np.isnan(profile_free_spearman(own, drops, None)).all()


def test_onset_gain_is_the_exact_random_block_expectation() -> None:
    # n = 5, half-drop block 0: E|R - 0| = (0 + 1 + 2 + 3 + 4) / 5 = 2
    gain = onset_gain(np.array([0, 4, 2]), np.array([0, 0, 2]), 5)
    # E|R - 2| = (2 + 1 + 0 + 1 + 2) / 5 = 1.2
    assert np.allclose(gain, [2.0, -2.0, 1.2], atol=1e-12)


def test_split_bootstrap_differences_two_subsets_of_the_same_resample() -> None:
    values = np.array([1.0, 3.0, 1.0, 3.0, 1.0, 3.0])[:, None]
    flags = np.array([False, True] * 3)  # within every prompt: 3 flagged, 1 not
    groups = [np.array([0, 1]), np.array([2, 3]), np.array([4, 5])]
    table = cluster_bootstrap(values, np.array([False]), groups, 200, 0, split=flags)
    # exact: medians of constants 3.0 and 1.0, every resample alike
    assert table[0].tolist() == [2.0, 2.0, 2.0]


def test_donor_sets_are_distinct_seeded_and_never_the_prompt() -> None:
    sets = donor_sets(6, 4, seed=2)
    assert all(len(set(d)) == 4 and p not in d for p, d in enumerate(sets))
    assert sets == donor_sets(6, 4, seed=2) and sets != donor_sets(6, 4, seed=3)
    with pytest.raises(ValueError, match="donors"):
        donor_sets(3, 3, seed=0)


def _synthetic(rng: np.random.Generator, informative: bool) -> dict:
    """A known answer: 40 prompts x 6 tokens x 12 blocks. Half the tokens have a monotonic
    logit-lens trajectory, half dip by 0.3. With ``informative``, credit = drop + noise on
    the non-monotonic tokens and pure noise on the monotonic ones, and the onset is the
    half-drop block; otherwise credit and onset know nothing of the drops."""
    n_tok, n = 240, 12
    prompt = np.repeat(np.arange(40), 6)
    drops = rng.standard_normal((n_tok, n))
    flags = np.arange(n_tok) % 2 == 1
    lens = np.tile(np.linspace(0.0, 0.9, n), (n_tok, 1))
    lens[flags, 5] -= 0.3
    noise = rng.standard_normal((n_tok, n))
    credits = np.where(flags[:, None], drops + 0.5 * noise, noise) if informative else noise
    onset = (half_point(drops.cumsum(1)) if informative
             else rng.integers(0, n, n_tok))
    direct = rng.standard_normal((n_tok, n))
    drops_by_kind = {"zero": drops.copy(), "mean": drops}
    if not informative:  # the identity block: the last zero drop IS the credit
        drops_by_kind["zero"][:, -1] = 100 * credits[:, -1]
    out = analyse(credits, lens, direct, onset, drops_by_kind, prompt, 300, 0, 0.05,
                  {"zero": -1})
    views = decision_views(out["views"], {"zero": n, "mean": n})
    return {"out": out, "rows": verdict(out["summary"], out["paired"], out["contrast"],
                                        views, chance=out["chance"], n_clusters=40),
            "views": views}


def _decisions(rows: list) -> dict:
    return {(r["view"], r["hypothesis"]): r["supported"] for r in rows if r["decided"]}


def test_verdict_supports_hypotheses_that_hold_by_construction() -> None:
    found = _synthetic(np.random.default_rng(0), informative=True)
    assert found["views"] == ["zero w/o block 12", "mean"]
    decided = _decisions(found["rows"])
    for view in found["views"]:
        assert decided[(view, "H1")] is True
        assert decided[(view, "H2")] is True  # credit informative only where non-monotonic
        assert decided[(view, "H3")] is True  # onset = half-drop block


def test_verdict_rejects_hypotheses_that_fail_by_construction() -> None:
    found = _synthetic(np.random.default_rng(1), informative=False)
    decided = _decisions(found["rows"])
    for view in found["views"]:
        assert not any(decided[(view, h)] for h in ("H1", "H2", "H3"))
    # The identity block alone makes the last block the largest zero drop, and the
    # top-credit block is often it: the all-block view counts that, the decided one not.
    top1 = found["out"]["summary"]["all"]
    assert top1["zero"]["IG-Lens credit"]["top1"][0] > 0.05
    assert top1["zero w/o block 12"]["IG-Lens credit"]["top1"][0] < 0.15
    assert top1["zero"]["IG-Lens credit"]["top1"][0] > (
        top1["zero w/o block 12"]["IG-Lens credit"]["top1"][0])


def test_packaged_prompts_and_prompt_files(tmp_path) -> None:
    prompts = load_prompts()
    assert len(prompts) >= 25 and len(set(prompts)) == len(prompts)
    text = tmp_path / "p.txt"
    text.write_text("one\n\n two \n", encoding="utf-8")
    assert load_prompts(text) == ["one", "two"]
    bad = tmp_path / "p.jsonl"
    bad.write_text('{"text": "x"}\n', encoding="utf-8")
    with pytest.raises(ValueError, match="prompt"):
        load_prompts(bad)


@pytest.fixture
def one_thread():
    """One intra-op thread for the SmolLM2 runs: on a shared 2-core machine two OpenMP
    threads per process oversubscribe the cores (4-8x slower); results do not depend on it."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


PROMPTS = ["What is the capital of France? Answer in one word.", "What is 2 + 2?",
           "Translate \"hello\" into Spanish."]


def test_end_to_end_on_smollm2(smollm2, one_thread, tmp_path) -> None:
    model, tokenizer = smollm2
    pairs = load_pairs()[::12]  # one capital, one agreement, one antonym pair
    result = validate(model, tokenizer, PROMPTS, max_new_tokens=2, threshold=0.2, n_boot=50,
                      min_reference=50, progress=False, pairs=pairs)
    n_tok = len(result.tokens)
    assert n_tok >= 2 and result.credits.shape == (n_tok, 30)
    assert set(result.drops) == {"zero", "mean", "resample"}
    assert all(t["p_final"] >= 0.2 for t in result.tokens)
    assert all(len(t["donor_prompt_indices"]) == 2 for t in result.tokens)  # min(4, 3 - 1)
    tol = result.settings["tolerance"]
    checks = {"clean", "p_final", "spot", "last_block", "patch clean", "patch spot",
              "patch restore"}
    assert set(result.to_dict()["check_errors"]) == checks
    assert max(result.to_dict()["check_errors"].values()) <= tol
    # The last block: zero-ablation drop = IG-Lens credit = direct effect.
    assert np.allclose(result.drops["zero"][:, -1], result.credits[:, -1], atol=tol)
    # f(h_n) - f(h_n - u_n) against f(h_n) - f(h_{n-1}): the same point up to the rounding of
    # h_n - u_n, read out through the same readout (the check's float32 bound, not a guess)
    assert np.allclose(result.direct[:, -1], result.credits[:, -1], atol=tol)
    views = ["zero", "zero w/o block 30", "mean", "resample"]
    assert list(result.analysis["views"]) == views
    decided = ["zero w/o block 30", "mean", "resample", "patch w/o block 1",
               "reverse patch w/o block 1"]
    assert list(dict.fromkeys(row["view"] for row in result.verdict)) == decided
    table = result.format_table()
    assert max(len(line) for line in table.splitlines()) <= 100
    assert all(name in table for name in PREDICTORS) and PRE_STATED in table
    data = json.loads(result.to_json())
    # every metric, and the means decided where a median sits on its CI's bound
    assert data["ablation"]["summary"]["all"]["zero"]["IG-Lens credit"].keys() == {
        *METRICS, *MEANS}
    assert len(data["tokens"]) == n_tok and len(data["patching"]["pairs"]) == 3
    fig = result.plot(str(tmp_path / "v.png"))
    assert (tmp_path / "v.png").stat().st_size > 0 and len(fig.axes) == 3


def test_json_records_the_provenance(smollm2, one_thread) -> None:
    model, tokenizer = smollm2
    result = validate(model, tokenizer, PROMPTS, kinds=("zero",), max_new_tokens=1,
                      n_boot=10, seed=3, progress=False)
    prov = json.loads(result.to_json())["settings"]["provenance"]
    assert prov["torch"] == torch.__version__ and prov["transformers"]
    assert prov["weights"] == weights_digest(model) and prov["model"]
    items = hashlib.sha256(json.dumps(PROMPTS).encode()).hexdigest()
    assert prov["prompts"]["items_sha256"] == items and prov["prompts"]["count"] == 3
    packaged = resources.files("captum_iglens") / "data" / "validation_prompts.jsonl"
    assert prov["prompts"]["file_sha256"] == hashlib.sha256(
        packaged.read_text(encoding="utf-8").encode()).hexdigest()
    assert prov["settings"]["seeds"] == {"donors": 3, "random_predictor": 3, "bootstrap": 3}
    assert prov["settings"]["kinds"] == ["zero"] and "pairs" not in prov


@pytest.fixture
def no_load(monkeypatch):
    def refuse(*_args, **_kwargs):
        raise AssertionError("the model must not be loaded")

    monkeypatch.setattr(models, "load_model", refuse)


@pytest.mark.parametrize("argv", [
    ["validate", "--ablation", "shuffle"],
    ["validate", "--threshold", "1.5"],
    ["validate", "--max-new-tokens", "0"],
    ["validate", "--prompts-file", "/no/such/file.jsonl"],
    ["validate", "--pairs-file", "/no/such/pairs.jsonl"],
    ["validate", "--donors", "0"],
    ["validate", "--plot", "/no/such/folder/v.png"],
])
def test_cli_argument_errors_come_before_loading(no_load, argv, capsys) -> None:
    assert main(argv) == 2
    assert capsys.readouterr().err.startswith("iglens: error:")


def test_cli_donors_default_is_the_library_default() -> None:
    import inspect

    from captum_iglens.cli import parse_args
    from captum_iglens.settings import VALIDATE_DONORS

    library = inspect.signature(validate).parameters["donors"].default
    assert parse_args(["validate"]).donors == library == VALIDATE_DONORS


def test_cli_validate(smollm2, one_thread, monkeypatch, tmp_path, capsys) -> None:
    monkeypatch.setattr(models, "load_model",
                        lambda spec=None, use_cache=True, device_map=None: smollm2)
    prompts = tmp_path / "p.txt"
    prompts.write_text("\n".join(PROMPTS[:2]) + "\n", encoding="utf-8")
    js, png = tmp_path / "v.json", tmp_path / "v.png"
    argv = ["validate", "--prompts-file", str(prompts), "--ablation", "zero",
            "--max-new-tokens", "1", "--threshold", "0.2", "--seed", "1",
            "--json", str(js), "--plot", str(png)]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "zero ablation\n" in out and "mean ablation" not in out and "PATCHING" not in out
    assert "Verdict on" in out and "zero w/o block 30" in out
    assert json.loads(js.read_text())["settings"]["kinds"] == ["zero"]
    assert png.stat().st_size > 0


def test_cli_patching(smollm2, one_thread, monkeypatch, tmp_path, capsys) -> None:
    monkeypatch.setattr(models, "load_model",
                        lambda spec=None, use_cache=True, device_map=None: smollm2)
    chosen = load_pairs()[:2]
    pairs = tmp_path / "pairs.jsonl"
    pairs.write_text("".join(json.dumps(vars(p)) + "\n" for p in chosen), encoding="utf-8")
    js = tmp_path / "v.json"
    argv = ["validate", "--ablation", "patch", "--pairs-file", str(pairs), "--json", str(js)]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "PATCHING: 2 pairs (0 skipped)" in out and "ABLATION" not in out
    assert "patch w/o block 1" in out and "reverse patch w/o block 1" in out
    data = json.loads(js.read_text())
    assert data["settings"]["provenance"]["pairs"]["file"] == str(pairs)
    assert [p["id"] for p in data["patching"]["pairs"]] == [p.id for p in chosen]
    misaligned = tmp_path / "bad.jsonl"
    entry = {"id": "b", "category": "c", "clean": "The capital of France is",
             "corrupted": "The capital of the United Kingdom is", "answer": " Paris",
             "foil": " London"}
    misaligned.write_text(json.dumps(entry) + "\n", encoding="utf-8")
    assert main(["validate", "--ablation", "patch", "--pairs-file", str(misaligned)]) == 2
    err = capsys.readouterr().err
    assert "do not align" in err and "--ablation zero, mean or resample" in err


def _half_point_before(cumulative: np.ndarray) -> np.ndarray:
    """The numpy copy of the rule ``half_point`` had before it called the one onset rule."""
    end = cumulative[:, -1:]
    sign = np.where(end < 0, -1.0, 1.0)
    slack = 1e-12 * np.abs(cumulative).max(1, keepdims=True)
    failing = sign * cumulative < sign * 0.5 * end - slack
    n = cumulative.shape[1]
    last_fail = np.where(failing.any(1), n - 1 - np.argmax(failing[:, ::-1], axis=1), -1)
    return np.minimum(last_fail + 1, n - 1)


def test_half_point_is_the_onset_rule_of_the_lens() -> None:
    """``half_point`` and ``onset_layer_indices`` are one rule: the same columns."""
    import torch

    from captum_iglens import onset_layer_indices

    rng = np.random.default_rng(0)
    credits = rng.normal(size=(400, 7))
    credits[:50] = np.round(credits[:50] * 2) / 2  # exact ties with the half threshold
    credits[50:60] = 0.0
    cumulative = credits.cumsum(1)
    got = half_point(cumulative)
    assert got.tolist() == _half_point_before(cumulative).tolist()
    onsets = onset_layer_indices(torch.from_numpy(credits), range(1, 8))
    assert (onsets - 1).tolist() == got.tolist()
