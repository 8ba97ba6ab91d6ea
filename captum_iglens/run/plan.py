"""The plan of a dataset run: records prepared into units of work (a batch, a document)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional, Sequence

from torch import nn

from captum_iglens.lens.context import check_context
from captum_iglens.run.records import Record
from captum_iglens.run.settings import RunSettings
from captum_iglens.text.batched import AnswerJob
from captum_iglens.text.explain_prompt import (
    contrast_per_token,
    foil_ids,
    target_ids,
    target_token_ids,
)
from captum_iglens.text.prompts import render_prompt
from captum_iglens.text.recorded import Recording

__all__ = ["Unit", "batch_groups", "check_length", "finish_job", "plan_units", "prepare_job"]


@dataclass
class Unit:
    """Records run together: a batch of prompts, one document, or unreadable records."""

    kind: str
    records: list[Record]
    jobs: list[Optional[AnswerJob]] = field(default_factory=list)
    errors: list[Optional[str]] = field(default_factory=list)


def prepare_job(record: Record, tokenizer: Any, settings: RunSettings) -> AnswerJob:
    """Render a prompt record and read its given answer (checks that need no model)."""
    rendered = render_prompt(tokenizer, record.prompt or "", settings.chat_template,
                             settings.template_kwargs)
    job = AnswerJob(record.prompt or "", rendered)
    if record.answer_ids is not None:
        job.answer_ids = list(record.answer_ids)
    elif record.answer is not None:
        job.answer_ids = target_token_ids(tokenizer, record.answer)
    elif isinstance(record.target, str):
        job.answer_ids = target_token_ids(tokenizer, record.target)
    elif record.target is not None:
        job.answer_ids = target_ids(record.target)
    job.foils = foil_ids(tokenizer, record.contrast)
    job.generated = not job.answer_ids
    return job


def plan_units(records: Sequence[Record], tokenizer: Any, settings: RunSettings) -> list[Unit]:
    """Units in a deterministic order, the same in every process.

    Unreadable records first, then documents, then prompt batches sorted by prompt length.
    """
    units = [Unit("error", [r], errors=[r.error]) for r in records if r.error]
    units += [Unit("document", [r]) for r in records if not r.error and r.is_document]
    prepared: list[tuple[int, Record, Optional[AnswerJob], Optional[str]]] = []
    for record in records:
        if record.error or record.is_document:
            continue
        try:
            job = prepare_job(record, tokenizer, settings)
            prepared.append((len(job.rendered.ids), record, job, None))
        except (ValueError, TypeError) as err:
            prepared.append((0, record, None, str(err)))
    prepared.sort(key=lambda item: (item[0], item[1].index))
    for begin in range(0, len(prepared), settings.batch_size):
        part = prepared[begin:begin + settings.batch_size]
        units.append(Unit("batch", [p[1] for p in part], [p[2] for p in part],
                           [p[3] for p in part]))
    return units


def check_length(job: AnswerJob, model: nn.Module, max_new_tokens: int) -> None:
    """Refuse a prompt that, with ``max_new_tokens``, exceeds the model's context."""
    n_answer = max_new_tokens if job.generated else len(job.answer_ids)
    check_context(model, len(job.rendered.ids), n_answer, generated=job.generated)


def finish_job(job: AnswerJob, record: Record) -> None:
    """Per-record checks once the answer is known: foils and reported positions."""
    if not job.answer_ids:
        raise ValueError("The model generated no token: nothing to explain.")
    n = len(job.answer_ids)
    if job.foils is not None:
        job.foils = contrast_per_token(job.foils, n)
        same = [t for t in range(n) if job.foils[t] == job.answer_ids[t]]
        if same:
            raise ValueError(f"The contrast equals the answer token at answer positions {same}: "
                             "p(y) - p(foil) is 0 there; choose another foil.")
    if record.positions is not None:
        keep = sorted({t + n if t < 0 else t for t in record.positions})
        if keep[0] < 0 or keep[-1] >= n:
            raise ValueError(f"positions {record.positions} are out of range for an answer of "
                             f"{n} tokens (0..{n - 1}, or negative from the end).")
        job.keep = keep


def batch_groups(items: list[tuple[Record, AnswerJob]],
            recorded: dict[int, tuple[Recording, int]]) -> list[list[tuple[Record, AnswerJob]]]:
    """Sub-batches explained together: plain and contrastive apart, recorded apart.

    Answers of other lengths share a sub-batch: only each row's own answer positions are read
    out (:func:`~captum_iglens.text.batched.explain_recorded`, and for given answers one
    teacher-forced forward, :func:`~captum_iglens.text.batched.explain_batch`).
    """
    groups: dict[tuple[bool, bool], list[tuple[Record, AnswerJob]]] = {}
    for item in items:
        key = (item[1].foils is not None, id(item[1]) in recorded)
        groups.setdefault(key, []).append(item)
    return list(groups.values())
