"""Core IG-Lens invariants on tiny random models (perturbed norms): R, C, Captum contract."""

from __future__ import annotations

import pytest
import torch
from captum.testing.helpers.basic import assertTensorAlmostEqual
from conftest import make_tiny

from captum_iglens import IGLens, onset_layer_indices
from captum_iglens.residual import capture_residual_stream

F32_EPS = torch.finfo(torch.float32).eps

GRADIENT_METHODS = ["riemann_left", "riemann_right", "riemann_middle", "riemann_trapezoid",
                    "gausslegendre"]


def model_probs(model: torch.nn.Module, ids: torch.Tensor, **kwargs) -> torch.Tensor:
    """softmax of the model's own logits, [B, S, V] float32."""
    with torch.no_grad():
        return torch.softmax(model.eval()(ids, use_cache=False, **kwargs).logits.float(), -1)


def test_readout_reproduces_model_logits(tiny_model, input_ids):
    """Invariant R on the full vocabulary at every position (Llama, GPT-2, GPT-NeoX)."""
    lens = IGLens(tiny_model)
    n = lens.num_layers
    with torch.no_grad(), capture_residual_stream(lens.decoder_blocks, [n]) as states:
        logits = tiny_model.eval()(input_ids, use_cache=False).logits
        lens_logits = lens.readout(states[n])
    assert torch.allclose(torch.softmax(lens_logits, -1), torch.softmax(logits, -1), atol=1e-6)

    positions = [0, 3, -1]
    out = lens.attribute_details(input_ids, positions=positions)
    expected = model_probs(tiny_model, input_ids)[:, positions]
    expected = expected.gather(-1, out.target[..., None])[..., 0]
    assertTensorAlmostEqual(None, out.p_final, expected, delta=1e-6, mode="max")


def test_last_hidden_state_is_post_norm_and_not_read_twice(tiny_llama, input_ids):
    """hidden_states[-1] is already normalised in transformers 5: normalising it again (the
    reference script's bug) breaks Invariant R, while the hooked residual satisfies it."""
    lens = IGLens(tiny_llama)
    with torch.no_grad():
        out = tiny_llama.eval()(input_ids, output_hidden_states=True, use_cache=False)
    true_p = torch.softmax(out.logits, -1)
    double_norm_p = torch.softmax(lens.readout(out.hidden_states[-1]), -1)
    assert (double_norm_p - true_p).abs().max() > 1e-3
    details = lens.attribute_details(input_ids, positions=-1)
    expected = true_p[:, -1].gather(-1, details.target)[:, 0]
    assertTensorAlmostEqual(None, details.p_final[:, 0], expected, delta=1e-6, mode="max")


@pytest.mark.parametrize("n_steps", [1, 4, 64])
@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-6), (torch.float64, 1e-12)])
def test_completeness_default_estimator(tiny_model, input_ids, n_steps, dtype, tol):
    """Invariant C at any step count, and equality with the explicit grid of n_steps + 1
    points per segment (observed changes summed)."""
    model = tiny_model.to(dtype)
    lens = IGLens(model)
    attr, delta = lens.attribute(input_ids, positions=[2, -1], n_steps=n_steps,
                                 return_convergence_delta=True)
    assert attr.dtype == (torch.float64 if dtype == torch.float64 else torch.float32)
    assert attr.shape == (2, 2, lens.num_layers)
    assert delta.abs().max() <= tol
    details = lens.attribute_details(input_ids, positions=[2, -1])
    direct = attr.sum(-1) - (details.p_final - details.p_baseline)
    assert direct.abs().max() <= tol
    grid = lens.path_probabilities(input_ids, positions=[2, -1], n_steps=n_steps)
    assert grid.shape == (2, 2, lens.num_layers, n_steps + 1)
    grid_credit = grid.diff(dim=-1).sum(-1)
    assert (grid_credit - attr).abs().max() <= 10 * tol
    assert attr.abs().sum() > 1e-3  # the test means something: credits are not all zero


def test_gradient_estimators_converge(tiny_llama, input_ids):
    lens = IGLens(tiny_llama)
    for method in GRADIENT_METHODS:
        errors = []
        for n_steps in (4, 16, 64):
            _, delta = lens.attribute(input_ids, method=method, n_steps=n_steps,
                                      return_convergence_delta=True)
            errors.append(delta.abs().max().item())
        assert errors[2] < errors[0], (method, errors)
    exact = lens.attribute(input_ids)
    gl, delta = lens.attribute(input_ids, method="gausslegendre", n_steps=64,
                               return_convergence_delta=True)
    assert delta.abs().max() <= 1e-3
    assert (gl - exact).abs().max() <= 1e-3  # both estimate the same segment integrals


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


def test_internal_batch_size_does_not_change_results(tiny_model, input_ids):
    lens = IGLens(tiny_model)
    for method in ("prediction_aware", "gausslegendre"):
        ref = lens.attribute(input_ids, positions=[0, 4, -1], method=method, n_steps=6)
        for chunk in (1, 7, 1000):
            got = lens.attribute(input_ids, positions=[0, 4, -1], method=method, n_steps=6,
                                 internal_batch_size=chunk)
            assertTensorAlmostEqual(None, got, ref, delta=1e-6, mode="max")


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


def test_default_baseline_does_not_depend_on_the_chosen_layers(tiny_llama, input_ids):
    """The "mean" baseline is the mean of h_1 whatever the layers: the same token has the
    same p_baseline and delta_p with all layers, with layers from 0, and with two layers."""
    outs = [IGLens(tiny_llama, layers=layers).attribute_details(input_ids, positions=[2, -1])
            for layers in (None, [0, 2], [3], [0, 1, 2, 3])]
    for out in outs[1:]:
        # the same readout of the same vector, other chunk shapes: float32 roundings only
        assert (out.p_baseline - outs[0].p_baseline).abs().max() <= 8 * F32_EPS
        assert (out.delta_p - outs[0].delta_p).abs().max() <= 16 * F32_EPS
    assert outs[0].delta_p.abs().max() > 1e-3  # a non-trivial total
    # the baseline is the mean of the first block's output, not of h_0 or h_{L_1}
    with capture_residual_stream(IGLens(tiny_llama).decoder_blocks, [1]) as states:
        with torch.no_grad():
            tiny_llama.eval()(input_ids, use_cache=False)
    explicit = IGLens(tiny_llama, layers=[0, 2]).attribute_details(
        input_ids, states[1].mean(1), positions=[2, -1])
    assert (explicit.p_baseline - outs[1].p_baseline).abs().max() <= 8 * F32_EPS


def test_layer_subset_credits_are_sums_of_finer_credits(tiny_llama, input_ids):
    """Telescoping: merging adjacent segments of the path adds their credits."""
    fine = IGLens(tiny_llama, layers=[1, 2, 3, 4]).attribute(input_ids)
    coarse = IGLens(tiny_llama, layers=[2, 4]).attribute(input_ids)
    assertTensorAlmostEqual(None, coarse[:, 0], fine[:, :2].sum(-1), delta=1e-6, mode="max")
    assertTensorAlmostEqual(None, coarse[:, 1], fine[:, 2:].sum(-1), delta=1e-6, mode="max")


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
