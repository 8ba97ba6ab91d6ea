"""Wall and CPU time of the causal validation: rows from block 1 (before) vs grown (after).

    python benchmarks/bench_validate.py [--model NAME] [--threads N] [--max-new-tokens 12]
                                        [--threshold 0.2] [--donors 4] [--skip-before]

Runs, one after the other in one process on the same prompts and settings: ``explain`` on
every packaged validation prompt (the reference cost), then the default ``validate``
ablations (zero, mean, resample with ``--donors`` donors averaged; the built-in checks;
1000 bootstrap resamples) twice: ``grow=False``, every ablation row recomputing blocks
``1..L-1`` from block 1 (the way the validation ran before), and ``grow=True``, each row
joining the batch after block ``L - 1`` from the clean row's residual (the default); then
the patching of the packaged pairs. Both ablation runs must agree to the check tolerance
(printed). Wall time on a shared machine is noisy: the process CPU time of each phase is
printed next to it (with one thread it is what the phase itself cost), and the load average
before and after.
"""

from __future__ import annotations

import argparse
import os
import platform
import time

import numpy as np
import torch


def _phases(result, label: str) -> None:
    wall, cpu = result.settings["seconds"], result.settings["cpu_seconds"]
    for phase in wall:
        print(f"{'  ' + label + ' ' + phase:<46}{wall[phase]:>10.1f}{cpu[phase]:>10.1f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None, help="a model name or path (default: SmolLM2)")
    parser.add_argument("--threads", type=int, default=None,
                        help="torch threads (default: torch's own choice)")
    parser.add_argument("--max-new-tokens", type=int, default=None)
    parser.add_argument("--threshold", type=float, default=None)
    parser.add_argument("--donors", type=int, default=None)
    parser.add_argument("--skip-before", action="store_true",
                        help="time only the default (grown) ablation")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)

    from transformers.utils import logging as hf_logging

    from captum_iglens import explain
    from captum_iglens.models.loading import load_model
    from captum_iglens.validate.ablation import KINDS
    from captum_iglens.validate.driver import (
        DEFAULT_DONORS,
        DEFAULT_MAX_NEW_TOKENS,
        DEFAULT_THRESHOLD,
        load_prompts,
        validate,
    )

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    max_new = args.max_new_tokens or DEFAULT_MAX_NEW_TOKENS
    threshold = DEFAULT_THRESHOLD if args.threshold is None else args.threshold
    donors = args.donors or DEFAULT_DONORS
    start = time.perf_counter()
    model, tokenizer = load_model(args.model)
    t_load = time.perf_counter() - start
    prompts = load_prompts()
    explain(model, tokenizer, prompts[0], max_new_tokens=2)  # warm-up, not timed
    load_before = os.getloadavg()

    start, cpu = time.perf_counter(), time.process_time()
    results = [explain(model, tokenizer, p, max_new_tokens=max_new) for p in prompts]
    t_explain, c_explain = time.perf_counter() - start, time.process_time() - cpu

    runs = {}
    for grow in ((True,) if args.skip_before else (False, True)):
        runs[grow] = validate(model, tokenizer, prompts, kinds=KINDS, threshold=threshold,
                              max_new_tokens=max_new, donors=donors, progress=False,
                              grow=grow)
    patched = validate(model, tokenizer, prompts, kinds=("patch",), progress=False)
    load_after = os.getloadavg()

    _report(runs, patched, results, prompts, (t_load, t_explain, c_explain),
            (load_before, load_after), (max_new, threshold, donors))


def _report(runs: dict, patched, results: list, prompts: list, times: tuple, loads: tuple,
            knobs: tuple) -> None:
    """Print the timings, the ratio before / after and the checks."""
    from captum_iglens.validate.ablation import KINDS

    (t_load, t_explain, c_explain), (load_before, load_after) = times, loads
    max_new, threshold, donors = knobs
    after = runs[True]
    n_tok, n_blocks = len(after.tokens), len(after.layer_indices)
    rows = 1 + (len(KINDS) - 1 + donors) * n_blocks
    print(f"model: {after.settings['model']} (load {t_load:.1f} s), {n_blocks} blocks")
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, "
          f"{os.cpu_count()} CPUs, {platform.processor() or platform.machine()}")
    print(f"load average before / after: {load_before[0]:.2f} / {load_after[0]:.2f} "
          "(shared machine: wall times are noisy, CPU times much less)")
    print(f"prompts: {len(prompts)} (packaged set), max_new_tokens={max_new}, "
          f"threshold p_final >= {threshold:g}, resample donors: {donors}")
    print(f"answer tokens: {sum(len(r.token_ids) for r in results)}; ablated: {n_tok} "
          f"(1 clean row + (2 kinds + {donors} donors) x {n_blocks} blocks = {rows} rows "
          "per token)")
    print()
    print(f"{'run':<46}{'wall [s]':>10}{'CPU [s]':>10}")
    print(f"{'explain (IG-Lens, all prompts)':<46}{t_explain:>10.1f}{c_explain:>10.1f}")
    for grow, result in runs.items():
        label = "grown" if grow else "from block 1"
        total = sum(result.settings["seconds"].values())
        total_cpu = sum(result.settings["cpu_seconds"].values())
        print(f"{'validate, ablation rows ' + label:<46}{total:>10.1f}{total_cpu:>10.1f}")
        _phases(result, "of which")
    wall, cpu = patched.settings["seconds"]["patch"], patched.settings["cpu_seconds"]["patch"]
    n_pairs = len(patched.patching["pairs"])
    print(f"{'patching, ' + str(n_pairs) + ' pairs (both directions)':<46}{wall:>10.1f}"
          f"{cpu:>10.1f}")
    print()
    _compare(runs, KINDS)
    print(f"ablation per token (grown, {rows} rows): "
          f"{after.settings['seconds']['ablate'] / max(n_tok, 1):.3f} s wall, "
          f"{after.settings['cpu_seconds']['ablate'] / max(n_tok, 1):.3f} s CPU")
    checks = ", ".join(f"{k} {v:.1e}" for k, v in after.check_errors.items())
    print(f"built-in checks passed, largest |error|: {checks} "
          f"(tolerance {after.settings['tolerance']:.1e})")


def _compare(runs: dict, kinds: tuple) -> None:
    """The ratio of the ablation phase before / after, and how far their drops differ."""
    after = runs[True]
    if False in runs:
        before = runs[False]
        ratio = (before.settings["cpu_seconds"]["ablate"]
                 / after.settings["cpu_seconds"]["ablate"])
        wall_ratio = before.settings["seconds"]["ablate"] / after.settings["seconds"]["ablate"]
        print(f"ablation phase, from block 1 / grown: {ratio:.2f}x in CPU time, "
              f"{wall_ratio:.2f}x in wall time")
        diff = max(float(np.abs(before.drops[k] - after.drops[k]).max()) for k in kinds)
        tol = after.settings["tolerance"]
        print(f"largest |drop difference| between the two: {diff:.1e} (a drop is p_clean - "
              f"p_ablated, each checked to {tol:.1e} (1 + p): at most {4 * tol:.1e} (1 + p) "
              "apart)")


if __name__ == "__main__":
    main()
