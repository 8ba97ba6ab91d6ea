"""Greedy answers with transformers' ``generate``, one prompt or a left-padded batch.

Decoding is plain greedy whatever the checkpoint stores, so every answer token is the
argmax of the model: that is the prediction IG-Lens then explains.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Any, Iterator, Sequence

import torch
from torch import nn

from captum_iglens.lens.context import max_sequence_length
from captum_iglens.lens.state import input_device, model_state_preserved
from captum_iglens.settings import DEFAULT_MAX_NEW_TOKENS

__all__ = ["DEFAULT_MAX_NEW_TOKENS", "end_ids", "generate_answer", "generate_batch",
           "greedy_generate", "left_pad", "neutral_generation_config", "pad_id"]



@contextmanager
def neutral_generation_config(
    model: nn.Module, tokenizer: Any, max_new_tokens: int
) -> Iterator[Any]:
    """Swap in a generation config with nothing but greedy decoding and the end tokens.

    ``generate(do_sample=False)`` still applies what the checkpoint's stored
    ``generation_config`` holds (``repetition_penalty``, ``no_repeat_ngram_size``, suppressed
    tokens, ...), and explicit arguments equal to a library default may be overridden by the
    stored values; then an answer token is not the argmax of the forward that is attributed.
    """
    from transformers import GenerationConfig

    stored = getattr(model, "generation_config", None)
    eos = getattr(stored, "eos_token_id", None)
    eos = eos if eos is not None else tokenizer.eos_token_id
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    neutral = GenerationConfig(do_sample=False, num_beams=1, eos_token_id=eos, pad_token_id=pad,
                               bos_token_id=getattr(stored, "bos_token_id", None),
                               max_new_tokens=max_new_tokens, use_cache=True)
    model.generation_config = neutral  # type: ignore[assignment]  # a GenerationMixin's
    try:
        yield neutral
    finally:
        model.generation_config = stored  # type: ignore[assignment]  # as above


def end_ids(model: nn.Module, tokenizer: Any) -> set[int]:
    """The ids that end a generated answer (the generation config's and the tokenizer's)."""
    ids = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    ids = ids if isinstance(ids, (list, tuple)) else [ids]
    return {int(i) for i in [*ids, tokenizer.eos_token_id] if i is not None}


def pad_id(tokenizer: Any) -> int:
    """The id used for padding: the tokenizer's pad token, else its end token, else 0."""
    for value in (getattr(tokenizer, "pad_token_id", None),
                  getattr(tokenizer, "eos_token_id", None)):
        if value is not None:
            return int(value)
    return 0


def left_pad(rows: Sequence[Sequence[int]], pad: int,
              device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """``[B, S]`` ids left-padded with ``pad`` and their ``[B, S]`` attention mask."""
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), pad, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for r, row in enumerate(rows):
        ids[r, width - len(row):] = torch.tensor(list(row), dtype=torch.long)
        mask[r, width - len(row):] = 1
    return ids.to(device), mask.to(device)


def greedy_generate(model: nn.Module, tokenizer: Any, prompt_ids: Sequence[Sequence[int]],
                    max_new_tokens: int, **generate_kwargs: Any
                    ) -> tuple[list[list[int]], Any, torch.Tensor]:
    """One left-padded greedy ``generate`` call: the answers and ``generate``'s own output.

    Args:
        model (nn.Module): A Hugging Face causal LM.
        tokenizer: Its tokenizer (pad and end tokens).
        prompt_ids (sequence of sequence of int): ``B`` prompts' token ids.
        max_new_tokens (int): Longest answer.
        **generate_kwargs: More ``GenerationConfig`` fields (e.g. ``output_logits=True,
            return_dict_in_generate=True``), set on the neutral greedy config.

    Returns:
        (answers, output, mask): ``B`` answers (each up to its first end token, included),
        what ``generate`` returned, and the prompts' ``[B, S_p]`` attention mask.

    Raises:
        ValueError: ``max_new_tokens < 1``, or a prompt plus ``max_new_tokens`` longer than
            the model's position table (checked before generating).
    """
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
    limit = max_sequence_length(model)
    longest = max(len(p) for p in prompt_ids)
    if limit is not None and longest + max_new_tokens > limit:
        raise ValueError(
            f"The prompt is {longest} tokens and max_new_tokens is {max_new_tokens}: "
            f"{longest + max_new_tokens} tokens, but this model positions at most "
            f"{limit} tokens. Shorten the prompt or lower max_new_tokens."
        )
    ids, mask = left_pad(prompt_ids, pad_id(tokenizer), input_device(model))
    with model_state_preserved(model), torch.no_grad(), \
            neutral_generation_config(model, tokenizer, max_new_tokens) as config:
        for name, value in generate_kwargs.items():
            setattr(config, name, value)
        out = model.generate(input_ids=ids, attention_mask=mask, generation_config=config)  # type: ignore[operator]  # a GenerationMixin
    sequences = out if isinstance(out, torch.Tensor) else out.sequences
    ends = end_ids(model, tokenizer)
    answers = []
    for row in sequences[:, ids.shape[1]:].tolist():
        stop = next((t + 1 for t, token in enumerate(row) if token in ends), len(row))
        answers.append(row[:stop])
    return answers, out, mask


def generate_batch(model: nn.Module, tokenizer: Any, prompt_ids: Sequence[Sequence[int]],
                   max_new_tokens: int) -> list[list[int]]:
    """Greedy answers of several prompts in one left-padded ``generate`` call.

    Decoding is plain greedy (the checkpoint's stored generation settings are not applied),
    as in :func:`generate_answer`; each answer stops after its first end token.

    Args:
        model (nn.Module): A Hugging Face causal LM.
        tokenizer: Its tokenizer (pad and end tokens).
        prompt_ids (sequence of sequence of int): ``B`` prompts' token ids.
        max_new_tokens (int): Longest answer.

    Returns:
        list[list[int]]: ``B`` answers, the end token included where the model emitted one.

    Raises:
        ValueError: ``max_new_tokens < 1``, or a prompt plus ``max_new_tokens`` longer than
            the model's position table (checked before generating).
    """
    return greedy_generate(model, tokenizer, prompt_ids, max_new_tokens)[0]


def generate_answer(
    model: nn.Module, tokenizer: Any, prompt_ids: Sequence[int],
    max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS,
) -> list[int]:
    """Greedy answer with transformers' ``generate`` (KV cache, attention mask, stops at EOS).

    Decoding is plain greedy: the checkpoint's stored generation settings (e.g. a
    ``repetition_penalty``) are not applied, so each token is the argmax of the model.

    Returns:
        list[int]: The generated token ids (the end token included when the model emitted it).

    Raises:
        ValueError: ``max_new_tokens < 1``, or the prompt plus ``max_new_tokens`` is longer
            than the model's position table (checked before generating).
    """
    return generate_batch(model, tokenizer, [list(prompt_ids)], max_new_tokens)[0]
