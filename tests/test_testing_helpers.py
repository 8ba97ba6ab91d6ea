"""captum_iglens.testing: the assertions fail loudly on what they exist to catch."""

from __future__ import annotations

import dataclasses

import conftest
import pytest
import tiny_families
import tiny_tokenizer
import torch
from _tolerance import (
    EPS32,
    completeness_tol,
    f32_tol,
    readout_prob_magnitude,
    reduction_length,
)

from captum_iglens import IGLens, explain_ids
from captum_iglens.lens.readout import LensReadout, resolve_readout
from captum_iglens.testing import (
    FAMILIES,
    assert_complete,
    assert_readout_exact,
    assert_telescopes_like_captum,
    tiny_causal_lm,
    word_tokenizer,
)
from captum_iglens.testing import tiny as package_tiny
from captum_iglens.testing._captum import _differences

IDS_TEXT = "w1 w2 w3 w4 w5 w6 w7"


def test_the_suite_factory_is_the_package_factory() -> None:
    """One copy: the suite's helpers re-export the package's objects themselves."""
    assert tiny_families.make_family is package_tiny.make_family
    assert tiny_families.SPECS is package_tiny.SPECS
    assert conftest.perturb_norms is package_tiny.perturb_norms
    assert tiny_tokenizer.word_tokenizer is word_tokenizer
    assert tuple(tiny_families.FAMILY_NAMES) == FAMILIES and len(FAMILIES) >= 40


def test_tiny_causal_lm_sizes_and_tokenizer() -> None:
    model, tok = tiny_causal_lm("gpt2", n_layers=3, hidden=32, vocab=64, seed=5)
    assert not model.training and model.config.n_layer == 3 and model.config.n_embd == 32
    assert model.get_output_embeddings().weight.shape == (64, 32)
    assert tok("w0 w59", add_special_tokens=False).input_ids == [4, 63]
    assert len(tok) == 64 and tok.pad_token_id == 0 and tok.eos_token_id == 2
    # norms are perturbed (weight 1 / bias 0 would hide a missing final norm) ...
    assert (model.transformer.ln_f.weight - 1).abs().max() > 0.1
    plain, _ = tiny_causal_lm("gpt2", n_layers=3, hidden=32, vocab=64, seed=5,
                              perturb_norms=False)
    # exact: untouched initial norm weights are exactly one
    assert bool((plain.transformer.ln_f.weight == 1).all())
    with pytest.raises(ValueError, match="Unknown tiny family 'nope'"):
        tiny_causal_lm("nope")


def _model_and_ids(family: str) -> tuple:
    model, tok = tiny_causal_lm(family)
    return model, tok(IDS_TEXT, return_tensors="pt").input_ids


@pytest.mark.numerics
@pytest.mark.parametrize("family", FAMILIES)
def test_readout_is_exact_on_every_family(family: str) -> None:
    model, ids = _model_and_ids(family)
    ratio = assert_readout_exact(model, ids)
    assert ratio.shape == ids.shape and bool((ratio <= 1).all())


@pytest.mark.numerics
def test_readout_bound_is_the_suites_and_holds() -> None:
    """The helper's bound is the suite's ``f32_tol`` of its magnitude (one copy of the
    magnitude, in captum_iglens.testing), and it holds: the float32 readout's probabilities
    stay within it of a float64 readout of the same residuals."""
    import copy

    model, ids = _model_and_ids("llama")
    lens = IGLens(model)
    from captum_iglens.testing._bounds import readout_tolerance
    from captum_iglens.testing._readout import last_residuals

    hidden, _ = last_residuals(lens, ids)
    mag = readout_prob_magnitude(lens.readout, hidden)
    expected = f32_tol(mag, mag, n_terms=reduction_length(lens.readout))
    tol = readout_tolerance(lens.readout, hidden)
    torch.testing.assert_close(tol, expected, rtol=1e-12, atol=0)
    wide = copy.deepcopy(lens.readout).double()
    with torch.no_grad():
        p32 = torch.softmax(lens.readout(hidden).double(), -1)
        p64 = torch.softmax(wide(hidden.double()), -1)
    err = (p32 - p64).abs()
    assert bool((err <= tol).all()) and float(err.max()) > 0.0


def _broken(model, kind: str):
    ro = resolve_readout(model)
    if kind == "final norm":
        return LensReadout(None, ro.unembed, ro.pre_unembed, ro.logit_transform)
    if kind == "soft-cap":
        return LensReadout(ro.final_norm, ro.unembed, ro.pre_unembed, None)
    return lambda h: ro(torch.roll(h, 1, dims=-2))  # off by one position


@pytest.mark.parametrize("family, kind", [("llama", "final norm"), ("gpt2", "final norm"),
                                          ("gemma2", "soft-cap"), ("granite", "soft-cap"),
                                          ("llama", "position"), ("gpt2", "position")])
def test_readout_helper_catches_a_broken_readout(family: str, kind: str) -> None:
    model, ids = _model_and_ids(family)
    lens = IGLens(model, readout=_broken(model, kind), check_readout=False)
    with pytest.raises(AssertionError, match=r"Invariant R fails.*Worst: row 0, position \d+, "
                                             r"token id \d+: lens p = .*> bound"):
        assert_readout_exact(model, ids, lens=lens)


def test_readout_helper_skips_masked_positions() -> None:
    model, _ = _model_and_ids("llama")
    ids = torch.tensor([[0, 0, 9, 10, 11]])
    mask = torch.tensor([[0, 0, 1, 1, 1]])
    ratio = assert_readout_exact(model, ids, attention_mask=mask)
    # exact: masked positions are multiplied by a zero mask
    assert bool((ratio[:, :2] == 0).all())


@pytest.fixture(scope="module")
def llama_out():
    model, ids = _model_and_ids("llama")
    return IGLens(model).attribute_details(ids, positions=[-3, -2, -1])


def test_assert_complete_on_every_result_kind(llama_out) -> None:
    gaps = assert_complete(llama_out)
    assert gaps.shape == (3,)
    bound = completeness_tol(llama_out.attributions, llama_out.delta_p).reshape(-1)
    assert bool((gaps <= bound).all())
    assert assert_complete(llama_out.attributions, llama_out.delta_p).shape == (3,)
    model, _ = _model_and_ids("llama")
    result = explain_ids(model, [5, 9, 14], [20, 21, 22], layers=[0, 1, 2])
    assert assert_complete(result).shape == (3,)
    assert_complete(result.to_captum())  # baseline_attr + each row: delta_p


def test_assert_complete_bound_is_derived_not_a_constant() -> None:
    credits = torch.tensor([[0.5, -0.25, 0.125, 0.0625]])
    exact = credits.double().sum(-1)
    bound = EPS32 / 2 * (4 * 0.9375 + float(exact.abs()))
    assert_complete(credits, exact + 0.9 * bound)
    with pytest.raises(AssertionError, match="1 of 1 predictions"):
        assert_complete(credits, exact + 1.1 * bound)
    # ten times larger credits: ten times the bound
    assert_complete(10 * credits, 10 * exact + 9 * bound)
    # the caller's tolerance instead: atol + rtol |delta_p|
    assert_complete(credits, exact + 5e-4, atol=1e-3)
    with pytest.raises(AssertionError, match=r"atol=0 \+ rtol=0.001"):
        assert_complete(credits, exact + 5e-4, rtol=1e-3)  # 1e-3 * 0.4375 < 5e-4


def test_assert_complete_names_the_worst_token_and_layer(llama_out) -> None:
    broken = dataclasses.replace(llama_out, attributions=llama_out.attributions.clone())
    broken.attributions[0, 1, 1] += 1e-4  # position -2 (index 5), layer L2
    with pytest.raises(AssertionError) as info:
        assert_complete(broken)
    text = str(info.value)
    assert "1 of 3 predictions" in text
    assert f"row 0, position 5, target id {int(llama_out.target[0, 1])}" in text
    assert "worst layer L2: its credit" in text and "f(h_L1) -> f(h_L2)" in text


def test_assert_complete_catches_a_gradient_estimators_discretisation() -> None:
    model, ids = _model_and_ids("gpt2")
    with pytest.warns(UserWarning, match="has not converged"):
        coarse = IGLens(model).attribute_details(ids, method="riemann_left", n_steps=2)
    with pytest.raises(AssertionError, match="worst layer L[12]: its credit"):
        assert_complete(coarse)


def test_assert_complete_errors(llama_out) -> None:
    with pytest.raises(TypeError, match="needs the totals"):
        assert_complete(llama_out.attributions)
    with pytest.raises(ValueError, match="delta_p has shape"):
        assert_complete(llama_out.attributions, torch.zeros(2))
    with pytest.raises(TypeError, match="not the \\(attributions, delta\\) tuple"):
        assert_complete((llama_out.attributions, llama_out.convergence_delta))
    with pytest.raises(ValueError, match="every delta_p is NaN"):
        assert_complete(llama_out.attributions, torch.full_like(llama_out.delta_p, float("nan")))


@pytest.mark.numerics
def test_telescopes_like_captum_returns_the_gaps() -> None:
    model, ids = _model_and_ids("llama")
    reference = torch.full_like(ids, 3)
    check = assert_telescopes_like_captum(model, ids, layers=[0, 1, 2], reference_ids=reference,
                                          n_steps=16)
    assert check.total.shape == (1,) and float(check.total.abs()) > 1e-3
    assert float(check["ig_lens"]) <= float(EPS32 * check.total.abs())
    # k = 3 layer runs, each ~ the whole change: LayerIG's sum is ~3 totals
    assert float(check["layer_integrated_gradients"]) == pytest.approx(
        2 * float(check.total.abs()), rel=0.05)
    rep = check.result
    # a total IG-Lens does not share is caught, naming the method and layer
    rep["ig_lens"].total += 1e-3
    messages = _differences(rep, ["layer_integrated_gradients"], 1e-7)
    assert len(messages) == 3 and messages[0].startswith("LayerIG at layer emb (row 0")


@pytest.mark.numerics
def test_telescopes_like_captum_on_a_batch_and_positions() -> None:
    model, tok = tiny_causal_lm("gpt2")
    ids = tok(["w1 w2 w3 w4 w5", "w9 w8 w7 w6 w5"], return_tensors="pt").input_ids
    check = assert_telescopes_like_captum(
        model, ids, layers=[1, 2], reference_ids=torch.full_like(ids, 3), n_steps=4,
        position=[-2, -1], methods=["layer_integrated_gradients"])
    assert check.total.shape == check["ig_lens"].shape == (2, 2)
    assert len(check.result) == 4 and check.result.passed
    torch.testing.assert_close(check["layer_integrated_gradients"], check.total.abs(),
                               rtol=0.05, atol=0)  # k = 2 runs: the sum is ~2 totals
