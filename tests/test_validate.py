"""The causal validation: its metrics and bootstrap, the packaged prompts, an end-to-end run
on the embedded SmolLM2 and the ``iglens validate`` command."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from scipy import stats

from captum_iglens import models
from captum_iglens.cli import main
from captum_iglens.validate import load_prompts, validate
from captum_iglens.validate_stats import (
    METRICS,
    PREDICTORS,
    cluster_bootstrap,
    half_point,
    nonmonotonic,
    token_metrics,
)


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
    result = validate(model, tokenizer, PROMPTS, max_new_tokens=2, threshold=0.2, n_boot=50,
                      min_reference=50, progress=False)
    n_tok = len(result.tokens)
    assert n_tok >= 2 and result.credits.shape == (n_tok, 30)
    assert set(result.drops) == {"zero", "mean", "resample"}
    assert all(t["p_final"] >= 0.2 for t in result.tokens)
    tol = result.settings["tolerance"]
    assert set(result.check_errors) == {"clean", "p_final", "spot", "last_block"}
    assert max(result.check_errors.values()) <= tol
    # The last block: zero-ablation drop = IG-Lens credit = direct effect.
    assert np.allclose(result.drops["zero"][:, -1], result.credits[:, -1], atol=tol)
    assert np.allclose(result.direct[:, -1], result.credits[:, -1], atol=1e-6)
    table = result.format_table()
    assert max(len(line) for line in table.splitlines()) <= 100
    assert all(name in table for name in PREDICTORS)
    data = json.loads(result.to_json())
    assert data["summary"]["all"]["zero"]["IG-Lens credit"].keys() == set(METRICS)
    assert len(data["tokens"]) == n_tok
    fig = result.plot(str(tmp_path / "v.png"))
    assert (tmp_path / "v.png").stat().st_size > 0 and len(fig.axes) == 2


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
    ["validate", "--plot", "/no/such/folder/v.png"],
])
def test_cli_argument_errors_come_before_loading(no_load, argv, capsys) -> None:
    assert main(argv) == 2
    assert capsys.readouterr().err.startswith("iglens: error:")


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
    assert "zero ablation, all tokens" in out and "mean ablation" not in out
    assert json.loads(js.read_text())["settings"]["kinds"] == ["zero"]
    assert png.stat().st_size > 0
