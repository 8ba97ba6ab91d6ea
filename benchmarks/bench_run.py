"""Dataset path: batched ``iglens run`` against one-prompt ``explain``, and document mode.

    python benchmarks/bench_run.py [--prompts 100] [--max-new-tokens 16] [--batch-size 16]
                                   [--document 2048] [--skip-document]

Side by side in one process on the embedded SmolLM2-135M-Instruct, on the same 100 short
prompts (chat template, greedy answers, IG-Lens over all 30 blocks):

1. ``explain`` one prompt at a time (the Python API a user would loop over);
2. ``run_records`` (what ``iglens run`` calls), batched;
3. batched greedy generation alone (``generate_batch``) of the same prompts in the same
   batches: what the attribution adds on top of producing the answers;
4. the lens readouts alone for as many path nodes as the run reads out: work any exact
   attribution does on top of generation (a measurement, with the timing noise of the rest).

Then document mode on a text of ``--document`` tokens and of twice that, each in a fresh
subprocess so that its peak resident memory (``ru_maxrss``) is its own: every position,
all 30 blocks. Prints answer tokens per second, the ratios and the targets (>= 3x for
batching, <= 1.5x attribution overhead, memory flat when the text doubles).
"""

from __future__ import annotations

import argparse
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

SUBJECTS = ["France", "Japan", "Kenya", "Peru", "Canada", "Egypt", "Norway", "India",
            "Chile", "Vietnam"]
TEMPLATES = [
    "What is the capital of {s}?",
    "Name one language spoken in {s}.",
    "On which continent is {s}?",
    "Write one word that describes {s}.",
    "What is {n} plus {m}?",
    "Spell the number {n} in words.",
    "Translate 'good morning' into the main language of {s}.",
    "Give a synonym of 'quick'.",
    "Complete: The sun rises in the",
    "Is {n} an even number? Answer yes or no.",
]


def prompts(count: int) -> list[str]:
    """``count`` short, varied prompts (deterministic)."""
    out = []
    for i in range(count):
        template = TEMPLATES[i % len(TEMPLATES)]
        out.append(template.format(s=SUBJECTS[(i // len(TEMPLATES)) % len(SUBJECTS)],
                                   n=3 + i, m=11 + 2 * i))
    return out


def _quiet() -> None:
    import warnings

    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    warnings.filterwarnings("ignore")


def bench_batched(args: argparse.Namespace) -> None:
    from captum_iglens import IGLens, explain
    from captum_iglens.models.loading import load_model
    from captum_iglens.run.records import Record
    from captum_iglens.run.runner import run_records
    from captum_iglens.run.settings import RunSettings
    from captum_iglens.text.generation import generate_batch
    from captum_iglens.text.prompts import render_prompt

    model, tokenizer = load_model()
    texts = prompts(args.prompts)
    explain(model, tokenizer, texts[0], max_new_tokens=2)  # warm-up, not timed
    lens = IGLens(model)

    start = time.perf_counter()
    singles = [explain(model, tokenizer, p, max_new_tokens=args.max_new_tokens) for p in texts]
    t_single = time.perf_counter() - start
    n_single = sum(len(r.token_ids) for r in singles)

    records = [Record(i, i + 1, prompt=p) for i, p in enumerate(texts)]
    settings = RunSettings(batch_size=args.batch_size, max_new_tokens=args.max_new_tokens)
    with tempfile.TemporaryDirectory() as tmp:
        start = time.perf_counter()
        report = run_records(model, tokenizer, records, Path(tmp) / "out.jsonl", settings,
                             lens, progress=False)
        t_batched = time.perf_counter() - start

    rendered = sorted((render_prompt(tokenizer, p).ids for p in texts), key=len)
    start = time.perf_counter()
    n_gen = 0
    for b in range(0, len(rendered), args.batch_size):
        answers = generate_batch(model, tokenizer, rendered[b:b + args.batch_size],
                                 args.max_new_tokens)
        n_gen += sum(len(a) for a in answers)
    t_generate = time.perf_counter() - start

    t_readout, n_rows = readout_floor(lens, tokenizer, texts, report.n_tokens)

    rate_single, rate_batched = n_single / t_single, report.n_tokens / t_batched
    print(f"{len(texts)} prompts, max_new_tokens={args.max_new_tokens}, "
          f"batch size {args.batch_size}, all {lens.num_layers} blocks")
    print(f"{'run':<48}{'wall [s]':>9}{'tokens':>8}{'tokens/s':>10}")
    print(f"{'explain, one prompt at a time':<48}{t_single:>9.1f}{n_single:>8}"
          f"{rate_single:>10.1f}")
    print(f"{'iglens run (run_records), batched':<48}{t_batched:>9.1f}{report.n_tokens:>8}"
          f"{rate_batched:>10.1f}")
    print(f"{'batched greedy generation alone':<48}{t_generate:>9.1f}{n_gen:>8}"
          f"{n_gen / t_generate:>10.1f}")
    print(f"batched / one at a time, answer tokens per second: "
          f"{rate_batched / rate_single:.2f}x (target >= 3x)")
    print(f"batched run / generation alone, wall time: {t_batched / t_generate:.2f}x "
          f"(target <= 1.5x); {report.n_errors} error records")
    print(f"lens readouts alone ({n_rows} rows: {len(lens.layer_indices) + 1} path nodes per "
          f"answer token, final norm + unembedding + log-softmax): {t_readout:.1f} s, work every "
          f"exact attribution does; generation + these readouts = "
          f"{(t_generate + t_readout) / t_generate:.2f}x generation alone (timed here)")


def readout_floor(lens, tokenizer, texts: list[str], n_tokens: int) -> tuple[float, int]:
    """Seconds the lens readout alone takes for ``n_tokens`` answer tokens' path nodes.

    Real residuals (every hidden state of the prompts run as one text), cycled to
    ``n_tokens * (k + 1)`` rows and read out as IG-Lens does (chunks of ``2**24 // V``).
    """
    from captum_iglens.lens.architectures import vocab_size
    from captum_iglens.lens.hooks import forward_with_capture
    from captum_iglens.lens.readout import chunk_rows, readout_probs

    ids = torch.tensor([tokenizer(" ".join(texts))["input_ids"][:1024]])
    states, _ = forward_with_capture(lens.model, lens.decoder_blocks, ids, {"use_cache": False},
                                     lens.layer_indices, None, None)
    pool = torch.cat([states[i][0] for i in lens.layer_indices])
    n_rows = n_tokens * (len(lens.layer_indices) + 1)
    rows = pool[torch.arange(n_rows) % pool.shape[0]]
    targets = torch.randint(0, vocab_size(lens.model), (n_rows,))
    start = time.perf_counter()
    readout_probs(lens.readout, rows, targets, chunk_rows(None, vocab_size(lens.model)))
    return time.perf_counter() - start, n_rows


def peak_mib() -> float:
    """This process's peak resident memory in MiB.

    ``VmHWM`` on Linux: ``ru_maxrss`` is carried over ``exec`` from the parent, so a child
    would report the parent's peak.
    """
    try:
        with open("/proc/self/status", encoding="ascii") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def bench_document(n_tokens: int) -> None:
    """Child process: document mode on ``n_tokens`` tokens; prints time and peak memory."""
    from captum_iglens import IGLens
    from captum_iglens.models.loading import load_model
    from captum_iglens.text.document import DEFAULT_CHUNK, explain_document

    model, tokenizer = load_model()
    text = " ".join(prompts(100))
    while len(tokenizer(text)["input_ids"]) < n_tokens:
        text = f"{text} {text}"
    text = tokenizer.decode(tokenizer(text)["input_ids"][:n_tokens])
    lens = IGLens(model)
    with torch.no_grad():  # the model's own forward over the text: weights paged in
        model(torch.tensor([tokenizer(text)["input_ids"]]), logits_to_keep=1, use_cache=False)
    base = peak_mib()
    start = time.perf_counter()
    result = explain_document(lens, tokenizer, text)
    wall = time.perf_counter() - start
    peak = peak_mib()
    print(f"document {len(result.input_ids)} tokens, {len(result.tokens)} positions x "
          f"{lens.num_layers} blocks, chunk {DEFAULT_CHUNK}: {wall:.1f} s; peak RSS (VmHWM) "
          f"of the model's own forward over the text {base:.0f} MiB, of IG-Lens over every "
          f"position {peak:.0f} MiB (+{peak - base:.0f}); completeness "
          f"{result.completeness_error:.1e}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=100)
    parser.add_argument("--max-new-tokens", type=int, default=16)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--document", type=int, default=2048)
    parser.add_argument("--skip-document", action="store_true")
    parser.add_argument("--child-document", type=int, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    _quiet()
    if args.child_document:
        bench_document(args.child_document)
        return
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, {os.cpu_count()} "
          f"CPUs; load average {os.getloadavg()[0]:.2f} (shared machine: timings are noisy)")
    bench_batched(args)
    if not args.skip_document:
        for size in (args.document, 2 * args.document):
            subprocess.run([sys.executable, __file__, "--child-document", str(size)],
                           check=True)
    print(f"load average after: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
