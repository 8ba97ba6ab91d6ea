"""Everything the command line and the input files decide is refused before the model loads
(exit status 2, without importing torch), and a rerun with nothing left to do says so
without loading the model.

The first run of a resume test runs a tiny random llama saved as a model folder; every
refusal after it runs with the loader replaced by a test failure."""

from __future__ import annotations

import fcntl
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import make_tiny
from tiny_tokenizer import word_tokenizer

from captum_iglens.cli import main
from captum_iglens.models import loading as models

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def loads(monkeypatch):
    """Count model loads; ``loads.forbid()`` makes a load fail the test."""

    class Loads:
        count = 0
        forbidden = False

        def forbid(self) -> None:
            self.forbidden = True

    seen = Loads()
    real = models.load_model

    def load_model(spec=None, use_cache=True, device_map=None):
        if seen.forbidden:
            pytest.fail(f"the model {spec!r} was loaded before the refusal")
        seen.count += 1
        return real(spec, use_cache=use_cache, device_map=device_map)

    monkeypatch.setattr(models, "load_model", load_model)
    return seen


def _write_input(path: Path, prompts: list[str]) -> Path:
    path.write_text("".join(json.dumps({"id": f"q{i}", "prompt": p}) + "\n"
                            for i, p in enumerate(prompts)), encoding="utf-8")
    return path


def _run(folder: Path, source: Path, output: Path, *extra: str) -> list[str]:
    return ["run", "--model", str(folder), "--input", str(source), "--output", str(output),
            "--no-chat-template", "--max-new-tokens", "2", "--no-progress", *extra]


@pytest.fixture
def done_run(tiny_folder, tmp_path, loads):
    """A finished block run of two records (all blocks, the default settings)."""
    source = _write_input(tmp_path / "in.jsonl", ["w1 w2", "w3"])
    output = tmp_path / "out.jsonl"
    assert main(_run(tiny_folder, source, output)) == 0 and loads.count == 1
    return source, output


def test_resume_with_other_settings_is_refused_before_loading(tiny_folder, done_run, loads,
                                                              capsys):
    source, output = done_run
    loads.forbid()
    capsys.readouterr()
    assert main(_run(tiny_folder, source, output, "--k", "2")) == 2
    assert capsys.readouterr().err == (
        f"iglens: error: {output} holds results of another run (layers: [1, 2, 3] there, "
        "[0, 3] now): resuming would mix their numbers. Write to another --output, or delete "
        "the file to start over.\n")
    assert main(_run(tiny_folder, source, output, "--method", "riemann_left",
                     "--units", "log-probability")) == 2
    err = capsys.readouterr().err
    assert ("units: 'probability' there, 'log-probability' now; method: 'prediction_aware' "
            "there, 'riemann_left' now; n_steps: None there, 50 now") in err
    assert main(_run(tiny_folder, source, output, "--granularity", "sublayer")) == 2
    assert "granularity: 'block' there, 'sublayer' now" in capsys.readouterr().err


def test_nothing_left_to_do_does_not_load_the_model(tiny_folder, done_run, loads, capsys):
    source, output = done_run
    before = output.read_bytes()
    assert all(line["run"]["source"] for line in map(json.loads, before.splitlines()))
    loads.forbid()
    capsys.readouterr()
    assert main(_run(tiny_folder, source, output)) == 0
    assert capsys.readouterr().err == (
        f"iglens run: nothing left to do: the 2 records are all in {output} (2 results, 0 "
        "errors), written with these settings from the same model files; the model was not "
        "loaded (delete the file, or write to another --output, to run them again)\n")
    assert output.read_bytes() == before
    # a changed record, or rewritten model files: the model is loaded and decides
    loads.forbidden = False
    _write_input(source, ["w1 w2", "w4"])
    assert main(_run(tiny_folder, source, output)) == 0 and loads.count == 2
    config = tiny_folder / "config.json"
    os.utime(config, ns=(config.stat().st_atime_ns, config.stat().st_mtime_ns + 10**9))
    assert main(_run(tiny_folder, source, output)) == 0 and loads.count == 3
    assert "0 were already done" not in capsys.readouterr().err


def test_a_locked_output_is_refused_before_loading(tiny_folder, tmp_path, loads, capsys):
    source = _write_input(tmp_path / "in.jsonl", ["w1"])
    output = tmp_path / "out.jsonl"
    lock = tmp_path / "out.jsonl.lock"
    loads.forbid()
    with open(lock, "a+") as handle:  # what a run writing the output holds
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        assert main(_run(tiny_folder, source, output)) == 2
    assert capsys.readouterr().err == (
        f"iglens: error: another process is writing --output {str(output)!r} (it holds "
        f"{lock}): wait for it to finish, or write to another --output\n")
    assert not output.exists()


def test_a_lock_taken_while_the_model_loads_is_a_usage_error(tiny_folder, tmp_path,
                                                             monkeypatch, capsys):
    """Two runs started together: the second finds the lock free before its load and taken
    after it (by the first run); that is still a usage error, exit 2, and nothing is written."""
    source = _write_input(tmp_path / "in.jsonl", ["w1"])
    output = tmp_path / "out.jsonl"
    lock = tmp_path / "out.jsonl.lock"
    real_load = models.load_model
    held = []

    def load_while_another_run_starts(*args, **kwargs):
        handle = open(lock, "a+")  # the other run takes the lock during this run's load
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        held.append(handle)
        return real_load(*args, **kwargs)

    monkeypatch.setattr(models, "load_model", load_while_another_run_starts)
    try:
        assert main(_run(tiny_folder, source, output)) == 2
    finally:
        for handle in held:
            handle.close()
    err = capsys.readouterr().err
    assert f"Another process is writing {output} (it holds {lock})" in err
    assert held and not output.exists()


@pytest.mark.parametrize("option, message", [
    (["--layers", "0,99"], "iglens: error: --layers: layer index 99 is out of range: this model "
     "has 30 decoder blocks, so hidden-state indices run from 0 to 30 (or -31..-1 from the "
     "end)\n"),
    (["--k", "100"], "iglens: error: --k must be between 1 and 31 for a model with 30 blocks\n"),
])
def test_layers_beyond_the_embedded_model_are_refused_before_loading(tmp_path, loads, capsys,
                                                                     option, message):
    source = _write_input(tmp_path / "in.jsonl", ["w1"])
    loads.forbid()
    assert main(["run", "--input", str(source), "--output", str(tmp_path / "o.jsonl"),
                 *option]) == 2
    assert capsys.readouterr().err == message


def test_layers_beyond_a_folders_config_are_refused_before_loading(tiny_folder, tmp_path,
                                                                   loads, capsys):
    source = _write_input(tmp_path / "in.jsonl", ["w1"])
    loads.forbid()
    assert main(_run(tiny_folder, source, tmp_path / "o.jsonl", "--layers", "5")) == 2
    assert "this model has 3 decoder blocks" in capsys.readouterr().err


def test_block_counts_known_without_loading(tiny_folder):
    from captum_iglens.models.facts import block_count

    assert block_count(str(tiny_folder)) == 3
    assert block_count(None) == block_count("SmolLM2") == 30
    assert block_count(str(tiny_folder / "missing")) is None


def test_the_embedded_block_count_is_the_gguf_files(tmp_path):
    """The stored 30 blocks and 8,192 positions are the embedded file's own metadata."""
    gguf = pytest.importorskip("gguf")
    from captum_iglens.models.registry import SMOLLM2_BLOCKS, SMOLLM2_POSITIONS

    try:
        path = models.default_gguf_path()
    except FileNotFoundError:
        pytest.skip("the embedded model is not installed")
    reader = gguf.GGUFReader(path)
    field = reader.fields["general.architecture"]
    arch = bytes(field.parts[field.data[0]]).decode()

    def value(key):
        entry = reader.fields[f"{arch}.{key}"]
        return int(entry.parts[entry.data[0]][0])

    assert (value("block_count"), value("context_length")) == (SMOLLM2_BLOCKS,
                                                               SMOLLM2_POSITIONS)


def test_validate_short_prompt_file_is_refused_before_loading(tmp_path, monkeypatch, loads,
                                                              capsys):
    """Four ~40-byte prompts: the byte bound (30 + bytes each) allows mean ablation's 200
    reference positions, the tokens of the cached tokenizer (a few a prompt) do not."""
    from captum_iglens.models.facts import cache_dir_for

    try:
        gguf = models.default_gguf_path()
    except FileNotFoundError:
        pytest.skip("the embedded model is not installed")
    monkeypatch.setenv("CAPTUM_IGLENS_CACHE", str(tmp_path / "cache"))
    word_tokenizer().save_pretrained(cache_dir_for(gguf))  # the entry's tokenizer.json
    prompts = ["w1 w2 w3 w4 w5 w6 w7 w8 w9 w10 w11 w12 w1",
               "w13 w14 w15 w16 w17 w18 w19 w20 w21 w22 w1",
               "w23 w24 w25 w26 w27 w28 w29 w30 w31 w32 w1",
               "w33 w34 w35 w36 w37 w38 w39 w40 w41 w42 w1"]
    assert all(len(p) >= 40 for p in prompts)
    path = tmp_path / "four.txt"
    path.write_text("\n".join(prompts) + "\n", encoding="utf-8")
    loads.forbid()
    assert main(["validate", "--prompts-file", str(path), "--ablation", "mean"]) == 2
    # the bound, computed here: 30 template tokens + 1 + the prompt's tokens, + 11 answer
    # tokens after position 0; the largest reference set is the others' spans
    tokens = [len(word_tokenizer()(p, add_special_tokens=False).input_ids) for p in prompts]
    spans = [30 + 1 + n + 12 - 1 for n in tokens]
    most = sum(spans) - min(spans)
    assert most < 200 <= 3 * min(30 + len(p) + 11 for p in prompts)  # bytes would allow it
    assert capsys.readouterr().err == (
        "iglens: error: mean ablation needs at least 200 reference positions (the other "
        "prompts' tokens, position 0 excluded), but with these 4 prompts and answers of at "
        f"most 12 tokens a prompt's reference set holds at most {most} (at least 5 prompts of "
        "this length are needed): use --ablation zero or --ablation resample (they need no "
        "reference set), or give more prompts (--prompts-file)\n")


def test_preload_refusals_import_no_torch(tmp_path):
    """The refusals run before torch is imported (about a second, where a load takes
    15-200 s)."""
    source = _write_input(tmp_path / "in.jsonl", ["w1"])
    code = ("import sys\nfrom captum_iglens.cli import main\n"
            f"status = main(['run', '--input', {str(source)!r}, '--output', "
            f"{str(tmp_path / 'o.jsonl')!r}, '--k', '100'])\n"
            "print('STATUS', status, 'torch' in sys.modules)\n")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env=env, check=True).stdout
    assert "STATUS 2 False" in out, out


def test_another_models_weights_are_a_usage_error_after_the_load(done_run, tmp_path, loads,
                                                                 capsys):
    """Only the load tells the weights apart: the refusal then is exit status 2 too."""
    source, output = done_run
    other = tmp_path / "other" / "tiny-llama"  # the same name, other weights
    make_tiny("llama", seed=1, n_layers=3).save_pretrained(other)
    word_tokenizer().save_pretrained(other)
    capsys.readouterr()
    assert main(_run(other, source, output)) == 2 and loads.count == 2
    err = capsys.readouterr().err
    assert f"iglens: error: {output} holds results of another run (weights: " in err


@pytest.mark.parametrize("argv, message", [
    (["explain", "--layers", "0,99", "hi"], "this model has 30 decoder blocks"),
    (["compare", "--k", "100", "hi"], "--k must be between 1 and 31 for a model with 30 blocks"),
])
def test_explain_and_compare_check_layers_before_loading(loads, capsys, argv, message):
    loads.forbid()
    assert main(argv) == 2
    assert message in capsys.readouterr().err
