"""Total-effect credits and attribution patching against the readout default, on SmolLM2.

    OMP_NUM_THREADS=1 python benchmarks/bench_total_effect.py [--repeats 3] [--n-steps 8]

Same prompt ("What is the capital of Vietnam?", chat template), same greedy answer (10
tokens), every answer token explained from one teacher-forced sequence, all 30 blocks; timed
side by side in one run, median after one warm-up:

* the readout default (``IGLens(model)``, ``prediction_aware``: ``T (k + 1)`` readouts, no
  backward pass);
* the total effect (``effect="total"``, exact step split at ``--n-steps``): one clean forward
  with its KV cache, then per answer token one batched single-position forward and backward
  of ``n_steps + 1`` rows over the cached prefix; ``mean`` and ``zero`` references;
* attribution patching (``effect="atp"``): the same with 2 rows (``g = 1`` and ``g = 0``).

Targets (issue 29): total effect at 8 steps <= 10x the readout default, AtP <= 3x. Also
printed: the completeness of each (AtP: its gap to delta_p, not an error), and the zero
reference's check, total effect = the readout credits' total with the embedding baseline.
"""

from __future__ import annotations

import argparse
import os
import platform

import torch
from _timing import median_time, smollm2_answer


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n-steps", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--max-new-tokens", type=int, default=10)
    args = parser.parse_args()

    from captum_iglens import IGLens
    from captum_iglens._utils.progress import progress_bars

    prompt = "What is the capital of Vietnam?"
    model, tokenizer, prompt_ids, answer, ids, positions, target = smollm2_answer(
        args.max_new_tokens, prompt)
    readout, total, atp = IGLens(model), IGLens(model, effect="total"), IGLens(model,
                                                                              effect="atp")

    def run(lens, **kw):
        return lambda: lens.attribute_details(ids, target=target, positions=positions, **kw)

    steps = {"n_steps": args.n_steps}
    rows = [("readout, prediction_aware (default)", readout, {}),
            (f"total, mean reference, exact {args.n_steps} steps", total,
             {"baselines": "mean", **steps}),
            (f"total, zero reference, exact {args.n_steps} steps", total,
             {"baselines": "zero", **steps}),
            ("atp, mean reference", atp, {"baselines": "mean"}),
            ("atp, zero reference", atp, {"baselines": "zero"}),
            ("readout, embedding baseline", readout, {"baselines": "embedding"})]
    with progress_bars(False):
        timed = [(name, *median_time(run(lens, **kw), args.repeats)) for name, lens, kw in rows]

    print(f"model: SmolLM2-135M-Instruct (30 blocks), torch {torch.__version__}, "
          f"{platform.processor() or platform.machine()}, {torch.get_num_threads()} threads "
          f"(OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', 'unset')}), "
          f"{os.cpu_count()} CPUs")
    print(f"prompt: {prompt!r} ({len(prompt_ids)} tokens with the chat template); answer "
          f"{tokenizer.decode(answer)!r}: {len(answer)} tokens x 30 blocks, each explained")
    print(f"median of {args.repeats} runs after one warm-up")
    print()
    print("x readout: time over the readout default; completeness: max |sum - delta_p| "
          "(atp: the estimate's gap to delta_p, median over tokens, not an error)")
    print(f"{'effect, reference, estimator':<42} {'time s':>8} {'x readout':>10} "
          f"{'completeness':>13}")
    base = timed[0][1]
    for name, seconds, out in timed[:5]:
        gap = out.convergence_delta.abs()
        shown = float(gap.median()) if out.effect == "atp" else float(gap.max())
        print(f"{name:<42} {seconds:>8.3f} {seconds / base:>9.2f}x {shown:>13.1e}")
    zero, emb = timed[2][2], timed[5][2]
    check = (zero.attributions.double().sum(-1) - emb.attributions.double().sum(-1)).abs()
    print()
    print(f"zero reference: |sum total effect - sum readout credits (embedding baseline)| "
          f"max = {float(check.max()):.1e} over {len(answer)} tokens")
    mean = timed[1][2]
    print(f"median start: F(0) = {float(mean.p_baseline.median()):.4f} (mean reference), "
          f"{float(zero.p_baseline.median()):.4f} (zero reference: f(h_0[i])); readout "
          f"default f(b) = {float(timed[0][2].p_baseline.median()):.4f}")


if __name__ == "__main__":
    main()
