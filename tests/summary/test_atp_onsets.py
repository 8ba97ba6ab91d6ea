"""Attribution patching has no onset layer: its first-order estimates are not a
decomposition, so no cumulative credit reaches a share of the total.

An AtP result holds ``None`` onsets (the table shows n/a), its JSON records ``null`` and
reads it back as ``None`` (an older file's numbers too), and a run summary of AtP records
pools no onset: the report, its JSON, the figure and the HTML say so in one line. Readout
and total-effect results keep their onset layers.
"""

from __future__ import annotations

import json
import warnings

import matplotlib

matplotlib.use("Agg")

import pytest  # noqa: E402
from tiny_families import make_family  # noqa: E402
from tiny_tokenizer import word_tokenizer  # noqa: E402

from captum_iglens import explain  # noqa: E402
from captum_iglens.results import IGLensResult  # noqa: E402
from captum_iglens.summary.html import render_html  # noqa: E402
from captum_iglens.summary.plot import plot_summary  # noqa: E402
from captum_iglens.summary.pool import summarize  # noqa: E402
from captum_iglens.summary.report import ATP_ONSET_NOTE  # noqa: E402

PROMPTS = ("w3 w5 w7 w9", "w2 w4 w6 w8 w1")


@pytest.fixture(scope="module")
def lm():
    return make_family("llama", seed=1).eval()


def _explain(lm, prompt: str, effect: str) -> IGLensResult:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return explain(lm, word_tokenizer(), prompt, max_new_tokens=2, chat_template=False,
                       effect=effect)


def _lines(results) -> list[dict]:
    return [{"id": f"r{i}", "index": i, "status": "ok", "seconds": 0.5, **r.to_dict()}
            for i, r in enumerate(results)]


def test_an_atp_result_records_no_onset_and_reads_it_back(lm) -> None:
    result = _explain(lm, PROMPTS[0], "atp")
    assert result.onset_layers == [None] * len(result.tokens)
    data = json.loads(result.to_json())
    assert [t["onset_layer"] for t in data["tokens"]] == [None] * len(result.tokens)
    back = IGLensResult.from_dict(data)
    assert back.onset_layers == [None] * len(result.tokens)
    assert "onset |" in back.format_table() and "n/a" in back.format_table()
    # an AtP file written before this fix held numbers: read back as no onset
    for token in data["tokens"]:
        token["onset_layer"] = result.layer_indices[-1]
    assert IGLensResult.from_dict(data).onset_layers == [None] * len(result.tokens)
    back.plot()  # the heatmap boxes no onset cell, and draws


@pytest.mark.parametrize("effect", ["readout", "total"])
def test_readout_and_total_results_keep_their_onsets(lm, effect) -> None:
    result = _explain(lm, PROMPTS[0], effect)
    data = result.to_dict()
    onsets = [t["onset_layer"] for t in data["tokens"]]
    assert onsets == result.onset_layers
    assert all(isinstance(o, int) and o in result.layer_indices for o in onsets)
    assert IGLensResult.from_dict(data).onset_layers == onsets


def test_a_summary_of_atp_records_pools_no_onset(lm) -> None:
    records = _lines([_explain(lm, p, "atp") for p in PROMPTS])
    # an older AtP line with numbers in onset_layer: skipped all the same
    for token in records[1]["tokens"]:
        token["onset_layer"] = records[1]["layers"][-1]
    summary = summarize(records, n_boot=20)
    assert summary.effect == "atp" and summary.n_tokens == 4
    assert summary.onset_counts == [0] * len(summary.layers)
    assert all(e["onset_count"] is None for e in summary.to_dict()["per_layer"])
    text = summary.format()
    assert text.count(ATP_ONSET_NOTE) == 1
    rows = [line.split() for line in text.splitlines()
            if line.split()[:1] and line.split()[0] in summary.layer_names]
    assert rows and all(row[4:6] == ["n/a", "n/a"] for row in rows)
    fig = plot_summary(summary)
    assert fig.axes[1].get_title() == "onset layer: n/a for AtP"
    assert not fig.axes[1].patches  # no histogram bars
    page = render_html(summary, records)
    assert ATP_ONSET_NOTE in page and "onset n/a" in page


def test_a_summary_of_readout_records_still_pools_onsets(lm) -> None:
    results = [_explain(lm, p, "readout") for p in PROMPTS]
    summary = summarize(_lines(results), n_boot=20)
    want = [sum(o == layer for r in results for o in r.onset_layers) for layer in summary.layers]
    assert summary.onset_counts == want and sum(want) == summary.n_tokens
    assert ATP_ONSET_NOTE not in summary.format()
    assert plot_summary(summary).axes[1].patches
