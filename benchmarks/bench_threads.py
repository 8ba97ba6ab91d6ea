"""Two threads, one model: what the per-model forward lock costs.

    OMP_NUM_THREADS=1 python benchmarks/bench_threads.py [--calls 6] [--smollm2]

IG-Lens runs a model's forward passes under one lock per model object (its train/eval modes
and stateful buffers are the model's, shared by every thread); readouts and estimators run
outside it. This times ``2 * calls`` explanations of two prompts run one after the other and
the same calls from two threads (``calls`` each), for the default estimator (a forward and
``T (k + 1)`` readouts: the forward is most of it) and a gradient estimator (readouts with a
backward pass each: most of it runs outside the lock), and checks that every threaded call
gave the sequential numbers bit for bit. Default model: a Llama built from a config (d=256,
6 blocks, vocabulary 8192, random weights); ``--smollm2``: the embedded SmolLM2-135M.
"""

from __future__ import annotations

import argparse
import os
import platform
import threading
import time

import torch


def _model(smollm2: bool) -> torch.nn.Module:
    if smollm2:
        from captum_iglens.models.loading import load_model

        return load_model()[0]
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=8192, hidden_size=256, intermediate_size=512,
                         num_hidden_layers=6, num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=512)
    return LlamaForCausalLM(config).eval()


def _timed(jobs: list, threaded: bool) -> tuple[float, list]:
    results: list = [None] * len(jobs)

    def run(i: int) -> None:
        results[i] = jobs[i]()

    start = time.perf_counter()
    if threaded:
        threads = [threading.Thread(target=run, args=(i,)) for i in range(len(jobs))]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    else:
        for i in range(len(jobs)):
            run(i)
    return time.perf_counter() - start, results


def main() -> None:
    """Print the timings and the bit-for-bit check."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=6)
    parser.add_argument("--smollm2", action="store_true")
    args = parser.parse_args()
    from captum_iglens import IGLens

    model = _model(args.smollm2)
    lens = IGLens(model)
    vocab = lens.spec.vocab_size or 1000
    gen = torch.Generator().manual_seed(0)
    prompts = [torch.randint(5, vocab, (1, n), generator=gen) for n in (48, 64)]
    print(f"model: {type(model).__name__} ({lens.spec.num_layers} blocks), torch "
          f"{torch.__version__}, {platform.machine()}, {torch.get_num_threads()} threads "
          f"(OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', 'unset')}), "
          f"{os.cpu_count()} CPUs; {args.calls} calls per thread, prompts of 48 and 64 tokens, "
          "8 positions explained each")
    print(f"{'estimator':<28} {'sequential s':>13} {'2 threads s':>12} {'ratio':>6} "
          f"{'bitwise':>8}")
    for method, steps in (("prediction_aware", 2), ("gausslegendre", 16)):
        def call(ids: torch.Tensor, m: str = method, n: int = steps) -> torch.Tensor:
            return lens.attribute(ids, positions=list(range(-8, 0)), method=m, n_steps=n)

        alone = [call(ids) for ids in prompts]  # warm-up and reference
        seq, _ = _timed([lambda ids=ids: [call(ids) for _ in range(args.calls)]
                         for ids in prompts], threaded=False)
        par, got = _timed([lambda ids=ids: [call(ids) for _ in range(args.calls)]
                           for ids in prompts], threaded=True)
        same = all(torch.equal(run, want) for runs, want in zip(got, alone, strict=True)
                   for run in runs)
        print(f"{method:<28} {seq:>13.3f} {par:>12.3f} {par / seq:>6.2f} {str(same):>8}")


if __name__ == "__main__":
    main()
