"""Multi-device wrappers run the model inside them: DataParallel / DistributedDataParallel
give the same numbers as the bare model (a left-padded row included), and clear errors for
calls that cannot work."""

from __future__ import annotations

import warnings

import pytest
import torch
from _tolerance import f32_tol, node_sensitivity, reduction_length
from conftest import make_tiny
from torch import nn

from captum_iglens import IGLens, compare_completeness
from captum_iglens.lens.architectures import strip_parallel, unwrap_model


def _padded_batch() -> tuple[torch.Tensor, torch.Tensor]:
    ids = torch.tensor([[0, 0, 5, 6, 7, 8], [9, 10, 11, 12, 13, 14]])
    mask = torch.tensor([[0, 0, 1, 1, 1, 1], [1, 1, 1, 1, 1, 1]])
    return ids, mask


def test_data_parallel_padded_row_equals_the_bare_model() -> None:
    model = make_tiny("gpt2").eval()  # GPT-2: wrong positions are far off (learned table)
    wrapped = nn.DataParallel(model)
    assert strip_parallel(wrapped) is model and unwrap_model(wrapped) is model
    ids, mask = _padded_batch()
    bare = IGLens(model).attribute_details(ids, additional_forward_args=mask)
    through = IGLens(wrapped).attribute_details(ids, additional_forward_args=mask)
    # the very same model called with the very same arguments: bit for bit
    assert torch.equal(bare.attributions, through.attributions)
    assert torch.equal(bare.p_final, through.p_final)
    # ... and the padded row is the row alone's prediction (position ids derived from the
    # mask): without them a GPT-2 row is off by far more than rounding
    lens = IGLens(model)
    alone = lens.attribute_details(ids[:1, 2:])
    sens = node_sensitivity(lens, ids[:1, 2:], [-1], alone.target)[..., -1]
    tol = f32_tol(sens, sens, n_terms=reduction_length(model))
    assert ((through.p_final[:1] - alone.p_final).abs() <= tol).all()
    wrong = IGLens(model).attribute_details(ids[:1], additional_forward_args={
        "attention_mask": mask[:1], "position_ids": torch.arange(6)[None]})
    assert (wrong.p_final[0] - alone.p_final[0]).abs().max() > 20 * tol.max()


def test_compare_completeness_in_inference_mode_says_what_to_do() -> None:
    model = make_tiny("llama")
    with torch.inference_mode(), pytest.raises(RuntimeError, match="outside inference_mode"):
        compare_completeness(model, torch.tensor([[3, 4, 5, 6]]), layers=[1, 3])


def test_right_padded_ids_without_their_mask_warn() -> None:
    model = make_tiny("llama").eval()
    model.config.pad_token_id = 0
    ids = torch.tensor([[5, 6, 7, 0, 0]])  # right padded, mask forgotten
    with pytest.warns(UserWarning, match="pad token id 0 and no attention mask"):
        IGLens(model).attribute(ids)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # with the mask, or at a real token: no warning
        IGLens(model).attribute(ids, additional_forward_args=torch.tensor([[1, 1, 1, 0, 0]]),
                                positions=2)
        IGLens(model).attribute(ids, positions=2)


def test_captum_text_input_with_an_appended_end_token_explains_the_prompt() -> None:
    from captum.attr import TextTokenInput
    from tiny_tokenizer import word_tokenizer
    from tokenizers.processors import TemplateProcessing

    from captum_iglens import LLMIGLensAttribution

    model = make_tiny("llama").eval()
    plain, with_eos = word_tokenizer(), word_tokenizer()
    with_eos._tokenizer.post_processor = TemplateProcessing(
        single="$A <eos>", special_tokens=[("<eos>", with_eos.eos_token_id)])
    assert with_eos("w1 w2 w3")["input_ids"][-1] == with_eos.eos_token_id
    lens = IGLens(model)
    want = LLMIGLensAttribution(lens, plain).attribute(
        TextTokenInput("w1 w2 w3", plain, baselines="w9"), target=torch.tensor([20, 21]))
    with pytest.warns(UserWarning, match="it is dropped"):
        got = LLMIGLensAttribution(lens, with_eos).attribute(
            TextTokenInput("w1 w2 w3", with_eos, baselines="w9"), target=torch.tensor([20, 21]))
    # the same ids through the same calls once the end token is dropped: bit for bit
    assert torch.equal(got.token_attr, want.token_attr)


def test_a_model_edited_after_the_lens_was_built_says_build_a_new_lens() -> None:
    from transformers.models.llama.modeling_llama import LlamaRMSNorm

    from captum_iglens.lens.changes import ModelChangedError

    ids = torch.tensor([[5, 6, 7, 8]])
    model = make_tiny("llama").eval()
    lens = IGLens(model)
    del model.model.layers[-1]  # a block pruned
    with pytest.raises(ModelChangedError,
                       match=r"holds 2 blocks \(the lens was built with 3\).*Build a new IGLens"):
        lens.attribute(ids)
    assert IGLens(model).attribute(ids).shape == (1, 2)  # a new lens works
    model = make_tiny("llama").eval()
    lens = IGLens(model)
    model.model.norm = LlamaRMSNorm(64)  # the final norm replaced
    with pytest.raises(ModelChangedError, match="final norm was replaced"):
        lens.attribute(ids)


def test_a_dynamically_quantized_head_is_refused_with_what_to_do() -> None:
    from torch.ao.quantization import quantize_dynamic

    model = make_tiny("llama").eval()
    whole = quantize_dynamic(model, {nn.Linear}, dtype=torch.qint8)
    with pytest.raises(ValueError, match="dynamically quantized.*leave lm_head out"):
        IGLens(whole)
    blocks_only = quantize_dynamic(make_tiny("llama").eval(), {"model.layers"},
                                   dtype=torch.qint8)
    out = IGLens(blocks_only).attribute_details(torch.tensor([[5, 6, 7, 8]]))
    assert torch.isfinite(out.attributions).all()


def test_numpy_ints_are_ints_for_internal_batch_size() -> None:
    import numpy as np

    model = make_tiny("llama").eval()
    ids = torch.tensor([[3, 4, 5, 6, 7]])
    lens = IGLens(model)
    # the same rows per readout chunk, so the same operations: bit for bit
    assert torch.equal(lens.attribute(ids, internal_batch_size=np.int64(4)),
                       lens.attribute(ids, internal_batch_size=4))
    with pytest.raises(ValueError, match="internal_batch_size must be an int >= 1"):
        lens.attribute(ids, internal_batch_size=np.float64(4.0))


def test_block_ablation_runs_through_data_parallel() -> None:
    # the ablation reads the forward signature and the input device through the wrapper
    # (it once read ``inspect.signature(model.forward)`` of the wrapper: ``*inputs``)
    from captum_iglens.validate.ablation import BlockAblation

    model = make_tiny("llama").eval()
    wrapped = BlockAblation(nn.DataParallel(model))
    bare = BlockAblation(model)
    assert (wrapped._cache_kw, wrapped._can_keep) == (bare._cache_kw, bare._can_keep)
    assert bare._can_keep  # the bare Llama forward takes logits_to_keep
