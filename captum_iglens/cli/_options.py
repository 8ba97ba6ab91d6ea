"""The option groups of the ``iglens`` commands, each defined once, with their checks.

Every ``add_*_options`` function adds its options to a command's parser and registers the
checks that go with them (:func:`add_check`). The router runs all registered checks on the
parsed arguments before it hands them to the command, so that every mistake in the command
line is reported before the model is loaded. Range checks run while parsing (the ``type=``
of the option).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Optional

from captum_iglens.cli._common import UsageError, add_check, at_least, run_checks
from captum_iglens.cli._template_date import (
    check_template_date,
    parse_template_date,
    warn_unused_template_date,
)

__all__ = [
    "DEFAULT_MODEL",
    "add_check",
    "add_estimator_options",
    "add_generation_options",
    "add_granularity_options",
    "add_layer_options",
    "add_model_options",
    "add_output_options",
    "add_prompt_options",
    "add_result_options",
    "at_least",
    "evenly_spaced_layers",
    "parse_layers",
    "read_prompts",
    "resolve_layers",
    "run_checks",
    "warn_unused_template_date",
]

DEFAULT_MODEL = "smollm2"


def parse_layers(text: str) -> list[int]:
    """``--layers``: comma-separated hidden-state indices such as ``0,10,20,30``.

    Raises:
        UsageError: if a part is not an int, no layer is named or one is named twice.
    """
    try:
        layers = [int(part) for part in text.split(",") if part.strip()]
    except ValueError as err:
        raise UsageError(
            f"--layers takes comma-separated ints such as 0,10,20,30, got {text!r}"
        ) from err
    if not layers:
        raise UsageError(f"--layers names no layer: give ints such as 0,10,20,30, got {text!r}")
    if len(set(layers)) != len(layers):
        raise UsageError(f"--layers names a layer twice: {text!r}")
    return layers


def add_model_options(parser: argparse.ArgumentParser) -> None:
    """``--model`` (default: the embedded SmolLM2; a path must exist) and ``--no-progress``."""
    parser.add_argument(
        "--model",
        default=None,
        help=f"'{DEFAULT_MODEL}' (default, embedded), another model name (smollm2-135m-instruct, "
        "qwen2.5-coder-0.5b-instruct, qwen2.5-coder-1.5b-instruct: installed from their part "
        "wheels), a local model folder or a .gguf file",
    )
    parser.add_argument("--no-progress", action="store_true",
                        help="no progress bars on stderr (they appear for work over 2 s)")
    add_check(parser, _check_model)


def _check_model(args: argparse.Namespace) -> None:
    from captum_iglens.models.registry import is_model_name, model_names

    spec = args.model
    if is_model_name(spec):
        return
    path = Path(spec).expanduser()
    if path.is_dir() or (path.is_file() and path.suffix == ".gguf"):
        return
    raise UsageError(
        f"--model {spec!r} is neither a model name ({', '.join(model_names())}), a local model "
        "folder nor a .gguf file (models are never downloaded: give a local path)"
    )


def add_layer_options(parser: argparse.ArgumentParser, default_k: Optional[int] = None) -> None:
    """``--layers`` / ``--k`` (not both).

    Args:
        parser (ArgumentParser): A command's parser.
        default_k (int, optional): ``--k`` when neither option is given; None: all blocks.
            Default: None.
    """
    parser.add_argument(
        "--layers",
        type=parse_layers,
        default=None,
        help="hidden-state indices, e.g. 0,10,20,30 (the last block is always added)",
    )
    k_help = "use k evenly spaced layers instead of all blocks"
    if default_k is not None:
        k_help = f"k evenly spaced layers (default: {default_k} when --layers is not given)"
    parser.add_argument("--k", type=at_least(1, "--k"), default=None, help=k_help)
    add_check(parser, _check_layers_or_k)


def add_granularity_options(parser: argparse.ArgumentParser, heads: bool = True) -> None:
    """``--granularity`` (block or sublayer) and, with ``heads``, ``--heads``.

    Args:
        parser (ArgumentParser): A command's parser.
        heads (bool, optional): Add ``--heads`` (per-head credits; needs
            ``--granularity sublayer``). Default: True.
    """
    from captum_iglens.settings import DEFAULT_GRANULARITY, GRANULARITIES

    parser.add_argument("--granularity", choices=GRANULARITIES, default=DEFAULT_GRANULARITY,
                        help="block (default): one credit per layer; sublayer: an attention "
                        "credit and an MLP credit per block (L3.attn, L3.mlp), adding up to "
                        "the block's")
    if heads:
        parser.add_argument("--heads", action="store_true",
                            help="with --granularity sublayer: split each attention credit "
                            "over the heads (JSON head_credits; one backward pass per step, "
                            "--n-steps steps; Llama-like families)")
        add_check(parser, _check_heads)


def _check_heads(args: argparse.Namespace) -> None:
    if args.heads and args.granularity != "sublayer":
        raise UsageError("--heads needs --granularity sublayer")


def _check_layers_or_k(args: argparse.Namespace) -> None:
    if args.layers is not None and args.k is not None:
        raise UsageError("give --layers or --k, not both")


def evenly_spaced_layers(n_layers: int, k: int) -> list[int]:
    """``k`` hidden-state indices evenly spaced over ``0..n_layers``, the last block included.

    Raises:
        UsageError: if ``k`` is not in ``1..n_layers + 1``.
    """
    if not 1 <= k <= n_layers + 1:
        raise UsageError(
            f"--k must be between 1 and {n_layers + 1} for a model with {n_layers} blocks"
        )
    if k == 1:
        return [n_layers]
    return sorted({round(i * n_layers / (k - 1)) for i in range(k)})


def resolve_layers(
    args: argparse.Namespace, n_layers: int, default_k: Optional[int] = None
) -> Optional[list[int]]:
    """The layers named by ``--layers`` / ``--k`` for a model with ``n_layers`` blocks.

    Args:
        args (Namespace): Parsed and checked arguments.
        n_layers (int): Number of decoder blocks of the loaded model.
        default_k (int, optional): ``--k`` when neither option is given (capped at
            ``n_layers + 1``). Default: None (all blocks).

    Returns:
        Hidden-state indices, or None for all blocks.

    Raises:
        UsageError: a layer index or ``--k`` beyond this model's blocks.
    """
    if args.layers is not None:
        for layer in args.layers:
            if not -(n_layers + 1) <= layer <= n_layers:
                raise UsageError(
                    f"--layers: layer index {layer} is out of range: this model has {n_layers} "
                    f"decoder blocks, so hidden-state indices run from 0 to {n_layers} "
                    f"(or -{n_layers + 1}..-1 from the end)"
                )
        return args.layers
    if args.k is not None:
        return evenly_spaced_layers(n_layers, args.k)
    if default_k is not None:
        return evenly_spaced_layers(n_layers, min(default_k, n_layers + 1))
    return None


def add_estimator_options(
    parser: argparse.ArgumentParser,
    n_steps: Optional[int] = None,
    n_steps_help: str = "steps per segment for gradient estimators",
    batch_help: str = "readout rows per chunk",
    with_method: bool = True,
) -> None:
    """``--method``, ``--n-steps``, ``--baseline``, ``--internal-batch-size``.

    Args:
        parser (ArgumentParser): A command's parser.
        n_steps (int, optional): Default of ``--n-steps``. Default: the package's (50).
        n_steps_help (str, optional): Help of ``--n-steps`` (the default is appended).
        batch_help (str, optional): Help of ``--internal-batch-size``.
        with_method (bool, optional): Add ``--method`` and ``--baseline`` (IG-Lens's
            estimator and residual baseline); else ``--n-steps`` must be >= 2. Default: True.
    """
    from captum_iglens.settings import (
        BASELINES,
        DEFAULT_BASELINE,
        DEFAULT_METHOD,
        DEFAULT_N_STEPS,
        METHODS,
    )

    n_steps = DEFAULT_N_STEPS if n_steps is None else n_steps
    if with_method:
        parser.add_argument("--method", default=DEFAULT_METHOD, choices=METHODS,
                            help=f"estimator (default: {DEFAULT_METHOD})")
    minimum = 1 if with_method else 2
    parser.add_argument("--n-steps", type=at_least(minimum, "--n-steps"), default=n_steps,
                        help=f"{n_steps_help} (default: {n_steps})")
    if with_method:
        parser.add_argument("--baseline", default=DEFAULT_BASELINE, choices=BASELINES,
                            help=f"baseline in residual space (default: {DEFAULT_BASELINE}, "
                            "the causal mean of h_1 up to the explained position)")
        add_check(parser, _check_method_steps)
    parser.add_argument("--internal-batch-size", type=at_least(1, "--internal-batch-size"),
                        default=None, help=batch_help)


def _check_method_steps(args: argparse.Namespace) -> None:
    from captum_iglens.settings import CAPTUM_METHODS

    if args.method in CAPTUM_METHODS and args.n_steps < 2:
        raise UsageError(f"--method {args.method} needs --n-steps >= 2")


def add_result_options(parser: argparse.ArgumentParser) -> None:
    """``--onset-frac``, ``--onset-rule``, ``--units``, ``--top-k`` and ``--contrast``."""
    from captum_iglens.settings import (
        DEFAULT_ONSET_FRAC,
        DEFAULT_ONSET_RULE,
        DEFAULT_UNITS,
        ONSET_RULES,
        UNITS,
    )

    parser.add_argument("--onset-frac", type=_fraction, default=DEFAULT_ONSET_FRAC,
                        help=f"fraction for the onset layer (default: {DEFAULT_ONSET_FRAC})")
    parser.add_argument("--onset-rule", choices=ONSET_RULES, default=DEFAULT_ONSET_RULE,
                        help="sustained (default): the first layer from which the cumulative "
                        "credit stays at or beyond frac x Δp; mass: the first layer holding "
                        "frac of the cumulative |credit|")
    parser.add_argument("--units", choices=UNITS, default=DEFAULT_UNITS,
                        help="the readout that is decomposed: probability (default) or "
                        "log-probability in nats; the credits add up exactly in either")
    parser.add_argument("--top-k", type=at_least(0, "--top-k"), default=0,
                        help="record the logit lens's top-k tokens at every layer in the JSON "
                        "and plot (default: 0, none)")
    parser.add_argument("--contrast", default=None, metavar="TEXT",
                        help="contrastive: explain p(token) - p(foil) with this foil text (one "
                        "token for every answer token, or one per answer token); log units: "
                        "the log-ratio. A leading space matters")
    add_check(parser, _check_contrast)


def _fraction(text: str) -> float:
    value = float(text)
    if not 0 < value <= 1:
        raise UsageError(f"--onset-frac must be in (0, 1], got {text}")
    return value


_fraction.__name__ = "float"


def _check_contrast(args: argparse.Namespace) -> None:
    if args.contrast == "":
        raise UsageError("--contrast is empty: give the foil text (e.g. ' London')")


def add_generation_options(parser: argparse.ArgumentParser) -> None:
    """``--max-new-tokens``, ``--no-chat-template`` and ``--template-date``."""
    from captum_iglens.settings import DEFAULT_MAX_NEW_TOKENS

    parser.add_argument("--max-new-tokens", type=at_least(1, "--max-new-tokens"),
                        default=DEFAULT_MAX_NEW_TOKENS,
                        help=f"longest answer; a longer one is marked truncated (default: "
                        f"{DEFAULT_MAX_NEW_TOKENS})")
    parser.add_argument("--no-chat-template", action="store_true",
                        help="use the raw prompt, without the chat template")
    parser.add_argument("--template-date", type=parse_template_date, default=None,
                        metavar="DATE", help="pin the date a chat template writes into the "
                        "prompt, as DD Mon YYYY (e.g. '26 Jul 2024'), for templates that "
                        "otherwise write today's date")
    add_check(parser, check_template_date)


def template_kwargs(args: argparse.Namespace) -> Optional[dict[str, str]]:
    """Chat-template variables pinned on the command line (``--template-date``)."""
    date = getattr(args, "template_date", None)
    return {"date_string": date} if date else None


def echo(text: str, width: int = 200) -> str:
    """``text`` on one line, cut to ``width`` characters with the length named."""
    flat = text.replace("\r", "").replace("\n", "↵")
    return flat if len(flat) <= width else f"{flat[:width]}… ({len(flat)} characters)"


def template_note(used: bool) -> str:
    """Whether the chat template was applied, for every output."""
    return "chat template: applied" if used else "chat template: not applied (raw prompt)"


def add_prompt_options(parser: argparse.ArgumentParser, sources: bool = False) -> None:
    """Add the prompt words; with ``sources``, also the other prompt sources and ``--target``.

    The other sources are ``--stdin``, ``--prompts-file`` and ``--loop``. The registered
    check stores the prompts in ``args.prompts`` (empty with ``--loop``).

    Args:
        parser (ArgumentParser): A command's parser.
        sources (bool, optional): Add the other prompt sources and ``--target``.
            Default: False.
    """
    parser.add_argument("prompt", nargs="*", help="the prompt (several words are joined)")
    if sources:
        parser.add_argument("--stdin", action="store_true",
                            help="read prompts from standard input, one per line")
        parser.add_argument("--prompts-file", default=None, metavar="PATH",
                            help="read prompts from a UTF-8 file, one per line (blank lines "
                            "skipped)")
        parser.add_argument("--loop", action="store_true",
                            help="ask for prompts repeatedly until an empty line or EOF")
        parser.add_argument("--target", default=None,
                            help="explain this answer text (each of its tokens, teacher-forced) "
                            "instead of generating one; a leading space matters")
    add_check(parser, _check_prompts)


def _check_prompts(args: argparse.Namespace) -> None:
    if getattr(args, "target", None) == "":
        raise UsageError("--target is empty: give the answer text to explain")
    _check_one_source(args)
    args.prompts = [] if getattr(args, "loop", False) else read_prompts(args)


def _check_one_source(args: argparse.Namespace) -> None:
    given = [name for name, on in (("--loop", getattr(args, "loop", False)),
                                   ("--prompts-file", getattr(args, "prompts_file", None)),
                                   ("--stdin", getattr(args, "stdin", False)),
                                   ("a prompt", args.prompt)) if on]
    if len(given) > 1:
        raise UsageError(f"give --loop, --prompts-file, --stdin or a prompt, not several of "
                         f"them (got {' and '.join(given)})")


def read_prompts(args: argparse.Namespace) -> list[str]:
    """The prompts named by the prompt words, ``--prompts-file`` or ``--stdin``.

    Args:
        args (Namespace): Needs ``prompt``; ``prompts_file``, ``stdin`` and ``loop`` are
            optional (absent means not given).

    Returns:
        The non-blank prompts, stripped.

    Raises:
        UsageError: several prompt sources given, an unreadable or empty ``--prompts-file``,
            nothing on standard input, or an empty prompt.
    """
    _check_one_source(args)
    if getattr(args, "prompts_file", None):
        try:
            text = Path(args.prompts_file).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as err:
            raise UsageError(f"cannot read --prompts-file {args.prompts_file!r}: {err}") from err
        prompts = [line.strip() for line in text.splitlines() if line.strip()]
        if not prompts:
            raise UsageError(f"--prompts-file {args.prompts_file!r} holds no prompt: one per line")
        return prompts
    if getattr(args, "stdin", False):
        prompts = [line.strip() for line in sys.stdin.read().splitlines() if line.strip()]
        if not prompts:
            raise UsageError("--stdin read no prompt: give one prompt per line")
        return prompts
    prompt = " ".join(args.prompt).strip()
    if not prompt:
        more = ", --stdin, --prompts-file or --loop" if hasattr(args, "stdin") else " to explain"
        raise UsageError(f"the prompt is empty: give a prompt{more}")
    return [prompt]


def add_output_options(parser: argparse.ArgumentParser, json_help: str, plot_help: str) -> None:
    """Add ``--json`` and ``--plot``.

    Both paths must be writable files, ``--plot`` of a kind matplotlib writes.

    Args:
        parser (ArgumentParser): A command's parser.
        json_help (str): Help of ``--json``.
        plot_help (str): Help of ``--plot``.
    """
    parser.add_argument("--json", dest="json_path", default=None, metavar="PATH",
                        help=json_help)
    parser.add_argument("--plot", dest="plot_path", default=None, metavar="PATH",
                        help=plot_help)
    add_check(parser, _check_output_paths)


def _check_output_paths(args: argparse.Namespace) -> None:
    for option, path in (("--json", args.json_path), ("--plot", args.plot_path)):
        if not path:
            continue
        target = Path(path)
        if target.is_dir():
            raise UsageError(f"{option} {path!r} is a folder: give a file path")
        if not target.parent.is_dir():
            raise UsageError(f"{option} {path!r}: the folder {str(target.parent)!r} does not exist")
        if not os.access(target if target.exists() else target.parent, os.W_OK):
            raise UsageError(f"{option} {path!r} cannot be written: permission denied")
        if option == "--plot":
            from matplotlib.figure import Figure

            kinds = Figure().canvas.get_supported_filetypes()
            if target.suffix.lstrip(".").lower() not in kinds:
                raise UsageError(
                    f"--plot {path!r}: use one of the extensions {', '.join(sorted(kinds))}"
                )
