"""``iglens benchmark``: which per-layer attribution tracks interventions (pre-registered).

iglens benchmark --out bench/                 # the three required families, all three tasks
iglens benchmark --families smollm2,gemma-3-270m --tasks ioi --max-pairs 100 --out bench/
iglens benchmark --out bench/ --cost          # the cost model's forwards per cell, no run
iglens benchmark --out bench/ --lenses tuned,jacobian   # + the lens addendum's rows (L1, L2)
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from captum_iglens.cli import _options as opts
from captum_iglens.cli._common import UsageError, exit_status_help, load

__all__ = ["DESCRIPTION", "EXIT_STATUS", "HELP", "add_arguments", "run"]

HELP = "score 12 per-layer predictors against 8 interventions on the benchmark's tasks"
DESCRIPTION = (
    "Run the faithfulness benchmark pre-registered in captum_iglens/validate/benchmark/"
    "prereg.json: for every family and task, the task's prompt pairs (IOI, factual recall, "
    "the packaged pairs, or a .jsonl pairs file) are kept where both prompts have as many "
    "tokens and the model's greedy answer is the clean one; each kept pair's clean answer "
    "is ablated block by block (zero, mean, resample), patched in both directions, deleted "
    "and kept top-k jointly and ablated on random block subsets, in probability, "
    "log-probability and logit difference, and the 12 predictors (readout credit, total "
    "effect in position and sequence scope, AtP, AtP*, direct logit attribution, the "
    "logit-lens level, Captum's LayerIntegratedGradients and LayerConductance, last layer "
    "always, the other prompts' mean drop profile, random) are scored by per-token "
    "Spearman rho, deletion/keep areas and infidelity, each with a cluster-bootstrap 95%% "
    "CI and n (a pair and its mirror one cluster); the hypotheses B1-B12 are decided by "
    "the pre-registered rule, re-run with the file's robustness seeds. Writes "
    "OUT/cells/<family>__<task>.json (skipped on a rerun when its fingerprint matches) with "
    "its measurements beside it (.measurements.json.gz), OUT/benchmark.json, "
    "OUT/benchmark.md and OUT/benchmark.png; --reuse-only writes them from the cells "
    "already in OUT and runs none (missing lens rows are computed from them); "
    "--tables-only writes them from the cell and lens files there without loading any "
    "model (a committed run on a machine without its models). With "
    "--lenses, the lens addendum (prereg_lenses.json) adds the readout credit under each "
    "fitted lens, scored against the cell's stored drops, in "
    "OUT/cells/<family>__<task>__lens-<kind>.json, and its hypotheses L1/L2 in a block of "
    "their own."
).replace("%%", "%")
EXIT_STATUS = exit_status_help(
    runtime="runtime error: a model could not be loaded, fewer than 2 pairs of a task are "
    "left for a model, a built-in patching check failed, OUT could not be written, or "
    "--reuse-only / --tables-only found no usable cell (a file left out while others are "
    "used exits 0 and is named at the end of benchmark.md)",
    usage="usage error: something is wrong in the command line (a bad task, model or --out)",
)
TASK_NAMES = ("ioi", "factual", "packaged")


def _split(values: list[str] | None) -> list[str]:
    return [v.strip() for value in values or [] for v in value.split(",") if v.strip()]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the options of ``iglens benchmark``.

    Args:
        parser (ArgumentParser): The command's parser.
    """
    from captum_iglens.validate.benchmark.families import FAMILY_MODELS

    parser.add_argument("--model", "--families", dest="models", action="append",
                        default=None, metavar="MODEL",
                        help="families: model names, folders or .gguf files, or the "
                        f"pre-registration's names ({', '.join(FAMILY_MODELS)}); comma "
                        "separated or repeated (default: the three required families)")
    parser.add_argument("--task", "--tasks", dest="tasks", action="append", default=None,
                        metavar="TASK", help=f"tasks: {', '.join(TASK_NAMES)} or a pairs "
                        ".jsonl file; comma separated or repeated (default: all three)")
    parser.add_argument("--pairs", "--max-pairs", dest="pairs",
                        type=opts.at_least(2, "--max-pairs"), default=None, metavar="N",
                        help="at most N pairs per task after filtering (default: all)")
    parser.add_argument("--out", required=True, metavar="DIR",
                        help="output folder (created, except by --tables-only, which reads "
                        "it; cells already there are reused)")
    parser.add_argument("--n-boot", type=opts.at_least(1, "--n-boot"), default=1000,
                        metavar="N", help="bootstrap resamples of the tables' CIs (default: "
                        "1000; the decisions use the pre-registration's)")
    parser.add_argument("--seed", type=int, default=0,
                        help="first seed of the random predictor, donors, subsets and "
                        "bootstrap; the pre-registration's robustness seeds follow (default: "
                        "0, the pre-registered one)")
    parser.add_argument("--captum-steps", type=opts.at_least(2, "--captum-steps"),
                        default=None, metavar="N",
                        help="integration steps of each Captum layer run (default: 20)")
    parser.add_argument("--cost", action="store_true",
                        help="print the cost model's forwards per cell and exit (loads the "
                        "models and filters the pairs; runs no intervention)")
    parser.add_argument("--reuse-only", action="store_true",
                        help="write the tables from the cells already in OUT whose "
                        "fingerprint matches; a (family, task) without one is named and "
                        "skipped, none is run (cells measured over several sessions or "
                        "machines, then tabulated together); with --lenses, a reused cell's "
                        "missing lens rows are computed from its stored measurements (no "
                        "intervention is re-run) and named")
    parser.add_argument("--tables-only", action="store_true",
                        help="write the tables from the cell and lens files already in OUT "
                        "without loading any model: a file is used when its fingerprint is "
                        "what today's code, settings and pairs give (its weights digest as "
                        "recorded) and its numbers are what its stored measurements give "
                        "when re-analysed (a few seconds a cell); the others are named and "
                        "left out, at the end of benchmark.md too; none is run (a "
                        "committed run, on a machine without its models or fitted lenses)")
    parser.add_argument("--lenses", action="append", default=None, metavar="KINDS",
                        help="lens addendum: also score the readout credit under these fitted "
                        "lenses (tuned, jacobian; comma separated), read from the lens cache "
                        "(`iglens fit-lens --kind K --model M` fits one; a family without "
                        "one reads n/a); default: none")
    parser.add_argument("--no-progress", action="store_true",
                        help="no progress bars on stderr")
    opts.add_check(parser, _check_modes)
    opts.add_check(parser, _check_lenses)
    opts.add_check(parser, _check_tasks)
    opts.add_check(parser, _check_models)


def _check_modes(args: argparse.Namespace) -> None:
    given = [flag for flag, on in (("--cost", args.cost), ("--reuse-only", args.reuse_only),
                                   ("--tables-only", args.tables_only)) if on]
    if len(given) > 1:
        raise UsageError(f"{' and '.join(given)}: give one of them (--cost counts, "
                         "--reuse-only loads the models and checks their weights, "
                         "--tables-only loads none)")
    if Path(args.out).exists() and not Path(args.out).is_dir():
        raise UsageError(f"--out {args.out}: a file, not a folder (give the benchmark's "
                         "output folder)")


def _check_lenses(args: argparse.Namespace) -> None:
    from captum_iglens.validate.benchmark.lens_rows import LENS_KINDS

    args.lenses = _split(args.lenses)
    bad = [k for k in args.lenses if k not in LENS_KINDS]
    if bad:
        raise UsageError(f"--lenses {','.join(bad)}: use {', '.join(LENS_KINDS)} (the logit "
                         "lens is the readout credit's own row)")
    if len(set(args.lenses)) != len(args.lenses):
        raise UsageError("--lenses: a lens kind is named twice")


def _check_tasks(args: argparse.Namespace) -> None:
    from captum_iglens.validate.pairs import load_pairs

    args.tasks = _split(args.tasks) or list(TASK_NAMES)
    args.task_files = {}
    for task in args.tasks:
        if task in TASK_NAMES:
            continue
        try:
            args.task_files[task] = load_pairs(task)
        except (OSError, UnicodeDecodeError, ValueError) as err:
            raise UsageError(f"--tasks {task!r}: not one of {', '.join(TASK_NAMES)} and not a "
                             f"pairs file ({err})") from err
    if len(set(args.tasks)) != len(args.tasks):
        raise UsageError("--tasks: a task is named twice")


def _check_models(args: argparse.Namespace) -> None:
    from captum_iglens.models.registry import is_model_name
    from captum_iglens.validate.benchmark.families import FAMILY_MODELS, required_families

    args.models = _split(args.models) or required_families()
    args.models = [FAMILY_MODELS.get(m, m) for m in args.models]
    if len(set(args.models)) != len(args.models):
        raise UsageError(f"--families {','.join(args.models)}: a family is named twice (a "
                         "pre-registration name and its model name are the same family)")
    for spec in args.models:
        if not is_model_name(spec) and not Path(spec).exists():
            raise UsageError(f"--families {spec!r}: neither a model name nor an existing path")


def run(args: argparse.Namespace) -> int:
    """Run (or resume) every (family, task) cell and write the tables and the figure.

    Returns:
        0

    Raises:
        Exception: loading or computation errors (exit status 1).
    """
    from tqdm.auto import tqdm

    from captum_iglens._utils.progress import progress_enabled
    from captum_iglens.validate.benchmark import cost as bench_cost
    from captum_iglens.validate.benchmark import runner
    from captum_iglens.validate.benchmark.collect import verify_cell
    from captum_iglens.validate.benchmark.families import family_runs_task
    from captum_iglens.validate.benchmark.tasks import task_pairs

    out = Path(args.out)
    if not args.cost and not args.tables_only:  # --cost writes nothing, --tables-only reads
        (out / "cells").mkdir(parents=True, exist_ok=True)
    settings = {"pairs": args.pairs, "n_boot": args.n_boot, "seed": args.seed,
                "captum_steps": args.captum_steps}
    cells, lens_cells, left_out = [], [], []
    shown = progress_enabled() and not args.no_progress
    todo = [(m, t) for m in args.models for t in args.tasks
            if family_runs_task(m, t)]
    if args.tables_only:
        return _tables_only(args, out, todo, settings, shown)
    loaded: dict[str, tuple] = {}
    for spec, task in tqdm(todo, desc="benchmark", unit="cell", disable=not shown):
        if spec not in loaded:
            loaded.clear()  # one model in memory at a time
            loaded[spec] = load(spec)
        model, tokenizer = loaded[spec]
        family, name = _names(args, spec, task)
        pairs = args.task_files.get(task) or task_pairs(task)
        if args.cost:
            print(json.dumps({"family": family, "task": name, **bench_cost.cell_cost(
                model, tokenizer, pairs, args.pairs, args.captum_steps)}))
            continue
        fingerprint = runner.cell_fingerprint(model, family, name, pairs, settings)
        path = runner.cell_path(out, family, name)
        cell = runner.load_cell(path, fingerprint["digest"])
        problem, data = (None, None) if cell is None else verify_cell(
            cell, path, args.n_boot, args.seed, family, name, pairs)
        if problem:
            print(f"{family} / {name}: {path.name}: {problem} (not reused)", file=sys.stderr)
            cell, data = None, None
        if cell is None and args.reuse_only:
            left_out.append(f"{family} / {name}: no cell with this fingerprint and its "
                            f"measurements' numbers in {path.parent} (--reuse-only runs none)")
            print(f"{left_out[-1]} (skipped)", file=sys.stderr)
            continue
        if cell is None:
            cell = runner.run_cell(model.eval(), tokenizer, family, name, pairs, args.pairs,
                                   args.n_boot, args.seed, progress=shown,
                                   captum_steps=args.captum_steps)
            cell["fingerprint"] = fingerprint
            runner.write_cell(path, cell)
        else:
            print(f"{family} / {name}: reused {path}", file=sys.stderr)
        cells.append(cell)
        lens_cells += _lens_cells(args, model.eval(), tokenizer, cell, path, pairs, spec,
                                  shown, data)
    if args.cost:
        return 0
    return _write_found("--reuse-only", out, cells, lens_cells, bool(args.lenses), left_out)


def _write_found(flag: str, out: Path, cells: list, lens_cells: list, lenses: bool,
                 left_out: list) -> int:
    """Write the tables of the cells found, or say why there are none."""
    if not cells:
        raise RuntimeError(f"{flag}: no cell in {out / 'cells'} can be used (each is named "
                           "above with why; a fingerprint holds the families, tasks, "
                           "--max-pairs, --n-boot, --seed and --captum-steps: give those the "
                           "cells ran with)")
    _write(out, cells, lens_cells, lenses, left_out)
    return 0


def _names(args: argparse.Namespace, spec: str, task: str) -> tuple[str, str]:
    """The family and task names of a cell file."""
    family = Path(spec).name if Path(spec).exists() else spec.lower()
    return family, Path(task).stem if task in args.task_files else task


def _tables_only(args: argparse.Namespace, out: Path, todo: list, settings: dict,
                 shown: bool) -> int:
    """--tables-only: the tables from the files in OUT, no model loaded."""
    from captum_iglens.validate.benchmark.collect import read_cells
    from captum_iglens.validate.benchmark.tasks import task_pairs

    if not (out / "cells").is_dir():
        raise RuntimeError(f"--tables-only: no folder {out / 'cells'} (copy a run's cells/ "
                           "into OUT first; --tables-only reads, it runs nothing)")
    wanted = [(*_names(args, spec, task), args.task_files.get(task) or task_pairs(task))
              for spec, task in todo]
    cells, lens_cells, used, left_out = read_cells(out, wanted, settings, args.lenses,
                                                   progress=shown)
    for line in used:
        print(line, file=sys.stderr)
    for line in left_out:
        print(f"{line} (left out)", file=sys.stderr)
    return _write_found("--tables-only", out, cells, lens_cells, bool(args.lenses),
                        left_out)


def _lens_cells(args: argparse.Namespace, model: object, tokenizer: object, cell: dict,
                path: Path, pairs: list, spec: str, shown: bool,
                data: dict | None) -> list[dict]:
    """The lens addendum's files of one cell, one per ``--lenses`` kind.

    ``data`` is the cell's measurements when already read (a reused cell), to check reused
    lens files against; None reads them when needed.
    """
    from captum_iglens.validate.benchmark import lens_rows
    from captum_iglens.validate.benchmark.collect import verify_lens_cell

    found_all = []
    for kind in args.lenses:
        found, reused = lens_rows.run_lens_cell(model, tokenizer, cell, path, pairs, kind,
                                                spec, Path(args.out), args.n_boot,
                                                progress=shown)
        where = f"{cell['family']} / {cell['task']} / {kind} lens"
        if reused:
            data = data if data is not None else lens_rows.read_measurements(path)
            problem = verify_lens_cell(found, cell, data, kind, args.n_boot)
            if problem:
                print(f"{where}: {problem} (left out; delete the file to recompute it)",
                      file=sys.stderr)
                continue
            print(f"{where}: reused", file=sys.stderr)
        elif found["status"] != "ok":
            print(f"{where}: {found['message']}", file=sys.stderr)
        else:  # said even under --reuse-only: it computes (no intervention is re-run)
            print(f"{where}: computed from the cell's stored measurements", file=sys.stderr)
        found_all.append(found)
    return found_all


def _write(out: Path, cells: list, lens_cells: list, lenses: bool,
           left_out: list) -> None:
    """OUT/benchmark.json, .md and .png.

    The lens addendum's block when ``lenses``; the files left out, when any, named at the end
    of the Markdown and in the JSON.
    """
    from captum_iglens.validate.benchmark import tables as bench_tables

    tables = bench_tables.markdown_tables(cells)
    saved: dict = {"cells": cells}
    if lenses:  # the addendum's block, apart from the pre-registration's tables
        tables["lenses"] = bench_tables.lens_tables(cells, lens_cells)
        saved["lens_addendum"] = bench_tables.lens_json(lens_cells)
    if left_out:  # a partial table says so in the file, not only on stderr
        tables["left out"] = "## Left out of these tables\n\n" + "\n".join(
            f"- {line}" for line in left_out)
        saved["left_out"] = list(left_out)
    (out / "benchmark.json").write_text(json.dumps(saved, indent=1), encoding="utf-8")
    (out / "benchmark.md").write_text("\n\n".join(tables.values()) + "\n", encoding="utf-8")
    bench_tables.figure(cells, out / "benchmark.png", lens_cells)
    print(tables["patch"])
    print(tables["hypotheses"])
    if lenses:
        print(tables["lenses"])
    print(f"wrote {out / 'benchmark.json'}, {out / 'benchmark.md'} and "
          f"{out / 'benchmark.png'}", file=sys.stderr)
