"""``iglens summarize``: pool a results file of ``iglens run`` into one report.

Examples::

    iglens summarize results.jsonl
    iglens summarize results.jsonl --json summary.json --plot summary.png
    iglens summarize results.jsonl --html report.html --html-max-records 50
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from captum_iglens.cli import _options as opts
from captum_iglens.cli._common import UsageError, exit_status_help, write_json

__all__ = ["DESCRIPTION", "EXIT_STATUS", "HELP", "add_arguments", "run"]

HELP = "summarize a results .jsonl of 'iglens run': per-layer credit, onsets, failures"
DESCRIPTION = (
    "Read the JSON lines written by 'iglens run' (a torn last line is skipped with a "
    "warning) and report, over every explained token: the mean IG-Lens credit per layer "
    "with a bootstrap confidence interval that resamples records (the tokens of one answer "
    "are not independent), the distribution of onset layers, the completeness over the "
    "run, the slowest records and every failure. Records must share their layers, units "
    "and contrastive mode. Loads no model."
)
EXIT_STATUS = exit_status_help(
    runtime="runtime error: the records cannot be pooled (other layers, units or contrastive "
    "mode), a later line is JSON but no result, or RESULTS cannot be read or an output "
    "written",
    usage="usage error: something is wrong in the command line: a bad option or output path, "
    "or RESULTS missing, unreadable or not a results file of 'iglens run'",
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the options of ``iglens summarize``.

    Args:
        parser (ArgumentParser): The command's parser.
    """
    from captum_iglens.settings import DEFAULT_MAX_RECORDS

    parser.add_argument("results", metavar="RESULTS",
                        help="the results file of 'iglens run' (.jsonl, one JSON object per "
                        "line)")
    opts.add_output_options(parser, json_help="write the summary as JSON to this path",
                            plot_help="write the per-layer credit and onset figure (PNG, PDF, "
                            "SVG) to this path")
    parser.add_argument("--html", dest="html_path", default=None, metavar="PATH",
                        help="write one self-contained HTML page: the report, the figures, "
                        "every answer coloured by onset layer and per-record heatmaps")
    parser.add_argument("--html-max-records", type=opts.at_least(0, "--html-max-records"),
                        default=DEFAULT_MAX_RECORDS, metavar="N",
                        help="heatmaps in the HTML page for the first N records only "
                        f"(default: {DEFAULT_MAX_RECORDS})")
    parser.add_argument("--n-boot", type=opts.at_least(1, "--n-boot"), default=1000, metavar="N",
                        help="bootstrap resamples of the confidence intervals (default: 1000)")
    parser.add_argument("--seed", type=int, default=0,
                        help="seed of the bootstrap (default: 0)")
    parser.add_argument("--allow-mixed-runs", action="store_true",
                        help="pool records that different runs (models, weights or settings "
                        "that change numbers) wrote into one file; refused by default")
    parser.add_argument("--only", choices=("plain", "contrastive"), default=None,
                        help="summarize only the plain or only the contrastive records of a "
                        "run that holds both (their credits cannot be pooled); error records "
                        "are reported either way")
    opts.add_check(parser, _check_results)
    opts.add_check(parser, _check_html)


def _check_results(args: argparse.Namespace) -> None:
    path = Path(args.results)
    if path.is_dir():
        raise UsageError(f"RESULTS {args.results!r} is a folder: give the .jsonl file of "
                         "'iglens run'")
    if not path.is_file():
        raise UsageError(f"RESULTS {args.results!r} does not exist (to explain a prompt that "
                         "starts with 'summarize', write 'iglens explain summarize ...')")
    if not os.access(path, os.R_OK):
        raise UsageError(f"RESULTS {args.results!r} cannot be read: permission denied")


def _check_html(args: argparse.Namespace) -> None:
    if not args.html_path:
        return
    target = Path(args.html_path)
    if target.is_dir():
        raise UsageError(f"--html {args.html_path!r} is a folder: give a file path")
    if not target.parent.is_dir():
        raise UsageError(f"--html {args.html_path!r}: the folder {str(target.parent)!r} does "
                         "not exist")
    if not os.access(target if target.exists() else target.parent, os.W_OK):
        raise UsageError(f"--html {args.html_path!r} cannot be written: permission denied")


def run(args: argparse.Namespace) -> int:
    """Summarize ``args.results``, print the report and write the requested files.

    Args:
        args (Namespace): Arguments parsed and checked by the router.

    Returns:
        0

    Raises:
        UsageError: ``args.results`` is not a results file.
        ValueError: a later line that is JSON but no result line, records that cannot be pooled
            (different layers, units or contrastive mode), or no result at all (exit
            status 1).
        OSError: the file cannot be read or an output cannot be written (exit status 1).
    """
    from captum_iglens.run.reader import load_results
    from captum_iglens.run.results_file import NotAResultsFile
    from captum_iglens.summary.pool import is_contrastive, summarize

    try:
        records, errors, torn = load_results(args.results)
    except NotAResultsFile as err:
        raise UsageError(str(err)) from err
    if args.only is not None:
        records = [r for r in records if is_contrastive(r) == (args.only == "contrastive")]
    summary = summarize(records, errors, n_boot=args.n_boot, seed=args.seed, torn=torn,
                        mixed_runs=args.allow_mixed_runs)
    print(f"results: {opts.echo(str(args.results))}")
    print(summary.format())
    if args.json_path:
        write_json(args.json_path, {"results": str(args.results), **summary.to_dict()})
    if args.plot_path and not records:
        print(f"iglens: warning: no record was explained: {args.plot_path} not written",
              file=sys.stderr)
    elif args.plot_path:
        from captum_iglens.summary.plot import plot_summary

        plot_summary(summary, args.plot_path)
        print(f"wrote {args.plot_path}", file=sys.stderr)
    if args.html_path:
        from captum_iglens.summary.html import write_html

        write_html(args.html_path, summary, records, args.html_max_records,
                   source=str(args.results))
        print(f"wrote {args.html_path}", file=sys.stderr)
    return 0
