"""plot_result stays readable for long answers (issue 9, item 15).

A tiny random llama with the word tokenizer explains a given 32-token answer (no big model,
few IG steps): every text artist stays inside the figure, every token is labelled, every
trajectory line has its own colour and is named by a colour bar (many tokens) or a legend
(few tokens), and the caption states the onset rule and the units.
"""

from __future__ import annotations

import dataclasses

import matplotlib

matplotlib.use("Agg")

import pytest  # noqa: E402
import torch  # noqa: E402
from matplotlib.backends.backend_agg import FigureCanvasAgg  # noqa: E402
from matplotlib.colors import to_rgba  # noqa: E402
from matplotlib.text import Text  # noqa: E402
from tiny_families import make_family  # noqa: E402
from tiny_tokenizer import word_tokenizer  # noqa: E402

from captum_iglens import explain  # noqa: E402
from captum_iglens.plot.credits import plot_heatmap, plot_result  # noqa: E402
from captum_iglens.results import IGLensResult  # noqa: E402

PROMPT = " ".join(f"w{i}" for i in range(60))  # long enough to be cut in the title
ANSWER_IDS = [4 + (7 * i) % 120 for i in range(32)]


@pytest.fixture(scope="module")
def model_and_tokenizer():
    return make_family("llama").eval(), word_tokenizer()


@pytest.fixture(scope="module")
def long_result(model_and_tokenizer) -> IGLensResult:
    model, tokenizer = model_and_tokenizer
    result = explain(model, tokenizer, PROMPT, target=ANSWER_IDS, chat_template=False,
                     n_steps=4)
    assert len(result.tokens) == 32
    # as if generation had stopped at the limit; a mix of argmax and non-argmax tokens
    return dataclasses.replace(result, truncated=True, max_new_tokens=32,
                               is_argmax=[t % 3 == 0 for t in range(32)])


@pytest.fixture(scope="module")
def short_result(model_and_tokenizer) -> IGLensResult:
    model, tokenizer = model_and_tokenizer
    return explain(model, tokenizer, "w5 w6 w7", target=ANSWER_IDS[:4], chat_template=False,
                   n_steps=4)


def _drawn(fig):
    FigureCanvasAgg(fig)
    fig.canvas.draw()
    return fig.canvas.get_renderer()


def _panels(fig):
    """Heatmap, trajectory, and colour-bar axes (the ones with a label but no data)."""
    ax_map = next(ax for ax in fig.axes if ax.images)
    ax_traj = next(ax for ax in fig.axes if ax.get_lines() and not ax.images)
    return ax_map, ax_traj


def _drawn_texts(fig, ax) -> list[Text]:
    """Titles, labels, legend and cell texts of ``ax``, and the tick labels it draws."""
    texts = [ax.title, ax._left_title, ax._right_title, ax.xaxis.label, ax.yaxis.label,
             *ax.texts]
    if ax.get_legend() is not None:
        texts += [*ax.get_legend().get_texts(), ax.get_legend().get_title()]
    for axis in (ax.xaxis, ax.yaxis):
        lo, hi = sorted(axis.get_view_interval())
        for tick in axis.get_major_ticks():  # ticks outside the view are not drawn
            if lo - 1e-9 <= tick.get_loc() <= hi + 1e-9:
                texts += [tick.label1, tick.label2]
    return texts


def _assert_texts_inside(fig) -> None:
    renderer = _drawn(fig)
    box = fig.bbox
    texts = [*fig.texts, fig._suptitle, fig._supxlabel]
    texts += [t for ax in fig.axes for t in _drawn_texts(fig, ax)]
    texts = [t for t in texts if t is not None and t.get_visible() and t.get_text().strip()]
    assert len(texts) > 10
    for text in texts:
        ext = text.get_window_extent(renderer)
        assert (ext.x0 >= box.x0 - 1 and ext.y0 >= box.y0 - 1 and ext.x1 <= box.x1 + 1
                and ext.y1 <= box.y1 + 1), (text.get_text()[:60], ext, box)


def test_long_answer_texts_stay_inside_the_figure(long_result) -> None:
    fig = plot_result(long_result)
    _assert_texts_inside(fig)
    lines = fig.get_suptitle().split("\n")
    prompt_lines = [s for s in lines if s.startswith("prompt: ")]
    answer_lines = [s for s in lines if s.startswith("answer (32 tokens)")]
    assert len(prompt_lines) == 1 and len(answer_lines) == 1  # separate lines
    assert lines.index(answer_lines[0]) > lines.index(prompt_lines[0])
    assert "[truncated at 32 tokens]" in answer_lines[0]
    assert "…" in fig.get_suptitle()  # the 60-word prompt is cut
    assert "chat" not in fig.get_suptitle()
    # the figure grew with the answer, within limits
    width, height = fig.get_size_inches()
    assert 8 <= height <= 24 and 9 <= width <= 24


def test_heatmap_labels_every_token_and_marks_non_argmax(long_result) -> None:
    fig = plot_result(long_result)
    ax_map, _ = _panels(fig)
    labels = [t.get_text() for t in ax_map.get_yticklabels()]
    assert len(labels) == 32
    for t, (label, token) in enumerate(zip(labels, long_result.tokens, strict=True)):
        assert label.startswith(f"{t} {token!r}")
        assert label.endswith("*") == (not long_result.is_argmax[t])
    # one onset box per token, at (onset column, token row)
    offsets = ax_map.collections[0].get_offsets()
    cols = [long_result.layer_indices.index(o) for o in long_result.onset_layers]
    assert [tuple(map(int, xy)) for xy in offsets] == list(zip(cols, range(32), strict=True))


def test_many_trajectories_get_distinct_colours_and_a_colour_bar(long_result) -> None:
    fig = plot_result(long_result)
    _, ax_traj = _panels(fig)
    lines = ax_traj.get_lines()
    assert len(lines) == 32
    assert len({to_rgba(line.get_color()) for line in lines}) == 32
    assert ax_traj.get_legend() is None
    bars = [ax for ax in fig.axes if ax.get_ylabel() == "answer token index"]
    assert len(bars) == 1
    # the colour bar maps index t to line t's colour
    mappable = bars[0]._colorbar.mappable
    for t in (0, 13, 31):
        assert to_rgba(mappable.to_rgba(t)) == to_rgba(lines[t].get_color())


@pytest.mark.parametrize("rule, words", [
    ("sustained", "first layer from which the cumulative credit stays at or beyond 0.5·Δp"),
    ("mass", "first layer holding 0.5 of the cumulative |credit|"),
])
def test_caption_states_rule_and_units(long_result, rule, words) -> None:
    caption = plot_result(dataclasses.replace(long_result, onset_rule=rule)).get_supxlabel()
    assert words in caption.replace("\n", " ")
    assert "probability" in caption
    log = dataclasses.replace(long_result, onset_rule=rule, units="log-probability")
    fig = plot_result(log)
    assert "nats" in fig.get_supxlabel()
    ax_map, ax_traj = _panels(fig)
    assert any("nats" in ax.get_ylabel() for ax in fig.axes if ax not in (ax_map, ax_traj))
    assert "nats" in ax_traj.get_ylabel()


def test_short_answer_keeps_a_legend(short_result) -> None:
    fig = plot_result(short_result)
    _assert_texts_inside(fig)
    _, ax_traj = _panels(fig)
    legend = ax_traj.get_legend()
    assert legend is not None
    names = [t.get_text() for t in legend.get_texts()]
    assert names == [f"{t} {tok!r}" for t, tok in enumerate(short_result.tokens)]
    assert len({to_rgba(line.get_color()) for line in ax_traj.get_lines()}) == 4
    assert not any(ax.get_ylabel() == "answer token index" for ax in fig.axes)
    assert "[truncated" not in fig.get_suptitle()


def _with_top1(result: IGLensResult, hit_row: int = 0) -> IGLensResult:
    n_tok, k = len(result.tokens), len(result.layer_indices)
    ids = torch.full((n_tok, k, 2), 3)
    ids[hit_row, :, 0] = result.token_ids[hit_row]
    words = [[[f"w{t}L{j}", "<unk>"] for j in range(k)] for t in range(n_tok)]
    return dataclasses.replace(result, top_k_ids=ids, top_k_probs=torch.rand(n_tok, k, 2),
                               top_k_tokens=words)


def test_top1_grid_when_readable(long_result) -> None:
    result = _with_top1(long_result)
    fig = plot_result(result)
    _assert_texts_inside(fig)
    grids = [ax for ax in fig.axes if len(ax.texts) == 32 * len(result.layer_indices)]
    assert len(grids) == 1
    texts = grids[0].texts
    assert texts[0].get_text() == "'w0L0'" and texts[0].get_fontweight() == "bold"
    assert texts[-1].get_fontweight() == "normal"


def test_top1_grid_skipped_when_too_many_layers() -> None:
    n_tok, k = 6, 30
    gen = torch.Generator().manual_seed(0)
    credit = torch.randn(n_tok, k, generator=gen) * 0.01
    result = IGLensResult(
        prompt="w1 w2", answer="w3 " * n_tok, prompt_length=2, input_ids=list(range(2 + n_tok)),
        tokens=[f"w{t}" for t in range(n_tok)], token_ids=list(range(n_tok)),
        positions=list(range(1, 1 + n_tok)), layer_indices=list(range(1, k + 1)),
        attributions=credit, lens_probs=torch.rand(n_tok, k, generator=gen),
        p_final=torch.rand(n_tok, generator=gen), p_baseline=torch.zeros(n_tok),
        convergence_delta=torch.zeros(n_tok), onset_layers=[1 + t for t in range(n_tok)],
        top_k_tokens=[[["w0"] for _ in range(k)] for _ in range(n_tok)],
    )
    fig = plot_result(result)
    assert not any(ax.texts for ax in fig.axes)
    assert fig.get_size_inches()[0] <= 24
    _assert_texts_inside(fig)


def test_log_units_caption_names_delta_log_p(long_result) -> None:
    log = dataclasses.replace(long_result, units="log-probability")
    caption = " ".join(plot_result(log).get_supxlabel().split())
    assert "stays at or beyond 0.5·Δlog p" in caption and "Δp" not in caption
    assert "Credit in log-probability, nats" in caption


def test_plot_heatmap_is_the_credit_panel_alone(long_result) -> None:
    fig = plot_heatmap(long_result)
    _assert_texts_inside(fig)
    maps = [ax for ax in fig.axes if ax.images]
    assert len(maps) == 1 and not any(ax.get_lines() for ax in fig.axes)  # no trajectory
    ax = maps[0]
    torch.testing.assert_close(torch.as_tensor(ax.images[0].get_array().data),
                               long_result.attributions.float(), atol=0, rtol=0)
    labels = [t.get_text() for t in ax.get_yticklabels()]
    assert len(labels) == 32 and labels[0] == f"0 {long_result.tokens[0]!r}"
    assert len(ax.collections[0].get_offsets()) == 32  # every onset boxed
    bar = next(a for a in fig.axes if a is not ax)
    assert bar.get_ylabel() == "IG-Lens credit (probability)"
    # compact: 0.14 inch per token, 0.16 per layer, beside 3.2 inches of labels
    width, height = fig.get_size_inches()
    assert height == pytest.approx(1.3 + 0.14 * 32, rel=1e-9)
    assert width == pytest.approx(3.2 + 0.16 * len(long_result.layer_indices), rel=1e-9)
