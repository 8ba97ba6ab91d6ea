"""IG-Lens over all 30 layers vs one LayerIntegratedGradients layer, on SmolLM2.

    python benchmarks/bench_compare.py [--n-steps 20] [--repeats 3] [--layer 15]

Same prompt ("What is the capital of Vietnam?", chat template), same explained token (the
first token of the greedy answer), same forward (``use_cache=False``), timed side by side in
one run: IG-Lens (default estimator) over all 30 decoder blocks, IG-Lens's gradient estimator
(gausslegendre, same ``n_steps``) over all 30 blocks, and Captum's LayerIntegratedGradients on
ONE decoder block (the cost of each of the 30 runs a per-layer Captum comparison needs).
Prints the median wall time of each and their ratio.
"""

from __future__ import annotations

import argparse
import os
import platform

import torch
from _timing import median_time


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n-steps", type=int, default=20)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--layer", type=int, default=15, help="hidden-state index for LIG")
    args = parser.parse_args()

    from captum.attr import LayerIntegratedGradients
    from transformers.utils import logging as hf_logging

    from captum_iglens import IGLens
    from captum_iglens.compare.driver import input_baseline_ids, target_probability_forward
    from captum_iglens.models.loading import load_model
    from captum_iglens.text.explain_prompt import build_prompt_ids, generate_answer

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    model, tokenizer = load_model()
    prompt = "What is the capital of Vietnam?"
    prompt_ids, _ = build_prompt_ids(tokenizer, prompt)
    answer = generate_answer(model, tokenizer, prompt_ids, 1)
    ids = torch.tensor([prompt_ids])
    mask = torch.ones_like(ids)
    target = answer[0]
    pos = ids.shape[1] - 1
    lens = IGLens(model)  # all 30 blocks
    base = input_baseline_ids(model, ids, tokenizer=tokenizer)
    forward = target_probability_forward(model, pos, target)
    lig = LayerIntegratedGradients(forward, lens.decoder_blocks[args.layer - 1])

    def run_lens():
        return lens.attribute(ids, target=target, additional_forward_args=mask,
                              return_convergence_delta=True)

    def run_lens_grad():
        return lens.attribute(ids, target=target, additional_forward_args=mask,
                              method="gausslegendre", n_steps=args.n_steps,
                              return_convergence_delta=True)

    def run_lig():
        return lig.attribute(ids, base, additional_forward_args=(mask,), n_steps=args.n_steps,
                             return_convergence_delta=True)

    torch.set_grad_enabled(True)
    model.eval()
    t_lens, (a_lens, d_lens) = median_time(run_lens, args.repeats)
    t_grad, (a_grad, d_grad) = median_time(run_lens_grad, args.repeats)
    t_lig, (a_lig, d_lig) = median_time(run_lig, args.repeats)

    print(f"model: SmolLM2-135M-Instruct (30 blocks), torch {torch.__version__}, "
          f"{platform.processor() or platform.machine()}, {torch.get_num_threads()} threads, "
          f"{os.cpu_count()} CPUs")
    print(f"prompt: {prompt!r} ({ids.shape[1]} tokens with the chat template); explained "
          f"token: {tokenizer.decode([target])!r} (id {target}), the first answer token")
    print(f"median of {args.repeats} runs after one warm-up; LIG/gradient n_steps = "
          f"{args.n_steps}")
    print()
    print(f"{'method':<56} {'layers':>6} {'time s':>9} {'completeness':>14}")
    rows = [
        ("IG-Lens, prediction_aware (default)", 30, t_lens,
         f"|δ| {float(d_lens.abs().max()):.1e}"),
        (f"IG-Lens, gausslegendre n_steps={args.n_steps}", 30, t_grad,
         f"|δ| {float(d_grad.abs().max()):.1e}"),
        (f"Captum LayerIntegratedGradients, block {args.layer}, n_steps={args.n_steps}", 1,
         t_lig, f"|δ| {float(d_lig.abs().max()):.1e}"),
    ]
    for name, k, t, delta in rows:
        print(f"{name:<56} {k:>6} {t:>9.4f} {delta:>14}")
    print()
    print(f"ratio  one LIG layer / IG-Lens all 30 layers (default)      : {t_lig / t_lens:8.1f}x")
    print(f"ratio  one LIG layer / IG-Lens all 30 layers (gausslegendre): {t_lig / t_grad:8.1f}x")
    print(f"a per-layer LIG comparison over 30 layers costs ~{30 * t_lig:.1f} s "
          f"({30 * t_lig / t_lens:.0f}x the IG-Lens default)")
    print(f"IG-Lens credits sum {float(a_lens.sum()):+.6f}; one LIG layer total "
          f"{float(a_lig.sum()):+.6f} (each layer's LIG total ~ F(x) - F(x'))")


if __name__ == "__main__":
    main()
