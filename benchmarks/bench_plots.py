"""Seconds a figure: the top-K panel and the heatmap, on synthetic results (no model).

    OMP_NUM_THREADS=1 python benchmarks/bench_plots.py [--repeats 3] [--before OLD/top_k.py]

The top-K figure: 4 panels of 30 layers x 5 ranks (600 labels, each fitted to its cell),
built (``plot_top_k``) and saved as PNG at 120 dpi (the CLI's ``PATH-topk.png``); the
heatmap figure (``plot_result``) of 6 tokens at 61 sub-layer nodes. Median of
``--repeats`` after one warm-up. ``--before`` times another checkout's ``top_k.py`` in the
same run (same result, same process), for a before/after.
"""

from __future__ import annotations

import argparse
import importlib.util
import io
import os
import platform
import statistics
import time
from typing import Any, Callable

import matplotlib

matplotlib.use("Agg")

import torch  # noqa: E402

from captum_iglens.results import IGLensResult  # noqa: E402


def _result(n_tok: int, k: int, ranks: int, granularity: str = "block") -> IGLensResult:
    gen = torch.Generator().manual_seed(0)
    tokens = [[[f"a-rather-long-token-{t}-{j}-{r}" for r in range(ranks)] for j in range(k)]
              for t in range(n_tok)]
    first = 0 if granularity == "sublayer" else 1
    return IGLensResult(
        prompt="w1 w2", answer="w3", prompt_length=2, input_ids=list(range(2 + n_tok)),
        tokens=[f"w{t}" for t in range(n_tok)], token_ids=list(range(n_tok)),
        positions=list(range(1, 1 + n_tok)), layer_indices=list(range(first, first + k)),
        attributions=torch.randn(n_tok, k, generator=gen) * 0.01,
        lens_probs=torch.rand(n_tok, k, generator=gen), p_final=torch.rand(n_tok, generator=gen),
        p_baseline=torch.zeros(n_tok), convergence_delta=torch.zeros(n_tok),
        onset_layers=[first + k - 1] * n_tok, top_k_ids=torch.full((n_tok, k, ranks), 99),
        top_k_probs=torch.rand(n_tok, k, ranks, generator=gen), top_k_tokens=tokens,
        granularity=granularity)


def _timed(draw: Callable[[], Any], repeats: int) -> tuple[float, float]:
    """Median seconds to build the figure and to save it (PNG, 120 dpi)."""
    draw().savefig(io.BytesIO(), format="png", dpi=120)  # warm-up: fonts, caches
    build, save = [], []
    for _ in range(repeats):
        start = time.perf_counter()
        fig = draw()
        mid = time.perf_counter()
        fig.savefig(io.BytesIO(), format="png", dpi=120)
        build.append(mid - start)
        save.append(time.perf_counter() - mid)
    return statistics.median(build), statistics.median(save)


def _module(path: str) -> Any:
    spec = importlib.util.spec_from_file_location("before_top_k", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    return module


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--before", default=None, help="another checkout's plot/top_k.py")
    args = parser.parse_args()
    from captum_iglens.plot import top_k
    from captum_iglens.plot.credits import plot_result

    print(f"torch {torch.__version__}, matplotlib {matplotlib.__version__}, "
          f"{platform.machine()}, {os.cpu_count()} CPUs, "
          f"OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', 'unset')}; "
          f"median of {args.repeats} after one warm-up")
    res = _result(6, 30, 5)
    rows = [("top-K, 4 panels x 30 layers x 5 ranks", lambda: top_k.plot_top_k(res))]
    if args.before:
        before = _module(args.before)
        rows.insert(0, (f"top-K, the same, {args.before}", lambda: before.plot_top_k(res)))
    sub = _result(6, 61, 1, "sublayer")
    rows.append(("plot_result, 6 tokens x 61 sub-layer nodes", lambda: plot_result(sub)))
    print(f"{'figure':<58}{'build s':>9}{'save s':>9}{'total s':>9}")
    for name, draw in rows:
        build, save = _timed(draw, args.repeats)
        print(f"{name:<58}{build:>9.2f}{save:>9.2f}{build + save:>9.2f}")


if __name__ == "__main__":
    main()
