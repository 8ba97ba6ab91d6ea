"""The ``iglens`` command: prompt in, answer out, IG-Lens token x layer table.

iglens "What is the capital of Vietnam?"
iglens --k 6 --json out.json "Name a prime number."
iglens compare --k 4 "What is the capital of Vietnam?"   # vs Captum (cli_compare.py)
echo "Why is the sky blue?" | iglens --stdin
iglens --prompts-file prompts.txt               # one prompt per line, one report each
iglens --target " Paris" "The capital of France is"
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import warnings
from typing import Any, Optional, Sequence

__all__ = ["main", "build_parser", "evenly_spaced_layers"]


class CliError(Exception):
    """A user-facing error: printed as one line, exit status 2."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # type: ignore[override]
        raise CliError(message)


def evenly_spaced_layers(n_layers: int, k: int) -> list[int]:
    """``k`` hidden-state indices evenly spaced over ``0..n_layers``, the last block included."""
    if not 1 <= k <= n_layers + 1:
        raise CliError(
            f"--k must be between 1 and {n_layers + 1} for a model with {n_layers} blocks"
        )
    if k == 1:
        return [n_layers]
    return sorted({round(i * n_layers / (k - 1)) for i in range(k)})


def _parse_layers(text: str) -> list[int]:
    try:
        layers = [int(part) for part in text.split(",") if part.strip()]
    except ValueError as err:
        raise CliError(
            f"--layers takes comma-separated ints such as 0,10,20,30, got {text!r}"
        ) from err
    if not layers:
        raise CliError(f"--layers names no layer: give ints such as 0,10,20,30, got {text!r}")
    if len(set(layers)) != len(layers):
        raise CliError(f"--layers names a layer twice: {text!r}")
    return layers


def add_model_arguments(parser: argparse.ArgumentParser) -> None:
    """Arguments shared by ``iglens`` and its sub-commands."""
    from captum_iglens.ig_lens import BASELINES, METHODS

    parser.add_argument("prompt", nargs="*", help="the prompt (several words are joined)")
    parser.add_argument(
        "--stdin", action="store_true", help="read prompts from standard input, one per line"
    )
    parser.add_argument(
        "--prompts-file",
        default=None,
        metavar="PATH",
        help="read prompts from a UTF-8 file, one per line (blank lines skipped)",
    )
    parser.add_argument(
        "--target",
        default=None,
        help="explain this answer text (each of its tokens, teacher-forced) instead of "
        "generating one; a leading space matters",
    )
    parser.add_argument(
        "--loop", action="store_true", help="ask for prompts repeatedly until an empty line or EOF"
    )
    parser.add_argument(
        "--model",
        default=None,
        help="'smollm2' (default, embedded), a local model folder or a .gguf file",
    )
    parser.add_argument(
        "--layers",
        type=_parse_layers,
        default=None,
        help="hidden-state indices, e.g. 0,10,20,30 (the last block is always added)",
    )
    parser.add_argument(
        "--k", type=int, default=None, help="use k evenly spaced layers instead of all blocks"
    )
    parser.add_argument(
        "--method",
        default="prediction_aware",
        choices=METHODS,
        help="estimator (default: prediction_aware)",
    )
    parser.add_argument(
        "--n-steps",
        type=int,
        default=50,
        help="steps per segment for gradient estimators (default: 50)",
    )
    parser.add_argument(
        "--baseline",
        default="mean",
        choices=BASELINES,
        help="baseline in residual space (default: mean)",
    )
    parser.add_argument(
        "--onset-frac",
        type=float,
        default=0.5,
        help="mass fraction for the onset layer (default: 0.5)",
    )
    parser.add_argument(
        "--max-new-tokens", type=int, default=32, help="longest answer (default: 32)"
    )
    parser.add_argument(
        "--internal-batch-size", type=int, default=None, help="readout rows per chunk"
    )
    parser.add_argument(
        "--no-chat-template",
        action="store_true",
        help="explain the raw prompt, without the chat template",
    )
    parser.add_argument(
        "--json", dest="json_path", default=None, help="write the results as JSON to this path"
    )
    parser.add_argument(
        "--plot",
        dest="plot_path",
        default=None,
        help="write the token x layer heatmap and logit-lens trajectory (PNG, PDF, SVG) to "
        "this path; several prompts get PATH-<i>",
    )


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="iglens",
        description=(
            "IG-Lens: exact additive attribution of each answer token's probability to the "
            "decoder layers of a causal LM (arXiv:2606.29693). Runs offline on the embedded "
            "SmolLM2-135M-Instruct by default."
        ),
    )
    add_model_arguments(parser)
    return parser


def read_prompts(args: argparse.Namespace) -> list[str]:
    """The prompts named by the arguments (not for ``--loop``)."""
    if getattr(args, "prompts_file", None):
        if args.stdin or args.prompt:
            raise CliError("give --prompts-file, --stdin or a prompt, not several of them")
        try:
            with open(args.prompts_file, encoding="utf-8") as handle:
                prompts = [line.strip() for line in handle.read().splitlines() if line.strip()]
        except OSError as err:
            raise CliError(f"cannot read --prompts-file {args.prompts_file!r}: {err}") from err
        if not prompts:
            raise CliError(f"--prompts-file {args.prompts_file!r} holds no prompt: one per line")
        return prompts
    if args.stdin:
        prompts = [line.strip() for line in sys.stdin.read().splitlines() if line.strip()]
        if not prompts:
            raise CliError("--stdin read no prompt: give one prompt per line")
        return prompts
    prompt = " ".join(args.prompt).strip()
    if not prompt:
        raise CliError("the prompt is empty: give a prompt, --stdin or --loop")
    return [prompt]


def resolve_layers(args: argparse.Namespace, n_layers: int) -> Optional[list[int]]:
    if args.layers is not None and args.k is not None:
        raise CliError("give --layers or --k, not both")
    if args.k is not None:
        return evenly_spaced_layers(n_layers, args.k)
    return args.layers


def load(args: argparse.Namespace) -> tuple[Any, Any]:
    """Load the model quietly (progress to stderr)."""
    from transformers.utils import logging as hf_logging

    from captum_iglens.models import load_model

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    print(
        f"loading {args.model or 'smollm2 (embedded SmolLM2-135M-Instruct)'} ...", file=sys.stderr
    )
    return load_model(args.model)


def check_output_paths(args: argparse.Namespace) -> None:
    """Refuse ``--json`` / ``--plot`` paths that cannot be written, before any computing."""
    from pathlib import Path

    for option, path in (
        ("--json", getattr(args, "json_path", None)),
        ("--plot", getattr(args, "plot_path", None)),
    ):
        if not path:
            continue
        target = Path(path)
        if target.is_dir():
            raise CliError(f"{option} {path!r} is a folder: give a file path")
        if not target.parent.is_dir():
            raise CliError(f"{option} {path!r}: the folder {str(target.parent)!r} does not exist")
        if option == "--plot":
            from matplotlib.figure import Figure

            kinds = Figure().canvas.get_supported_filetypes()
            if target.suffix.lstrip(".").lower() not in kinds:
                raise CliError(
                    f"--plot {path!r}: use one of the extensions {', '.join(sorted(kinds))}"
                )


def _run_main(args: argparse.Namespace) -> int:
    from captum_iglens.ig_lens import IGLens
    from captum_iglens.readout import resolve_decoder_blocks
    from captum_iglens.text import _explain_one

    if args.n_steps < 1:
        raise CliError("--n-steps must be >= 1")
    if args.method != "prediction_aware" and args.n_steps < 2:
        raise CliError(f"--method {args.method} needs --n-steps >= 2")
    if args.k is not None and args.k < 1:
        raise CliError("--k must be >= 1")
    if args.internal_batch_size is not None and args.internal_batch_size < 1:
        raise CliError("--internal-batch-size must be >= 1")
    if args.max_new_tokens < 1:
        raise CliError("--max-new-tokens must be >= 1")
    if not 0 < args.onset_frac <= 1:
        raise CliError("--onset-frac must be in (0, 1]")
    check_output_paths(args)
    prompts = [] if args.loop else read_prompts(args)
    model, tokenizer = load(args)
    lens = IGLens(model, layers=resolve_layers(args, len(resolve_decoder_blocks(model))))
    results = []

    def run_one(prompt: str) -> None:
        result = _explain_one(
            model,
            tokenizer,
            prompt,
            args.max_new_tokens,
            lens,
            args.method,
            args.n_steps,
            args.baseline,
            args.onset_frac,
            args.internal_batch_size,
            not args.no_chat_template,
            getattr(args, "target", None),
        )
        results.append(result)
        print(f"prompt: {prompt}")
        if not result.chat_template_used:
            print("(no chat template: the raw prompt was used)")
        print(f"answer: {result.answer}")
        if getattr(args, "target", None) is not None:
            print(f"target token ids: {result.token_ids}")
        print(result.format_table())
        print()

    if args.loop:
        while True:
            try:
                prompt = input("prompt> ").strip()
            except EOFError:
                break
            if not prompt:
                break
            run_one(prompt)
    else:
        for prompt in prompts:
            run_one(prompt)
    if args.json_path and not results:
        print(f"no prompt was explained: {args.json_path} not written", file=sys.stderr)
    elif args.json_path:
        payload: Any = results[0].to_dict() if len(results) == 1 else [r.to_dict() for r in results]
        with open(args.json_path, "w", encoding="utf-8") as handle:
            json.dump(payload, handle, indent=2)
        print(f"wrote {args.json_path}", file=sys.stderr)
    if getattr(args, "plot_path", None) and results:
        _write_plots(results, args.plot_path)
    return 0


def _write_plots(results: list, path: str) -> None:
    """``--plot``: one figure per result (``stem-<i>.ext`` when there are several)."""
    from pathlib import Path

    target = Path(path)
    for i, result in enumerate(results):
        out = target
        if len(results) > 1:
            out = target.with_name(f"{target.stem}-{i}{target.suffix}")
        result.plot(str(out))
        print(f"wrote {out}", file=sys.stderr)


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Entry point of the ``iglens`` console script; returns the exit status."""
    argv = list(sys.argv[1:] if argv is None else argv)
    with warnings.catch_warnings():
        warnings.showwarning = _one_line_warning
        try:
            if argv and argv[0] == "compare":  # `iglens compare ...`: see cli_compare.py
                from captum_iglens.cli_compare import run_compare

                return run_compare(argv[1:])
            args = build_parser().parse_args(argv)
            return _run_main(args)
        except CliError as err:
            print(f"iglens: error: {err}", file=sys.stderr)
            return 2
        except KeyboardInterrupt:
            return 130
        except Exception as err:  # a one-line error, never a traceback (IGLENS_DEBUG=1: raise)
            if os.environ.get("IGLENS_DEBUG"):
                raise
            message = str(err).splitlines()[0] if str(err) else ""
            expected = (ValueError, TypeError, OSError, RuntimeError, ArithmeticError)
            if not isinstance(err, expected):
                message = f"{type(err).__name__}: {message} (IGLENS_DEBUG=1 shows the traceback)"
            print(f"iglens: error: {message or type(err).__name__}", file=sys.stderr)
            return 1


def _one_line_warning(message: Warning | str, category: type, *_: object, **__: object) -> None:
    print(f"iglens: warning: {message}", file=sys.stderr)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
