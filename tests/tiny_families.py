"""Tiny randomly initialised causal LMs of every family in readout.FAMILIES (issue 4).

Each builder gives hidden size 64, 2 blocks, vocabulary 128, perturbed norm weights and
biases (DESIGN.md section 3, item 2) and, where the family has them, non-trivial soft-cap /
scale / multiplier values, so that a readout that skips one of them fails Invariant R.
"""

from __future__ import annotations

from typing import Any, Callable

import torch
from conftest import HIDDEN, VOCAB, perturb_norms
from torch import nn

N_BLOCKS = 2
_COMMON: dict[str, Any] = dict(vocab_size=VOCAB, bos_token_id=1, eos_token_id=2, pad_token_id=0)


def _llama_like(**extra: Any) -> dict[str, Any]:
    return dict(hidden_size=HIDDEN, intermediate_size=128, num_hidden_layers=N_BLOCKS,
                num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                tie_word_embeddings=False, initializer_range=0.15, **_COMMON, **extra)


def _gpt_like(**extra: Any) -> dict[str, Any]:
    return dict(initializer_range=0.15, **_COMMON, **extra)


_TINY_SIGLIP: dict[str, Any] = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                    num_attention_heads=2, image_size=28, patch_size=14)

# family -> (config class name, model class name, config kwargs)
SPECS: dict[str, tuple[str, str, Callable[[], dict[str, Any]]]] = {
    "llama": ("LlamaConfig", "LlamaForCausalLM", lambda: _llama_like()),
    "mistral": ("MistralConfig", "MistralForCausalLM", lambda: _llama_like(sliding_window=None)),
    "mixtral": ("MixtralConfig", "MixtralForCausalLM",
                lambda: _llama_like(num_local_experts=4, num_experts_per_tok=2)),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", lambda: _llama_like()),
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM", lambda: _llama_like(head_dim=16)),
    "phi3": ("Phi3Config", "Phi3ForCausalLM", lambda: _llama_like()),
    "olmo": ("OlmoConfig", "OlmoForCausalLM", lambda: _llama_like()),
    "olmo2": ("Olmo2Config", "Olmo2ForCausalLM", lambda: _llama_like()),
    "stablelm": ("StableLmConfig", "StableLmForCausalLM", lambda: _llama_like()),
    "gemma": ("GemmaConfig", "GemmaForCausalLM", lambda: _llama_like(head_dim=16)),
    "gemma2": ("Gemma2Config", "Gemma2ForCausalLM",
               lambda: _llama_like(head_dim=16, final_logit_softcapping=3.0,
                                   attn_logit_softcapping=20.0, query_pre_attn_scalar=16,
                                   sliding_window=4)),
    "gemma3_text": ("Gemma3TextConfig", "Gemma3ForCausalLM",
                    lambda: _llama_like(head_dim=16, final_logit_softcapping=3.0,
                                        query_pre_attn_scalar=16, sliding_window=4)),
    "cohere": ("CohereConfig", "CohereForCausalLM", lambda: _llama_like(logit_scale=0.3)),
    "granite": ("GraniteConfig", "GraniteForCausalLM",
                lambda: _llama_like(logits_scaling=4.0, embedding_multiplier=3.0,
                                    residual_multiplier=0.7, attention_multiplier=0.2)),
    "phi": ("PhiConfig", "PhiForCausalLM",
            lambda: _llama_like(partial_rotary_factor=0.5)),
    "gpt2": ("GPT2Config", "GPT2LMHeadModel",
             lambda: _gpt_like(n_embd=HIDDEN, n_layer=N_BLOCKS, n_head=4, n_positions=128)),
    "gptj": ("GPTJConfig", "GPTJForCausalLM",
             lambda: _gpt_like(n_embd=HIDDEN, n_layer=N_BLOCKS, n_head=4, n_positions=128,
                               rotary_dim=8, tie_word_embeddings=False)),
    "codegen": ("CodeGenConfig", "CodeGenForCausalLM",
                lambda: _gpt_like(n_embd=HIDDEN, n_layer=N_BLOCKS, n_head=4, n_positions=128,
                                  rotary_dim=8)),
    "gpt_bigcode": ("GPTBigCodeConfig", "GPTBigCodeForCausalLM",
                    lambda: _gpt_like(n_embd=HIDDEN, n_layer=N_BLOCKS, n_head=4,
                                      n_positions=128)),
    "gpt_neo": ("GPTNeoConfig", "GPTNeoForCausalLM",
                lambda: _gpt_like(hidden_size=HIDDEN, num_layers=N_BLOCKS, num_heads=4,
                                  attention_types=[[["global", "local"], 1]], window_size=4,
                                  max_position_embeddings=128)),
    "falcon": ("FalconConfig", "FalconForCausalLM",
               lambda: _gpt_like(hidden_size=HIDDEN, num_hidden_layers=N_BLOCKS,
                                 num_attention_heads=4, alibi=True, new_decoder_architecture=False,
                                 multi_query=True, parallel_attn=True, bias=True)),
    "falcon_rope": ("FalconConfig", "FalconForCausalLM",
                    lambda: _gpt_like(hidden_size=HIDDEN, num_hidden_layers=N_BLOCKS,
                                      num_attention_heads=4, num_kv_heads=2, alibi=False,
                                      new_decoder_architecture=True)),
    "gpt_neox": ("GPTNeoXConfig", "GPTNeoXForCausalLM",
                 lambda: _gpt_like(hidden_size=HIDDEN, intermediate_size=128,
                                   num_hidden_layers=N_BLOCKS, num_attention_heads=4,
                                   max_position_embeddings=128)),
    "opt": ("OPTConfig", "OPTForCausalLM",
            lambda: _gpt_like(hidden_size=HIDDEN, ffn_dim=128, num_hidden_layers=N_BLOCKS,
                              num_attention_heads=4, max_position_embeddings=128,
                              word_embed_proj_dim=HIDDEN, init_std=0.15)),
    # OPT-350m layout: project_in / project_out, post-norm blocks, no final norm.
    "opt_350m": ("OPTConfig", "OPTForCausalLM",
                 lambda: _gpt_like(hidden_size=HIDDEN, ffn_dim=128, num_hidden_layers=N_BLOCKS,
                                   num_attention_heads=4, max_position_embeddings=128,
                                   word_embed_proj_dim=32, do_layer_norm_before=False,
                                   init_std=0.15)),
    # Families added for the logit transforms of transformers 5.24 (issue 8).
    "cohere2": ("Cohere2Config", "Cohere2ForCausalLM",
                lambda: _llama_like(logit_scale=0.3, sliding_window=4)),
    "cohere2_moe": ("Cohere2MoeConfig", "Cohere2MoeForCausalLM",
                    lambda: _llama_like(logit_scale=0.3, sliding_window=4, num_experts=4,
                                        num_experts_per_tok=2)),
    "granitemoe": ("GraniteMoeConfig", "GraniteMoeForCausalLM",
                   lambda: _llama_like(logits_scaling=4.0, embedding_multiplier=3.0,
                                       residual_multiplier=0.7, num_local_experts=4,
                                       num_experts_per_tok=2)),
    "granitemoeshared": ("GraniteMoeSharedConfig", "GraniteMoeSharedForCausalLM",
                         lambda: _llama_like(logits_scaling=4.0, num_local_experts=4,
                                             num_experts_per_tok=2, shared_intermediate_size=64)),
    "granitemoehybrid": ("GraniteMoeHybridConfig", "GraniteMoeHybridForCausalLM",
                         lambda: _llama_like(logits_scaling=4.0, num_local_experts=4,
                                             num_experts_per_tok=2, shared_intermediate_size=64,
                                             layer_types=["mamba", "attention"], mamba_n_heads=4,
                                             mamba_d_head=32, mamba_d_state=8,
                                             mamba_chunk_size=8)),
    "granite_swa": ("GraniteSWAConfig", "GraniteSWAForCausalLM",
                    lambda: _llama_like(logits_scaling=4.0, sliding_window=4)),
    "granitemoe_swa": ("GraniteMoeSWAConfig", "GraniteMoeSWAForCausalLM",
                       lambda: _llama_like(logits_scaling=4.0, sliding_window=4,
                                           num_local_experts=4, num_experts_per_tok=2,
                                           shared_intermediate_size=64)),
    "hyperclovax": ("HyperCLOVAXConfig", "HyperCLOVAXForCausalLM",
                    lambda: _llama_like(logits_scaling=0.3, embedding_multiplier=2.0)),
    "vaultgemma": ("VaultGemmaConfig", "VaultGemmaForCausalLM",
                   lambda: _llama_like(head_dim=16, final_logit_softcapping=3.0,
                                       query_pre_attn_scalar=16, sliding_window=4)),
    "nanochat": ("NanoChatConfig", "NanoChatForCausalLM",
                 lambda: _llama_like(head_dim=16, final_logit_softcapping=3.0)),
    "beam": ("BeamConfig", "BeamForCausalLM",
             lambda: _llama_like(head_dim=16, final_logit_softcapping=3.0, sliding_window=4)),
    "recurrent_gemma": ("RecurrentGemmaConfig", "RecurrentGemmaForCausalLM",
                        lambda: _llama_like(head_dim=16, lru_width=64, attention_window_size=4,
                                            logits_soft_cap=3.0,
                                            block_types=["recurrent", "attention"])),
    "falcon_h1": ("FalconH1Config", "FalconH1ForCausalLM",
                  lambda: _llama_like(head_dim=16, lm_head_multiplier=0.3, mamba_n_heads=4,
                                      mamba_d_head=32, mamba_expand=2, mamba_d_ssm=128,
                                      mamba_d_state=8, mamba_chunk_size=8)),
    "gemma4_text": ("Gemma4TextConfig", "Gemma4ForCausalLM",
                    lambda: _llama_like(head_dim=16, final_logit_softcapping=3.0,
                                        hidden_size_per_layer_input=8, sliding_window=4)),
    # Gemma-3 4B and larger: AutoModelForCausalLM gives the multimodal class (text tower at
    # model.language_model); run on text-only ids. Its forward does not soft-cap.
    "gemma3": ("Gemma3Config", "Gemma3ForConditionalGeneration",
               lambda: dict(text_config=_llama_like(head_dim=16, final_logit_softcapping=3.0,
                                                    query_pre_attn_scalar=16, sliding_window=4),
                            vision_config=_TINY_SIGLIP, mm_tokens_per_image=4,
                            image_token_index=127, boi_token_index=125, eoi_token_index=126,
                            initializer_range=0.15)),
    "bloom": ("BloomConfig", "BloomForCausalLM",
              lambda: _gpt_like(hidden_size=HIDDEN, n_layer=N_BLOCKS, n_head=4)),
    "mpt": ("MptConfig", "MptForCausalLM",
            lambda: dict(d_model=HIDDEN, n_heads=4, n_layers=N_BLOCKS, expansion_ratio=2,
                         max_seq_len=128, vocab_size=VOCAB, initializer_range=0.15,
                         attn_config={"alibi": True})),
}

FAMILY_NAMES = tuple(SPECS)


_LAYER_KEYS = ("num_hidden_layers", "n_layer", "n_layers")


def make_family(
    family: str, seed: int = 0, dtype: torch.dtype = torch.float32, n_blocks: int = N_BLOCKS
) -> nn.Module:
    """A tiny ``family`` model with perturbed norms and head biases, as constructed (train
    mode). Raises ``ImportError`` / ``AttributeError`` if transformers lacks the family.
    ``n_blocks`` other than 2 is not supported for gpt_neo (its attention_types)."""
    import transformers as tf

    config_name, model_name, kwargs = SPECS[family]
    torch.manual_seed(seed)
    args = kwargs()
    for key in _LAYER_KEYS:
        if key in args:
            args[key] = n_blocks
    config = getattr(tf, config_name)(**args)
    model = getattr(tf, model_name)(config)
    perturb_norms(model, seed)
    gen = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        head = model.get_output_embeddings()
        if getattr(head, "bias", None) is not None:  # Phi, GPT-J: make the head bias matter
            head.bias.add_(torch.randn(head.bias.shape, generator=gen))
    return model.to(dtype)
