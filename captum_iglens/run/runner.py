"""Dataset runs: IG-Lens over every record of a file, batched, resumable and sharded.

:func:`run_records` reads what the output already holds and runs only the other records:
prompt records are sorted by length and cut into batches (left-padded generation, then one
teacher-forced IG-Lens forward per batch, :mod:`captum_iglens.text.batched`); text records run
alone in document mode (:mod:`captum_iglens.text.document`). Every result is appended to the
output as soon as its batch is done (:class:`~captum_iglens.run.results_file.ResultsFile`). A
record that cannot run becomes an error record and the run goes on. Launched with several
processes (``accelerate launch`` / ``torchrun``), process ``r`` runs batches ``r, r + w,
...`` into its own part file and rank 0 merges them: every record once, in input order.
"""

from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path
from typing import Any, Optional, Sequence, Union

from torch import nn

from captum_iglens._utils.progress import progress_bar
from captum_iglens.ig_lens import IGLens
from captum_iglens.lens.architectures import strip_parallel
from captum_iglens.lens.layer_readout import lens_key, lens_name
from captum_iglens.results import IGLensResult
from captum_iglens.run.distributed import Processes, processes
from captum_iglens.run.fingerprint import (
    check_resume,
    input_hash,
    record_fields,
    run_fingerprint,
    run_lock,
)
from captum_iglens.run.plan import Unit, batch_groups, check_length, finish_job, plan_units
from captum_iglens.run.records import Record
from captum_iglens.run.results_file import ResultsFile, check_results_file, read_lines
from captum_iglens.run.resume import fingerprint_settings
from captum_iglens.run.settings import RunReport, RunSettings
from captum_iglens.text.batched import AnswerJob, explain_batch, explain_recorded
from captum_iglens.text.document import explain_document
from captum_iglens.text.explain_prompt import (
    annotate_answer,
    foil_ids,
)
from captum_iglens.text.generation import generate_batch
from captum_iglens.text.recorded import Recording, can_record, generate_recording

__all__ = ["run_records"]


def _error_line(record: Record, error: BaseException | str) -> dict[str, Any]:
    message = error if isinstance(error, str) else str(error).strip() or type(error).__name__
    kind = "ValueError" if isinstance(error, str) else type(error).__name__
    line = {"id": record.id, "index": record.index, "status": "error", "error": message,
            "error_type": kind, "prompt": record.prompt if record.text is None else record.text}
    return line | ({"meta": record.meta} if record.meta else {})


def _ok_line(record: Record, result: IGLensResult, seconds: float) -> dict[str, Any]:
    line = {"id": record.id, "index": record.index, "status": "ok", "seconds": seconds,
            **result.to_dict()}
    # the answer's ids: {"prompt": ..., "answer_ids": ...} re-runs this record exactly
    line["answer_ids"] = [int(i) for i in result.input_ids[result.prompt_length:]]
    return line | ({"meta": record.meta} if record.meta else {})


class _Runner:
    """Runs the units of one process and appends their lines."""

    def __init__(self, lens: IGLens, tokenizer: Any, settings: RunSettings,
                 out: ResultsFile) -> None:
        self.lens, self.tokenizer, self.settings, self.out = lens, tokenizer, settings, out
        self.tokens = 0

    def run(self, unit: Unit) -> None:
        start = time.perf_counter()
        if unit.kind == "error":
            self.out.append(_error_line(unit.records[0], unit.errors[0] or "unreadable"))
        elif unit.kind == "document":
            self._document(unit.records[0], start)
        else:
            self._batch(unit, start)

    def _document(self, record: Record, start: float) -> None:
        s = self.settings
        try:
            # a foil given as text is tokenised like a prompt record's
            foils = foil_ids(self.tokenizer, record.contrast)
            result = explain_document(self.lens, self.tokenizer, record.text or "",
                                      record.positions, s.stride, s.chunk, foils,
                                      settings=s.attribution, report=s.report)
        except Exception as err:  # noqa: BLE001 - one bad record must not stop the run
            self.out.append(_error_line(record, err))
            return
        self.tokens += len(result.tokens)
        self.out.append(_ok_line(record, result, time.perf_counter() - start))

    def _usable(self, unit: Unit) -> list[tuple[Record, AnswerJob]]:
        """Checks before generation; failures are written as error records."""
        usable = []
        for record, job, error in zip(unit.records, unit.jobs, unit.errors, strict=True):
            try:
                if error is not None or job is None:
                    raise ValueError(error or "unreadable record")
                check_length(job, self.lens.model, self.settings.max_new_tokens)
                usable.append((record, job))
            except ValueError as err:
                self.out.append(_error_line(record, err))
        return usable

    def _generate(self, items: list[tuple[Record, AnswerJob]]) -> dict[int, tuple[Recording, int]]:
        """Generate the answers; where the baseline allows, record the residuals too.

        Returns ``{id(job): (recording, row)}`` for the recorded jobs.
        """
        todo = [job for _, job in items if job.generated]
        if not todo:
            return {}
        s = self.settings
        prompts = [job.rendered.ids for job in todo]
        baselines = s.attribution.baselines
        recording = None
        # a recording holds block outputs only: sub-layer lenses re-run prompt + answer
        if can_record(baselines, self.lens.model) and self.lens.spec.recordable:
            recording = generate_recording(self.lens, self.tokenizer, prompts,
                                           s.max_new_tokens, baselines)
            answers = recording.answers
        else:
            answers = generate_batch(self.lens.model, self.tokenizer, prompts, s.max_new_tokens)
        for job, answer in zip(todo, answers, strict=True):
            job.answer_ids = answer
        if recording is None:
            return {}
        return {id(job): (recording, row) for row, job in enumerate(todo)}

    def _batch(self, unit: Unit, start: float) -> None:
        items = self._usable(unit)
        if not items:
            return
        try:
            recorded = self._generate(items)
        except Exception as err:  # noqa: BLE001 - find the failing record one at a time
            if len(items) > 1:
                for item in items:
                    self._batch(Unit("batch", [item[0]], [item[1]], [None]), start)
            else:
                self.out.append(_error_line(items[0][0], err))
            return
        # every record of the batch shares its generation; each sub-batch, its own readouts
        generation = (time.perf_counter() - start) / len(items)
        ready = []
        for record, job in items:
            try:
                finish_job(job, record)
                ready.append((record, job))
            except ValueError as err:
                self.out.append(_error_line(record, err))
        for group in batch_groups(ready, recorded):
            self._explain(group, generation, recorded)

    def _explain(self, group: list[tuple[Record, AnswerJob]], generation: float,
                 recorded: dict[int, tuple[Recording, int]]) -> None:
        s, start = self.settings, time.perf_counter()
        jobs = [job for _, job in group]
        try:
            if id(jobs[0]) in recorded:
                recording = recorded[id(jobs[0])][0].rows([recorded[id(j)][1] for j in jobs])
                results = explain_recorded(self.lens, self.tokenizer, recording, jobs,
                                           settings=s.attribution, report=s.report)
            else:
                results = explain_batch(self.lens, self.tokenizer, jobs,
                                        settings=s.attribution, report=s.report)
        except Exception as err:  # noqa: BLE001 - one bad record must not stop the run
            if len(group) > 1:
                for item in group:
                    self._explain([item], generation, recorded)
                return
            self.out.append(_error_line(group[0][0], err))
            return
        share = generation + (time.perf_counter() - start) / len(group)
        for (record, job), result in zip(group, results, strict=True):
            result = annotate_answer(result, self.lens.model, self.tokenizer, job.rendered,
                                     job.generated, s.max_new_tokens)
            self.tokens += len(result.tokens)
            self.out.append(_ok_line(record, result, share))


def _count(path: Path) -> tuple[int, int]:
    lines = read_lines(path)[0]
    errors = sum(1 for line in lines if line.get("status") == "error")
    return len(lines) - errors, errors


def run_records(model: nn.Module, tokenizer: Any, records: Sequence[Record],
                output: Union[str, Path], settings: Optional[RunSettings] = None,
                lens: Optional[IGLens] = None, progress: bool = True,
                procs: Optional[Processes] = None) -> RunReport:
    """Explain every record not yet in ``output``, appending one line per record.

    Args:
        model (nn.Module): A Hugging Face causal LM.
        tokenizer: Its tokenizer.
        records (sequence of Record): From :func:`~captum_iglens.run.records.read_records`.
        output (str or Path): The results file (``.jsonl``); created, or resumed.
        settings (RunSettings, optional): Batch size, generation and attribution settings.
        lens (IGLens, optional): The lens (layers, units). Default: all blocks, probability.
        progress (bool, optional): A progress bar (records, tokens/s, ETA). Default: True.
        procs (Processes, optional): This process's rank and the barrier. Default: from the
            environment (``accelerate launch`` / ``torchrun``), else a single process.

    Returns:
        RunReport: Counts over the merged output (every process) and this process's throughput.

    Raises:
        OSError: the output cannot be written.
        ValueError: ``output`` exists and is not a results file.
        RunMismatchError: ``output`` holds lines of another run (another model, weights,
            package version or numeric setting; see
            :func:`~captum_iglens.run.fingerprint.check_resume`): nothing is run or written.
        RuntimeError: another process is writing ``output``
            (:func:`~captum_iglens.run.fingerprint.run_lock`).

    Every line records the run's fingerprint (``"run"``) and its record's ``input_hash``;
    a record whose id is done but whose input changed since is run again, and its new line
    replaces the old one.
    """
    settings = settings or RunSettings()
    procs = procs or processes()
    lens = lens or IGLens(strip_parallel(model))
    start = time.perf_counter()
    check_results_file(output)
    out = ResultsFile(output, procs.rank, procs.world_size)
    with run_lock(out.path, enabled=procs.is_main):
        pending = _pending(out, lens, records, settings)
        procs.barrier()  # every process has read what was done before any writes
        units = plan_units(pending, tokenizer, settings)[procs.rank::procs.world_size]
        runner = _Runner(lens, tokenizer, settings, out)
        out.open()
        _run_units(units, runner, procs, progress, start)
        out.close()
        procs.barrier()
        if procs.is_main:
            out.finalize({r.id: r.index for r in records})
    # every process counts the merged output (its part file is gone once rank 0 merged it),
    # so all of them exit with the same status
    procs.barrier()
    n_ok, n_errors = _count(out.path)
    return RunReport(Path(output), len(records), len(records) - len(pending), n_ok, n_errors,
                     runner.tokens, time.perf_counter() - start)


def _pending(out: ResultsFile, lens: IGLens, records: Sequence[Record],
             settings: RunSettings) -> list[Record]:
    """The records to run: not in the output yet, or whose input changed since.

    Stamps ``out`` with the run's fingerprint and the records' input hashes, after
    refusing an output that another run wrote (:func:`~captum_iglens.run.fingerprint.check_resume`).
    """
    # the lens decides granularity and effect
    attribution = replace(settings.attribution, granularity=lens.granularity,
                          effect=lens.spec.effect)
    fingerprint = run_fingerprint(
        lens.model, layers=lens.layer_indices, units=lens.units,
        settings=fingerprint_settings(attribution, settings.report, settings.generation,
                                      stride=settings.stride, lens=lens_name(lens.spec.lens),
                                      lens_key=lens_key(lens.spec.lens)))
    lines = out.lines()
    check_resume(lines, fingerprint, out.path)
    if settings.model_source is not None:  # not compared: lets a rerun skip the load
        fingerprint = {**fingerprint, "source": settings.model_source}
    out.stamp = {"run": fingerprint}
    out.input_hashes = {r.id: input_hash(record_fields(r)) for r in records}
    done = {line.get("id"): line.get("input_hash") for line in lines}
    return [r for r in records if done.get(r.id, "") != out.input_hashes[r.id]]


def _run_units(units: list[Unit], runner: _Runner, procs: Processes, progress: bool,
               start: float) -> None:
    total = sum(len(u.records) for u in units)
    desc = f"iglens run [{procs.rank}]" if procs.world_size > 1 else "iglens run"
    with progress_bar(total=total, desc=desc, unit="record", enabled=progress,
                      leave=True) as bar:
        for unit in units:
            runner.run(unit)
            elapsed = time.perf_counter() - start
            bar.update(len(unit.records))
            bar.set_postfix_str(f"{runner.tokens / max(elapsed, 1e-9):.1f} tokens/s")
