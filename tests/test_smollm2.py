"""Real-model checks on the embedded SmolLM2-135M-Instruct (offline)."""

from __future__ import annotations

import pytest
import torch

from captum_iglens import IGLens, explain
from captum_iglens.models import load_model

PROMPT = "What is the capital of Vietnam?"


@pytest.fixture(scope="module")
def vietnam(smollm2):
    model, tokenizer = smollm2
    return explain(model, tokenizer, PROMPT, max_new_tokens=24)


def test_answer_probabilities_are_the_models_own(smollm2, vietnam):
    """Every answer token's p_final equals softmax of a plain forward (Invariant R), and
    completeness holds to 1e-6 (Invariant C), on all 30 layers."""
    model, _ = smollm2
    result = vietnam
    assert len(result.tokens) >= 2 and result.layer_indices == list(range(1, 31))
    ids = torch.tensor([result.input_ids])
    with torch.no_grad():
        probs = torch.softmax(model(ids, use_cache=False).logits[0].float(), -1)
    expected = probs[result.positions, result.token_ids]
    assert (result.p_final - expected).abs().max() <= 1e-5
    assert result.completeness_error <= 1e-6
    sums = result.attributions.sum(-1)
    assert (sums - result.delta_p).abs().max() <= 1e-6
    # Greedy decoding: each answer token is the argmax of the model at its position.
    assert probs[result.positions].argmax(-1).tolist() == result.token_ids
    assert result.chat_template_used


def test_reference_double_norm_bug_is_absent(smollm2, vietnam):
    """Applying the final norm to hidden_states[-1] (already normalised) gives a wrong
    last-layer probability; the lens readout of the hooked residual gives the model's own."""
    model, _ = smollm2
    ids = torch.tensor([vietnam.input_ids])
    lens = IGLens(model)
    with torch.no_grad():
        out = model(ids, output_hidden_states=True, use_cache=False)
        wrong = torch.softmax(lens.readout(out.hidden_states[-1][0]).float(), -1)
    wrong_p = wrong[vietnam.positions, vietnam.token_ids]
    assert (wrong_p - vietnam.p_final).abs().max() > 0.1
    assert torch.allclose(vietnam.lens_probs[:, -1], vietnam.p_final, atol=1e-7)


def test_gguf_cache_round_trip(tmp_path, monkeypatch, smollm2):
    """The cached float32 copy gives the same logits as the freshly de-quantised model, and
    the second load does not de-quantise again (the cache folder is reused)."""
    monkeypatch.setenv("CAPTUM_IGLENS_CACHE", str(tmp_path))
    fresh, tokenizer = load_model()
    cached_dirs = list(tmp_path.iterdir())
    assert len(cached_dirs) == 1 and (cached_dirs[0] / "model.safetensors").is_file()
    cached, cached_tok = load_model()
    ids = torch.tensor([tokenizer("The capital of France is")["input_ids"]])
    with torch.no_grad():
        a = fresh(ids, use_cache=False).logits
        b = cached(ids, use_cache=False).logits
        c = smollm2[0](ids, use_cache=False).logits
    assert torch.equal(a, b) and torch.equal(a, c)
    assert cached.lm_head.weight.data_ptr() == cached.model.embed_tokens.weight.data_ptr()
    assert cached_tok.chat_template == tokenizer.chat_template
    assert list(tmp_path.iterdir()) == cached_dirs
    # A damaged cache (truncated weights) is rebuilt from the GGUF file, with a warning.
    (cached_dirs[0] / "model.safetensors").write_bytes(b"12345")
    with pytest.warns(UserWarning, match="damaged"):
        rebuilt, _ = load_model()
    with torch.no_grad():
        assert torch.equal(rebuilt(ids, use_cache=False).logits, a)


def test_chunk_size_does_not_change_gradient_estimator_on_smollm2(smollm2):
    """On a real vocabulary, 1-3 row matrix products take another BLAS kernel; chunks are
    padded so that results do not depend on internal_batch_size (found at 8e-5 before)."""
    model, tokenizer = smollm2
    ids = tokenizer("The capital of France is", return_tensors="pt").input_ids
    lens = IGLens(model, layers=[0, 10, 20, 30])
    ref = lens.attribute(ids, method="gausslegendre", n_steps=4)
    for chunk in (1, 3, 5):
        got = lens.attribute(ids, method="gausslegendre", n_steps=4, internal_batch_size=chunk)
        assert (got - ref).abs().max() <= 1e-6
    exact = lens.attribute(ids)
    assert (lens.attribute(ids, internal_batch_size=1) - exact).abs().max() <= 1e-7


def test_model_folder_without_tokenizer_is_refused(tmp_path):
    """transformers builds a special-tokens-only tokenizer from a folder without tokenizer
    files; load_model refuses it instead of explaining an empty prompt."""
    from tiny_families import make_family

    make_family("gpt2").save_pretrained(tmp_path)
    with pytest.raises(ValueError, match="tokenizer"):
        load_model(str(tmp_path))
