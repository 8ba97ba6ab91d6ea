"""The total effect and AtP as predictors of ``validate`` (issue 29, item 7), on a tiny llama."""

from __future__ import annotations

import json
import warnings

import numpy as np
import pytest
import torch
from tiny_families import make_family
from tiny_tokenizer import word_tokenizer

from captum_iglens import IGLens
from captum_iglens.validate.driver import validate
from captum_iglens.validate.predictors import add_predictors
from captum_iglens.validate.stats import analyse
from captum_iglens.validate.verdict import EXCLUDED_BLOCK

PROMPTS = ["w4 w5 w6", "w7 w8 w9 w10", "w11 w12 w3", "w13 w14 w15"]


@pytest.fixture(scope="module")
def run():
    model = make_family("llama", n_blocks=3).eval()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the word tokenizer has no chat template
        result = validate(model, word_tokenizer(), PROMPTS, kinds=("zero", "mean"),
                          threshold=0.0, max_new_tokens=2, n_boot=20, progress=False,
                          min_reference=1)
    return model, result


def test_tables_and_json_hold_the_effect_predictors(run) -> None:
    _, result = run
    table = result.format_table()
    for view in ("zero", "mean", "zero w/o block 3"):
        block = table.split(f"\n{view} ablation\n", 1)[1].split("\n\n", 1)[0]
        assert any(line.startswith("total effect ") for line in block.splitlines()), view
        assert any(line.startswith("AtP ") for line in block.splitlines()), view
    assert "AtP: first-order estimate" in table
    assert max(len(line) for line in table.splitlines()) <= 100
    assert set(result.summary["all"]["mean"]) >= {"IG-Lens credit", "total effect", "AtP"}
    assert "total effect" in result.paired["all"]["zero"]
    data = json.loads(result.to_json())
    assert "total effect" in data["predictors"] and data["settings"]["effects"] == ["total",
                                                                                    "atp"]
    assert len(data["tokens"][0]["predictors"]["mean"]["AtP"]) == 3


def test_the_scores_are_the_lens_own(run) -> None:
    # the stored total effect of a token is IGLens(effect="total") at its position
    model, result = run
    token = result.tokens[0]
    p = token["prompt_index"]
    rows = [i for i, t in enumerate(result.tokens) if t["prompt_index"] == p]
    answer_ids = word_tokenizer()(PROMPTS[p])["input_ids"]
    ids = torch.tensor([answer_ids + [t["token_id"] for t in result.tokens if
                                      t["prompt_index"] == p]])
    out = IGLens(model, effect="total").attribute_details(
        ids, "zero", target=torch.tensor([[token["token_id"]]]), positions=token["position"],
        n_steps=8)
    got = result.predictors["zero"]["total effect"][rows[0]]
    assert np.abs(got - out.attributions[0, 0].double().numpy()).max() <= 1e-6


def test_a_planted_predictor_equal_to_the_drop_scores_rho_one() -> None:
    rng = np.random.default_rng(0)
    n_tok, n = 24, 6
    drops = {"zero": rng.standard_normal((n_tok, n)), "mean": rng.standard_normal((n_tok, n))}
    prompt = np.repeat(np.arange(6), 4)
    credits, lens = rng.standard_normal((n_tok, n)), rng.random((n_tok, n))
    onset = rng.integers(0, n, n_tok)
    analysis = analyse(credits, lens, credits, onset, drops, prompt, 50, 0, 0.05,
                       EXCLUDED_BLOCK)
    planted = {"mean": {"planted": drops["mean"].copy(), "noise": rng.standard_normal((n_tok,
                                                                                      n))}}
    add_predictors(analysis, planted, drops, prompt, 50, 0, EXCLUDED_BLOCK)
    rho = analysis["summary"]["all"]["mean"]["planted"]["spearman"]
    assert rho == pytest.approx([1.0, 1.0, 1.0], abs=1e-12)
    assert analysis["summary"]["all"]["mean"]["planted"]["top1"][0] == pytest.approx(1.0)
    # the noise predictor is not: the check has teeth
    assert analysis["summary"]["all"]["mean"]["noise"]["spearman"][0] < 0.5
    assert "planted" not in analysis["summary"]["all"]["zero"]  # only its own kind
    paired = analysis["paired"]["all"]["mean"]["planted"]["spearman"][0]
    ours = analysis["summary"]["all"]["mean"]["IG-Lens credit"]["spearman"][0]
    assert paired == pytest.approx(ours - 1.0, abs=0.2)  # medians of differences


def test_effects_can_be_left_out_and_are_checked() -> None:
    model = make_family("llama", n_blocks=3).eval()
    with pytest.raises(ValueError, match="effects must be among"):
        validate(model, word_tokenizer(), PROMPTS, kinds=("zero",), effects=("causal",))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        result = validate(model, word_tokenizer(), PROMPTS, kinds=("zero",), threshold=0.0,
                          max_new_tokens=1, n_boot=5, progress=False, effects=())
    assert result.predictors == {} and "total effect" not in result.format_table()
