"""Shared fixtures: tiny randomly initialised causal LMs with perturbed norms, and SmolLM2.

Random-init norms start at weight 1 / bias 0, which hides a double-applied final norm
(DESIGN.md section 3, item 2): every fixture perturbs norm weights and biases.
"""

from __future__ import annotations

import os

import pytest
import torch
from torch import nn

from captum_iglens.testing.tiny import perturb_norms  # noqa: F401  (one copy, re-exported)

VOCAB = 128
HIDDEN = 64
N_LAYERS = 3


def make_tiny(family: str, seed: int = 0, n_layers: int = N_LAYERS) -> nn.Module:
    """A tiny causal LM of ``family`` (hidden 64, perturbed norms), as constructed (train
    mode); see ``tiny_families.SPECS`` for every family."""
    from tiny_families import make_family

    return make_family(family, seed=seed, n_blocks=n_layers)


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


@pytest.fixture(scope="module")
def tiny_folder(tmp_path_factory: pytest.TempPathFactory):
    """A model folder that ``--model`` loads: a tiny random llama (3 blocks, 128 positions,
    perturbed norms) and the word tokenizer (no chat template); one per test module."""
    from captum_iglens.testing._tokenizer import word_tokenizer

    folder = tmp_path_factory.mktemp("models") / "tiny-llama"
    make_tiny("llama", n_layers=3).save_pretrained(folder)
    word_tokenizer().save_pretrained(folder)
    return folder


@pytest.fixture(scope="session")
def smollm2():
    """The embedded SmolLM2-135M-Instruct (model, tokenizer), loaded offline."""
    from transformers.utils import logging as hf_logging

    from captum_iglens.models.loading import load_model

    hf_logging.disable_progress_bar()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    return load_model()


# Fixtures that load a real model: a test that asks for one (directly or through another
# fixture) is slow on a 2-core CPU (a load, then 30-block forwards), so it runs in the second
# documented command, `python -m pytest -q -m slow tests`, and not in README's quick one.
REAL_MODEL_FIXTURES = frozenset({"smollm2", "smollm2_loads"})


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark ``slow`` every test that uses a real model or carries ``real_model``."""
    for item in items:
        uses_real = REAL_MODEL_FIXTURES.intersection(getattr(item, "fixturenames", ()))
        if uses_real or item.get_closest_marker("real_model") is not None:
            item.add_marker(pytest.mark.slow)
