"""Logit, tuned and Jacobian lens on SmolLM2: KL to the final distribution and top-1 agreement.

    OMP_NUM_THREADS=1 python benchmarks/bench_lenses.py [--train 40] [--held-out 8]
        [--seq-len 64] [--steps 120] [--batch-tokens 32] [--jacobian-prompts 2]

The tuned-lens paper's figure as a table (Belrose et al. 2023, Fig. 2): per hidden-state index
``L``, the mean ``KL(p_final || g_L(h_L))`` (nats) and the share of tokens whose top-1 token
under ``g_L`` is the model's, on held-out text. Corpus: the default of ``iglens fit-lens``,
text SmolLM2 samples itself from the packaged prompts (seed 0), ``--train + --held-out``
chunks of ``--seq-len`` tokens from distinct prompts; the first ``--train`` chunks fit the
lenses, the rest are held out. The tuned lens is fitted by Adam on the tuned-lens objective
(:func:`~captum_iglens.lens.fit.fit_tuned_lens`), the Jacobian lens is the average Jacobian
over ``--jacobian-prompts`` training chunks of 24 tokens (its backward passes cost
``d / 32`` batched backward passes per prompt, so it is fitted on little text here). Also checks
completeness with lens terms on one prompt for each lens. One thread.
"""

from __future__ import annotations

import argparse
import os
import platform
import time

import torch

from captum_iglens import IGLens
from captum_iglens.lens.fit import fit_jacobian_lens, fit_tuned_lens, residuals_of
from captum_iglens.lens.fit_corpus import corpus_ids
from captum_iglens.lens.translators import JacobianLens, TunedLens
from captum_iglens.models import load_model


def _table(model, lenses: dict, hidden: torch.Tensor) -> None:
    n = hidden.shape[1] - 1
    dtype = next(model.parameters()).dtype
    readout = next(iter(lenses.values())).readout
    with torch.no_grad():
        final = readout(hidden[:, n].to(dtype)).float().log_softmax(-1)
        top = final.argmax(-1)
        print(f"{'L':>3} " + " ".join(f"{k + ' KL':>12} {k + ' top1':>12}" for k in lenses))
        means = {k: [] for k in lenses}
        for layer in range(n + 1):
            cells = []
            for name, lens in lenses.items():
                logq = lens(hidden[:, layer].to(dtype), layer).float().log_softmax(-1)
                kl = float((final.exp() * (final - logq)).sum(-1).mean())
                agree = float((logq.argmax(-1) == top).float().mean())
                means[name].append(kl)
                cells.append(f"{kl:12.4f} {agree:12.3f}")
            print(f"{layer:>3} " + " ".join(cells))
    wins = [all(means["tuned"][i] < means["logit"][i] for i in range(n))]
    print(f"tuned KL < logit KL at every layer L < n={n}: {wins[0]}")
    print("mean KL over L < n: " + ", ".join(f"{k} {sum(v[:n]) / n:.4f}"
                                             for k, v in means.items()))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--train", type=int, default=40)
    parser.add_argument("--held-out", type=int, default=8)
    parser.add_argument("--seq-len", type=int, default=64)
    parser.add_argument("--steps", type=int, default=120)
    parser.add_argument("--batch-tokens", type=int, default=32)
    parser.add_argument("--jacobian-prompts", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(1)
    omp = os.environ.get("OMP_NUM_THREADS")
    print(f"torch {torch.__version__}, {platform.processor() or platform.machine()}, "
          f"threads {torch.get_num_threads()} (OMP_NUM_THREADS={omp})")
    model, tokenizer = load_model("smollm2")
    t0 = time.perf_counter()
    ids = corpus_ids(model, tokenizer, seq_len=args.seq_len,
                     n_sequences=args.train + args.held_out, seed=0)
    t_gen = time.perf_counter() - t0
    train, held = ids[:args.train], ids[args.train:]
    print(f"corpus: {ids.shape[0]} chunks x {ids.shape[1]} tokens sampled by the model "
          f"({t_gen:.0f} s); fit on {train.numel()} tokens, held out {held.numel()}")
    t0 = time.perf_counter()
    tuned = fit_tuned_lens(model, train, steps=args.steps, batch_tokens=args.batch_tokens,
                           progress=False)
    t_tuned = time.perf_counter() - t0
    print(f"tuned lens fit: {args.steps} Adam steps x {args.batch_tokens} tokens, "
          f"{t_tuned:.0f} s (residual capture included)")
    t0 = time.perf_counter()
    jac = fit_jacobian_lens(model, train[:args.jacobian_prompts, :24], progress=False,
                            dim_batch=32)
    print(f"jacobian lens fit: {args.jacobian_prompts} prompts x 24 tokens, "
          f"{time.perf_counter() - t0:.0f} s")
    logit = TunedLens.for_model(model)  # identity translators: the logit lens
    hidden = residuals_of(model, held)
    print(f"\nheld-out text, {hidden.shape[0]} tokens: mean KL(p_final || lens) in nats, "
          "top-1 agreement with the model")
    _table(model, {"logit": logit, "tuned": tuned, "jacobian": jac}, hidden)
    prompt = tokenizer("The capital of France is", return_tensors="pt").input_ids
    print("\ncompleteness with lens terms (one prompt, last position):")
    for name, lens in (("tuned", tuned), ("jacobian", jac)):
        out = IGLens(model, lens=lens).attribute_details(prompt)
        total = out.attributions.double().sum(-1) + out.lens_change.double().sum(-1)
        err = float((total - (out.p_final - out.p_baseline).double()).abs().max())
        print(f"  {name:<9} |sum credits + sum lens terms - (p_final - g_0(b))| = {err:.2e}")
    assert isinstance(jac, JacobianLens)


if __name__ == "__main__":
    main()
