"""Shared fixtures: tiny randomly initialised causal LMs with perturbed norms, and SmolLM2.

Random-init norms start at weight 1 / bias 0, which hides a double-applied final norm
(DESIGN.md section 3, item 2): every fixture perturbs norm weights and biases.
"""

from __future__ import annotations

import os

import pytest
import torch
from torch import nn

VOCAB = 128
HIDDEN = 64
N_LAYERS = 3


def perturb_norms(model: nn.Module, seed: int = 0) -> nn.Module:
    """Give every norm non-trivial weights and biases (and every other weight a larger scale
    so that next-token probabilities are far from uniform)."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, module in model.named_modules():
            is_norm = "norm" in type(module).__name__.lower() or "ln" in name.split(".")[-1]
            for pname, param in module.named_parameters(recurse=False):
                noise = torch.randn(param.shape, generator=gen, dtype=torch.float32).to(param.dtype)
                if is_norm and pname == "weight":
                    param.add_(0.5 * noise)
                elif is_norm and pname == "bias":
                    param.add_(0.3 * noise)
    return model


def make_tiny(family: str, seed: int = 0, n_layers: int = N_LAYERS) -> nn.Module:
    """A tiny causal LM of ``family`` (hidden 64), perturbed norms, as constructed (train mode)."""
    import transformers as tf

    torch.manual_seed(seed)
    common = dict(vocab_size=VOCAB, initializer_range=0.15, bos_token_id=1, eos_token_id=2, pad_token_id=0)
    if family == "llama":
        config = tf.LlamaConfig(hidden_size=HIDDEN, intermediate_size=128, num_hidden_layers=n_layers,
                                num_attention_heads=4, num_key_value_heads=2,
                                max_position_embeddings=128, tie_word_embeddings=False, **common)
        model = tf.LlamaForCausalLM(config)
    elif family == "gpt2":
        config = tf.GPT2Config(n_embd=HIDDEN, n_layer=n_layers, n_head=4, n_positions=128, **common)
        model = tf.GPT2LMHeadModel(config)
    elif family == "gpt_neox":
        config = tf.GPTNeoXConfig(hidden_size=HIDDEN, intermediate_size=128, num_hidden_layers=n_layers,
                                  num_attention_heads=4, max_position_embeddings=128, **common)
        model = tf.GPTNeoXForCausalLM(config)
    else:
        raise ValueError(family)
    return perturb_norms(model, seed)


@pytest.fixture(params=["llama", "gpt2", "gpt_neox"])
def tiny_model(request: pytest.FixtureRequest) -> nn.Module:
    return make_tiny(request.param)


@pytest.fixture
def tiny_llama() -> nn.Module:
    return make_tiny("llama", n_layers=4)


@pytest.fixture
def input_ids() -> torch.Tensor:
    gen = torch.Generator().manual_seed(1)
    return torch.randint(0, VOCAB, (2, 9), generator=gen)


@pytest.fixture(scope="session")
def smollm2():
    """The embedded SmolLM2-135M-Instruct (model, tokenizer), loaded offline."""
    from transformers.utils import logging as hf_logging

    from captum_iglens.models import load_model

    hf_logging.disable_progress_bar()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    return load_model()
