"""Progress bars: drawn on stderr for long steps, silenced by progress_bars(False)."""

from __future__ import annotations

import pytest
import torch
from conftest import make_tiny

import captum_iglens._utils.progress as progress
from captum_iglens import IGLens
from captum_iglens._utils.progress import progress_bars, progress_enabled


@pytest.fixture
def no_delay(monkeypatch):
    monkeypatch.setattr(progress, "DELAY_S", 0.0)


def _gradient_run() -> torch.Tensor:
    model = make_tiny("llama").eval()
    ids = torch.arange(3, 9)[None]
    return IGLens(model).attribute(ids, method="gausslegendre", n_steps=8)


def test_gradient_estimator_draws_a_bar_on_stderr(no_delay, capsys) -> None:
    _gradient_run()
    err = capsys.readouterr().err
    # 1 position x 3 segments x 8 steps = 24 readout rows, all counted
    assert "IG-Lens gausslegendre readouts" in err and "/24 [" in err


def test_progress_bars_false_silences_every_bar(no_delay, capsys) -> None:
    with progress_bars(False):
        assert not progress_enabled()
        _gradient_run()
    assert progress_enabled()
    assert "readouts" not in capsys.readouterr().err


def test_short_work_draws_nothing_with_the_default_delay(capsys) -> None:
    assert progress.DELAY_S >= 1.0
    _gradient_run()  # well under a second on a tiny model
    assert "readouts" not in capsys.readouterr().err


def test_every_model_command_takes_no_progress(tmp_path) -> None:
    from captum_iglens.cli import parse_args

    records = tmp_path / "in.jsonl"
    records.write_text('{"id": "a", "prompt": "hi"}\n')
    out = str(tmp_path / "out.jsonl")

    run = ["run", "--no-progress", "--input", str(records), "--output", out]
    for argv in (["explain", "--no-progress", "hi"], ["compare", "--no-progress", "hi"],
                 ["validate", "--no-progress"], run):
        assert parse_args(argv).no_progress is True
