"""Document mode: time and peak memory as the text doubles, one pass against re-runs.

    python benchmarks/bench_document.py [--sizes 2048 4096 8192] [--chunks 512 128]
                                        [--rerun-sizes 2048 4096] [--threads 1]

On the embedded SmolLM2-135M-Instruct, every position of a text, all 30 blocks, default
settings (prediction-aware, causal mean baseline). Each run is a fresh subprocess, so that
its peak resident memory (``VmHWM``) is its own:

* one pass (the default): the text fed once, ``--chunks`` positions per forward with the
  KV cache of the earlier chunks;
* re-run (``one_pass=False``, what document mode did before, and still does for families
  whose cache cannot serve): one forward over the whole text per chunk of 512 positions.

Prints a table (processor and wall time, peak memory over the model's own forward over the
text, completeness) and the time ratios when the text doubles (targets: <= 2.2x). With one
thread a run's processor time is its work: on a shared machine its wall time also counts the
time other processes held the cores.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_run import _quiet, peak_mib, prompts  # noqa: E402


def document_text(tokenizer, n_tokens: int) -> str:
    """A text of about ``n_tokens`` tokens made of the benchmark prompts (deterministic)."""
    text = " ".join(prompts(100))
    while len(tokenizer(text)["input_ids"]) < n_tokens:
        text = f"{text} {text}"
    return tokenizer.decode(tokenizer(text)["input_ids"][:n_tokens])


def child(n_tokens: int, chunk: int, one_pass: bool) -> None:
    """One document run; prints one JSON line."""
    from captum_iglens import IGLens
    from captum_iglens.models.loading import load_model
    from captum_iglens.text.document import explain_document

    model, tokenizer = load_model()
    text = document_text(tokenizer, n_tokens)
    lens = IGLens(model)
    with torch.no_grad():  # the model's own forward over the text: weights paged in
        model(torch.tensor([tokenizer(text)["input_ids"]]), logits_to_keep=1, use_cache=False)
    base = peak_mib()
    start, cpu = time.perf_counter(), time.process_time()
    result = explain_document(lens, tokenizer, text, chunk=chunk, one_pass=one_pass)
    wall, cpu = time.perf_counter() - start, time.process_time() - cpu
    print(json.dumps({"tokens": len(result.input_ids), "positions": len(result.tokens),
                      "wall": wall, "cpu": cpu, "base": base, "peak": peak_mib(),
                      "completeness": result.completeness_error}))


def run_child(n_tokens: int, chunk: int, one_pass: bool, threads: int) -> dict:
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads))
    args = [sys.executable, __file__, "--child", str(n_tokens), str(chunk), str(int(one_pass))]
    out = subprocess.run(args, check=True, capture_output=True, text=True, env=env)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[2048, 4096, 8192])
    parser.add_argument("--chunks", type=int, nargs="+", default=[512, 128])
    parser.add_argument("--rerun-sizes", type=int, nargs="*", default=[2048, 4096])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--child", type=int, nargs=3, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    _quiet()
    if args.child:
        torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", args.threads)))
        child(args.child[0], args.child[1], bool(args.child[2]))
        return
    print(f"torch {torch.__version__}, {args.threads} thread(s) per run, {os.cpu_count()} "
          f"CPUs; load average {os.getloadavg()[0]:.2f} at the start (shared machine)")
    print("SmolLM2-135M-Instruct, float32, every position, all 30 blocks, causal mean "
          "baseline, prediction-aware")
    runs = [(n, c, True) for c in args.chunks for n in args.sizes]
    runs += [(n, 512, False) for n in args.rerun_sizes]
    print(f"{'path':<10}{'chunk':>6}{'tokens':>8}{'cpu [s]':>9}{'ratio':>7}{'wall [s]':>10}"
          f"{'ratio':>7}{'forward [MiB]':>15}{'peak [MiB]':>12}{'added':>8}"
          f"{'completeness':>14}")
    last: dict[tuple[int, bool], dict] = {}
    for n_tokens, chunk, one_pass in runs:
        got = run_child(n_tokens, chunk, one_pass, args.threads)
        before = last.get((chunk, one_pass))
        ratios = [f"{got[k] / before[k]:.2f}" if before else "" for k in ("cpu", "wall")]
        last[(chunk, one_pass)] = got
        print(f"{'one pass' if one_pass else 're-run':<10}{chunk:>6}{got['tokens']:>8}"
              f"{got['cpu']:>9.1f}{ratios[0]:>7}{got['wall']:>10.1f}{ratios[1]:>7}"
              f"{got['base']:>15.0f}{got['peak']:>12.0f}{got['peak'] - got['base']:>+8.0f}"
              f"{got['completeness']:>14.1e}", flush=True)
    print("ratio: over the same path and chunk at half as many tokens, the row above (target "
          "<= 2.2); cpu: the run's own processor time (one thread), which other work on a "
          "shared machine does not stretch as it does wall time")
    print(f"load average after: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
