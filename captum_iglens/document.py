"""Document mode: IG-Lens over the next-token predictions of a given text.

The text is teacher-forced: position ``p`` predicts token ``p + 1`` of the text itself, at
every position or at a stride. Positions are explained in chunks, each one forward over the
whole text whose unembedding and readouts cover the chunk only, so the ``positions x layers
x vocabulary`` readout never sits in memory at once.
"""

from __future__ import annotations

from dataclasses import fields, replace
from typing import Any, Optional, Sequence

import torch
from torch import Tensor

from captum_iglens._progress import progress_bar
from captum_iglens.architectures import context_length, display_name
from captum_iglens.ig_lens import IGLens
from captum_iglens.prompts import render_prompt
from captum_iglens.residual import input_device
from captum_iglens.results import IGLensOutput, IGLensResult
from captum_iglens.results.from_output import AnswerSpec, result_from_output
from captum_iglens.text import contrast_per_token

__all__ = ["DEFAULT_CHUNK", "document_positions", "explain_document"]

#: Positions explained per forward pass in document mode.
DEFAULT_CHUNK = 512


def document_positions(n_tokens: int, positions: Optional[Sequence[int]] = None,
                       stride: int = 1) -> list[int]:
    """The explained positions of a text of ``n_tokens`` tokens.

    Args:
        n_tokens (int): Length of the tokenised text ``S``; positions ``0..S-2`` predict a
            token of the text.
        positions (sequence of int, optional): Chosen positions (negative: from ``S - 1``,
            so ``-1`` is the prediction of the last token). Default: every ``stride``-th.
        stride (int, optional): Step between explained positions. Default: 1 (all).

    Returns:
        list[int]: Sorted, distinct, non-negative positions.

    Raises:
        ValueError: a text of fewer than 2 tokens, ``stride < 1``, or a position out of range.
    """
    last = n_tokens - 2
    if last < 0:
        raise ValueError("The text has fewer than 2 tokens: no next-token prediction in it.")
    if stride < 1:
        raise ValueError(f"stride must be >= 1, got {stride}.")
    if positions is None:
        return list(range(0, last + 1, stride))
    chosen = set()
    for p in positions:
        q = p + last + 1 if p < 0 else p
        if not 0 <= q <= last:
            raise ValueError(f"Position {p} is out of range: this text's predictions are at "
                             f"positions 0..{last} (or -{last + 1}..-1).")
        chosen.add(q)
    return sorted(chosen)


def _concat(outputs: list[IGLensOutput]) -> IGLensOutput:
    """Outputs of chunks of positions joined along the position axis."""
    if len(outputs) == 1:
        return outputs[0]
    joined: dict[str, Any] = {}
    for f in fields(outputs[0]):
        value = getattr(outputs[0], f.name)
        if isinstance(value, Tensor):
            joined[f.name] = torch.cat([getattr(o, f.name) for o in outputs], dim=1)
        elif f.name == "positions":
            joined[f.name] = [p for o in outputs for p in o.positions]
    return replace(outputs[0], **joined)


def explain_document(lens: IGLens, tokenizer: Any, text: str,
                     positions: Optional[Sequence[int]] = None, stride: int = 1,
                     chunk: int = DEFAULT_CHUNK, contrast: Any = None,
                     onset_frac: float = 0.5, onset_rule: str = "sustained", top_k: int = 0,
                     **attribute_kwargs: Any) -> IGLensResult:
    """IG-Lens over the next-token predictions of ``text`` (teacher forcing).

    Args:
        lens (IGLens): The lens (model, layers, units).
        tokenizer: The model's tokenizer (no chat template; its start token is kept).
        text (str): The document.
        positions (sequence of int, optional): Positions to explain; see
            :func:`document_positions`. Default: every ``stride``-th.
        stride (int, optional): Step between explained positions. Default: 1.
        chunk (int, optional): Positions per forward pass. Default: :data:`DEFAULT_CHUNK`.
        contrast (optional): Foil token ids, one for every position or one per position.
        onset_frac (float, optional): Fraction of the onset rule. Default: 0.5.
        onset_rule (str, optional): ``"sustained"`` (default) or ``"mass"``.
        top_k (int, optional): Logit-lens top tokens recorded per layer. Default: 0.
        **attribute_kwargs: ``baselines``, ``method``, ``n_steps``, ``internal_batch_size``.

    Returns:
        IGLensResult: ``T`` explained positions x ``k`` layers; ``prompt`` is the text,
        ``prompt_length`` 1 (the first token is context only), ``extras["document"]`` True.

    Raises:
        ValueError: an empty text, bad positions or stride, a text longer than the model's
            context (:func:`~captum_iglens.architectures.context_length`); and as
            :meth:`~captum_iglens.IGLens.attribute`.
    """
    if chunk < 1:
        raise ValueError(f"chunk must be >= 1, got {chunk}.")
    ids = render_prompt(tokenizer, text, chat_template=False).ids
    limit = context_length(lens.model)
    if limit is not None and len(ids) > limit:
        raise ValueError(f"The text is {len(ids)} tokens, but this model's context is {limit} "
                         "tokens: split it into parts of at most that length.")
    chosen = document_positions(len(ids), positions, stride)
    foils = contrast_per_token(contrast, len(chosen)) if contrast is not None else None
    sequence = torch.tensor([ids], device=input_device(lens.model))
    outputs = []
    starts = range(0, len(chosen), chunk)
    for begin in progress_bar(starts, desc="document chunks", unit="chunk"):
        part = chosen[begin:begin + chunk]
        target = sequence[:, [p + 1 for p in part]]
        kwargs = dict(attribute_kwargs)
        if foils is not None:
            kwargs["contrast"] = torch.tensor([foils[begin:begin + chunk]],
                                              device=sequence.device)
        outputs.append(lens.attribute_details(sequence, target=target, positions=part,
                                              top_k=top_k, **kwargs))
    spec = AnswerSpec(prompt=text, input_ids=list(ids), prompt_length=1,
                      token_ids=[ids[p + 1] for p in chosen], positions=chosen,
                      method=attribute_kwargs.get("method", "prediction_aware"),
                      n_steps=attribute_kwargs.get("n_steps", 50), onset_frac=onset_frac,
                      onset_rule=onset_rule, model_name=display_name(lens.model))
    result = result_from_output(_concat(outputs), 0, range(len(chosen)), spec, tokenizer)
    result.extras["document"] = True
    return result
