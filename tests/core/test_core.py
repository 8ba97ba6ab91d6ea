"""Core IG-Lens invariants on tiny random models (perturbed norms): R, C, Captum contract."""

from __future__ import annotations

import warnings

import pytest
import torch
from _tolerance import (
    completeness_tol,
    credit_sensitivity,
    f32_tol,
    head_gradient_magnitude,
    lens_nodes,
    readout_prob_magnitude,
    readout_sensitivity,
    reduction_length,
)
from conftest import make_tiny

from captum_iglens import IGLens, onset_layer_indices
from captum_iglens.lens.hooks import capture_residual_stream

F32_EPS = torch.finfo(torch.float32).eps

GRADIENT_METHODS = ["riemann_left", "riemann_right", "riemann_middle", "riemann_trapezoid",
                    "gausslegendre"]


def model_probs(model: torch.nn.Module, ids: torch.Tensor, **kwargs) -> torch.Tensor:
    """softmax of the model's own logits, [B, S, V] float32."""
    with torch.no_grad():
        return torch.softmax(model.eval()(ids, use_cache=False, **kwargs).logits.float(), -1)


@pytest.mark.numerics
def test_readout_reproduces_model_logits(tiny_model, input_ids):
    """Invariant R on the full vocabulary at every position (Llama, GPT-2, GPT-NeoX), to the
    float32 rounding of two readouts of the same h_n (tests/_tolerance.py)."""
    lens = IGLens(tiny_model)
    n = lens.num_layers
    with torch.no_grad(), capture_residual_stream(lens.decoder_blocks, [n]) as states:
        logits = tiny_model.eval()(input_ids, use_cache=False).logits
        lens_logits = lens.readout(states[n])
    mag = readout_prob_magnitude(lens.readout, states[n])  # [B, S, V]
    tol = f32_tol(mag, mag, n_terms=reduction_length(lens.readout))
    assert ((torch.softmax(lens_logits, -1) - torch.softmax(logits, -1)).abs() <= tol).all()

    positions = [0, 3, -1]
    out = lens.attribute_details(input_ids, positions=positions)
    expected = model_probs(tiny_model, input_ids)[:, positions]
    expected = expected.gather(-1, out.target[..., None])[..., 0]
    # Same ids, same shapes: h_n is the same; the final norm and head run on other rows.
    sens = readout_sensitivity(lens.readout, states[n][:, positions], out.target)
    tol = f32_tol(sens, sens, n_terms=reduction_length(lens.readout))
    assert ((out.p_final - expected).abs() <= tol).all()


@pytest.mark.numerics
def test_last_hidden_state_is_post_norm_and_not_read_twice(tiny_llama, input_ids):
    """hidden_states[-1] is already normalised in transformers 5: normalising it again (the
    reference script's bug) breaks Invariant R, while the hooked residual satisfies it."""
    lens = IGLens(tiny_llama)
    with torch.no_grad():
        out = tiny_llama.eval()(input_ids, output_hidden_states=True, use_cache=False)
    true_p = torch.softmax(out.logits, -1)
    double_norm_p = torch.softmax(lens.readout(out.hidden_states[-1]), -1)
    details = lens.attribute_details(input_ids, positions=-1)
    expected = true_p[:, -1].gather(-1, details.target)[:, 0]
    h_n = lens_nodes(lens, input_ids, [-1], "zero")[:, :, -1]
    sens = readout_sensitivity(lens.readout, h_n, details.target)[:, 0]
    tol = f32_tol(sens, sens, n_terms=reduction_length(lens.readout))
    assert ((details.p_final[:, 0] - expected).abs() <= tol).all()
    # The bug is visible far above that rounding bound.
    assert (double_norm_p - true_p).abs().max() > 1e3 * tol.max()


@pytest.mark.numerics
@pytest.mark.parametrize("n_steps", [1, 4, 64])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_completeness_default_estimator(tiny_model, input_ids, n_steps, dtype):
    """Invariant C at any step count, and equality with the explicit grid of n_steps + 1
    points per segment (observed changes summed), to the rounding of the dtype."""
    model = tiny_model.to(dtype)
    lens = IGLens(model)
    attr, delta = lens.attribute(input_ids, positions=[2, -1], n_steps=n_steps,
                                 return_convergence_delta=True)
    assert attr.dtype == (torch.float64 if dtype == torch.float64 else torch.float32)
    assert attr.shape == (2, 2, lens.num_layers)
    details = lens.attribute_details(input_ids, positions=[2, -1])
    bound = completeness_tol(attr, details.delta_p)  # rigorous: k credits summed
    assert (delta.abs() <= bound).all()
    direct = attr.sum(-1) - (details.p_final - details.p_baseline)
    assert (direct.abs() <= bound).all()
    grid = lens.path_probabilities(input_ids, positions=[2, -1], n_steps=n_steps)
    assert grid.shape == (2, 2, lens.num_layers, n_steps + 1)
    grid_credit = grid.diff(dim=-1).sum(-1)
    # The grid's changes telescope to the same endpoints, read out in other chunks (and
    # h_{j-1} + 1.0 * (h_j - h_{j-1}) need not round to h_j): both readouts' bounds, plus
    # n_steps + 1 roundings of the differences and their sum.
    nodes = lens_nodes(lens, input_ids, [2, -1])
    sens = readout_sensitivity(lens.readout, nodes, details.target)
    eps = torch.finfo(dtype).eps
    tol = (f32_tol(credit_sensitivity(sens), credit_sensitivity(sens),
                   n_terms=reduction_length(lens.readout), eps=eps)
           + eps * (n_steps + 1) * grid.diff(dim=-1).abs().sum(-1).double())
    assert ((grid_credit - attr).abs() <= tol).all()
    # the test means something: credits stand far above these bounds
    assert attr.abs().max() > 1e3 * max(float(bound.max()), float(tol.max()))


@pytest.mark.numerics
def test_gradient_estimators_converge(tiny_llama, input_ids):
    lens = IGLens(tiny_llama)
    for method in GRADIENT_METHODS:
        errors = []
        for n_steps in (4, 16, 64):
            _, delta = lens.attribute(input_ids, method=method, n_steps=n_steps,
                                      return_convergence_delta=True)
            errors.append(delta.abs().max().item())
        assert errors[2] < errors[0], (method, errors)
    exact = lens.attribute_details(input_ids)
    gl, delta = lens.attribute(input_ids, method="gausslegendre", n_steps=64,
                               return_convergence_delta=True)
    # Both estimate the same segment integrals. 64 Gauss-Legendre nodes integrate the
    # analytic readout far below float32 rounding (in float64 GL-16, 32 and 64 agree with the
    # endpoint differences to the float32 RMSNorm's own rounding, 2e-8), so what is left is
    # the rounding of each: the gradient credits' sums of |terms| and the readouts' at the
    # nodes (tests/_tolerance.py).
    nodes = lens_nodes(lens, input_ids, [-1])
    mag = head_gradient_magnitude(lens.readout, nodes, exact.target, "gausslegendre", 64)
    sens = readout_sensitivity(lens.readout, nodes, exact.target)
    n = reduction_length(lens.readout)
    tol = f32_tol(mag, credit_sensitivity(sens), n_terms=n)[:, 0]
    assert ((gl - exact.attributions[:, 0]).abs() <= tol).all()
    # delta: the credits' bounds summed, plus the float32 sum of k credits
    bound = tol.sum(-1) + completeness_tol(gl, exact.delta_p[:, 0])
    assert (delta.abs() <= bound).all()
    assert (exact.attributions.abs().max(-1).values > 1e2 * tol.max(-1).values).all()


def test_convergence_delta_contract(tiny_llama, input_ids):
    lens = IGLens(tiny_llama, layers=[1, 3])
    assert lens.has_convergence_delta()
    assert hasattr(lens.attribute, "__wrapped__")
    for method in ("prediction_aware", "riemann_trapezoid"):
        attr, delta = lens.attribute(input_ids, positions=[1, -1], method=method, n_steps=8,
                                     return_convergence_delta=True)
        again = lens.compute_convergence_delta(attr, "mean", input_ids, positions=[1, -1])
        assert torch.equal(delta, again)
    attr1, delta1 = lens.attribute(input_ids, return_convergence_delta=True)
    assert attr1.shape == (2, 3) and delta1.shape == (2,)  # layers 1, 3 and the last block 4
    assert torch.equal(delta1, lens.compute_convergence_delta(attr1, "mean", input_ids))


@pytest.mark.numerics
def test_internal_batch_size_does_not_change_results(tiny_model, input_ids):
    """Chunk sizes change the row counts of the readout's matrix products, hence the BLAS
    kernel and summation order: results agree to the float32 bound of each credit."""
    lens = IGLens(tiny_model)
    positions = [0, 4, -1]
    nodes = lens_nodes(lens, input_ids, positions)
    n = reduction_length(lens.readout)
    for method in ("prediction_aware", "gausslegendre"):
        ref = lens.attribute_details(input_ids, positions=positions, method=method, n_steps=6)
        if method == "prediction_aware":
            mag = credit_sensitivity(readout_sensitivity(lens.readout, nodes, ref.target))
        else:
            mag = head_gradient_magnitude(lens.readout, nodes, ref.target, method, 6)
        tol = f32_tol(mag, mag, n_terms=n)
        for chunk in (1, 7, 1000):
            got = lens.attribute(input_ids, positions=positions, method=method, n_steps=6,
                                 internal_batch_size=chunk)
            assert ((got - ref.attributions).abs() <= tol).all(), (method, chunk)
        # a chunk row lost or counted twice moves a credit by a whole step's share
        assert ref.attributions.abs().max() > 1e2 * tol.max()


def _hook_count(model: torch.nn.Module) -> int:
    return sum(len(m._forward_hooks) + len(m._forward_pre_hooks) for m in model.modules())


def test_model_state_restored_after_success_and_error(input_ids):
    model = make_tiny("gpt2")  # constructed in train mode, dropout 0.1
    model.transformer.h[0].requires_grad_(False)
    flags = [p.requires_grad for p in model.parameters()]
    lens = IGLens(model)
    hooks = _hook_count(model)
    first = lens.attribute(input_ids, method="riemann_middle", n_steps=4)
    second = lens.attribute(input_ids, method="riemann_middle", n_steps=4)
    assert torch.equal(first, second)  # dropout never active
    assert model.training and model.transformer.h[1].attn.training
    assert [p.requires_grad for p in model.parameters()] == flags
    assert all(p.grad is None for p in model.parameters())
    assert _hook_count(model) == hooks

    def boom(*_):
        raise RuntimeError("boom")

    handle = model.transformer.h[1].register_forward_hook(boom)
    with pytest.raises(RuntimeError, match="boom"):
        lens.attribute(input_ids)
    handle.remove()
    assert _hook_count(model) == hooks
    assert model.training and model.transformer.h[0].training
    assert [p.requires_grad for p in model.parameters()] == flags


def test_layers_modules_ints_and_last_block():
    model = make_tiny("llama", n_layers=4)
    blocks = model.model.layers
    assert IGLens(model).layer_indices == (1, 2, 3, 4)
    assert IGLens(model, layers=[blocks[2], blocks[0]]).layer_indices == (1, 3, 4)
    assert IGLens(model, layers=[0, 2]).layer_indices == (0, 2, 4)
    assert IGLens(model, layers=[model.get_input_embeddings(), -1]).layer_indices == (0, 4)
    attr = IGLens(model, layers=[0, 2]).attribute(torch.tensor([[5, 6, 7]]))
    assert attr.shape == (1, 3)


@pytest.mark.numerics
def test_default_baseline_does_not_depend_on_the_chosen_layers(tiny_llama, input_ids):
    """The "mean" baseline is the mean of h_1 whatever the layers: the same token has the
    same p_baseline and delta_p with all layers, with layers from 0, and with two layers."""
    outs = [IGLens(tiny_llama, layers=layers).attribute_details(input_ids, positions=[2, -1])
            for layers in (None, [0, 2], [3], [0, 1, 2, 3])]
    # the same readout of the same vectors in other chunk shapes: float32 rounding only
    lens = IGLens(tiny_llama)
    nodes = lens_nodes(lens, input_ids, [2, -1])  # [B, P, k + 1, d]: baseline, ..., h_n
    sens = readout_sensitivity(lens.readout, nodes[:, :, [0, -1]],
                               outs[0].target)
    n = reduction_length(lens.readout)
    tol_base = f32_tol(sens[..., 0], sens[..., 0], n_terms=n)
    tol_delta = f32_tol(sens.sum(-1), sens.sum(-1), n_terms=n)
    for out in outs[1:]:
        assert ((out.p_baseline - outs[0].p_baseline).abs() <= tol_base).all()
        assert ((out.delta_p - outs[0].delta_p).abs() <= tol_delta).all()
    assert outs[0].delta_p.abs().max() > 1e-3  # a non-trivial total
    # the baseline is the causal mean of the first block's output (positions 0..p for
    # position p), not of h_0 or h_{L_1}, nor of the whole sequence
    with capture_residual_stream(IGLens(tiny_llama).decoder_blocks, [1]) as states:
        with torch.no_grad():
            tiny_llama.eval()(input_ids, use_cache=False)
    seq = input_ids.shape[1]
    prefix_means = torch.stack([states[1][:, :3].mean(1), states[1].mean(1)], dim=1)
    explicit = IGLens(tiny_llama, layers=[0, 2]).attribute_details(
        input_ids, prefix_means, positions=[2, seq - 1])
    assert ((explicit.p_baseline - outs[1].p_baseline).abs() <= tol_base).all()
    whole = IGLens(tiny_llama, layers=[0, 2]).attribute_details(
        input_ids, states[1].mean(1), positions=[2, seq - 1])
    # position 2's baseline is not the whole sequence's mean (that read the future)
    assert (whole.p_baseline[:, 0] - outs[1].p_baseline[:, 0]).abs().max() > 100 * tol_base.max()


@pytest.mark.numerics
def test_layer_subset_credits_are_sums_of_finer_credits(tiny_llama, input_ids):
    """Telescoping: merging adjacent segments of the path adds their credits (to the
    rounding of the node readouts, in chunks of other shapes, and of the float32 sum)."""
    fine_lens = IGLens(tiny_llama, layers=[1, 2, 3, 4])
    fine = fine_lens.attribute_details(input_ids)
    coarse = IGLens(tiny_llama, layers=[2, 4]).attribute(input_ids)
    nodes = lens_nodes(fine_lens, input_ids, [-1])[:, 0]  # [B, 5, d]: b, h_1, ..., h_4
    sens = readout_sensitivity(fine_lens.readout, nodes, fine.target.expand(-1, 5))
    n = reduction_length(fine_lens.readout)
    for merged, (a, b) in ((coarse[:, 0], (0, 2)), (coarse[:, 1], (2, 4))):
        ends = sens[:, a] + sens[:, b]  # both runs read out the segment's two endpoints
        parts = fine.attributions[:, 0, a:b]
        tol = f32_tol(ends, ends, n_terms=n) + F32_EPS * parts.abs().sum(-1).double()
        assert ((merged - parts.sum(-1)).abs() <= tol).all()


def test_onset_layer():
    attr = torch.tensor([[0.1, 0.3, 0.6], [-0.4, 0.1, 0.5], [0.0, 0.0, 0.0]])
    onset = onset_layer_indices(attr, [2, 5, 8], frac=0.5, rule="mass")
    assert onset.tolist() == [8, 5, 2]
    assert onset_layer_indices(attr, [2, 5, 8], frac=0.35, rule="mass").tolist() == [5, 2, 2]
    # sustained (default): cumulative credit stays >= half of delta_p from the onset on;
    # row 2's cumulative sum is -0.4, -0.3, 0.2: only the last layer holds half of 0.2
    assert onset_layer_indices(attr, [2, 5, 8]).tolist() == [8, 8, 2]
    with pytest.raises(ValueError, match="fraction"):
        onset_layer_indices(attr, [2, 5, 8], frac=0.0)
    with pytest.raises(ValueError, match="onset rule"):
        onset_layer_indices(attr, [2, 5, 8], rule="median")


def test_sustained_onset_is_never_a_layer_that_lowers_the_probability():
    """The mass rule can pick a layer with negative credit; the default rule cannot when
    delta_p > 0, and for delta_p < 0 it mirrors (a layer that lowers the probability)."""
    attr = torch.tensor([[0.6, -0.5, 0.3], [-0.1, -0.3, 0.05]])
    assert onset_layer_indices(attr, [1, 2, 3], rule="mass").tolist() == [2, 2]
    assert onset_layer_indices(attr, [1, 2, 3]).tolist() == [3, 2]
    gen = torch.Generator().manual_seed(0)
    credits = torch.randn(500, 7, generator=gen)
    onset = onset_layer_indices(credits, list(range(7)))
    chosen = credits.gather(-1, onset[:, None])[:, 0]
    positive = credits.sum(-1) > 0
    assert (chosen[positive] > 0).all() and (chosen[~positive] < 0).all()
    cumulative = credits.double().cumsum(-1)
    half = 0.5 * cumulative[:, -1:]
    sign = half.sign()
    after = torch.arange(7)[None] >= onset[:, None]
    assert ((sign * cumulative >= sign * half - 1e-12) | ~after).all()


def test_input_forms_and_refusals_that_would_otherwise_be_silent(tiny_llama, input_ids):
    """Inputs that torch would silently truncate or that address padding are refused; the
    numpy / 0-d tensor spellings of an int give the int's result."""
    import numpy as np

    lens = IGLens(tiny_llama)
    ref = lens.attribute(input_ids, positions=-1)
    assert torch.equal(lens.attribute(input_ids, positions=np.int64(-1)), ref)
    assert torch.equal(lens.attribute(input_ids, positions=torch.tensor(-1)), ref)
    assert IGLens(tiny_llama, layers=[np.int64(2)]).layer_indices == (2, 4)
    mask = torch.ones_like(input_ids)
    mask[1, :3] = 0
    cases = [
        (TypeError, "integer token ids", dict(target=3.7)),
        (TypeError, "integer token ids", dict(target=torch.tensor([3.0, 4.0]))),
        (TypeError, "integers", dict(positions=[1.5])),
        (ValueError, "row 1 is padding", dict(positions=[0], additional_forward_args=mask)),
        (ValueError, "NaN or inf", dict(baselines=torch.full((64,), float("nan")))),
        (ValueError, "n_steps", dict(n_steps=0)),
    ]
    for error, match, kwargs in cases:
        with pytest.raises(error, match=match):
            lens.attribute(input_ids, **kwargs)
    with pytest.raises(ValueError, match="one credit per chosen layer"):
        lens.compute_convergence_delta(torch.zeros(2, 7), "mean", input_ids)
    with pytest.raises(ValueError, match="layers is empty"):
        IGLens(tiny_llama, layers=[])
    with torch.inference_mode():
        assert torch.equal(lens.attribute(input_ids), ref)
        with pytest.raises(RuntimeError, match="inference_mode"):
            lens.attribute(input_ids, method="gausslegendre", n_steps=4)


def test_unconverged_gradient_estimate_warns(tiny_llama, input_ids):
    """A gradient estimate with |sum - Δp| above 1e-3 says so (with what to do); a
    converged one and the exact default stay silent."""
    lens = IGLens(tiny_llama, layers=[4])  # one long segment: hard to integrate
    with pytest.warns(UserWarning, match="has not converged.*n_steps"):
        _, delta = lens.attribute(input_ids, method="riemann_left", n_steps=2,
                                  return_convergence_delta=True)
    assert delta.abs().max() > 1e-3  # the warning reports a real gap
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        lens.attribute(input_ids)
        _, delta = IGLens(tiny_llama).attribute(input_ids, method="gausslegendre", n_steps=64,
                                                return_convergence_delta=True)
    assert delta.abs().max() <= 1e-3


@pytest.mark.numerics
def test_explained_pairs_alone_are_read_out(tiny_llama, input_ids):
    """A ragged batch: row 1 is left-padded over its first 4 positions. With ``explained``,
    the padded pairs (refused without it) are skipped: only the explained pairs reach the
    readout, they equal the same pairs computed without a mask (to the readout's rounding,
    other chunk shapes), and the other entries are NaN (ids: -1)."""
    ids = input_ids.clone()
    mask = torch.ones_like(ids)
    mask[1, :4] = 0
    positions = [2, 5, 8]
    explained = torch.tensor([[True, False, True], [False, True, True]])
    with pytest.raises(ValueError, match="padding"):
        IGLens(tiny_llama).attribute_details(ids, additional_forward_args=(mask,),
                                             positions=positions)
    base = IGLens(tiny_llama)
    rows: list[int] = []

    def counting(hidden: torch.Tensor) -> torch.Tensor:
        rows.append(hidden.shape[0])
        return base.readout(hidden)

    counting.name = "counting"  # type: ignore[attr-defined]
    lens = IGLens(tiny_llama, readout=counting)
    ragged = lens.attribute_details(ids, additional_forward_args=(mask,), positions=positions,
                                    explained=explained, top_k=3)
    n_ragged, rows[:] = sum(rows), []
    # every pair of row 0 is real: the full computation there (padded rows against each
    # prompt alone: test_run.test_batch_rows_equal_each_prompt_alone)
    full0 = lens.attribute_details(ids[:1], positions=positions, top_k=3)
    n_full = sum(rows)
    k = lens.num_layers
    # per explained pair: k + 1 nodes and k top-k layers; h_n again for the distribution
    # check (padded to >= 8 rows); all 6 pairs would be 6 * (2k + 1) + 8
    assert n_ragged <= 4 * (2 * k + 1) + 8 < 6 * (2 * k + 1) + 8
    assert n_full >= 3 * (2 * k + 1)
    assert ragged.attributions.shape == (2, 3, k)
    for name in ("attributions", "lens_probs", "p_final", "p_baseline", "convergence_delta"):
        value = getattr(ragged, name)
        assert torch.isnan(value[~explained]).all(), name
    assert (ragged.model_argmax[~explained] == -1).all()
    assert (ragged.top_k_ids[~explained] == -1).all()
    assert ragged.positions == positions
    nodes = lens_nodes(base, ids[:1], positions)
    sens = readout_sensitivity(base.readout, nodes, full0.target[..., None].expand(-1, -1, k + 1))
    tol = f32_tol(credit_sensitivity(sens), credit_sensitivity(sens),
                  n_terms=reduction_length(base.readout))
    got = ragged.attributions[0, explained[0]]
    assert ((got - full0.attributions[0, explained[0]]).abs() <= tol[0, explained[0]]).all()
    assert (ragged.top_k_ids[0, explained[0]] == full0.top_k_ids[0, explained[0]]).all()
    assert ragged.attributions[explained].abs().max() > 1e3 * float(tol.max())
    with pytest.raises(ValueError, match="explained has shape"):
        lens.attribute_details(ids, positions=positions, explained=explained[:1])
    with pytest.raises(TypeError, match="bool"):
        lens.attribute_details(ids, positions=positions, explained=explained.long())
