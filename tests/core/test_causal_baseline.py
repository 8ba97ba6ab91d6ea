"""The default "mean" baseline is causal: position p's path start reads only h_1 at the
attended positions <= p of p's own document, so a token's credits do not depend on what
follows it (answer length), on other documents packed into its row, or on padding."""

from __future__ import annotations

import warnings

import pytest
import torch
from _tolerance import credit_sensitivity, f32_tol, node_sensitivity, reduction_length
from conftest import make_tiny
from tiny_tokenizer import word_tokenizer

from captum_iglens import IGLens, explain
from captum_iglens._core.baselines import causal_mean, document_starts


def _loop_mean(first: torch.Tensor, mask: torch.Tensor, starts: list[list[int]]) -> torch.Tensor:
    """Independent reference: for each row and position, the masked mean over its own
    document's columns up to it, one position at a time."""
    out = torch.zeros_like(first)
    for b in range(first.shape[0]):
        for p in range(first.shape[1]):
            begin = max(s for s in starts[b] if s <= p)
            w = mask[b, begin:p + 1].double()
            if w.sum() > 0:
                out[b, p] = ((first[b, begin:p + 1].double() * w[:, None]).sum(0)
                             / w.sum()).to(first.dtype)
    return out


def test_causal_mean_equals_a_position_by_position_mean() -> None:
    gen = torch.Generator().manual_seed(0)
    first = torch.randn(2, 9, 5, generator=gen)
    mask = torch.ones(2, 9, dtype=torch.long)
    mask[1, :2] = 0  # left padding in row 1
    # row 0 packs two documents (positions restart at column 4); row 1 is one document
    position_ids = torch.tensor([[0, 1, 2, 3, 0, 1, 2, 3, 4], [0, 0, 0, 1, 2, 3, 4, 5, 6]])
    assert document_starts(position_ids, (2, 9), first.device)[0].tolist() == \
        [0, 0, 0, 0, 4, 4, 4, 4, 4]
    got = causal_mean(first, mask, position_ids)
    want = _loop_mean(first, mask, [[0, 4], [0, 1, 2]])
    # both sum in float64 and round once to float32: at most one float32 rounding apart
    assert ((got - want).abs() <= f32_tol(want, want)).all()
    # the last position of document 0 is not the row's mean (that read document 1)
    assert (got[0, 3] - first[0].mean(0)).abs().max() > 1e-2
    # padding counts nowhere: row 1's position 2 averages itself only
    assert ((got[1, 2] - first[1, 2]).abs() <= f32_tol(first[1, 2])).all()


def _generated(model, tokenizer, n_new: int):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return explain(model, tokenizer, "w3 w5 w7", max_new_tokens=n_new, chat_template=False)


def test_answer_token_0_is_the_same_for_2_and_24_new_tokens() -> None:
    model = make_tiny("llama").eval()
    model.generation_config.eos_token_id = None  # never stop early: 24 tokens
    tokenizer = word_tokenizer()
    short, long = _generated(model, tokenizer, 2), _generated(model, tokenizer, 24)
    assert len(short.token_ids) == 2 and len(long.token_ids) == 24
    assert short.token_ids == long.token_ids[:2]
    # Both answers come from the same prompt pass and KV-cached pass (recorded while
    # generating) and the causal baseline reads nothing after the explained position:
    # the same operations on the same values, bit for bit.
    assert torch.equal(short.attributions, long.attributions[:2])
    assert torch.equal(short.p_baseline, long.p_baseline[:2])


@pytest.mark.numerics
def test_a_document_packed_into_a_row_is_explained_as_alone() -> None:
    model = make_tiny("llama").eval()
    lens = IGLens(model)
    first, second = torch.tensor([[5, 6, 7, 8]]), torch.tensor([[9, 10, 11, 12, 13]])
    packed = torch.cat([first, second], dim=1)
    position_ids = torch.tensor([[0, 1, 2, 3, 0, 1, 2, 3, 4]])
    alone = lens.attribute_details(second, positions=[1, 4])
    # no attention mask: transformers reads the packed documents from the position ids
    inside = lens.attribute_details(packed, target=alone.target, positions=[5, 8],
                                    additional_forward_args={"position_ids": position_ids})
    sens = node_sensitivity(lens, second, [1, 4], alone.target)
    n = reduction_length(model)
    tol = f32_tol(credit_sensitivity(sens), credit_sensitivity(sens), n_terms=n)
    assert ((inside.attributions - alone.attributions).abs() <= tol).all()
    # the whole row's mean (the old default) moves the baseline of document 1's first
    # explained token far beyond rounding
    base_tol = f32_tol(sens[:, :1, 0], sens[:, :1, 0], n_terms=n)
    whole = lens.attribute_details(
        packed, target=alone.target[:, :1], positions=[5],
        additional_forward_args={"position_ids": position_ids},
        baselines=_row_mean_h1(lens, packed, position_ids))
    assert (whole.p_baseline - alone.p_baseline[:, :1]).abs().max() > 10 * base_tol.max()


def _row_mean_h1(lens: IGLens, ids: torch.Tensor, position_ids: torch.Tensor) -> torch.Tensor:
    from captum_iglens.lens.hooks import capture_residual_stream

    with capture_residual_stream(lens.decoder_blocks, [1]) as states:
        with torch.no_grad():
            lens.model(ids, position_ids=position_ids, use_cache=False)
    return states[1].mean(1)
