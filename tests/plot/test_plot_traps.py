"""Plots without traps: each fix inspected on the figure it draws.

- LLMIGLensAttribution with a reference: the reference's own readout -p(y|x') is kept out
  of the layer columns, so plot_seq_attr's largest bar is a layer's, not the reference's;
- every token row keeps visible cells (display="row" / "log-probability");
- axis labels and units survive Captum's own heatmap and bar helpers;
- layer 0 is shown as the move from the baseline to h_0 ("b→emb"), set apart;
- the top-k view shows K tokens at any number of layers, each label inside its own cell;
- Captum's visualize_text takes the result's records.
"""

from __future__ import annotations

import dataclasses

import matplotlib

matplotlib.use("Agg")

import numpy as np  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402
from captum.attr import TextTokenInput  # noqa: E402
from matplotlib.backends.backend_agg import FigureCanvasAgg  # noqa: E402
from tiny_families import make_family  # noqa: E402

from captum_iglens import IGLens, LLMIGLensAttribution, explain_ids  # noqa: E402
from captum_iglens.plot.credits import plot_heatmap, plot_result, plot_top_k  # noqa: E402
from captum_iglens.results import IGLensLLMAttributionResult, IGLensResult  # noqa: E402
from captum_iglens.testing import assert_complete  # noqa: E402

PROMPT, TARGET = "My favourite fruits are", " apples, pears, and bananas."


@pytest.fixture(scope="module")
def fruit(smollm2) -> IGLensLLMAttributionResult:
    model, tokenizer = smollm2
    llm_attr = LLMIGLensAttribution(IGLens(model, layers=[0, 10, 20, 30]), tokenizer)
    space = tokenizer(" ", add_special_tokens=False)["input_ids"][0]
    return llm_attr.attribute(TextTokenInput(PROMPT, tokenizer, baselines=space), target=TARGET)


def _bars(ax) -> np.ndarray:
    """Per-layer values of Captum's seq bars (a positive and a negative bar per layer)."""
    heights = np.array([p.get_height() for p in ax.patches])
    half = len(heights) // 2
    return heights[:half] + heights[half:]


def test_reference_readout_is_not_the_largest_bar(fruit) -> None:
    assert fruit.input_tokens == ["emb", "L10", "L20", "L30"]
    # the trap: -p(y|x') in the first layer's column would have been the largest bar
    old = fruit.seq_attr.clone()
    old[0] += fruit.baseline_attr.sum()
    assert int(old.abs().argmax()) == 0
    _, ax = fruit.plot_seq_attr()
    bars = _bars(ax)
    np.testing.assert_allclose(bars, fruit.seq_attr.numpy(), rtol=0, atol=0)
    assert int(np.abs(bars).argmax()) != 0  # now a layer's bar is the largest
    assert abs(bars[0]) < 0.1 * np.abs(bars).max()
    # nothing was dropped: baseline_attr + each row adds up to F(x) - F(x')
    assert_complete(fruit)
    torch.testing.assert_close(fruit.baseline_attr, -fruit.p_baseline, atol=0, rtol=0)


def test_captum_plots_keep_their_axis_labels(fruit) -> None:
    fig, ax = fruit.plot_token_attr()
    assert ax.get_xlabel().startswith("layer") and ax.get_ylabel() == "answer token"
    colour_bar = next(a for a in fig.axes if a is not ax)
    assert colour_bar.get_ylabel() == "IG-Lens credit (probability)"
    assert [t.get_text() for t in ax.get_xticklabels()] == fruit.input_tokens
    _, ax2 = fruit.plot_seq_attr()
    assert ax2.get_xlabel() == "layer"
    assert ax2.get_ylabel() == "IG-Lens credit, summed over answer tokens (probability)"


def _visible(image) -> np.ndarray:
    """Per row, the largest distance of a cell's colour-map position from white (0.5)."""
    values = np.asarray(image.get_array())
    return np.abs(image.norm(values) - 0.5).max(axis=1)


def test_every_token_row_has_visible_cells(fruit) -> None:
    fig, ax = fruit.plot_token_attr()
    # the trap: an unlikely token is near white (under a tenth of the colour scale)
    assert _visible(ax.images[0]).min() < 0.05
    fig, ax = fruit.plot_token_attr(display="row")
    assert _visible(ax.images[0]).min() == pytest.approx(0.5)  # every row reaches the end
    assert "largest |credit|" in next(a for a in fig.axes if a is not ax).get_ylabel()
    with pytest.raises(ValueError, match="display='nope'"):
        fruit.plot_token_attr(display="nope")


def test_visualization_records_for_captum(fruit) -> None:
    from captum.attr import visualization

    records = fruit.to_visualization_records()
    assert len(records) == len(fruit.output_tokens)
    for t, rec in enumerate(records):
        assert rec.raw_input_ids == fruit.input_tokens and rec.pred_class == fruit.output_tokens[t]
        assert float(rec.word_attributions.abs().max()) == pytest.approx(1.0)
        # the score is delta_p (baseline_attr + the row), not the row's p(y|x)
        assert rec.attr_score == pytest.approx(
            float(fruit.token_attr[t].double().sum() + fruit.baseline_attr[t]), rel=0, abs=1e-12)
    html = visualization.visualize_text(records, legend=False)
    assert "L30" in html.data and fruit.output_tokens[0] in html.data


@pytest.fixture(scope="module")
def result() -> IGLensResult:
    model = make_family("llama", n_blocks=3).eval()
    result = explain_ids(model, [5, 9, 14, 20], [30, 31, 32, 33], layers=[0, 1, 2, 3],
                         top_k=3)
    # one unlikely token: its credits a millionth of the others'
    attr = result.attributions.clone()
    attr[1] *= 1e-6
    return dataclasses.replace(result, attributions=attr)


def test_package_heatmap_rows_stay_visible(result) -> None:
    for fig in (plot_result(result), plot_heatmap(result)):
        image = next(ax for ax in fig.axes if ax.images).images[0]
        assert _visible(image)[1] < 1e-5
    for fig in (plot_result(result, display="row"), plot_heatmap(result, display="row")):
        ax = next(ax for ax in fig.axes if ax.images)
        assert _visible(ax.images[0]).min() == pytest.approx(0.5)
        bar = next(a for a in fig.axes if getattr(a, "_colorbar", None) is not None)
        assert bar.get_ylabel() == "credit / the token's largest |credit|"


def test_log_probability_display_is_the_change_of_log_p(result) -> None:
    fig = plot_result(result, display="log-probability")
    image = next(ax for ax in fig.axes if ax.images).images[0]
    levels = torch.cat([result.p_baseline[:, None], result.lens_probs], 1).double()
    expected = (levels.log()[:, 1:] - levels.log()[:, :-1]).float().numpy()
    np.testing.assert_allclose(np.asarray(image.get_array()), expected, rtol=1e-6, atol=1e-6)
    with pytest.raises(ValueError, match="probability units"):
        plot_result(dataclasses.replace(result, units="log-probability"),
                    display="log-probability")


def test_layer_zero_is_the_move_from_the_baseline(result) -> None:
    fig = plot_result(result)
    ax = next(ax for ax in fig.axes if ax.images)
    assert [t.get_text() for t in ax.get_xticklabels()] == ["b→emb", "L1", "L2", "L3"]
    assert any(list(line.get_xdata()) == [0.5, 0.5] for line in ax.get_lines())
    assert "b→emb" in ax.get_xlabel() and "b→emb" in fig.get_supxlabel().replace("\n", " ")
    table = result.format_table()
    lines = table.splitlines()
    row = next(i for i, line in enumerate(lines) if line.strip().startswith("b→emb |"))
    assert set(lines[row + 1]) == {"·"} and lines[row + 2].strip().startswith("L1 |")
    assert "b→emb (above the dotted line): the move from the baseline b to h_0" in \
        " ".join(lines)
    records = result.to_visualization_records()
    assert records[0].raw_input_ids == ["b→emb", "L1", "L2", "L3"]
    # the records of the unlikely token are scaled to its own row
    assert float(records[1].word_attributions.abs().max()) == pytest.approx(1.0)


def _long_top_k(n_tok: int, k: int, ranks: int) -> IGLensResult:
    gen = torch.Generator().manual_seed(0)
    tokens = [[[f"a-rather-long-token-{t}-{j}-{r}" for r in range(ranks)] for j in range(k)]
              for t in range(n_tok)]
    ids = torch.full((n_tok, k, ranks), 99)
    ids[:, -1, 0] = torch.arange(n_tok)  # the answer token is top-1 at the last layer
    return IGLensResult(
        prompt="w1 w2", answer="w3", prompt_length=2, input_ids=list(range(2 + n_tok)),
        tokens=[f"w{t}" for t in range(n_tok)], token_ids=list(range(n_tok)),
        positions=list(range(1, 1 + n_tok)), layer_indices=list(range(1, k + 1)),
        attributions=torch.randn(n_tok, k, generator=gen) * 0.01,
        lens_probs=torch.rand(n_tok, k, generator=gen), p_final=torch.rand(n_tok, generator=gen),
        p_baseline=torch.zeros(n_tok), convergence_delta=torch.zeros(n_tok),
        onset_layers=[1] * n_tok, top_k_ids=ids,
        top_k_probs=torch.rand(n_tok, k, ranks, generator=gen), top_k_tokens=tokens)


def _inside_cells(fig, ax, columns: int) -> None:
    FigureCanvasAgg(fig)
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    box = ax.get_window_extent(renderer)
    width = box.width / columns
    for text in ax.texts:
        x, _ = text.get_position()
        ext = text.get_window_extent(renderer)
        left = box.x0 + (x + 0.5) * width - width / 2
        assert ext.x0 >= left - 1 and ext.x1 <= left + width + 1, text.get_text()
        assert ext.y0 >= box.y0 - 1 and ext.y1 <= box.y1 + 1


def test_top_k_view_at_thirty_layers() -> None:
    res = _long_top_k(6, 30, 5)
    fig = plot_top_k(res)
    panels = [ax for ax in fig.axes if ax.images]
    assert len(panels) == 4  # the first max_panels answer tokens
    for ax in panels:
        assert len(ax.texts) == 30 * 5
        _inside_cells(fig, ax, 5)
    texts = panels[0].texts
    assert all("…" in t.get_text() for t in texts)  # cut to the cell, with an ellipsis
    hits = [t for t in texts if t.get_fontweight() == "bold"]
    assert len(hits) == 1 and hits[0].get_position() == (0, 29)
    assert [t.get_text() for t in panels[0].get_yticklabels()][-1] == "L30"
    fig = plot_top_k(res, tokens=[5], top_k=2)
    assert len([ax for ax in fig.axes if ax.images][0].texts) == 30 * 2


def test_top_1_grid_labels_fit_their_cells() -> None:
    res = _long_top_k(4, 6, 1)
    fig = plot_result(res)
    grid = next(ax for ax in fig.axes if len(ax.texts) == 4 * 6)
    _inside_cells(fig, grid, 6)


def test_top_k_view_of_a_real_result(result) -> None:
    fig = result.plot_top_k()
    panels = [ax for ax in fig.axes if ax.images]
    assert len(panels) == 4 and all(len(ax.texts) == 4 * 3 for ax in panels)
    with pytest.raises(ValueError, match="no top-k tokens"):
        plot_top_k(dataclasses.replace(result, top_k_tokens=None))
    with pytest.raises(ValueError, match="top_k must be in 1..3"):
        plot_top_k(result, top_k=4)
