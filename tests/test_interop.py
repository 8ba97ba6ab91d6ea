"""Captum visualization interop: to_captum(), LLMIGLensAttribution, IGLensResult.plot()."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import numpy as np  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402
from _tolerance import (  # noqa: E402
    EPS32,
    f32_tol,
    lens_nodes,
    readout_prob_magnitude,
    reduction_length,
)
from captum.attr import (  # noqa: E402
    LayerIntegratedGradients,
    LLMAttributionResult,
    LLMGradientAttribution,
    TextTokenInput,
)
from conftest import make_tiny  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402

from captum_iglens import IGLens, explain_ids  # noqa: E402
from captum_iglens.llm_attr import LLMIGLensAttribution  # noqa: E402
from captum_iglens.testing import assert_complete  # noqa: E402

PROMPT = [5, 17, 33, 8, 90, 41]
ANSWER = [12, 77, 3, 64]


@pytest.fixture(scope="module")
def result():
    model = make_tiny("llama", n_layers=4)
    return explain_ids(model, PROMPT, ANSWER, layers=[0, 2, 3, 4])


def _split(attributions: torch.Tensor, p_baseline: torch.Tensor) -> torch.Tensor:
    """The first column without the baseline's readout: credit_0 + f(b), in float64, once
    rounded to float32 (the view's own computation, so the same floats)."""
    first = (attributions[:, 0].double() + p_baseline.double()).float()
    return torch.cat([first[:, None], attributions[:, 1:].float()], 1)


@pytest.mark.numerics
def test_to_captum_round_trip(result) -> None:
    res = result.to_captum()
    assert isinstance(res, LLMAttributionResult)
    assert res.input_tokens == ["emb", "L2", "L3", "L4"] == result.layer_names
    assert res.output_tokens == result.tokens == [str(i) for i in ANSWER]
    assert tuple(res.token_attr.shape) == (len(ANSWER), 4)
    # the layer columns are the result's credits, the baseline's readout -f(b) set apart:
    # the same float32 values (column 0: the same float64 sum, rounded once): exact
    torch.testing.assert_close(res.token_attr, _split(result.attributions, result.p_baseline),
                               atol=0, rtol=0)
    torch.testing.assert_close(res.baseline_attr, -result.p_baseline.float(), atol=0, rtol=0)
    torch.testing.assert_close(res.output_probs, result.p_final.float(), atol=0, rtol=0)
    # ... and sums over the T answer tokens, in whatever order: (T - 1) u sum|credit|
    sum_tol = EPS32 / 2 * (len(ANSWER) - 1) * res.token_attr.double().abs().sum(0)
    assert ((res.seq_attr - res.token_attr.sum(0)).abs() <= sum_tol).all()
    # each row, with baseline_attr, adds up to that token's Δp (Proposition 1); the split
    # first column adds one rounding (assert_complete counts it)
    assert_complete(res)
    torch.testing.assert_close(res.delta_p, result.delta_p.float(), atol=0, rtol=0)
    expected = dict(zip(result.layer_names, res.token_attr.sum(0).tolist(), strict=True))
    assert res.seq_attr_dict.keys() == expected.keys()
    for name, tol in zip(result.layer_names, sum_tol.tolist(), strict=True):
        assert abs(res.seq_attr_dict[name] - expected[name]) <= tol
    fig, ax = res.plot_token_attr()
    assert isinstance(fig, Figure)
    np.testing.assert_array_equal(ax.images[0].get_array(), res.token_attr.numpy())
    assert [t.get_text() for t in ax.get_xticklabels()] == result.layer_names
    fig2, ax2 = res.plot_seq_attr()
    assert isinstance(fig2, Figure) and len(ax2.patches) == 2 * 4  # pos + neg bars per layer


def test_result_plot(result, tmp_path) -> None:
    path = tmp_path / "heat.png"
    fig = result.plot(str(path))
    assert isinstance(fig, Figure) and path.stat().st_size > 1000
    ax_map = next(ax for ax in fig.axes if ax.images)
    ax_traj = next(ax for ax in fig.axes if ax.get_lines() and not ax.images)
    image = ax_map.images[0]
    # the plot shows the result's own values: exact
    np.testing.assert_array_equal(image.get_array(), result.attributions.numpy())
    vmax = float(result.attributions.abs().max())
    assert image.norm.vmin == -vmax and image.norm.vmax == vmax
    # Captum's colours (plot_token_attr's red-white-green): green positive, red negative
    captum_map = LLMAttributionResult._get_plot_color_map(None)
    np.testing.assert_allclose(image.get_cmap()(1.0), captum_map(1.0))
    np.testing.assert_allclose(image.get_cmap()(0.0), captum_map(0.0))
    # one onset marker per token at (onset column, token row)
    markers = np.concatenate([c.get_offsets() for c in ax_map.collections])
    cols = [result.layer_indices.index(o) for o in result.onset_layers]
    np.testing.assert_array_equal(markers, np.array([[c, t] for t, c in enumerate(cols)]))
    # one logit-lens trajectory per token
    lines = ax_traj.get_lines()
    assert len(lines) == len(ANSWER)
    for t, line in enumerate(lines):
        np.testing.assert_array_equal(line.get_xdata(), result.layer_indices)
        np.testing.assert_array_equal(line.get_ydata(), result.lens_probs[t].numpy())


@pytest.mark.numerics
def test_llm_gradient_attribution_path(smollm2) -> None:
    model, tokenizer = smollm2
    assert issubclass(LLMIGLensAttribution, LLMGradientAttribution)
    assert IGLens in LLMIGLensAttribution.SUPPORTED_METHODS
    assert LayerIntegratedGradients in LLMIGLensAttribution.SUPPORTED_METHODS
    lens = IGLens(model, layers=[10, 20, 30])
    llm_attr = LLMIGLensAttribution(lens, tokenizer)
    inp = TextTokenInput("The capital of France is", tokenizer)
    res = llm_attr.attribute(inp, target=" Paris, France")
    target = tokenizer(" Paris, France", add_special_tokens=False)["input_ids"]
    assert isinstance(res, LLMAttributionResult)
    assert res.input_tokens == ["L10", "L20", "L30"]
    assert len(res.output_tokens) == len(target) and "Paris" in res.output_tokens[0]
    assert tuple(res.token_attr.shape) == (len(target), 3)
    # one teacher-forced pass over prompt + target[:-1]: row t is IG-Lens at position
    # len(prompt) - 1 + t with target[t]
    prompt = tokenizer("The capital of France is", return_tensors="pt").input_ids
    ids = torch.cat([prompt, torch.tensor([target[:-1]], dtype=torch.long)], dim=1)
    n = prompt.shape[1]
    # The reference is Captum's: every prompt token replaced by the TextTokenInput baseline
    # (token id 0 by default), then the target tokens.
    reference = torch.cat([torch.zeros_like(prompt), ids[:, n:]], dim=1)
    positions = list(range(n - 1, n - 1 + len(target)))
    out = lens.attribute_details(ids, reference, target=torch.tensor([target]),
                                 positions=positions)
    assert res.baseline == "reference ids"
    # The wrapper makes this very call (ids, reference, targets, positions): the same
    # float32 operations, so its numbers are these, exactly (the reference's readout
    # -p(y|x') set apart from the first layer's column).
    torch.testing.assert_close(res.token_attr, _split(out.attributions[0], out.p_baseline[0]),
                               atol=0, rtol=0)
    torch.testing.assert_close(res.baseline_attr, -out.p_baseline[0].float(), atol=0, rtol=0)
    torch.testing.assert_close(res.p_baseline, out.p_baseline[0].float(), atol=0, rtol=0)
    torch.testing.assert_close(res.convergence_delta, out.convergence_delta[0].float(),
                               atol=0, rtol=0)
    mean = llm_attr.attribute(inp, target=" Paris, France", baselines="mean")
    out_mean = lens.attribute_details(ids, target=torch.tensor([target]), positions=positions)
    torch.testing.assert_close(mean.token_attr,
                               _split(out_mean.attributions[0], out_mean.p_baseline[0]),
                               atol=0, rtol=0)
    torch.testing.assert_close(res.output_probs, out.p_final[0].float(), atol=0, rtol=0)
    assert_complete(res)  # baseline_attr + each row adds up to its delta_p
    with torch.no_grad():
        logits = model(ids, use_cache=False).logits[0, n - 1:].softmax(-1)
    model_p = logits[torch.arange(len(target)), torch.tensor(target)]
    # the same ids and shapes: the same h_n, read out on other rows (Invariant R)
    h_n = lens_nodes(lens, ids, positions, "zero")[0, :, -1]
    mag = readout_prob_magnitude(lens.readout, h_n)[torch.arange(len(target)),
                                                    torch.tensor(target)]
    tol = f32_tol(mag, mag, n_terms=reduction_length(lens.readout))
    assert ((res.output_probs - model_p).abs() <= tol).all()
    torch.testing.assert_close(res.seq_attr, res.token_attr.sum(0), atol=0, rtol=0)
    fig, _ = res.plot_token_attr()
    assert isinstance(fig, Figure)


def test_captum_methods_pass_through_unchanged(smollm2) -> None:
    """With one of Captum's own methods the subclass is Captum's LLMGradientAttribution."""
    model, tokenizer = smollm2
    inp = TextTokenInput("The capital of France is", tokenizer)
    lig = LayerIntegratedGradients(model, model.get_input_embeddings())
    ours = LLMIGLensAttribution(lig, tokenizer).attribute(inp, target=" Paris", n_steps=4)
    theirs = LLMGradientAttribution(lig, tokenizer).attribute(inp, target=" Paris", n_steps=4)
    assert ours.input_tokens == theirs.input_tokens == inp.values  # input tokens, not layers
    # Captum's own code path on both sides: the same operations, identical
    torch.testing.assert_close(ours.token_attr, theirs.token_attr, atol=0, rtol=0)
    torch.testing.assert_close(ours.seq_attr, theirs.seq_attr, atol=0, rtol=0)
