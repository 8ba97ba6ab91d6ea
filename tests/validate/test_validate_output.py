"""What ``validate`` prints and draws, on a tiny random llama (issue 32, item 5).

- the donors of resample ablation are named only when resample ran;
- every line of the verdict has a decision cell (H1's first line was blank);
- the box plot's medians differ in colour from every box face (C1 medians on the C1 boxes
  of the second view were invisible) and its legend sits off the axes' data area.
"""

from __future__ import annotations

import warnings

import matplotlib

matplotlib.use("Agg")

import numpy as np  # noqa: E402
import pytest  # noqa: E402
from matplotlib.backends.backend_agg import FigureCanvasAgg  # noqa: E402
from matplotlib.colors import to_rgba  # noqa: E402
from tiny_families import make_family  # noqa: E402
from tiny_tokenizer import word_tokenizer  # noqa: E402

from captum_iglens.validate.driver import validate  # noqa: E402

PROMPTS = ["w4 w5 w6", "w7 w8 w9 w10", "w11 w12", "w13 w14 w15"]


def _validate(kinds: tuple[str, ...]):
    model = make_family("llama", n_blocks=3).eval()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the word tokenizer has no chat template
        return validate(model, word_tokenizer(), PROMPTS, kinds=kinds, threshold=0.0,
                        max_new_tokens=2, n_boot=20, progress=False)


@pytest.fixture(scope="module")
def zero_only():
    return _validate(("zero",))


@pytest.fixture(scope="module")
def with_resample():
    return _validate(("zero", "resample"))


def test_donors_are_named_only_with_resample(zero_only, with_resample) -> None:
    assert "resample donors" not in zero_only.format_table()
    assert "donor prompts" not in zero_only.format_table()
    assert zero_only.format_table().splitlines()[1] == (
        "This run: 20 bootstrap resamples, seed 0.")
    donors = with_resample.settings["donors"]
    assert donors == len(PROMPTS) - 1
    table = with_resample.format_table()
    assert f"seed 0, {donors} resample donors." in table
    assert f"resample: the mean over {donors} donor prompts" in table


def _verdict_rows(result) -> list[str]:
    lines = result.format_verdict().splitlines()
    head = next(i for i, line in enumerate(lines) if line.endswith(" decision"))
    return lines[head + 1:]


def test_every_verdict_line_has_a_decision(with_resample) -> None:
    column = _verdict_rows(with_resample)
    header = next(line for line in with_resample.format_verdict().splitlines()
                  if line.endswith(" decision"))
    at = header.index("decision")
    rows = with_resample.verdict
    assert len(column) == len(rows) > 0
    words = {True: "supported", False: "not supported", None: "n/a"}
    for line, row in zip(column, rows, strict=True):
        cell = line[at:].strip()
        assert cell, line  # the trap: H1's first line had a blank cell
        word = words[row["supported"]] if row["decided"] else "reported only"
        assert cell == word + (" (mean)" if row["mean_instead"] else ""), line
    first_h1 = next(line for line, row in zip(column, rows, strict=True)
                    if row["hypothesis"] == "H1")
    assert first_h1[at:].strip().removesuffix(" (mean)") in ("supported", "not supported", "n/a")
    assert max(len(line) for line in column) <= 100


def test_box_plot_medians_are_visible_and_the_legend_is_off_the_data(with_resample) -> None:
    fig = with_resample.plot()
    FigureCanvasAgg(fig)
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    ax = fig.axes[0]
    faces = [patch for patch in ax.patches if patch.get_facecolor()[3] > 0]
    assert len(faces) == 8 * len(with_resample.analysis["views"])  # one box per predictor
    face_colours = {to_rgba(p.get_facecolor()) for p in faces}
    assert len(face_colours) == len(with_resample.analysis["views"])
    for face in faces:  # the trap: the default C1 median on the C1 boxes of view 2
        x0, x1 = face.get_path().get_extents().intervalx
        median = [line for line in ax.get_lines() if len(line.get_xdata()) == 2
                  and np.allclose(sorted(line.get_xdata()), [x0, x1])]
        assert len(median) == 1  # the one full-width horizontal line of the box
        assert to_rgba(median[0].get_color()) != to_rgba(face.get_facecolor())
        assert to_rgba(median[0].get_color()) not in face_colours
    legend = ax.get_legend()
    assert legend is not None
    box = legend.get_window_extent(renderer)
    data = ax.get_window_extent(renderer)
    assert box.y0 >= data.y1 - 1 or box.x0 >= data.x1 - 1, (box, data)  # above or beside
    assert fig.bbox.contains(box.x0, box.y0) and fig.bbox.contains(box.x1, box.y1)
