"""Shared by the benchmark scripts: the median wall time of a call, and SmolLM2's answer to the
README prompt as a teacher-forced input (``python benchmarks/<script>.py`` puts this folder on
``sys.path``)."""

from __future__ import annotations

import statistics
import time
from typing import Any, Callable

import torch


def median_time(fn: Callable[[], Any], repeats: int) -> tuple[float, Any]:
    """``(median seconds of `repeats` timed calls after one untimed warm-up, last result)``."""
    out = fn()  # warm-up (not timed)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times), out


#: ``(model, tokenizer, prompt_ids, answer, ids, positions, target)``
Answer = tuple[Any, Any, list[int], list[int], torch.Tensor, list[int], torch.Tensor]


def smollm2_answer(max_new_tokens: int, prompt: str = "What is the capital of Vietnam?"
                   ) -> Answer:
    """The embedded SmolLM2, its greedy answer to ``prompt`` and the teacher-forced input.

    Returns:
        ``(model, tokenizer, prompt_ids, answer, ids [1, S], positions, target [1, T])``:
        every answer token explained at the position before it.
    """
    from transformers.utils import logging as hf_logging

    from captum_iglens.models.loading import load_model
    from captum_iglens.text.explain_prompt import build_prompt_ids, generate_answer

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    model, tokenizer = load_model()
    prompt_ids, _ = build_prompt_ids(tokenizer, prompt)
    answer = generate_answer(model, tokenizer, prompt_ids, max_new_tokens)
    ids = torch.tensor([prompt_ids + answer[:-1]])
    positions = list(range(len(prompt_ids) - 1, len(prompt_ids) - 1 + len(answer)))
    return model, tokenizer, prompt_ids, answer, ids, positions, torch.tensor([answer])
