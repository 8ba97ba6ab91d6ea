"""compare_completeness for test suites: batches, several positions, rtol/atol, .passed."""

from __future__ import annotations

import json

import pytest
import torch
from _tolerance import completeness_tol
from conftest import make_tiny

from captum_iglens.compare.driver import compare_completeness
from captum_iglens.results import CompletenessBatch, CompletenessReport

METHODS = ["ig_lens", "layer_integrated_gradients", "logit_lens"]


@pytest.fixture(scope="module")
def tiny():
    return make_tiny("llama", n_layers=3)


def _padded() -> tuple[torch.Tensor, torch.Tensor]:
    ids = torch.tensor([[0, 0, 5, 6, 7, 8, 9], [11, 12, 13, 14, 15, 16, 17]])  # pad id 0
    mask = torch.tensor([[0, 0, 1, 1, 1, 1, 1], [1, 1, 1, 1, 1, 1, 1]])
    return ids, mask


@pytest.fixture(scope="module")
def batch(tiny) -> CompletenessBatch:
    ids, mask = _padded()
    return compare_completeness(tiny, ids, position=[-2, -1], n_steps=8, baselines=3,
                                additional_forward_args=mask, methods=METHODS)


def test_batch_is_one_report_per_row_and_position(batch, tiny) -> None:
    assert isinstance(batch, CompletenessBatch) and len(batch) == 4
    assert [(r.row, r.position) for r in batch] == [(0, 5), (0, 6), (1, 5), (1, 6)]
    assert batch.report(1, -1) is batch[3]
    ids, mask = _padded()
    # Each report is the single-prediction comparison of its own row and position: the
    # same calls on the same values (row, mask, reference), so the same floats.
    single = compare_completeness(tiny, ids[1:], position=-2, n_steps=8, baselines=3,
                                  additional_forward_args=mask[1:], methods=METHODS)
    assert isinstance(single, CompletenessReport)
    for name in METHODS:
        torch.testing.assert_close(batch[2][name].per_layer, single[name].per_layer,
                                   atol=0, rtol=0)
    # exact: the same forward on the same row
    assert batch[2].f_input == single.f_input and batch[2].target_id == single.target_id


def test_batch_passes_and_captum_layer_gaps_are_about_k_minus_1_totals(batch) -> None:
    assert batch.passed
    batch.assert_complete()
    for rep in batch:
        ig = rep["ig_lens"]
        assert ig.completeness_gap <= float(completeness_tol(ig.per_layer,
                                                             torch.tensor(ig.total)))
    gaps = batch.gaps("layer_integrated_gradients")
    assert gaps.shape == (2, 2)
    totals = torch.tensor([r.f_input - r.f_baseline for r in batch],
                          dtype=torch.float64).reshape(2, 2)
    # each of the k = 3 layer runs decomposes the whole change: the sum is ~3 totals, the gap
    # ~2; 8 Gauss-Legendre nodes leave a quadrature error under 1% here (not rounding)
    torch.testing.assert_close(gaps, 2 * totals.abs(), atol=0, rtol=0.05)
    assert totals.abs().min() > 0.03  # a real change, not a vacuous one
    with pytest.raises(AssertionError, match="4 of 4 checks failed; the worst: LayerIG"):
        batch.assert_complete(methods=["layer_integrated_gradients"])


def test_targets_are_recorded_and_said_in_the_header(tiny, batch) -> None:
    assert {r.target_source for r in batch} == {"model argmax"}
    assert "model argmax" in batch[0].format_table().splitlines()[0]
    ids, mask = _padded()
    given = compare_completeness(tiny, ids, target=torch.tensor([40, 41]), position=-1,
                                 n_steps=4, baselines=3, additional_forward_args=(mask,),
                                 methods=["ig_lens"])
    assert [r.target_id for r in given] == [40, 41]
    assert all(r.target_source == "given" for r in given)
    assert "(id 41, given) at row 1, position 6" in given[1].format_table()
    data = json.loads(json.dumps(batch.to_dict()))
    assert data["n_rows"] == 2 and data["positions"] == [5, 6]
    assert data["reports"][3]["target_source"] == "model argmax"


def test_tolerances_and_the_worst_layer_in_the_message(tiny) -> None:
    ids = torch.tensor([[5, 9, 14, 21, 33, 40, 52]])
    rep = compare_completeness(tiny, ids, n_steps=4, baselines=3,
                               methods=["ig_lens", "logit_lens"])
    ig = rep["ig_lens"]
    derived = float(completeness_tol(ig.per_layer, torch.tensor(ig.total)))
    assert rep.completeness_bound("ig_lens") == pytest.approx(derived, rel=1e-12)
    assert rep.passed and "check IG-Lens" in rep.format_table()
    # a credit moved by ten bounds fails the derived check, names the layer whose credit
    # differs from its own segment's change of the lens levels, and passes a loose atol
    ig.per_layer[1] += 10 * derived
    assert not rep.passed and "FAILED" in rep.format_table()
    with pytest.raises(AssertionError, match=r"worst layer L2: its credit"):
        rep.assert_complete()
    rep.assert_complete(atol=20 * derived)
    rep.rtol, rep.atol = 0.0, 100 * derived
    assert rep.passed
    with pytest.raises(ValueError, match="rtol and atol must be >= 0"):
        rep.assert_complete(atol=-1.0)
    with pytest.raises(ValueError, match="levels, not credits"):
        rep.assert_complete(methods=["logit_lens"])


def test_report_rtol_atol_from_the_call(tiny) -> None:
    ids = torch.tensor([[5, 9, 14, 21, 33]])
    rep = compare_completeness(tiny, ids, n_steps=4, baselines=3, methods=["ig_lens"],
                               rtol=0.0, atol=0.5)
    assert (rep.rtol, rep.atol) == (0.0, 0.5)
    assert rep.completeness_bound("ig_lens") == pytest.approx(0.5)


def test_forward_arg_tuples_beyond_the_mask(tiny) -> None:
    """Captum passes additional_forward_args positionally after the inputs: (mask, -1) would
    make -1 the position ids (transformers crashed inside); it is refused, naming the
    parameter. A tensor there is used as Captum would use it."""
    from captum_iglens import IGLens
    from captum_iglens._core.inputs import position_ids_from_mask

    ids, mask = _padded()
    lens = IGLens(tiny)
    with pytest.raises(TypeError, match=r"additional_forward_args\[1\] = -1 goes to the "
                                        r"forward's 'position_ids' parameter"):
        lens.attribute(ids, additional_forward_args=(mask, -1))
    with pytest.raises(ValueError, match="additional_forward_args has 40 elements"):
        lens.attribute(ids, additional_forward_args=(mask,) + (None,) * 39)
    plain = lens.attribute(ids, additional_forward_args=mask)
    # the position ids the mask implies, given explicitly: the same call, the same floats
    given = lens.attribute(ids, additional_forward_args=(mask, position_ids_from_mask(mask)))
    torch.testing.assert_close(given, plain, atol=0, rtol=0)
