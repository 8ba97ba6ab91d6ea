"""The printed report and the HTML page of `iglens summarize`: batches ranked by their time,
records named by id or index, one number format per column, units named as the run's, and
small palette PNGs per record."""

from __future__ import annotations

import base64
import re
import struct

import matplotlib

matplotlib.use("Agg")

import pytest  # noqa: E402
import torch  # noqa: E402
from conftest import VOCAB, make_tiny  # noqa: E402
from test_summarize import ERRORS, LAYERS, N_RECORDS, ok_line  # noqa: E402

from captum_iglens import explain_ids  # noqa: E402
from captum_iglens.results import IGLensResult  # noqa: E402
from captum_iglens.summary.html import render_html  # noqa: E402
from captum_iglens.summary.pool import N_SLOWEST, summarize  # noqa: E402
from captum_iglens.summary.report import column_format  # noqa: E402


@pytest.fixture(scope="module")
def lines() -> list[dict]:
    """Result lines of a tiny llama: 8 records, answers of 1 to 3 tokens."""
    model = make_tiny("llama", n_layers=4)
    gen = torch.Generator().manual_seed(3)
    out = []
    for i in range(N_RECORDS):
        ids = torch.randint(4, VOCAB, (8,), generator=gen).tolist()
        result = explain_ids(model, ids[:5], ids[5:6 + i % 3], layers=LAYERS,
                             prompt=f"prompt {i}")
        out.append(ok_line(result, i))
    return out


# seconds per record as `iglens run` writes them: every record of a batch gets the same
# share of the batch's time. Batches: rec6 alone 2.0 s, rec0-2 3 x 0.5 = 1.5 s,
# rec4-5 2 x 0.7 = 1.4 s, rec3 alone 1.2 s, rec7 alone 0.3 s.
SHARES = [0.5, 0.5, 0.5, 1.2, 0.7, 0.7, 2.0, 0.3]


def test_errors_and_slowest_batches_are_listed(lines) -> None:
    timed = [dict(line, seconds=share) for line, share in zip(lines, SHARES, strict=True)]
    summary = summarize(timed, ERRORS, n_boot=50)
    assert [(f["id"], f["error_type"], f["error"]) for f in summary.failures] == [
        (e["id"], e["error_type"], e["error"]) for e in ERRORS]
    # ranked by the batch's time, not by the per-record share (rec3's 1.2 s share is the
    # second largest, but its batch is the fourth slowest)
    assert [b["ids"] for b in summary.slowest_batches] == [
        ["rec6"], ["rec0", "rec1", "rec2"], ["rec4", "rec5"], ["rec3"], ["rec7"]]
    assert len(summary.slowest_batches) == N_SLOWEST
    assert [b["seconds"] for b in summary.slowest_batches] == pytest.approx(
        [2.0, 1.5, 1.4, 1.2, 0.3], rel=1e-12)
    assert [b["records"] for b in summary.slowest_batches] == [1, 3, 2, 1, 1]
    assert summary.slowest_batches[1]["tokens"] == sum(len(lines[i]["tokens"]) for i in (0, 1, 2))
    assert summary.total_seconds == pytest.approx(sum(SHARES), rel=1e-12)
    text = summary.format()
    assert "Slowest batches" in text and "share its time" in text
    slow = text.split("Slowest batches")[1].splitlines()[1:6]
    assert "record id 'rec6'" in slow[0] and "2.00 s" in slow[0]
    assert "ids 'rec0', 'rec1', 'rec2'" in slow[1] and "3 records" in slow[1]
    for entry in ERRORS:
        assert f"record id '{entry['id']}'" in text and entry["error"] in text
    assert all(len(line) <= 100 for line in text.splitlines())


def test_equal_batch_times_keep_file_order(lines) -> None:
    timed = [dict(line, seconds=1.0 if i == 2 else 0.5 if i < 2 else 0.1)
             for i, line in enumerate(lines)]
    summary = summarize(timed, n_boot=50)
    # rec0-1 (2 x 0.5 s) and rec2 (1 x 1.0 s) both took 1.0 s: rec0's batch comes first
    assert [b["ids"] for b in summary.slowest_batches[:2]] == [["rec0", "rec1"], ["rec2"]]


def test_records_are_named_by_id_or_index(lines) -> None:
    nameless = [dict(line, id=None) for line in lines]
    text = summarize(nameless, n_boot=50).format()
    worst = summarize(lines, n_boot=50).worst
    assert f"(worst: record #{worst['index']} (index), token {worst['token']})" in " ".join(
        text.split())
    text = summarize(lines, n_boot=50).format()
    assert f"(worst: record id '{worst['id']}', token {worst['token']})" in " ".join(
        text.split())


def test_mean_and_ci_columns_use_one_format(lines) -> None:
    text = summarize(lines, n_boot=200).format()
    rows = [line.split() for line in text.splitlines()
            if line.startswith("  ") and line.split()[0] in ("emb", "L2", "L3", "L4", "sum")]
    assert len(rows) == 5
    numbers = [value for row in rows[:4] for value in row[1:4]] + [rows[4][1], rows[4][-1]]
    # one format for the whole column: every number fixed point with the same decimals,
    # or every number in scientific notation
    shapes = {re.sub(r"\d", "9", value) for value in numbers}
    assert all(value[0] in "+-" for value in numbers)
    assert len({len(shape.split(".")[1]) for shape in shapes}) == 1, shapes
    assert all("e" in shape for shape in shapes) or not any("e" in s for s in shapes)


@pytest.mark.parametrize("values, spec", [
    ([0.03267, -0.0005636, 0.1131], "+.6f"),  # 3 significant digits of 0.0005636
    ([0.25, -0.5], "+.4f"),
    ([0.2, 3e-7], "+.3e"),  # fixed point would need more than 6 decimals
    ([12345.0, 0.5], "+.3e"),
    ([float("nan"), 0.0], "+.4f"),
])
def test_column_format(values, spec) -> None:
    assert column_format(values) == spec


def test_log_probability_run_names_its_units(lines) -> None:
    nats = [dict(line, units="log-probability") for line in lines]
    summary = summarize(nats, n_boot=50)
    text = " ".join(summary.format().split())
    assert "mean Δlog p" in text and "max |sum of credits - Δlog p|" in text
    assert "(nats)" in text and "Δp" not in text and "probability over" not in text
    page = render_html(summary, nats[:2], max_records=0)
    assert "Δlog p" in page and "delta_p" not in page
    assert "Δp" in summarize(lines, n_boot=50).format()


def big_line(i: int) -> dict:
    """A 64-token answer over 30 layers, as a SmolLM2 run writes them (random credits,
    which compress worse than real ones)."""
    n_tok, k = 64, 30
    gen = torch.Generator().manual_seed(i)
    result = IGLensResult(
        prompt=f"prompt {i}", answer="w " * n_tok, prompt_length=2,
        input_ids=list(range(2 + n_tok)), tokens=[f"w{t}" for t in range(n_tok)],
        token_ids=list(range(n_tok)), positions=list(range(1, 1 + n_tok)),
        layer_indices=list(range(1, k + 1)),
        attributions=torch.randn(n_tok, k, generator=gen) * 0.05,
        lens_probs=torch.rand(n_tok, k, generator=gen), p_final=torch.rand(n_tok, generator=gen),
        p_baseline=torch.zeros(n_tok), convergence_delta=torch.zeros(n_tok),
        onset_layers=[1 + t % k for t in range(n_tok)])
    return {"id": f"big{i}", "index": i, "status": "ok", "seconds": 1.0, **result.to_dict()}


def test_html_heatmaps_are_small_palette_pngs() -> None:
    """Before: plot_result's full figure at 80 dpi, about 500 KB per 64-token record."""
    big = [big_line(i) for i in range(3)]
    page = render_html(summarize(big, n_boot=50), big)
    sections = re.findall(r'<section id="rec-\d+">.*?base64,([A-Za-z0-9+/=]+)"', page)
    assert len(sections) == 3
    for image in sections:
        png = base64.b64decode(image)
        assert png[25] == 3  # PNG colour type 3: a palette image
        width, height = struct.unpack(">II", png[16:24])
        # plot_heatmap's compact size at 72 dpi: 3.2 + 0.16 * 30 by 1.3 + 0.14 * 64 inches
        assert abs(width - 72 * 8.0) <= 2 and abs(height - 72 * 10.26) <= 2
        assert len(png) < 40_000, len(png)
    assert len(page.encode("utf-8")) < 250_000
