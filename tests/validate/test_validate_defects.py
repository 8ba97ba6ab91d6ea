"""Defects of the pre-stated test found in review (issue 30), each pinned by a test.

Each test failed on the code before its fix: H2's statistic, H3's chance value and its
last-layer comparator, a verdict on too few clusters or a zero-width interval, the
mirrored patching couples, the patching progress bar under ``--no-progress``, and the
two cluster bootstraps of the package giving the same numbers.
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import torch

from captum_iglens._utils.progress import progress_bars
from captum_iglens.summary.bootstrap import cluster_mean_ci
from captum_iglens.validate import patching
from captum_iglens.validate.metrics import onset_gain
from captum_iglens.validate.pairs import PromptPair, couple_clusters
from captum_iglens.validate.report import analyse_patches
from captum_iglens.validate.stats import analyse, cluster_bootstrap, onset_gain_chance
from captum_iglens.validate.verdict import STATISTICS, decision_views, verdict

_N_PROMPTS, _PER, _N = 40, 6, 12


def _run(credits, lens, drops, onset, prompt=None, n_boot=300):
    prompt = np.repeat(np.arange(_N_PROMPTS), _PER) if prompt is None else prompt
    direct = np.random.default_rng(9).standard_normal(credits.shape)
    out = analyse(credits, lens, direct, onset, {"mean": drops}, prompt, n_boot, 0, 0.05)
    views = decision_views(out["views"], {"mean": credits.shape[1]})
    rows = verdict(out["summary"], out["paired"], out["contrast"], views,
                   chance=out["chance"], n_clusters=len(np.unique(prompt)))
    return out, {r["hypothesis"]: r["supported"] for r in rows if r["decided"]}, rows


def _trajectories(rng):
    """Monotonic tokens: the lens level rises as the drops do; non-monotonic ones dip and
    their drops are noise. Credit ranks every token's drops exactly."""
    n_tok = _N_PROMPTS * _PER
    flags = np.arange(n_tok) % 2 == 1
    lens = np.tile(np.linspace(0.0, 0.9, _N), (n_tok, 1))
    lens[flags, 5] -= 0.3
    drops = np.where(flags[:, None], rng.standard_normal((n_tok, _N)), lens)
    return drops, lens, flags


def test_h2_decides_the_gap_over_the_lens_level() -> None:
    drops, lens, flags = _trajectories(np.random.default_rng(0))
    credits = drops.copy()  # rho(credit) = 1 on both groups: its own rho does not move
    onset = np.zeros(len(drops), dtype=int)
    out, decided, _ = _run(credits, lens, drops, onset)
    assert out["nonmonotonic"].tolist() == flags.tolist()
    # the credit's lead over the lens level is 0 on monotonic tokens, about 1 on the others
    assert decided["H2"] is True
    h2 = [s for s in STATISTICS if s.hypothesis == "H2"]
    assert [(s.table, s.predictor) for s in h2] == [("contrast paired", "lens level")]


def test_onset_gain_chance_is_the_median_under_random_onsets() -> None:
    rng = np.random.default_rng(1)
    half = rng.integers(0, 30, 2000)
    chance = onset_gain_chance(half, 30)
    draws = [np.median(onset_gain(rng.integers(0, 30, 2000), half, 30)) for _ in range(400)]
    assert abs(chance - np.mean(draws)) < 5 * np.std(draws) / np.sqrt(400) + 0.05
    assert chance > 0.5  # the median's chance value is not 0


def test_h3_is_not_supported_by_a_random_onset_or_by_the_last_layer() -> None:
    rng = np.random.default_rng(2)
    drops, lens, _ = _trajectories(rng)
    credits = rng.standard_normal(drops.shape)
    random_onset = rng.integers(0, _N, len(drops))
    out, decided, _ = _run(credits, lens, drops, random_onset, n_boot=1000)
    assert out["chance"]["mean"]["onset_gain"] > 0
    assert decided["H3"] is not True
    # an onset that is always the last block, where the half-drop block is late: it beats
    # chance, but not the comparator "last layer always"
    late = np.tile(np.r_[np.zeros(_N - 1), 1.0], (len(drops), 1))
    _, decided, rows = _run(credits, lens, late, np.full(len(drops), _N - 1))
    assert any("last layer" in r["statistic"] for r in rows if r["hypothesis"] == "H3")
    assert decided["H3"] is not True


def test_too_few_clusters_or_a_zero_width_ci_is_na_not_supported() -> None:
    rng = np.random.default_rng(3)
    drops = rng.standard_normal((3, _N))
    prompt = np.arange(3)
    out = analyse(drops, -drops, drops, np.zeros(3, dtype=int), {"mean": drops}, prompt,
                  300, 0, 0.05)
    # H1's paired difference is exactly 2 on every pair: a zero-width interval
    assert out["paired"]["all"]["mean"]["lens level"]["spearman"][1:] == [2.0, 2.0]
    rows = verdict(out["summary"], out["paired"], out["contrast"], ["mean"])
    assert {r["supported"] for r in rows if r["hypothesis"] == "H1"} == {None}
    rows = verdict(out["summary"], out["paired"], out["contrast"], ["mean"], n_clusters=3)
    assert {r["supported"] for r in rows if r["decided"]} == {None}


def _pair(i: str, clean: str, corrupted: str, answer: str, foil: str) -> PromptPair:
    return PromptPair(i, "c", clean, corrupted, answer, foil)


def test_mirrored_couples_are_one_cluster() -> None:
    pairs = [_pair("a", "x", "y", " 1", " 2"), _pair("b", "y", "x", " 2", " 1"),
             _pair("c", "u", "v", " 3", " 4"), _pair("d", "w", "v", " 5", " 4")]
    assert couple_clusters(pairs).tolist() == [0, 0, 1, 2]
    rng = np.random.default_rng(4)
    patches = [SimpleNamespace(
        pair=p, credits=torch.tensor(rng.standard_normal(_N)), lens=torch.tensor(
            rng.standard_normal(_N)), direct=torch.tensor(rng.standard_normal(_N)),
        recovery=torch.tensor(rng.standard_normal(_N)),
        reverse=torch.tensor(rng.standard_normal(_N)), onset=0, position=1, target=1,
        foil=2, f_clean=0.5, f_corrupted=0.1, embedding_recovery=0.0,
        check_errors={"clean": 0.0}) for p in pairs]
    out = analyse_patches(patches, [], 50, 0, 0.05)
    assert out["clusters"] == [0, 0, 1, 2]


def test_no_progress_silences_the_patching_bar(monkeypatch, capsys) -> None:
    pairs = [_pair(str(i), "x", "y", " 1", " 2") for i in range(3)]
    monkeypatch.setattr(patching, "pair_ids", lambda tok, pair: None)
    monkeypatch.setattr(patching, "patch_pair", lambda *a, **k: "patched")
    ablation = SimpleNamespace(num_layers=4)
    patching.patch_pairs(ablation, None, pairs, progress=True)
    assert "patch" in capsys.readouterr().err  # the bar shows without --no-progress
    with progress_bars(False):
        found, _ = patching.patch_pairs(ablation, None, pairs, progress=True)
    assert found == ["patched"] * 3 and capsys.readouterr().err == ""


def test_the_two_cluster_bootstraps_give_the_same_numbers() -> None:
    rng = np.random.default_rng(5)
    counts = rng.integers(1, 6, 15)
    tokens = rng.standard_normal((int(counts.sum()), 3))
    edges = np.r_[0, np.cumsum(counts)]
    groups = [np.arange(edges[g], edges[g + 1]) for g in range(15)]
    sums = np.stack([tokens[g].sum(0) for g in groups])
    low, high = cluster_mean_ci(sums, counts.astype(np.float64), n_boot=2000, seed=7)
    table = cluster_bootstrap(tokens, np.ones(3, dtype=bool), groups, n_boot=2000, seed=7)
    tol = 16 * np.finfo(np.float64).eps * np.abs(tokens).max()
    np.testing.assert_allclose(low, table[:, 1], rtol=0, atol=tol)
    np.testing.assert_allclose(high, table[:, 2], rtol=0, atol=tol)


def test_the_weighted_bootstrap_is_the_loop_over_concatenated_resamples() -> None:
    from captum_iglens.validate import stats

    rng = np.random.default_rng(6)
    cols = rng.standard_normal((300, 4))
    cols[:, 1] = np.round(cols[:, 1])  # discrete: ties and even-count medians
    rates = np.array([True, False, False, True])
    groups = [np.arange(10 * i, 10 * (i + 1) - i % 3) for i in range(30)]
    draws, _ = cluster_bootstrap(cols, rates, groups, 500, 3, return_draws=True)
    picks = stats.cluster_draws(len(groups), 500, 3)
    loop = np.stack([stats._statistic(cols[np.concatenate([groups[g] for g in p])], rates)
                     for p in picks])
    assert np.array_equal(draws[:, ~rates], loop[:, ~rates])  # medians: the same values
    tol = 16 * np.finfo(np.float64).eps * np.abs(cols).max()
    np.testing.assert_allclose(draws[:, rates], loop[:, rates], rtol=0, atol=tol)
