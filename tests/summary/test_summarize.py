"""`iglens summarize`: loading a results .jsonl (torn last line), the pooled statistics
against direct numpy computations on real IG-Lens results of a tiny random model, the
refusal to pool incomparable records, and the command's JSON, figure and HTML outputs."""

from __future__ import annotations

import base64
import copy
import json
import re
import warnings
from collections import Counter

import matplotlib

matplotlib.use("Agg")

import numpy as np  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402
from _tolerance import completeness_tol  # noqa: E402
from conftest import VOCAB, make_tiny  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402

from captum_iglens import explain_ids  # noqa: E402
from captum_iglens.cli import main  # noqa: E402
from captum_iglens.models import loading as models
from captum_iglens.summary.bootstrap import cluster_mean_ci
from captum_iglens.summary.html import render_html  # noqa: E402
from captum_iglens.summary.plot import plot_summary  # noqa: E402
from captum_iglens.summary.pool import RunSummary, load_results, summarize

LAYERS = [0, 2, 3, 4]
N_RECORDS = 8
NASTY_PROMPT = '<script>alert("x")</script> & \'q\' é'


@pytest.fixture(scope="module")
def results():
    """Real IGLensResults of a tiny llama: 8 prompts, answers of 1 to 3 tokens."""
    model = make_tiny("llama", n_layers=4)
    gen = torch.Generator().manual_seed(3)
    out = []
    for i in range(N_RECORDS):
        ids = torch.randint(4, VOCAB, (8,), generator=gen).tolist()
        prompt = NASTY_PROMPT if i == 2 else f"prompt {i}"
        out.append(explain_ids(model, ids[:5], ids[5:6 + i % 3], layers=LAYERS, prompt=prompt))
    return out


def ok_line(result, i: int, seconds: float | None = None) -> dict:
    return {"id": f"rec{i}", "index": i, "status": "ok",
            "seconds": 0.25 * ((i * 5) % N_RECORDS) + 0.1 if seconds is None else seconds,
            **result.to_dict()}


def error_line(i: int, message: str, kind: str = "ValueError", prompt=None) -> dict:
    return {"id": f"bad{i}", "index": i, "status": "error", "error": message,
            "error_type": kind, "prompt": prompt}


@pytest.fixture(scope="module")
def lines(results):
    return [ok_line(r, i) for i, r in enumerate(results)]


ERRORS = [error_line(N_RECORDS, "The answer has no tokens: nothing to explain."),
          error_line(N_RECORDS + 1, "CUDA out of memory <oops> & more", "RuntimeError",
                     prompt="a <b>bold</b> prompt")]


def write(path, entries, tail: bytes = b"") -> str:
    body = b"".join(json.dumps(e, ensure_ascii=False).encode("utf-8") + b"\n\n"
                    for e in entries)
    path.write_bytes(body + tail)
    return str(path)


def torn_tail(entry: dict) -> bytes:
    """The first bytes of a line, cut inside a two-byte UTF-8 character."""
    raw = json.dumps(entry, ensure_ascii=False).encode("utf-8")
    cut = raw.index("é".encode()) + 1
    return raw[:cut]


def all_tokens(results) -> dict[str, np.ndarray]:
    """Every token of the real results, from the tensors (not the JSON)."""
    return {
        "credits": torch.cat([r.attributions.double() for r in results]).numpy(),
        "delta": torch.cat([r.convergence_delta.double() for r in results]).numpy(),
        "delta_p": torch.cat([r.delta_p.double() for r in results]).numpy(),
        "onsets": [o for r in results for o in r.onset_layers],
    }


# ----------------------------------------------------------------------------- loading
def test_load_skips_torn_last_line_with_a_warning(lines, tmp_path) -> None:
    torn_source = dict(lines[0], id="torn", prompt="é" * 5)
    path = write(tmp_path / "r.jsonl", lines + ERRORS, torn_tail(torn_source))
    with pytest.warns(UserWarning, match="torn last line") as caught:
        records, errors, torn = load_results(path)
    assert len(caught) == 1 and "line 21" in str(caught[0].message)  # blank lines counted
    assert torn == 1
    assert [r["id"] for r in records] == [f"rec{i}" for i in range(N_RECORDS)]
    assert [e["id"] for e in errors] == ["bad8", "bad9"]
    assert records == lines and errors == ERRORS


def test_complete_file_loads_without_warning(lines, tmp_path) -> None:
    path = write(tmp_path / "r.jsonl", lines)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        records, errors, torn = load_results(path)
    assert (len(records), errors, torn) == (N_RECORDS, [], 0)


def test_torn_line_in_the_middle_is_skipped_with_its_own_warning(lines, tmp_path) -> None:
    path = tmp_path / "r.jsonl"
    path.write_bytes(json.dumps(lines[0]).encode() + b"\n" + torn_tail(dict(lines[1],
                     prompt="é")) + b"\n" + json.dumps(lines[2]).encode() + b"\n")
    with pytest.warns(UserWarning, match="line 2, a torn line followed by more lines"):
        records, _, torn = load_results(str(path))
    assert torn == 1 and [r["id"] for r in records] == ["rec0", "rec2"]


@pytest.mark.parametrize("line, match", [('{"foo": 1}', "'status' is None"),
                                         ("[1, 2]", "expected a JSON object"),
                                         ('{"status": "done"}', "'status' is 'done'")])
def test_lines_of_another_kind_are_refused(tmp_path, line, match) -> None:
    path = tmp_path / "r.jsonl"
    path.write_text(line + "\n", encoding="utf-8")
    with pytest.raises(ValueError, match=match):
        load_results(str(path))


def test_a_file_of_only_torn_or_blank_lines_is_refused(tmp_path) -> None:
    path = tmp_path / "r.jsonl"
    path.write_text('\n\n{"id": 1, "sta', encoding="utf-8")
    with pytest.warns(UserWarning, match="torn"), pytest.raises(ValueError, match="no result"):
        load_results(str(path))


# ----------------------------------------------------------------------------- statistics
def test_per_layer_mean_and_completeness_equal_direct_computations(results, lines) -> None:
    summary = summarize(lines, ERRORS, n_boot=200)
    direct = all_tokens(results)
    assert summary.layers == LAYERS and summary.layer_names == ["emb", "L2", "L3", "L4"]
    assert summary.n_ok == N_RECORDS and summary.n_failed == 2
    assert summary.n_tokens == len(direct["delta"]) == sum(len(r.tokens) for r in results)
    # the JSON holds float(float32) values: the means agree up to float64 summation order
    np.testing.assert_allclose(summary.mean_credit, direct["credits"].mean(0), rtol=1e-12,
                               atol=1e-15)
    # exact: the max of the same float values, no rounding
    assert summary.max_abs_convergence_delta == float(np.abs(direct["delta"]).max())
    worst = int(np.abs(direct["delta"]).argmax())
    lengths = np.cumsum([len(r.tokens) for r in results])
    record = int(np.searchsorted(lengths, worst, side="right"))
    assert summary.worst["id"] == f"rec{record}"
    # the per-layer means add up to the mean delta_p (Proposition 1, averaged)
    tol = float(completeness_tol(torch.cat([r.attributions for r in results]),
                                 torch.cat([r.delta_p for r in results])).max())
    assert abs(sum(summary.mean_credit) - summary.mean_delta_p) <= tol
    assert summary.mean_delta_p == pytest.approx(direct["delta_p"].mean(), rel=1e-12)


def test_onset_counts_equal_a_direct_count(results, lines) -> None:
    summary = summarize(lines, n_boot=50)
    counts = Counter(all_tokens(results)["onsets"])
    assert summary.onset_counts == [counts.get(layer, 0) for layer in LAYERS]
    assert sum(summary.onset_counts) == summary.n_tokens


def test_ci_contains_the_mean_and_shrinks_with_more_records(lines) -> None:
    one = summarize(lines, n_boot=2000, seed=1)
    mean, low, high = (np.array(x) for x in (one.mean_credit, one.ci_low, one.ci_high))
    assert ((low <= mean) & (mean <= high)).all() and (high > low).all()
    more = [dict(line, id=f"{line['id']}-{copy_}") for copy_ in range(4) for line in lines]
    four = summarize(more, n_boot=2000, seed=1)
    np.testing.assert_allclose(four.mean_credit, one.mean_credit, rtol=1e-12, atol=1e-15)
    width_one, width_four = high - low, np.array(four.ci_high) - np.array(four.ci_low)
    # 4x the records: about half the width (1 / sqrt(4))
    assert (width_four < 0.7 * width_one).all() and (width_four > 0.3 * width_one).all()


def test_ci_resamples_records_not_tokens(lines) -> None:
    """Repeating every token of every record 10 times adds no independent evidence: a
    record-clustered CI stays the same (a token-level bootstrap would shrink ~3x)."""
    base = summarize(lines, n_boot=500, seed=2)
    repeated = []
    for line in lines:
        entry = copy.deepcopy(line)
        entry["tokens"] = entry["tokens"] * 10
        repeated.append(entry)
    same = summarize(repeated, n_boot=500, seed=2)
    assert same.n_tokens == 10 * base.n_tokens
    np.testing.assert_allclose(same.ci_low, base.ci_low, rtol=1e-9, atol=1e-15)
    np.testing.assert_allclose(same.ci_high, base.ci_high, rtol=1e-9, atol=1e-15)


def test_ci_agrees_with_a_hand_rolled_cluster_bootstrap(results) -> None:
    sums = np.stack([r.attributions.double().sum(0).numpy() for r in results])
    counts = np.array([len(r.tokens) for r in results], dtype=np.float64)
    low, high = cluster_mean_ci(sums, counts, n_boot=4000, seed=0)
    rng = np.random.default_rng(12345)
    pick = rng.integers(0, len(results), (4000, len(results)))
    draws = sums[pick].sum(1) / counts[pick].sum(1)[:, None]
    ref_low, ref_high = np.percentile(draws, [2.5, 97.5], axis=0)
    width = ref_high - ref_low
    assert (np.abs(low - ref_low) <= 0.15 * width).all()
    assert (np.abs(high - ref_high) <= 0.15 * width).all()


def test_one_record_has_no_ci(lines) -> None:
    summary = summarize(lines[:1], n_boot=50)
    assert np.isnan(summary.ci_low).all() and np.isnan(summary.ci_high).all()
    assert "no CI: it needs at least 2 records" in summary.format()
    assert all(v["ci_low"] is None for v in summary.to_dict()["per_layer"])


def test_only_failures(tmp_path) -> None:
    summary = summarize([], ERRORS, n_boot=50)
    assert (summary.n_ok, summary.n_failed, summary.n_tokens, summary.layers) == (0, 2, 0, [])
    assert "no record was explained" in summary.format()
    json.dumps(summary.to_dict(), allow_nan=False)
    assert "bad9" in render_html(summary, [])
    with pytest.raises(ValueError, match="no record was explained"):
        plot_summary(summary)


def test_to_dict_is_strict_json(lines) -> None:
    data = json.loads(json.dumps(summarize(lines, ERRORS, n_boot=50).to_dict(),
                                 allow_nan=False))
    assert [row["name"] for row in data["per_layer"]] == ["emb", "L2", "L3", "L4"]
    assert data["records_ok"] == N_RECORDS and data["records_failed"] == 2
    assert data["completeness"]["tokens"] == data["tokens"]


@pytest.mark.parametrize("change, words", [
    ({"units": "log-probability"}, "units log-probability"),
    ({"layers": [0, 4]}, "layers [0, 4]"),
    ({"contrastive": True}, "contrastive:"),
])
def test_incomparable_records_are_refused(lines, change, words) -> None:
    mixed = [dict(line, **change) if i in (1, 5) else line for i, line in enumerate(lines)]
    with pytest.raises(ValueError) as info:
        summarize(mixed, n_boot=50)
    message = str(info.value)
    assert words in message and "ids rec1, rec5" in message and "separately" in message
    assert "ids rec0, rec2, rec3, rec4, rec6, rec7" in message
    assert "\n" not in message  # the CLI prints its first line only
    extra = [dict(line, id=f"{line['id']}b") for line in lines[:3]]
    with pytest.raises(ValueError, match=r"ids rec0, rec2, rec3, rec4, rec6, rec7 and 3 more"):
        summarize(mixed + extra, n_boot=50)


def test_contrastive_and_document_records(lines) -> None:
    marked = [dict(line, contrastive=True, document=i < 3) for i, line in enumerate(lines)]
    summary = summarize(marked, n_boot=50)
    assert summary.contrastive and summary.n_documents == 3
    assert "p(y) - p(foil)" in summary.format() and "3 in document mode" in summary.format()


def test_plot_summary_shows_the_summary(lines) -> None:
    summary = summarize(lines, n_boot=200)
    fig = plot_summary(summary)
    assert isinstance(fig, Figure)
    ax_mean, ax_onset = fig.axes[:2]
    np.testing.assert_array_equal(ax_mean.get_lines()[-1].get_ydata(), summary.mean_credit)
    assert ax_mean.collections, "no CI band"
    assert [p.get_height() for p in ax_onset.patches] == summary.onset_counts


# ----------------------------------------------------------------------------- command line
@pytest.fixture
def no_load(monkeypatch):
    def load_model(spec=None, use_cache=True, device_map=None):
        pytest.fail("iglens summarize loaded a model")

    monkeypatch.setattr(models, "load_model", load_model)


def test_cli_writes_json_plot_and_html(lines, tmp_path, capsys, no_load) -> None:
    torn_source = dict(lines[0], id="torn-record", prompt="é")
    path = write(tmp_path / "results.jsonl", lines + ERRORS, torn_tail(torn_source))
    out = {name: str(tmp_path / name) for name in ("s.json", "s.png", "s.html")}
    status = main(["summarize", path, "--json", out["s.json"], "--plot", out["s.png"],
                   "--html", out["s.html"], "--n-boot", "300", "--seed", "4",
                   "--html-max-records", "3"])
    captured = capsys.readouterr()
    assert status == 0, captured.err
    assert "iglens: warning:" in captured.err and "torn last line" in captured.err
    assert "Failed records (2)" in captured.out
    assert all(len(line) <= 100 for line in captured.out.splitlines())

    data = json.loads(open(out["s.json"], encoding="utf-8").read())
    direct = summarize(lines, ERRORS, n_boot=300, seed=4, torn=1).to_dict()
    assert data == {"results": path, **json.loads(json.dumps(direct))}
    assert open(out["s.png"], "rb").read(8) == b"\x89PNG\r\n\x1a\n"

    page = open(out["s.html"], encoding="utf-8").read()
    check_html(page, lines)
    assert "Heatmaps of the first 3 of 8 records only" in page
    assert len(re.findall(r'<section id="rec-\d+">', page)) == 3
    assert "torn-record" not in page


def test_cli_only_splits_a_run_mixing_contrastive_and_plain(lines, tmp_path, capsys,
                                                              no_load) -> None:
    """One run's file with contrastive and plain records: refused as a whole (pointing to
    --only), and each --only summary equals summarizing that group's records alone."""
    foiled = []
    for i, line in enumerate(lines):
        if i in (1, 5):
            line = copy.deepcopy(line)
            line["tokens"] = [dict(t, contrast_id=7, contrast_token="w3") for t in line["tokens"]]
        foiled.append(line)
    path = write(tmp_path / "mixed.jsonl", foiled + ERRORS)
    assert main(["summarize", path, "--n-boot", "50"]) == 1
    assert "--only plain" in capsys.readouterr().err
    for only, picked in (("plain", [0, 2, 3, 4, 6, 7]), ("contrastive", [1, 5])):
        out = str(tmp_path / f"{only}.json")
        assert main(["summarize", path, "--only", only, "--json", out, "--n-boot", "50"]) == 0
        capsys.readouterr()
        data = json.loads(open(out, encoding="utf-8").read())
        direct = summarize([foiled[i] for i in picked], ERRORS, n_boot=50).to_dict()
        assert data == {"results": path, **json.loads(json.dumps(direct))}
        assert data["records_ok"] == len(picked) and data["records_failed"] == 2


def check_html(page: str, lines: list[dict]) -> None:
    """Self-contained, every id present, images decodable, anchors resolve, text escaped."""
    for entry in lines + ERRORS:
        assert entry["id"] in page
    images = re.findall(r'<img src="data:image/png;base64,([A-Za-z0-9+/=]+)"', page)
    assert len(images) >= 2
    assert all(base64.b64decode(image)[:4] == b"\x89PNG" for image in images)
    targets = set(re.findall(r'id="([^"]+)"', page))
    links = re.findall(r'href="#([^"]*)"', page)
    assert links and all(link in targets for link in links)
    assert not re.search(r'(src|href)="(?!data:|#)', page), "external asset"
    assert "<script" not in page
    assert "&lt;script&gt;alert(&quot;x&quot;)&lt;/script&gt; &amp; &#x27;q&#x27; é" in page
    assert "&lt;b&gt;bold&lt;/b&gt;" in page and "&lt;oops&gt; &amp; more" in page


def test_html_without_cap_links_every_record(lines, tmp_path) -> None:
    summary = summarize(lines[:3], ERRORS, n_boot=50)
    page = render_html(summary, lines[:3], max_records=200)
    check_html(page, lines[:3])
    assert "Heatmaps of the first" not in page
    assert re.findall(r'<section id="(rec-\d+)">', page) == ["rec-0", "rec-1", "rec-2"]


@pytest.mark.parametrize("argv, words", [
    (["summarize", "missing.jsonl"], "does not exist"),
    (["summarize", "{tmp}"], "is a folder"),
    (["summarize", "{file}", "--html", "{tmp}/no/such/page.html"], "does not exist"),
    (["summarize", "{file}", "--n-boot", "0"], "--n-boot must be >= 1"),
    (["summarize", "{file}", "--plot", "{tmp}/x.nope"], "use one of the extensions"),
])
def test_cli_usage_errors(lines, tmp_path, capsys, no_load, argv, words) -> None:
    path = write(tmp_path / "r.jsonl", lines[:2])
    argv = [a.format(tmp=tmp_path, file=path) for a in argv]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("iglens: error:") and words in err[0]


def test_cli_mixed_units_is_a_one_line_runtime_error(lines, tmp_path, capsys, no_load) -> None:
    path = write(tmp_path / "r.jsonl", [lines[0], dict(lines[1], units="log-probability")])
    assert main(["summarize", path]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "ids rec0" in err[0] and "ids rec1" in err[0]


def test_help_lists_summarize(capsys) -> None:
    assert main(["--help"]) == 0
    assert "summarize" in capsys.readouterr().out.split("commands:")[1]


def test_run_summary_is_a_dataclass_with_format(lines) -> None:
    summary = summarize(lines, n_boot=50)
    assert isinstance(summary, RunSummary) and str(summary) == summary.format()


def test_a_foil_in_the_tokens_makes_a_record_contrastive(lines) -> None:
    foiled = copy.deepcopy(lines[3])
    foiled["tokens"] = [dict(t, contrast_id=7, contrast_token="w3") for t in foiled["tokens"]]
    with pytest.raises(ValueError, match=r"contrastive: ids rec3\b"):
        summarize([*lines[:3], foiled], n_boot=50)
