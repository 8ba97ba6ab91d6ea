"""Head gates, sequence scope and AtP*'s GradDrop of the total effect, on SmolLM2.

    OMP_NUM_THREADS=1 python benchmarks/bench_total_effect_nodes.py [--repeats 1]

The answer of bench_total_effect.py ("What is the capital of Vietnam?", 10 greedy tokens,
each explained from one teacher-forced sequence), all 30 blocks, timed side by side against
the readout default:

* ``effect="total", granularity="sublayer", heads=True`` (mean reference, exact split): the
  completeness of the 60 node credits, and of the 9 head credits + rest against each
  attention credit;
* ``effect="atp"`` with ``heads=True``, and AtP*'s GradDrop (``run_total(...,
  grad_drop=True)``, block nodes: 30 more backward rows per token);
* ``run_total(..., scope="sequence")`` (mean reference, exact split): the same total as the
  position scope, another split; the largest difference of the two splits.
"""

from __future__ import annotations

import argparse
import os

import torch
from _timing import median_time, smollm2_answer


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n-steps", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--max-new-tokens", type=int, default=10)
    args = parser.parse_args()

    from captum_iglens import IGLens
    from captum_iglens._core.total_effect import run_total
    from captum_iglens._utils.progress import progress_bars

    model, tokenizer, _, answer, ids, positions, target = smollm2_answer(args.max_new_tokens)
    heads_total = IGLens(model, effect="total", granularity="sublayer", heads=True)
    heads_atp = IGLens(model, effect="atp", granularity="sublayer", heads=True)
    block_total, block_atp = IGLens(model, effect="total"), IGLens(model, effect="atp")
    n = args.n_steps

    def lens_run(lens, **kw):
        return lambda: lens.attribute_details(ids, target=target, positions=positions, **kw)

    def spec_run(lens, baseline, **kw):
        return lambda: run_total(lens.spec, ids, baseline, target, None, n, "prediction_aware",
                                 None, positions, **kw)[0]

    rows = [("readout, prediction_aware (default)", lens_run(IGLens(model))),
            (f"total, block, mean, exact {n}", lens_run(block_total, baselines="mean",
                                                       n_steps=n)),
            (f"total, sublayer + heads, mean, exact {n}", lens_run(heads_total,
                                                                  baselines="mean", n_steps=n)),
            ("atp, sublayer + heads, mean", lens_run(heads_atp, baselines="mean")),
            ("atp, block, mean", lens_run(block_atp, baselines="mean")),
            ("atp* (GradDrop), block, mean", spec_run(block_atp, "mean", grad_drop=True)),
            (f"total, block, mean, exact {n}, sequence", spec_run(block_total, "mean",
                                                                  scope="sequence"))]
    with progress_bars(False):
        timed = [(name, *median_time(fn, args.repeats)) for name, fn in rows]
    print(f"SmolLM2-135M-Instruct, {torch.get_num_threads()} threads (OMP_NUM_THREADS="
          f"{os.environ.get('OMP_NUM_THREADS', 'unset')}), answer "
          f"{tokenizer.decode(answer)!r}: {len(answer)} tokens x 30 blocks; median of "
          f"{args.repeats} after one warm-up")
    print(f"{'run':<42} {'time s':>8} {'x readout':>10} {'max |delta|':>12}")
    base = timed[0][1]
    for name, seconds, out in timed:
        print(f"{name:<42} {seconds:>8.3f} {seconds / base:>9.2f}x "
              f"{float(out.convergence_delta.abs().max()):>12.1e}")
    heads = timed[2][2]
    att = heads.attributions[..., 0::2].double()
    gap = (heads.head_credits.double().sum(-1) + heads.head_rest.double() - att).abs()
    print(f"heads + rest - attention credit: max {float(gap.max()):.1e} over "
          f"{att.numel()} attention nodes; max |rest| {float(heads.head_rest.abs().max()):.1e}")
    block, seq = timed[1][2], timed[6][2]
    same = ((block.p_final - block.p_baseline) - (seq.p_final - seq.p_baseline)).abs()
    split = float((block.attributions - seq.attributions).abs().max())
    print(f"sequence vs position scope: |delta_p difference| max {float(same.max()):.1e}; "
          f"credits differ by up to {split:.3f}")
    star, atp = timed[5][2], timed[4][2]
    print(f"atp* vs |atp|: median |difference| "
          f"{float((star.attributions - atp.attributions.abs()).abs().median()):.2e}")


if __name__ == "__main__":
    main()
