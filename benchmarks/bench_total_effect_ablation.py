"""How well readout credits, total-effect credits and AtP predict block-ablation drops.

    OMP_NUM_THREADS=1 python benchmarks/bench_total_effect_ablation.py [--prompts N]

The pre-registered test of :mod:`captum_iglens.validate.total_effect_plan` (read it for what
is measured and the thresholds, committed before this script was first run): SmolLM2, the
packaged validation prompts, the answer tokens ``iglens validate`` ablates; per token the
Spearman rho over the 30 blocks between each predictor and each ablation's drops, and top-1.
"""

from __future__ import annotations

import argparse
import os
import time

import numpy as np
import torch
from scipy.stats import spearmanr


def _scores(pred: np.ndarray, drop: np.ndarray) -> tuple[float, float]:
    """Median per-token Spearman rho and mean top-1 hit of ``pred`` against ``drop`` [N, n]."""
    rhos = [spearmanr(p, d).statistic for p, d in zip(pred, drop, strict=True)]
    rhos = [r for r in rhos if np.isfinite(r)]
    top1 = float(np.mean(pred.argmax(1) == drop.argmax(1)))
    return float(np.median(rhos)), top1


def _predictors(model, result, sel) -> dict[str, np.ndarray]:
    """Readout, total (8 steps) and AtP credits ``[T_sel, 30]`` for the selected tokens."""
    from captum_iglens import IGLens
    from captum_iglens.validate.total_effect_plan import PREREGISTRATION

    ids = torch.tensor([result.input_ids[:-1]])
    positions = [result.positions[t] for t in sel]
    target = torch.tensor([[result.token_ids[t] for t in sel]])
    steps = PREREGISTRATION["n_steps_total"]
    out = {"readout": result.attributions[sel].numpy()}
    for effect in ("total", "atp"):
        lens = IGLens(model, effect=effect)
        for ref in ("zero", "mean"):
            got = lens.attribute_details(ids, ref, target=target, positions=positions,
                                         n_steps=steps)
            out[f"{effect}/{ref}"] = got.attributions[0].numpy()
    return out


def _drops(ablation, traces, p, result, sel) -> dict[str, np.ndarray]:
    """Zero, mean (other prompts) and causal-mean ablation drops ``[T_sel, 30]``."""
    from captum_iglens.validate.ablation import mean_updates

    trace = traces[p]
    pos = [result.positions[t] for t in sel]
    target = torch.tensor([result.token_ids[t] for t in sel])
    others = [t for q, t in enumerate(traces) if q != p]
    mean = mean_updates(others, 200 if len(traces) >= 32 else 1)  # 1: a short trial run
    out = ablation.ablate(trace, pos, target, ("zero", "mean"), mean,
                          p_final=result.p_final[sel], last_credit=result.attributions[sel, -1])
    causal = []
    for j, i in enumerate(pos):
        ref = trace.updates[1:i].double().mean(0).to(trace.updates.dtype)
        one = ablation.ablate(trace, [i], target[j:j + 1], ("mean",), ref)
        causal.append(one.drops["mean"][0])
    return {"zero": out.drops["zero"].numpy(), "mean": out.drops["mean"].numpy(),
            "causal mean": torch.stack(causal).numpy()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=None, help="first N prompts only")
    args = parser.parse_args()

    from transformers.utils import logging as hf_logging

    from captum_iglens import explain
    from captum_iglens._utils.progress import progress_bars
    from captum_iglens.models.loading import load_model
    from captum_iglens.settings import VALIDATE_MAX_NEW_TOKENS, VALIDATE_THRESHOLD
    from captum_iglens.validate.ablation import BlockAblation
    from captum_iglens.validate.inputs import load_prompts
    from captum_iglens.validate.total_effect_plan import PREREGISTRATION

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    model, tokenizer = load_model()
    prompts = load_prompts()[:args.prompts]
    ablation = BlockAblation(model)
    start = time.perf_counter()
    with progress_bars(False):
        # teacher-forced, as the ablation's checks are (generation's KV cache rounds otherwise)
        results = [explain(model, tokenizer, p, target=explain(
            model, tokenizer, p, max_new_tokens=VALIDATE_MAX_NEW_TOKENS).token_ids)
            for p in prompts]
        traces = [ablation.trace(torch.tensor(r.input_ids)) for r in results]
        preds: dict[str, list] = {}
        drops: dict[str, list] = {}
        for p, result in enumerate(results):
            sel = [t for t, v in enumerate(result.p_final.tolist()) if v >= VALIDATE_THRESHOLD]
            if not sel:
                continue
            for name, arr in _predictors(model, result, sel).items():
                preds.setdefault(name, []).append(arr)
            for name, arr in _drops(ablation, traces, p, result, sel).items():
                drops.setdefault(name, []).append(arr)
    pred = {k: np.concatenate(v).astype(np.float64) for k, v in preds.items()}
    drop = {k: np.concatenate(v).astype(np.float64) for k, v in drops.items()}
    n_tok = next(iter(drop.values())).shape[0]
    print(f"SmolLM2-135M-Instruct, {len(prompts)} packaged prompts, {n_tok} answer tokens "
          f"(p_final >= {VALIDATE_THRESHOLD}) x 30 blocks; OMP_NUM_THREADS="
          f"{os.environ.get('OMP_NUM_THREADS', 'unset')}; {time.perf_counter() - start:.0f} s")
    print("median per-token Spearman rho / top-1 hit rate (predictor vs ablation drop)")
    print(f"{'predictor':<22} {'zero':>14} {'mean':>14} {'causal mean':>14}")
    for name in ("readout", "total", "atp"):
        cells = []
        for kind in ("zero", "mean", "causal mean"):
            key = name if name == "readout" else f"{name}/{'zero' if kind == 'zero' else 'mean'}"
            rho, top1 = _scores(pred[key], drop[kind])
            cells.append(f"{rho:.2f} / {top1:.2f}")
        label = {"readout": "readout credit", "total": "total effect, 8 steps",
                 "atp": "AtP"}[name]
        print(f"{label:<22} {cells[0]:>14} {cells[1]:>14} {cells[2]:>14}")
    th = PREREGISTRATION["thresholds"]["mean"]
    t_rho, t_top = _scores(pred["total/mean"], drop["mean"])
    a_rho, _ = _scores(pred["atp/mean"], drop["mean"])
    print()
    print("pre-registered (mean ablation of iglens validate):")
    for what, got, need in (("total effect median rho", t_rho, th["total_rho"]),
                            ("total effect top-1", t_top, th["total_top1"]),
                            ("AtP median rho", a_rho, th["atp_rho"])):
        print(f"  {what:<26} {got:.3f} (>= {need}): {'met' if got >= need else 'NOT met'}")


if __name__ == "__main__":
    main()
