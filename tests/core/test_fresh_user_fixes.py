"""Refusals a fresh user found missing: settings that contradict the lens, a lens of another
model or with the wrong output, a readout estimator for the total effect, and the total
effect's convergence warning."""

from __future__ import annotations

import warnings

import pytest
import torch

from captum_iglens import IGLens
from captum_iglens._core.estimators import ESTIMATORS, register_estimator
from captum_iglens.settings import AttributionSettings
from captum_iglens.testing import tiny_causal_lm


@pytest.fixture(scope="module")
def lm():
    model, _ = tiny_causal_lm("llama", n_layers=3)
    return model


def _ids() -> torch.Tensor:
    return torch.tensor([[3, 17, 5, 9, 22, 11]])


@pytest.mark.parametrize("field, value", [("units", "log-probability"), ("effect", "total"),
                                          ("granularity", "sublayer")])
def test_settings_that_contradict_the_lens_are_refused(lm, field, value) -> None:
    with pytest.raises(ValueError, match="choose the lens"):
        IGLens(lm).attribute_details(_ids(), settings=AttributionSettings(**{field: value}))


def test_settings_that_agree_with_the_lens_are_taken(lm) -> None:
    lens = IGLens(lm, units="log-probability")
    given = AttributionSettings(units="log-probability", n_steps=8)
    out = lens.attribute_details(_ids(), settings=given)
    assert out.units == "log-probability" and out.n_steps == 8


@pytest.mark.parametrize("field, value", [("units", "logits"), ("effect", "foo"),
                                          ("granularity", "foo"), ("scope", "everywhere")])
def test_settings_refuse_unknown_values(field, value) -> None:
    with pytest.raises(ValueError, match=field):
        AttributionSettings(**{field: value})


def test_a_lens_object_of_another_model_is_refused(lm) -> None:
    from captum_iglens.lens.translators import LensDigestError, TunedLens

    other, _ = tiny_causal_lm("llama", n_layers=3, seed=1)
    with pytest.raises(LensDigestError, match="fitted on the model"):
        IGLens(lm, lens=TunedLens.for_model(other))
    IGLens(other, lens=TunedLens.for_model(other))  # its own model: accepted


@pytest.mark.parametrize("bad", [lambda h, layer: h, lambda h, layer: None])
def test_a_lens_returning_no_logits_is_refused(lm, bad) -> None:
    with pytest.raises(TypeError, match="must return logits"):
        IGLens(lm, lens=bad).attribute(_ids())


def test_a_readout_estimator_is_refused_for_the_total_effect(lm) -> None:
    def endpoints(readout, path, values, method, n_steps, chunk):  # noqa: ARG001
        return values[..., 1:] - values[..., :-1]

    register_estimator("endpoints_t", endpoints, exact=True)
    try:
        with pytest.raises(ValueError, match="readout estimator"):
            IGLens(lm, effect="total").attribute(_ids(), method="endpoints_t")
    finally:
        ESTIMATORS.pop("endpoints_t", None)


def test_the_total_effect_warns_when_a_gradient_rule_has_not_converged(lm) -> None:
    lens = IGLens(lm, effect="total")
    out = lens.attribute_details(_ids(), "zero", method="riemann_left", n_steps=2)
    gap = float(out.convergence_delta.abs().max())
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        lens.attribute_details(_ids(), "zero", method="riemann_left", n_steps=2)
    said = [w for w in seen if "has not converged" in str(w.message)]
    from captum_iglens._core.estimators import CONVERGENCE_WARNING

    assert bool(said) == (gap > CONVERGENCE_WARNING)


def test_settings_of_another_type_are_refused(lm) -> None:
    with pytest.raises(TypeError, match="takes an object of AttributionSettings"):
        IGLens(lm).attribute(_ids(), settings={"n_steps": 8})


@pytest.mark.parametrize("effect, words", [("readout", "IG-Lens credit"),
                                           ("total", "total-effect credit"),
                                           ("atp", "not additive")])
def test_the_table_legend_names_what_a_credit_measures(effect, words) -> None:
    from captum_iglens import explain

    model, tokenizer = tiny_causal_lm("llama", n_layers=3)
    result = explain(model, tokenizer, "w1 w2 w3 w4", max_new_tokens=2, chat_template=False,
                     effect=effect, baselines="zero")
    legend = " ".join(result.format_table().split())
    assert words in legend
    assert ("readout at the baseline" in legend) == (effect == "readout")


def test_the_table_legend_names_a_per_layer_lens() -> None:
    from captum_iglens import explain
    from captum_iglens.lens.translators import TunedLens

    model, tokenizer = tiny_causal_lm("llama", n_layers=3)
    plain = explain(model, tokenizer, "w1 w2 w3 w4", max_new_tokens=2, chat_template=False)
    tuned = explain(model, tokenizer, "w1 w2 w3 w4", max_new_tokens=2, chat_template=False,
                    layer_readout=TunedLens.for_model(model))
    words, plain_words = (" ".join(r.format_table().split()) for r in (tuned, plain))
    assert "lens's readout g_L(h_L)" in words and "tuned" in words  # names the lens
    assert "g_L(h_L)" not in plain_words and "logit-lens readout f(h_L)" in plain_words
