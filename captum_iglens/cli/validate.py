"""``iglens validate``: does IG-Lens credit predict what ablating a block does?

iglens validate                                  # packaged prompts and pairs: 3 ablations, patching
iglens validate --ablation zero --threshold 0.5
iglens validate --ablation patch --pairs-file my_pairs.jsonl
iglens validate --prompts-file my.jsonl --json v.json --plot v.png
"""

from __future__ import annotations

import argparse
import sys

from captum_iglens.cli import _options as opts
from captum_iglens.cli._common import UsageError, exit_status_help, load
from captum_iglens.settings import VALIDATE_DONORS

__all__ = ["DESCRIPTION", "EXIT_STATUS", "HELP", "add_arguments", "run"]

HELP = "test IG-Lens credit against ablation and patching of every block (pre-stated test)"
DESCRIPTION = (
    "Run the pre-stated test of IG-Lens's open question (arXiv:2606.29693; printed with its "
    "verdict): H1 credit ranks the blocks by their causal drop better than the logit-lens "
    "level and chance, H2 better on non-monotonic than on monotonic logit-lens trajectories, "
    "H3 the onset lies nearer the half-drop block than a random block. Interventions: every "
    "decoder block's residual update ablated at every answer token with p_final >= "
    "--threshold (zero, mean, or resample from --donors other prompts, averaged), and "
    "counterfactual patching of prompt pairs (one block's update from the clean run patched "
    "into the corrupted one, and back) against contrastive IG-Lens credit from the "
    "corrupted reference. Every predictor (credit, |credit|, logit lens, direct effect, "
    "baselines) is scored per token (Spearman rho, rho without the shared layer profile, "
    "top-1 / top-3, drop percentiles, onset distance) with prompt-clustered bootstrap 95% "
    "CIs. Default prompts and pairs: the frozen sets shipped with the package."
)
EXIT_STATUS = exit_status_help(
    runtime="runtime error: the model could not be loaded, the computation failed, no answer "
    "token reached --threshold, a built-in check of the ablation or the patching failed, or "
    "--json / --plot could not be written",
    usage="usage error: something is wrong in the command line; found before the model is "
    "loaded, except what only the model's tokenizer can tell: prompts too few or too short "
    "for the reference set of mean ablation (found before the model is loaded where the "
    "embedded model's token counts are bounded, else before any prompt is explained), or "
    "fewer than 2 patching pairs whose prompts have as many tokens (before any run)",
)
ABLATIONS = ("zero", "mean", "resample", "patch", "all")
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
                        help="intervention: an ablation kind, patch (counterfactual patching "
                        "of the pairs), or all four (default)")
    parser.add_argument("--pairs-file", default=None, metavar="PATH",
                        help="patching pairs: a .jsonl file of {\"id\", \"category\", "
                        "\"clean\", \"corrupted\", \"answer\", \"foil\"} objects, clean and "
                        "corrupted of equal token count (default: the packaged set)")
    parser.add_argument("--donors", type=opts.at_least(1, "--donors"),
                        default=VALIDATE_DONORS,
                        help="resample ablation: donor prompts per prompt, their "
                        f"probabilities averaged; at most the other prompts (default: "
                        f"{VALIDATE_DONORS})")
    parser.add_argument("--threshold", type=_probability, default=DEFAULT_THRESHOLD,
                        help="explain answer tokens with p_final >= this probability "
                        f"(default: {DEFAULT_THRESHOLD:g})")
    parser.add_argument("--max-new-tokens", type=opts.at_least(1, "--max-new-tokens"),
                        default=DEFAULT_MAX_NEW_TOKENS,
                        help=f"longest greedy answer (default: {DEFAULT_MAX_NEW_TOKENS})")
    parser.add_argument("--no-effects", action="store_true",
                        help="skip the effect predictors (total effect and AtP scores, a "
                        "gated forward and backward per block and token): a faster run")
    parser.add_argument("--seed", type=int, default=0,
                        help="seed of the resample donors, the random predictor and the "
                        "bootstrap (default: 0)")
    opts.add_model_options(parser)
    opts.add_output_options(parser, json_help="write every token's drops, predictors and "
                            "metrics and the summaries as JSON to this path",
                            plot_help="write the correlation and profile figure (PNG, PDF, "
                            "SVG) to this path")
    opts.add_check(parser, _check_prompts_file)
    opts.add_check(parser, _check_pairs_file)
    opts.add_check(parser, _check_mean_reference)


def _check_prompts_file(args: argparse.Namespace) -> None:
    from captum_iglens.validate.inputs import load_prompts

    try:
        args.prompts = load_prompts(args.prompts_file)
    except (OSError, UnicodeDecodeError, ValueError) as err:
        raise UsageError(f"--prompts-file {args.prompts_file!r}: {err}") from err
    if len(args.prompts) < 2:
        raise UsageError("--prompts-file: the validation needs at least 2 prompts")


def _check_pairs_file(args: argparse.Namespace) -> None:
    """Read the patching pairs (when patching runs), before loading."""
    from captum_iglens.validate.pairs import load_pairs

    args.pairs = None
    if args.ablation not in ("patch", "all"):
        return
    try:
        args.pairs = load_pairs(args.pairs_file)
    except (OSError, UnicodeDecodeError, ValueError) as err:
        raise UsageError(f"--pairs-file {args.pairs_file!r}: {err}") from err


def _check_mean_reference(args: argparse.Namespace) -> None:
    """Refuse before loading a prompt set too small for mean ablation, where it is certain.

    For the embedded model the prompts' token counts are bounded without loading it:
    :data:`EMBEDDED_TEMPLATE_TOKENS` plus one, plus each prompt's tokens as the tokenizer of
    its cache entry splits them (read without transformers), or plus its UTF-8 bytes where
    the model was never cached. Another model's template is unknown until it is loaded
    (then :func:`captum_iglens.validate.driver.validate` checks).

    Raises:
        UsageError: even the bounded counts leave every prompt's reference set short.
    """
    from captum_iglens.models.registry import SMOLLM2_NAMES
    from captum_iglens.validate.inputs import reference_shortfall

    name = (args.model or opts.DEFAULT_MODEL).strip().lower()
    if args.ablation not in ("mean", "all") or name not in SMOLLM2_NAMES:
        return
    shortfall = reference_shortfall(_embedded_bounds(args.prompts), args.max_new_tokens)
    if shortfall:
        raise UsageError(f"{shortfall}: {_REMEDY}")


def _embedded_bounds(prompts: list[str]) -> list[int]:
    """Upper bounds of the embedded model's token counts of ``prompts`` (template included).

    The chat template adds at most :data:`EMBEDDED_TEMPLATE_TOKENS` tokens around a prompt;
    one more allows for a merge at its boundary going the other way.
    """
    from captum_iglens.models.facts import embedded_tokenizer_file

    path = embedded_tokenizer_file()
    try:
        from tokenizers import Tokenizer

        tokenizer = Tokenizer.from_file(str(path)) if path is not None else None
    except Exception:  # noqa: BLE001 - no usable tokenizer file: the looser byte bound
        tokenizer = None
    if tokenizer is None:
        return [EMBEDDED_TEMPLATE_TOKENS + len(p.encode("utf-8")) for p in prompts]
    return [EMBEDDED_TEMPLATE_TOKENS + 1 + len(tokenizer.encode(p, add_special_tokens=False).ids)
            for p in prompts]


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
    from captum_iglens.validate.ablation import ReferenceSetError
    from captum_iglens.validate.driver import INTERVENTIONS, validate
    from captum_iglens.validate.patching import PairAlignmentError
    from captum_iglens.validate.predictors import DEFAULT_EFFECTS

    model, tokenizer = load(args.model)
    kinds = INTERVENTIONS if args.ablation == "all" else (args.ablation,)
    try:
        result = validate(model, tokenizer, args.prompts, kinds=kinds,
                          threshold=args.threshold, max_new_tokens=args.max_new_tokens,
                          seed=args.seed, donors=args.donors, pairs=args.pairs,
                          prompts_file=args.prompts_file, pairs_file=args.pairs_file,
                          effects=() if args.no_effects else DEFAULT_EFFECTS)
    except ReferenceSetError as err:
        raise UsageError(f"{err.shortfall}: {_REMEDY}") from err
    except PairAlignmentError as err:
        raise UsageError(str(err).replace("leave 'patch' out of the kinds",
                                          "use --ablation zero, mean or resample")) from err
    print(result.format_table())
    if args.json_path:
        result.to_json(args.json_path)
        print(f"wrote {args.json_path}", file=sys.stderr)
    if args.plot_path:
        result.plot(args.plot_path)
        print(f"wrote {args.plot_path}", file=sys.stderr)
    return 0
