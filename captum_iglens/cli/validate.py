"""``iglens validate``: does IG-Lens credit predict what ablating a block does?

iglens validate                                  # packaged prompts, all three ablations
iglens validate --ablation zero --threshold 0.5
iglens validate --prompts-file my.jsonl --json v.json --plot v.png
"""

from __future__ import annotations

import argparse
import sys

from captum_iglens.cli import _options as opts
from captum_iglens.cli._common import UsageError, exit_status_help, load

__all__ = ["DESCRIPTION", "EXIT_STATUS", "HELP", "add_arguments", "run"]

HELP = "test IG-Lens credit against position-local ablation of every block"
DESCRIPTION = (
    "Explain every prompt of a set (chat template, greedy answer), ablate each decoder "
    "block's residual update at every answer token with p_final >= --threshold (zero, mean "
    "or resample), and score how well IG-Lens credit, |credit|, the logit lens, the direct "
    "effect and baselines rank the blocks by their probability drop: Spearman rho, top-1 / "
    "top-3 hits, drop percentiles and onset distance, with prompt-clustered bootstrap 95% "
    "CIs, for all tokens and for non-monotonic logit-lens trajectories (arXiv:2606.29693). "
    "Default prompts: the frozen set shipped with the package."
)
EXIT_STATUS = exit_status_help(
    runtime="runtime error: the model could not be loaded, the computation failed, no answer "
    "token reached --threshold, a built-in check of the ablation failed, or --json / --plot "
    "could not be written",
    usage="usage error: something is wrong in the command line; found before the model is "
    "loaded, except what only the model's tokenizer can tell: prompts too few or too short "
    "for the reference set of mean ablation (found before the model is loaded where the "
    "embedded model's token counts are bounded, else before any prompt is explained)",
)
ABLATIONS = ("zero", "mean", "resample", "all")
_REMEDY = ("use --ablation zero or --ablation resample (they need no reference set), or give "
           "more prompts (--prompts-file)")
#: Tokens the embedded SmolLM2's chat template adds around a prompt (system prompt and role
#: markers): with its byte-level BPE, a prompt of b UTF-8 bytes is at most this + b tokens.
EMBEDDED_TEMPLATE_TOKENS = 30


def _probability(text: str) -> float:
    value = float(text)
    if not 0.0 <= value <= 1.0:
        raise UsageError(f"--threshold is a probability in [0, 1], got {value:g}")
    return value


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the options of ``iglens validate``.

    Args:
        parser (ArgumentParser): The command's parser.
    """
    from captum_iglens.settings import VALIDATE_MAX_NEW_TOKENS as DEFAULT_MAX_NEW_TOKENS
    from captum_iglens.settings import VALIDATE_THRESHOLD as DEFAULT_THRESHOLD

    parser.add_argument("--prompts-file", default=None, metavar="PATH",
                        help="prompts: a .jsonl file of {\"prompt\": ...} objects or a text "
                        "file with one prompt per line (default: the packaged set)")
    parser.add_argument("--ablation", default="all", choices=ABLATIONS,
                        help="ablation kind (default: all three)")
    parser.add_argument("--threshold", type=_probability, default=DEFAULT_THRESHOLD,
                        help="explain answer tokens with p_final >= this probability "
                        f"(default: {DEFAULT_THRESHOLD:g})")
    parser.add_argument("--max-new-tokens", type=opts.at_least(1, "--max-new-tokens"),
                        default=DEFAULT_MAX_NEW_TOKENS,
                        help=f"longest greedy answer (default: {DEFAULT_MAX_NEW_TOKENS})")
    parser.add_argument("--seed", type=int, default=0,
                        help="seed of the resample donors, the random predictor and the "
                        "bootstrap (default: 0)")
    opts.add_model_options(parser)
    opts.add_output_options(parser, json_help="write every token's drops, predictors and "
                            "metrics and the summaries as JSON to this path",
                            plot_help="write the correlation and profile figure (PNG, PDF, "
                            "SVG) to this path")
    opts.add_check(parser, _check_prompts_file)
    opts.add_check(parser, _check_mean_reference)


def _check_prompts_file(args: argparse.Namespace) -> None:
    from captum_iglens.validate import load_prompts

    try:
        args.prompts = load_prompts(args.prompts_file)
    except (OSError, UnicodeDecodeError, ValueError) as err:
        raise UsageError(f"--prompts-file {args.prompts_file!r}: {err}") from err
    if len(args.prompts) < 2:
        raise UsageError("--prompts-file: the validation needs at least 2 prompts")


def _check_mean_reference(args: argparse.Namespace) -> None:
    """Refuse before loading a prompt set too small for mean ablation, where it is certain.

    For the embedded model the prompts' token counts are bounded without its tokenizer
    (:data:`EMBEDDED_TEMPLATE_TOKENS` plus the UTF-8 bytes); another model's template is
    unknown until it is loaded (then :func:`captum_iglens.validate.validate` checks).

    Raises:
        UsageError: even the bounded counts leave every prompt's reference set short.
    """
    from captum_iglens.validate import reference_shortfall

    if args.ablation not in ("mean", "all") or args.model not in (None, opts.DEFAULT_MODEL):
        return
    bounds = [EMBEDDED_TEMPLATE_TOKENS + len(p.encode("utf-8")) for p in args.prompts]
    shortfall = reference_shortfall(bounds, args.max_new_tokens)
    if shortfall:
        raise UsageError(f"{shortfall}: {_REMEDY}")


def run(args: argparse.Namespace) -> int:
    """Run the validation and print its table.

    Args:
        args (Namespace): Arguments parsed and checked by the router.

    Returns:
        0

    Raises:
        UsageError: prompts too few or short for mean ablation's reference set.
        Exception: loading or computation errors, a failed ablation check (exit status 1).
    """
    from captum_iglens.ablation import KINDS, ReferenceSetError
    from captum_iglens.validate import validate

    model, tokenizer = load(args.model)
    kinds = KINDS if args.ablation == "all" else (args.ablation,)
    try:
        result = validate(model, tokenizer, args.prompts, kinds=kinds,
                          threshold=args.threshold, max_new_tokens=args.max_new_tokens,
                          seed=args.seed)
    except ReferenceSetError as err:
        raise UsageError(f"{err.shortfall}: {_REMEDY}") from err
    print(result.format_table())
    if args.json_path:
        result.to_json(args.json_path)
        print(f"wrote {args.json_path}", file=sys.stderr)
    if args.plot_path:
        result.plot(args.plot_path)
        print(f"wrote {args.plot_path}", file=sys.stderr)
    return 0
