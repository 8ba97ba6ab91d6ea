"""Side-by-side timing of the IG-Lens estimators on the embedded SmolLM2 (issue: core).

On all 30 layers and every answer token of the default prompt, times in one run:
  * the default prediction-aware estimator (T * (k + 1) readouts, no backward pass);
  * the same credits computed the way the reference script does: the readout at all
    n_steps + 1 grid points of every segment (n_steps = 64), observed changes summed;
  * the gradient estimator (Gauss-Legendre) at n_steps = 64;
  * the plain logit lens of the same layers (forward with hooks + T * k readouts).
Two timings per variant: end to end (each runs the model forward, then its readouts), and
the estimator alone on one shared captured residual stream (the forward excluded, the same
for all). Prints median wall times, ratios and the max abs difference between the default
estimator and the grid computation. Then the default, the default as it ran before each
node was read out once (``h_n`` read out a second time for the readout check), and the logit
lens, interleaved round by round (``--pairs``), so a shared machine's load falls on all
three alike.

    python benchmarks/bench_estimators.py [--prompt TEXT] [--repeats 5] [--n-steps 64]
                                           [--pairs 15] [--threads N]
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Callable

import torch
from transformers.utils import logging as hf_logging

from captum_iglens import IGLens
from captum_iglens._core.estimators import ESTIMATORS, grid_probs, node_probs
from captum_iglens._core.pipeline import capture_lens_path
from captum_iglens.lens.hooks import capture_residual_stream
from captum_iglens.lens.readout import chunk_rows, readout_probs
from captum_iglens.lens.readout_check import check_readout
from captum_iglens.models.loading import load_model
from captum_iglens.text.explain_prompt import build_prompt_ids, generate_answer


def median_time(fn: Callable[[], object], repeats: int) -> tuple[float, object]:
    fn()  # warm-up
    times, out = [], None
    for _ in range(repeats):
        start = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times), out


def logit_lens(lens: IGLens, ids: torch.Tensor, positions: list[int], target: torch.Tensor):
    """Plain logit lens: f(h_L) for the chosen layers, [T, k]."""
    with torch.no_grad(), capture_residual_stream(lens.decoder_blocks, lens.layer_indices) as h:
        lens.model(ids, use_cache=False, logits_to_keep=1)  # no need for its own logits
        hidden = torch.stack([h[i][0, positions] for i in lens.layer_indices], 1)  # [T, k, d]
        logits = lens.readout(hidden).float()
        index = target[0][:, None, None].expand(-1, hidden.shape[1], 1)
        return torch.softmax(logits, -1).gather(-1, index)[..., 0]


def previous_default(lens: IGLens, ids: torch.Tensor, positions: list[int],
                     target: torch.Tensor) -> torch.Tensor:
    """The default as it ran before each node was read out once: every node of every
    position read out, then h_n read out again for the whole-distribution check."""
    cap = capture_lens_path(lens.spec, ids, target, positions, "mean", None)
    nodes, chunk = cap.path.nodes, chunk_rows(None, 49152)
    probs = readout_probs(lens.readout, nodes.reshape(-1, nodes.shape[-1]),
                          cap.path.row_ids(tuple(nodes.shape[:-1])), chunk).view(nodes.shape[:3])
    check_readout(lens.readout, probs, cap.model_probs, torch.float32,
                  hidden=nodes[:, :, -1], reference=cap.reference, chunk=chunk)
    return probs.diff(dim=-1)


def interleaved(variants: dict[str, Callable[[], object]], pairs: int) -> None:
    """Each variant once per round, ``pairs`` rounds: medians of wall and processor time.

    Interleaving spreads a shared machine's changing load evenly over the variants.
    """
    wall: dict[str, list[float]] = {name: [] for name in variants}
    cpu: dict[str, list[float]] = {name: [] for name in variants}
    for fn in variants.values():
        fn()  # warm-up
    for _ in range(pairs):
        for name, fn in variants.items():
            start, start_cpu = time.perf_counter(), time.process_time()
            fn()
            wall[name].append(time.perf_counter() - start)
            cpu[name].append(time.process_time() - start_cpu)
    lens = "plain logit lens"
    print(f"\ninterleaved, {pairs} rounds: median end-to-end time, and relative to the logit lens")
    print(f"{'variant':<44}{'wall [s]':>10}{'ratio':>8}{'cpu [s]':>10}{'ratio':>8}")
    for name in variants:
        w, c = statistics.median(wall[name]), statistics.median(cpu[name])
        print(f"{name:<44}{w:>10.4f}{w / statistics.median(wall[lens]):>7.3f}x"
              f"{c:>10.4f}{c / statistics.median(cpu[lens]):>7.3f}x")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompt", default="What is the capital of Vietnam?")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--n-steps", type=int, default=64)
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: leave)")
    parser.add_argument("--pairs", type=int, default=15,
                        help="rounds of the interleaved default / logit lens timing (0: none)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()

    model, tokenizer = load_model()
    prompt_ids, _ = build_prompt_ids(tokenizer, args.prompt)
    answer_ids = generate_answer(model, tokenizer, prompt_ids, 32)
    ids = torch.tensor([prompt_ids + answer_ids])
    positions = list(range(len(prompt_ids) - 1, len(prompt_ids) - 1 + len(answer_ids)))
    target = torch.tensor([answer_ids])
    lens = IGLens(model)
    n_tok, k = len(answer_ids), len(lens.layer_indices)
    print(f"model: SmolLM2-135M-Instruct (embedded), {k} layers, d=576, vocab 49152")
    print(f"prompt: {args.prompt!r} -> answer {tokenizer.decode(answer_ids)!r} ({n_tok} tokens)")
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, "
          f"median of {args.repeats} runs, each including the model forward\n")

    def default() -> torch.Tensor:
        return lens.attribute(ids, target=target, positions=positions)

    def grid() -> torch.Tensor:
        profile = lens.path_probabilities(ids, target=target, positions=positions,
                                          n_steps=args.n_steps)
        return profile.diff(dim=-1).sum(-1)

    def gradient() -> torch.Tensor:
        return lens.attribute(ids, target=target, positions=positions, method="gausslegendre",
                              n_steps=args.n_steps)

    def lens_only() -> torch.Tensor:
        return logit_lens(lens, ids, positions, target)

    # 1. End to end: each variant runs the model forward, then its readouts.
    t_default, a_default = median_time(default, args.repeats)
    t_grid, a_grid = median_time(grid, max(1, args.repeats // 2))
    t_grad, a_grad = median_time(gradient, max(1, args.repeats // 2))
    t_lens, p_lens = median_time(lens_only, args.repeats)
    details = lens.attribute_details(ids, target=target, positions=positions)
    delta_p = details.p_final - details.p_baseline

    # 2. Estimators alone, side by side on one captured residual stream (same forward).
    cap = capture_lens_path(lens.spec, ids, target, positions, "mean", None)
    chunk = chunk_rows(None, 49152)
    layers = cap.path.nodes[:, :, 1:]
    hidden = layers.reshape(-1, layers.shape[-1])
    lens_targets = cap.path.target[:, :, None].expand(layers.shape[:-1]).reshape(-1)
    e_default, _ = median_time(lambda: node_probs(lens.readout, cap.path, chunk).diff(dim=-1),
                               args.repeats)
    e_grid, _ = median_time(lambda: grid_probs(lens.readout, cap.path, args.n_steps, chunk)
                            .diff(dim=-1).sum(-1), max(1, args.repeats // 2))
    probs = node_probs(lens.readout, cap.path, chunk)
    e_grad, _ = median_time(lambda: ESTIMATORS["gausslegendre"].estimate(
        lens.readout, cap.path, probs, "gausslegendre", args.n_steps, chunk),
        max(1, args.repeats // 2))
    e_lens, _ = median_time(lambda: readout_probs(lens.readout, hidden, lens_targets, chunk),
                            args.repeats)

    readouts = [n_tok * (k + 1), n_tok * k * (args.n_steps + 1), n_tok * k * args.n_steps,
                n_tok * k]
    names = ["prediction_aware (default)", f"grid, n_steps={args.n_steps} (reference)",
             f"gausslegendre, n_steps={args.n_steps}", "plain logit lens"]
    notes = ["no backward", "no backward", "backward", "no backward"]
    print(f"{'variant':<34} {'end-to-end [s]':>14} {'estimator [s]':>14} {'readouts':>9}")
    for name, t_e2e, t_est, count, note in zip(
        names, (t_default, t_grid, t_grad, t_lens), (e_default, e_grid, e_grad, e_lens),
        readouts, notes, strict=True,
    ):
        print(f"{name:<34} {t_e2e:>14.4f} {t_est:>14.4f} {count:>9}  ({note})")
    print()
    print("                                            estimator   end-to-end")
    print(f"speed-up of default over grid computation: {e_grid / e_default:9.1f}x "
          f"{t_grid / t_default:11.1f}x")
    print(f"speed-up of default over gausslegendre:     {e_grad / e_default:9.1f}x "
          f"{t_grad / t_default:11.1f}x")
    print(f"cost of default relative to logit lens:     {e_default / e_lens:9.3f}x "
          f"{t_default / t_lens:11.3f}x")
    print()
    print(f"max |default - grid| credits:               {(a_default - a_grid).abs().max():.3e}")
    print(f"max |default - gausslegendre| credits:      {(a_default - a_grad).abs().max():.3e}")
    print(f"max |lens_probs - plain logit lens|:        "
          f"{(details.lens_probs[0] - p_lens).abs().max():.3e}")
    print(f"completeness max |sum - delta_p| (default): "
          f"{(a_default.sum(-1) - delta_p).abs().max():.3e}")
    if args.pairs:
        interleaved({"prediction_aware (default)": default,
                     "default before (h_n read out twice)": lambda: previous_default(
                         lens, ids, positions, target),
                     "plain logit lens": lens_only}, args.pairs)


if __name__ == "__main__":
    main()
