"""The dataset path: `iglens run` (records, batches, resume, sharding, error records, document
mode) and the batched / document functions under it, on a tiny random llama (GPT-2 where a
position table must limit the prompt length).

Numbers are compared with the bounds of tests/_tolerance.py: a row of a left-padded batch
against the same prompt alone (or in another batch) within the whole-model node sensitivity
of that prompt; two runs of the very same batches (several processes against one, a redone
record with batch size 1) byte for byte; cached passes of a document within the whole-model bound.
"""

from __future__ import annotations

import json
import os
import random
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from _tolerance import (
    EPS32,
    completeness_tol,
    credit_sensitivity,
    f32_tol,
    node_sensitivity,
    reduction_length,
)
from conftest import make_tiny
from tiny_tokenizer import word_tokenizer

from captum_iglens import IGLens
from captum_iglens.cli import main
from captum_iglens.lens.context import max_sequence_length
from captum_iglens.run.records import read_records
from captum_iglens.run.results_file import read_lines
from captum_iglens.run.runner import run_records
from captum_iglens.run.settings import RunSettings
from captum_iglens.text.batched import AnswerJob, explain_batch, explain_recorded
from captum_iglens.text.document import document_positions, explain_document
from captum_iglens.text.explain_prompt import explain_ids, generate_answer
from captum_iglens.text.generation import generate_batch
from captum_iglens.text.prompts import render_prompt
from captum_iglens.text.recorded import generate_recording

ROOT = Path(__file__).resolve().parents[2]
MAX_NEW = 6
# Per token, the fields compared exactly (the floats have bounds: assert_tokens_close).
EXACT_TOKEN_KEYS = ("token", "token_id", "position", "onset_layer", "is_argmax", "contrast_id",
                    "contrast_token")


def words(rng: random.Random, n: int) -> str:
    return " ".join(f"w{rng.randrange(124)}" for _ in range(n))


def write_jsonl(path: Path, rows: list) -> Path:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows),
                    encoding="utf-8")
    return path


def run_args(folder: Path, source: Path, output: Path, *extra: str) -> list[str]:
    return ["run", "--model", str(folder), "--input", str(source), "--output", str(output),
            "--no-chat-template", "--max-new-tokens", str(MAX_NEW), "--no-progress", *extra]


def lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def without_seconds(line: dict) -> dict:
    return {k: v for k, v in line.items() if k != "seconds"}


@pytest.fixture(autouse=True)
def one_thread():
    """Torch on one thread here, as in the processes the tests launch (OMP_NUM_THREADS=1):
    a run here and a launched one then do the same float operations, and no OpenMP thread
    spins waiting for a sibling descheduled on this shared machine."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def env_one_thread() -> dict:
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", HF_HUB_OFFLINE="1",
               TRANSFORMERS_OFFLINE="1", CUDA_VISIBLE_DEVICES="")  # CPU runs, as here
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    env.pop("IGLENS_DEBUG", None)
    return env


@pytest.fixture(scope="session")
def gpt2_folder(tmp_path_factory) -> Path:
    """A tiny random GPT-2 (3 blocks): a learned table of 128 positions, so a longer prompt
    cannot run (rotary llama has no such limit: max_sequence_length is None there)."""
    folder = tmp_path_factory.mktemp("models") / "tiny-gpt2"
    make_tiny("gpt2", n_layers=3).save_pretrained(folder)
    word_tokenizer().save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def loaded(tiny_folder):
    """The folder's model and tokenizer as `iglens run` loads them (eval mode)."""
    from captum_iglens.models.loading import load_model

    return load_model(str(tiny_folder))


@pytest.fixture(scope="module")
def tiny():
    """A tiny llama (3 blocks) and the word tokenizer, in process."""
    return make_tiny("llama", n_layers=3).eval(), word_tokenizer()


# ------------------------------------------------------------------------------- tolerances
def answer_bounds(lens: IGLens, input_ids: list[int], positions: list[int], targets: list[int],
                  foils: list[int] | None = None) -> dict[str, torch.Tensor]:
    """Bounds for one prompt's numbers computed in two forward passes of other shapes (alone,
    or as a row of a left-padded batch): each within eps sqrt(n) times the whole-model node
    sensitivity of the prompt alone (padding gets no attention weight, so a padded row's
    sensitivity is that one), as tests/test_compare.py's left-padding test. Contrastive: the
    target's plus the foil's. Returns per-token bounds for every float field of the JSON."""
    ids = torch.tensor([input_ids[:positions[-1] + 1]])
    sens = node_sensitivity(lens, ids, positions, torch.tensor([targets]))[0]
    if foils is not None:
        sens = sens + node_sensitivity(lens, ids, positions, torch.tensor([foils]))[0]
    n = reduction_length(lens.model)
    node = f32_tol(sens, sens, n_terms=n)  # [T, k + 1]
    credit = f32_tol(credit_sensitivity(sens), credit_sensitivity(sens), n_terms=n)  # [T, k]
    return {"attributions": credit, "lens_probs": node[:, 1:], "p_final": node[:, -1],
            "p_baseline": node[:, 0], "credit": credit, "node": node}


def assert_tokens_close(got: list[dict], want: list[dict], bounds: dict) -> None:
    """Per token: exact fields equal; floats within ``bounds``; the derived floats (delta,
    sums) within the bounds of what they are computed from plus their own float32 sums."""
    assert len(got) == len(want)
    u = EPS32 / 2
    for t, (a, b) in enumerate(zip(got, want, strict=True)):
        assert {k: a.get(k) for k in EXACT_TOKEN_KEYS} == {k: b.get(k) for k in EXACT_TOKEN_KEYS}
        assert set(a) == set(b)
        for key in ("attributions", "lens_probs", "p_final", "p_baseline"):
            diff = (torch.tensor(a[key], dtype=torch.float64)
                    - torch.tensor(b[key], dtype=torch.float64)).abs()
            assert (diff <= bounds[key][t]).all(), (t, key, diff, bounds[key][t])
        mags = [abs(x["delta_p"]) + abs(x["p_final"]) + abs(x["p_baseline"]) for x in (a, b)]
        tol = float(bounds["p_final"][t] + bounds["p_baseline"][t]) + u * sum(mags)
        assert abs(a["delta_p"] - b["delta_p"]) <= tol
        k = len(a["attributions"])
        sums = [(k - 1) * u * sum(abs(c) for c in x["attributions"]) for x in (a, b)]
        tol = float(bounds["attributions"][t].sum()) + sum(sums)
        assert abs(a["sum_attributions"] - b["sum_attributions"]) <= tol
        for x in (a, b):  # each adds up to its own Δp (Proposition 1)
            gap = abs(x["sum_attributions"] - x["delta_p"])
            assert gap <= float(completeness_tol(torch.tensor([x["attributions"]]),
                                                 torch.tensor([x["delta_p"]]))[0])


def assert_record_close(got: dict, want: dict, lens: IGLens, skip: tuple = ()) -> None:
    """Everything but wall time, ``skip`` and the floats exactly; floats within the bounds
    of two forward passes of other shapes."""
    skip = {"seconds", "tokens", "completeness_max_abs_error", *skip}
    assert {k: v for k, v in got.items() if k not in skip} == \
        {k: v for k, v in want.items() if k not in skip}
    if want["status"] != "ok":
        return
    toks = want["tokens"]
    foils = [t["contrast_id"] for t in toks] if want["contrastive"] else None
    bounds = answer_bounds(lens, want["input_ids"], [t["position"] for t in toks],
                           [t["token_id"] for t in toks], foils)
    assert_tokens_close(got["tokens"], toks, bounds)


def result_tokens(result) -> list[dict]:
    return result.to_dict()["tokens"]


# --------------------------------------------------------------------------- 1. kill -9
@pytest.mark.numerics
def test_killed_run_resumes_to_the_uninterrupted_output(tiny_folder, loaded, tmp_path, capsys):
    """SIGKILL mid-run, a torn half line appended as a write cut mid-line would leave, then
    the same command again: every id once, in input order, each the uninterrupted run's
    record (the resumed batches hold other records: floats within the padding bound)."""
    rng = random.Random(50)
    source = write_jsonl(tmp_path / "d50.jsonl",
                         [{"id": f"r{i}", "prompt": words(rng, rng.randint(2, 9))}
                          for i in range(50)])
    ref, out = tmp_path / "ref.jsonl", tmp_path / "out.jsonl"
    assert main(run_args(tiny_folder, source, ref, "--batch-size", "2")) == 0
    reference = lines(ref)
    assert [r["id"] for r in reference] == [f"r{i}" for i in range(50)]
    assert all(r["status"] == "ok" for r in reference)

    stop_after = random.Random(7).randint(3, 25)  # kill once this many lines are written
    command = [sys.executable, "-m", "captum_iglens",
               *run_args(tiny_folder, source, out, "--batch-size", "2")]
    proc = subprocess.Popen(command, env=env_one_thread(), stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, cwd=tmp_path)
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and proc.poll() is None:
            if out.exists() and out.read_bytes().count(b"\n") >= stop_after:
                break
            time.sleep(0.002)
        assert proc.poll() is None, "the run ended before it could be killed"
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        proc.kill()
        proc.wait()
    assert proc.returncode == -signal.SIGKILL
    written = read_lines(out)[0]
    assert stop_after <= len(written) < 50
    whole = json.dumps(reference[-1]).encode()
    with open(out, "ab") as handle:  # a write cut mid-line
        handle.write(whole[:len(whole) // 2])

    capsys.readouterr()
    assert main(run_args(tiny_folder, source, out, "--batch-size", "2")) == 0
    err = capsys.readouterr().err
    assert "torn last line" in err
    assert f"({len(written)} were already done)" in err
    resumed = lines(out)
    assert [r["id"] for r in resumed] == [f"r{i}" for i in range(50)]
    before = {r["id"]: r for r in written}
    model, _ = loaded
    lens = IGLens(model)
    for got, want in zip(resumed, reference, strict=True):
        if got["id"] in before:
            # written before the kill: kept as written, and run in the reference's batches
            # with the same threads, so equal to its records exactly
            assert got == before[got["id"]]
            assert without_seconds(got) == without_seconds(want)
        else:
            assert_record_close(got, want, lens)
    assert not list(tmp_path.glob("out.jsonl.*"))


# ------------------------------------------------------------------- 2. several processes
def test_two_processes_write_the_single_process_output(tiny_folder, tmp_path, capsys):
    """`torchrun --nproc_per_node 2`: each process runs every other batch of the same plan
    into its part file, rank 0 merges. The batches are those of one process and every
    process runs one thread, as the reference here: the same float operations, so the
    records are equal exactly (wall time aside), and no part file is left."""
    pytest.importorskip("accelerate")
    rng = random.Random(2)
    rows = [{"id": f"p{i}", "prompt": words(rng, rng.randint(2, 8))} for i in range(6)]
    rows.insert(2, {"id": "doc", "text": words(rng, 12), "positions": [0, 4, -1]})
    rows.insert(5, {"id": "forced", "prompt": words(rng, 4), "answer": "w5 w6 w7",
                    "contrast": "w9", "topic": "x"})
    rows.append({"id": "kept", "prompt": words(rng, 3), "positions": [-1]})
    source = write_jsonl(tmp_path / "d.jsonl", rows)
    ref, out = tmp_path / "ref.jsonl", tmp_path / "out.jsonl"
    assert main(run_args(tiny_folder, source, ref, "--batch-size", "2")) == 0
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone",
               "--nproc_per_node", "2", "-m", "captum_iglens",
               *run_args(tiny_folder, source, out, "--batch-size", "2")]
    done = subprocess.run(command, env=env_one_thread(), capture_output=True, text=True,
                          cwd=tmp_path, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stderr.count("loading ") == 2  # two processes ran
    assert done.stderr.count("were already done") == 1  # rank 0 reports
    got, want = lines(out), lines(ref)
    # rank 0 explained some of the tokens, the other process the rest
    own = int(re.search(r"(\d+) tokens explained now by this process", done.stderr).group(1))
    assert 0 < own < sum(len(r["tokens"]) for r in want)
    assert [r["id"] for r in got] == [r["id"] for r in rows]
    assert [without_seconds(r) for r in got] == [without_seconds(r) for r in want]
    assert not list(tmp_path.glob("out.jsonl.*"))


# ------------------------------------------------------------------------ 3. error records
def test_bad_records_become_error_records(gpt2_folder, tmp_path, capsys):
    """An empty prompt, a prompt beyond the position table, a target outside the vocabulary
    and a line that is not JSON, among good records: one error line each (with its id and
    a message naming the problem), the others complete, exit status 1, errors counted."""
    from captum_iglens.models.loading import load_model

    model, _ = load_model(str(gpt2_folder))
    limit = max_sequence_length(model)
    assert limit == 128
    rng = random.Random(3)
    rows = [{"id": "ok1", "prompt": words(rng, 4)},
            {"id": "empty", "prompt": "  "},
            {"id": "ok2", "prompt": words(rng, 5), "answer": "w1 w2"},
            {"id": "long", "prompt": words(rng, limit + 1)},
            {"id": "vocab", "prompt": words(rng, 3), "target": [7, 500]},
            '{"id": "torn", "prompt": "w1',
            {"id": "ok3", "prompt": words(rng, 3)},
            {"id": "edge", "prompt": words(rng, limit - MAX_NEW)}]
    source = write_jsonl(tmp_path / "bad.jsonl", rows)
    out = tmp_path / "out.jsonl"
    capsys.readouterr()
    assert main(run_args(gpt2_folder, source, out, "--batch-size", "3")) == 1
    err = capsys.readouterr().err
    assert "4 results, 4 errors of 8 records" in err
    got = lines(out)
    assert [r["id"] for r in got] == ["ok1", "empty", "ok2", "long", "vocab", "line-6", "ok3",
                                      "edge"]
    status = {r["id"]: r["status"] for r in got}
    assert status == {"ok1": "ok", "empty": "error", "ok2": "ok", "long": "error",
                      "vocab": "error", "line-6": "error", "ok3": "ok", "edge": "ok"}
    errors = {r["id"]: r["error"] for r in got if r["status"] == "error"}
    assert "empty" in errors["empty"]
    assert f"{limit + 1} tokens" in errors["long"] and str(limit) in errors["long"]
    assert "500" in errors["vocab"] and "vocabulary" in errors["vocab"]
    assert "line 6 is not JSON" in errors["line-6"]
    assert all(r["index"] == i for i, r in enumerate(got))
    # the good records of the batches that held bad ones are the ones of a clean run
    clean = write_jsonl(tmp_path / "clean.jsonl", [r for r in rows if isinstance(r, dict)
                                                   and r["id"] in ("ok1", "ok2", "ok3")])
    assert main(run_args(gpt2_folder, clean, tmp_path / "clean-out.jsonl")) == 0
    lens = IGLens(model)
    by_id = {r["id"]: r for r in got}
    for want in lines(tmp_path / "clean-out.jsonl"):
        assert_record_close(by_id[want["id"]], want, lens, skip=("index",))


def test_a_failing_generation_fails_its_record_only(loaded, tmp_path, monkeypatch):
    """Generation that fails for one prompt: the batch is retried one prompt at a time and
    only that prompt becomes an error record; the run goes on."""
    import captum_iglens.run.runner as run_module

    model, tok = loaded
    real = run_module.generate_recording

    def failing(lens, tokenizer, prompt_ids, max_new_tokens, baselines):
        if any(5 + 4 in ids for ids in prompt_ids):  # the prompt holding w5
            raise RuntimeError("generation broke on w5")
        return real(lens, tokenizer, prompt_ids, max_new_tokens, baselines)

    monkeypatch.setattr(run_module, "generate_recording", failing)
    records = read_records(write_jsonl(tmp_path / "d.jsonl", [
        {"id": "a", "prompt": "w1 w2"}, {"id": "b", "prompt": "w5 w6"},
        {"id": "c", "prompt": "w7 w8"}]))
    report = run_records(model, tok, records, tmp_path / "out.jsonl",
                         RunSettings(batch_size=3, max_new_tokens=2, chat_template=False),
                         progress=False)
    assert (report.n_ok, report.n_errors) == (2, 1)
    got = lines(tmp_path / "out.jsonl")
    assert [(r["id"], r["status"]) for r in got] == [("a", "ok"), ("b", "error"), ("c", "ok")]
    assert got[1]["error"] == "generation broke on w5" and got[1]["error_type"] == "RuntimeError"


# ------------------------------------------------------------------ 4. batched == single
def _job(tokenizer, prompt: str, answer: list[int], foils: list[int] | None = None) -> AnswerJob:
    return AnswerJob(prompt, render_prompt(tokenizer, prompt, chat_template=False),
                     answer_ids=answer, foils=foils)


@pytest.mark.numerics
@pytest.mark.parametrize("contrastive", [False, True])
def test_batch_rows_equal_each_prompt_alone(tiny, contrastive):
    """Prompts of 6, 4 and 2 tokens with answers of 4, 1 and 3 tokens in one left-padded
    forward (a batch whose answers are one token each, and one whose 1-token prompt with its
    answer is shorter than the longest answer: padding inside the explained columns): every
    row equals explain_ids on that prompt alone, within the whole-model bound of two forward
    passes of other shapes."""
    model, tok = tiny
    lens = IGLens(model)
    gen = torch.Generator().manual_seed(4)
    batches = [[(6, 4), (4, 1), (2, 3)], [(3, 1), (5, 1)], [(7, 6), (1, 2), (2, 1)]]
    for shape in batches:
        jobs = []
        for n_prompt, n_answer in shape:
            ids = torch.randint(4, 128, (n_prompt + 2 * n_answer,), generator=gen).tolist()
            prompt = " ".join(f"w{i - 4}" for i in ids[:n_prompt])
            answer = ids[n_prompt:n_prompt + n_answer]
            foils = None
            if contrastive:  # one foil per answer token, never the token itself
                foils = [f if f != a else (a + 1) % 128
                         for f, a in zip(ids[n_prompt + n_answer:], answer, strict=True)]
            jobs.append(_job(tok, prompt, answer, foils))
        if shape is batches[-1]:  # the case is real: a row is padded in explained columns
            assert min(len(j.rendered.ids) + len(j.answer_ids) - 1 for j in jobs) < 6
        rows = explain_batch(lens, tok, jobs)
        for job, row in zip(jobs, rows, strict=True):
            alone = explain_ids(model, job.rendered.ids, job.answer_ids, tokenizer=tok,
                                prompt=job.prompt, lens=lens, contrast=job.foils)
            assert row.prompt == alone.prompt and row.answer == alone.answer
            assert row.input_ids == alone.input_ids and row.prompt_length == alone.prompt_length
            assert row.contrast_ids == alone.contrast_ids == job.foils
            bounds = answer_bounds(lens, alone.input_ids, alone.positions, alone.token_ids,
                                   job.foils)
            assert_tokens_close(result_tokens(row), result_tokens(alone), bounds)
            # meaningful: the credits stand well above the bound (padding that is attended
            # moves the padded rows' credits here by their own size, 2e-2)
            assert row.attributions.abs().max() > 20 * bounds["credit"].max()


@pytest.mark.numerics
@pytest.mark.parametrize("family", ["llama", "gpt2", "gemma2", "bloom", "falcon_h1", "mpt"])
@pytest.mark.parametrize("contrastive", [False, True])
def test_recorded_generation_equals_teacher_forcing_alone(family, contrastive):
    """Residuals recorded while generating (prompt pass, then one KV-cached pass per token)
    give each prompt's teacher-forced result alone, within the whole-model bound of two
    forward passes of other shapes, for families with tuple outputs, learned or ALiBi
    positions, soft-capped logits and state-space blocks. The answers are
    generate_batch's, every token is the argmax of the attributed pass, and the model holds
    no hook afterwards."""
    model, tok = make_tiny(family, n_layers=3).eval(), word_tokenizer()
    lens = IGLens(model)
    rng = random.Random(11)
    prompts = [words(rng, n) for n in (6, 2, 4)]
    rendered = [render_prompt(tok, p, chat_template=False) for p in prompts]
    hooks = sum(len(m._forward_hooks) + len(m._forward_pre_hooks) for m in model.modules())
    recording = generate_recording(lens, tok, [r.ids for r in rendered], 5)
    assert recording.answers == generate_batch(model, tok, [r.ids for r in rendered], 5)
    assert hooks == sum(len(m._forward_hooks) + len(m._forward_pre_hooks)
                        for m in model.modules())
    jobs = []
    for prompt, r, answer in zip(prompts, rendered, recording.answers, strict=True):
        foils = [(a + 1 + t) % 128 for t, a in enumerate(answer)] if contrastive else None
        jobs.append(AnswerJob(prompt, r, answer, foils=foils, generated=True))
    rows = explain_recorded(lens, tok, recording, jobs, top_k=2)
    for job, row in zip(jobs, rows, strict=True):
        alone = explain_ids(model, job.rendered.ids, job.answer_ids, tokenizer=tok,
                            prompt=job.prompt, lens=lens, contrast=job.foils, top_k=2)
        assert row.input_ids == alone.input_ids and row.positions == alone.positions
        assert all(row.is_argmax)
        bounds = answer_bounds(lens, alone.input_ids, alone.positions, alone.token_ids,
                               job.foils)
        got, want = result_tokens(row), result_tokens(alone)
        if not all(alone.is_argmax):  # a near tie the teacher-forced pass breaks otherwise
            for token in got + want:
                token.pop("is_argmax", None)
        assert_tokens_close(got, want, bounds)
        assert row.attributions.abs().max() > 20 * bounds["credit"].max()


def test_generate_batch_equals_one_prompt_at_a_time(tiny):
    """Left-padded greedy generation gives each prompt's own greedy answer."""
    model, tok = tiny
    rng = random.Random(5)
    prompts = [render_prompt(tok, words(rng, n), chat_template=False).ids for n in (2, 7, 4, 9)]
    batched = generate_batch(model, tok, prompts, 5)
    alone = [generate_answer(model, tok, p, 5) for p in prompts]
    assert batched == alone
    assert all(1 <= len(a) <= 5 for a in batched)


# ---------------------------------------------------------------------------- 5. resume
def test_rerun_skips_everything_and_a_torn_line_is_redone(tiny_folder, loaded, tmp_path,
                                                           capsys):
    """The same command twice: the second skips every record and leaves the output byte for
    byte. A torn last line is cut (warning) and its record run again, here alone as before
    (batch size 1): the same operations, the same line."""
    model, tok = loaded
    rng = random.Random(6)
    source = write_jsonl(tmp_path / "d.jsonl",
                         [{"id": i, "prompt": words(rng, 3 + i)} for i in range(4)])
    out = tmp_path / "out.jsonl"
    assert main(run_args(tiny_folder, source, out, "--batch-size", "1")) == 0
    first = out.read_bytes()
    assert len(first.splitlines()) == 4
    capsys.readouterr()
    assert main(run_args(tiny_folder, source, out, "--batch-size", "1")) == 0
    # every record done by these settings and model files: said without loading the model
    assert "nothing left to do: the 4 records are all in" in capsys.readouterr().err
    assert out.read_bytes() == first
    report = run_records(model, tok, read_records(source), out,
                         RunSettings(batch_size=1, max_new_tokens=MAX_NEW, chat_template=False),
                         progress=False)
    assert (report.n_skipped, report.n_ok, report.n_errors, report.n_tokens) == (4, 4, 0, 0)
    assert out.read_bytes() == first

    kept = first.splitlines(keepends=True)
    out.write_bytes(b"".join(kept[:3]) + kept[3][:40])  # the last write cut mid-line
    capsys.readouterr()
    assert main(run_args(tiny_folder, source, out, "--batch-size", "1")) == 0
    err = capsys.readouterr().err
    assert "cut off a torn last line (40 bytes)" in err and "(3 were already done)" in err
    assert [without_seconds(r) for r in lines(out)] == \
        [without_seconds(json.loads(r)) for r in kept]

    dup = write_jsonl(tmp_path / "dup.jsonl", [{"id": "a", "prompt": "w1"},
                                               {"id": "b", "prompt": "w2"},
                                               {"id": "a", "prompt": "w3"}])
    with pytest.raises(ValueError, match=r"records 1 and 3 share the id 'a'"):
        read_records(dup)
    capsys.readouterr()
    assert main(run_args(tiny_folder, dup, tmp_path / "dup-out.jsonl")) == 2
    assert "share the id 'a'" in capsys.readouterr().err
    assert not (tmp_path / "dup-out.jsonl").exists()


# ------------------------------------------------------------------------ 6. documents
def test_document_positions():
    assert document_positions(6) == [0, 1, 2, 3, 4]
    assert document_positions(6, stride=2) == [0, 2, 4]
    assert document_positions(6, [-1, 0, -5, 2, 2]) == [0, 2, 4]
    for bad in ([5], [-6]):
        with pytest.raises(ValueError, match="out of range"):
            document_positions(6, bad)
    with pytest.raises(ValueError, match="fewer than 2"):
        document_positions(1)
    with pytest.raises(ValueError, match="stride"):
        document_positions(6, stride=0)


@pytest.mark.numerics
def test_document_chunks_and_targets(tiny):
    """Every next-token prediction of a text: targets are the text's own next tokens; cached
    passes of 3 positions give the numbers of one pass of 128 (forwards of other lengths over
    a KV cache: within the whole-model bound); each position adds up to its Δp."""
    model, tok = tiny
    lens = IGLens(model)
    text = words(random.Random(8), 14)
    ids = render_prompt(tok, text, chat_template=False).ids
    whole = explain_document(lens, tok, text)
    parts = explain_document(lens, tok, text, chunk=3)
    assert whole.positions == parts.positions == list(range(len(ids) - 1))
    assert whole.token_ids == parts.token_ids == ids[1:]
    assert whole.input_ids == ids and whole.prompt == text and whole.prompt_length == 1
    assert whole.extras["document"] is True and whole.to_dict()["document"] is True
    sens = node_sensitivity(lens, torch.tensor([ids]), whole.positions,
                            torch.tensor([whole.token_ids]))[0]
    n = reduction_length(lens.model)
    node = f32_tol(sens, sens, n_terms=n)
    credit = f32_tol(credit_sensitivity(sens), credit_sensitivity(sens), n_terms=n)
    bounds = {"attributions": credit, "lens_probs": node[:, 1:], "p_final": node[:, -1],
              "p_baseline": node[:, 0]}
    assert_tokens_close(result_tokens(parts), result_tokens(whole), bounds)
    assert whole.attributions.abs().max() > 20 * credit.max()  # as the batch tests
    for result in (whole, parts):
        gap = (result.attributions.double().sum(-1) - result.delta_p.double()).abs()
        assert (gap <= completeness_tol(result.attributions, result.delta_p)).all()

    strided = explain_document(lens, tok, text, stride=4, chunk=2)
    assert strided.positions == list(range(0, len(ids) - 1, 4))
    assert strided.token_ids == [ids[p + 1] for p in strided.positions]
    picked = explain_document(lens, tok, text, positions=[-1, 0, 3])
    assert picked.positions == [0, 3, len(ids) - 2]
    assert picked.token_ids == [ids[1], ids[4], ids[-1]]
    with pytest.raises(ValueError, match="out of range"):
        explain_document(lens, tok, text, positions=[len(ids) - 1])


def test_text_file_writes_one_document_record(tiny_folder, tmp_path, capsys):
    """`--text-file`: one record, id the file name, `"document": true`, every position (or
    every `--stride`-th), and `--contrast` applies to it too."""
    text = " ".join(w for w in words(random.Random(9), 10).split() if w != "w3")  # foil below
    source = tmp_path / "essay.txt"
    source.write_text(text + "\n", encoding="utf-8")
    out = tmp_path / "essay.jsonl"
    args = ["run", "--model", str(tiny_folder), "--text-file", str(source), "--output",
            str(out), "--no-progress", "--stride", "2", "--chunk", "2"]
    assert main(args) == 0
    (line,) = lines(out)
    assert line["id"] == "essay.txt" and line["status"] == "ok" and line["document"] is True
    ids = [int(w[1:]) + 4 for w in text.split()]
    assert [t["position"] for t in line["tokens"]] == list(range(0, len(ids) - 1, 2))
    assert [t["token_id"] for t in line["tokens"]] == ids[1::2]
    assert line["contrastive"] is False

    out2 = tmp_path / "essay-contrast.jsonl"
    assert main([*args[:6], str(out2), *args[7:], "--contrast", "w3"]) == 0
    (line,) = lines(out2)
    assert line["contrastive"] is True
    assert {t["contrast_id"] for t in line["tokens"]} == {7}



def test_a_crlf_text_file_is_normalised_and_says_so(tiny_folder, tmp_path, capsys):
    """A Windows-written document gives the same tokens as its LF twin, and the output and
    stderr name the normalisation (it used to happen silently)."""
    from captum_iglens.run.records import read_document

    body = ["w4 w5 w6", "w7 w8", "w9 w10"]
    crlf, lf = tmp_path / "crlf.txt", tmp_path / "lf.txt"
    crlf.write_bytes(("\ufeff" + "\r\n".join(body) + "\r\n").encode("utf-8"))
    lf.write_bytes(("\n".join(body) + "\n").encode("utf-8"))
    text, notes = read_document(crlf)
    assert text == lf.read_text(encoding="utf-8")
    assert notes == ["a UTF-8 byte-order mark was dropped", "3 CRLF line endings became LF"]
    assert read_document(lf)[1] == []
    got = {}
    for source in (crlf, lf):
        out = tmp_path / f"{source.stem}.jsonl"
        assert main(["run", "--model", str(tiny_folder), "--text-file", str(source),
                     "--output", str(out), "--no-progress"]) == 0
        (got[source.stem],) = lines(out)
    assert "3 CRLF line endings became LF" in capsys.readouterr().err
    assert got["crlf"]["meta"]["normalised"] == notes and "meta" not in got["lf"]
    assert got["crlf"]["input_ids"] == got["lf"]["input_ids"]

# ------------------------------------------------------------------------- 7. records
def test_read_records_ids_meta_and_text_files(tmp_path):
    path = write_jsonl(tmp_path / "r.jsonl", [
        {"prompt": "w1 w2", "source": "a", "score": [1, 2]},
        "",
        {"id": "x", "prompt": "w3", "answer": "w4 w5", "positions": [0]},
        {"text": "w6 w7 w8", "contrast": [9]},
        {"prompt": "w1", "text": "w2"},
        {"id": 3.5, "prompt": "w1"},
        "[1, 2]",
        {"id": "n", "prompt": 42},
    ])
    records = read_records(path)
    # default: the line number; a line that cannot be read: "line-<number>" (no clash)
    assert [r.id for r in records] == [1, "x", 4, 5, "line-6", "line-7", "n"]
    assert [r.index for r in records] == list(range(7))
    first, forced, doc, both, bad_id, array, number = records
    assert number.error == '"prompt" must be text (a JSON string), got int 42'
    assert first.meta == {"source": "a", "score": [1, 2]} and first.error is None
    assert forced.answer == "w4 w5" and forced.positions == [0] and forced.meta == {}
    assert doc.is_document and doc.contrast == [9] and not first.is_document
    assert "exactly one of" in both.error
    assert '"id" must be' in bad_id.error
    assert "not a JSON object" in array.error

    plain = tmp_path / "prompts.txt"
    plain.write_text("w1 w2\n\n  w3  \n", encoding="utf-8")
    assert [(r.id, r.prompt) for r in read_records(plain)] == [(1, "w1 w2"), (3, "w3")]
    (tmp_path / "empty.jsonl").write_text("\n\n", encoding="utf-8")
    with pytest.raises(ValueError, match="no record"):
        read_records(tmp_path / "empty.jsonl")
    # any case of .jsonl / .ndjson is JSON lines, a byte-order mark is dropped; JSON records
    # in a file named otherwise are refused instead of explained as prompt text
    upper = tmp_path / "R.JSONL"
    upper.write_text("\ufeff" + json.dumps({"id": "a", "prompt": "w1"}) + "\n", encoding="utf-8")
    assert [(r.id, r.prompt, r.error) for r in read_records(upper)] == [("a", "w1", None)]
    misnamed = tmp_path / "r.json"
    misnamed.write_text(json.dumps({"id": "a", "prompt": "w1"}) + "\n", encoding="utf-8")
    with pytest.raises(ValueError, match="line 1 is a JSON record"):
        read_records(misnamed)


def test_output_that_is_not_a_results_file_is_refused_and_damaged_lines_are_skipped(
        tiny_folder, tmp_path, capsys):
    """An --output that holds something else is never truncated; a damaged line in the
    middle of a results file costs that line only (it used to drop everything after it)."""
    source = write_jsonl(tmp_path / "in.jsonl", [{"id": i, "prompt": f"w{4 + i} w9"}
                                                 for i in range(4)])
    notes = tmp_path / "notes.md"
    notes.write_text("# my notes\nkeep me\n", encoding="utf-8")
    assert main(run_args(tiny_folder, source, notes)) == 2
    assert notes.read_text(encoding="utf-8") == "# my notes\nkeep me\n"
    assert "not a results file" in capsys.readouterr().err

    out = tmp_path / "out.jsonl"
    assert main(run_args(tiny_folder, source, out)) == 0
    good = out.read_bytes().splitlines(keepends=True)
    out.write_bytes(good[0] + good[1][: len(good[1]) // 2] + b"\n" + b"".join(good[2:]))
    with pytest.warns(UserWarning, match="1 damaged line"):
        records, torn = read_lines(out)
    assert [r["id"] for r in records] == [0, 2, 3] and torn == 0
    assert main(run_args(tiny_folder, source, out)) == 0
    assert "3 were already done" in capsys.readouterr().err
    assert [r["id"] for r in lines(out)] == [0, 1, 2, 3]


def test_positions_meta_and_contrast_in_a_run(tiny_folder, tmp_path, capsys):
    """`positions` keeps those answer tokens (from the very forward of the whole answer when
    run alone: equal); other keys come back under `meta`; a generated answer cut to some
    tokens is still marked truncated; `--contrast` fills in records without their own."""
    rows = [{"id": "all", "prompt": "w1 w2 w3", "answer": "w5 w6 w7"},
            {"id": "some", "prompt": "w1 w2 w3", "answer": "w5 w6 w7", "positions": [-1, 0],
             "source": "s", "n": 3},
            {"id": "gen", "prompt": "w10 w11 w12"},
            {"id": "gen-last", "prompt": "w10 w11 w12", "positions": [-1]}]
    source = write_jsonl(tmp_path / "d.jsonl", rows)
    out = tmp_path / "out.jsonl"
    assert main(run_args(tiny_folder, source, out, "--batch-size", "1")) == 0
    full, some, gen, gen_last = lines(out)
    assert some["meta"] == {"source": "s", "n": 3} and "meta" not in full
    assert [t["token"] for t in some["tokens"]] == ["w5", "w7"]
    assert some["tokens"] == [full["tokens"][0], full["tokens"][2]]
    assert some["answer"] == full["answer"] == "w5 w6 w7"
    # this answer runs to the limit without an end token: truncated, even when cut to one
    assert len(gen["tokens"]) == MAX_NEW and gen["truncated"] is True
    assert gen_last["tokens"] == gen["tokens"][-1:]
    assert gen_last["truncated"] == gen["truncated"] and gen_last["answer"] == gen["answer"]

    rows = [{"id": "c", "prompt": "w4 w5", "answer": "w9 w8"},
            {"id": "own", "prompt": "w4 w5", "answer": "w9 w8", "contrast": "w7 w6"},
            {"id": "same", "prompt": "w4 w5", "answer": "w3"}]
    source = write_jsonl(tmp_path / "c.jsonl", rows)
    out = tmp_path / "c-out.jsonl"
    capsys.readouterr()
    assert main(run_args(tiny_folder, source, out, "--contrast", "w3")) == 1
    c, own, same = lines(out)
    assert c["contrastive"] and [t["contrast_token"] for t in c["tokens"]] == ["w3", "w3"]
    assert [t["contrast_token"] for t in own["tokens"]] == ["w7", "w6"]
    assert same["status"] == "error" and "contrast equals the answer" in same["error"]


def test_records_beyond_a_rotary_models_context_are_error_records(tmp_path):
    """Rotary models have no position table: their trained context (max_position_embeddings)
    limits prompt and text records, which used to run (for hours, in quadratic memory)."""
    model = make_tiny("llama").eval()
    model.config.max_position_embeddings = 24
    assert max_sequence_length(model) is None
    tokenizer = word_tokenizer()
    rng = random.Random(5)
    records = read_records(write_jsonl(tmp_path / "in.jsonl", [
        {"id": "fits", "prompt": words(rng, 24 - MAX_NEW)},
        {"id": "prompt", "prompt": words(rng, 24 - MAX_NEW + 1)},
        {"id": "text", "text": words(rng, 25)},
        {"id": "short text", "text": words(rng, 24)}]))
    settings = RunSettings(batch_size=4, max_new_tokens=MAX_NEW, chat_template=False)
    report = run_records(model, tokenizer, records, tmp_path / "out.jsonl", settings,
                         progress=False)
    got = {r["id"]: r for r in lines(tmp_path / "out.jsonl")}
    assert (report.n_ok, report.n_errors) == (2, 2)
    assert got["fits"]["status"] == got["short text"]["status"] == "ok"
    assert "context is 24 tokens" in got["prompt"]["error"]
    assert "25 tokens" in got["text"]["error"] and "context is 24" in got["text"]["error"]
