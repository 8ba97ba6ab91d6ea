"""``iglens run``: IG-Lens over a dataset, batched, resumable, one JSON line per record.

Examples::

    iglens run --input data.jsonl --output results.jsonl
    iglens run --input prompts.txt --output results.jsonl --batch-size 16
    iglens run --text-file essay.txt --output essay.jsonl --stride 4
    accelerate launch --num_processes 2 -m captum_iglens run --input data.jsonl --output r.jsonl
    torchrun --nproc_per_node 2 -m captum_iglens run --input data.jsonl --output r.jsonl
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any, Optional

from captum_iglens.cli import _layer_options as layer_opts
from captum_iglens.cli import _options as opts
from captum_iglens.cli._common import UsageError, exit_status_help, load
from captum_iglens.run.results_file import (
    OutputLockedError,
    ResultsWriteError,
    RunMismatchError,
    check_results_file,
)

__all__ = ["DESCRIPTION", "EXIT_STATUS", "HELP", "add_arguments", "run"]

HELP = "explain every record of a .jsonl or text file into a results .jsonl (resumable)"
DESCRIPTION = (
    "IG-Lens over a dataset: one result line per input record, in the schema of "
    "`iglens --json` plus the record's id. Prompt records are batched (left-padded generation "
    "and attribution); text records are explained at every position (document mode). "
    "Re-running the same command skips the ids already in the output. Under `accelerate "
    "launch` or `torchrun`, the records are sharded across processes and merged in input order."
)
EXIT_STATUS = exit_status_help(
    success="done, every record explained; under a launcher also when some records became "
    "error records (a launcher would take 1 for a crash; the summary line counts them)",
    runtime="some records became error records (one process), the model could not be loaded, "
    "or the results could not be written (the message names the file and the fix; rerun the "
    "same command to resume)",
    usage="usage error: something is wrong in the command line (an input, an --output that "
    "cannot be written, is no results file, holds another run's settings or is being written "
    "by another process); found before the model is loaded, except --layers / --k beyond the "
    "blocks of a .gguf file's model, an output written by another model's weights and a "
    "lock that another run took while this one loaded its model",
    interrupted="interrupted (Ctrl-C); the records already written are kept: re-run the same "
    "command to resume",
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the options of ``iglens run``.

    Args:
        parser (ArgumentParser): The command's parser.
    """
    parser.add_argument("--input", default=None, metavar="PATH",
                        help="records: a .jsonl file (id, prompt or text; optional answer, "
                        "target, contrast, positions) or a text file, one prompt per line")
    parser.add_argument("--text-file", default=None, metavar="PATH",
                        help="document mode: explain every next-token prediction of this "
                        "text file (one record, its id the file name)")
    parser.add_argument("--output", required=True, metavar="PATH",
                        help="results, one JSON object per line (.jsonl); resumed if it exists")
    parser.add_argument("--batch-size", type=opts.at_least(1, "--batch-size"), default=8,
                        help="prompts per batch (default: 8)")
    parser.add_argument("--stride", type=opts.at_least(1, "--stride"), default=1,
                        help="document mode: explain every n-th position (default: 1, all)")
    parser.add_argument("--chunk", type=opts.at_least(1, "--chunk"), default=None,
                        help="document mode: positions per forward pass (default: 512)")
    parser.add_argument("--device", default=None,
                        help="run on this device, e.g. cuda or cuda:1 (default: the model's; "
                        "under accelerate/torchrun, each process's own)")
    parser.add_argument("--device-map", default=None, metavar="MAP",
                        help="load a model folder with this accelerate device map, e.g. auto "
                        "(one large model across the GPUs of one process)")
    opts.add_model_options(parser)
    layer_opts.add_layer_options(parser)
    layer_opts.add_granularity_options(parser, heads=False)
    opts.add_estimator_options(parser)
    opts.add_effect_option(parser)
    opts.add_lens_option(parser)
    opts.add_result_options(parser)
    opts.add_generation_options(parser)
    opts.add_check(parser, _check_files)


def _check_files(args: argparse.Namespace) -> None:
    sources = [s for s in (args.input, args.text_file) if s]
    if len(sources) != 1:
        raise UsageError("give --input or --text-file (one of them)")
    if not Path(sources[0]).is_file():
        raise UsageError(f"{sources[0]!r} is not a file")
    _check_output(args.output, sources[0])
    if args.text_file and not Path(args.text_file).read_bytes().strip():
        raise UsageError(f"--text-file {args.text_file!r} is empty: give a text to explain")
    if args.device and args.device.startswith("cuda") and not _cuda():
        raise UsageError(f"--device {args.device}: this torch build sees no CUDA device")


def _check_output(output: str, source: str) -> None:
    """Refuse an ``--output`` that cannot be written, or holds something else, before loading.

    The folder must take new files too: a run with several processes writes part files
    next to the output and merges them through a temporary file there.

    Raises:
        UsageError: a folder, a path in a missing folder or under a file, a folder or file
            that cannot be written, the input file, or a file that is not a results file.
    """
    out, where = Path(output), f"--output {output!r}"
    if out.is_dir():
        raise UsageError(f"{where} is a folder: give a file path (e.g. results.jsonl)")
    folder = out.parent
    if folder.exists() and not folder.is_dir():
        raise UsageError(f"{where}: {str(folder)!r} is a file, not a folder: give a path in a "
                         "folder")
    if not folder.is_dir():
        raise UsageError(f"{where}: the folder {str(folder)!r} does not exist: create it or "
                         "choose --output elsewhere")
    if not os.access(folder, os.W_OK | os.X_OK) or (out.exists()
                                                    and not os.access(out, os.W_OK)):
        raise UsageError(f"{where} cannot be written (permission denied or a read-only disk): "
                         "choose --output in a writable folder")
    if out.exists() and out.resolve() == Path(source).resolve():
        raise UsageError("--output is the input file: give another path")
    try:
        check_results_file(out)
    except ValueError as err:
        raise UsageError(f"--output: {err}") from err
    except OSError as err:
        raise UsageError(f"{where} cannot be read to resume it: {err.strerror or err}") from err


def _cuda() -> bool:
    import torch

    return torch.cuda.is_available()


def _records(args: argparse.Namespace) -> list[Any]:
    from captum_iglens.run.records import Record, read_document, read_records

    if args.text_file:
        try:
            text, notes = read_document(args.text_file)
        except (OSError, UnicodeDecodeError) as err:
            raise UsageError(f"cannot read --text-file {args.text_file!r}: {err}") from err
        if notes:
            print(f"iglens: warning: --text-file {args.text_file!r}: {'; '.join(notes)} "
                  "(recorded in the result's meta)", file=sys.stderr)
        records = [Record(0, Path(args.text_file).name, text=text,
                          meta={"normalised": notes} if notes else {},
                          error=None if text.strip() else "the text file is empty")]
    else:
        try:
            records = read_records(args.input)
        except (OSError, UnicodeDecodeError, ValueError) as err:
            raise UsageError(f"--input {args.input!r}: {err}") from err
    if args.contrast is not None:
        for record in records:
            record.contrast = record.contrast if record.contrast is not None else args.contrast
    return records


def _settings_map(args: argparse.Namespace) -> dict[str, Any]:
    from captum_iglens.run.resume import fingerprint_settings

    return fingerprint_settings(opts.attribution_settings(args), opts.report_settings(args),
                                opts.generation_settings(args), stride=args.stride,
                                lens=args.lens)


def _done_lines(output: Path) -> list[dict[str, Any]]:
    from captum_iglens.run.results_file import ResultsFile, read_lines

    files = [output, *ResultsFile(output).parts()]
    return [line for file in files for line in read_lines(file, warn=False)[0]]


def _before_loading(args: argparse.Namespace, records: list[Any]) -> Optional[int]:
    """What the command line and the files decide, checked before the model is loaded.

    Returns:
        The exit status when nothing is left to do (every record done by these settings and
        the same model files), else None.

    Raises:
        UsageError: another process holds the output's lock, --layers / --k beyond the
            blocks of a model whose block count its name or config.json gives, or an output
            written with other settings.
    """
    from captum_iglens.models.facts import block_count
    from captum_iglens.run import resume

    output, launched = Path(args.output), int(os.environ.get("WORLD_SIZE", "1")) > 1
    lock = None if launched else resume.lock_holder(output)
    if lock is not None:
        raise UsageError(f"another process is writing --output {args.output!r} (it holds "
                         f"{lock}): wait for it to finish, or write to another --output")
    n_blocks = block_count(args.model)
    layers = None
    if n_blocks is not None:
        layers = layer_opts.hidden_state_indices(layer_opts.resolve_layers(args, n_blocks),
                                                 n_blocks)
    planned = resume.planned_entries(_settings_map(args), args.units, layers)
    lines = _done_lines(output)
    problem = resume.resume_mismatch(lines, planned, output)
    if problem:
        raise UsageError(problem)
    hashes = {r.id: resume.input_hash(resume.record_fields(r)) for r in records}
    if launched or not resume.nothing_left(lines, hashes, planned, args.model_source):
        return None
    errors = sum(1 for line in lines if line.get("status") == "error")
    print(f"iglens run: nothing left to do: the {len(records)} records are all in "
          f"{args.output} ({len(records) - errors} results, {errors} errors), written with "
          "these settings from the same model files; the model was not loaded (delete the "
          "file, or write to another --output, to run them again)", file=sys.stderr)
    return 1 if errors else 0


def _place(model: Any, args: argparse.Namespace, procs: Any) -> Any:
    """Move the model to ``--device``, or to this process's device in a launched run."""
    if args.device_map:
        return model
    if args.device:
        return model.to(args.device)
    if procs.world_size > 1 and procs.device.type != "cpu":
        return model.to(procs.device)
    return model


def run(args: argparse.Namespace) -> int:
    """Run every record not yet in ``--output``; rank 0 prints the summary line.

    Args:
        args (Namespace): Arguments parsed and checked by the router.

    Returns:
        0, or 1 when some records ended as error records in a single-process run.

    Raises:
        UsageError: unreadable input, duplicate ids, layers beyond the model's blocks.
        RuntimeError: the results cannot be written; one line naming the file and the fix
            (exit status 1).
        Exception: loading errors (exit status 1).
    """
    from captum_iglens.models.facts import source_id

    records = _records(args)
    args.model_source = source_id(args.model)
    status = _before_loading(args, records)  # torch is not imported yet: this takes ~1 s
    if status is not None:
        return status
    from captum_iglens import IGLens, resolve_decoder_blocks
    from captum_iglens.run.distributed import processes
    from captum_iglens.run.runner import run_records
    from captum_iglens.run.settings import RunSettings
    from captum_iglens.settings import DEFAULT_CHUNK

    procs = processes()
    model, tokenizer = load(args.model, device_map=args.device_map)
    model = _place(model, args, procs)
    blocks = resolve_decoder_blocks(model)  # located once: the lens takes them
    layers = layer_opts.resolve_layers(args, len(blocks))
    if procs.is_main:
        opts.warn_unused_template_date(args, tokenizer)
    lens = IGLens(model, layers=layers, decoder_blocks=blocks, units=args.units,
                  granularity=args.granularity, effect=args.effect, lens=args.lens)
    settings = RunSettings(
        batch_size=args.batch_size, max_new_tokens=args.max_new_tokens,
        chat_template=not args.no_chat_template, template_kwargs=opts.template_kwargs(args),
        onset_frac=args.onset_frac, onset_rule=args.onset_rule, top_k=args.top_k,
        stride=args.stride, chunk=args.chunk or DEFAULT_CHUNK,
        attribution=opts.attribution_settings(args),
        model_source=args.model_source)
    try:
        report = run_records(model, tokenizer, records, args.output, settings, lens,
                             progress=not args.no_progress, procs=procs)
    except ResultsWriteError as err:
        raise RuntimeError(err.message("choose --output elsewhere")) from err
    except (RunMismatchError, OutputLockedError) as err:
        # another model's weights, or a run that took the lock while this one loaded its model:
        # known only after the load, and still a usage error (exit 2)
        raise UsageError(str(err)) from err
    if procs.is_main:
        print(report.format(), file=sys.stderr)
    # Launchers (torchrun, accelerate) read a non-zero status as a crashed worker.
    return 1 if report.n_errors and procs.world_size == 1 else 0
