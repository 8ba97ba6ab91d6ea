"""The total effect and attribution patching through explain(), JSON, the table and the CLI."""

from __future__ import annotations

import json
import warnings

import pytest
import torch
from tiny_families import make_family
from tiny_tokenizer import word_tokenizer

from captum_iglens import IGLens, explain
from captum_iglens.cli import main
from captum_iglens.models import loading as models
from captum_iglens.results import IGLensResult

PROMPT = "w3 w5 w7 w9 w2 w4"


def _explain(effect: str, **kwargs):
    model = make_family("llama", seed=1).eval()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return model, explain(model, word_tokenizer(), PROMPT, max_new_tokens=3,
                              chat_template=False, effect=effect, **kwargs)


@pytest.mark.parametrize("effect", ["total", "atp"])
def test_explain_records_effect_method_and_steps(effect: str) -> None:
    steps = {} if effect == "atp" else {"n_steps": 4}  # AtP takes no steps (refused)
    model, result = _explain(effect, **steps)
    assert result.effect == effect
    assert (result.method, result.n_steps) == (("atp", 1) if effect == "atp"
                                               else ("prediction_aware", 4))
    # the same numbers as the lens on the teacher-forced sequence
    ids = torch.tensor([result.input_ids[:-1]])
    out = IGLens(model, effect=effect).attribute_details(
        ids, target=torch.tensor([result.token_ids]), positions=result.positions, **steps)
    assert torch.allclose(result.attributions, out.attributions[0], rtol=0, atol=1e-6)
    data = json.loads(result.to_json())
    assert data["effect"] == effect and data["method"] == result.method
    assert ("not a decomposition" in data["delta_meaning"]) == (effect == "atp")
    assert IGLensResult.from_dict(data).effect == effect
    table = result.format_table()
    assert ("not a decomposition" in table) == (effect == "atp")
    assert ("total effect" in table) == (effect == "total")
    assert "update" in result.baseline_description


def test_readout_json_is_unchanged() -> None:
    _, result = _explain("readout")
    data = result.to_dict()
    assert "effect" not in data and "delta_meaning" not in data


@pytest.fixture
def tiny_load(monkeypatch):
    model, tokenizer = make_family("llama", seed=1).eval(), word_tokenizer()
    monkeypatch.setattr(models, "load_model",
                        lambda spec=None, use_cache=True, device_map=None: (model, tokenizer))
    return model


@pytest.mark.parametrize("effect", ["total", "atp"])
def test_cli_explain_effect_writes_it_to_json(effect, tiny_load, tmp_path, capsys) -> None:
    path = tmp_path / "out.json"
    steps = [] if effect == "atp" else ["--n-steps", "4"]  # AtP takes no steps (refused)
    argv = ["explain", "--effect", effect, *steps, "--max-new-tokens", "2",
            "--no-chat-template", "--json", str(path), PROMPT]
    assert main(argv) == 0
    data = json.loads(path.read_text())
    data = data[0] if isinstance(data, list) else data
    assert data["effect"] == effect
    assert abs(sum(data["tokens"][0]["attributions"]) - data["tokens"][0]["delta_p"]
               - data["tokens"][0]["convergence_delta"]) <= 1e-6


@pytest.mark.parametrize("extra, message", [
    (["--baseline", "embedding"], "--baseline must be mean or zero"),
])
def test_cli_effect_refusals(extra, message, tiny_load, capsys) -> None:
    assert main(["explain", "--effect", "total", *extra, PROMPT]) == 2
    assert message in capsys.readouterr().err


def test_cli_effect_head_gates_write_head_credits(tiny_load, tmp_path) -> None:
    path = tmp_path / "heads.json"
    argv = ["explain", "--effect", "total", "--granularity", "sublayer", "--heads",
            "--n-steps", "4", "--max-new-tokens", "2", "--no-chat-template", "--json",
            str(path), PROMPT]
    assert main(argv) == 0
    data = json.loads(path.read_text())
    token = (data[0] if isinstance(data, list) else data)["tokens"][0]
    heads = torch.tensor(token["head_credits"]).double()
    attention = torch.tensor(token["attributions"][0::2]).double()
    # the heads and the rest add up to each attention credit (float32 rounding of each)
    whole = heads.sum(-1) + torch.tensor(token["head_rest"]).double()
    bound = 4 * torch.finfo(torch.float32).eps * (heads.abs().sum(-1) + attention.abs())
    assert bool(((whole - attention).abs() <= bound + 1e-12).all())


def test_cli_run_effect_is_fingerprinted(tiny_load, tmp_path, capsys) -> None:
    source = tmp_path / "in.jsonl"
    source.write_text(json.dumps({"id": "a", "prompt": PROMPT}) + "\n"
                      + json.dumps({"id": "b", "prompt": "w8 w6 w4"}) + "\n")
    out = tmp_path / "out.jsonl"
    argv = ["run", "--input", str(source), "--output", str(out), "--max-new-tokens", "2",
            "--no-chat-template", "--no-progress", "--n-steps", "4"]
    assert main([*argv, "--effect", "total"]) == 0
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    assert {line["effect"] for line in lines} == {"total"}
    assert {line["run"]["effect"] for line in lines} == {"total"}
    # resuming the file as a readout run would mix two kinds of credit: refused
    assert main([*argv, "--effect", "readout"]) != 0
    assert "effect: 'total' there, 'readout' now" in capsys.readouterr().err


@pytest.mark.parametrize("baselines", [None, "zero"])
def test_captum_llm_attribution_with_total_effect(baselines) -> None:
    from captum.attr import TextTokenInput

    from captum_iglens import LLMIGLensAttribution

    model, tok = make_family("llama", seed=1).eval(), word_tokenizer()
    lens = IGLens(model, effect="total")
    kwargs = {} if baselines is None else {"baselines": baselines}
    res = LLMIGLensAttribution(lens, tok).attribute(TextTokenInput(PROMPT, tok),
                                                    target=" w7 w8", n_steps=4, **kwargs)
    assert res.effect == "total" and res.token_attr.shape == (2, 2)
    assert res.baseline == ("reference ids" if baselines is None else "zero")
    assert bool((res.baseline_attr == 0).all())
    gap = res.token_attr.double().sum(-1) - (res.output_probs - res.p_baseline).double()
    assert float(gap.abs().max()) <= 4 * torch.finfo(torch.float32).eps


def test_plot_names_the_effect() -> None:
    import matplotlib

    matplotlib.use("Agg")
    _, result = _explain("atp")
    fig = result.plot()
    texts = [t.get_text() for ax in fig.axes for t in (ax.title, ax.yaxis.label)]
    assert any("AtP estimate (not additive)" in t for t in texts)
    assert "not a decomposition" in fig._supxlabel.get_text()


def test_summarize_labels_atp_and_keeps_effects_apart(tiny_load, tmp_path, capsys) -> None:
    source = tmp_path / "in.jsonl"
    source.write_text(json.dumps({"id": "a", "prompt": PROMPT}) + "\n")
    outs = {}
    for effect in ("atp", "readout"):
        outs[effect] = tmp_path / f"{effect}.jsonl"
        assert main(["run", "--input", str(source), "--output", str(outs[effect]),
                     "--max-new-tokens", "2", "--no-chat-template", "--no-progress",
                     "--effect", effect]) == 0
    capsys.readouterr()
    assert main(["summarize", str(outs["atp"])]) == 0
    assert "not a decomposition" in capsys.readouterr().out
    mixed = tmp_path / "mixed.jsonl"
    mixed.write_text(outs["atp"].read_text() + outs["readout"].read_text())
    assert main(["summarize", "--allow-mixed-runs", str(mixed)]) != 0
    assert "not comparable" in capsys.readouterr().err


@pytest.mark.parametrize("effect, name", [("readout", "readout credit"),
                                          ("total", "total effect"),
                                          ("atp", "AtP estimate (not additive)")])
def test_summary_table_plot_and_html_name_the_effect(effect, name, tiny_load,
                                                     tmp_path) -> None:
    from captum_iglens.summary.html import render_html
    from captum_iglens.summary.plot import plot_summary
    from captum_iglens.summary.pool import load_results, summarize

    source = tmp_path / "in.jsonl"
    source.write_text(json.dumps({"id": "a", "prompt": PROMPT}) + "\n"
                      + json.dumps({"id": "b", "prompt": "w8 w6 w4"}) + "\n")
    out = tmp_path / "out.jsonl"
    assert main(["run", "--input", str(source), "--output", str(out), "--max-new-tokens", "2",
                 "--no-chat-template", "--no-progress",
                 *([] if effect == "atp" else ["--n-steps", "4"]), "--effect", effect]) == 0
    loaded = load_results(str(out))
    records = loaded[0] if isinstance(loaded, tuple) else loaded
    summary = summarize(records, n_boot=20)
    text = summary.format()
    assert f"Per-layer mean {name} over" in text
    others = {"readout credit", "total effect", "AtP estimate"} - {name.split(" (")[0]}
    assert not any(f"Per-layer mean {o}" in text for o in others)
    fig = plot_summary(summary)
    labels = [t.get_text() for ax in fig.axes for t in (ax.title, ax.yaxis.label)]
    assert f"mean {name} per layer over" in labels[0] and labels[1].startswith(name)
    assert name in fig._suptitle.get_text()
    page = render_html(summary, records, max_records=0)
    assert f"IG-Lens run summary ({name})" in page.replace("&#x27;", "'")
