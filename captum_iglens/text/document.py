"""Document mode: IG-Lens over the next-token predictions of a given text.

The text is teacher-forced: position ``p`` predicts token ``p + 1`` of the text itself, at
every position or at a stride. The text runs once, in chunks of ``chunk`` positions, each
pass attending to the earlier chunks through the model's KV cache
(:mod:`captum_iglens.text.document_pass`), and each chunk's explained positions are read out
before the next pass: the forward work grows with the text, and the ``positions x layers x
vocabulary`` readout never sits in memory at once. Families whose cache cannot serve
(:func:`~captum_iglens.text.document_pass.cache_refusal`) re-run the model over the text for
each chunk of positions instead.
"""

from __future__ import annotations

from contextlib import closing
from dataclasses import fields, replace
from typing import Any, Optional, Sequence

import torch
from torch import Tensor

from captum_iglens._core.entry import Forward, Recorded, attribute, check_estimator
from captum_iglens._utils.progress import progress_bar
from captum_iglens._utils.typing import BaselineSpec
from captum_iglens.ig_lens import IGLens
from captum_iglens.lens.context import context_length
from captum_iglens.lens.state import input_device
from captum_iglens.results import IGLensOutput, IGLensResult
from captum_iglens.settings import (
    DEFAULT_CHUNK,
    DEFAULT_ONSET_FRAC,
    DEFAULT_ONSET_RULE,
    AttributionSettings,
    ReportSettings,
    report_settings,
)
from captum_iglens.text.document_pass import DocumentChunk, cache_refusal, document_chunks
from captum_iglens.text.explain_prompt import contrast_per_token
from captum_iglens.text.packaging import AnswerSpec, result_from_output
from captum_iglens.text.prompts import render_prompt

__all__ = ["DEFAULT_CHUNK", "document_positions", "explain_document"]


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


def _baseline_rows(baselines: BaselineSpec, index: slice, positions: list[int],
                   n_chosen: int) -> BaselineSpec:
    """A chunk's rows of a baseline tensor with one row per explained or text position.

    ``[1, T, d]`` (one row per explained position) is cut at ``index``, ``[1, S, d]`` (one
    per text position) at ``positions``; any other baseline is returned as given.
    """
    if not (isinstance(baselines, Tensor) and baselines.is_floating_point()
            and baselines.dim() == 3):
        return baselines
    return baselines[:, index] if baselines.shape[1] == n_chosen else baselines[:, positions]


def _check_document_baseline(baselines: BaselineSpec, n_chosen: int, n_tokens: int) -> None:
    """Refuse a ``[B, P, d]`` baseline with neither ``T`` nor ``S`` rows, before any pass.

    Raises:
        ValueError: naming the shapes a document's baseline tensor may have.
    """
    if (isinstance(baselines, Tensor) and baselines.is_floating_point()
            and baselines.dim() == 3 and baselines.shape[1] not in (n_chosen, n_tokens)):
        raise ValueError(
            f"A document's baseline tensor of shape {tuple(baselines.shape)} has neither one "
            f"row per explained position ({n_chosen}) nor one per text position "
            f"({n_tokens}): give [d], [1, d], [1, {n_chosen}, d] or [1, {n_tokens}, d].")


def _chunk_source(piece: DocumentChunk, sequence: Tensor, foils: Optional[list[int]],
                  baselines: BaselineSpec, n_chosen: int) -> Recorded:
    """One cached pass's explained positions as a recording (targets: the text's next tokens).

    Takes the chunk's tensors (:meth:`~captum_iglens.text.document_pass.DocumentChunk.take`):
    the source holds them alone.
    """
    targets = sequence[:, [p + 1 for p in piece.positions]]
    contrast = None if foils is None else torch.tensor([foils[piece.index]])
    states, dist, mean = piece.take()
    if isinstance(baselines, str):  # the running causal mean: a [1, P, d] tensor here
        start, name = (mean if baselines == "mean" else baselines), baselines
    else:
        start = _baseline_rows(baselines, piece.index, piece.positions, n_chosen)
        name = "tensor"
    return Recorded(states, dist, piece.positions, targets, sequence.shape[1],
                    contrast=contrast, start=start, start_name=name)


def _one_pass(lens: IGLens, sequence: Tensor, chosen: list[int], chunk: int,
              foils: Optional[list[int]], top_k: int,
              settings: AttributionSettings) -> IGLensOutput:
    """The text in cached passes of ``chunk`` positions, each chunk read out in turn."""
    outputs = []
    with closing(document_chunks(lens, sequence, chosen, chunk, settings.baselines)) as passes, \
            progress_bar(total=len(chosen), desc="document", unit="position") as bar:
        for piece in passes:
            source = _chunk_source(piece, sequence, foils, settings.baselines, len(chosen))
            bar.update(len(piece.positions))
            outputs.append(attribute(lens.spec, source, settings=settings, top_k=top_k)[0])
    return _concat(outputs)


def _rerun(lens: IGLens, sequence: Tensor, chosen: list[int], chunk: int,
           foils: Optional[list[int]], top_k: int,
           settings: AttributionSettings) -> IGLensOutput:
    """One forward over the whole text per chunk of ``chunk`` explained positions."""
    outputs = []
    for begin in progress_bar(range(0, len(chosen), chunk), desc="document chunks",
                              unit="chunk"):
        part = chosen[begin:begin + chunk]
        target = sequence[:, [p + 1 for p in part]]
        rows = replace(settings, baselines=_baseline_rows(
            settings.baselines, slice(begin, begin + chunk), part, len(chosen)))
        contrast = None if foils is None else torch.tensor([foils[begin:begin + chunk]],
                                                           device=sequence.device)
        source = Forward(sequence, target=target, positions=part, contrast=contrast)
        outputs.append(attribute(lens.spec, source, settings=rows, top_k=top_k)[0])
    return _concat(outputs)


def explain_document(lens: IGLens, tokenizer: Any, text: str,
                     positions: Optional[Sequence[int]] = None, stride: int = 1,
                     chunk: int = DEFAULT_CHUNK, contrast: Any = None,
                     onset_frac: float = DEFAULT_ONSET_FRAC,
                     onset_rule: str = DEFAULT_ONSET_RULE, top_k: int = 0,
                     one_pass: bool = True, *, baselines: Optional[BaselineSpec] = None,
                     method: Optional[str] = None, n_steps: Optional[int] = None,
                     internal_batch_size: Optional[int] = None,
                     settings: Optional[AttributionSettings] = None,
                     report: Optional[ReportSettings] = None) -> IGLensResult:
    """IG-Lens over the next-token predictions of ``text`` (teacher forcing).

    The text runs once, ``chunk`` positions per forward pass with the KV cache of the
    earlier ones; families whose cache cannot serve
    (:func:`~captum_iglens.text.document_pass.cache_refusal`: RecurrentGemma, KV-shared layers,
    dynamic RoPE past its trained length, reference-id baselines) re-run the whole text for
    each chunk of ``chunk`` explained positions. Both give the numbers of one forward over the
    whole text, up to float32 rounding.

    Args:
        lens (IGLens): The lens (model, layers, units).
        tokenizer: The model's tokenizer (no chat template; its start token is kept).
        text (str): The document.
        positions (sequence of int, optional): Positions to explain; see
            :func:`document_positions`. Default: every ``stride``-th.
        stride (int, optional): Step between explained positions. Default: 1.
        chunk (int, optional): Text positions per forward pass (so at most that many
            explained positions read out together). Default: :data:`DEFAULT_CHUNK`.
        contrast (optional): Foil token ids, one for every position or one per position.
        onset_frac (float, optional): Fraction of the onset rule. Default: 0.5.
        onset_rule (str, optional): ``"sustained"`` (default) or ``"mass"``.
        top_k (int, optional): Logit-lens top tokens recorded per layer. Default: 0.
        one_pass (bool, optional): ``False`` re-runs the whole text for each chunk of
            explained positions even where the cache could serve (to compare the two).
            Default: True.
        baselines (optional): Keyword-only: a name, or a float tensor ``[d]``, ``[1, d]``,
            ``[1, T, d]`` or ``[1, S, d]``, or reference ids ``[1, S]``.
        method (str, optional): Keyword-only: the estimator. Default: ``"prediction_aware"``.
        n_steps (int, optional): Keyword-only: its steps per segment. Default: 50.
        internal_batch_size (int, optional): Keyword-only: readout rows per chunk.
            Each of these four given replaces its field of ``settings``.
        settings (AttributionSettings, optional): Keyword-only: the attribution settings in
            one object. Default: :class:`~captum_iglens.settings.AttributionSettings`'s.
        report (ReportSettings, optional): Keyword-only: ``onset_frac``, ``onset_rule`` and
            ``top_k`` in one object (:class:`~captum_iglens.settings.ReportSettings`),
            instead of those arguments (given both, ``ValueError``).

    Returns:
        IGLensResult: ``T`` explained positions x ``k`` layers; ``prompt`` is the text,
        ``prompt_length`` 1 (the first token is context only), ``extras["document"]`` True.

    Raises:
        ValueError: an empty text, bad positions or stride, a text longer than the model's
            context (:func:`~captum_iglens.lens.context.context_length`), a baseline tensor
            of another shape; and as :meth:`~captum_iglens.IGLens.attribute`.
        TypeError: an argument other than those above.
    """
    if chunk < 1:
        raise ValueError(f"chunk must be >= 1, got {chunk}.")
    settings = (settings or AttributionSettings()).updated(
        baselines=baselines, method=method, n_steps=n_steps,
        internal_batch_size=internal_batch_size)
    check_estimator(settings.method, settings.n_steps)  # before the text's first pass
    shown = report_settings(report, onset_frac=onset_frac, onset_rule=onset_rule, top_k=top_k)
    ids = render_prompt(tokenizer, text, chat_template=False).ids
    limit = context_length(lens.model)
    if limit is not None and len(ids) > limit:
        raise ValueError(f"The text is {len(ids)} tokens, but this model's context is {limit} "
                         "tokens: split it into parts of at most that length.")
    chosen = document_positions(len(ids), positions, stride)
    foils = contrast_per_token(contrast, len(chosen)) if contrast is not None else None
    sequence = torch.tensor([ids], device=input_device(lens.model))
    _check_document_baseline(settings.baselines, len(chosen), len(ids))
    refusal = cache_refusal(lens.model, len(ids), settings.baselines)
    # sub-layer nodes are captured by a whole forward (attribute_details): re-run
    block = lens.spec.recordable
    run = _one_pass if one_pass and refusal is None and block else _rerun
    output = run(lens, sequence, chosen, chunk, foils, shown.top_k, settings)
    spec = AnswerSpec(prompt=text, input_ids=list(ids), prompt_length=1,
                      token_ids=[ids[p + 1] for p in chosen], positions=chosen,
                      onset_frac=shown.onset_frac, onset_rule=shown.onset_rule,
                      model_name=lens.spec.display_name)
    result = result_from_output(output, 0, range(len(chosen)), spec, tokenizer, settings)
    return replace(result, extras={**result.extras, "document": True})
