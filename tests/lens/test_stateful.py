"""Stateful model parts start pristine on every call: the same call gives the same numbers
whatever ran before it (dynamic NTK RoPE keeps the inv_freq grown for the longest sequence it
saw, transformers #25306), and the model is handed back with the state it had."""

from __future__ import annotations

import warnings

import torch
from tiny_tokenizer import word_tokenizer
from transformers import LlamaConfig, LlamaForCausalLM

from captum_iglens import IGLens, explain
from captum_iglens.lens.state import dynamic_rope_prefixes


def _dynamic_llama() -> LlamaForCausalLM:
    config = LlamaConfig(
        vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=16,
        rope_parameters={"rope_type": "dynamic", "factor": 2.0, "rope_theta": 10000.0})
    torch.manual_seed(0)
    return LlamaForCausalLM(config).eval()


def _grow(model: LlamaForCausalLM) -> None:
    """What a user's earlier, longer call does to the rotary embedding."""
    with torch.no_grad():
        model(torch.randint(0, 128, (1, 40)), use_cache=False)


def test_the_state_is_real_and_found() -> None:
    model = _dynamic_llama()
    rotary = model.model.rotary_emb
    assert dynamic_rope_prefixes(rotary) == [""]
    ids = torch.randint(0, 128, (1, 20))
    with torch.no_grad():
        fresh = model(ids, use_cache=False).logits
    _grow(model)
    with torch.no_grad():
        after = model(ids, use_cache=False).logits
    # without a reset, the model itself answers differently after the longer call
    assert (fresh - after).abs().max() > 1e-3


def test_attribute_after_a_longer_call_equals_a_fresh_model() -> None:
    model = _dynamic_llama()
    ids = torch.randint(0, 128, (2, 20), generator=torch.Generator().manual_seed(1))
    fresh = IGLens(model).attribute_details(ids, positions=[-3, -1])
    _grow(model)
    grown = model.model.rotary_emb.inv_freq.clone()
    again = IGLens(model).attribute_details(ids, positions=[-3, -1])
    # the same forward from the same pristine frequencies: bit for bit
    assert torch.equal(fresh.attributions, again.attributions)
    assert torch.equal(fresh.p_final, again.p_final)
    # and the user's model is handed back with the state it had
    assert torch.equal(model.model.rotary_emb.inv_freq, grown)
    assert int(model.model.rotary_emb.max_seq_len_cached) == 40


def test_generated_explanation_after_a_longer_call_equals_a_fresh_model() -> None:
    tokenizer = word_tokenizer()
    prompt = " ".join(f"w{i % 9 + 3}" for i in range(18))  # 18 tokens: past 16

    def run(model):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return explain(model, tokenizer, prompt, max_new_tokens=4, chat_template=False)

    fresh = run(_dynamic_llama())
    model = _dynamic_llama()
    _grow(model)
    again = run(model)
    assert again.token_ids == fresh.token_ids
    assert torch.equal(again.attributions, fresh.attributions)


def test_the_ablation_runs_in_the_same_pristine_state() -> None:
    """The ablation's eval mode is the attribution's: RoPE reset on entry, restored on exit."""
    from captum_iglens.validate.ablation import BlockAblation

    ids = torch.randint(0, 128, (20,), generator=torch.Generator().manual_seed(2))
    fresh = BlockAblation(_dynamic_llama()).trace(ids)
    model = _dynamic_llama()
    _grow(model)
    grown = model.model.rotary_emb.inv_freq.clone()
    model.train()
    again = BlockAblation(model).trace(ids)
    # the same forward from the same pristine frequencies: bit for bit
    assert torch.equal(fresh.hidden, again.hidden)
    assert torch.equal(model.model.rotary_emb.inv_freq, grown)
    assert model.training and all(m.training for m in model.modules())
