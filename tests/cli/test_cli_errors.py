"""The `iglens` error paths of the first hour: what each mistake says, its exit status, and
that it is refused before the heavy work (loading the model, explaining) wherever the command
line or the tokenizer can tell.

Runs on a tiny random llama saved as a model folder (word tokenizer, loaded in a second);
only the bound of the embedded model's chat template needs SmolLM2's tokenizer."""

from __future__ import annotations

import errno
import json
import os
import warnings
from pathlib import Path

import matplotlib

matplotlib.use("Agg")

import pytest  # noqa: E402
import torch  # noqa: E402
from conftest import make_tiny  # noqa: E402
from tiny_tokenizer import word_tokenizer  # noqa: E402

from captum_iglens.cli import COMMANDS, main, parse_args  # noqa: E402
from captum_iglens.cli._template_date import warn_unused_template_date  # noqa: E402
from captum_iglens.cli.validate import EMBEDDED_TEMPLATE_TOKENS  # noqa: E402
from captum_iglens.models import loading as models  # noqa: E402
from captum_iglens.run import results_file
from captum_iglens.run.results_file import ResultsFile, ResultsWriteError  # noqa: E402
from captum_iglens.text import explain_prompt as text
from captum_iglens.text.prompts import render_prompt  # noqa: E402
from captum_iglens.validate import driver as validate_module  # noqa: E402
from captum_iglens.validate.ablation import ReferenceSetError, ResidualTrace, mean_updates  # noqa: E402
from captum_iglens.validate.driver import (  # noqa: E402
    load_prompts,
    max_reference_positions,
    reference_shortfall,
)

DATE_TEMPLATE = "{{ date_string }}|{% for m in messages %}{{ m['content'] }}{% endfor %}"
PLAIN_TEMPLATE = "{% for m in messages %}{{ m['content'] }}{% endfor %}"


@pytest.fixture(autouse=True)
def one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture
def no_load(monkeypatch):
    """Fail the test if the CLI tries to load a model."""

    def load_model(spec=None, use_cache=True, device_map=None):
        pytest.fail(f"the model was loaded (spec {spec!r}) before the argument error")

    monkeypatch.setattr(models, "load_model", load_model)


def error_line(capsys) -> str:
    """The one error line on stderr (a `loading ...` line before it is allowed)."""
    err = [line for line in capsys.readouterr().err.strip().splitlines()
           if not line.startswith("loading ")]
    assert len(err) == 1, err
    assert err[0].startswith("iglens: error:") and "Traceback" not in err[0]
    return err[0]


def write_lines(path: Path, lines: list[str]) -> Path:
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return path


# ------------------------------------------------- 3. validate: mean ablation's reference set
SHORT_PROMPTS = ["What is the capital of France?", "What is 2 + 2?", "Name a primary color."]


def test_reference_bound_is_the_shortest_prompts_set():
    """Spans length + max_new_tokens - 1: [14, 24, 34]; the largest set leaves out the
    shortest prompt: 24 + 34 = 58."""
    assert max_reference_positions([10, 20, 30], 5) == 58
    assert reference_shortfall([10, 20, 30], 5, min_reference=58) is None
    short = reference_shortfall([10, 20, 30], 5, min_reference=59)
    assert "at least 59 reference positions" in short and "holds at most 58" in short
    # 58 over 2 other prompts: 29 each; ceil(59 / 29) + 1 = 4 prompts of this length
    assert "at least 4 prompts of this length are needed" in short
    assert reference_shortfall([10], 5, min_reference=1000) is None  # < 2 prompts: elsewhere


def test_validate_refuses_a_short_prompt_set_before_loading(tmp_path, no_load, capsys,
                                                           monkeypatch):
    # an empty model cache: no cached tokenizer, so the bound is one token per UTF-8 byte
    # (tests/cli/test_preload_refusals.py checks the tighter bound of a cached tokenizer)
    monkeypatch.setenv("CAPTUM_IGLENS_CACHE", str(tmp_path / "empty-cache"))
    prompts = write_lines(tmp_path / "p.txt", SHORT_PROMPTS)
    assert main(["validate", "--prompts-file", str(prompts)]) == 2
    line = error_line(capsys)
    spans = [EMBEDDED_TEMPLATE_TOKENS + len(p.encode()) + 12 - 1 for p in SHORT_PROMPTS]
    most = sum(spans) - min(spans)
    assert most < 200
    assert f"reference set holds at most {most}" in line
    assert "use --ablation zero or --ablation resample (they need no reference set)" in line
    assert "more prompts" in line
    assert main(["validate", "--ablation", "mean", "--prompts-file", str(prompts)]) == 2
    capsys.readouterr()
    for ablation in ("zero", "resample"):  # no reference set: not refused
        args = parse_args(["validate", "--ablation", ablation, "--prompts-file", str(prompts)])
        assert args.prompts == SHORT_PROMPTS
    # more prompts of this length lift the bound over 200; so does the packaged set
    assert parse_args(["validate", "--prompts-file",
                       str(write_lines(tmp_path / "p6.txt", SHORT_PROMPTS * 2))]).ablation == "all"
    assert len(parse_args(["validate"]).prompts) == len(load_prompts())


def test_embedded_template_bound_holds_for_smollm2(smollm2):
    """The pre-load bound: SmolLM2's chat template adds exactly EMBEDDED_TEMPLATE_TOKENS
    tokens around a prompt, and its byte-level BPE gives a prompt at most one token per
    UTF-8 byte."""
    _, tokenizer = smollm2
    for prompt in ["Hi", "What is 2 + 2?", "Übersetze „Straße“ ins Englische: 東京"]:
        own = len(tokenizer(prompt, add_special_tokens=False)["input_ids"])
        rendered = len(render_prompt(tokenizer, prompt).ids)
        assert rendered == EMBEDDED_TEMPLATE_TOKENS + own
        assert own <= len(prompt.encode("utf-8"))
    for prompt in load_prompts():
        assert len(render_prompt(tokenizer, prompt).ids) <= (EMBEDDED_TEMPLATE_TOKENS
                                                             + len(prompt.encode("utf-8")))
    # the pre-load bound from the cache entry's tokenizer.json (loading SmolLM2 wrote it)
    from captum_iglens.cli.validate import _embedded_bounds
    from captum_iglens.models.facts import embedded_tokenizer_file

    prompts = [*load_prompts(), " leading", "\n\nnew lines\n", "Übersetze „Straße“: 東京"]
    bounds = _embedded_bounds(prompts)
    if embedded_tokenizer_file() is not None:
        assert bounds == [EMBEDDED_TEMPLATE_TOKENS + 1 + len(
            tokenizer(p, add_special_tokens=False)["input_ids"]) for p in prompts]
    assert all(len(render_prompt(tokenizer, p).ids) <= b
               for p, b in zip(prompts, bounds, strict=True))


def test_validate_of_another_model_refuses_before_explaining(tiny_folder, tmp_path,
                                                             monkeypatch, capsys):
    """Another model's template is known once it is loaded: the check runs then, before
    the first prompt is explained."""

    def explain(*_args, **_kwargs):
        pytest.fail("a prompt was explained before the reference-set check")

    monkeypatch.setattr(validate_module, "explain", explain)
    prompts = ["w1 w2 w3", "w4 w5", "w6"]
    path = write_lines(tmp_path / "p.txt", prompts)
    assert main(["validate", "--model", str(tiny_folder), "--prompts-file", str(path),
                 "--max-new-tokens", "4"]) == 2
    line = error_line(capsys)
    tokenizer = word_tokenizer()
    spans = [len(tokenizer(p)["input_ids"]) + 4 - 1 for p in prompts]  # [6, 5, 4]
    assert f"holds at most {sum(spans) - min(spans)} (" in line  # 11
    assert "--ablation zero or --ablation resample" in line


def test_mean_updates_error_names_the_remedy():
    traces = [ResidualTrace(torch.zeros(5, dtype=torch.long), torch.zeros(5, 3, 2), [])
              for _ in range(2)]
    with pytest.raises(ReferenceSetError) as caught:
        mean_updates(traces, min_positions=9)  # 2 x (5 - 1) = 8 positions
    message = str(caught.value)
    assert "the reference set has 8:" in message
    assert "'zero' or 'resample', which need no reference set" in message
    assert caught.value.shortfall.endswith("the reference set has 8")
    assert isinstance(caught.value, ValueError)  # callers catching ValueError still do
    assert mean_updates(traces, min_positions=8).shape == (2, 2)


# ----------------------------------------------------------------- 4. run: the output path
def run_argv(folder: Path, source: Path, output: Path | str) -> list[str]:
    return ["run", "--model", str(folder), "--input", str(source), "--output", str(output),
            "--no-chat-template", "--max-new-tokens", "2", "--no-progress"]


@pytest.fixture
def source(tmp_path) -> Path:
    return write_lines(tmp_path / "in.jsonl", [json.dumps({"id": i, "prompt": f"w{4 + i} w9"})
                                               for i in range(3)])


def test_run_output_under_a_file_is_refused_before_loading(source, tmp_path, no_load, capsys):
    blocker = write_lines(tmp_path / "file.txt", ["not a folder"])
    assert main(run_argv(tmp_path, source, blocker / "out.jsonl")) == 2
    assert f"{str(blocker)!r} is a file, not a folder" in error_line(capsys)
    assert main(run_argv(tmp_path, source, tmp_path / "no" / "out.jsonl")) == 2
    assert "does not exist: create it or choose --output elsewhere" in error_line(capsys)
    assert main(run_argv(tmp_path, source, tmp_path)) == 2
    assert "is a folder: give a file path" in error_line(capsys)


def test_run_output_in_a_read_only_folder_is_refused_before_loading(source, tmp_path, no_load,
                                                                   monkeypatch, capsys):
    """Tests run as root, whom chmod does not stop: the read-only folder is simulated where
    the CLI asks (os.access), as a read-only disk (EROFS) answers it for root too."""
    folder = tmp_path / "ro"
    folder.mkdir()
    real = os.access
    monkeypatch.setattr(os, "access", lambda path, mode, **kw: (
        False if Path(path) == folder and mode & os.W_OK else real(path, mode, **kw)))
    assert main(run_argv(tmp_path, source, folder / "out.jsonl")) == 2
    assert ("cannot be written (permission denied or a read-only disk): choose --output in a "
            "writable folder") in error_line(capsys)
    assert parse_args(run_argv(tmp_path, source, tmp_path / "out.jsonl")).output  # writable


def test_run_unreadable_output_is_refused_before_loading(source, tmp_path, no_load,
                                                         monkeypatch, capsys):
    out = write_lines(tmp_path / "out.jsonl", ['{"id": 0, "status": "ok"}'])

    def unreadable(path):
        raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), str(path))

    monkeypatch.setattr("captum_iglens.cli.run.check_results_file", unreadable)
    assert main(run_argv(tmp_path, source, out)) == 2
    assert error_line(capsys).endswith("cannot be read to resume it: Permission denied")


def test_compare_names_the_greedy_answer_token(tiny_folder, tmp_path, capsys):
    out = tmp_path / "cmp.json"
    assert main(["compare", "--model", str(tiny_folder), "--no-chat-template", "--k", "1",
                 "--n-steps", "2", "--max-new-tokens", "2", "--token-index", "1",
                 "--json", str(out), "w4"]) == 0
    text = capsys.readouterr().out
    head = next(line for line in text.splitlines() if line.startswith("target "))
    # the trap: the token the model generated greedily was called "given"
    assert ", greedy answer token) at position" in head and "given" not in head
    assert json.loads(out.read_text())["target_source"] == "greedy answer token"
    assert main(["compare", "--model", str(tiny_folder), "--no-chat-template", "--k", "1",
                 "--n-steps", "2", "--prefix", "w5", "w4"]) == 0
    assert ", model argmax) at position" in capsys.readouterr().out


def test_interrupted_run_says_the_same_command_resumes(source, tmp_path, monkeypatch, capsys):
    def load_model(spec=None, use_cache=True, device_map=None):
        raise KeyboardInterrupt

    monkeypatch.setattr(models, "load_model", load_model)
    assert main(run_argv(tmp_path, source, tmp_path / "out.jsonl")) == 130
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        "iglens: interrupted: the records already in the results file are kept; re-run the "
        "same command to resume")
    assert "re-run the same command to resume" in " ".join(COMMANDS["run"].EXIT_STATUS.split())


def test_full_disk_is_one_line_naming_the_file_and_the_run_resumes(tiny_folder, source, tmp_path,
                                                                   monkeypatch, capsys):
    out = tmp_path / "out.jsonl"
    real_fsync = os.fsync

    def full(fd):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(results_file.os, "fsync", full)
    assert main(run_argv(tiny_folder, source, out)) == 1
    assert error_line(capsys) == (
        f"iglens: error: cannot write results to {out}: {os.strerror(errno.ENOSPC)}; free space "
        "on its disk, then run again (the run resumes), or choose --output elsewhere")
    monkeypatch.setattr(results_file.os, "fsync", real_fsync)
    assert main(run_argv(tiny_folder, source, out)) == 0
    assert [json.loads(line)["id"] for line in out.read_text().splitlines()] == [0, 1, 2]


def test_results_write_error_is_an_oserror_naming_the_file(tmp_path, monkeypatch):
    out = ResultsFile(tmp_path / "r.jsonl")
    out.open()

    def full(fd):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(results_file.os, "fsync", full)
    with pytest.raises(ResultsWriteError) as caught:
        out.append({"id": 1, "status": "ok"})
    err = caught.value
    assert isinstance(err, OSError) and err.errno == errno.ENOSPC
    assert str(err) == (f"cannot write results to {tmp_path / 'r.jsonl'}: "
                        f"{os.strerror(errno.ENOSPC)}; free space on its disk, then run again "
                        "(the run resumes), or write the results elsewhere")
    assert out._handle is None  # closed: nothing left to flush at exit


# ---------------------------------------------------------------------- 6. CLI edges
@pytest.mark.parametrize("argv, word, command", [
    (["--k", "4", "explian", "What is it?"], "explian", "explain"),
    (["--k", "4", "--max-new-tokens", "3", "comapre", "hi"], "comapre", "compare"),
    (["--no-chat-template", "sumarize", "r.jsonl"], "sumarize", "summarize"),
])
def test_mistyped_command_after_options_is_refused(argv, word, command, no_load, capsys):
    assert main(argv) == 2
    line = error_line(capsys)
    assert line.startswith(f"iglens: error: unknown command {word!r}; did you mean {command!r}?")
    assert f"'iglens {command} [options] PROMPT'" in line


def test_prompts_after_options_that_only_look_like_commands_still_run():
    assert parse_args(["--k", "4", "Explain", "gravity"]).prompts == ["Explain gravity"]
    assert parse_args(["--k", "4", "compute", "2+2"]).prompts == ["compute 2+2"]
    assert parse_args(["--k", "4", "what", "is", "it"]).prompts == ["what is it"]
    args = parse_args(["explain", "--k", "4", "explian", "hi"])  # the command is given
    assert args.prompts == ["explian hi"]


def test_summarize_of_a_file_that_is_not_a_results_file(tmp_path, no_load, capsys):
    notes = write_lines(tmp_path / "notes.md", ["# notes", "", "some text", "more"])
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no torn-line warning on the way
        assert main(["summarize", str(notes)]) == 2
    assert error_line(capsys) == (
        f"iglens: error: {notes} is not a results file of 'iglens run': none of its 3 non-blank "
        "lines parses as a JSON record (give the --output file of a run)")
    prompts = write_lines(tmp_path / "in.jsonl", [json.dumps({"id": 0, "prompt": "hi"})])
    assert main(["summarize", str(prompts)]) == 2
    assert "line 1: 'status' is None" in error_line(capsys)
    # explain's --json: one indented document, whose line "  0.5," once parsed as a record
    explained = tmp_path / "explain.json"
    explained.write_text(json.dumps({"status": "ok", "credits": [0.5, 0.25]}, indent=1))
    assert main(["summarize", str(explained)]) == 2
    assert error_line(capsys) == (
        f"iglens: error: {explained} is one JSON document over 7 lines (the --json output of "
        "'iglens explain'?), not the JSON lines of 'iglens run': give the --output file of a "
        "run")


def test_damaged_line_is_reported_once_per_resumed_run(tmp_path):
    path = tmp_path / "out.jsonl"
    good = [json.dumps({"id": i, "status": "ok"}) for i in range(3)]
    path.write_text(good[0] + "\n" + good[1][:7] + "\n" + good[2] + "\n", encoding="utf-8")
    out = ResultsFile(path)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert out.done_ids() == {0, 2}  # as run_records: read, open, append, merge
        out.open()
        out.append({"id": 1, "status": "ok"})
        assert out.finalize({0: 0, 1: 1, 2: 2}) == 3
    damaged = [w for w in caught if "damaged line" in str(w.message)]
    assert len(damaged) == 1, [str(w.message) for w in caught]
    assert [json.loads(line)["id"] for line in path.read_text().splitlines()] == [0, 1, 2]


@pytest.mark.parametrize("date", ["yesterday", "2024-07-26", "26 July 2024x", "32 Jul 2024"])
def test_malformed_template_date_is_a_usage_error(date, no_load, capsys):
    assert main(["--template-date", date, "hi"]) == 2
    assert f"--template-date {date!r} is not a date" in error_line(capsys)


def test_template_date_is_normalised_and_needs_the_template(no_load, capsys):
    assert parse_args(["--template-date", "5 jul  2024", "hi"]).template_date == "05 Jul 2024"
    assert parse_args(["compare", "--template-date", "26 Jul 2024", "hi"]).template_date == (
        "26 Jul 2024")
    assert main(["--template-date", "26 Jul 2024", "--no-chat-template", "hi"]) == 2
    assert "no effect with --no-chat-template" in error_line(capsys)


@pytest.mark.parametrize("template, why", [
    (DATE_TEMPLATE, None),
    (PLAIN_TEMPLATE, "this model's chat template writes no date"),
    (None, "this model's tokenizer has no chat template"),
    ("{{ strftime_now('%d') }}" + PLAIN_TEMPLATE, None),  # pinned through its clock
])
def test_a_template_date_without_effect_is_warned(template, why, capsys):
    args = parse_args(["--template-date", "26 Jul 2024", "hi"])
    warn_unused_template_date(args, word_tokenizer(chat_template=template))
    err = capsys.readouterr().err
    if why is None:
        assert err == ""
    else:
        assert err.startswith("iglens: warning: --template-date '26 Jul 2024' has no effect: ")
        assert why in err and err.count("\n") == 1
    warn_unused_template_date(parse_args(["hi"]), word_tokenizer())  # no pin: nothing to say
    assert capsys.readouterr().err == ""


def test_template_date_warning_reaches_the_command(tiny_folder, capsys):
    assert main(["--model", str(tiny_folder), "--template-date", "26 Jul 2024", "--k", "1",
                 "--max-new-tokens", "1", "w4"]) == 0
    err = capsys.readouterr().err
    assert err.count("--template-date '26 Jul 2024' has no effect") == 1


@pytest.fixture(scope="module")
def plain_template_folder(tmp_path_factory) -> Path:
    """The tiny llama with a chat template that writes no date."""
    folder = tmp_path_factory.mktemp("models") / "tiny-llama-plain-template"
    make_tiny("llama", n_layers=3).save_pretrained(folder)
    word_tokenizer(chat_template=PLAIN_TEMPLATE).save_pretrained(folder)
    return folder


@pytest.mark.parametrize("command", [[], ["compare"]])
def test_template_date_warning_is_said_once(plain_template_folder, command, capsys):
    # the trap: the CLI said it, then the library's render_prompt said it again
    # ("date_string='26 Jul 2024' has no effect"), once per prompt
    prompts = ["w4"] if command else ["w4", "w5"]
    assert main([*command, "--model", str(plain_template_folder), "--template-date",
                 "26 Jul 2024", "--k", "1", "--max-new-tokens", "1", *prompts]) == 0
    err = capsys.readouterr().err
    assert err.count("has no effect") == 1, err
    assert "--template-date '26 Jul 2024' has no effect: this model's chat template writes " \
        "no date" in err


@pytest.fixture
def no_explain(monkeypatch):
    def explain(*_args, **_kwargs):
        pytest.fail("the prompt was explained before the foil was checked")

    monkeypatch.setattr(text, "explain", explain)


@pytest.mark.parametrize("extra, words", [
    (["--target", "w5", "--contrast", "w6 w7"],
     "--contrast 'w6 w7' is 2 tokens [10, 11] but --target 'w5' is 1 token [9]: give a foil of "
     "one token"),
    (["--target", "w5 w6 w7", "--contrast", "w6 w7"],
     "--contrast 'w6 w7' is 2 tokens [10, 11] but --target 'w5 w6 w7' is 3 tokens"),
    (["--contrast", " "], "--contrast ' ': the model's tokenizer turns it into no token"),
    (["--target", " ", "--contrast", "w6"], "--target ' ': the model's tokenizer turns it into"),
])
def test_foil_mistakes_the_tokenizer_finds_are_usage_errors(extra, words, tiny_folder,
                                                            no_explain, capsys):
    assert main(["--model", str(tiny_folder), "--no-chat-template", *extra, "w4"]) == 2
    assert words in error_line(capsys)


def test_foil_that_does_not_pair_with_the_generated_answer(tiny_folder, capsys):
    assert main(["--model", str(tiny_folder), "--no-chat-template", "--max-new-tokens", "1",
                 "--contrast", "w6 w7", "w4"]) == 2
    assert ("--contrast 'w6 w7' is 2 tokens [10, 11], which does not pair with the answer "
            "generated for this prompt") in error_line(capsys)
    assert main(["--model", str(tiny_folder), "--no-chat-template", "--max-new-tokens", "1",
                 "--k", "1", "--contrast", "w6", "w4"]) == 0  # one foil pairs with any answer


# ------------------------------------------------------------- each command's exit status
def exit_block(name: str, capsys) -> str:
    assert main([name, "--help"]) == 0
    return capsys.readouterr().out.split("exit status:")[1]


def test_each_command_help_has_its_own_exit_status(capsys):
    blocks = {name: " ".join(exit_block(name, capsys).split()) for name in COMMANDS}
    assert len(set(blocks.values())) == len(COMMANDS)  # no shared block
    for name, block in blocks.items():
        for status in ("0 ", "1 ", "2 ", "130 interrupted"):
            assert status in block
        assert ("--token-index" in block) == (name == "compare")
        assert ("model could not be loaded" in block) == (name != "summarize")
    assert "not a results file" in blocks["summarize"]
    assert "results could not be written" in blocks["run"]
    assert "reference set of mean ablation" in blocks["validate"]
    assert "--contrast" in blocks["explain"]


def test_top_k_draws_its_own_figure_beside_the_heatmap(tiny_folder, tmp_path, capsys):
    out = tmp_path / "fig.png"
    assert main(["--model", str(tiny_folder), "--top-k", "3", "--k", "3", "--plot", str(out),
                 "--max-new-tokens", "2", "--no-progress", "w4"]) == 0
    assert out.stat().st_size > 0 and (tmp_path / "fig-topk.png").stat().st_size > 0
    assert "fig-topk.png" in capsys.readouterr().err
