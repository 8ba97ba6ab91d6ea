"""``--scope`` and ``--grad-drop`` on the command line and in a run's fingerprint.

Both are recorded (and compared) only away from their defaults, so a default run keeps the
digest it always had: the digest over :data:`FINGERPRINT_KEYS` alone, computed here as
run_fingerprint computed it before these keys existed. A run at another scope has another
digest, and a resume that would mix the two is refused, before and after the model loads.
"""

from __future__ import annotations

import hashlib
import json
import warnings
from pathlib import Path

import pytest
from conftest import make_tiny
from tiny_tokenizer import word_tokenizer

from captum_iglens import IGLens
from captum_iglens.cli import main, parse_args
from captum_iglens.cli._options import attribution_settings
from captum_iglens.models import loading as models
from captum_iglens.run.fingerprint import RunMismatchError, run_fingerprint
from captum_iglens.run.records import read_records
from captum_iglens.run.resume import (
    FINGERPRINT_KEYS,
    fingerprint_settings,
    planned_entries,
    resume_mismatch,
)
from captum_iglens.run.runner import run_records
from captum_iglens.run.settings import RunSettings
from captum_iglens.settings import (
    AttributionSettings,
    GenerationSettings,
    ReportSettings,
    settings_from_record,
)


def _write(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


@pytest.fixture
def source(tmp_path: Path) -> Path:
    return _write(tmp_path / "in.jsonl", [{"id": "a", "prompt": "w3 w4 w5"},
                                          {"id": "b", "prompt": "w6 w7"}])


def _run_argv(source: Path, output: Path, *extra: str) -> list[str]:
    return ["run", "--input", str(source), "--output", str(output), "--no-chat-template",
            "--max-new-tokens", "2", "--no-progress", *extra]


def test_cli_options_reach_the_settings(source, tmp_path) -> None:
    out = tmp_path / "out.jsonl"
    default = attribution_settings(parse_args(_run_argv(source, out)))
    assert (default.scope, default.grad_drop) == ("position", False)
    seq = attribution_settings(parse_args(_run_argv(
        source, out, "--effect", "total", "--baseline", "zero", "--scope", "sequence")))
    assert (seq.effect, seq.scope, seq.grad_drop) == ("total", "sequence", False)
    star = attribution_settings(parse_args(
        ["explain", "--effect", "atp", "--baseline", "zero", "--grad-drop", "w1 w2"]))
    assert (star.effect, star.scope, star.grad_drop) == ("atp", "position", True)


@pytest.mark.parametrize("extra, message", [
    (["--scope", "sequence"], "--scope sequence places the gates of --effect total or atp"),
    (["--grad-drop"], "--grad-drop (AtP*'s GradDrop) modifies attribution patching"),
    (["--effect", "total", "--baseline", "zero", "--grad-drop"], "use it with --effect atp"),
    (["--effect", "atp", "--baseline", "zero", "--grad-drop", "--scope", "sequence"],
     "--scope position"),
    (["--effect", "total", "--baseline", "zero", "--scope", "sequence", "--granularity",
      "sublayer"], "sub-layer and head gates are position-scope only"),
    (["--effect", "total", "--scope", "layer"], "invalid choice: 'layer'"),
])
@pytest.mark.parametrize("command", ["explain", "run"])
def test_cli_refusals_before_the_model_loads(command, extra, message, source, tmp_path,
                                             monkeypatch, capsys) -> None:
    monkeypatch.setattr(models, "load_model", lambda *a, **k: pytest.fail("model loaded"))
    argv = (_run_argv(source, tmp_path / "out.jsonl", *extra) if command == "run"
            else ["explain", *extra, "w1 w2"])
    assert main(argv) == 2
    assert message in capsys.readouterr().err


def _fingerprint(model, attribution: AttributionSettings) -> dict:
    settings = fingerprint_settings(attribution, ReportSettings(), GenerationSettings(),
                                    stride=1)
    return run_fingerprint(model, layers=[1, 2], units="probability", settings=settings)


def _digest_without_new_keys(entries: dict, extra: tuple[str, ...] = ()) -> str:
    """The digest as run_fingerprint wrote it before ``scope`` and ``grad_drop`` existed."""
    compared = json.dumps([entries[k] for k in (*FINGERPRINT_KEYS, *extra)], sort_keys=True,
                          default=str)
    return hashlib.sha256(compared.encode()).hexdigest()[:16]


def test_default_digests_are_unchanged_and_another_scope_differs() -> None:
    model = make_tiny("llama").eval()
    readout = _fingerprint(model, AttributionSettings())
    assert "scope" not in readout and "grad_drop" not in readout
    assert readout["digest"] == _digest_without_new_keys(readout)
    total = _fingerprint(model, AttributionSettings(effect="total", baselines="zero"))
    assert "scope" not in total and "grad_drop" not in total
    assert total["digest"] == _digest_without_new_keys(total, ("effect",))  # exact: hex strings
    seq = _fingerprint(model, AttributionSettings(effect="total", baselines="zero",
                                                  scope="sequence"))
    assert seq["scope"] == "sequence" and "grad_drop" not in seq
    assert seq["digest"] not in (total["digest"], _digest_without_new_keys(seq, ("effect",)))
    star = _fingerprint(model, AttributionSettings(effect="atp", baselines="zero",
                                                   grad_drop=True))
    assert star["grad_drop"] is True
    atp = _fingerprint(model, AttributionSettings(effect="atp", baselines="zero"))
    assert star["digest"] != atp["digest"]
    # a fingerprint reads back as the settings that made it
    assert settings_from_record(seq).scope == "sequence"
    assert settings_from_record(star).grad_drop is True
    assert settings_from_record(total).scope == "position"


def _settings(scope: str) -> RunSettings:
    return RunSettings(batch_size=2, max_new_tokens=2, chat_template=False,
                       attribution=AttributionSettings(effect="total", baselines="zero",
                                                       n_steps=2, scope=scope))


def test_resuming_at_another_scope_is_refused(source, tmp_path) -> None:
    model = make_tiny("llama").eval()
    more = _write(tmp_path / "more.jsonl", [{"id": "a", "prompt": "w3 w4 w5"},
                                            {"id": "b", "prompt": "w6 w7"},
                                            {"id": "c", "prompt": "w8 w9"}])
    for first, then in (("position", "sequence"), ("sequence", "position")):
        out = tmp_path / f"{first}.jsonl"
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            run_records(model, word_tokenizer(), read_records(source), out, _settings(first),
                        progress=False, lens=IGLens(model, effect="total"))
        lines = [json.loads(line) for line in out.read_text().splitlines()]
        before = out.read_bytes()
        message = f"scope: '{first}' there, '{then}' now"
        # the check before the load (the CLI's) and the one after it
        planned = planned_entries(fingerprint_settings(
            _settings(then).attribution, ReportSettings(), GenerationSettings(2, False),
            stride=1), "probability")
        problem = resume_mismatch(lines, planned, out)
        assert problem is not None and message in problem
        with pytest.raises(RunMismatchError, match=message):
            run_records(model, word_tokenizer(), read_records(more), out, _settings(then),
                        progress=False, lens=IGLens(model, effect="total"))
        assert out.read_bytes() == before
