"""The `iglens compare` sub-command and the main command's --plot, on the embedded SmolLM2."""

from __future__ import annotations

import json

import matplotlib

matplotlib.use("Agg")

import pytest  # noqa: E402
import torch  # noqa: E402

from captum_iglens import cli, cli_compare  # noqa: E402
from captum_iglens.text import build_prompt_ids, generate_answer  # noqa: E402

PROMPT = "What is the capital of France?"


@pytest.fixture
def patched_load(smollm2, monkeypatch):
    """Reuse the session's SmolLM2 instead of loading it again in every command."""
    monkeypatch.setattr(cli, "load", lambda args: smollm2)
    monkeypatch.setattr(cli_compare, "load", lambda args: smollm2)
    return smollm2


def test_compare_json_and_plot(patched_load, tmp_path, capsys) -> None:
    model, tokenizer = patched_load
    js, png = tmp_path / "cmp.json", tmp_path / "cmp.png"
    rc = cli.main(["compare", "--layers", "28", "--n-steps", "6", "--token-index", "1",
                   "--json", str(js), "--plot", str(png), PROMPT])
    assert rc == 0
    out = capsys.readouterr().out
    for label in ("IG-Lens", "LayerIG", "LayerCond", "lens p", "|sum-total|"):
        assert label in out
    data = json.loads(js.read_text())
    assert data["layers"] == [28, 30] and data["n_steps"] == 6
    # the target is the second token of the greedy answer, explained after the first
    prompt_ids, _ = build_prompt_ids(tokenizer, PROMPT)
    answer = generate_answer(model, tokenizer, prompt_ids, 2)
    assert data["target_id"] == answer[1]
    assert data["input_ids"] == prompt_ids + answer[:1]
    methods = data["methods"]
    assert set(methods) == {"ig_lens", "layer_integrated_gradients", "layer_conductance",
                            "logit_lens"}
    assert methods["ig_lens"]["completeness_gap"] <= 1e-6
    with torch.no_grad():
        p = model(torch.tensor([data["input_ids"]])).logits[0, -1].softmax(-1)[answer[1]]
    assert data["F_input"] == pytest.approx(float(p), abs=1e-5)
    assert methods["logit_lens"]["per_layer"][-1] == pytest.approx(float(p), abs=1e-5)
    lig = methods["layer_integrated_gradients"]
    change = data["F_input"] - data["F_baseline"]
    assert lig["total"] == pytest.approx(change, abs=1e-6)
    assert len(lig["convergence_deltas"]) == 2
    assert lig["completeness_gap"] == pytest.approx(abs(sum(lig["per_layer"]) - change), abs=1e-6)
    assert png.stat().st_size > 1000


def test_compare_prefix(patched_load, tmp_path, capsys) -> None:
    model, tokenizer = patched_load
    js = tmp_path / "p.json"
    rc = cli.main(["compare", "--no-chat-template", "--layers", "29", "--n-steps", "4",
                   "--prefix", " is", "--json", str(js), "The capital of France"])
    assert rc == 0
    data = json.loads(js.read_text())
    ids = list(tokenizer("The capital of France")["input_ids"])
    ids += tokenizer(" is", add_special_tokens=False)["input_ids"]
    assert data["input_ids"] == ids
    with torch.no_grad():
        greedy = int(model(torch.tensor([ids])).logits[0, -1].argmax())
    assert data["target_id"] == greedy
    assert "next token after prefix" in capsys.readouterr().out


@pytest.mark.parametrize(
    "argv, message",
    [
        (["compare"], "prompt is empty"),
        (["compare", "--token-index", "-1", "Hi"], "--token-index"),
        (["compare", "--layers", "1,x", "Hi"], "--layers"),
        (["compare", "--k", "3", "--layers", "1", "Hi"], "--layers or --k"),
        (["compare", "--prefix", "a", "--token-index", "1", "Hi"], "not both"),
        (["compare", "--n-steps", "1", "Hi"], "--n-steps"),
        (["compare", "--bogus", "Hi"], "unrecognized"),
    ],
)
def test_compare_bad_arguments(argv, message, capsys) -> None:
    assert cli.main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("iglens: error:") and message in err[0]


def test_compare_token_index_past_answer(patched_load, capsys) -> None:
    assert cli.main(["compare", "--max-new-tokens", "2", "--token-index", "40", "Hi"]) == 2
    err = capsys.readouterr().err
    assert "past the answer" in err


def test_main_command_plot_still_works(patched_load, tmp_path, capsys) -> None:
    png, js = tmp_path / "heat.png", tmp_path / "r.json"
    rc = cli.main(["--k", "3", "--max-new-tokens", "3", "--plot", str(png), "--json", str(js),
                   PROMPT])
    assert rc == 0
    data = json.loads(js.read_text())
    assert data["layers"] == [0, 15, 30] and len(data["tokens"]) == 3
    assert data["completeness_max_abs_error"] <= 1e-6
    assert png.stat().st_size > 1000
    assert "completeness" in capsys.readouterr().out
