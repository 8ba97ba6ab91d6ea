"""Many prompts at once: IG-Lens over a left-padded batch, teacher-forced or recorded.

A row of a batch gives the result of the same prompt run alone (to float32 rounding): the
attention mask hides the padding, ``position_ids`` restart at each row's first real token,
and the mean baseline averages each row's own real positions. :func:`explain_batch` runs one
teacher-forced forward over given answers; :func:`explain_recorded` reads out the residuals
that generation itself recorded (:mod:`captum_iglens.text.recorded`), with no second forward.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional, Sequence

import torch

from captum_iglens._core.entry import Forward, Recorded, attribute
from captum_iglens.ig_lens import IGLens
from captum_iglens.lens.readout import ModelDistribution
from captum_iglens.lens.state import input_device
from captum_iglens.results import IGLensOutput, IGLensResult
from captum_iglens.settings import (
    DEFAULT_ONSET_FRAC,
    DEFAULT_ONSET_RULE,
    AttributionSettings,
    ReportSettings,
    report_settings,
)
from captum_iglens.text.generation import left_pad, pad_id
from captum_iglens.text.packaging import AnswerSpec, result_from_output
from captum_iglens.text.prompts import RenderedPrompt
from captum_iglens.text.recorded import Recording

__all__ = ["AnswerJob", "explain_batch", "explain_recorded"]


@dataclass
class AnswerJob:
    """One prompt of a batch: its rendered ids, the answer to explain and its foils.

    Attributes:
        prompt (str): The user's prompt (recorded in the result).
        rendered (RenderedPrompt): Its text and ids (chat template applied or not).
        answer_ids (list[int]): The answer's ids (generated or given); empty until generated.
        foils (list[int], optional): One foil id per answer token for a contrastive run.
        keep (list[int], optional): Indices of the answer tokens to report (default: all).
        generated (bool): The answer was generated greedily.
    """

    prompt: str
    rendered: RenderedPrompt
    answer_ids: list[int] = field(default_factory=list)
    foils: Optional[list[int]] = None
    keep: Optional[list[int]] = None
    generated: bool = False


def _targets(ids: torch.Tensor, jobs: Sequence[AnswerJob], n_cols: int,
             vocab: int) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
    """``[B, n_cols]`` targets (and foils) at the last ``n_cols`` positions of each row.

    Row ``r``'s answer fills its last ``T_r`` columns; earlier columns (prompt tokens of
    that row) get the actual next token, and a foil different from it, and are dropped.
    """
    # Column c's next token is column c + 1's input; the last column has none (every row's
    # answer covers it). Taken from the whole row, so that n_cols = 1 gives one column too.
    following = torch.cat([ids[:, 1:], ids[:, -1:]], dim=1)
    targets = following[:, ids.shape[1] - n_cols:].clone()
    foils = (targets + 1) % vocab if jobs[0].foils is not None else None
    for r, job in enumerate(jobs):
        n = len(job.answer_ids)
        targets[r, n_cols - n:] = torch.tensor(job.answer_ids)
        if foils is not None:
            foils[r, n_cols - n:] = torch.tensor(job.foils)
    return targets, foils


def explain_batch(lens: IGLens, tokenizer: Any, jobs: Sequence[AnswerJob],
                  onset_frac: float = DEFAULT_ONSET_FRAC,
                  onset_rule: str = DEFAULT_ONSET_RULE, top_k: int = 0, *,
                  settings: Optional[AttributionSettings] = None,
                  report: Optional[ReportSettings] = None) -> list[IGLensResult]:
    """IG-Lens over every answer token of ``B`` prompts, in one left-padded forward.

    Each row is ``prompt + answer[:-1]``, left-padded to the longest; answers end at the
    same column, so the explained positions are the last ``max_r T_r`` columns, shared by
    every row. Only each row's own answer positions (those it reports) are read out
    (``attribute_details(..., explained=...)``): a shorter answer costs no readout of the
    columns before it.

    Args:
        lens (IGLens): The lens (its model, layers and units).
        tokenizer: Decodes the tokens of the results.
        jobs (sequence of AnswerJob): ``B`` prompts with their answers; all or none with
            ``foils``.
        onset_frac (float, optional): Fraction of the onset rule. Default: 0.5.
        onset_rule (str, optional): ``"sustained"`` (default) or ``"mass"``.
        top_k (int, optional): Logit-lens top tokens to record per layer. Default: 0.
        settings (AttributionSettings, optional): Keyword-only: ``baselines``, ``method``,
            ``n_steps``, ``internal_batch_size``. Default: the defaults.
        report (ReportSettings, optional): Keyword-only: ``onset_frac``, ``onset_rule`` and
            ``top_k`` in one object (:class:`~captum_iglens.settings.ReportSettings`),
            instead of those arguments (given both, ``ValueError``).

    Returns:
        list[IGLensResult]: One per job, equal to :func:`~captum_iglens.text.explain_ids` on
        that job alone up to float32 rounding.

    Raises:
        ValueError: a job without answer, a mix of contrastive and plain jobs; and as
            :meth:`~captum_iglens.IGLens.attribute`.
    """
    _check_jobs(jobs)
    rows = [job.rendered.ids + job.answer_ids[:-1] for job in jobs]
    n_cols = max(len(job.answer_ids) for job in jobs)
    explained = torch.zeros(len(jobs), n_cols, dtype=torch.bool)
    for r, job in enumerate(jobs):
        explained[r, _columns(job, n_cols)] = True
    model = lens.model
    ids, mask = left_pad(rows, pad_id(tokenizer), input_device(model))
    targets, foils = _targets(ids, jobs, n_cols, lens.spec.vocab_size or 1)
    positions = list(range(ids.shape[1] - n_cols, ids.shape[1]))
    source = Forward(ids, target=targets, positions=positions, additional_forward_args=(mask,),
                     contrast=foils, explained=explained)
    shown = report_settings(report, onset_frac=onset_frac, onset_rule=onset_rule, top_k=top_k)
    out, _ = attribute(lens.spec, source, settings=settings or AttributionSettings(),
                       top_k=shown.top_k)
    return [_row_result(out, r, job, n_cols, tokenizer, lens, shown)
            for r, job in enumerate(jobs)]


def _check_jobs(jobs: Sequence[AnswerJob]) -> None:
    """Refuse an empty batch, a job without answer, or contrastive and plain jobs mixed."""
    if not jobs or any(not job.answer_ids for job in jobs):
        raise ValueError("Every job of a batch needs a non-empty answer.")
    if len({job.foils is None for job in jobs}) > 1:
        raise ValueError("A batch mixes contrastive and plain jobs: batch them separately.")


def _padded(rows: Sequence[Sequence[int]], width: int) -> torch.Tensor:
    """``[B, width]`` ids, each row continued with its own last id (never read out)."""
    return torch.tensor([list(r) + [r[-1]] * (width - len(r)) for r in rows], dtype=torch.long)



def explain_recorded(lens: IGLens, tokenizer: Any, recording: Recording,
                     jobs: Sequence[AnswerJob], onset_frac: float = DEFAULT_ONSET_FRAC,
                     onset_rule: str = DEFAULT_ONSET_RULE, top_k: int = 0, *,
                     settings: Optional[AttributionSettings] = None,
                     report: Optional[ReportSettings] = None) -> list[IGLensResult]:
    """IG-Lens over the generated answers of ``recording``: readouts only, no forward.

    Row ``r`` of the recording is ``jobs[r]``; answer token ``t`` is explained at the
    recording's column ``S_p - 1 + t`` with the residuals of the pass that generated it.

    Args:
        lens (IGLens): The lens the recording was made with.
        tokenizer: Decodes the tokens of the results.
        recording (Recording): From :func:`~captum_iglens.text.recorded.generate_recording`.
        jobs (sequence of AnswerJob): One per row, ``answer_ids`` the recording's answers;
            all or none with ``foils`` (one per answer token).
        onset_frac (float, optional): Fraction of the onset rule. Default: 0.5.
        onset_rule (str, optional): ``"sustained"`` (default) or ``"mass"``.
        top_k (int, optional): Logit-lens top tokens to record per layer. Default: 0.
        settings (AttributionSettings, optional): Keyword-only: ``baselines`` (the
            recording's), ``method``, ``n_steps``, ``internal_batch_size``. Default: the
            defaults.
        report (ReportSettings, optional): Keyword-only: ``onset_frac``, ``onset_rule`` and
            ``top_k`` in one object (:class:`~captum_iglens.settings.ReportSettings`),
            instead of those arguments (given both, ``ValueError``).

    Returns:
        list[IGLensResult]: One per job, equal to :func:`~captum_iglens.text.explain_ids`
        on that job alone up to the rounding of the model's dtype (a KV-cached forward
        against a whole one: about 1e-6 of the credits in float32, 1e-2 in bfloat16).

    Raises:
        ValueError: jobs that are not the recording's rows, a mix of contrastive and plain
            jobs, an unknown estimator, a bad ``top_k``, a sub-layer lens; and as
            :meth:`~captum_iglens.IGLens.attribute`.
    """
    if not lens.spec.recordable:
        raise ValueError("A recording holds the block outputs only: explain a "
                         "granularity='sublayer' lens with explain_ids (one teacher-forced "
                         "forward), not from a recording.")
    if [job.answer_ids for job in jobs] != recording.answers:
        raise ValueError("The jobs' answers are not the recording's: one job per row.")
    _check_jobs(jobs)
    if any(job.foils is not None and len(job.foils) != len(job.answer_ids) for job in jobs):
        raise ValueError("Give one foil per answer token (contrast_per_token).")
    n_cols = recording.logits.shape[1]
    explained = torch.zeros(len(jobs), n_cols, dtype=torch.bool)
    for r, job in enumerate(jobs):
        explained[r, _kept(job)] = True
    foils = jobs[0].foils is not None
    source = Recorded(
        recording.states, ModelDistribution.from_logits(recording.logits),
        recording.positions, _padded(recording.answers, n_cols), recording.mask.shape[1],
        contrast=_padded([job.foils or [] for job in jobs], n_cols) if foils else None,
        mask=recording.mask, explained=explained)
    shown = report_settings(report, onset_frac=onset_frac, onset_rule=onset_rule, top_k=top_k)
    out, _ = attribute(lens.spec, source, settings=settings or AttributionSettings(),
                       top_k=shown.top_k)
    return [_row_result(out, r, job, len(job.answer_ids), tokenizer, lens, shown)
            for r, job in enumerate(jobs)]


def _kept(job: AnswerJob) -> list[int]:
    """The answer-token indices the job reports."""
    return job.keep if job.keep is not None else list(range(len(job.answer_ids)))


def _columns(job: AnswerJob, n_cols: int) -> list[int]:
    """The explained columns (of the last ``n_cols``) of the job's reported tokens."""
    return [n_cols - len(job.answer_ids) + t for t in _kept(job)]


def _row_result(out: IGLensOutput, row: int, job: AnswerJob, n_cols: int, tokenizer: Any,
                lens: IGLens, report: ReportSettings) -> IGLensResult:
    n_prompt, answer = len(job.rendered.ids), job.answer_ids
    keep = _kept(job)
    spec = AnswerSpec(
        prompt=job.prompt, input_ids=job.rendered.ids + answer, prompt_length=n_prompt,
        token_ids=[answer[t] for t in keep], positions=[n_prompt - 1 + t for t in keep],
        onset_frac=report.onset_frac, onset_rule=report.onset_rule,
        model_name=lens.spec.display_name)
    return result_from_output(out, row, _columns(job, n_cols), spec, tokenizer)
