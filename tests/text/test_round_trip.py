"""Exact round trips: a result's answer_ids re-run it bit for bit, where its decoded text
(pieces of a split UTF-8 character decode to U+FFFD) re-tokenises to other ids, and warns."""

from __future__ import annotations

import json
import warnings

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from captum_iglens.run.records import read_records
from captum_iglens.run.runner import run_records
from captum_iglens.run.settings import RunSettings

SETTINGS = RunSettings(batch_size=1, chat_template=False)


def _run(model, tokenizer, rows, path):
    source = path.with_suffix(".in.jsonl")
    source.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        run_records(model, tokenizer, read_records(source), path, SETTINGS, progress=False)
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def test_a_split_emoji_answer_reruns_exactly_from_its_ids(smollm2, tmp_path) -> None:
    _, tokenizer = smollm2
    emoji = tokenizer("Hi \U0001f60a", add_special_tokens=False)["input_ids"]
    split = emoji[:-1]  # the answer ends inside the emoji's UTF-8 bytes
    assert "\ufffd" in tokenizer.decode(split)
    # a tiny random model over SmolLM2's vocabulary: only the ids matter here
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2)).eval()
    (first,) = _run(model, tokenizer, [{"id": "a", "prompt": "Say hi", "target": split}],
                    tmp_path / "first.jsonl")
    assert first["answer_ids"] == split and "\ufffd" in first["answer"]
    (again,) = _run(model, tokenizer, [{"id": "a", "prompt": "Say hi",
                                        "answer_ids": first["answer_ids"]}],
                    tmp_path / "again.jsonl")
    # the same ids through the same forward: every number bit for bit
    assert again["input_ids"] == first["input_ids"]
    assert again["tokens"] == first["tokens"]
    # the decoded text does not come back as the same ids, and says so
    with pytest.warns(UserWarning, match="U\\+FFFD"):
        source = tmp_path / "text.in.jsonl"
        source.write_text(json.dumps({"id": "a", "prompt": "Say hi",
                                      "answer": first["answer"]}) + "\n", encoding="utf-8")
        run_records(model, tokenizer, read_records(source), tmp_path / "text.jsonl", SETTINGS,
                    progress=False)
    text = json.loads((tmp_path / "text.jsonl").read_text(encoding="utf-8"))
    assert text["answer_ids"] != split


def test_answer_ids_are_checked_when_read(tmp_path) -> None:
    source = tmp_path / "in.jsonl"
    rows = [{"id": 1, "prompt": "p", "answer_ids": []},
            {"id": 2, "prompt": "p", "answer_ids": [1, "x"]},
            {"id": 3, "prompt": "p", "answer_ids": [1], "answer": "a"},
            {"id": 4, "text": "t", "answer_ids": [1]},
            {"id": 5, "prompt": "p", "answer_ids": [4, 5]}]
    source.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    records = read_records(source)
    assert "non-empty list of token ids" in records[0].error
    assert "non-empty list of token ids" in records[1].error
    assert "not ['answer', 'answer_ids']" in records[2].error
    assert "text record" in records[3].error
    assert records[4].error is None and records[4].answer_ids == [4, 5]
