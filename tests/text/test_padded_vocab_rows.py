"""Answer tokens that are padded vocabulary rows (an output embedding resized with
``pad_to_multiple_of``): no token exists for them, the tokenizer decodes them to ``""``.
Their numbers are the model's own; the labels say what they are and a warning says that the
answer text leaves them out."""

from __future__ import annotations

import pytest
import torch
from tiny_families import make_family
from tiny_tokenizer import word_tokenizer

from captum_iglens import explain
from captum_iglens.text.explain_prompt import explain_ids

PADDED = 150  # a row of the resized head beyond the tokenizer's 128 tokens


def _padded_model() -> torch.nn.Module:
    model = make_family("llama", n_blocks=2).eval()
    model.resize_token_embeddings(130, pad_to_multiple_of=64)
    assert model.lm_head.weight.shape[0] == 192 > PADDED
    return model


def test_a_padded_row_in_the_answer_is_labelled_and_warned() -> None:
    model, tok = _padded_model(), word_tokenizer()
    prompt, answer = tok("w1 w2 w3").input_ids, [9, PADDED, 10]
    assert tok.decode([PADDED]) == ""  # what the labels said before: nothing
    with pytest.warns(UserWarning, match=r"Answer token ids \[150\] are padded vocabulary rows"):
        result = explain_ids(model, prompt, answer, tokenizer=tok, top_k=192)
    assert result.tokens == [tok.decode([9]), "<vocab row 150: no token>", tok.decode([10])]
    assert "<vocab row 150: no token>" in result.top_k_tokens[0][0]  # every row is in the top k
    bare = explain_ids(model, prompt, answer)  # no tokenizer: ids as labels, same numbers
    assert torch.equal(result.attributions, bare.attributions)
    assert bare.tokens == ["9", "150", "10"]


def test_a_generated_padded_row_is_labelled_and_warned() -> None:
    model, tok = _padded_model(), word_tokenizer()
    ids = tok("w1 w2 w3", return_tensors="pt").input_ids
    with torch.no_grad():
        first = int(model(ids, use_cache=False).logits[0, -1].argmax())
        # make the padded row the model's first answer token: its logit is 3 x the argmax's
        model.lm_head.weight[PADDED] = 3 * model.lm_head.weight[first]
        assert int(model(ids, use_cache=False).logits[0, -1].argmax()) == PADDED
    with pytest.warns(UserWarning, match="padded vocabulary rows"):
        result = explain(model, tok, "w1 w2 w3", max_new_tokens=3, chat_template=False)
    assert result.token_ids[0] == PADDED and result.tokens[0] == "<vocab row 150: no token>"
    assert result.is_argmax[0]
