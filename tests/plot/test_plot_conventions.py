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

from captum_iglens.plot.credits import plot_heatmap, plot_result  # noqa: E402


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
