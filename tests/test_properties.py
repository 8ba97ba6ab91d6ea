"""Property test (issue 4, item 7): on random tiny models of several families, random layer
subsets, baselines, positions and targets, Invariant C (completeness with the default
estimator) and Invariant R (p_final is the model's own probability) always hold, to the
float32 rounding bounds of tests/_tolerance.py.
"""

from __future__ import annotations

import pytest
import torch
from _tolerance import (
    completeness_tol,
    f32_tol,
    lens_nodes,
    readout_prob_magnitude,
    reduction_length,
)
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tiny_families import make_family

from captum_iglens import IGLens

FAMILIES = ("llama", "gpt2", "gpt_neox", "gemma2", "granite", "opt_350m", "bloom", "phi")


@st.composite
def cases(draw: st.DrawFn) -> dict:
    family = draw(st.sampled_from(FAMILIES))
    n_blocks = draw(st.integers(1, 3))
    seq_len = draw(st.integers(1, 7))
    batch = draw(st.integers(1, 2))
    layers = draw(st.lists(st.integers(0, n_blocks), unique=True, max_size=n_blocks + 1))
    positions = draw(st.lists(st.integers(-seq_len, seq_len - 1), min_size=1, max_size=3))
    baseline = draw(st.sampled_from(["mean", "zero", "embedding", "tensor"]))
    target = draw(st.one_of(st.none(), st.integers(0, 127)))
    seed = draw(st.integers(0, 2**16))
    chunk = draw(st.sampled_from([None, 1, 5]))
    return dict(family=family, n_blocks=n_blocks, seq_len=seq_len, batch=batch, layers=layers,
                positions=positions, baseline=baseline, target=target, seed=seed, chunk=chunk)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@pytest.mark.numerics
@given(cases())
def test_completeness_and_readout_exactness(case: dict) -> None:
    model = make_family(case["family"], seed=case["seed"], n_blocks=case["n_blocks"])
    gen = torch.Generator().manual_seed(case["seed"])
    ids = torch.randint(0, 128, (case["batch"], case["seq_len"]), generator=gen)
    baseline = case["baseline"]
    if baseline == "tensor":
        baseline = torch.randn(case["batch"], 64, generator=gen)
    lens = IGLens(model, layers=case["layers"] or None, check_readout=False)
    assert lens.layer_indices[-1] == case["n_blocks"]
    out = lens.attribute_details(ids, target=case["target"], positions=case["positions"],
                                 baselines=baseline, internal_batch_size=case["chunk"])
    k = len(lens.layer_indices)
    assert out.attributions.shape == (case["batch"], len(case["positions"]), k)
    # Invariant C, against the float32 readout: k float32 credits summed (rigorous bound)
    bound = completeness_tol(out.attributions, out.delta_p)
    assert (out.convergence_delta.abs() <= bound).all()
    assert ((out.attributions.sum(-1) - (out.p_final - out.p_baseline)).abs() <= bound).all()
    # Invariant R, against the model's own logits
    with torch.no_grad():
        logits = model.eval()(ids, use_cache=False).logits
    probs = torch.softmax(logits, -1)[:, out.positions]
    expected = probs.gather(-1, out.target[..., None])[..., 0]
    # Same ids and shapes, so the same h_n; the final norm and head run on other rows.
    h_n = lens_nodes(lens, ids, out.positions, "zero")[:, :, -1]
    mag = readout_prob_magnitude(lens.readout, h_n).gather(-1, out.target[..., None])[..., 0]
    assert ((out.p_final - expected).abs()
            <= f32_tol(mag, mag, n_terms=reduction_length(lens.readout))).all()
    assert (out.lens_probs[..., -1] == out.p_final).all()
