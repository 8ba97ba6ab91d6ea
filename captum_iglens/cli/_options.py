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
from pathlib import Path
from typing import TYPE_CHECKING, Optional

from captum_iglens.cli._common import UsageError, add_check, at_least, run_checks
from captum_iglens.cli._template_date import (
    check_template_date,
    parse_template_date,
    warn_unused_template_date,
)

if TYPE_CHECKING:
    from captum_iglens.settings import AttributionSettings, GenerationSettings, ReportSettings

__all__ = [
    "attribution_settings",
    "generation_settings",
    "report_settings",
    "DEFAULT_MODEL",
    "add_check",
    "add_estimator_options",
    "add_generation_options",
    "add_model_options",
    "add_output_options",
    "add_result_options",
    "at_least",
    "run_checks",
    "warn_unused_template_date",
]

DEFAULT_MODEL = "smollm2"


def add_model_options(parser: argparse.ArgumentParser) -> None:
    """``--model`` (default: the embedded SmolLM2; a path must exist) and ``--no-progress``."""
    parser.add_argument(
        "--model",
        default=None,
        help=f"'{DEFAULT_MODEL}' (default, embedded), another model name (smollm2-135m-instruct, "
        "qwen2.5-coder-0.5b-instruct, qwen2.5-coder-1.5b-instruct, gemma-3-270m: installed from "
        "their part wheels), a local model folder or a .gguf file",
    )
    parser.add_argument("--no-progress", action="store_true",
                        help="no progress bars on stderr (they appear for work over 2 s)")
    add_check(parser, _check_model)


def _check_model(args: argparse.Namespace) -> None:
    from captum_iglens.models.facts import close_model_names
    from captum_iglens.models.registry import is_model_name, model_names

    spec = args.model
    if is_model_name(spec):
        return
    path = Path(spec).expanduser()
    if path.is_dir() or (path.is_file() and path.suffix == ".gguf"):
        return
    close = close_model_names(spec)
    hint = f": did you mean --model {' or --model '.join(close)}?" if close else ""
    raise UsageError(
        f"--model {spec!r} is neither a model name ({', '.join(model_names())}), a local model "
        f"folder nor a .gguf file (models are never downloaded: give a local path){hint}"
    )


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


def add_effect_option(parser: argparse.ArgumentParser) -> None:
    """``--effect``: readout credits (default), total-effect credits or attribution patching.

    With ``total`` or ``atp``, ``--baseline`` names the gates' reference (``mean`` or
    ``zero``; ``embedding`` is refused) and ``--heads`` is refused; ``--scope sequence``
    gates every position up to the token's (block granularity) and ``--grad-drop`` (with
    ``atp``) gives AtP*.
    """
    from captum_iglens.settings import DEFAULT_EFFECT, DEFAULT_SCOPE, EFFECTS, SCOPES

    parser.add_argument(
        "--effect", choices=EFFECTS, default=DEFAULT_EFFECT,
        help=f"what a credit measures (default: {DEFAULT_EFFECT}, what the final norm and "
        "unembedding read out of each block's output); total: each block's exact share of "
        "the change of p(token) when every block's update at the token's position goes to "
        "its reference (--baseline mean or zero); atp: attribution patching's first-order "
        "estimate per block (not a decomposition)")
    parser.add_argument(
        "--scope", choices=SCOPES, default=DEFAULT_SCOPE,
        help=f"with --effect total or atp: where the gates act (default: {DEFAULT_SCOPE}, "
        "the token's position); sequence: every position up to it, one gate per block "
        "(block granularity; at position i it costs about i + 1 times as much)")
    parser.add_argument("--grad-drop", action="store_true",
                        help="with --effect atp: AtP*'s GradDrop (Kramar et al. 2024), "
                        "recorded as method atp*")
    add_check(parser, _check_effect)


def add_lens_option(parser: argparse.ArgumentParser) -> None:
    """``--lens``: the per-layer readout (``logit``, the default, or a fitted lens)."""
    from captum_iglens.settings import DEFAULT_LENS, LENSES

    parser.add_argument(
        "--lens", choices=LENSES, default=DEFAULT_LENS,
        help=f"the per-layer readout (default: {DEFAULT_LENS}, the model's own final norm "
        "and unembedding at every layer); tuned or jacobian: the lens fitted for this model "
        "by `iglens fit-lens` (credits are then block terms, and lens_change holds the "
        "change of readout between layers)")
    add_check(parser, _check_lens)


def _check_lens(args: argparse.Namespace) -> None:
    """Refuse a fitted ``--lens`` with what it cannot read (IGLens's rule), before the load."""
    from captum_iglens.settings import DEFAULT_EFFECT, DEFAULT_GRANULARITY, DEFAULT_LENS

    if args.lens == DEFAULT_LENS:
        return
    effect = getattr(args, "effect", DEFAULT_EFFECT)
    granularity = getattr(args, "granularity", DEFAULT_GRANULARITY)
    if effect != DEFAULT_EFFECT:
        raise UsageError(f"--lens {args.lens} reads block outputs for readout credits: it "
                         f"cannot be used with --effect {effect} (drop one of them)")
    if granularity != DEFAULT_GRANULARITY or getattr(args, "heads", False):
        raise UsageError(f"--lens {args.lens} reads block outputs: it cannot be used with "
                         "--granularity sublayer or --heads (drop one of them)")


def _check_effect(args: argparse.Namespace) -> None:
    from captum_iglens.settings import DEFAULT_EFFECT, DEFAULT_GRANULARITY, DEFAULT_SCOPE

    effect, scope = args.effect, args.scope
    if args.grad_drop and (effect != "atp" or scope != DEFAULT_SCOPE):
        raise UsageError("--grad-drop (AtP*'s GradDrop) modifies attribution patching: use it "
                         "with --effect atp and --scope position")
    if effect == DEFAULT_EFFECT:
        if scope != DEFAULT_SCOPE:
            raise UsageError(f"--scope {scope} places the gates of --effect total or atp; "
                             "readout credits have none: add --effect total or atp")
        return
    from captum_iglens.settings import CAPTUM_METHODS, DEFAULT_METHOD, DEFAULT_N_STEPS

    method = getattr(args, "method", DEFAULT_METHOD)
    steps = getattr(args, "n_steps", DEFAULT_N_STEPS)
    if effect == "atp" and (method != DEFAULT_METHOD or steps != DEFAULT_N_STEPS):
        raise UsageError("--effect atp takes no --method or --n-steps: AtP is first-order "
                         "(one backward pass, no integration steps); drop them, or use "
                         "--effect total")
    if effect == "total" and method not in (DEFAULT_METHOD, *CAPTUM_METHODS):
        raise UsageError(f"--method {method} is a readout estimator: --effect total takes "
                         f"{DEFAULT_METHOD} (the exact step split) or one of "
                         f"{', '.join(CAPTUM_METHODS)}")
    granularity = getattr(args, "granularity", DEFAULT_GRANULARITY)
    if scope != DEFAULT_SCOPE and granularity != DEFAULT_GRANULARITY:
        raise UsageError(f"--scope {scope} gates whole blocks: sub-layer and head gates are "
                         "position-scope only (use --granularity block or --scope position)")
    from captum_iglens._core.baseline_rows import gate_references

    if args.baseline not in gate_references():
        raise UsageError(f"--effect {effect} gates block updates: --baseline must be "
                         f"{' or '.join(gate_references())} (the update's reference), not "
                         f"{args.baseline}")


def _check_method_steps(args: argparse.Namespace) -> None:
    from captum_iglens.settings import method_min_steps

    least = method_min_steps(args.method) or 1
    if args.n_steps < least:
        raise UsageError(f"--method {args.method} needs --n-steps >= {least}")


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


def attribution_settings(args: argparse.Namespace) -> AttributionSettings:
    """The :class:`~captum_iglens.settings.AttributionSettings` of a command's options.

    Built once, where the options enter the package: ``--method``, ``--n-steps``,
    ``--baseline``, ``--internal-batch-size`` and, where the command has them, ``--units``,
    ``--granularity``, ``--effect``, ``--heads``, ``--scope`` and ``--grad-drop`` (an
    option it lacks keeps its default).
    No torch import.
    """
    from captum_iglens.settings import AttributionSettings

    names = {"method": "method", "n_steps": "n_steps", "baselines": "baseline",
             "internal_batch_size": "internal_batch_size", "units": "units",
             "granularity": "granularity", "effect": "effect", "heads": "heads",
             "scope": "scope", "grad_drop": "grad_drop"}
    return AttributionSettings().updated(
        **{field: getattr(args, option, None) for field, option in names.items()})


def report_settings(args: argparse.Namespace) -> ReportSettings:
    """The report settings of ``--onset-frac``, ``--onset-rule``, ``--top-k`` (no torch)."""
    from captum_iglens.settings import ReportSettings

    return ReportSettings(args.onset_frac, args.onset_rule, args.top_k)


def generation_settings(args: argparse.Namespace) -> GenerationSettings:
    """The generation settings of ``--max-new-tokens``, ``--no-chat-template``, the date."""
    from captum_iglens.settings import GenerationSettings

    return GenerationSettings(args.max_new_tokens, not args.no_chat_template,
                              template_kwargs(args))
