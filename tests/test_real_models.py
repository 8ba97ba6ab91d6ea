"""Every installed named model, on its real weights: Invariant R against the model's own
logits, completeness, recorded generation equal to teacher forcing, and a left-padded batch
equal to its rows alone. Models that are not installed are skipped with the command that
installs them (marker real_model; CI installs Qwen2.5-Coder-0.5B beside SmolLM2)."""

from __future__ import annotations

import warnings

import pytest
import torch
from _tolerance import (
    completeness_tol,
    f32_tol,
    lens_nodes,
    node_sensitivity,
    readout_sensitivity,
    reduction_length,
)

from captum_iglens import IGLens, explain
from captum_iglens.models.loading import load_model
from captum_iglens.models.registry import NAMED_MODELS, part_files

PROMPT = "What is the capital of Vietnam?"


def _installed(name: str) -> str:
    entry = NAMED_MODELS.get(name)
    if entry is not None:
        try:
            part_files(entry)
        except FileNotFoundError:
            pytest.skip(f"{name} is not installed: {entry.pip_command()}")
    return name


@pytest.fixture(scope="module", params=["smollm2-135m-instruct", "qwen2.5-coder-0.5b-instruct",
                                        "qwen2.5-coder-1.5b-instruct"])
def named(request, smollm2):
    name = _installed(request.param)
    if name == "smollm2-135m-instruct":
        yield (name, *smollm2)
        return
    model, tokenizer = load_model(name)
    yield name, model, tokenizer
    del model


def _explain(model, tokenizer, **kwargs):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return explain(model, tokenizer, PROMPT, max_new_tokens=4, **kwargs)


@pytest.mark.real_model
@pytest.mark.numerics
def test_readout_is_the_models_own_and_credits_complete(named) -> None:
    _, model, tokenizer = named
    result = _explain(model, tokenizer)
    ids = torch.tensor([result.input_ids[:-1]])
    with torch.no_grad():
        probs = torch.softmax(model(ids, use_cache=False).logits[0].float(), -1)
    expected = probs[result.positions, result.token_ids]
    lens = IGLens(model)
    h_n = lens_nodes(lens, ids, result.positions, "zero")[:, :, -1]
    sens = readout_sensitivity(lens.readout, h_n, torch.tensor([result.token_ids]))[0]
    # the recorded KV-cached passes against one full forward: the readout's own rounding
    # plus the forward's, bounded through the readout (both run the same weights)
    tol = f32_tol(sens, sens, n_terms=reduction_length(model))
    assert ((result.p_final - expected).abs() <= tol).all()
    assert (result.convergence_delta.abs()
            <= completeness_tol(result.attributions, result.delta_p)).all()
    assert result.delta_p.abs().max() > 1e-2  # non-trivial credits


#: Whole-model bounds (a backward pass over every weight, its gradients held at once) for
#: models up to this size; larger ones (the 1.5B: ~14 GB) are checked at the readout only.
SENSITIVITY_LIMIT = 1_000_000_000


def _small_enough(name: str, model) -> None:
    size = sum(p.numel() for p in model.parameters())
    if size > SENSITIVITY_LIMIT:
        pytest.skip(f"{name}: the whole-model rounding bound needs a backward pass over "
                    f"{size / 1e9:.1f}B weights; checked at the readout only")


def _end_bounds(model, ids: torch.Tensor, positions: list[int], target: torch.Tensor,
                mask: torch.Tensor | None = None) -> torch.Tensor:
    """Rounding bounds ``[B, P, 2]`` of ``p_baseline`` and ``p_final`` for two forward passes
    of other shapes: eps sqrt(n) times the whole-model sensitivity of the readout at the
    path's two ends (a lens with the last block only), one backward pass per value."""
    lens = IGLens(model, layers=[len(IGLens(model).decoder_blocks)])
    sens = node_sensitivity(lens, ids, positions, target, "mean", mask)
    return f32_tol(sens, sens, n_terms=reduction_length(model))


@pytest.mark.real_model
@pytest.mark.numerics
def test_recorded_generation_equals_teacher_forcing(named) -> None:
    """The recorded KV-cached passes against one teacher-forced forward: the same answer,
    and p_final, p_baseline (the causal mean baseline's readout) and delta_p within the
    whole-model bound of the path's ends (per-credit bounds on every family's tiny model:
    test_run.test_recorded_generation_equals_teacher_forcing_alone)."""
    name, model, tokenizer = named
    _small_enough(name, model)
    recorded = _explain(model, tokenizer)
    forced = _explain(model, tokenizer, target=recorded.token_ids)
    assert forced.token_ids == recorded.token_ids
    ids = torch.tensor([recorded.input_ids[:-1]])
    tol = _end_bounds(model, ids, recorded.positions, torch.tensor([recorded.token_ids]))[0]
    assert ((recorded.p_final - forced.p_final).abs() <= tol[:, 1]).all()
    assert ((recorded.p_baseline - forced.p_baseline).abs() <= tol[:, 0]).all()
    assert ((recorded.delta_p - forced.delta_p).abs() <= tol.sum(-1)).all()


@pytest.mark.real_model
@pytest.mark.numerics
def test_left_padded_batch_rows_equal_each_alone(named) -> None:
    name, model, tokenizer = named
    _small_enough(name, model)
    seqs = [torch.tensor(tokenizer(t, add_special_tokens=False)["input_ids"])
            for t in ("The capital of France is", "Two plus two equals")]
    width = max(len(s) for s in seqs)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    ids = torch.full((2, width), pad)
    mask = torch.zeros(2, width, dtype=torch.long)
    for row, seq in enumerate(seqs):
        ids[row, width - len(seq):], mask[row, width - len(seq):] = seq, 1
    lens = IGLens(model)
    batch = lens.attribute_details(ids, additional_forward_args=mask)
    for row, seq in enumerate(seqs):
        one = lens.attribute_details(seq[None], target=batch.target[row:row + 1])
        # a padded row's sum of |terms| is its own (padding gets no attention weight)
        tol = _end_bounds(model, seq[None], [-1], batch.target[row:row + 1])[0, 0]
        assert abs(float(batch.p_final[row, 0] - one.p_final[0, 0])) <= float(tol[1])
        assert abs(float(batch.delta_p[row, 0] - one.delta_p[0, 0])) <= float(tol.sum())
