"""``iglens fit-lens``: fit a tuned or Jacobian lens for a model, into the lens cache.

iglens fit-lens --kind tuned                                  # SmolLM2, its own sampled text
iglens fit-lens --kind tuned --text-file corpus.txt --steps 300
iglens fit-lens --kind jacobian --sequences 4 --seq-len 32
iglens fit-lens --kind tuned --from-tuned-lens path/to/lens   # a tuned-lens package folder
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from captum_iglens.cli import _options as opts
from captum_iglens.cli._common import UsageError, exit_status_help, load
from captum_iglens.settings import FIT_SEQ_LEN, FIT_SEQUENCES, FIT_STEPS

__all__ = ["DESCRIPTION", "EXIT_STATUS", "HELP", "add_arguments", "run"]

HELP = "fit a tuned or Jacobian lens for a model (cached; then use --lens tuned|jacobian)"
DESCRIPTION = (
    "Fit a per-layer readout offline and save it in the lens cache, keyed by the model's "
    "weights digest and the fit's settings, so that explain/run --lens KIND and "
    "IGLens(model, lens=KIND) find it. tuned: affine translators h + A h + b per layer, "
    "identity-initialised, fitted by Adam on the tuned-lens objective (KL from the final "
    "distribution, summed over layers); resumable (a checkpoint beside the entry every 10 "
    "steps). jacobian: the average Jacobian of the last block's output with respect to each "
    "layer's residual (TransformerLens's estimator; no optimisation). Text: --text-file, or "
    "by default text the model samples itself from the packaged prompts (seed 0; the lens is "
    "then best on text the model finds likely)."
)
EXIT_STATUS = exit_status_help(
    runtime="runtime error: the model could not be loaded, the text is too short, or the "
    "cache could not be written",
    usage="usage error: something is wrong in the command line (a missing --text-file)",
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the options of ``iglens fit-lens``.

    Args:
        parser (ArgumentParser): The command's parser.
    """
    parser.add_argument("--kind", required=True, choices=("tuned", "jacobian"),
                        help="the lens to fit")
    opts.add_model_options(parser)
    parser.add_argument("--text-file", default=None, metavar="FILE",
                        help="UTF-8 text to fit on (default: text the model samples itself "
                        "from the packaged prompts)")
    parser.add_argument("--steps", type=opts.at_least(1, "--steps"), default=FIT_STEPS,
                        metavar="N", help=f"Adam steps of the tuned lens (default: {FIT_STEPS})")
    parser.add_argument("--sequences", type=opts.at_least(1, "--sequences"),
                        default=FIT_SEQUENCES, metavar="N",
                        help=f"text chunks to fit on (default: {FIT_SEQUENCES})")
    parser.add_argument("--seq-len", type=opts.at_least(3, "--seq-len"), default=FIT_SEQ_LEN,
                        metavar="N", help=f"tokens per chunk (default: {FIT_SEQ_LEN})")
    parser.add_argument("--from-tuned-lens", default=None, metavar="DIR",
                        help="with --kind tuned: load a lens trained with the tuned-lens "
                        "package (config.json, params.pt) instead of fitting one")
    opts.add_check(parser, _check_files)


def _check_files(args: argparse.Namespace) -> None:
    if args.text_file is not None and not Path(args.text_file).is_file():
        raise UsageError(f"--text-file {args.text_file!r} is not a file")
    if args.from_tuned_lens is not None:
        if args.kind != "tuned":
            raise UsageError("--from-tuned-lens loads a tuned lens: use --kind tuned")
        if not Path(args.from_tuned_lens, "params.pt").is_file():
            raise UsageError(f"--from-tuned-lens {args.from_tuned_lens!r}: no params.pt there")


def run(args: argparse.Namespace) -> int:
    """Fit (or load) the lens and save it in the cache; print where.

    Returns:
        0
    """
    from captum_iglens.lens import fit
    from captum_iglens.lens.fit_corpus import corpus_ids
    from captum_iglens.lens.weights import weights_digest

    model, tokenizer = load(args.model)
    digest = weights_digest(model)
    progress = not args.no_progress
    lens: Any
    if args.from_tuned_lens is not None:
        lens = fit.load_tuned_lens_folder(args.from_tuned_lens, model)
        path = fit.lens_cache_path(digest, "tuned", lens.settings)
    else:
        text = (Path(args.text_file).read_text(encoding="utf-8")
                if args.text_file is not None else None)
        ids = corpus_ids(model, tokenizer, text, seq_len=args.seq_len,
                         n_sequences=args.sequences)
        settings = {"kind": args.kind, "corpus": fit.corpus_digest(ids),
                    "text_file": args.text_file, "seq_len": args.seq_len,
                    "sequences": int(ids.shape[0]),
                    **({"steps": args.steps} if args.kind == "tuned" else {})}
        path = fit.lens_cache_path(digest, args.kind, settings)
        if args.kind == "tuned":
            lens = fit.fit_tuned_lens(model, ids, steps=args.steps, progress=progress,
                                      checkpoint=path.with_suffix(".ckpt"),
                                      settings=settings)
        else:
            lens = fit.fit_jacobian_lens(model, ids, progress=progress, settings=settings)
    lens.save(path)
    path.with_suffix(".ckpt").unlink(missing_ok=True)
    print(f"{args.kind} lens for weights {digest} saved to {path}")
    print(f"use it with --lens {args.kind} or IGLens(model, lens={args.kind!r})",
          file=sys.stderr)
    return 0
