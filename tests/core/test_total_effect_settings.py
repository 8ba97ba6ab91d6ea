"""``scope`` and ``grad_drop`` travel in :class:`AttributionSettings` to ``run_total``.

``IGLens.attribute_details(..., settings=...)`` and ``explain(..., scope=..., grad_drop=...)``
must give exactly (``torch.equal``) what ``run_total`` gives with the keywords, and a scope
or GradDrop the lens cannot honour is refused with a message saying what to do. The
numbers of the two scopes and of AtP* themselves are checked against independent
implementations in test_total_effect_scope.py and test_total_effect_atp_star.py.
"""

from __future__ import annotations

import warnings

import pytest
import torch
from tiny_families import make_family
from tiny_tokenizer import word_tokenizer

from captum_iglens import IGLens, explain
from captum_iglens._core.total_effect import run_total
from captum_iglens.settings import AttributionSettings, settings_from_record

SEQ = 9
POSITIONS = [SEQ - 1, SEQ - 3]
PROMPT = "w3 w5 w7 w9 w2 w4"


def _ids(seed: int = 0) -> torch.Tensor:
    return torch.randint(3, 100, (1, SEQ), generator=torch.Generator().manual_seed(seed))


def _fields(out) -> list[torch.Tensor]:
    return [out.attributions, out.p_final, out.p_baseline, out.convergence_delta,
            out.lens_probs]


@pytest.mark.parametrize("effect, baseline", [("total", "zero"), ("total", "mean"),
                                              ("atp", "zero")])
def test_sequence_scope_through_settings_is_run_total_with_the_keyword(effect, baseline):
    model = make_family("llama", seed=1).eval()
    lens, ids = IGLens(model, effect=effect), _ids()
    steps = {} if effect == "atp" else {"n_steps": 4}  # AtP takes no steps (refused)
    settings = AttributionSettings(baselines=baseline, effect=effect, scope="sequence",
                                   **steps)
    got = lens.attribute_details(ids, positions=POSITIONS, settings=settings)
    want, _ = run_total(lens.spec, ids, baseline, None, None, settings.n_steps,
                        "prediction_aware", None, POSITIONS, scope="sequence")
    assert all(torch.equal(a, b) for a, b in zip(_fields(got), _fields(want), strict=True))
    # and the setting was read: position scope gives other credits (AtP of the two scopes
    # differs by the earlier positions' gate gradients, test_total_effect_scope.py)
    other = lens.attribute_details(ids, positions=POSITIONS,
                                   settings=AttributionSettings(baselines=baseline, **steps))
    assert (got.attributions - other.attributions).abs().max() > 1e-4


def test_grad_drop_through_settings_is_run_total_with_the_keyword() -> None:
    model = make_family("llama", seed=2, n_blocks=4).eval()
    lens, ids = IGLens(model, effect="atp"), _ids(1)
    settings = AttributionSettings(baselines="zero", grad_drop=True)
    got = lens.attribute_details(ids, positions=POSITIONS, settings=settings)
    want, _ = run_total(lens.spec, ids, "zero", None, None, settings.n_steps,
                        settings.method, None, POSITIONS, grad_drop=True)
    assert got.method == want.method == "atp*"
    assert all(torch.equal(a, b) for a, b in zip(_fields(got), _fields(want), strict=True))
    plain = lens.attribute_details(ids, "zero", positions=POSITIONS)
    assert plain.method == "atp"
    assert bool((got.attributions >= 0).all())  # GradDrop's estimates are nonnegative
    assert (got.attributions - plain.attributions).abs().max() > 1e-4


def _explain(model, **kwargs):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return explain(model, word_tokenizer(), PROMPT, max_new_tokens=3,
                       chat_template=False, **kwargs)


def test_explain_takes_scope_as_a_keyword_or_in_settings() -> None:
    model = make_family("llama", seed=1).eval()
    by_keyword = _explain(model, effect="total", baselines="zero", n_steps=4,
                          scope="sequence")
    by_settings = _explain(model, settings=AttributionSettings(
        effect="total", baselines="zero", n_steps=4, scope="sequence"))
    ids = torch.tensor([by_keyword.input_ids[:-1]])
    want, _ = run_total(IGLens(model, effect="total").spec, ids, "zero",
                        torch.tensor([by_keyword.token_ids]), None, 4, "prediction_aware",
                        None, list(by_keyword.positions), scope="sequence")
    for result in (by_keyword, by_settings):
        assert torch.equal(result.attributions, want.attributions[0])
        assert torch.equal(result.p_final, want.p_final[0])
    position = _explain(model, effect="total", baselines="zero", n_steps=4)
    assert (position.attributions - by_keyword.attributions).abs().max() > 1e-4


def test_explain_grad_drop() -> None:
    model = make_family("llama", seed=2, n_blocks=4).eval()
    result = _explain(model, effect="atp", baselines="zero", grad_drop=True)
    assert result.method == "atp*"


@pytest.mark.parametrize("lens_kwargs, settings, message", [
    ({}, {"scope": "sequence"}, "a readout lens"),
    ({}, {"grad_drop": True}, "use it with effect='atp'"),
    ({"effect": "total"}, {"grad_drop": True, "baselines": "zero"},
     "use it with effect='atp'"),
    ({"effect": "atp"}, {"grad_drop": True, "scope": "sequence", "baselines": "zero"},
     "scope='position'"),
    ({"effect": "total", "granularity": "sublayer"}, {"scope": "sequence", "baselines": "zero"},
     "sub-layer and head gates are position-scope only"),
    ({"effect": "total"}, {"scope": "layer", "baselines": "zero"}, "scope='layer'"),
])
def test_refusals(lens_kwargs, settings, message) -> None:
    model = make_family("llama", seed=1).eval()
    lens = IGLens(model, **lens_kwargs)
    with pytest.raises(ValueError, match=message):
        lens.attribute_details(_ids(), positions=POSITIONS,
                               settings=AttributionSettings(**settings))


def test_grad_drop_needs_two_blocks() -> None:
    lens = IGLens(make_family("llama", seed=1, n_blocks=1).eval(), effect="atp")
    with pytest.raises(ValueError, match=">= 2 blocks"):
        lens.attribute_details(_ids(), settings=AttributionSettings(baselines="zero",
                                                                    grad_drop=True))


def test_explain_refuses_a_readout_scope_before_generating(monkeypatch) -> None:
    model = make_family("llama", seed=1).eval()
    monkeypatch.setattr(model, "generate", lambda *a, **k: pytest.fail("generated first"))
    with pytest.raises(ValueError, match="a readout lens"):
        _explain(model, scope="sequence")


def test_settings_from_record_reads_them_back() -> None:
    assert settings_from_record({}).scope == "position"
    assert settings_from_record({}).grad_drop is False
    got = settings_from_record({"effect": "atp", "scope": "sequence", "grad_drop": True})
    assert (got.scope, got.grad_drop) == ("sequence", True)
    assert AttributionSettings().updated(scope="sequence").scope == "sequence"
