"""Mistakes a new user makes get an error that names the real mistake and what to do:
arguments swapped, a base model without its head, an encoder or encoder-decoder model, token
ids where a prompt is expected, embeddings where token ids are, an input past the trained
context, a mistyped model name, an option of another command. Python errors speak Python,
command-line errors speak flags."""

from __future__ import annotations

import pytest
import torch
from conftest import make_tiny
from tiny_tokenizer import word_tokenizer

from captum_iglens import IGLens, UnknownArchitectureError, explain
from captum_iglens.cli import main


@pytest.fixture(scope="module")
def model():
    return make_tiny("llama").eval()


def test_a_tokenizer_in_place_of_the_model(model):
    tok = word_tokenizer()
    with pytest.raises(TypeError) as info:
        IGLens(tok)
    assert str(info.value) == (
        f"IGLens(model) takes the model, got a tokenizer ({type(tok).__name__}): are the "
        "arguments swapped? Build the lens from the model alone, IGLens(model), and give the "
        "tokenizer to explain(model, tokenizer, prompt) or use it to make the token ids that "
        "IGLens.attribute takes.")
    with pytest.raises(TypeError, match="got a tokenizer .*are the arguments swapped"):
        explain(tok, model, "w1 w2")


def test_a_base_model_without_its_head(model):
    with pytest.raises(UnknownArchitectureError) as info:
        IGLens(model.model)
    assert str(info.value) == (
        "LlamaModel (model_type='llama') is a base model without its language-model head: "
        "IG-Lens reads the next-token probability through the final norm and the unembedding "
        "(lm_head). Pass the causal LM that holds both, IGLens(model) rather than "
        "IGLens(model.model), e.g. AutoModelForCausalLM.from_pretrained(...).")


def _bert(cls_name: str, **extra):
    import transformers

    config = transformers.BertConfig(hidden_size=32, num_hidden_layers=2,
                                     num_attention_heads=2, intermediate_size=64,
                                     vocab_size=100, **extra)
    return getattr(transformers, cls_name)(config)


def _t5():
    from transformers import T5Config, T5ForConditionalGeneration

    return T5ForConditionalGeneration(T5Config(d_model=32, num_layers=2, num_heads=2, d_ff=64,
                                               d_kv=16, vocab_size=100))


@pytest.mark.parametrize("build, message", [
    (lambda: _bert("BertForMaskedLM"),
     "BertForMaskedLM (model_type='bert') is an encoder (a bidirectional, masked-language "
     "model), not a causal LM: IG-Lens explains decoder-only causal language models (Llama, "
     "GPT-2, Qwen, Gemma, ...), whose residual stream at a position ends in the next-token "
     "prediction. Load a decoder-only model with AutoModelForCausalLM."),
    (lambda: _bert("BertLMHeadModel", is_decoder=True),
     "BertLMHeadModel (model_type='bert') is an encoder (a bidirectional, masked-language "
     "model), not a causal LM: IG-Lens explains"),
    (_t5,
     "T5ForConditionalGeneration (model_type='t5') is an encoder-decoder model: IG-Lens "
     "explains decoder-only causal language models (Llama, GPT-2, Qwen, Gemma, ...), whose "
     "residual stream at a position ends in the next-token prediction. Load a decoder-only "
     "model with AutoModelForCausalLM."),
])
def test_encoder_and_encoder_decoder_models_are_named(build, message):
    with pytest.raises(UnknownArchitectureError) as info:
        IGLens(build())
    assert str(info.value).startswith(message)
    assert "decoder_blocks=" not in str(info.value)


def test_token_ids_where_explain_takes_a_prompt(model):
    ids = torch.tensor([[1, 5, 9, 17]])
    with pytest.raises(TypeError) as info:
        explain(model, word_tokenizer(), ids)
    assert str(info.value) == (
        "explain(model, tokenizer, prompt) takes the prompt as text (a str, or a list of str), "
        "got a Tensor of shape (1, 4). To explain token ids, use "
        "IGLens(model).attribute(input_ids, target=...); or decode them first: "
        "explain(model, tokenizer, tokenizer.decode(input_ids[0])).")
    with pytest.raises(ValueError, match="prompt is empty"):  # still said for empty text
        explain(model, word_tokenizer(), " ")


def test_embeddings_where_attribute_takes_token_ids(model):
    ids = torch.tensor([[1, 5, 9, 17]])
    embeds = model.get_input_embeddings()(ids).detach()
    with pytest.raises(ValueError) as info:
        IGLens(model).attribute(embeds, target=3)
    assert str(info.value) == (
        "inputs must be token ids of shape [B, S], got a torch.float32 tensor of shape "
        "(1, 4, 64): that looks like input embeddings [B, S, d] (inputs_embeds). IG-Lens runs "
        "the model from its token ids (the residual stream starts at the model's own "
        "embedding): pass the input_ids, e.g. tokenizer(text, return_tensors='pt').input_ids.")
    with pytest.raises(ValueError, match=r"unsqueeze\(0\) for a single sequence"):
        IGLens(model).attribute(ids[0], target=3)  # the advice where it is right


def test_an_input_past_the_trained_context_is_refused_before_computing(model):
    """The tiny llama is rotary with max_position_embeddings=128 (no position table): 129
    tokens are refused with the rule of explain and iglens run, before any forward pass."""
    assert model.config.max_position_embeddings == 128
    calls = []
    handle = model.register_forward_pre_hook(lambda *_: calls.append(1))
    try:
        with pytest.raises(ValueError) as info:
            IGLens(model).attribute(torch.ones(1, 129, dtype=torch.long), target=3)
        IGLens(model).attribute(torch.ones(1, 128, dtype=torch.long), target=3, n_steps=1)
    finally:
        handle.remove()
    assert str(info.value) == (
        "The input is 129 tokens long, past this model's trained context of 128 tokens (its "
        "config's max_position_embeddings): positions beyond it are extrapolation, so the "
        "credits would describe the model outside its training, and the time and memory grow "
        "with the square of the length (tens of minutes on a CPU). Shorten the input to 128 "
        "tokens or fewer, as explain and iglens run require.")
    assert calls  # the 128-token call ran: only the refused one computed nothing before


def test_a_mistyped_model_name_gets_a_suggestion(capsys):
    from captum_iglens.models.loading import load_model

    with pytest.raises(FileNotFoundError) as info:
        load_model("smolm2")
    message = str(info.value)
    assert message.startswith("load_model(spec='smolm2'): 'smolm2' is neither a model name")
    assert message.endswith("Did you mean 'smollm2'?") and "--model" not in message
    with pytest.raises(FileNotFoundError) as info:
        load_model("qwen2.5-coder-1.5b")
    assert "Did you mean 'qwen2.5-coder-1.5b-instruct' or" in str(info.value)
    assert main(["explain", "--model", "smolm2", "hello"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("iglens: error: --model 'smolm2' is neither a model name")
    assert err.endswith("(models are never downloaded: give a local path): did you mean "
                        "--model smollm2?\n")


@pytest.mark.parametrize("argv, message", [
    (["explain", "--batch-size", "4", "hi"],
     "iglens: error: unrecognized arguments: --batch-size; --batch-size is an option of "
     "'iglens run', not of 'iglens explain' (see 'iglens explain --help')\n"),
    (["--batch-size", "4", "hi"],  # the shorthand for explain
     "iglens: error: unrecognized arguments: --batch-size; --batch-size is an option of "
     "'iglens run', not of 'iglens explain' (see 'iglens explain --help')\n"),
    (["explain", "--n-stepz", "4", "hi"],
     "iglens: error: unrecognized arguments: --n-stepz; --n-stepz: did you mean --n-steps? "
     "(see 'iglens explain --help')\n"),
])
def test_an_option_of_another_command_names_it(capsys, argv, message):
    assert main(argv) == 2
    assert capsys.readouterr().err == message
