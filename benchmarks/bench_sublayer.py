"""Sub-layer credits (granularity="sublayer") against block credits, on SmolLM2, side by side.

    OMP_NUM_THREADS=1 python benchmarks/bench_sublayer.py [--repeats 5] [--n-steps 20]

Same prompt ("What is the capital of Vietnam?", chat template), same greedy answer, every
answer token explained from one teacher-forced forward (``attribute_details`` at the answer's
positions), all 30 blocks; timed in one run, median after one warm-up: block and sub-layer
granularity with the default estimator (exact, readouts only: ``T (k + 1)`` against
``T (2k + 1)`` readouts), with the gausslegendre gradient estimator, and sub-layer with
per-head credits (``heads=True``: ``n_steps + 1`` readouts with a backward each per attention
segment). Also prints where the credit sits for the answer tokens: attention vs MLP.
"""

from __future__ import annotations

import argparse
import os
import platform

import torch
from _timing import median_time, smollm2_answer


def _where_credit_sits(out, tokens: list[str]) -> None:
    """Per answer token: attention and MLP credit summed over the 30 blocks, and Δp."""
    attn, mlp = out.attributions[0, :, 0::2].double(), out.attributions[0, :, 1::2].double()
    print(f"{'token':<14} {'Δp':>9} {'Σ attention':>12} {'Σ MLP':>9} {'|attn| share':>13}")
    for t, token in enumerate(tokens):
        a, m = float(attn[t].sum()), float(mlp[t].sum())
        share = float(attn[t].abs().sum() / (attn[t].abs().sum() + mlp[t].abs().sum()))
        print(f"{token!r:<14} {float(out.delta_p[0, t]):>+9.4f} {a:>+12.4f} {m:>+9.4f} "
              f"{share:>13.2f}")
    a, m = float(attn.sum()), float(mlp.sum())
    share = float(attn.abs().sum() / (attn.abs().sum() + mlp.abs().sum()))
    print(f"{'all tokens':<14} {float(out.delta_p.sum()):>+9.4f} {a:>+12.4f} {m:>+9.4f} "
          f"{share:>13.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n-steps", type=int, default=20)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--max-new-tokens", type=int, default=16)
    args = parser.parse_args()

    from captum_iglens import IGLens
    from captum_iglens._utils.progress import progress_bars

    prompt = "What is the capital of Vietnam?"
    model, tokenizer, prompt_ids, answer, ids, positions, target = smollm2_answer(
        args.max_new_tokens, prompt)
    block, sub = IGLens(model), IGLens(model, granularity="sublayer")
    heads = IGLens(model, granularity="sublayer", heads=True)

    def run(lens, **kw):
        return lambda: lens.attribute_details(ids, target=target, positions=positions, **kw)

    grad = {"method": "gausslegendre", "n_steps": args.n_steps}
    rows = [("block, prediction_aware (default)", block, {}),
            ("sublayer, prediction_aware (default)", sub, {}),
            (f"block, gausslegendre n_steps={args.n_steps}", block, grad),
            (f"sublayer, gausslegendre n_steps={args.n_steps}", sub, grad),
            (f"sublayer + heads, n_steps={args.n_steps}", heads, {"n_steps": args.n_steps})]
    with progress_bars(False):
        timed = [(name, *median_time(run(lens, **kw), args.repeats))
                 for name, lens, kw in rows]
    n_tok, n_grad = len(answer), args.n_steps
    readouts = [n_tok * 31, n_tok * 61, n_tok * (31 + 30 * n_grad),
                n_tok * (61 + 60 * n_grad), n_tok * (61 + 30 * (n_grad + 1))]

    print(f"model: SmolLM2-135M-Instruct (30 blocks, 9 heads), torch {torch.__version__}, "
          f"{platform.processor() or platform.machine()}, {torch.get_num_threads()} threads "
          f"(OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', 'unset')}), "
          f"{os.cpu_count()} CPUs")
    print(f"prompt: {prompt!r} ({len(prompt_ids)} tokens with the chat template); answer "
          f"{tokenizer.decode(answer)!r}: {len(answer)} tokens, each explained")
    print(f"median of {args.repeats} runs after one warm-up, one teacher-forced forward each")
    print()
    print("readouts: lens readouts of the path (nodes, grid points); x block: time over the "
          "block row of the same estimator (heads: over the block default)")
    print(f"{'granularity, estimator':<38} {'credits':>7} {'readouts':>9} {'time s':>9} "
          f"{'x block':>8} {'completeness':>13}")
    base = {"prediction_aware": timed[0][1], "gausslegendre": timed[2][1]}
    for (name, seconds, out), count in zip(timed, readouts, strict=True):
        ref = base["gausslegendre" if "gausslegendre" in name else "prediction_aware"]
        print(f"{name:<38} {out.attributions.shape[-1]:>7} {count:>9} {seconds:>9.4f} "
              f"{seconds / ref:>7.2f}x {float(out.convergence_delta.abs().max()):>13.1e}")
    heads_out = timed[4][2]
    gap = (heads_out.head_credits.sum(-1) + heads_out.head_rest
           - heads_out.attributions[..., 0::2]).abs().max()
    print(f"heads: max |Σ heads + rest - attention credit| = {float(gap):.1e}")
    print()
    tokens = [tokenizer.decode([i]) for i in answer]
    _where_credit_sits(timed[1][2], tokens)


if __name__ == "__main__":
    main()
