"""What a fresh user found about the effects on the command line and in the JSON: the text
table names what its credit column holds and gives AtP no onset; the explain JSON records
``scope`` and ``grad_drop``; AtP refuses estimator settings it would ignore (Python and CLI,
and resume does not tell two AtP runs apart by them); ``iglens validate --no-effects``; and
a fitted ``--lens`` with what it cannot read is refused before the model loads.

Tiny random llamas only (the word tokenizer, no chat template)."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import pytest
import torch
from tiny_families import make_family
from tiny_tokenizer import word_tokenizer

from captum_iglens import IGLens, explain
from captum_iglens.cli import main
from captum_iglens.models import loading as models
from captum_iglens.results import IGLensResult
from captum_iglens.run.fingerprint import check_resume
from captum_iglens.run.results_file import RunMismatchError
from captum_iglens.run.resume import settings_mismatch
from captum_iglens.settings import DEFAULT_N_STEPS
from captum_iglens.validate.predictors import DEFAULT_EFFECTS

PROMPT = "w3 w5 w7 w9 w2 w4"


@pytest.fixture(scope="module")
def lm():
    return make_family("llama", seed=1).eval()


@pytest.fixture
def tiny_load(monkeypatch, lm):
    """``load_model`` answers with the tiny llama and the word tokenizer."""
    monkeypatch.setattr(models, "load_model",
                        lambda spec=None, use_cache=True, device_map=None: (lm, word_tokenizer()))
    return lm


@pytest.fixture
def no_load(monkeypatch):
    """A model load fails the test: what is refused must be refused before it."""
    def load_model(spec=None, use_cache=True, device_map=None):
        pytest.fail(f"the model {spec!r} was loaded before the refusal")

    monkeypatch.setattr(models, "load_model", load_model)


def _error_line(capsys) -> str:
    err = [line for line in capsys.readouterr().err.strip().splitlines()
           if not line.startswith("loading ")]
    assert len(err) == 1, err
    assert err[0].startswith("iglens: error:") and "Traceback" not in err[0]
    return err[0]


def _explain_cli(capsys, tmp_path, *extra: str) -> tuple[str, dict]:
    path = tmp_path / "out.json"
    assert main(["explain", "--max-new-tokens", "3", "--no-chat-template", "--json",
                 str(path), *extra, PROMPT]) == 0
    return capsys.readouterr().out, json.loads(path.read_text())


def _row(table: str, name: str) -> list[str]:
    """The cells of the table row named ``name`` (the first block of tokens)."""
    for line in table.splitlines():
        head, _, rest = line.partition("|")
        if head.strip() == name:
            return [cell.strip() for cell in rest.split("|") if cell.strip()]
    raise AssertionError(f"no row {name!r} in\n{table}")


def _column_names(table: str) -> list[str]:
    """The column-name line: per token the credit's name and the level's."""
    for line in table.splitlines():
        head, _, rest = line.partition("|")
        if not head.strip() and "lens p" in rest:
            return rest.split()
    raise AssertionError(f"no column-name line in\n{table}")


# 1. the table names its credit column after the effect; AtP has no onset

@pytest.mark.parametrize("effect, name", [("readout", "IG"), ("total", "total"),
                                          ("atp", "AtP")])
def test_the_credit_column_is_named_after_the_effect(effect, name, tiny_load, tmp_path,
                                                     capsys) -> None:
    out, data = _explain_cli(capsys, tmp_path, "--effect", effect)
    n_shown = min(4, len(data["tokens"]))
    words = [w for w in _column_names(out) if w not in ("|", "lens", "p")]
    assert words == [name] * n_shown
    assert f"{name}: the " in " ".join(out.split())  # the legend names it too


def test_atp_shows_no_onset_and_the_legend_says_why(tiny_load, tmp_path, capsys) -> None:
    out, data = _explain_cli(capsys, tmp_path, "--effect", "atp")
    n_shown = min(4, len(data["tokens"]))
    assert _row(out, "onset") == ["n/a"] * n_shown
    legend = " ".join(out.split())
    assert "onset: n/a: AtP estimates are not a decomposition" in legend
    assert "(sustained rule)" not in legend


@pytest.mark.parametrize("effect", ["readout", "total"])
def test_readout_and_total_onsets_are_still_shown(effect, tiny_load, tmp_path,
                                                  capsys) -> None:
    out, data = _explain_cli(capsys, tmp_path, "--effect", effect)
    shown = data["tokens"][:4]
    # the onset row names each token's onset layer (JSON: hidden-state index L -> "L<l>")
    assert _row(out, "onset") == [f"L{t['onset_layer']}" for t in shown]
    assert "(sustained rule)" in " ".join(out.split())


# 2. the explain JSON records scope and grad_drop, and reads them back

@pytest.mark.parametrize("kwargs, recorded", [
    ({"effect": "total", "scope": "sequence"}, {"scope": "sequence"}),
    ({"effect": "atp", "grad_drop": True}, {"grad_drop": True}),
    ({"effect": "atp"}, {}),
])
def test_explain_json_records_scope_and_grad_drop(lm, kwargs, recorded) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        result = explain(lm, word_tokenizer(), PROMPT, max_new_tokens=2,
                         chat_template=False, **kwargs)
    data = json.loads(result.to_json())
    for key in ("scope", "grad_drop"):  # recorded only away from the default
        assert data.get(key) == recorded.get(key)
    back = IGLensResult.from_dict(data)
    assert back.scope == kwargs.get("scope", "position")
    assert back.grad_drop is kwargs.get("grad_drop", False)
    assert back.method == ("atp*" if kwargs.get("grad_drop") else result.method)


def test_a_readout_json_holds_no_scope_or_grad_drop_key(lm) -> None:
    data = explain(lm, word_tokenizer(), PROMPT, max_new_tokens=2, chat_template=False
                   ).to_dict()
    assert not {"scope", "grad_drop", "effect"} & set(data)


# 3. AtP refuses a method or n_steps: it is first-order and takes no steps

@pytest.mark.parametrize("given", [{"n_steps": 8}, {"method": "riemann_left"}])
def test_atp_refuses_a_method_or_steps_in_python(lm, given) -> None:
    ids = torch.tensor([[3, 17, 5, 9, 22, 11]])
    lens = IGLens(lm, effect="atp")
    with pytest.raises(ValueError, match="AtP is first-order") as caught:
        lens.attribute(ids, **given)
    (name, value), = given.items()  # the message names what was given, not the defaults
    assert f"given {name}={value!r}:" in str(caught.value)
    with pytest.raises(ValueError, match="takes no estimator or steps"):
        explain(lm, word_tokenizer(), PROMPT, max_new_tokens=2, chat_template=False,
                effect="atp", **given)
    # the total effect takes them; AtP at the defaults runs
    IGLens(lm, effect="total").attribute(ids, n_steps=4)
    assert lens.attribute(ids).shape == (1, len(lens.spec.layer_indices))


@pytest.mark.parametrize("extra", [["--n-steps", "8"], ["--method", "riemann_left"]])
def test_atp_refuses_a_method_or_steps_on_the_command_line(extra, no_load, tiny_folder,
                                                           capsys) -> None:
    assert main(["explain", "--model", str(tiny_folder), "--effect", "atp", *extra,
                 PROMPT]) == 2
    line = _error_line(capsys)
    assert "--effect atp takes no --method or --n-steps" in line and "first-order" in line


def test_resume_does_not_tell_two_atp_runs_apart_by_steps() -> None:
    theirs = {"method": "riemann_left", "n_steps": 8, "effect": "atp", "digest": "a"}
    mine = {"method": "prediction_aware", "n_steps": DEFAULT_N_STEPS, "effect": "atp",
            "digest": "b"}
    assert settings_mismatch(theirs, mine) == []
    check_resume([{"run": theirs}], mine, Path("out.jsonl"))
    # a total-effect run depends on its steps: still told apart
    total = {**theirs, "effect": "total"}
    assert settings_mismatch(total, {**mine, "effect": "total"}) == [
        "method: 'riemann_left' there, 'prediction_aware' now",
        f"n_steps: 8 there, {DEFAULT_N_STEPS} now"]
    with pytest.raises(RunMismatchError, match="n_steps: 8 there"):
        check_resume([{"run": total}], {**mine, "effect": "total"}, Path("out.jsonl"))
    # AtP against another setting that it reads is still refused
    with pytest.raises(RunMismatchError, match="top_k: 0 there, 3 now"):
        check_resume([{"run": {**theirs, "top_k": 0}}], {**mine, "top_k": 3}, Path("o"))


# 4. iglens validate --no-effects

@pytest.mark.parametrize("extra, effects", [(["--no-effects"], ()), ([], DEFAULT_EFFECTS)])
def test_validate_no_effects_skips_the_effect_predictors(extra, effects, tiny_folder,
                                                         tmp_path, monkeypatch,
                                                         capsys) -> None:
    from captum_iglens.validate import driver

    seen = {}

    class Done:
        def format_table(self) -> str:
            return "table"

    def validate(*_args, **kwargs):
        seen.update(kwargs)
        return Done()

    monkeypatch.setattr(driver, "validate", validate)
    prompts = tmp_path / "p.txt"
    prompts.write_text("w1 w2 w3\nw4 w5 w6\n")
    assert main(["validate", "--model", str(tiny_folder), "--ablation", "zero",
                 "--prompts-file", str(prompts), *extra]) == 0
    assert tuple(seen["effects"]) == effects


def test_validate_help_and_docs_name_no_effects(capsys) -> None:
    assert main(["validate", "--help"]) == 0
    assert "--no-effects" in capsys.readouterr().out
    docs = Path(__file__).resolve().parents[2] / "docs" / "cli.md"
    assert "`--no-effects`, which skips the effect predictors" in " ".join(
        docs.read_text(encoding="utf-8").split())


# 5. a fitted --lens with what it cannot read: refused before the load, naming the flags

@pytest.mark.parametrize("command", ["explain", "run"])
@pytest.mark.parametrize("extra, flag", [
    (["--effect", "total"], "--effect total"),
    (["--effect", "atp"], "--effect atp"),
    (["--granularity", "sublayer"], "--granularity sublayer"),
])
def test_lens_conflicts_are_usage_errors_before_the_load(command, extra, flag, no_load,
                                                         tiny_folder, tmp_path,
                                                         capsys) -> None:
    if command == "run":
        source = tmp_path / "in.jsonl"
        source.write_text(json.dumps({"id": "a", "prompt": PROMPT}) + "\n")
        argv = ["run", "--input", str(source), "--output", str(tmp_path / "o.jsonl")]
    else:
        argv = ["explain", PROMPT]
    assert main([*argv, "--model", str(tiny_folder), "--lens", "tuned", *extra]) == 2
    line = _error_line(capsys)
    assert "--lens tuned" in line and flag in line


def test_the_same_combinations_are_what_iglens_refuses(lm) -> None:
    from captum_iglens.lens.translators import TunedLens

    lens = TunedLens.for_model(lm)
    for kwargs in ({"effect": "total"}, {"effect": "atp"}, {"granularity": "sublayer"}):
        with pytest.raises(ValueError, match="per-layer readout"):
            IGLens(lm, lens=lens, **kwargs)
    IGLens(lm, lens=lens)  # block readout credits: taken


def test_an_atp_figure_shows_no_onset(lm) -> None:
    """AtP has no onset: its figure's caption and heatmap title promise no onset box."""
    import matplotlib

    matplotlib.use("Agg")
    result = explain(lm, word_tokenizer(), PROMPT, max_new_tokens=2, chat_template=False,
                     effect="atp")
    fig = result.plot()
    texts = [t.get_text() for t in fig.texts] + [ax.get_title() for ax in fig.axes]
    assert not any("□ onset" in t for t in texts), texts
    assert any("No onset" in t for t in texts)
    readout = explain(lm, word_tokenizer(), PROMPT, max_new_tokens=2, chat_template=False)
    assert any("□ onset" in t.get_text() for t in readout.plot().texts)
