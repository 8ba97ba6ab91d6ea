"""Contrastive targets: IG-Lens of ``F = p(y) - p(foil)`` (``contrast=``) on tiny random models.

``F`` is a scalar readout of the residual, so its credits telescope as the plain target's
do, and every estimator is linear in the readout: the contrastive credits are the target's
minus the foil's. Tolerances follow from float32 rounding (tests/_tolerance.py).
"""

from __future__ import annotations

import json

import matplotlib

matplotlib.use("Agg")

import pytest  # noqa: E402
import torch  # noqa: E402
from _tolerance import (  # noqa: E402
    EPS32,
    completeness_tol,
    credit_sensitivity,
    f32_tol,
    head_gradient_magnitude,
    lens_nodes,
    logit_magnitude,
    node_sensitivity,
    readout_sensitivity,
    reduction_length,
    sensitivity,
)
from conftest import VOCAB  # noqa: E402

from captum_iglens import IGLens, ReadoutMismatchError  # noqa: E402
from captum_iglens.plot.credits import plot_result  # noqa: E402
from captum_iglens.results import IGLensOutput, IGLensResult  # noqa: E402

POSITIONS = [2, -1]


def _logits(model: torch.nn.Module, ids: torch.Tensor) -> torch.Tensor:
    """The model's own float32 logits ``[B, S, V]`` (eval mode, no cache)."""
    with torch.no_grad():
        return model.eval()(ids, use_cache=False).logits.float()


def _top_two(model: torch.nn.Module, ids: torch.Tensor, positions: list[int]
             ) -> tuple[torch.Tensor, torch.Tensor]:
    """Target (argmax) and foil (the runner-up) ``[B, P]`` at ``positions``: a foil with a
    probability of the target's order, so ignoring it would show."""
    top = _logits(model, ids)[:, positions].topk(2, dim=-1).indices
    return top[..., 0], top[..., 1]


def _readout_sensitivity(readout: torch.nn.Module, nodes: torch.Tensor, ids: torch.Tensor,
                         log: bool) -> torch.Tensor:
    """:func:`sensitivity` of the probability (or log-probability) of ``ids [B, P]`` at every
    node ``[B, P, k + 1, d]`` over the readout alone: ``[B, P, k + 1]``."""
    ids = ids[:, :, None].expand(nodes.shape[:3])

    def values() -> torch.Tensor:
        lp = torch.log_softmax(readout(nodes).float(), -1).gather(-1, ids[..., None])[..., 0]
        return lp if log else lp.exp()

    return sensitivity(readout, values).view(nodes.shape[:3])


# ---------------------------------------------------------------------------- linearity
@pytest.mark.numerics
@pytest.mark.parametrize("units", ["probability", "log-probability"])
def test_prediction_aware_credits_are_target_minus_foil(tiny_model, input_ids, units):
    """Credits, levels and p_final of F equal those of the target minus those of the foil
    from two plain runs: three readouts of the same nodes, each within eps sqrt(n) times its
    sum of |terms| (the contrastive one: the target's plus the foil's)."""
    lens = IGLens(tiny_model, units=units)
    target, foil = _top_two(tiny_model, input_ids, POSITIONS)
    con = lens.attribute_details(input_ids, target=target, positions=POSITIONS, contrast=foil)
    plain_y = lens.attribute_details(input_ids, target=target, positions=POSITIONS)
    plain_f = lens.attribute_details(input_ids, target=foil, positions=POSITIONS)
    assert torch.equal(con.contrast, foil) and torch.equal(con.target, target)
    assert plain_y.contrast is None

    nodes = lens_nodes(lens, input_ids, POSITIONS)
    log = units == "log-probability"
    sens_y = _readout_sensitivity(lens.readout, nodes, target, log)
    sens_f = _readout_sensitivity(lens.readout, nodes, foil, log)
    n = reduction_length(lens.readout)
    cs_y, cs_f = credit_sensitivity(sens_y), credit_sensitivity(sens_f)
    credit_tol = f32_tol(cs_y, cs_f, cs_y, cs_f, n_terms=n)
    node_tol = f32_tol(sens_y, sens_f, sens_y, sens_f, n_terms=n)
    expected = plain_y.attributions.double() - plain_f.attributions.double()
    assert ((con.attributions - expected).abs() <= credit_tol).all()
    levels = plain_y.lens_probs.double() - plain_f.lens_probs.double()
    assert ((con.lens_probs - levels).abs() <= node_tol[..., 1:]).all()
    finals = plain_y.p_final.double() - plain_f.p_final.double()
    assert ((con.p_final - finals).abs() <= node_tol[..., -1]).all()
    # Meaningful: the foil's own credits (what a run ignoring it would miss) and the
    # contrastive credits stand far above the bound.
    assert plain_f.attributions.abs().max() > 1e3 * credit_tol.max()
    assert con.attributions.abs().max() > 1e3 * credit_tol.max()


@pytest.mark.numerics
@pytest.mark.filterwarnings("ignore:IG-Lens's riemann_trapezoid estimate has not converged")
@pytest.mark.parametrize("method", ["gausslegendre", "riemann_trapezoid"])
def test_gradient_credits_are_target_minus_foil(tiny_llama, input_ids, method):
    """The gradient estimators integrate grad F = grad p_y - grad p_foil at the same
    quadrature points: linear in F. Each run's rounding is bounded by its credits' sum of
    |terms| (tests/_tolerance.py, head_gradient_magnitude); the contrastive gradient's sum of
    |terms| is at most the target's plus the foil's (triangle inequality)."""
    lens = IGLens(tiny_llama)
    target, foil = _top_two(tiny_llama, input_ids, POSITIONS)
    kwargs = dict(positions=POSITIONS, method=method, n_steps=16)
    con = lens.attribute(input_ids, target=target, contrast=foil, **kwargs)
    plain_y = lens.attribute(input_ids, target=target, **kwargs)
    plain_f = lens.attribute(input_ids, target=foil, **kwargs)
    nodes = lens_nodes(lens, input_ids, POSITIONS)
    mag_y = head_gradient_magnitude(lens.readout, nodes, target, method, 16)
    mag_f = head_gradient_magnitude(lens.readout, nodes, foil, method, 16)
    tol = f32_tol(mag_y, mag_f, mag_y, mag_f, n_terms=reduction_length(lens.readout))
    expected = plain_y.double() - plain_f.double()
    assert ((con - expected).abs() <= tol).all()
    assert plain_f.abs().max() > 1e3 * tol.max()


def test_path_probabilities_of_f_are_target_minus_foil(tiny_llama, input_ids):
    """The grid readout of F is the difference of the two plain grids: the same points in
    the same chunks give the same log-softmax rows, and each exp is within an ulp of its
    exact value (plus the subtraction's rounding, <= u |F|)."""
    lens = IGLens(tiny_llama)
    target, foil = _top_two(tiny_llama, input_ids, POSITIONS)
    grid = lens.path_probabilities(input_ids, target=target, positions=POSITIONS, n_steps=3,
                                   contrast=foil)
    grid_y = lens.path_probabilities(input_ids, target=target, positions=POSITIONS, n_steps=3)
    grid_f = lens.path_probabilities(input_ids, target=foil, positions=POSITIONS, n_steps=3)
    assert grid.shape == (2, 2, lens.num_layers, 4)
    expected = grid_y.double() - grid_f.double()
    tol = 2 * EPS32 * (grid_y.double().abs() + grid_f.double().abs())
    assert ((grid - expected).abs() <= tol).all()
    assert grid_f.abs().max() > 1e3 * tol.max()


# ---------------------------------------------------------------------------- completeness
@pytest.mark.numerics
@pytest.mark.parametrize("units", ["probability", "log-probability"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_contrastive_completeness(tiny_model, input_ids, units, dtype):
    """Invariant C for F: the credits add up to F(h_n) - F(b) within the rigorous bound of a
    sum of k rounded credits, and the delta of attribute and compute_convergence_delta
    agree."""
    lens = IGLens(tiny_model.to(dtype), units=units)
    target, foil = _top_two(tiny_model, input_ids, POSITIONS)
    out = lens.attribute_details(input_ids, target=target, positions=POSITIONS, contrast=foil)
    bound = completeness_tol(out.attributions, out.delta_p)
    assert (out.convergence_delta.abs() <= bound).all()
    direct = out.attributions.sum(-1) - (out.p_final - out.p_baseline)
    assert (direct.abs() <= bound).all()
    attr, delta = lens.attribute(input_ids, target=target, positions=POSITIONS, contrast=foil,
                                 return_convergence_delta=True)
    assert torch.equal(attr, out.attributions) and torch.equal(delta, out.convergence_delta)
    again = lens.compute_convergence_delta(attr, "mean", input_ids, target, positions=POSITIONS,
                                           contrast=foil)
    assert torch.equal(again, delta)
    assert out.attributions.abs().max() > 1e3 * bound.max()


@pytest.mark.numerics
def test_reference_ids_total_is_f_of_input_minus_f_of_reference(tiny_model, input_ids):
    """With reference token ids as baselines, the credits add up to F(x) - F(x') from the
    model's own logits on both inputs: each lens value and the model's are two readouts of
    the same h_n (the reference's forward is the model's too), plus the completeness bound."""
    model = tiny_model.eval()
    lens = IGLens(model)
    ref = input_ids.clone()
    ref[:, 1:-1] = 9  # Captum-style reference: keep the ends, fill the middle
    target, foil = _top_two(model, input_ids, POSITIONS)
    out = lens.attribute_details(input_ids, ref, target, positions=POSITIONS, contrast=foil)
    assert out.baseline == "reference ids"

    def model_f(ids: torch.Tensor) -> torch.Tensor:
        probs = torch.softmax(_logits(model, ids)[:, POSITIONS].double(), -1)
        return probs.gather(-1, target[..., None])[..., 0] - probs.gather(-1, foil[..., None])[
            ..., 0]

    change = model_f(input_ids) - model_f(ref)
    nodes = lens_nodes(lens, input_ids, POSITIONS, ref)
    n = reduction_length(lens.readout)
    tol = completeness_tol(out.attributions, out.delta_p)
    for node in (nodes[:, :, 0], nodes[:, :, -1]):  # h_n(x') and h_n(x)
        sens = (readout_sensitivity(lens.readout, node, target)
                + readout_sensitivity(lens.readout, node, foil))
        tol = tol + f32_tol(sens, sens, n_terms=n)
    assert ((out.attributions.double().sum(-1) - change).abs() <= tol).all()
    assert change.abs().max() > 1e2 * tol.max()  # a non-trivial total


@pytest.mark.numerics
def test_log_units_final_value_is_the_logit_difference(tiny_model, input_ids):
    """In log units F(h_n) = log p(y) - log p(foil) = z_y - z_foil: the logsumexp cancels.
    Bound: the lens's and the model's logits each within eps sqrt(n) of their sums of
    |terms| (logit_magnitude), plus the log-softmax's pointwise roundings (z - max, minus the
    log-sum, the final difference), generously at eps (= 2u) each."""
    model = tiny_model.eval()
    lens = IGLens(model, units="log-probability")
    logits = _logits(model, input_ids)[:, POSITIONS].double()
    target, foil = logits.argmax(-1), logits.argmin(-1)  # a wide gap: F is far from p_y - p_f
    out = lens.attribute_details(input_ids, target=target, positions=POSITIONS, contrast=foil)
    z_y, z_f = logits.gather(-1, target[..., None])[..., 0], logits.gather(-1, foil[..., None])[
        ..., 0]
    h_n = lens_nodes(lens, input_ids, POSITIONS)[:, :, -1]
    _, mags = logit_magnitude(lens.readout, h_n)
    mag = mags.gather(-1, target[..., None])[..., 0] + mags.gather(-1, foil[..., None])[..., 0]
    log_probs = torch.log_softmax(logits, -1)
    lp_y = log_probs.gather(-1, target[..., None])[..., 0]
    lp_f = log_probs.gather(-1, foil[..., None])[..., 0]
    pointwise = EPS32 * (z_y.abs() + z_f.abs() + 2 * logits.abs().amax(-1) + lp_y.abs()
                         + lp_f.abs() + (z_y - z_f).abs())
    tol = f32_tol(mag, mag, n_terms=reduction_length(lens.readout)) + pointwise
    assert ((out.p_final - (z_y - z_f)).abs() <= tol).all()
    # Not the probability difference, nor log of it: those are far from the logit gap.
    probs = log_probs.exp()
    p_diff = probs.gather(-1, target[..., None])[..., 0] - probs.gather(-1, foil[..., None])[
        ..., 0]
    assert ((out.p_final - p_diff).abs() > 1e3 * tol).all()
    bound = completeness_tol(out.attributions, out.delta_p)
    assert (out.convergence_delta.abs() <= bound).all()


# ---------------------------------------------------------------------------- batching, forms
@pytest.mark.numerics
def test_batched_equals_unbatched(tiny_llama, input_ids):
    """Each row of a batch with per-row foils equals its single-row run: the two forward
    passes differ in matrix shapes, so each is within eps sqrt(n) times the whole model's
    sum of |terms| for the target plus the foil (tests/_tolerance.py)."""
    lens = IGLens(tiny_llama)
    target, foil = _top_two(tiny_llama, input_ids, POSITIONS)
    batch = lens.attribute_details(input_ids, target=target, positions=POSITIONS, contrast=foil)
    sens = (node_sensitivity(lens, input_ids, POSITIONS, target)
            + node_sensitivity(lens, input_ids, POSITIONS, foil))
    n = reduction_length(tiny_llama)
    credit_tol = f32_tol(credit_sensitivity(sens), credit_sensitivity(sens), n_terms=n)
    p_tol = f32_tol(sens[..., -1], sens[..., -1], n_terms=n)
    for row in range(input_ids.shape[0]):
        one = lens.attribute_details(input_ids[row:row + 1], target=target[row:row + 1],
                                     positions=POSITIONS, contrast=foil[row:row + 1])
        assert ((batch.attributions[row] - one.attributions[0]).abs() <= credit_tol[row]).all()
        assert ((batch.p_final[row] - one.p_final[0]).abs() <= p_tol[row]).all()
        assert torch.equal(one.contrast[0], foil[row])
    # The bound is loose (the whole model's sum of |terms|) but still resolves the foil:
    # leaving it out moves the credits far beyond it.
    plain = lens.attribute(input_ids, target=target, positions=POSITIONS)
    assert (batch.attributions - plain).abs().max() > 10 * credit_tol.max()


def test_contrast_forms_as_target_takes_them(tiny_llama, input_ids):
    """An int, a [B] list and a [B, P] tensor of the same foils give the same run."""
    lens = IGLens(tiny_llama)
    foil, target = 5, 7
    full = lens.attribute(input_ids, target=target, positions=POSITIONS,
                          contrast=torch.full((2, 2), foil))
    for form in (foil, [foil, foil], torch.tensor([foil, foil])):
        got = lens.attribute(input_ids, target=target, positions=POSITIONS, contrast=form)
        assert torch.equal(got, full)
    single = lens.attribute(input_ids, target=7, contrast=foil)  # int position: [B, k]
    assert single.shape == (2, lens.num_layers)


def test_contrast_refusals(tiny_llama, input_ids):
    lens = IGLens(tiny_llama)
    target = _top_two(tiny_llama, input_ids, POSITIONS)[0]
    same = target.clone()
    same[0, 0] = (same[0, 0] + 1) % VOCAB  # equal to the target at all but one position
    with pytest.raises(ValueError, match="identically 0"):
        lens.attribute(input_ids, target=target, positions=POSITIONS, contrast=same)
    with pytest.raises(ValueError, match="identically 0"):
        lens.attribute(input_ids, target=3, contrast=3)
    with pytest.raises(ValueError, match="Contrast token ids \\[128\\] are outside"):
        lens.attribute(input_ids, target=3, contrast=VOCAB)
    with pytest.raises(ValueError, match="outside the vocabulary"):
        lens.attribute(input_ids, target=3, contrast=-1)
    with pytest.raises(ValueError, match="contrast has 3 entries"):
        lens.attribute(input_ids, target=3, contrast=[4, 5, 6])
    with pytest.raises(ValueError, match="contrast has shape"):
        lens.attribute(input_ids, target=3, positions=POSITIONS, contrast=torch.ones(2, 3).long())
    with pytest.raises(TypeError, match="contrast="):
        lens.attribute(input_ids, target=3, contrast=" Paris")
    with pytest.raises(TypeError, match="contrast must be integer"):
        lens.attribute(input_ids, target=3, contrast=4.0)
    with pytest.raises(ValueError, match="identically 0"):
        lens.path_probabilities(input_ids, target=3, contrast=3)
    with pytest.raises(ValueError, match="outside the vocabulary"):
        lens.compute_convergence_delta(torch.zeros(2, 4), "mean", input_ids, 3, contrast=VOCAB)
    out = lens.attribute_details(input_ids, target=3, contrast=4)
    with pytest.raises(ValueError, match="IGLensOutput.contrast has shape"):
        IGLensOutput(**{**vars(out), "contrast": out.contrast[:, :0]})


def test_readout_check_still_runs_for_contrastive_targets(tiny_llama, input_ids):
    """Invariant R compares the target's and foil's probabilities at h_n with the model's:
    a readout that doubles the logits is refused, with or without a foil."""
    lens = IGLens(tiny_llama)

    def doubled(h: torch.Tensor) -> torch.Tensor:
        return 2 * lens.readout(h)

    broken = IGLens(tiny_llama, readout=doubled)
    with pytest.raises(ReadoutMismatchError, match="own probability"):
        broken.attribute(input_ids, target=3, contrast=4)
    unchecked = IGLens(tiny_llama, readout=doubled, check_readout=False)
    assert unchecked.attribute(input_ids, target=3, contrast=4).shape == (2, lens.num_layers)


# ---------------------------------------------------------------------------- results
def _result(model: torch.nn.Module, ids: torch.Tensor, contrastive: bool,
            units: str = "probability") -> IGLensResult:
    """An IGLensResult of the last three predictions of ``ids``, built as the text level
    builds it, with foils (``w<id>`` tokens) when ``contrastive``."""
    lens = IGLens(model, units=units)
    positions = [ids.shape[1] - 3, ids.shape[1] - 2, ids.shape[1] - 1]
    target, foil = _top_two(model, ids, positions)
    out = lens.attribute_details(ids, target=target, positions=positions,
                                 contrast=foil if contrastive else None)
    attr = out.attributions[0]
    return IGLensResult(
        prompt="w1 w2", answer="", prompt_length=ids.shape[1] - 2,
        input_ids=ids[0].tolist(), tokens=[f"w{int(t)}" for t in target[0]],
        token_ids=target[0].tolist(), positions=positions,
        layer_indices=list(lens.layer_indices), attributions=attr,
        lens_probs=out.lens_probs[0], p_final=out.p_final[0], p_baseline=out.p_baseline[0],
        convergence_delta=out.convergence_delta[0],
        onset_layers=lens.onset_layers(attr).tolist(), units=units,
        contrast_ids=foil[0].tolist() if contrastive else None,
        contrast_tokens=[f"w{int(f)}" for f in foil[0]] if contrastive else None,
    )


def test_json_round_trip_keeps_the_contrast(tiny_llama, input_ids):
    result = _result(tiny_llama, input_ids[:1], contrastive=True)
    assert result.contrastive
    data = json.loads(result.to_json())
    assert data["contrastive"] is True
    assert [t["contrast_id"] for t in data["tokens"]] == result.contrast_ids
    assert [t["contrast_token"] for t in data["tokens"]] == result.contrast_tokens
    again = IGLensResult.from_dict(data)
    assert again.contrastive
    assert again.contrast_ids == result.contrast_ids
    assert again.contrast_tokens == result.contrast_tokens
    assert again.format_table() == result.format_table()

    plain = _result(tiny_llama, input_ids[:1], contrastive=False)
    data = json.loads(plain.to_json())
    assert data["contrastive"] is False
    assert all("contrast_id" not in t for t in data["tokens"])
    back = IGLensResult.from_dict(data)
    assert not back.contrastive and back.contrast_ids is None and back.contrast_tokens is None


def test_result_refuses_foils_of_another_length(tiny_llama, input_ids):
    result = _result(tiny_llama, input_ids[:1], contrastive=True)
    with pytest.raises(ValueError, match="contrast_ids has 2 entries for 3 tokens"):
        IGLensResult(**{**vars(result), "contrast_ids": result.contrast_ids[:2]})


@pytest.mark.parametrize("units", ["probability", "log-probability"])
def test_table_names_the_foil_and_what_the_values_are(tiny_llama, input_ids, units):
    result = _result(tiny_llama, input_ids[:1], contrastive=True, units=units)
    table = result.format_table()
    vs_line = next(line for line in table.splitlines() if line.lstrip().startswith("vs |"))
    for foil in result.contrast_tokens:
        assert repr(foil) in vs_line
    words = "log p(token) - log p(foil)" if units != "probability" else "p(token) - p(foil)"
    assert f"F = {words}" in " ".join(table.splitlines())
    assert "max |sum - ΔF|" in table and "contrastive)" in table
    assert all(len(line) <= 100 for line in table.splitlines())
    plain = _result(tiny_llama, input_ids[:1], contrastive=False, units=units).format_table()
    assert "foil" not in plain and "vs |" not in plain


def test_plot_labels_say_p_of_y_minus_p_of_foil(tiny_llama, input_ids):
    result = _result(tiny_llama, input_ids[:1], contrastive=True)
    fig = plot_result(result)
    labels = [ax.get_ylabel() for ax in fig.axes]
    assert any("IG-Lens credit (p(y) - p(foil)" in label for label in labels)  # colourbar
    assert "logit-lens p(y) - p(foil)" in labels
    ticks = [t.get_text() for ax in fig.axes for t in ax.get_yticklabels()]
    assert any(f"vs {result.contrast_tokens[0]!r}" in t for t in ticks)
    plain = plot_result(_result(tiny_llama, input_ids[:1], contrastive=False))
    assert not any("foil" in ax.get_ylabel() for ax in plain.axes)
