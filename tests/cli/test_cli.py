"""The `iglens` command line: routing, argument checks before loading, exit codes, and the
`explain` / `compare` commands on the embedded SmolLM2 (loaded once per session)."""

from __future__ import annotations

import io
import json
import subprocess
import sys

import matplotlib

matplotlib.use("Agg")

import pytest  # noqa: E402
import torch  # noqa: E402

import captum_iglens  # noqa: E402
from captum_iglens.cli import COMMANDS, UsageError, build_parser, main, parse_args  # noqa: E402
from captum_iglens.cli._layer_options import resolve_layers
from captum_iglens.cli.compare import DEFAULT_K  # noqa: E402
from captum_iglens.models import loading as models  # noqa: E402
from captum_iglens.text.explain_prompt import build_prompt_ids, generate_answer  # noqa: E402

PROMPT = "What is the capital of France?"


@pytest.fixture
def patched_load(smollm2, monkeypatch):
    """Reuse the session's SmolLM2 instead of loading it again in every command."""
    monkeypatch.setattr(models, "load_model",
                        lambda spec=None, use_cache=True, device_map=None: smollm2)
    return smollm2


@pytest.fixture
def no_load(monkeypatch):
    """Fail the test if the CLI tries to load a model."""

    def load_model(spec=None, use_cache=True, device_map=None):
        pytest.fail(f"the model was loaded (spec {spec!r}) before the argument error")

    monkeypatch.setattr(models, "load_model", load_model)


def one_error_line(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    assert err[0].startswith("iglens: error:") and "Traceback" not in err[0]
    return err[0]


# ----------------------------------------------------------------------------- routing
def test_help_lists_both_commands_and_exit_codes(capsys) -> None:
    assert main(["--help"]) == 0
    out = capsys.readouterr().out
    commands = out.split("commands:")[1]
    assert "explain" in commands and "compare" in commands
    for status in ("0 ", "1 ", "2 ", "130"):
        assert f"\n  {status}" in out
    assert "iglens explain" in out  # the shorthand is explained


@pytest.mark.parametrize("name", list(COMMANDS))
def test_every_registered_command_has_help(name, capsys) -> None:
    assert main([name, "--help"]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"usage: iglens {name}") and "exit status:" in out
    assert " ".join(COMMANDS[name].HELP.split()) in " ".join(build_parser().format_help().split())


def test_version(capsys) -> None:
    assert main(["--version"]) == 0
    assert capsys.readouterr().out == f"iglens {captum_iglens.__version__}\n"


def test_python_dash_m_runs_the_command() -> None:
    out = subprocess.run([sys.executable, "-m", "captum_iglens", "--version"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == f"iglens {captum_iglens.__version__}"


@pytest.mark.parametrize("word, command", [("comapre", "compare"), ("explian", "explain"),
                                           ("compar", "compare")])
def test_near_miss_of_a_command_is_refused(word, command, no_load, capsys) -> None:
    assert main([word, "hi"]) == 2
    assert one_error_line(capsys) == (
        f"iglens: error: unknown command {word!r}; did you mean {command!r}?"
    )


@pytest.mark.parametrize("argv", [
    ["--k", "2", "compare", "hi"],
    ["--k", "2", "--token-index", "1", "compare", "hi"],  # not an explain option either
    ["--no-chat-template", "explain", "hi"],
])
def test_options_before_a_command_are_refused(argv, no_load, capsys) -> None:
    assert main(argv) == 2
    line = one_error_line(capsys)
    command = next(word for word in argv if word in COMMANDS)
    assert f"put the command first: 'iglens {command} [options] PROMPT'" in line


def test_shorthand_keeps_prompts_that_only_look_like_commands() -> None:
    assert parse_args(["Explain", "gravity"]).prompts == ["Explain gravity"]
    assert parse_args(["compute", "2+2"]).prompts == ["compute 2+2"]
    args = parse_args(["--target", "compare", "hi"])  # a command name as an option's value
    assert (args.command, args.target, args.prompts) == ("explain", "compare", ["hi"])
    assert parse_args(["explain", "comapre", "hi"]).prompts == ["comapre hi"]
    with pytest.raises(UsageError, match="--k must be >= 1"):  # not "put the command first"
        parse_args(["--target", "compare", "hi", "--k", "0"])


def test_shorthand_equals_explain(patched_load, tmp_path, capsys) -> None:
    outputs = []
    for argv in ([], ["explain"]):
        js = tmp_path / f"{len(outputs)}.json"
        assert main([*argv, "--k", "3", "--max-new-tokens", "3", "--json", str(js), PROMPT]) == 0
        outputs.append((capsys.readouterr().out, json.loads(js.read_text())))
    assert "answer:" in outputs[0][0] and len(outputs[0][1]["tokens"]) == 3
    assert outputs[0] == outputs[1]


# ------------------------------------------------------------------- argument errors
PRELOAD_ERRORS = [
    ([""], "prompt is empty"),
    ([], "prompt is empty"),
    (["--k", "0", PROMPT], "--k must be >= 1"),
    (["--k", "x", PROMPT], "invalid int value"),
    (["--layers", "1,x", PROMPT], "--layers takes comma-separated ints"),
    (["--layers", ",", PROMPT], "names no layer"),
    (["--layers", "3,3", PROMPT], "twice"),
    (["--k", "3", "--layers", "1,2", PROMPT], "not both"),
    (["--method", "nope", PROMPT], "invalid choice"),
    (["--n-steps", "0", PROMPT], "--n-steps must be >= 1"),
    (["--method", "gausslegendre", "--n-steps", "1", PROMPT], "needs --n-steps"),
    (["--max-new-tokens", "0", PROMPT], "--max-new-tokens must be >= 1"),
    (["--internal-batch-size", "0", PROMPT], "--internal-batch-size must be >= 1"),
    (["--onset-frac", "0", PROMPT], "--onset-frac must be in (0, 1]"),
    (["--onset-frac", "1.5", PROMPT], "--onset-frac must be in (0, 1]"),
    (["--target", "", PROMPT], "--target is empty"),
    (["--stdin", PROMPT], "not several"),
    (["--loop", "--prompts-file", "p.txt"], "not several"),
    (["--prompts-file", "/no/such/prompts.txt"], "cannot read --prompts-file"),
    (["--model", "/no/such/folder", PROMPT], "neither"),
    (["--json", "/", PROMPT], "is a folder"),
    (["--json", "/no/such/dir/x.json", PROMPT], "does not exist"),
    (["--plot", "heat.xyz", PROMPT], "extensions"),
    (["--bogus", PROMPT], "unrecognized"),
    (["compare"], "prompt is empty"),
    (["compare", "--token-index", "-1", "Hi"], "--token-index must be >= 0"),
    (["compare", "--layers", "1,x", "Hi"], "--layers"),
    (["compare", "--k", "3", "--layers", "1", "Hi"], "--layers or --k"),
    (["compare", "--prefix", "a", "--token-index", "1", "Hi"], "not both"),
    (["compare", "--n-steps", "1", "Hi"], "--n-steps must be >= 2"),
    (["compare", "--max-new-tokens", "0", "Hi"], "--max-new-tokens must be >= 1"),
    (["compare", "--internal-batch-size", "0", "Hi"], "--internal-batch-size must be >= 1"),
    (["compare", "--baseline-token", "-2", "Hi"], "--baseline-token must be >= 0"),
    (["compare", "--gradient-method", "prediction_aware", "Hi"], "invalid choice"),
    (["compare", "--json", "/no/such/dir/x.json", "Hi"], "does not exist"),
    (["compare", "--plot", "cmp.xyz", "Hi"], "extensions"),
    (["compare", "--model", "/no/such/folder", "Hi"], "neither"),
    (["compare", "--stdin", "Hi"], "unrecognized"),
]


@pytest.mark.parametrize("argv, message", PRELOAD_ERRORS)
def test_argument_errors_exit_2_before_loading(argv, message, no_load, capsys) -> None:
    assert main(argv) == 2
    assert message in one_error_line(capsys)


@pytest.mark.parametrize("argv, message", [
    (["explain", "--stdin"], "--stdin read no prompt"),
    (["--prompts-file", "EMPTY"], "holds no prompt"),
])
def test_empty_prompt_sources_exit_2_before_loading(argv, message, no_load, tmp_path,
                                                    monkeypatch, capsys) -> None:
    empty = tmp_path / "empty.txt"
    empty.write_text("\n  \n", encoding="utf-8")
    monkeypatch.setattr(sys, "stdin", io.StringIO("\n \n"))
    assert main([str(empty) if word == "EMPTY" else word for word in argv]) == 2
    assert message in one_error_line(capsys)


@pytest.mark.parametrize("argv, message", [
    (["--layers", "0,40", PROMPT], "out of range"),
    (["--k", "40", PROMPT], "--k must be between 1 and 31"),
    (["compare", "--layers", "-32", PROMPT], "out of range"),
    (["compare", "--max-new-tokens", "2", "--token-index", "40", "Hi"], "past the answer"),
])
def test_errors_the_model_reveals_are_usage_errors(argv, message, patched_load, capsys) -> None:
    """What only the loaded model can tell (its number of blocks, its answer) is still a
    mistake in the command line: exit status 2, like every other one."""
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("iglens: error:") and message in err[-1]


# -------------------------------------------------------------------- runtime errors
def test_runtime_error_exits_1(tmp_path, capsys) -> None:
    """A folder that exists (the command line is fine) but holds no model: the real loader
    fails, one line, exit status 1."""
    assert main(["--model", str(tmp_path), PROMPT]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err[0].startswith("loading ") and len(err) == 2
    assert err[1].startswith("iglens: error:") and "Traceback" not in err[1]


def test_unexpected_error_names_its_type_and_debug_reraises(monkeypatch, capsys) -> None:
    class Boom(Exception):
        pass

    def load_model(spec=None, use_cache=True, device_map=None):
        raise Boom("first line\nsecond line")

    monkeypatch.setattr(models, "load_model", load_model)
    assert main(["compare", PROMPT]) == 1
    line = capsys.readouterr().err.strip().splitlines()[-1]
    assert line == "iglens: error: Boom: first line (IGLENS_DEBUG=1 shows the traceback)"
    monkeypatch.setenv("IGLENS_DEBUG", "1")
    with pytest.raises(Boom):
        main(["compare", PROMPT])


def test_ctrl_c_exits_130(monkeypatch, capsys) -> None:
    def load_model(spec=None, use_cache=True, device_map=None):
        raise KeyboardInterrupt

    monkeypatch.setattr(models, "load_model", load_model)
    assert main([PROMPT]) == 130
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        "iglens: interrupted: this command does not resume; re-run it to start over")


# ------------------------------------------------------------------------- explain
def test_explain_json_and_plot_on_smollm2(patched_load, tmp_path, capsys) -> None:
    path, png = tmp_path / "out.json", tmp_path / "heat.png"
    assert main(["--k", "4", "--max-new-tokens", "6", "--json", str(path), "--plot", str(png),
                 PROMPT]) == 0
    assert png.stat().st_size > 1000
    printed = capsys.readouterr().out
    assert "answer:" in printed and "completeness: max |sum - Δp|" in printed
    data = json.loads(path.read_text())
    for key in ("answer", "prompt_length", "input_ids", "layers", "method", "baseline",
                "tokens", "completeness_max_abs_error"):
        assert key in data
    assert data["layers"] == [0, 10, 20, 30]
    assert data["completeness_max_abs_error"] <= 1e-6
    token = data["tokens"][0]
    assert len(token["attributions"]) == 4 and len(token["lens_probs"]) == 4
    assert token["position"] == data["prompt_length"] - 1
    assert data["input_ids"][token["position"] + 1] == token["token_id"]
    assert abs(sum(token["attributions"]) - token["delta_p"]) <= 1e-6
    assert token["onset_layer"] in data["layers"]


def test_model_option_reaches_the_loader(smollm2, monkeypatch, capsys) -> None:
    specs = []

    def load_model(spec=None, use_cache=True, device_map=None):
        specs.append(spec)
        return smollm2

    monkeypatch.setattr(models, "load_model", load_model)
    assert main(["--model", "smollm2", "--layers", "30", "--target", " Paris", PROMPT]) == 0
    assert main(["compare", "--layers", "30", "--n-steps", "2", "--prefix", " is", PROMPT]) == 0
    assert specs == ["smollm2", None]
    assert "loading smollm2 ..." in capsys.readouterr().err


def test_prompts_file_target_gives_a_json_list_and_numbered_plots(patched_load, tmp_path,
                                                                  capsys) -> None:
    model, tokenizer = patched_load
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("The capital of France is\n\n  The capital of Italy is \n", "utf-8")
    js, png = tmp_path / "r.json", tmp_path / "heat.png"
    assert main(["explain", "--prompts-file", str(prompts), "--target", " Paris", "--k", "2",
                 "--no-chat-template", "--json", str(js), "--plot", str(png)]) == 0
    out = capsys.readouterr().out
    paris = tokenizer(" Paris", add_special_tokens=False)["input_ids"]
    assert out.count("prompt: ") == 2 and f"target token ids: {paris}" in out
    assert "chat template: not applied (raw prompt)" in out
    data = json.loads(js.read_text())
    assert [d["prompt"] for d in data] == ["The capital of France is", "The capital of Italy is"]
    assert all([t["token_id"] for t in d["tokens"]] == paris for d in data)
    assert (tmp_path / "heat-0.png").is_file() and (tmp_path / "heat-1.png").is_file()
    assert not png.exists()


def test_stdin_and_loop(patched_load, tmp_path, monkeypatch, capsys) -> None:
    monkeypatch.setattr(sys, "stdin", io.StringIO("The capital of France is\n"))
    js = tmp_path / "s.json"
    assert main(["--stdin", "--target", " Paris", "--k", "1", "--json", str(js)]) == 0
    assert json.loads(js.read_text())["prompt"] == "The capital of France is"
    answers = iter(["The capital of France is", "The capital of Spain is", ""])
    monkeypatch.setattr("builtins.input", lambda _prompt: next(answers))
    assert main(["--loop", "--target", " Paris", "--k", "1", "--json", str(js)]) == 0
    assert [d["prompt"] for d in json.loads(js.read_text())] == [
        "The capital of France is", "The capital of Spain is"]
    capsys.readouterr()
    monkeypatch.setattr("builtins.input", lambda _prompt: (_ for _ in ()).throw(EOFError))
    assert main(["--loop", "--k", "1", "--json", str(tmp_path / "none.json")]) == 0
    assert "no prompt was explained" in capsys.readouterr().err
    assert not (tmp_path / "none.json").exists()


# ------------------------------------------------------------------------- compare
def test_compare_json_and_plot(patched_load, tmp_path, capsys) -> None:
    model, tokenizer = patched_load
    js, png = tmp_path / "cmp.json", tmp_path / "cmp.png"
    rc = main(["compare", "--layers", "28", "--n-steps", "4", "--token-index", "1",
               "--json", str(js), "--plot", str(png), PROMPT])
    assert rc == 0
    out = capsys.readouterr().out
    for label in ("IG-Lens", "LayerIG", "LayerCond", "lens p", "|sum-total|"):
        assert label in out
    data = json.loads(js.read_text())
    assert data["layers"] == [28, 30] and data["n_steps"] == 4
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
    # by default IG-Lens starts at the same reference as Captum: one total for all methods
    assert data["lens_baseline"] == "reference ids"
    assert methods["ig_lens"]["total"] == pytest.approx(change, abs=1e-5)
    assert len(lig["convergence_deltas"]) == 2
    assert lig["completeness_gap"] == pytest.approx(abs(sum(lig["per_layer"]) - change), abs=1e-6)
    assert png.stat().st_size > 1000


def test_compare_prefix_and_gradient_method(patched_load, tmp_path, capsys) -> None:
    model, tokenizer = patched_load
    js = tmp_path / "p.json"
    rc = main(["compare", "--no-chat-template", "--layers", "29", "--n-steps", "2",
               "--gradient-method", "gausslegendre", "--lens-baseline", "mean", "--prefix", " is",
               "--json", str(js), "The capital of France"])
    assert rc == 0
    data = json.loads(js.read_text())
    assert data["layers"] == [29, 30] and "ig_lens_gradient" in data["methods"]
    assert data["lens_baseline"] == "mean"
    ids = list(tokenizer("The capital of France")["input_ids"])
    ids += tokenizer(" is", add_special_tokens=False)["input_ids"]
    assert data["input_ids"] == ids
    with torch.no_grad():
        greedy = int(model(torch.tensor([ids])).logits[0, -1].argmax())
    assert data["target_id"] == greedy
    assert "next token after prefix" in capsys.readouterr().out


def test_compare_layers_default_to_six_evenly_spaced() -> None:
    args = parse_args(["compare", PROMPT])
    assert resolve_layers(args, 30, DEFAULT_K) == [0, 6, 12, 18, 24, 30]
    assert resolve_layers(args, 3, DEFAULT_K) == [0, 1, 2, 3]  # capped at every layer
    assert resolve_layers(parse_args(["compare", "--k", "2", PROMPT]), 30, DEFAULT_K) == [0, 30]
    assert resolve_layers(parse_args([PROMPT]), 30) is None  # explain: every block


def test_a_closed_pipe_ends_quietly(monkeypatch, capsys) -> None:
    """`iglens ... | head`: the reader leaving is not an error (it used to exit 1 with a
    traceback about the flush)."""

    def run(_args):
        raise BrokenPipeError(32, "Broken pipe")

    monkeypatch.setattr(COMMANDS["explain"], "run", run)
    assert main(["explain", "hello"]) == 0
    assert "error" not in capsys.readouterr().err
