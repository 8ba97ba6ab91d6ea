"""A results file records what produced it: resuming with another model or other settings
is refused before any work, an id whose input changed runs again, and a second process on
the same output is locked out."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import pytest
from conftest import make_tiny
from tiny_tokenizer import word_tokenizer

from captum_iglens.run.fingerprint import RunMismatchError, run_fingerprint, run_lock
from captum_iglens.run.records import read_records
from captum_iglens.run.runner import run_records
from captum_iglens.run.settings import RunSettings

SETTINGS = RunSettings(batch_size=2, max_new_tokens=3, chat_template=False)


def _write(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def _run(model, source: Path, out: Path, settings: RunSettings = SETTINGS):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return run_records(model, word_tokenizer(), read_records(source), out, settings,
                           progress=False)


@pytest.fixture
def source(tmp_path: Path) -> Path:
    return _write(tmp_path / "in.jsonl", [{"id": "a", "prompt": "w3 w4 w5"},
                                          {"id": "b", "prompt": "w6 w7"}])


def test_every_line_carries_the_fingerprint_and_its_input_hash(source, tmp_path) -> None:
    model = make_tiny("llama").eval()
    out = tmp_path / "out.jsonl"
    _run(model, source, out)
    got = [json.loads(line) for line in out.read_text().splitlines()]
    fingerprint = run_fingerprint(model, layers=[1, 2, 3], units="probability", settings={
        "method": "prediction_aware", "baselines": "mean", "max_new_tokens": 3,
        "chat_template": False, "template_kwargs": None, "onset_frac": 0.5,
        "onset_rule": "sustained", "top_k": 0, "stride": 1})
    assert [line["run"]["digest"] for line in got] == [fingerprint["digest"]] * 2
    assert len({line["input_hash"] for line in got}) == 2


def test_resuming_with_another_model_is_refused_and_the_output_untouched(source,
                                                                         tmp_path) -> None:
    out = tmp_path / "out.jsonl"
    _run(make_tiny("llama", seed=0).eval(), source, out)
    before = out.read_bytes()
    more = _write(tmp_path / "more.jsonl", [{"id": "a", "prompt": "w3 w4 w5"},
                                            {"id": "b", "prompt": "w6 w7"},
                                            {"id": "c", "prompt": "w8 w9"}])
    with pytest.raises(RunMismatchError, match="weights: '[0-9a-f]+' there, '[0-9a-f]+' now"):
        _run(make_tiny("llama", seed=1).eval(), more, out)
    assert out.read_bytes() == before
    other = RunSettings(batch_size=2, max_new_tokens=5, chat_template=False)
    with pytest.raises(RunMismatchError, match="max_new_tokens: 3 there, 5 now"):
        _run(make_tiny("llama", seed=0).eval(), more, out, other)
    # another batch size changes no number: resuming is fine and runs only the new record
    model = make_tiny("llama", seed=0).eval()
    report = _run(model, more, out, RunSettings(batch_size=1, max_new_tokens=3,
                                                chat_template=False))
    assert (report.n_skipped, report.n_ok) == (2, 3)


def test_an_edited_prompt_runs_again_and_replaces_its_line(source, tmp_path) -> None:
    model = make_tiny("llama").eval()
    out = tmp_path / "out.jsonl"
    _run(model, source, out)
    first = {line["id"]: line for line in map(json.loads, out.read_text().splitlines())}
    edited = _write(tmp_path / "edited.jsonl", [{"id": "a", "prompt": "w3 w4 w5"},
                                                {"id": "b", "prompt": "w9 w10 w11"}])
    report = _run(model, edited, out)
    assert report.n_skipped == 1  # only b's input changed
    got = [json.loads(line) for line in out.read_text().splitlines()]
    assert [line["id"] for line in got] == ["a", "b"]  # one line per id, in input order
    assert got[0] == first["a"]
    assert got[1]["prompt"] == "w9 w10 w11" and got[1]["input_hash"] != first["b"]["input_hash"]


def test_a_file_from_before_fingerprints_is_refused(source, tmp_path) -> None:
    model = make_tiny("llama").eval()
    out = tmp_path / "out.jsonl"
    _run(model, source, out)
    old = [{k: v for k, v in json.loads(line).items() if k not in ("run", "input_hash")}
           for line in out.read_text().splitlines()]
    _write(out, old)
    with pytest.raises(RunMismatchError, match="older version that recorded no run"):
        _run(model, source, out)


def test_a_second_process_on_the_same_output_is_locked_out(source, tmp_path) -> None:
    out = tmp_path / "out.jsonl"
    with run_lock(out):
        with pytest.raises(RuntimeError, match="Another process is writing"):
            _run(make_tiny("llama").eval(), source, out)
    assert not out.exists()
    assert not out.with_name("out.jsonl.lock").exists()  # released


def test_summarize_refuses_to_pool_two_runs_unless_told(source, tmp_path, capsys) -> None:
    from captum_iglens.cli import main
    from captum_iglens.run.reader import load_results
    from captum_iglens.summary.pool import summarize

    first, second = tmp_path / "one.jsonl", tmp_path / "two.jsonl"
    _run(make_tiny("llama", seed=0).eval(), source, first)
    _run(make_tiny("llama", seed=1).eval(), source, second)
    mixed = tmp_path / "mixed.jsonl"
    mixed.write_text(first.read_text().splitlines()[0] + "\n"
                     + second.read_text().splitlines()[1] + "\n")
    records, errors, _ = load_results(mixed)
    with pytest.raises(RunMismatchError, match="2 different runs.*--allow-mixed-runs"):
        summarize(records, errors, n_boot=10)
    assert summarize(records, errors, n_boot=10, mixed_runs=True).n_ok == 2
    assert summarize(*load_results(first)[:2], n_boot=10).n_ok == 2  # one run: fine
    assert main(["summarize", str(mixed)]) == 1
    assert "different runs" in capsys.readouterr().err
    assert main(["summarize", "--allow-mixed-runs", str(mixed)]) == 0


def test_resuming_at_another_granularity_is_refused(source, tmp_path) -> None:
    # a sub-layer run's lines hold 2k credits: mixing them with a block run's k credits
    # under one fingerprint would break every summary of the file
    from captum_iglens import IGLens

    model = make_tiny("llama").eval()
    more = _write(tmp_path / "more.jsonl", [{"id": "a", "prompt": "w3 w4 w5"},
                                            {"id": "b", "prompt": "w6 w7"},
                                            {"id": "c", "prompt": "w8 w9"}])
    for first, then in (("block", "sublayer"), ("sublayer", "block")):
        out = tmp_path / f"{first}.jsonl"
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            run_records(model, word_tokenizer(), read_records(source), out, SETTINGS,
                        progress=False, lens=IGLens(model, granularity=first))
        before = out.read_bytes()
        with pytest.raises(RunMismatchError,
                           match=f"granularity: '{first}' there, '{then}' now"):
            run_records(model, word_tokenizer(), read_records(more), out, SETTINGS,
                        progress=False, lens=IGLens(model, granularity=then))
        assert out.read_bytes() == before
