"""``iglens benchmark``: which per-layer attribution tracks interventions (pre-registered).

iglens benchmark --out bench/                                   # SmolLM2, all three tasks
iglens benchmark --model smollm2 --model gemma-3-270m --task ioi --pairs 100 --out bench/
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from captum_iglens.cli import _options as opts
from captum_iglens.cli._common import UsageError, exit_status_help, load

__all__ = ["DESCRIPTION", "EXIT_STATUS", "HELP", "add_arguments", "run"]

HELP = "score per-layer predictors against patching on the benchmark's tasks (resumable)"
DESCRIPTION = (
    "Run the faithfulness benchmark pre-registered in captum_iglens/validate/benchmark/"
    "prereg.json: for every --model and --task, the task's prompt pairs (IOI, factual "
    "recall, the packaged pairs, or a .jsonl pairs file) are kept where both prompts have "
    "as many tokens and the model's greedy answer is the clean one, patched block by block "
    "in both directions, and each predictor (readout credit, logit-lens level, direct logit "
    "attribution, last layer always, the other pairs' mean profile, random; the others of "
    "the pre-registration are listed as not scored yet) is scored by its per-pair Spearman "
    "rho with the drops (block 1 left out), with a cluster-bootstrap 95%% CI (a pair and its "
    "mirror one cluster). Writes OUT/cells/<family>__<task>.json (skipped on a rerun when "
    "its fingerprint matches), OUT/benchmark.json and OUT/benchmark.md."
).replace("%%", "%")
EXIT_STATUS = exit_status_help(
    runtime="runtime error: a model could not be loaded, fewer than 2 pairs of a task are "
    "left for a model, a built-in patching check failed, or OUT could not be written",
    usage="usage error: something is wrong in the command line (a bad task, model or --out)",
)
TASK_NAMES = ("ioi", "factual", "packaged")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the options of ``iglens benchmark``.

    Args:
        parser (ArgumentParser): The command's parser.
    """
    parser.add_argument("--model", dest="models", action="append", default=None,
                        metavar="MODEL", help="a family: a model name, folder or .gguf "
                        "file; repeat for several (default: smollm2)")
    parser.add_argument("--task", dest="tasks", action="append", default=None,
                        metavar="TASK", help=f"one of {', '.join(TASK_NAMES)} or a pairs "
                        ".jsonl file; repeat for several (default: all three)")
    parser.add_argument("--pairs", type=opts.at_least(2, "--pairs"), default=None,
                        metavar="N", help="at most N pairs per task after filtering "
                        "(default: all)")
    parser.add_argument("--out", required=True, metavar="DIR",
                        help="output folder (created; cells already there are reused)")
    parser.add_argument("--n-boot", type=opts.at_least(1, "--n-boot"), default=1000,
                        metavar="N", help="bootstrap resamples of the table's CIs "
                        "(default: 1000)")
    parser.add_argument("--seed", type=int, default=0,
                        help="seed of the random predictor and the bootstrap (default: 0)")
    parser.add_argument("--no-progress", action="store_true",
                        help="no progress bars on stderr")
    opts.add_check(parser, _check_tasks)
    opts.add_check(parser, _check_models)


def _check_tasks(args: argparse.Namespace) -> None:
    from captum_iglens.validate.pairs import load_pairs

    args.tasks = args.tasks or list(TASK_NAMES)
    args.task_files = {}
    for task in args.tasks:
        if task in TASK_NAMES:
            continue
        try:
            args.task_files[task] = load_pairs(task)
        except (OSError, UnicodeDecodeError, ValueError) as err:
            raise UsageError(f"--task {task!r}: not one of {', '.join(TASK_NAMES)} and not a "
                             f"pairs file ({err})") from err
    if len(set(args.tasks)) != len(args.tasks):
        raise UsageError("--task: a task is named twice")


def _check_models(args: argparse.Namespace) -> None:
    from captum_iglens.models.registry import is_model_name

    args.models = args.models or [opts.DEFAULT_MODEL]
    for spec in args.models:
        if not is_model_name(spec) and not Path(spec).exists():
            raise UsageError(f"--model {spec!r}: neither a model name nor an existing path")


def run(args: argparse.Namespace) -> int:
    """Run (or resume) every (family, task) cell and write the tables.

    Returns:
        0

    Raises:
        Exception: loading or computation errors (exit status 1).
    """
    from tqdm.auto import tqdm

    from captum_iglens._utils.progress import progress_enabled
    from captum_iglens.validate.benchmark import runner
    from captum_iglens.validate.benchmark.tasks import task_pairs

    out = Path(args.out)
    (out / "cells").mkdir(parents=True, exist_ok=True)
    settings = {"pairs": args.pairs, "n_boot": args.n_boot, "seed": args.seed}
    cells = []
    shown = progress_enabled()
    todo = [(m, t) for m in args.models for t in args.tasks]
    loaded: dict[str, tuple] = {}
    for spec, task in tqdm(todo, desc="benchmark", unit="cell", disable=not shown):
        if spec not in loaded:
            loaded.clear()  # one model in memory at a time
            loaded[spec] = load(spec)
        model, tokenizer = loaded[spec]
        family = Path(spec).name if Path(spec).exists() else spec.lower()
        name = Path(task).stem if task in args.task_files else task
        pairs = args.task_files.get(task) or task_pairs(task)
        fingerprint = runner.cell_fingerprint(model, family, name, pairs, settings)
        path = runner.cell_path(out, family, name)
        cell = runner.load_cell(path, fingerprint["digest"])
        if cell is None:
            cell = runner.run_cell(model.eval(), tokenizer, family, name, pairs, args.pairs,
                                   args.n_boot, args.seed, progress=shown)
            cell["fingerprint"] = fingerprint
            path.write_text(json.dumps(cell, indent=1, allow_nan=True), encoding="utf-8")
        else:
            print(f"{family} / {name}: reused {path}", file=sys.stderr)
        cells.append(cell)
    tables = {view: runner.markdown_table(cells, view) for view in runner.PATCH_VIEWS}
    tables["hypotheses"] = runner.hypotheses_table(cells)
    (out / "benchmark.json").write_text(json.dumps({"cells": cells}, indent=1),
                                        encoding="utf-8")
    (out / "benchmark.md").write_text("\n\n".join(tables.values()) + "\n", encoding="utf-8")
    print(tables["patch"])
    print(f"wrote {out / 'benchmark.json'} and {out / 'benchmark.md'}", file=sys.stderr)
    return 0
