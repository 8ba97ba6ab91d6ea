"""Per-model costs of IG-Lens on the named offline models, each measured in its own process.

For every model named on the command line (default: the embedded SmolLM2 and every
installed Qwen2.5-Coder), a child process measures, in one run:
  * load time and the peak resident memory of the process after loading (ru_maxrss);
  * IG-Lens (default estimator, all blocks, every token of a teacher-forced answer) against
    a plain logit lens of the same blocks on the same ids: seconds per answer token and the
    ratio of the two, medians of --repeats runs;
  * ``iglens run`` throughput (``run_records``, generated answers) at batch 1 and batch 16;
  * the cost of ``validate`` per ablated token (zero ablation only, a few prompts).
The parent prints one table; pass --threads 1 on a shared machine and say so.

    python benchmarks/bench_models.py [--models smollm2 qwen2.5-coder-1.5b-instruct]
        [--threads 1] [--repeats 3] [--prompts 16]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path

PROMPT = "What is the capital of Vietnam?"


def _median(fn, repeats: int) -> float:
    fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def _peak_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _lens_vs_logit_lens(model, tokenizer, repeats: int) -> dict:
    import torch

    from captum_iglens import IGLens
    from captum_iglens.lens.hooks import capture_residual_stream
    from captum_iglens.text.explain_prompt import build_prompt_ids, generate_answer

    prompt_ids, _ = build_prompt_ids(tokenizer, PROMPT)
    answer = generate_answer(model, tokenizer, prompt_ids, 16)
    ids = torch.tensor([prompt_ids + answer[:-1]])
    positions = list(range(len(prompt_ids) - 1, len(prompt_ids) - 1 + len(answer)))
    target = torch.tensor([answer])
    lens = IGLens(model)

    def iglens() -> object:
        return lens.attribute(ids, target=target, positions=positions)

    def logit_lens() -> object:
        with torch.no_grad(), capture_residual_stream(lens.decoder_blocks,
                                                      lens.layer_indices) as h:
            model(ids, use_cache=False, logits_to_keep=1)
            hidden = torch.stack([h[i][0, positions] for i in lens.layer_indices], 1)
            logits = lens.readout(hidden).float()
            index = target[0][:, None, None].expand(-1, hidden.shape[1], 1)
            return torch.softmax(logits, -1).gather(-1, index)

    t_lens, t_ll = _median(iglens, repeats), _median(logit_lens, repeats)
    return {"answer": tokenizer.decode(answer), "answer_tokens": len(answer),
            "iglens_s_per_token": t_lens / len(answer), "logit_lens_s_per_token":
            t_ll / len(answer), "iglens_over_logit_lens": t_lens / t_ll}


def _run_throughput(model, tokenizer, n_prompts: int, batch: int) -> float:
    from captum_iglens.run.records import Record
    from captum_iglens.run.runner import run_records
    from captum_iglens.run.settings import RunSettings
    from captum_iglens.validate.driver import load_prompts

    texts = (load_prompts() * 4)[:n_prompts]
    records = [Record(i, i, prompt=t) for i, t in enumerate(texts)]
    with tempfile.TemporaryDirectory() as tmp:
        report = run_records(model, tokenizer, records, Path(tmp) / "out.jsonl",
                             RunSettings(batch_size=batch, max_new_tokens=16), progress=False)
    return report.n_tokens / report.seconds


def _validate_cost(model, tokenizer) -> dict:
    from captum_iglens.validate.driver import load_prompts, validate

    start = time.perf_counter()
    result = validate(model, tokenizer, load_prompts()[:4], kinds=("zero",), n_boot=10,
                      progress=False)
    seconds = time.perf_counter() - start
    return {"validate_tokens": len(result.tokens),
            "validate_s_per_token": seconds / max(len(result.tokens), 1)}


def child(name: str, repeats: int, n_prompts: int) -> dict:
    """Everything measured for one model, in this (fresh) process."""
    warnings.simplefilter("ignore")
    from transformers.utils import logging as hf_logging

    from captum_iglens.models.loading import load_model

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    start = time.perf_counter()
    model, tokenizer = load_model(name)
    out = {"model": name, "load_s": time.perf_counter() - start, "load_peak_mib": _peak_mib(),
           "parameters": sum(p.numel() for p in model.parameters())}
    out.update(_lens_vs_logit_lens(model, tokenizer, repeats))
    out["run_batch1_tok_s"] = _run_throughput(model, tokenizer, n_prompts, 1)
    out["run_batch16_tok_s"] = _run_throughput(model, tokenizer, n_prompts, 16)
    out.update(_validate_cost(model, tokenizer))
    out["peak_mib"] = _peak_mib()
    return out


def _installed_models() -> list[str]:
    from captum_iglens.models.registry import NAMED_MODELS, part_files

    names = ["smollm2-135m-instruct"]
    for name, entry in NAMED_MODELS.items():
        try:
            part_files(entry)
        except FileNotFoundError:
            continue
        names.append(name)
    return names


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="*", default=None)
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: leave)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.threads:
        os.environ["OMP_NUM_THREADS"] = str(args.threads)
        import torch

        torch.set_num_threads(args.threads)
    if args.child:
        print("RESULT " + json.dumps(child(args.child, args.repeats, args.prompts)))
        return
    names = args.models or _installed_models()
    print(f"{platform.machine()}, {os.cpu_count()} CPUs, threads: {args.threads or 'default'}, "
          f"load average {os.getloadavg()[0]:.2f}")
    rows = []
    for name in names:
        cmd = [sys.executable, __file__, "--child", name, "--repeats", str(args.repeats),
               "--prompts", str(args.prompts), "--threads", str(args.threads)]
        done = subprocess.run(cmd, capture_output=True, text=True, check=True)
        line = next(x for x in done.stdout.splitlines() if x.startswith("RESULT "))
        rows.append(json.loads(line[len("RESULT "):]))
    print(f"load average after: {os.getloadavg()[0]:.2f}\n")
    fields = [("parameters", "parameters", "{:,}"), ("load_s", "load [s]", "{:.1f}"),
              ("load_peak_mib", "peak RSS after load [MiB]", "{:,.0f}"),
              ("answer", "answer", "{!r}"),
              ("iglens_s_per_token", "IG-Lens [s / answer token]", "{:.4f}"),
              ("logit_lens_s_per_token", "logit lens [s / answer token]", "{:.4f}"),
              ("iglens_over_logit_lens", "IG-Lens / logit lens", "{:.2f}x"),
              ("run_batch1_tok_s", "iglens run, batch 1 [tokens/s]", "{:.1f}"),
              ("run_batch16_tok_s", "iglens run, batch 16 [tokens/s]", "{:.1f}"),
              ("validate_s_per_token", "validate (zero), s / token", "{:.2f}"),
              ("peak_mib", "peak RSS, whole run [MiB]", "{:,.0f}")]
    print(f"{'':32}" + "".join(f"{r['model'][:28]:>30}" for r in rows))
    for key, label, spec in fields:
        print(f"{label:32}" + "".join(f"{spec.format(r[key])[:28]:>30}" for r in rows))


if __name__ == "__main__":
    main()
