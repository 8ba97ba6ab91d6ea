"""One GPU check of IG-Lens's costs, side by side in one run, in float32 and bfloat16.

    python benchmarks/gpu_check.py [--model SPEC] [--device cuda] [--cpu-small]

For each dtype, on the same model (default: the embedded SmolLM2-135M-Instruct):

1. IG-Lens's default (prediction-aware, all blocks) against a plain logit lens of the same
   layers, over every token of a greedy answer (median of a few runs, each with its forward);
2. IG-Lens's default against Captum's LayerIntegratedGradients over every block, one block
   at a time (as :func:`captum_iglens.compare.driver.compare_completeness` runs it), 50 steps, for
   the same one prediction;
3. a dataset run (:func:`captum_iglens.run.runner.run_records`: generation recorded, then the
   readouts) against batched greedy generation alone of the same prompts in the same batches;
4. document mode on an 8,192-token text (every position, one cached pass).

Sizes fit five minutes on one GPU. Without CUDA (or with ``--cpu-small``) the smallest sizes
run instead (a few prompts, a 64-token document, 8 LIG steps), so the script also runs on a
CPU, on a tiny model folder in seconds (``--model PATH``). :func:`main` returns the numbers.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_run import _quiet, prompts  # noqa: E402


@dataclass(frozen=True)
class Sizes:
    """How much each section does."""

    repeats: int
    answer_tokens: int
    lig_steps: int
    prompts: int
    max_new_tokens: int
    batch_size: int
    document_tokens: int


FULL = Sizes(repeats=5, answer_tokens=32, lig_steps=50, prompts=64, max_new_tokens=32,
             batch_size=32, document_tokens=8192)
SMALL = Sizes(repeats=2, answer_tokens=4, lig_steps=8, prompts=4, max_new_tokens=4,
              batch_size=4, document_tokens=64)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed(fn: Callable[[], Any], device: torch.device, repeats: int = 1) -> tuple[float, Any]:
    """Median wall time of ``repeats`` calls after one warm-up, and the last result."""
    out = fn()
    times = []
    for _ in range(repeats):
        _sync(device)
        start = time.perf_counter()
        out = fn()
        _sync(device)
        times.append(time.perf_counter() - start)
    return statistics.median(times), out


def logit_lens(lens: Any, ids: torch.Tensor, positions: list[int],
               target: torch.Tensor) -> torch.Tensor:
    """Plain logit lens: ``softmax(readout(h_L))[target]`` at the chosen layers, ``[T, k]``."""
    from captum_iglens.lens.hooks import capture_residual_stream

    with torch.no_grad(), capture_residual_stream(lens.decoder_blocks, lens.layer_indices) as h:
        lens.model(ids, use_cache=False, logits_to_keep=1)
        hidden = torch.stack([h[i][0, positions] for i in lens.layer_indices], 1)
        logits = lens.readout(hidden).float()
        index = target[0][:, None, None].expand(-1, hidden.shape[1], 1)
        return torch.softmax(logits, -1).gather(-1, index)[..., 0]


def _prompt_ids(tokenizer: Any, text: str) -> list[int]:
    from captum_iglens.text.prompts import render_prompt

    return render_prompt(tokenizer, text, chat_template=bool(
        getattr(tokenizer, "chat_template", None))).ids


def lens_sections(lens: Any, tokenizer: Any, sz: Sizes, device: torch.device) -> dict:
    """Sections 1 and 2: IG-Lens against the logit lens and against 30-layer LIG."""
    from captum_iglens.compare.driver import compare_completeness
    from captum_iglens.text.generation import generate_answer

    prompt = _prompt_ids(tokenizer, "What is the capital of Vietnam?")
    answer = generate_answer(lens.model, tokenizer, prompt, sz.answer_tokens)
    ids = torch.tensor([prompt + answer], device=device)
    positions = list(range(len(prompt) - 1, len(prompt) - 1 + len(answer)))
    target = torch.tensor([answer], device=device)
    t_lens, out = timed(lambda: lens.attribute_details(ids, target=target, positions=positions),
                        device, sz.repeats)
    t_logit, _ = timed(lambda: logit_lens(lens, ids, positions, target), device, sz.repeats)
    one = torch.tensor([prompt], device=device)
    t_one, _ = timed(lambda: lens.attribute(one, target=answer[0]), device, sz.repeats)
    t_lig, report = timed(lambda: compare_completeness(
        lens.model, one, target=answer[0], methods=("layer_integrated_gradients",),
        n_steps=sz.lig_steps, tokenizer=tokenizer), device)
    delta = (out.attributions.double().sum(-1) - (out.p_final - out.p_baseline).double())
    return {"answer_tokens": len(answer), "lens_s": t_lens, "logit_lens_s": t_logit,
            "lens_over_logit_lens": t_lens / t_logit, "lens_one_s": t_one, "lig_s": t_lig,
            "lig_over_lens": t_lig / t_one, "completeness": float(delta.abs().max()),
            "lig_layers": len(lens.layer_indices), "lig_report": report}


def run_section(lens: Any, tokenizer: Any, sz: Sizes, device: torch.device) -> dict:
    """Section 3: a dataset run against batched generation alone, same prompts and batches."""
    from captum_iglens.run.records import Record
    from captum_iglens.run.runner import run_records
    from captum_iglens.run.settings import RunSettings
    from captum_iglens.text.generation import generate_batch

    texts = prompts(sz.prompts)
    chat = bool(getattr(tokenizer, "chat_template", None))
    records = [Record(i, i + 1, prompt=p) for i, p in enumerate(texts)]
    settings = RunSettings(batch_size=sz.batch_size, max_new_tokens=sz.max_new_tokens,
                           chat_template=chat)
    with tempfile.TemporaryDirectory() as tmp:
        run_records(lens.model, tokenizer, records[:1], Path(tmp) / "warm.jsonl", settings,
                    lens, progress=False)
        _sync(device)
        start = time.perf_counter()
        report = run_records(lens.model, tokenizer, records, Path(tmp) / "out.jsonl", settings,
                             lens, progress=False)
        _sync(device)
        t_run = time.perf_counter() - start
    rendered = sorted((_prompt_ids(tokenizer, p) for p in texts), key=len)

    def generate() -> int:
        return sum(len(a) for b in range(0, len(rendered), sz.batch_size)
                   for a in generate_batch(lens.model, tokenizer,
                                           rendered[b:b + sz.batch_size], sz.max_new_tokens))

    t_gen, n_gen = timed(generate, device)
    return {"run_s": t_run, "run_tokens": report.n_tokens, "run_errors": report.n_errors,
            "run_ok": report.n_ok, "generate_s": t_gen, "generate_tokens": n_gen,
            "run_over_generate": t_run / t_gen}


def document_section(lens: Any, tokenizer: Any, sz: Sizes, device: torch.device) -> dict:
    """Section 4: document mode, every position of a ``document_tokens`` text."""
    from bench_document import document_text

    from captum_iglens.text.document import explain_document

    text = document_text(tokenizer, sz.document_tokens)
    t_doc, result = timed(lambda: explain_document(lens, tokenizer, text), device)
    return {"document_s": t_doc, "document_tokens": len(result.input_ids),
            "document_positions": len(result.tokens),
            "document_completeness": result.completeness_error}


def check_dtype(model: Any, tokenizer: Any, dtype: torch.dtype, sz: Sizes,
                device: torch.device) -> dict:
    """Every section on ``model`` in ``dtype``."""
    from captum_iglens import IGLens

    model.to(device=device, dtype=dtype)
    lens = IGLens(model)
    out = lens_sections(lens, tokenizer, sz, device)
    out.update(run_section(lens, tokenizer, sz, device))
    out.update(document_section(lens, tokenizer, sz, device))
    return out


ROWS = [
    ("IG-Lens default, {answer_tokens} answer tokens [s]", "lens_s", "{:.4f}"),
    ("plain logit lens, same tokens and layers [s]", "logit_lens_s", "{:.4f}"),
    ("  ratio IG-Lens / logit lens", "lens_over_logit_lens", "{:.3f}x"),
    ("IG-Lens default, one prediction [s]", "lens_one_s", "{:.4f}"),
    ("LIG, {lig_layers} layers one at a time [s]", "lig_s", "{:.2f}"),
    ("  ratio LIG / IG-Lens", "lig_over_lens", "{:.0f}x"),
    ("run_records, {run_tokens} answer tokens [s]", "run_s", "{:.2f}"),
    ("batched generation alone, {generate_tokens} tokens [s]", "generate_s", "{:.2f}"),
    ("  ratio run / generation", "run_over_generate", "{:.2f}x"),
    ("document mode, {document_tokens} tokens [s]", "document_s", "{:.2f}"),
    ("IG-Lens completeness max |sum - delta_p|", "completeness", "{:.1e}"),
    ("document completeness max |sum - delta_p|", "document_completeness", "{:.1e}"),
]


def print_table(results: dict[str, dict]) -> None:
    """One row per measurement, one column per dtype."""
    names = list(results)
    first = results[names[0]]
    print(f"{'':<56}" + "".join(f"{n:>12}" for n in names))
    for label, key, fmt in ROWS:
        cells = "".join(f"{fmt.format(results[n][key]):>12}" for n in names)
        print(f"{label.format(**first):<56}{cells}")


def main(argv: Optional[Sequence[str]] = None) -> dict[str, dict]:
    """Run every section in float32 and bfloat16; print the table; return the numbers."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None, help="model spec or folder (default SmolLM2)")
    parser.add_argument("--device", default=None, help="default: cuda if available, else cpu")
    parser.add_argument("--cpu-small", action="store_true",
                        help="the smallest sizes (the default without CUDA)")
    args = parser.parse_args(argv)
    _quiet()
    from captum_iglens._utils.progress import progress_bars
    from captum_iglens.models.loading import load_model

    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    sz = SMALL if args.cpu_small or device.type != "cuda" else FULL
    model, tokenizer = load_model(args.model)
    where = torch.cuda.get_device_name(device) if device.type == "cuda" else \
        f"CPU, {torch.get_num_threads()} threads"
    print(f"{where}; torch {torch.__version__}; {type(model).__name__}, "
          f"{'full' if sz is FULL else 'small'} sizes")
    results = {}
    with progress_bars(False):
        for name, dtype in (("float32", torch.float32), ("bfloat16", torch.bfloat16)):
            results[name] = check_dtype(model, tokenizer, dtype, sz, device)
    print_table(results)
    return results


if __name__ == "__main__":
    main()
