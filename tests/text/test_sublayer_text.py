"""Sub-layer credits through the text level, the JSON, the table, the plots and the CLI
(explain, run, summarize) on a tiny llama with the word tokenizer."""

from __future__ import annotations

import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")

import pytest  # noqa: E402
import torch  # noqa: E402
from _tolerance import completeness_tol  # noqa: E402
from conftest import make_tiny  # noqa: E402
from tiny_tokenizer import word_tokenizer  # noqa: E402

from captum_iglens import IGLens  # noqa: E402
from captum_iglens.cli import main  # noqa: E402
from captum_iglens.results import IGLensResult  # noqa: E402
from captum_iglens.testing import assert_complete  # noqa: E402
from captum_iglens.text.explain_prompt import explain, explain_ids  # noqa: E402

PROMPT = "w5 w9 w17 w3 w40"


@pytest.fixture(scope="module")
def tiny():
    return make_tiny("llama", n_layers=3).eval(), word_tokenizer()


def test_explain_sublayer_result_table_json_and_plot(tiny, tmp_path: Path) -> None:
    model, tok = tiny
    result = explain(model, tok, PROMPT, max_new_tokens=4, chat_template=False,
                     granularity="sublayer", heads=True, n_steps=4)
    assert result.layer_names == ["L1.attn", "L1.mlp", "L2.attn", "L2.mlp", "L3.attn",
                                  "L3.mlp"]
    assert result.attributions.shape == (len(result.tokens), 6)
    assert_complete(result)
    assert all(result.is_argmax)  # generated, then one teacher-forced forward
    table = result.format_table()
    assert "L3.attn |" in table and "L3.mlp |" in table
    assert max(len(line) for line in table.splitlines()) <= 100
    data = result.to_dict()
    assert data["granularity"] == "sublayer" and data["layer_names"] == result.layer_names
    token = data["tokens"][0]
    assert len(token["head_credits"]) == 3 and len(token["head_rest"]) == 3
    parts = torch.tensor([h + [r] for h, r in zip(token["head_credits"], token["head_rest"],
                                                  strict=True)])
    attn = torch.tensor(token["attributions"][0::2])
    assert ((parts.double().sum(-1) - attn.double()).abs()
            <= completeness_tol(parts, attn)).all()
    back = IGLensResult.from_dict(json.loads(json.dumps(data)))
    assert back.granularity == "sublayer" and back.layer_names == result.layer_names
    png = tmp_path / "sub.png"
    result.plot(str(png))
    assert png.stat().st_size > 1000


def test_block_json_is_unchanged(tiny) -> None:
    model, tok = tiny
    data = explain(model, tok, PROMPT, max_new_tokens=2, chat_template=False).to_dict()
    assert "granularity" not in data and "layer_names" not in data


def test_explain_ids_with_a_sublayer_lens(tiny) -> None:
    model, tok = tiny
    lens = IGLens(model, layers=[0, 2], granularity="sublayer")
    sub = explain_ids(model, tok(PROMPT)["input_ids"], [7, 8, 9], tok, lens=lens)
    assert sub.layer_names == ["emb", "L2.attn", "L2.mlp", "L3.attn", "L3.mlp"]
    assert set(sub.onset_layers) <= set(sub.layer_indices)
    assert_complete(sub)


def test_cli_heads_need_sublayer(capsys) -> None:
    assert main(["explain", "--heads", PROMPT]) == 2
    assert "--heads needs --granularity sublayer" in capsys.readouterr().err
    assert main(["explain", "--granularity", "foo", PROMPT]) == 2


def test_cli_explain_run_and_summarize_sublayer(tiny_folder, tmp_path, capsys) -> None:
    out_json, png = tmp_path / "e.json", tmp_path / "e.png"
    assert main(["explain", "--model", str(tiny_folder), "--no-chat-template",
                 "--max-new-tokens", "3", "--granularity", "sublayer", "--json",
                 str(out_json), "--plot", str(png), PROMPT]) == 0
    assert "L1.attn" in capsys.readouterr().out
    assert json.loads(out_json.read_text())["layer_names"][:2] == ["L1.attn", "L1.mlp"]
    source = tmp_path / "in.jsonl"
    source.write_text("".join(json.dumps({"id": str(i), "prompt": p}) + "\n"
                              for i, p in enumerate([PROMPT, "w1 w2 w3"])))
    results = tmp_path / "out.jsonl"
    assert main(["run", "--model", str(tiny_folder), "--input", str(source), "--output",
                 str(results), "--no-chat-template", "--max-new-tokens", "3",
                 "--no-progress", "--granularity", "sublayer"]) == 0
    lines = [json.loads(x) for x in results.read_text().splitlines()]
    assert all(line["status"] == "ok" and line["granularity"] == "sublayer"
               for line in lines if "status" in line)
    capsys.readouterr()
    html, plot, summary = tmp_path / "s.html", tmp_path / "s.png", tmp_path / "s.json"
    assert main(["summarize", str(results), "--json", str(summary), "--plot", str(plot),
                 "--html", str(html)]) == 0
    assert "L3.mlp" in capsys.readouterr().out
    data = json.loads(summary.read_text())
    assert data["granularity"] == "sublayer"
    assert [row["name"] for row in data["per_layer"]][:2] == ["L1.attn", "L1.mlp"]
    assert "L1.attn" in html.read_text() and plot.stat().st_size > 1000


def test_captum_llm_attribution_names_sublayer_columns(tiny) -> None:
    from captum.attr import TextTokenInput

    from captum_iglens import LLMIGLensAttribution

    model, tok = tiny
    lens = IGLens(model, granularity="sublayer")
    res = LLMIGLensAttribution(lens, tok).attribute(TextTokenInput(PROMPT, tok), target=" w7 w8")
    assert res.input_tokens[:2] == ["L1.attn", "L1.mlp"]
    assert res.token_attr.shape == (2, 6)
    assert_complete(res)


def test_cli_heads_need_a_json_export(capsys) -> None:
    # the table and plot show attention totals: head credits without --json would be lost
    assert main(["explain", "--granularity", "sublayer", "--heads", PROMPT]) == 2
    assert "--heads writes per-head credits to the JSON export only" in (
        capsys.readouterr().err)


def test_cli_heads_with_json_export_their_credits(tiny_folder, tmp_path) -> None:
    # the refusal above must not refuse the one way head credits leave the command line
    out = tmp_path / "h.json"
    assert main(["explain", "--model", str(tiny_folder), "--no-chat-template",
                 "--max-new-tokens", "2", "--granularity", "sublayer", "--heads",
                 "--n-steps", "3", "--json", str(out), "--no-progress", PROMPT]) == 0
    data = json.loads(out.read_text())
    names = data["layer_names"]
    for token in data["tokens"]:
        attention = [c for c, n in zip(token["attributions"], names, strict=True)
                     if n.endswith(".attn")]
        heads = [sum(row) + rest for row, rest in zip(token["head_credits"],
                                                      token["head_rest"], strict=True)]
        # heads + rest add up to each attention credit (a float32 sum over 4 heads + rest)
        tol = 8 * 1.2e-7 * max(1.0, max(abs(a) for a in attention))
        assert max(abs(h - a) for h, a in zip(heads, attention, strict=True)) <= tol
