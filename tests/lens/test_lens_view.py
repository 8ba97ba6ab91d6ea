"""A per-layer readout's lens terms, shown apart wherever credits are read, and its identity.

With a fitted lens the credits are block terms and ``lens_change`` the lens terms; the text
table, the JSON, the plots and the run summary show the lens terms apart, and credits plus lens
terms add up to ``p_final - p_baseline``. Each term is a float32 rounding of an exact float64
difference (``<= eps/2 |term|``) and the unrounded terms telescope exactly, so
``|sum credits + sum lens terms - delta| <= eps * (sum |terms| + |delta|)``. The table prints 6
decimals (``<= 5e-7`` each) and layer cells 5 decimals (``<= 5e-6``). A logit-lens result,
its JSON and its run fingerprint carry none of it (as before).
"""

from __future__ import annotations

import json
import re

import pytest
import torch
from conftest import make_tiny
from tiny_tokenizer import word_tokenizer
from torch import nn

from captum_iglens import IGLens
from captum_iglens.lens.fit import load_tuned_lens_folder
from captum_iglens.lens.layer_readout import lens_identity, lens_key
from captum_iglens.lens.translators import TunedLens, load_lens
from captum_iglens.results import IGLensResult
from captum_iglens.run.fingerprint import RunMismatchError, check_resume, run_fingerprint
from captum_iglens.run.records import read_records
from captum_iglens.run.resume import fingerprint_settings
from captum_iglens.run.runner import run_records
from captum_iglens.run.settings import RunSettings
from captum_iglens.settings import AttributionSettings, GenerationSettings, ReportSettings
from captum_iglens.summary.html import render_html
from captum_iglens.summary.plot import plot_summary
from captum_iglens.summary.pool import summarize
from captum_iglens.text.explain_prompt import explain

EPS = torch.finfo(torch.float32).eps
PROMPT, TARGET = "w1 w2 w3", "w4 w5 w6"


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch):
    monkeypatch.setenv("CAPTUM_IGLENS_CACHE", str(tmp_path / "cache"))


@pytest.fixture(scope="module")
def model() -> nn.Module:
    return make_tiny("llama").eval()


@pytest.fixture(scope="module")
def tok():
    return word_tokenizer()


def _tuned(model: nn.Module, seed: int) -> TunedLens:
    """A tuned lens with random translators (no fit): its lens terms are not zero."""
    lens = TunedLens.for_model(model)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for layer in lens.translators:
            d = layer.weight.shape[0]
            layer.weight.copy_(0.3 * torch.randn(d, d, generator=gen) / d ** 0.5)
            layer.bias.copy_(0.1 * torch.randn(d, generator=gen))
    return lens.requires_grad_(False)


@pytest.fixture(scope="module")
def tuned(model) -> TunedLens:
    return _tuned(model, 0)


def _explain(model, tok, lens=None) -> IGLensResult:
    return explain(model, tok, PROMPT, target=TARGET, chat_template=False, layer_readout=lens)


def _adds_up(credits: torch.Tensor, lens: torch.Tensor, delta: torch.Tensor) -> None:
    credits, lens, delta = credits.double(), lens.double(), delta.double()
    err = (credits.sum(-1) + lens.sum(-1) - delta).abs()
    bound = EPS * (credits.abs().sum(-1) + lens.abs().sum(-1) + delta.abs())
    assert (err <= bound).all(), float((err - bound).max())


def _row(table: str, name: str) -> list[float]:
    """The numbers of the table's rows named ``name`` (every block of tokens, in order)."""
    values: list[float] = []
    for line in table.splitlines():
        head, _, cells = line.partition("|")
        if head.strip() == name:
            values += [float(c.split()[0]) for c in cells.split("|") if c.strip()]
    return values


def test_the_table_shows_the_lens_terms_and_they_add_up(model, tok, tuned) -> None:
    result = _explain(model, tok, tuned)
    assert result.lens_change is not None
    n_tok, k = result.attributions.shape
    assert float(result.lens_change.abs().max()) > 1e-4  # the lens changes the readout
    _adds_up(result.attributions, result.lens_change, result.delta_p)
    table = result.format_table()
    lens_row, sums, deltas = _row(table, "lens"), _row(table, "sum"), _row(table, "Δp")
    assert len(lens_row) == n_tok
    for t in range(n_tok):
        # the printed lens sum is the tensor's, and sum + lens = Δp up to the printing
        assert abs(lens_row[t] - float(result.lens_change[t].sum())) <= 5e-7 + 4 * EPS
        assert abs(sums[t] + lens_row[t] - deltas[t]) <= 3 * 5e-7 + 4 * EPS
    # per layer: each layer's row holds its IG credit first, then (below) its lens term
    names = result.layer_names
    for j, name in enumerate(names):
        rows = _row(table, name)  # the IG credit per token; then the lens term per token
        credits, terms = rows[:n_tok], rows[n_tok:]
        assert len(terms) == n_tok, name
        for t in range(n_tok):
            assert abs(terms[t] - float(result.lens_change[t, j])) <= 5e-6 + 4 * EPS
            assert abs(credits[t] - float(result.attributions[t, j])) <= 5e-6 + 4 * EPS
    assert "max |sum + lens - Δp|" in table and "tuned" in table
    assert tuned.identity()["digest"] in table
    assert all(len(line) <= 100 for line in table.splitlines())


def test_the_onset_follows_the_rule_the_legend_states(model, tok, tuned) -> None:
    """Under a per-layer lens the onset is taken on the block terms (the lens terms are no
    layer's doing) and the legend says so: each onset is the first layer from which the
    cumulative block terms stay at or beyond ``frac`` times their own sum."""
    from captum_iglens.plot.credits import _onset_words

    result = _explain(model, tok, tuned)
    legend = " ".join(result.format_table().split())
    assert "the block terms' sum, lens terms left out" in legend
    assert "block terms' sum" in _onset_words(result)
    for t, onset in enumerate(result.onset_layers):
        credits = result.attributions[t].double()
        total, cum = float(credits.sum()), credits.cumsum(0)
        reached = [bool((cum[j:] * (1 if total >= 0 else -1)
                         >= result.onset_frac * abs(total)).all()) for j in range(len(cum))]
        expected = result.layer_indices[reached.index(True)] if any(reached) else None
        assert onset == expected, (t, onset, expected)


def test_a_logit_lens_result_is_as_before(model, tok) -> None:
    result = _explain(model, tok)
    assert result.lens_change is None and result.lens is None
    table = result.format_table()
    assert "lens term" not in table and _row(table, "lens") == []
    assert "max |sum - Δp|" in table and "logit-lens readout f(h_L)" in table
    data = result.to_dict()
    assert "lens" not in data and all("lens_change" not in t for t in data["tokens"])
    fig = result.plot()
    assert not any("lens term" in ax.get_title() for ax in fig.axes)
    assert [ax.get_title() for ax in fig.axes][1] == "logit-lens trajectory per token"


def test_the_json_names_the_lens_and_its_terms_add_up(model, tok, tuned, tmp_path) -> None:
    result = _explain(model, tok, tuned)
    data = json.loads(result.to_json())
    assert data["lens"] == tuned.identity()
    assert data["lens"]["kind"] == "tuned" and re.fullmatch(r"[0-9a-f]{16}",
                                                            data["lens"]["digest"])
    for entry in data["tokens"]:
        _adds_up(torch.tensor(entry["attributions"]), torch.tensor(entry["lens_change"]),
                 torch.tensor(entry["delta_p"]))
    back = IGLensResult.from_dict(data)
    assert back.lens == data["lens"]
    assert torch.equal(back.lens_change, result.lens_change)  # exact: float32 through JSON


def test_a_fitted_lens_identity_tells_lenses_apart(model, tuned, tmp_path) -> None:
    other = _tuned(model, 1)
    same = _tuned(model, 0)
    assert tuned.identity()["digest"] != other.identity()["digest"]
    assert tuned.identity() == same.identity()  # the same tensors, the same identity
    path = tuned.save(tmp_path / "t.pt")
    loaded = load_lens(path, model)
    assert loaded.identity()["digest"] == tuned.identity()["digest"]
    assert loaded.identity()["source"] == str(path)
    assert lens_key(loaded) == tuned.identity()["digest"]
    folder = tmp_path / "tl"
    folder.mkdir()
    d, n = model.config.hidden_size, model.config.num_hidden_layers
    (folder / "config.json").write_text(json.dumps({"d_model": d, "num_hidden_layers": n,
                                                    "bias": True}))
    torch.save({f"layer_translators.{i}.{p}": v for i, layer in enumerate(tuned.translators)
                for p, v in layer.state_dict().items()}, folder / "params.pt")
    from_folder = load_tuned_lens_folder(folder, model)
    assert from_folder.identity()["digest"] == tuned.identity()["digest"]
    assert from_folder.identity()["source"] == str(folder)
    # the logit lens has no identity (results stay as they were); a custom readout its class
    assert lens_identity(IGLens(model).spec.lens) is None
    assert lens_key(IGLens(model).spec.lens) is None

    class Mine:
        def __call__(self, hidden, layer):
            return tuned(hidden, layer)

    assert lens_identity(Mine()) == {"kind": "custom", "name": "Mine"}


def _settings(lens: str = "logit", key=None, **extra) -> dict:
    return {**fingerprint_settings(AttributionSettings(), ReportSettings(),
                                   GenerationSettings(), stride=1, lens=lens, lens_key=key),
            **extra}


def test_the_fingerprint_names_which_fitted_lens(model, tuned, tmp_path) -> None:
    other = _tuned(model, 1)
    layers, units = [1, 2], "probability"
    a = run_fingerprint(model, layers=layers, units=units,
                        settings=_settings("tuned", lens_key(tuned)))
    b = run_fingerprint(model, layers=layers, units=units,
                        settings=_settings("tuned", lens_key(other)))
    assert a["lens_digest"] == tuned.identity()["digest"]
    assert a["digest"] != b["digest"]
    with pytest.raises(RunMismatchError, match="lens_digest"):
        check_resume([{"run": a}], b, tmp_path / "out.jsonl")
    check_resume([{"run": a}], a, tmp_path / "out.jsonl")  # the same lens resumes
    # the logit lens: no lens entries, the digest of a run that never named a lens
    plain = run_fingerprint(model, layers=layers, units=units, settings=_settings())
    legacy = run_fingerprint(model, layers=layers, units=units, settings={
        key: value for key, value in _settings().items() if key not in ("lens", "lens_digest")})
    assert "lens" not in plain and "lens_digest" not in plain
    assert plain["digest"] == legacy["digest"]
    assert _settings() == _settings(key="ignored for the logit lens")


def _records(tmp_path):
    path = tmp_path / "in.jsonl"
    path.write_text("".join(json.dumps({"id": i, "prompt": p, "answer": TARGET}) + "\n"
                            for i, p in enumerate(["w1 w2", "w3 w4 w5"])))
    return read_records(path)


def test_a_run_resumed_with_another_fitted_lens_is_refused(model, tok, tuned,
                                                           tmp_path) -> None:
    out, settings = tmp_path / "out.jsonl", RunSettings(chat_template=False)
    records = _records(tmp_path)
    run_records(model, tok, records, out, settings, lens=IGLens(model, lens=tuned),
                progress=False)
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    assert lines[0]["run"]["lens"] == "tuned"
    assert lines[0]["run"]["lens_digest"] == tuned.identity()["digest"]
    assert lines[0]["lens"] == tuned.identity()
    with pytest.raises(RunMismatchError, match="lens_digest"):
        run_records(model, tok, records, out, settings,
                    lens=IGLens(model, lens=_tuned(model, 1)), progress=False)
    # the summary: a lens-term column, grey hatched bars, and credits + lens terms add up
    records_ok = [line for line in lines if line.get("status") == "ok"]
    summary = summarize(records_ok, n_boot=20)
    assert summary.mean_lens_change is not None
    want = [sum(t["lens_change"][j] for r in records_ok for t in r["tokens"])
            / summary.n_tokens for j in range(len(summary.layers))]
    for got, expected in zip(summary.mean_lens_change, want, strict=True):
        assert abs(got - expected) <= 8 * EPS * (abs(expected) + 1e-3)
    total = sum(summary.mean_credit) + sum(summary.mean_lens_change)
    scale = sum(abs(v) for v in (*summary.mean_credit, *summary.mean_lens_change))
    assert abs(total - summary.mean_delta_p) <= 8 * EPS * (scale + abs(summary.mean_delta_p))
    text = summary.format()
    assert "lens term" in text and "sum of credits + lens terms" in text
    per_layer = summary.to_dict()["per_layer"]
    assert [e["mean_lens_change"] for e in per_layer] == pytest.approx(
        summary.mean_lens_change, abs=0)
    fig = plot_summary(summary)
    labels = [text.get_text() for ax in fig.axes if ax.get_legend() is not None
              for text in ax.get_legend().get_texts()]
    assert any("lens term" in label for label in labels)
    bars = [c for ax in fig.axes for c in ax.containers if "lens term" in str(c.get_label())]
    assert bars and [p.get_hatch() for p in bars[0]] == ["///"] * len(summary.layers)
    heights = [p.get_height() for p in bars[0]]
    assert heights == pytest.approx(summary.mean_lens_change, abs=0)
    assert "grey hatched" in render_html(summary, records_ok)


def test_the_plots_draw_the_lens_terms_apart(model, tok, tuned) -> None:
    from captum_iglens.plot.credits import plot_heatmap

    result = _explain(model, tok, tuned)
    for fig in (result.plot(), plot_heatmap(result)):
        panels = [ax for ax in fig.axes if ax.get_title().startswith("lens terms")]
        assert len(panels) == 1
        shown = panels[0].get_images()[0].get_array()
        assert torch.equal(torch.tensor(shown.data), result.lens_change.float())  # exact: a copy
        legend = [t.get_text() for t in panels[0].get_legend().get_texts()]
        assert legend and "lens term" in legend[0]


def test_a_fitted_lens_run_is_never_skipped_before_the_load() -> None:
    """Which fitted lens is known only with the model: a rerun loads it and compares."""
    from captum_iglens.run.resume import nothing_left, planned_entries

    for lens, want in (("logit", True), ("tuned", False)):
        planned = planned_entries(_settings(lens), "probability", [1, 2])
        lines = [{"id": "a", "input_hash": "h", "run": {**planned, "source": "s",
                                                        "digest": "d"}}]
        assert nothing_left(lines, {"a": "h"}, planned, "s") is want, lens
