"""The benchmark's statistics on planted measurements, its curves and its row engine."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch

from captum_iglens.validate.benchmark import analysis, measure
from captum_iglens.validate.benchmark.decide import load_preregistration
from captum_iglens.validate.benchmark.predict import GROUPS, MODEL_PREDICTORS

N_TOK, N_BLOCKS, SEEDS = 60, 8, (0, 1, 2)
KINDS = ("zero", "mean", *(f"resample#{s}" for s in SEEDS), "patch", "reverse patch")


def _data(seed: int = 0) -> dict:
    """Random measurements with the shapes measure_cell writes: 60 tokens, 8 blocks."""
    rng = np.random.default_rng(seed)
    base = {u: rng.standard_normal((N_TOK, N_BLOCKS)) for u in measure.UNITS}
    drops = {k: {u: v + 0.01 * rng.standard_normal(v.shape) for u, v in base.items()}
             for k in KINDS}
    preds = {g: {p: rng.standard_normal((N_TOK, N_BLOCKS)) for p in MODEL_PREDICTORS}
             for g in GROUPS}
    names = [*MODEL_PREDICTORS, "last layer always", "other prompts' mean drop profile",
             *(f"random#{s}" for s in SEEDS)]
    curves = {k: {part: {u: rng.random((N_TOK, N_BLOCKS + 1)) for u in measure.UNITS}
                  for part in ("deletion", "keep")} for k in names}
    subsets = {str(s): {"masks": rng.random((N_TOK, 32, N_BLOCKS)) < 0.5,
                        "drops": rng.standard_normal((N_TOK, 32))} for s in SEEDS}
    return {"n": N_BLOCKS, "drops": drops, "predictors": preds, "curves": curves,
            "subsets": subsets, "nonmonotonic": rng.random(N_TOK) < 0.4,
            "clusters": {"prompt": np.arange(N_TOK), "pair": np.arange(N_TOK) // 2}}


def _plant(data: dict, group: str, name: str, kind: str, unit: str) -> None:
    data["predictors"][group][name] = np.array(data["drops"][kind][unit])


@pytest.mark.parametrize("kind,group,unit", [("zero", "zero", "probability"),
                                             ("mean", "mean", "probability"),
                                             ("patch", "patch", "logit difference"),
                                             ("reverse patch", "patch", "logit difference")])
def test_a_planted_predictor_scores_one_and_a_shuffled_one_chance(kind, group, unit) -> None:
    prereg = load_preregistration()
    data = _data()
    _plant(data, group, "readout credit", kind, unit)
    drops = data["drops"][kind][unit]
    data["predictors"][group]["AtP"] = np.random.default_rng(5).permuted(drops, axis=1)
    values = analysis.per_token(data, 0, prereg)["rho"][kind][unit]
    for view in ("all", "decided"):
        planted = values[view]["readout credit"]
        assert np.abs(planted - 1.0).max() <= 1e-12 and planted.shape == (N_TOK,)
    cl = data["clusters"][analysis.CLUSTER_OF[kind]]
    chance = analysis.summarise(values["decided"]["AtP"], cl, 2000, 0, 2.8)
    assert chance["low"] < 0 < chance["high"] and abs(chance["mean"]) < 0.15
    assert chance["n"] == N_TOK and 0 < chance["mde"] < 0.5
    one = analysis.summarise(values["decided"]["readout credit"], cl, 200, 0, 2.8)
    assert one["mean"] == pytest.approx(1.0, abs=1e-12)


def test_the_decided_views_leave_out_the_preregistered_blocks() -> None:
    prereg = load_preregistration()
    data = _data()
    # a predictor equal to the drops everywhere but the excluded block: rho 1 on the view only
    for kind, group, unit, col in (("zero", "zero", "probability", -1),
                                   ("patch", "patch", "logit difference", 0)):
        planted = np.array(data["drops"][kind][unit])
        planted[:, col] = -100.0
        data["predictors"][group]["readout credit"] = planted
        rho = analysis.per_token(data, 0, prereg)["rho"][kind][unit]
        assert np.abs(rho["decided"]["readout credit"] - 1).max() <= 1e-12
        assert rho["all"]["readout credit"].mean() < 0.95  # the excluded block counts there


def _planted_config() -> dict:
    data = _data(3)
    rng = np.random.default_rng(9)
    noisy = {k: np.array(data["drops"][k]["logit difference"]) for k in ("patch",)}
    data["predictors"]["patch"]["AtP"] = noisy["patch"] + 0.3 * rng.standard_normal(
        noisy["patch"].shape)
    data["predictors"]["patch"]["readout credit"] = noisy["patch"] + 1.0 * rng.standard_normal(
        noisy["patch"].shape)
    data["predictors"]["mean"]["LayerIntegratedGradients"] = np.array(
        data["drops"]["mean"]["probability"]) + 0.5 * rng.standard_normal((N_TOK, N_BLOCKS))
    return data


def test_rerunning_with_another_seed_moves_no_verdict_on_a_planted_configuration() -> None:
    prereg = load_preregistration()
    found = analysis.analyse(_planted_config(), prereg, 200, SEEDS)
    hyp = found["hypotheses"]
    assert hyp["B1"]["verdict"] == "supported"  # AtP planted nearer the patching drops
    assert hyp["B7"]["verdict"] == "supported"  # the credit beats "last layer always"
    assert hyp["B9"]["verdict"] == "supported"  # LIG planted, vs random
    assert hyp["B8"]["verdict"] in ("not supported", "reversed")  # both random
    for cell in hyp.values():
        assert set(cell["seed_verdicts"]) == {"0", "1", "2"}
        assert cell["unstable"] is False, cell
        if cell["verdict"] != "n/a":
            assert cell["n_tokens"] == N_TOK and np.isfinite(cell["mde"])
    assert set(hyp) == {h["id"] for h in prereg.hypotheses}
    assert set(hyp["B6"]) >= {"parts"} and len(hyp["B6"]["parts"]) == 2
    names = analysis.predictor_names(prereg)
    for kind in analysis.INTERVENTIONS:
        unit = analysis.PRIMARY_UNIT(prereg, kind)
        assert set(found["scores"][kind][unit]["decided"]) == set(names)
    assert set(found["curves"]["comprehensiveness"]) == set(names)
    assert set(found["magnitude"]) == set(names)


def test_too_few_tokens_give_na_never_supported() -> None:
    prereg = load_preregistration()
    data = _planted_config()
    keep = np.arange(12)

    def cut(x):
        if isinstance(x, dict):
            return {k: cut(v) for k, v in x.items()}
        return np.asarray(x)[keep] if np.ndim(x) else x

    small = {k: cut(v) for k, v in data.items()}
    hyp = analysis.analyse(small, prereg, 100, SEEDS[:1])["hypotheses"]
    assert {c["verdict"] for c in hyp.values()} == {"n/a"}


def test_the_rho_gap_of_b5_is_the_group_difference() -> None:
    prereg = load_preregistration()
    data = _data(4)
    values = analysis.per_token(data, 0, prereg)
    h = next(h for h in prereg.hypotheses if h["id"] == "B5")
    weighted, _, _, reason = analysis._statistic(h, values, data, prereg)
    assert reason == ""
    view = values["rho"]["mean"]["probability"]["decided"]
    diff = view["readout credit"] - view["logit-lens level"]
    flags = np.asarray(data["nonmonotonic"])
    expected = diff[flags].mean() - diff[~flags].mean()
    assert np.mean(weighted) == pytest.approx(expected, abs=1e-12)


def test_row_spearman_is_scipys_row_by_row() -> None:
    from scipy.stats import spearmanr

    rng = np.random.default_rng(2)
    a = rng.integers(0, 4, (30, 7)).astype(float)  # ties
    b = rng.standard_normal((30, 7))
    a[3] = 1.0  # a constant row: NaN
    got = analysis.row_spearman(a, b)
    assert np.isnan(got[3])
    for i in (0, 1, 2, 4, 29):
        assert got[i] == pytest.approx(spearmanr(a[i], b[i]).statistic, abs=1e-12)


def test_deletion_and_keep_curves_of_a_planted_ordering_give_the_extreme_areas() -> None:
    rng = np.random.default_rng(0)
    effects = rng.random(6)  # an additive toy: a joint ablation drops the sum of its effects

    def areas(scores):
        delete, keep = measure.joint_masks(scores)
        return (delete @ effects).mean(), (keep @ effects).mean()

    planted = areas(effects)
    every = [areas(np.array(order, float)) for order in itertools.permutations(range(6))]
    assert planted[0] == pytest.approx(max(c for c, _ in every), abs=1e-12)
    assert planted[1] == pytest.approx(min(s for _, s in every), abs=1e-12)
    reversed_ = areas(-effects)
    assert reversed_[0] == pytest.approx(min(c for c, _ in every), abs=1e-12)
    delete, keep = measure.joint_masks(effects)
    assert delete.shape == (7, 6) and not delete[0].any() and delete[-1].all()
    assert (keep == ~delete).all()


def test_infidelity_is_captums_formula_on_block_masks() -> None:
    from captum.metrics import infidelity

    rng = np.random.default_rng(1)
    n, m = 5, 16
    weights = torch.tensor(rng.standard_normal(n))
    masks = torch.tensor(rng.random((m, n)) < 0.5, dtype=torch.float64)

    def forward(gates):  # a nonlinear function of the blocks kept
        return torch.tanh(gates @ weights) + (gates[:, 0] * gates[:, 1])

    def perturb(inputs):
        return masks, inputs - masks

    attr = torch.tensor(rng.standard_normal(n))[None]
    ones = torch.ones(1, n, dtype=torch.float64)
    theirs = infidelity(forward, perturb, ones, attr, n_perturb_samples=m, normalize=False)
    drops = (forward(ones) - forward(ones - masks)).numpy()
    ours = analysis.infidelity(attr.numpy(), masks.numpy().astype(bool)[None], drops[None])
    assert ours[0] == pytest.approx(float(theirs[0]), rel=1e-10)


def test_joint_rows_match_a_full_hooked_forward() -> None:
    from tiny_families import make_family

    from captum_iglens.validate.ablation import BlockAblation
    from captum_iglens.validate.ablation_hooks import eval_mode, hooked
    from captum_iglens.validate.ablation_rows import token_probs

    model = make_family("llama", seed=0, n_blocks=4).eval()
    ablation = BlockAblation(model)
    ids = torch.tensor([5, 17, 3, 40, 9, 22])
    trace, pos, y = ablation.trace(ids), 5, 7
    mask = np.array([[True, False, True, False], [True, True, True, True]])
    got = measure.masked_rows(ablation, trace, pos, torch.tensor(mask), None,
                              torch.tensor([y]))[:, 0].double()
    zeros = torch.zeros(1, trace.hidden.shape[-1], dtype=trace.hidden.dtype)
    plan = {1: (torch.tensor([1]), zeros), 3: (torch.tensor([1]), zeros)}
    with eval_mode(model), hooked(ablation.blocks, plan, pos):
        logits = model(ids[None].expand(2, -1), use_cache=False).logits[:, pos]
    full = token_probs(logits, torch.tensor([y]))[:, 0].double()
    tol = 64 * torch.finfo(torch.float32).eps
    assert abs(float(got[0] - full[0])) <= tol and abs(float(got[1] - full[1])) <= tol
    # every update removed: the readout of the embedding itself
    with torch.no_grad():
        alone = token_probs(ablation.readout(trace.hidden[pos, 0][None]), torch.tensor([y]))
    assert abs(float(got[2] - alone[0, 0])) <= tol
    # rows that change nothing are the clean row, even when no row changes anything
    none = measure.masked_rows(ablation, trace, pos, torch.zeros(2, 4, dtype=torch.bool), None,
                               torch.tensor([y]))[:, 0].double()
    assert float((none - got[0]).abs().max()) <= tol


def test_the_onset_of_last_layer_always_is_the_last_block() -> None:
    prereg = load_preregistration()
    data = _data(6)
    drops = np.zeros((N_TOK, N_BLOCKS))
    drops[:, -1] = 1.0  # every recovery sits in the last block: its half point is the last
    data["drops"]["patch"]["logit difference"] = drops + 1e-3 * np.arange(N_BLOCKS)
    gains = analysis.per_token(data, 0, prereg)["onset_gain"]["patch"]
    n_view = N_BLOCKS - 1  # block 1 left out
    chance = np.abs(np.arange(n_view) - (n_view - 1)).mean()
    assert np.abs(gains["last layer always"] - chance).max() <= 1e-12  # the best gain there is
    assert (gains["random"] <= chance + 1e-12).all()
