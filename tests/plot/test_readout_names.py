"""The table and the plots name the readout of the levels: the logit lens's ``f`` or a
per-layer lens's ``g_L`` (tuned, jacobian, custom), never ``f`` under a per-layer lens.

A logit-lens result prints and draws byte for byte what it did before: its table's SHA-256
and its axis labels are pinned here (recorded on the synthetic results below before the
per-layer names existed).
"""

from __future__ import annotations

import hashlib
from dataclasses import replace

import matplotlib

matplotlib.use("Agg")

import pytest  # noqa: E402
import torch  # noqa: E402
from plot_synthetic import synthetic_result  # noqa: E402

from captum_iglens.plot.credits import plot_result  # noqa: E402
from captum_iglens.plot.heatmap import start_note  # noqa: E402
from captum_iglens.results import IGLensResult  # noqa: E402

#: SHA-256 of ``synthetic_result(n_tok=3, units=...).format_table()`` before this change.
LOGIT_TABLES = {
    "probability": "9b57a6f6f088ca5ea2de9f5db119c9d4cee3b2fa3ac930155511409151adcbbd",
    "log-probability": "342178052d785a3f3fa08149f0c2ed15ea3fbdb2881b4f17a481b83658d756d8",
}
LOGIT_YLABELS = {"probability": "logit-lens probability f(h_L)",
                 "log-probability": "logit-lens log-probability (nats)"}
TUNED = {"kind": "tuned", "digest": "0123456789abcdef", "source": "t.pt"}


def _per_layer(units: str, lens: dict) -> IGLensResult:
    base = synthetic_result(n_tok=3, units=units)
    return replace(base, lens_change=torch.zeros_like(base.attributions), lens=lens)


def _trajectory(result: IGLensResult):
    return plot_result(result).axes[1]


@pytest.mark.parametrize("units", ["probability", "log-probability"])
def test_a_logit_lens_result_prints_and_draws_as_before(units) -> None:
    result = synthetic_result(n_tok=3, units=units)
    table = result.format_table()
    assert hashlib.sha256(table.encode()).hexdigest() == LOGIT_TABLES[units]
    assert "lens p" in table or "lens lp" in table
    ax = _trajectory(result)
    assert ax.get_title() == "logit-lens trajectory per token"
    assert ax.get_ylabel() == LOGIT_YLABELS[units]
    if units == "log-probability":
        assert "to the logit lens's level at L1" in start_note(result, "credit")


@pytest.mark.parametrize("units", ["probability", "log-probability"])
def test_a_per_layer_lens_names_its_readout_in_the_table(units) -> None:
    table = _per_layer(units, TUNED).format_table()
    level = "g_L p" if units == "probability" else "g_L lp"
    head = table.splitlines()[1]
    assert head.count(level) == 3 and "lens p" not in head and "lens lp" not in head
    legend = " ".join(table.split())
    assert f"{level}: the tuned (0123456789abcdef) lens's readout g_L(h_L)" in legend
    assert "f(h_L)" not in table
    assert all(len(line) <= 100 for line in table.splitlines())


@pytest.mark.parametrize("lens, kind", [(TUNED, "tuned lens"),
                                        ({"kind": "jacobian", "digest": "ab"}, "jacobian lens"),
                                        ({"kind": "custom", "name": "Mine"}, "custom Mine lens")])
def test_a_per_layer_lens_names_its_readout_in_the_plots(lens, kind) -> None:
    prob = _trajectory(_per_layer("probability", lens))
    assert prob.get_title() == f"{kind} g_L(h_L) trajectory per token"
    assert prob.get_ylabel() == f"{kind} probability g_L(h_L)"
    logs = _per_layer("log-probability", lens)
    assert _trajectory(logs).get_ylabel() == f"{kind} g_L log-probability (nats)"
    note = start_note(logs, "credit")
    assert f"to the {kind} g_L's level at L1" in note and "logit" not in note


def _with_top_k(result: IGLensResult, ranks: int = 2) -> IGLensResult:
    n_tok, k = result.attributions.shape
    ids = torch.arange(ranks).repeat(n_tok, k, 1)
    probs = torch.tensor([0.6, 0.3][:ranks]).repeat(n_tok, k, 1)
    words = [[[f"w{r}" for r in range(ranks)] for _ in range(k)] for _ in range(n_tok)]
    return replace(result, top_k_ids=ids, top_k_probs=probs, top_k_tokens=words)


@pytest.mark.parametrize("per_layer", [False, True])
def test_the_top_k_plots_name_the_readout(per_layer) -> None:
    from captum_iglens.plot.top_k import plot_top_k

    base = _per_layer("probability", TUNED) if per_layer else synthetic_result(n_tok=3)
    result = _with_top_k(base)
    name = "tuned lens g_L" if per_layer else "logit-lens"
    fig = plot_top_k(result)
    assert fig._suptitle.get_text().startswith(f"{name} top-2 tokens at each layer")
    assert f"{name} probability" in [ax.get_ylabel() for ax in fig.axes]
    grids = [ax for ax in plot_result(result).axes if "top-1 token" in ax.get_title()]
    assert [ax.get_title() for ax in grids] == [
        f"{name} top-1 token\n(bold green = the answer token)"]


@pytest.mark.parametrize("draw", ["result", "heatmap"])
def test_the_lens_legend_meets_neither_the_x_label_nor_the_title(draw) -> None:
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    from captum_iglens.plot.heatmap import plot_heatmap

    result = _per_layer("probability", TUNED)
    fig = plot_result(result) if draw == "result" else plot_heatmap(result)
    canvas = FigureCanvasAgg(fig)
    canvas.draw()  # lays the figure out
    renderer = canvas.get_renderer()
    (ax,) = [a for a in fig.axes if a.get_title().startswith("lens terms")]
    legend = ax.get_legend().get_window_extent(renderer)
    for other in (ax.xaxis.label, ax.title):
        assert not legend.overlaps(other.get_window_extent(renderer)), other.get_text()
    assert not legend.overlaps(ax.get_window_extent(renderer))  # nor the cells
