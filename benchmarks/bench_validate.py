"""Wall time of the full causal validation vs plain ``explain`` on the same prompts.

    python benchmarks/bench_validate.py [--threads N] [--max-new-tokens 16] [--threshold 0.2]

Runs, side by side in one process on the embedded SmolLM2-135M-Instruct: ``explain`` on every
packaged validation prompt (chat template, greedy answer, IG-Lens over all 30 blocks), then
the default ``validate`` (same prompts, all three ablation kinds, every block at every
explained token, the built-in checks, 1000 bootstrap resamples). Prints both wall times,
their ratio, the per-phase split and the target (the validation within 5 minutes on a
2-core CPU). The CPU may be shared: the load average before and after is printed.
"""

from __future__ import annotations

import argparse
import os
import platform
import time

import torch


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=None,
                        help="torch threads (default: torch's own choice)")
    parser.add_argument("--max-new-tokens", type=int, default=None)
    parser.add_argument("--threshold", type=float, default=None)
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)

    from transformers.utils import logging as hf_logging

    from captum_iglens import explain
    from captum_iglens.ablation import KINDS
    from captum_iglens.models import load_model
    from captum_iglens.validate import (
        DEFAULT_MAX_NEW_TOKENS,
        DEFAULT_THRESHOLD,
        load_prompts,
        validate,
    )

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    max_new = args.max_new_tokens or DEFAULT_MAX_NEW_TOKENS
    threshold = DEFAULT_THRESHOLD if args.threshold is None else args.threshold
    model, tokenizer = load_model()
    prompts = load_prompts()
    explain(model, tokenizer, prompts[0], max_new_tokens=2)  # warm-up, not timed
    load_before = os.getloadavg()

    start = time.perf_counter()
    results = [explain(model, tokenizer, p, max_new_tokens=max_new) for p in prompts]
    t_explain = time.perf_counter() - start

    start = time.perf_counter()
    result = validate(model, tokenizer, prompts, kinds=KINDS, threshold=threshold,
                      max_new_tokens=max_new, progress=False)
    t_validate = time.perf_counter() - start
    load_after = os.getloadavg()

    n_answer = sum(len(r.token_ids) for r in results)
    n_tok = len(result.tokens)
    n_blocks = len(result.layer_indices)
    seconds = result.settings["seconds"]
    rows = 1 + len(KINDS) * n_blocks
    print(f"model: SmolLM2-135M-Instruct (embedded), {n_blocks} blocks")
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, "
          f"{os.cpu_count()} CPUs, {platform.processor() or platform.machine()}")
    print(f"load average before / after: {load_before[0]:.2f} / {load_after[0]:.2f} "
          "(shared machine: timings are noisy)")
    print(f"prompts: {len(prompts)} (packaged set), max_new_tokens={max_new}, "
          f"threshold p_final >= {threshold:g}")
    print(f"answer tokens: {n_answer}; explained and ablated: {n_tok} "
          f"({len(KINDS)} kinds x {n_blocks} blocks + 1 clean row = {rows} rows per token)")
    print()
    print(f"{'run':<44}{'wall [s]':>10}")
    print(f"{'explain (IG-Lens, all prompts)':<44}{t_explain:>10.1f}")
    print(f"{'validate (3 ablations, every block/token)':<44}{t_validate:>10.1f}")
    for phase in ("explain", "ablate", "analyse"):
        print(f"{'  of which ' + phase:<44}{seconds[phase]:>10.1f}")
    print()
    print(f"validate / explain: {t_validate / t_explain:.1f}x")
    print(f"ablation per token (all {rows} rows in one batch): "
          f"{seconds['ablate'] / max(n_tok, 1):.3f} s")
    verdict = "met" if t_validate <= 300 else "NOT met"
    print(f"target <= 300 s for the full default validation: {verdict}")
    checks = ", ".join(f"{k} {v:.1e}" for k, v in result.check_errors.items())
    print(f"built-in checks passed, largest |error|: {checks} "
          f"(tolerance {result.settings['tolerance']:.1e})")


if __name__ == "__main__":
    main()
