"""Fitted per-layer readouts (tuned lens, Jacobian lens): their definitions, their fits,
completeness with lens terms, the cache keyed by the weights digest, and the named kinds.

Completeness: each credit and lens term is a float64 difference of float32 readouts rounded
to float32 (``<= eps/2 |term|``) and the unrounded terms telescope exactly, so
``|sum credits + sum lens terms - (p_final - g_0(b))| <= eps * (sum |terms| + |delta|)``.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from conftest import make_tiny
from torch import nn

from captum_iglens import IGLens
from captum_iglens.lens.fit import (
    fit_jacobian_lens,
    fit_tuned_lens,
    lens_cache_path,
    load_tuned_lens_folder,
    named_lens,
    residuals_of,
)
from captum_iglens.lens.hooks import held_hooks, hidden_of
from captum_iglens.lens.layer_readout import LayerReadout, lens_name
from captum_iglens.lens.translators import JacobianLens, LensDigestError, TunedLens, load_lens
from captum_iglens.lens.weights import weights_digest
from captum_iglens.run.resume import fingerprint_settings, planned_entries

EPS = torch.finfo(torch.float32).eps
IDS = torch.tensor([[3, 4, 5, 6, 7, 8], [9, 10, 11, 12, 13, 14]])
POSITIONS = [1, 3, 5]
FAMILIES = ("llama", "gpt2", "gpt_neox", "qwen2")


def _corpus(seed: int = 0, n: int = 6, seq: int = 10) -> torch.Tensor:
    return torch.randint(3, 120, (n, seq), generator=torch.Generator().manual_seed(seed))


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch):
    monkeypatch.setenv("CAPTUM_IGLENS_CACHE", str(tmp_path / "cache"))


@pytest.fixture(scope="module")
def model() -> nn.Module:
    return make_tiny("llama").eval()


@pytest.fixture(scope="module")
def tuned(model) -> TunedLens:
    return fit_tuned_lens(model, _corpus(), steps=20, lr=1e-2, progress=False)


@pytest.fixture(scope="module")
def jacobian(model) -> JacobianLens:
    return fit_jacobian_lens(model, _corpus(n=2), dim_batch=24, progress=False)


def _check_adds_up(out) -> None:
    credits, lens = out.attributions.double(), out.lens_change.double()
    delta = (out.p_final - out.p_baseline).double()
    err = (credits.sum(-1) + lens.sum(-1) - delta).abs()
    bound = EPS * (credits.abs().sum(-1) + lens.abs().sum(-1) + delta.abs())
    assert (err <= bound).all(), float((err - bound).max())


def test_logit_by_name_is_todays_credits_bit_for_bit(model) -> None:
    for units in ("probability", "log-probability"):
        named = IGLens(model, lens="logit", units=units).attribute_details(IDS,
                                                                          positions=POSITIONS)
        default = IGLens(model, units=units).attribute_details(IDS, positions=POSITIONS)
        assert torch.equal(named.attributions, default.attributions)  # exact: same path
        assert torch.equal(named.p_baseline, default.p_baseline)  # exact: same path
        assert named.lens_change is None


def test_identity_initialised_lenses_read_as_the_logit_lens(model) -> None:
    h = torch.randn(5, model.config.hidden_size)
    readout = IGLens(model).spec.readout
    for lens in (TunedLens.for_model(model), JacobianLens.for_model(model)):
        assert isinstance(lens, LayerReadout)
        for layer in range(model.config.num_hidden_layers + 1):
            # A = 0, b = 0 (tuned) and J = I (jacobian): T_L(h) = h, computed in float32
            assert torch.equal(lens(h, layer), readout(h)), (lens.kind, layer)  # exact: h+0


@pytest.mark.parametrize("family", FAMILIES)
def test_completeness_with_lens_terms_for_each_kind(family) -> None:
    model = make_tiny(family).eval()
    lenses = (fit_tuned_lens(model, _corpus(), steps=5, lr=1e-2, progress=False),
              fit_jacobian_lens(model, _corpus(n=1, seq=6), dim_batch=32, progress=False))
    for lens in lenses:
        for units in ("probability", "log-probability"):
            out = IGLens(model, lens=lens, units=units).attribute_details(IDS,
                                                                          positions=POSITIONS)
            # the lens changes the readout: lens terms are not all zero
            assert float(out.lens_change[..., :-1].abs().max()) > 1e-6, (family, lens.kind)
            _check_adds_up(out)


def test_the_tuned_fit_lowers_the_kl_at_every_layer_below_n(model, tuned) -> None:
    hidden = residuals_of(model, _corpus())
    n = model.config.num_hidden_layers
    logit = TunedLens.for_model(model)
    with torch.no_grad():
        final = logit.readout(hidden[:, n]).log_softmax(-1)
        for layer in range(n):
            kls = [float((final.exp() * (final - lens(hidden[:, layer], layer).log_softmax(-1)))
                         .sum(-1).mean()) for lens in (logit, tuned)]
            # 20 Adam steps from the identity on its own training rows: a clear drop (a fit
            # that did not train, or trained another layer's translator, keeps the logit KL)
            assert kls[1] < 0.9 * kls[0], (layer, kls)
        # g_n is the model's own readout: the last layer is never translated
        assert torch.equal(tuned(hidden[:, n], n), logit.readout(hidden[:, n]))  # exact


def _h0_to_hn(model: nn.Module, embeds: torch.Tensor) -> torch.Tensor:
    """h_n (pre final norm) of a llama as a function of h_0 = inputs_embeds."""
    blocks = model.model.layers
    kept = {}
    with held_hooks() as hooks:
        hooks.forward(blocks[-1], lambda _m, _a, out: kept.__setitem__("h", hidden_of(out)))
        model(inputs_embeds=embeds[None], use_cache=False)
    return kept["h"][0]


def test_the_jacobian_lens_is_the_average_jacobian(model) -> None:
    """J_0 = mean_{t valid} sum_{t' valid} d h_{n,t'} / d h_{0,t}, against the full Jacobian."""
    ids = _corpus(n=1, seq=6)
    lens = fit_jacobian_lens(model, ids, skip_first=1, dim_batch=7, progress=False)  # 64 % 7
    embeds = model.get_input_embeddings()(ids[0]).detach()
    full = torch.autograd.functional.jacobian(lambda e: _h0_to_hn(model, e), embeds)
    valid = list(range(1, 5))  # skip the first position and the last
    want = torch.stack([full[valid, :, t, :].sum(0) for t in valid]).mean(0)  # [d, d]
    got = lens.jacobians[0]
    # the same float32 gradients in other batchings: rounding relative to the largest entry
    tol = 1e-4 * float(want.abs().max())
    assert float((got - want).abs().max()) <= tol
    assert float((want - torch.eye(want.shape[0])).abs().max()) > 1e-2  # not the identity


def test_save_reload_in_a_new_process_gives_identical_credits(model, tuned, tmp_path) -> None:
    path = tuned.save(tmp_path / "tuned.pt")
    here = IGLens(model, lens=load_lens(path, model)).attribute_details(IDS,
                                                                        positions=POSITIONS)
    mine = IGLens(model, lens=tuned).attribute_details(IDS, positions=POSITIONS)
    assert torch.equal(here.attributions, mine.attributions)  # exact: same tensors
    code = textwrap.dedent(f"""
        import sys, torch
        sys.path.insert(0, {str(Path(__file__).parents[1])!r})
        from conftest import make_tiny
        from captum_iglens import IGLens
        from captum_iglens.lens.translators import load_lens
        model = make_tiny("llama").eval()
        out = IGLens(model, lens=load_lens({str(path)!r}, model)).attribute_details(
            torch.tensor({IDS.tolist()}), positions={POSITIONS})
        torch.save([out.attributions, out.lens_change], {str(tmp_path / "out.pt")!r})
    """)
    subprocess.run([sys.executable, "-c", code], check=True, capture_output=True)
    there = torch.load(tmp_path / "out.pt")
    assert torch.equal(there[0], here.attributions)  # exact: same lens, model, inputs
    assert torch.equal(there[1], here.lens_change)  # exact: same lens, model, inputs


def test_a_lens_of_another_model_is_refused_by_its_digest(model, tuned, tmp_path) -> None:
    path = tuned.save(tmp_path / "tuned.pt")
    other = make_tiny("llama", seed=1).eval()  # same layout, other weights
    assert weights_digest(other) != tuned.digest
    with pytest.raises(LensDigestError, match="iglens fit-lens --kind tuned"):
        load_lens(path, other)
    # the cache is keyed by digest: the other model finds no lens of its own
    tuned.save(lens_cache_path(tuned.digest, "tuned", {"steps": 20}))
    assert isinstance(named_lens(model, "tuned"), TunedLens)
    with pytest.raises(ValueError, match="fit one first with `iglens fit-lens --kind tuned`"):
        IGLens(other, lens="tuned")


def test_named_kinds(model, tuned, jacobian) -> None:
    with pytest.raises(ValueError, match="iglens fit-lens --kind jacobian"):
        IGLens(model, lens="jacobian")
    with pytest.raises(ValueError, match="use 'logit'"):
        IGLens(model, lens="tunned")
    tuned.save(lens_cache_path(tuned.digest, "tuned", {"steps": 20}))
    jacobian.save(lens_cache_path(jacobian.digest, "jacobian", {}))
    for name, lens in (("tuned", tuned), ("jacobian", jacobian)):
        by_name = IGLens(model, lens=name).attribute_details(IDS, positions=POSITIONS)
        by_object = IGLens(model, lens=lens).attribute_details(IDS, positions=POSITIONS)
        assert torch.equal(by_name.attributions, by_object.attributions)  # exact: same lens
        assert lens_name(IGLens(model, lens=name).spec.lens) == name


def test_a_tuned_lens_package_folder_loads_where_the_layouts_match(model, tmp_path) -> None:
    d, n = model.config.hidden_size, model.config.num_hidden_layers
    gen = torch.Generator().manual_seed(3)
    params = {f"layer_translators.{i}.{p}": 0.1 * torch.randn(*s, generator=gen)
              for i in range(n) for p, s in (("weight", (d, d)), ("bias", (d,)))}
    torch.save(params, tmp_path / "params.pt")
    (tmp_path / "config.json").write_text(json.dumps(
        {"base_model_name_or_path": "tiny", "d_model": d, "num_hidden_layers": n,
         "bias": True, "lens_type": "linear_tuned_lens"}))
    lens = load_tuned_lens_folder(tmp_path, model)
    h = torch.randn(4, d)
    w, b = params["layer_translators.1.weight"], params["layer_translators.1.bias"]
    torch.testing.assert_close(lens.translate(h, 1), h + h @ w.T + b, rtol=0,
                               atol=8 * EPS * float((h.abs() @ w.abs().T).max() + 1))
    (tmp_path / "config.json").write_text(json.dumps({"d_model": d + 1,
                                                      "num_hidden_layers": n}))
    with pytest.raises(ValueError, match="layouts do not match"):
        load_tuned_lens_folder(tmp_path, model)


def test_the_lens_is_fingerprinted_only_away_from_logit() -> None:
    from captum_iglens.settings import AttributionSettings, GenerationSettings, ReportSettings

    settings = (AttributionSettings(n_steps=20), ReportSettings(), GenerationSettings(8))
    common = dict(stride=1)
    old = fingerprint_settings(*settings, **common)
    assert fingerprint_settings(*settings, **common, lens="logit") == old
    assert planned_entries(old, "probability") == planned_entries(
        fingerprint_settings(*settings, **common, lens="logit"), "probability")
    tuned = fingerprint_settings(*settings, **common, lens="tuned")
    assert tuned["lens"] == "tuned"
    assert planned_entries(tuned, "probability")["lens"] == "tuned"


def test_fit_lens_cli_fits_into_the_cache(model, tmp_path) -> None:
    from captum_iglens.cli import main
    from captum_iglens.testing import tiny_causal_lm

    lm, tokenizer = tiny_causal_lm("llama")
    folder = tmp_path / "lm"
    lm.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    text = tmp_path / "text.txt"
    text.write_text(" ".join(f"w{i % 7}" for i in range(80)))
    code = main(["fit-lens", "--kind", "tuned", "--model", str(folder), "--text-file",
                 str(text), "--steps", "3", "--sequences", "2", "--seq-len", "8",
                 "--no-progress"])
    assert code == 0
    assert isinstance(named_lens(lm, "tuned"), TunedLens)


def test_the_text_level_result_carries_the_lens_terms() -> None:
    from captum_iglens import explain
    from captum_iglens.results import IGLensResult
    from captum_iglens.testing import tiny_causal_lm

    lm, tokenizer = tiny_causal_lm("llama")
    lens = fit_tuned_lens(lm, _corpus(), steps=5, lr=1e-2, progress=False)
    result = explain(lm, tokenizer, "w1 w2 w3", layer_readout=lens, max_new_tokens=3,
                     chat_template=False)
    credits, terms = result.attributions.double(), result.lens_change.double()
    delta = (result.p_final - result.p_baseline).double()
    err = (credits.sum(-1) + terms.sum(-1) - delta).abs()
    assert (err <= EPS * (credits.abs().sum(-1) + terms.abs().sum(-1) + delta.abs())).all()
    back = IGLensResult.from_dict(json.loads(json.dumps(result.to_dict())))
    assert torch.equal(back.lens_change, result.lens_change)  # exact: float32 via JSON floats
    plain = explain(lm, tokenizer, "w1 w2 w3", max_new_tokens=3, chat_template=False)
    assert plain.lens_change is None and "lens_change" not in json.dumps(plain.to_dict())


def test_an_interrupted_tuned_fit_resumes_to_the_same_lens(model, tmp_path) -> None:
    corpus = _corpus()
    whole = fit_tuned_lens(model, corpus, steps=6, lr=1e-2, progress=False)
    checkpoint = tmp_path / "fit.ckpt"
    fit_tuned_lens(model, corpus, steps=3, lr=1e-2, progress=False, checkpoint=checkpoint,
                   checkpoint_every=3)  # "interrupted" after step 3, its checkpoint written
    assert torch.load(checkpoint, weights_only=True)["step"] == 3
    resumed = fit_tuned_lens(model, corpus, steps=6, lr=1e-2, progress=False,
                             checkpoint=checkpoint, checkpoint_every=3)
    # the same row draws (seeded per step) and the optimiser's state restored: bit for bit
    for a, b in zip(whole.state_dict().values(), resumed.state_dict().values(), strict=True):
        assert torch.equal(a, b)  # exact: the same float32 operations in the same order
    assert float(whole.translators[0].weight.abs().max()) > 0  # it did train


def test_the_default_corpus_is_prefix_stable() -> None:
    """The first N chunks of a longer default corpus are the N-chunk corpus itself, so a
    table that fits on the first N and holds out the rest fits what ``fit-lens`` fits."""
    from captum_iglens.lens.fit_corpus import corpus_ids
    from captum_iglens.testing import tiny_causal_lm

    lm, tokenizer = tiny_causal_lm("llama")
    short = corpus_ids(lm, tokenizer, seq_len=12, n_sequences=3)
    long = corpus_ids(lm, tokenizer, seq_len=12, n_sequences=5)
    assert short.shape == (3, 12) and long.shape == (5, 12)
    assert torch.equal(long[:3], short)
    assert not torch.equal(long[3], long[4])  # sampled, not one repeated chunk
