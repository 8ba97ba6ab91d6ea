"""Dataset files end their lines at "\\n" only: U+2028, U+2029, U+0085, form feeds and the
other characters :meth:`str.splitlines` breaks at stay inside a record; a lone surrogate (an
unpaired JSON escape) becomes a clear error record, not the tokenizer's bare type error."""

from __future__ import annotations

import argparse
import io
import json
from pathlib import Path

import pytest

from captum_iglens.run.records import read_records

# every character str.splitlines() breaks at besides "\n" and "\r"
BREAKS = ["\u2028", "\u2029", "\u0085", "\x0b", "\x0c", "\x1c", "\x1d", "\x1e"]


def _prompts() -> list[str]:
    """Six prompts, five of them holding one of the Unicode line boundaries."""
    return ["What is the capital\u2028of Vietnam?", "Paris\u2029is in", "a\x85b c",
            "form\x0cfeed and\x0btab", "fs\x1cgs\x1drs\x1e end", "plain prompt"]


def test_split_lines_breaks_at_newline_only():
    from captum_iglens._utils.lines import split_lines, surrogate_problem

    text = "".join(p + "\n" for p in _prompts())
    assert len(text.splitlines()) > 6  # what the readers used, for the record
    assert split_lines(text) == _prompts()
    assert split_lines("a\r\nb\r\n") == ["a", "b"]
    assert split_lines("a\n\nb") == ["a", "", "b"]
    assert split_lines("") == []
    assert surrogate_problem("plain", "x") is None


def test_a_text_file_keeps_its_record_count(tmp_path):
    path = tmp_path / "prompts.txt"
    path.write_text("".join(p + "\n" for p in _prompts()), encoding="utf-8", newline="")
    records = read_records(path)
    assert [r.prompt for r in records] == [p.strip() for p in _prompts()]
    assert [r.id for r in records] == [1, 2, 3, 4, 5, 6]


def test_a_jsonl_file_with_raw_line_separators_inside_strings(tmp_path):
    rows = [{"id": f"q{i}", "prompt": p} for i, p in enumerate(_prompts())]
    path = tmp_path / "records.jsonl"
    # ensure_ascii=False writes U+2028 raw: valid JSON, valid JSON Lines
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\r\n" for r in rows),
                    encoding="utf-8", newline="")
    assert "\u2028" in path.read_text(encoding="utf-8")
    records = read_records(path)
    assert [(r.id, r.prompt, r.error) for r in records] == [
        (f"q{i}", p, None) for i, p in enumerate(_prompts())]


def test_a_lone_surrogate_becomes_a_clear_error_record(tmp_path):
    path = tmp_path / "records.jsonl"
    path.write_text('{"id": "ok", "prompt": "fine"}\n'
                    '{"id": "bad", "prompt": "emoji \\ud83d half"}\n'
                    '{"id": "pair", "prompt": "emoji \\ud83d\\ude00 whole"}\n'
                    '{"id": "ans", "prompt": "x", "answer": " \\udc00"}\n', encoding="utf-8")
    ok, bad, pair, ans = read_records(path)
    assert ok.error is None and pair.error is None and pair.prompt == "emoji \U0001f600 whole"
    assert bad.error == ('"prompt" holds a lone surrogate U+D83D at character 6 (an unpaired '
                         '\\ud83d escape), which is not text: write the character itself, or '
                         'both halves of its surrogate pair')
    assert ans.error is not None and "U+DC00" in ans.error and '"answer"' in ans.error


def test_validate_and_patching_files_keep_their_lines(tmp_path):
    from captum_iglens.validate.inputs import load_prompts
    from captum_iglens.validate.patching import load_pairs

    text = tmp_path / "p.txt"
    text.write_text("".join(p + "\n" for p in _prompts()), encoding="utf-8")
    assert load_prompts(text) == [p.strip() for p in _prompts()]
    jsonl = tmp_path / "p.jsonl"
    jsonl.write_text("".join(json.dumps({"prompt": p}, ensure_ascii=False) + "\n"
                             for p in _prompts()), encoding="utf-8")
    assert load_prompts(jsonl) == _prompts()
    broken = tmp_path / "s.jsonl"
    broken.write_text('{"prompt": "a \\ud800"}\n', encoding="utf-8")
    with pytest.raises(ValueError, match=r"prompt 1 holds a lone surrogate U\+D800"):
        load_prompts(broken)
    pairs = tmp_path / "pairs.jsonl"
    fields = {"clean": "The capital\u2028of France is", "corrupted": "The capital\u2028of Italy is",
              "answer": " Paris", "foil": " Rome", "category": "c"}
    pairs.write_text("".join(json.dumps(dict(fields, id=f"p{i}"), ensure_ascii=False) + "\n"
                             for i in range(2)), encoding="utf-8")
    assert [p.clean for p in load_pairs(pairs)] == [fields["clean"]] * 2


def test_cli_prompt_files_and_stdin_keep_their_lines(tmp_path, monkeypatch):
    from captum_iglens.cli._prompt_options import read_prompts

    path = tmp_path / "p.txt"
    path.write_text("".join(p + "\n" for p in _prompts()), encoding="utf-8")
    args = argparse.Namespace(prompts_file=str(path), stdin=False, prompt=[], loop=False)
    assert read_prompts(args) == [p.strip() for p in _prompts()]
    monkeypatch.setattr("sys.stdin", io.StringIO("".join(p + "\n" for p in _prompts())))
    args = argparse.Namespace(prompts_file=None, stdin=True, prompt=[], loop=False)
    assert read_prompts(args) == [p.strip() for p in _prompts()]


def test_iglens_run_reports_the_surrogate_record(tmp_path, capsys):
    from conftest import make_tiny
    from tiny_tokenizer import word_tokenizer

    from captum_iglens.cli import main

    folder = tmp_path / "tiny"
    make_tiny("llama", n_layers=2).save_pretrained(folder)
    word_tokenizer().save_pretrained(folder)
    source = tmp_path / "in.jsonl"
    source.write_text('{"id": "a", "prompt": "w1 w2\u2028w3"}\n'
                      '{"id": "b", "prompt": "w1 \\udfff"}\n', encoding="utf-8")
    out = tmp_path / "out.jsonl"
    code = main(["run", "--model", str(folder), "--input", str(source), "--output", str(out),
                 "--no-chat-template", "--max-new-tokens", "2", "--no-progress"])
    rows = [json.loads(line) for line in Path(out).read_text(encoding="utf-8").split("\n")
            if line]
    assert code == 1, capsys.readouterr().err
    assert [(r["id"], r["status"]) for r in rows] == [("a", "ok"), ("b", "error")]
    assert "lone surrogate U+DFFF" in rows[1]["error"]
