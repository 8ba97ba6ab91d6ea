"""Tiny randomly initialised causal LMs of every verified family, built offline.

Each builder gives a small config (by default hidden size 64, 2 decoder blocks, a
vocabulary of 128), then perturbs every norm's weight and bias, and, where the family has
them, sets non-trivial soft-cap / scale / multiplier values: a lens readout that skips the
final norm, the soft-cap or a logit scale then fails Invariant R (arXiv:2606.29693,
section 3), whereas random-init norms (weight 1, bias 0) would hide it.
"""

from __future__ import annotations

from typing import Any, Callable

import torch
from torch import nn

__all__ = ["FAMILIES", "FAMILY_NAMES", "N_BLOCKS", "SPECS", "make_family", "perturb_norms"]

N_BLOCKS = 2
HIDDEN = 64
VOCAB = 128


def perturb_norms(model: nn.Module, seed: int = 0) -> nn.Module:
    """Give every norm non-trivial weights (``1 + 0.5 N(0, 1)``) and biases (``+ 0.3 N(0, 1)``).

    A module is a norm when its class name contains ``norm`` or its own name ends in ``ln``
    (GPT-2's ``ln_f``). Changes ``model`` in place and returns it.
    """
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, module in model.named_modules():
            is_norm = "norm" in type(module).__name__.lower() or "ln" in name.split(".")[-1]
            for pname, param in module.named_parameters(recurse=False):
                noise = torch.randn(param.shape, generator=gen).to(param.dtype)
                if is_norm and pname == "weight":
                    param.add_(0.5 * noise)
                elif is_norm and pname == "bias":
                    param.add_(0.3 * noise)
    return model


def _common(vocab: int) -> dict[str, Any]:
    return dict(vocab_size=vocab, bos_token_id=1, eos_token_id=2, pad_token_id=0)


def _llama_like(hidden: int = HIDDEN, vocab: int = VOCAB, **extra: Any) -> dict[str, Any]:
    return dict(hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=N_BLOCKS,
                num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                tie_word_embeddings=False, initializer_range=0.15, **_common(vocab), **extra)


def _gpt_like(hidden: int = HIDDEN, vocab: int = VOCAB, **extra: Any) -> dict[str, Any]:
    return dict(initializer_range=0.15, **_common(vocab), **extra)


_TINY_SIGLIP: dict[str, Any] = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                    num_attention_heads=2, image_size=28, patch_size=14)

Builder = Callable[..., dict[str, Any]]


def _sized(extra: dict[str, Any], h: int) -> dict[str, Any]:
    """``extra`` with ``head_dim=True`` as a quarter of the hidden size, ``"H"`` as it."""
    return {key: h // 4 if value is True and key == "head_dim" else h if value == "H" else value
            for key, value in extra.items()}


def _ll(**extra: Any) -> Builder:
    """A Llama-like builder (see :func:`_sized` for the size placeholders)."""
    def build(h: int = HIDDEN, v: int = VOCAB) -> dict[str, Any]:
        return _llama_like(h, v, **_sized(extra, h))
    return build


def _gpt(**extra: Any) -> Builder:
    """A GPT-like builder; the value ``"H"`` means the hidden size."""
    def build(h: int = HIDDEN, v: int = VOCAB) -> dict[str, Any]:
        return _gpt_like(h, v, **_sized(extra, h))
    return build


_GEMMA_CAP = dict(head_dim=True, final_logit_softcapping=3.0, query_pre_attn_scalar=16,
                  sliding_window=4)
_MOE = dict(num_local_experts=4, num_experts_per_tok=2)


def _gemma3(h: int = HIDDEN, v: int = VOCAB) -> dict[str, Any]:
    return dict(text_config=_ll(**_GEMMA_CAP)(h, v), vision_config=_TINY_SIGLIP,
                mm_tokens_per_image=4, image_token_index=v - 1, boi_token_index=v - 3,
                eoi_token_index=v - 2, initializer_range=0.15)


def _mpt(h: int = HIDDEN, v: int = VOCAB) -> dict[str, Any]:
    return dict(d_model=h, n_heads=4, n_layers=N_BLOCKS, expansion_ratio=2, max_seq_len=128,
                vocab_size=v, initializer_range=0.15, attn_config={"alibi": True})


#: family -> (config class name, model class name, builder(hidden=64, vocab=128) -> config
#: kwargs; called with no arguments it gives the default sizes).
SPECS: dict[str, tuple[str, str, Builder]] = {
    "llama": ("LlamaConfig", "LlamaForCausalLM", _ll()),
    "mistral": ("MistralConfig", "MistralForCausalLM", _ll(sliding_window=None)),
    "mixtral": ("MixtralConfig", "MixtralForCausalLM", _ll(**_MOE)),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", _ll()),
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM", _ll(head_dim=True)),
    "phi3": ("Phi3Config", "Phi3ForCausalLM", _ll()),
    "olmo": ("OlmoConfig", "OlmoForCausalLM", _ll()),
    "olmo2": ("Olmo2Config", "Olmo2ForCausalLM", _ll()),
    "stablelm": ("StableLmConfig", "StableLmForCausalLM", _ll()),
    "gemma": ("GemmaConfig", "GemmaForCausalLM", _ll(head_dim=True)),
    "gemma2": ("Gemma2Config", "Gemma2ForCausalLM",
               _ll(head_dim=True, final_logit_softcapping=3.0, attn_logit_softcapping=20.0,
                   query_pre_attn_scalar=16, sliding_window=4)),
    "gemma3_text": ("Gemma3TextConfig", "Gemma3ForCausalLM", _ll(**_GEMMA_CAP)),
    "cohere": ("CohereConfig", "CohereForCausalLM", _ll(logit_scale=0.3)),
    "granite": ("GraniteConfig", "GraniteForCausalLM",
                _ll(logits_scaling=4.0, embedding_multiplier=3.0, residual_multiplier=0.7,
                    attention_multiplier=0.2)),
    "phi": ("PhiConfig", "PhiForCausalLM", _ll(partial_rotary_factor=0.5)),
    "gpt2": ("GPT2Config", "GPT2LMHeadModel",
             _gpt(n_embd="H", n_layer=N_BLOCKS, n_head=4, n_positions=128)),
    "gptj": ("GPTJConfig", "GPTJForCausalLM",
             _gpt(n_embd="H", n_layer=N_BLOCKS, n_head=4, n_positions=128, rotary_dim=8,
                  tie_word_embeddings=False)),
    "codegen": ("CodeGenConfig", "CodeGenForCausalLM",
                _gpt(n_embd="H", n_layer=N_BLOCKS, n_head=4, n_positions=128, rotary_dim=8)),
    "gpt_bigcode": ("GPTBigCodeConfig", "GPTBigCodeForCausalLM",
                    _gpt(n_embd="H", n_layer=N_BLOCKS, n_head=4, n_positions=128)),
    "gpt_neo": ("GPTNeoConfig", "GPTNeoForCausalLM",
                _gpt(hidden_size="H", num_layers=N_BLOCKS, num_heads=4,
                     attention_types=[[["global", "local"], 1]], window_size=4,
                     max_position_embeddings=128)),
    "falcon": ("FalconConfig", "FalconForCausalLM",
               _gpt(hidden_size="H", num_hidden_layers=N_BLOCKS, num_attention_heads=4,
                    alibi=True, new_decoder_architecture=False, multi_query=True,
                    parallel_attn=True, bias=True)),
    "falcon_rope": ("FalconConfig", "FalconForCausalLM",
                    _gpt(hidden_size="H", num_hidden_layers=N_BLOCKS, num_attention_heads=4,
                         num_kv_heads=2, alibi=False, new_decoder_architecture=True)),
    "gpt_neox": ("GPTNeoXConfig", "GPTNeoXForCausalLM",
                 _gpt(hidden_size="H", intermediate_size=128, num_hidden_layers=N_BLOCKS,
                      num_attention_heads=4, max_position_embeddings=128)),
    "opt": ("OPTConfig", "OPTForCausalLM",
            _gpt(hidden_size="H", ffn_dim=128, num_hidden_layers=N_BLOCKS, num_attention_heads=4,
                 max_position_embeddings=128, word_embed_proj_dim="H", init_std=0.15)),
    # OPT-350m layout: project_in / project_out, post-norm blocks, no final norm.
    "opt_350m": ("OPTConfig", "OPTForCausalLM",
                 _gpt(hidden_size="H", ffn_dim=128, num_hidden_layers=N_BLOCKS,
                      num_attention_heads=4, max_position_embeddings=128,
                      word_embed_proj_dim=32, do_layer_norm_before=False, init_std=0.15)),
    # Families with the logit transforms of transformers 5.24.
    "cohere2": ("Cohere2Config", "Cohere2ForCausalLM", _ll(logit_scale=0.3, sliding_window=4)),
    "cohere2_moe": ("Cohere2MoeConfig", "Cohere2MoeForCausalLM",
                    _ll(logit_scale=0.3, sliding_window=4, num_experts=4,
                        num_experts_per_tok=2)),
    "granitemoe": ("GraniteMoeConfig", "GraniteMoeForCausalLM",
                   _ll(logits_scaling=4.0, embedding_multiplier=3.0, residual_multiplier=0.7,
                       **_MOE)),
    "granitemoeshared": ("GraniteMoeSharedConfig", "GraniteMoeSharedForCausalLM",
                         _ll(logits_scaling=4.0, shared_intermediate_size=64, **_MOE)),
    "granitemoehybrid": ("GraniteMoeHybridConfig", "GraniteMoeHybridForCausalLM",
                         _ll(logits_scaling=4.0, shared_intermediate_size=64,
                             layer_types=["mamba", "attention"], mamba_n_heads=4,
                             mamba_d_head=32, mamba_d_state=8, mamba_chunk_size=8, **_MOE)),
    "granite_swa": ("GraniteSWAConfig", "GraniteSWAForCausalLM",
                    _ll(logits_scaling=4.0, sliding_window=4)),
    "granitemoe_swa": ("GraniteMoeSWAConfig", "GraniteMoeSWAForCausalLM",
                       _ll(logits_scaling=4.0, sliding_window=4, shared_intermediate_size=64,
                           **_MOE)),
    "hyperclovax": ("HyperCLOVAXConfig", "HyperCLOVAXForCausalLM",
                    _ll(logits_scaling=0.3, embedding_multiplier=2.0)),
    "vaultgemma": ("VaultGemmaConfig", "VaultGemmaForCausalLM", _ll(**_GEMMA_CAP)),
    "nanochat": ("NanoChatConfig", "NanoChatForCausalLM",
                 _ll(head_dim=True, final_logit_softcapping=3.0)),
    "beam": ("BeamConfig", "BeamForCausalLM",
             _ll(head_dim=True, final_logit_softcapping=3.0, sliding_window=4)),
    "recurrent_gemma": ("RecurrentGemmaConfig", "RecurrentGemmaForCausalLM",
                        _ll(head_dim=True, lru_width="H", attention_window_size=4,
                            logits_soft_cap=3.0, block_types=["recurrent", "attention"])),
    "falcon_h1": ("FalconH1Config", "FalconH1ForCausalLM",
                  _ll(head_dim=True, lm_head_multiplier=0.3, mamba_n_heads=4, mamba_d_head=32,
                      mamba_expand=2, mamba_d_ssm=128, mamba_d_state=8, mamba_chunk_size=8)),
    "gemma4_text": ("Gemma4TextConfig", "Gemma4ForCausalLM",
                    _ll(head_dim=True, final_logit_softcapping=3.0,
                        hidden_size_per_layer_input=8, sliding_window=4)),
    # Gemma-3 4B and larger: AutoModelForCausalLM gives the multimodal class (text tower at
    # model.language_model); run on text-only ids. Its forward does not soft-cap.
    "gemma3": ("Gemma3Config", "Gemma3ForConditionalGeneration", _gemma3),
    "bloom": ("BloomConfig", "BloomForCausalLM",
              _gpt(hidden_size="H", n_layer=N_BLOCKS, n_head=4)),
    "mpt": ("MptConfig", "MptForCausalLM", _mpt),
}

#: The family names :func:`make_family` and :func:`~captum_iglens.testing.tiny_causal_lm`
#: build, in a fixed order.
FAMILIES: tuple[str, ...] = tuple(SPECS)
FAMILY_NAMES = FAMILIES

_LAYER_KEYS = ("num_hidden_layers", "n_layer", "n_layers", "num_layers")
_PATTERNS = ("layer_types",)


def _config_kwargs(family: str, hidden: int, vocab: int, n_blocks: int) -> dict[str, Any]:
    args = SPECS[family][2](hidden, vocab)
    target = args["text_config"] if "text_config" in args else args
    for key in _LAYER_KEYS:
        if key in target:
            target[key] = n_blocks
    for key in _PATTERNS:  # one entry per block, repeated as given
        if key in target and len(target[key]) != n_blocks:
            target[key] = [target[key][i % len(target[key])] for i in range(n_blocks)]
    if "attention_types" in target and n_blocks != N_BLOCKS:  # GPT-Neo: global, local, ...
        pattern = [[["global", "local"], n_blocks // 2]] if n_blocks > 1 else []
        target["attention_types"] = pattern + ([[["global"], 1]] if n_blocks % 2 else [])
    return args


def make_family(
    family: str,
    seed: int = 0,
    dtype: torch.dtype = torch.float32,
    n_blocks: int = N_BLOCKS,
    *,
    hidden: int = HIDDEN,
    vocab: int = VOCAB,
    perturb: bool = True,
) -> nn.Module:
    """A tiny ``family`` model with perturbed norms and head biases, in train mode.

    Args:
        family (str): One of :data:`FAMILIES`.
        seed (int, optional): Seeds the initialisation and the perturbation. Default: 0.
        dtype (torch.dtype, optional): The model's dtype. Default: float32.
        n_blocks (int, optional): Decoder blocks. Default: 2.
        hidden (int, optional): Hidden size, a multiple of 16. Default: 64.
        vocab (int, optional): Vocabulary size, at least 16. Default: 128.
        perturb (bool, optional): Perturb the norms (:func:`perturb_norms`) and a head bias.
            Default: True.

    Returns:
        nn.Module: The ``*ForCausalLM`` model, as constructed (train mode).

    Raises:
        ValueError: an unknown family, or sizes out of range.
        ImportError, AttributeError: this transformers version lacks the family.
    """
    import transformers as tf

    if family not in SPECS:
        raise ValueError(f"Unknown tiny family {family!r}: use one of {', '.join(FAMILIES)}.")
    if hidden < 16 or hidden % 16 or vocab < 16:
        raise ValueError(f"hidden must be a multiple of 16 and vocab >= 16, got {hidden}, {vocab}")
    config_name, model_name, _ = SPECS[family]
    torch.manual_seed(seed)
    config = getattr(tf, config_name)(**_config_kwargs(family, hidden, vocab, n_blocks))
    model = getattr(tf, model_name)(config)
    if perturb:
        perturb_norms(model, seed)
        gen = torch.Generator().manual_seed(seed + 1)
        with torch.no_grad():
            head = model.get_output_embeddings()
            if getattr(head, "bias", None) is not None:  # Phi, GPT-J: make the bias matter
                head.bias.add_(torch.randn(head.bias.shape, generator=gen))
    return model.to(dtype)
