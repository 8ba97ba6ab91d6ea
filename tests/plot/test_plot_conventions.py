"""Plots that agree with Captum and say what they hold (issue 32, item 5).

Each test inspects the figure (colours, plotted arrays, labels, sizes) on a synthetic
result whose levels and credits are known (``plot_synthetic``):

- ``result.plot()`` and Captum's ``plot_token_attr`` of the same result draw a positive
  credit in the same colour (Captum's: green positive, red negative);
- ``visualize_text`` records score ``Δp``, not ``p(y|x)``.
"""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
from plot_synthetic import synthetic_result  # noqa: E402

from captum_iglens.plot.credits import plot_heatmap  # noqa: E402


@pytest.fixture(autouse=True)
def _close_pyplot():
    yield
    plt.close("all")  # Captum's own plots use pyplot


def _image(fig):
    return next(ax for ax in fig.axes if ax.images).images[0]


def _hue(rgba) -> str:
    """``"green"`` or ``"red"``: which of the two channels dominates a colour."""
    r, g = float(rgba[0]), float(rgba[1])
    assert abs(r - g) > 0.2, rgba  # a saturated colour, not white or grey
    return "green" if g > r else "red"


def test_package_and_captum_heatmaps_share_the_colour_of_a_sign() -> None:
    result = synthetic_result()
    attr = result.attributions.numpy()
    assert (attr[:, 0] < 0).all() and (attr[:, 1] > 0).all() and (attr[:, 2] < 0).all()
    captum_image = result.to_captum().plot_token_attr()[1].images[0]
    drawn = [_image(result.plot()), _image(plot_heatmap(result)), captum_image]
    for image in drawn:
        values = np.asarray(image.get_array())
        colours = image.to_rgba(values)
        neg = np.unravel_index(np.argmin(values), values.shape)
        pos = np.unravel_index(np.argmax(values), values.shape)
        assert values[neg] < 0 < values[pos]
        # the trap: RdBu_r drew positive red where Captum draws it green
        assert _hue(colours[pos]) == "green" and _hue(colours[neg]) == "red"
        assert image.norm.vmin == -image.norm.vmax  # centred at 0
    ends = [tuple(image.cmap(x)) for image in drawn for x in (0.0, 1.0)]
    assert ends[0:2] == ends[2:4] == ends[4:6]  # one map: Captum's red-white-green


@pytest.mark.parametrize("units", ["probability", "log-probability"])
def test_visualization_records_score_delta_p(units) -> None:
    result = synthetic_result(units=units)
    delta = (result.p_final - result.p_baseline).double()
    view = result.to_captum()
    for records in (result.to_visualization_records(), view.to_visualization_records()):
        for t, rec in enumerate(records):
            scale = float(result.attributions[t].abs().sum() + result.p_baseline[t].abs())
            tol = 8 * float(np.finfo(np.float32).eps) * scale
            assert rec.attr_score == pytest.approx(float(delta[t]), abs=tol)
            # the trap: the Captum view's score repeated p(y|x), the record's pred_prob
            assert abs(rec.attr_score - rec.pred_prob) > 1e-3
            assert rec.pred_prob == pytest.approx(float(result.p_final[t]))


def _map_axes(fig):
    return next(ax for ax in fig.axes if ax.images)


def test_sublayer_columns_that_span_skipped_blocks_say_so() -> None:
    # layers [0, 25, 30] of 30 blocks at sub-layer granularity: nodes 0, 49, 50, 59, 60
    result = synthetic_result(layer_indices=[0, 49, 50, 59, 60], granularity="sublayer")
    assert result.layer_names == ["emb", "L25.attn", "L25.mlp", "L30.attn", "L30.mlp"]
    honest = ["b→emb", "L1-24+L25.attn", "L25.mlp", "L26-29+L30.attn", "L30.mlp"]
    fig = result.plot()
    ax = _map_axes(fig)
    # the trap: "L25.attn" for a column holding blocks 1-24 as well
    assert [t.get_text() for t in ax.get_xticklabels()] == honest
    # the trajectory is drawn over blocks (L25.attn at 24.5 and L25.mlp at 25 had
    # overlapping name labels)
    traj = next(a for a in fig.axes if a.get_lines() and not a.images)
    assert traj.get_xlabel() == "decoder block (L.attn at L - 0.5, L.mlp at L)"
    np.testing.assert_array_equal(traj.get_lines()[0].get_xdata(), [0, 24.5, 25, 29.5, 30])
    caption = " ".join(fig.get_supxlabel().split())
    assert ("L1-24+L25.attn: the segment from the previous chosen layer to L25.attn, blocks "
            "1-24 whole (skipped layers) and L25's attention.") in caption
    ax = _map_axes(plot_heatmap(result))
    assert [t.get_text() for t in ax.get_xticklabels()] == honest
    _, ax = result.to_captum().plot_token_attr()
    assert [t.get_text() for t in ax.get_xticklabels()] == ["emb", *honest[1:]]
    _, ax = result.to_captum().plot_seq_attr()
    assert [t.get_text() for t in ax.get_xticklabels()] == ["emb", *honest[1:]]
    assert honest[1] in result.format_table()
    # one block skipped; adjacent blocks and the baseline's first segment keep their names
    one = synthetic_result(layer_indices=[47, 48, 51, 52, 53, 54], granularity="sublayer")
    assert [t.get_text() for t in _map_axes(one.plot()).get_xticklabels()] == [
        "L24.attn", "L24.mlp", "L25+L26.attn", "L26.mlp", "L27.attn", "L27.mlp"]
    assert "L25+L26.attn: the segment from the previous chosen layer to L26.attn, blocks 25 " \
        "whole" in " ".join(one.plot().get_supxlabel().split())


def test_sublayer_heatmap_of_sixty_columns_is_legible_at_a_normal_width() -> None:
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    result = synthetic_result(n_tok=6, layer_indices=list(range(61)), granularity="sublayer")
    fig = result.plot()
    width_in, _ = fig.get_size_inches()
    # the trap: 24 in (2,880 px at the 120 dpi of the CLI) for 61 columns; shown 1,240 px
    # wide, its 7 pt labels were ~5 px. Now <= 13 in: >= 9 px labels at that width.
    assert width_in <= 13.0
    ax = _map_axes(fig)
    labels = [t for t in ax.get_xticklabels() if t.get_text()]
    for text in labels:
        assert text.get_fontsize() >= 7.0  # points
        assert text.get_fontsize() / 72 * 1240 / width_in >= 9.0  # px at 1,240 px wide
    names = [t.get_text() for t in labels]
    assert names == ["b→emb", *[f"L{b}.mlp" for b in range(1, 31)]]  # each block once
    assert len(ax.xaxis.get_minorticklocs()) == 30  # the .attn columns keep a tick
    assert "unlabelled ticks: each block's .attn" in ax.get_xlabel()
    FigureCanvasAgg(fig)
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    boxes = [t.get_window_extent(renderer) for t in labels]
    for left, right in zip(boxes[:-1], boxes[1:], strict=True):
        assert left.x1 <= right.x0 + 0.5, (left, right)  # no two labels overlap
    assert fig.bbox.width <= 13.0 * fig.dpi
    # 30 blocks at block granularity: every column labelled, the figure as narrow
    blocks = synthetic_result(n_tok=6, layer_indices=list(range(31)))
    fig = blocks.plot()
    assert fig.get_size_inches()[0] <= 13.0
    assert len([t for t in _map_axes(fig).get_xticklabels() if t.get_text()]) == 31


def test_top_k_labels_are_fitted_without_laying_out_whole_strings(monkeypatch) -> None:
    """The 22 s top-K figure: ~15 whole-string layouts a label (TextToPath, ~3 ms each) and
    a constrained layout per panel. Now: per-character widths, one layout, same fit."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.layout_engine import ConstrainedLayoutEngine
    from matplotlib.textpath import TextToPath
    from test_plot_traps import _long_top_k

    from captum_iglens.plot import top_k
    from captum_iglens.plot.top_k import fit_label, plot_top_k

    calls = {"text_to_path": 0, "layout": 0}
    measure, execute = TextToPath.get_text_width_height_descent, ConstrainedLayoutEngine.execute

    def counted_measure(self, *args, **kwargs):
        calls["text_to_path"] += 1
        return measure(self, *args, **kwargs)

    def counted_execute(self, fig):
        calls["layout"] += 1
        return execute(self, fig)

    monkeypatch.setattr(TextToPath, "get_text_width_height_descent", counted_measure)
    monkeypatch.setattr(ConstrainedLayoutEngine, "execute", counted_execute)
    fig = plot_top_k(_long_top_k(6, 30, 5))
    assert calls == {"text_to_path": 0, "layout": 1}  # before: thousands, and 4 layouts
    panels = [ax for ax in fig.axes if ax.images]
    assert len(panels) == 4 and all(len(ax.texts) == 150 for ax in panels)
    # every label inside its cell as the renderer lays it out (the fit is not looser)
    FigureCanvasAgg(fig)
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    for ax in panels:
        box = ax.get_window_extent(renderer)
        width = box.width / 5
        for text in ax.texts:
            x, _ = text.get_position()
            ext = text.get_window_extent(renderer)
            assert box.x0 + x * width - 1 <= ext.x0 and ext.x1 <= box.x0 + (x + 1) * width + 1
    # the per-character width is the renderer's to a few percent, and cut labels use the room
    label = panels[0].texts[0]
    drawn_pt = renderer.get_text_width_height_descent(
        "'a-rather-long'", label.get_fontproperties(), ismath=False)[0] * 72.0 / fig.dpi
    text_width_pt = top_k.text_width_pt
    assert text_width_pt("'a-rather-long'", label.get_fontsize()) == pytest.approx(
        drawn_pt, rel=0.05)
    cut = fit_label("a-rather-long-token", 40.0, 8.0)
    assert cut.endswith("…") and text_width_pt(cut, 8.0) <= 40.0
    assert text_width_pt(fit_label("a-rather-long-token", 48.0, 8.0), 8.0) > 40.0


def _early_lens_result(units: str = "log-probability"):
    """The logit lens's level at L1 is e-44 (as on SmolLM2); later layers move by <= 3 nats."""
    import torch

    rises = torch.tensor([[0.0, 1.5, -0.5, 2.0], [0.0, 0.5, 1.0, 3.0], [0.0, -1.0, 2.5, 1.0]],
                         dtype=torch.float64)
    lens = (-44.0 + rises.cumsum(-1)).exp()
    return synthetic_result(n_tok=3, units=units, lens=lens)


@pytest.mark.parametrize("how", ["log units", "log display"])
def test_log_heatmap_draws_the_start_apart(how) -> None:
    result = _early_lens_result("log-probability" if how == "log units" else "probability")
    display = "log-probability" if how == "log display" else "credit"
    for fig in (result.plot(display=display), plot_heatmap(result, display=display)):
        ax = _map_axes(fig)
        image = ax.images[0]
        drawn = image.get_array()
        values = np.asarray(drawn.data)
        levels = np.concatenate([result.p_baseline.double().numpy()[:, None],
                                 result.lens_probs.double().numpy()], 1)
        levels = levels if result.units == "log-probability" else np.log(levels)
        np.testing.assert_allclose(values, np.diff(levels, axis=1), rtol=1e-5, atol=1e-4)
        assert values[:, 0].max() < -30 and np.abs(values[:, 1:]).max() <= 3.0 + 1e-4
        # the trap: the start (-44 nats a cell) set the colour scale, the rises were white
        assert image.norm.vmax == pytest.approx(float(np.abs(values[:, 1:]).max()))
        assert image.norm.vmin == -image.norm.vmax
        assert drawn.mask[:, 0].all() and not drawn.mask[:, 1:].any()  # grey, off the scale
        grey = image.to_rgba(drawn)[:, 0]
        assert np.allclose(grey[:, :3], grey[0, 0])  # one grey, not a credit colour
        written = {round(t.get_position()[1]): t.get_text() for t in ax.texts
                   if t.get_position()[0] == 0}
        assert written == {t: f"{values[t, 0]:.1f}" for t in range(3)}
        assert "first: the start" in ax.get_xlabel()
    caption = " ".join(result.plot(display=display).get_supxlabel().split())
    assert "Log units: the first column (L1) is the start" in caption
    # probability credits keep one scale for every column
    prob = _early_lens_result("probability")
    image = _map_axes(prob.plot()).images[0]
    assert not np.ma.getmaskarray(image.get_array()).any()


def test_captum_view_in_log_units_draws_the_start_apart() -> None:
    result = _early_lens_result()
    view = result.to_captum()
    start = view.token_attr[:, 0].numpy()
    assert start.max() < -40  # log p at L1: a level
    fig, ax = view.plot_token_attr()
    image = ax.images[0]
    rises = view.token_attr[:, 1:].numpy()
    # the trap: Captum's scale was |log p at L1| (44 nats); the rises (<= 3 nats) were white
    assert image.norm.vmax == pytest.approx(float(np.abs(rises).max()))
    assert image.get_array().mask[:, 0].all()
    cells = {(round(t.get_position()[0]), round(t.get_position()[1])): t.get_text()
             for t in ax.texts}
    assert all(cells[(0, t)] == f"{start[t]:.4f}" for t in range(3))
    assert all(cells[(1, t)] == f"{rises[t, 0]:.4f}" for t in range(3))
    assert "first: the start, log p at L1" in ax.get_xlabel()
    _, ax = view.plot_seq_attr()
    heights = np.array([p.get_height() for p in ax.patches])
    bars = heights[:4] + heights[4:]
    # exact: the first bar is drawn with height 0 (it was sum_t log p at L1: -132 nats here)
    assert bars[0] == 0.0
    np.testing.assert_allclose(bars[1:], view.seq_attr[1:].numpy(), rtol=0, atol=0)
    low, high = ax.get_ylim()
    assert low > -10 and high < 10  # the axis is the rises'
    note = next(t.get_text() for t in ax.texts if t.get_text().startswith("start"))
    assert f"{float(view.token_attr[:, 0].double().sum()):.1f}" in note
    # the numbers are unchanged: the rows still add up with baseline_attr
    total = view.baseline_attr.double() + view.token_attr.double().sum(-1)
    np.testing.assert_allclose(total.numpy(), view.delta_p.double().numpy(), atol=1e-4)
    # probability units: the first column stays on the scale
    prob = _early_lens_result("probability").to_captum()
    _, ax = prob.plot_token_attr()
    assert not np.ma.getmaskarray(ax.images[0].get_array()).any()


def test_row_display_in_log_units_scales_each_row_by_its_rises() -> None:
    result = _early_lens_result()
    image = _map_axes(result.plot(display="row")).images[0]
    values = np.asarray(image.get_array().data)
    rises = result.attributions[:, 1:].abs().amax(-1).numpy()
    np.testing.assert_allclose(np.abs(values[:, 1:]).max(1), 1.0, rtol=1e-6)
    np.testing.assert_allclose(values[:, 0], result.attributions[:, 0].numpy() / rises,
                               rtol=1e-6)
    assert image.get_array().mask[:, 0].all() and image.norm.vmax == pytest.approx(1.0)
