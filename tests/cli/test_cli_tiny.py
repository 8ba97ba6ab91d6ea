"""The `iglens` commands end to end on a tiny Llama (4 blocks, hidden 64, perturbed norms) with
the offline word tokenizer: the quick suite's copy of the SmolLM2 CLI tests (marked slow), so
that README's quick test command still runs explain and compare through the command line.

Every number is checked against the model itself (its own logits) or against the arithmetic
(credits add up to Δp), never against a stored value.
"""

from __future__ import annotations

import json

import matplotlib

matplotlib.use("Agg")

import pytest  # noqa: E402
import torch  # noqa: E402
from _tolerance import f32_tol  # noqa: E402
from tiny_families import make_family  # noqa: E402

from captum_iglens.cli import main  # noqa: E402
from captum_iglens.models import loading as models  # noqa: E402
from captum_iglens.testing._tokenizer import word_tokenizer  # noqa: E402

N_BLOCKS = 4
PROMPT = "w1 w7 w3 w9 w2"


@pytest.fixture
def tiny_load(monkeypatch):
    """``load_model`` answers with a tiny Llama and the word tokenizer (no chat template)."""
    torch.manual_seed(0)
    model = make_family("llama", seed=3, n_blocks=N_BLOCKS).eval()
    tokenizer = word_tokenizer(model.config.vocab_size)
    monkeypatch.setattr(models, "load_model",
                        lambda spec=None, use_cache=True, device_map=None: (model, tokenizer))
    return model, tokenizer


def _greedy(model, ids: list[int], n: int) -> list[int]:
    """The model's own greedy continuation, one argmax at a time (independent of generate)."""
    out = list(ids)
    with torch.no_grad():
        for _ in range(n):
            out.append(int(model(torch.tensor([out])).logits[0, -1].argmax()))
    return out[len(ids):]


def test_explain_json_and_plot_on_a_tiny_model(tiny_load, tmp_path, capsys) -> None:
    model, tokenizer = tiny_load
    path, png = tmp_path / "out.json", tmp_path / "heat.png"
    assert main(["--max-new-tokens", "3", "--no-chat-template", "--json", str(path),
                 "--plot", str(png), PROMPT]) == 0
    assert png.stat().st_size > 1000
    printed = capsys.readouterr().out
    assert "answer:" in printed and "completeness: max |sum - Δp|" in printed
    data = json.loads(path.read_text())
    prompt_ids = tokenizer(PROMPT)["input_ids"]
    answer = _greedy(model, prompt_ids, 3)
    assert data["input_ids"][:len(prompt_ids)] == prompt_ids
    assert [t["token_id"] for t in data["tokens"]] == answer[:len(data["tokens"])]
    assert data["layers"] == list(range(1, N_BLOCKS + 1))
    ids = torch.tensor([data["input_ids"]])
    with torch.no_grad():
        logits = model(ids).logits[0]
    probs = logits.softmax(-1)
    hidden = model.config.hidden_size
    for token in data["tokens"]:
        p = float(probs[token["position"], token["token_id"]])
        # the last lens level is the model's own probability (Invariant R): the two logit
        # vectors differ by float32 rounding of hidden-length dot products, and a probability
        # moves by at most the largest logit change
        tol = f32_tol(logits[token["position"]].abs().max(), n_terms=hidden)
        assert token["lens_probs"][-1] == pytest.approx(p, abs=float(tol))
        assert abs(sum(token["attributions"]) - token["delta_p"]) <= 1e-6


def test_compare_json_on_a_tiny_model(tiny_load, tmp_path, capsys) -> None:
    model, tokenizer = tiny_load
    js, png = tmp_path / "cmp.json", tmp_path / "cmp.png"
    assert main(["compare", "--no-chat-template", "--layers", "2", "--n-steps", "4",
                 "--json", str(js), "--plot", str(png), PROMPT]) == 0
    out = capsys.readouterr().out
    for label in ("IG-Lens", "LayerIG", "LayerCond", "lens p", "|sum-total|"):
        assert label in out
    data = json.loads(js.read_text())
    assert data["layers"] == [2, N_BLOCKS] and data["n_steps"] == 4
    with torch.no_grad():
        p = model(torch.tensor([data["input_ids"]])).logits[0, -1].softmax(-1)
    assert data["target_id"] == int(p.argmax())
    assert data["F_input"] == pytest.approx(float(p[data["target_id"]]), abs=1e-5)
    methods = data["methods"]
    change = data["F_input"] - data["F_baseline"]
    assert methods["ig_lens"]["completeness_gap"] <= 1e-6
    assert methods["ig_lens"]["total"] == pytest.approx(change, abs=1e-5)
    # Captum's LayerIntegratedGradients on each layer alone: every block output is a full cut,
    # so each layer's total is (close to) the whole change, and the layers do not add up to it
    lig = methods["layer_integrated_gradients"]
    assert len(lig["per_layer"]) == 2
    assert lig["completeness_gap"] == pytest.approx(abs(sum(lig["per_layer"]) - change),
                                                    abs=1e-6)
    assert png.stat().st_size > 1000
