"""LensSpec carries the model's facts once; the ablation takes the spec instead of its own."""

from __future__ import annotations

import torch
from conftest import make_tiny

from captum_iglens import IGLens
from captum_iglens.lens.architectures import display_name, model_type, vocab_size
from captum_iglens.lens.families import FAMILIES
from captum_iglens.validate.ablation import BlockAblation


def test_the_spec_reads_each_fact_once() -> None:
    model = make_tiny("llama").eval()
    spec = IGLens(model).spec
    assert spec.vocab_size == vocab_size(model) == model.config.vocab_size
    assert spec.model_type == model_type(model) == "llama"
    assert spec.family is FAMILIES["llama"]
    assert spec.display_name == display_name(model)
    assert spec.input_embeddings is model.get_input_embeddings()
    # cached: the first read is kept on the spec (a config edited later is not re-read)
    model.config.vocab_size = 7
    assert spec.vocab_size == 128 and "vocab_size" in vars(spec)


def test_the_ablation_takes_the_lens_spec() -> None:
    model = make_tiny("llama").eval()
    spec = IGLens(model).spec
    ablation = BlockAblation(spec)
    assert ablation.spec is spec
    assert ablation.blocks is spec.decoder_blocks and ablation.readout is spec.readout
    # built from the model, it builds the one spec the lens would
    own = BlockAblation(model)
    assert own.spec.layer_indices == spec.layer_indices
    ids = torch.tensor([3, 4, 5, 6, 7])
    a, b = ablation.trace(ids), own.trace(ids)
    assert torch.equal(a.hidden, b.hidden)  # exact: the same modules and inputs
