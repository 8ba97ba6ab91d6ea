"""Pieces every ``iglens`` command shares.

The usage error, the parser, the checks run before loading and the model loader.
"""

from __future__ import annotations

import argparse
import json
import sys
import textwrap
from typing import Any, Callable, NoReturn

__all__ = [
    "EXIT_INTERRUPTED",
    "EXIT_RUNTIME",
    "EXIT_USAGE",
    "Parser",
    "UsageError",
    "add_check",
    "at_least",
    "exit_status_help",
    "load",
    "model_device",
    "run_checks",
    "write_json",
]

EXIT_USAGE = 2
EXIT_RUNTIME = 1
EXIT_INTERRUPTED = 130


_HELP_WIDTH = 88


def exit_status_help(runtime: str, usage: str, success: str = "success",
                     interrupted: str = "interrupted (Ctrl-C)") -> str:
    """The ``exit status:`` block of a command's ``--help``: what each status means there.

    Args:
        runtime (str): When the command exits 1.
        usage (str): When it exits 2.
        success (str, optional): When it exits 0. Default: ``"success"``.
        interrupted (str, optional): When it exits 130. Default: ``"interrupted (Ctrl-C)"``.

    Returns:
        str: the block, one status per entry, wrapped to the help's width.
    """
    rows = [(0, success), (EXIT_RUNTIME, runtime), (EXIT_USAGE, usage),
            (EXIT_INTERRUPTED, interrupted)]
    lines = ["exit status:"]
    for code, text in rows:
        first, *rest = textwrap.wrap(text, _HELP_WIDTH - 7)
        lines += [f"  {code:<4} {first}", *(" " * 7 + line for line in rest)]
    lines.append("errors are one line 'iglens: error: ...'; IGLENS_DEBUG=1 shows a runtime "
                 "error's traceback")
    return "\n".join(lines)


class UsageError(Exception):
    """A mistake in the command line: printed as one ``iglens: error:`` line, exit status 2."""


class Parser(argparse.ArgumentParser):
    """An ``ArgumentParser`` that raises :class:`UsageError` instead of exiting.

    ``--help`` and ``--version`` still raise ``SystemExit(0)``; the router turns that into the
    exit status.
    """

    def error(self, message: str) -> NoReturn:
        """Raise a :class:`UsageError` carrying argparse's ``message``.

        Raises:
            UsageError: always.
        """
        raise UsageError(message)


def load(model: str | None, device_map: str | None = None) -> tuple[Any, Any]:
    """Load the model and its tokenizer quietly (one progress line on stderr).

    Args:
        model (str, optional): ``--model``: ``None`` or ``"smollm2"`` for the embedded
            SmolLM2-135M-Instruct, a local model folder or a ``.gguf`` file. Default: None.
        device_map (str, optional): ``--device-map`` for a model folder (e.g. ``"auto"``).

    Returns:
        (model, tokenizer)

    Raises:
        Exception: whatever :func:`captum_iglens.models.loading.load_model` raises (a runtime error,
            exit status 1).
    """
    from transformers.utils import logging as hf_logging

    from captum_iglens.models import loading as models

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    print(f"loading {model or 'smollm2 (embedded SmolLM2-135M-Instruct)'} ...", file=sys.stderr)
    return models.load_model(model, device_map=device_map)


def model_device(model: Any) -> Any:
    """The device of the model's first parameter that is not on ``meta`` (else the CPU).

    Models dispatched by accelerate keep offloaded weights on ``meta``; the first real
    parameter tells where the token ids should go.

    Args:
        model (nn.Module): The loaded model.

    Returns:
        torch.device
    """
    import torch

    for param in model.parameters():
        if param.device.type != "meta":
            return param.device
    return torch.device("cpu")


def write_json(path: str, payload: Any) -> None:
    """Write ``payload`` as indented JSON to ``path`` and say so on stderr.

    Args:
        path (str): The ``--json`` path (checked before loading).
        payload: JSON-serialisable data.

    Raises:
        OSError: if the file cannot be written (a runtime error, exit status 1).
    """
    with open(path, "w", encoding="utf-8") as handle:
        json.dump(payload, handle, indent=2)
    print(f"wrote {path}", file=sys.stderr)


Check = Callable[[argparse.Namespace], None]
_CHECKS = "_checks"


def add_check(parser: argparse.ArgumentParser, check: Check) -> None:
    """Register ``check(args)`` to run on ``parser``'s arguments before the model is loaded.

    Args:
        parser (ArgumentParser): A command's parser.
        check (callable): Raises :class:`UsageError` on a bad command line; may normalise
            ``args`` in place.
    """
    parser.set_defaults(**{_CHECKS: (*(parser.get_default(_CHECKS) or ()), check)})


def run_checks(args: argparse.Namespace) -> None:
    """Run the checks registered on the parser that produced ``args``, in order.

    Raises:
        UsageError: from the first check that fails.
    """
    for check in getattr(args, _CHECKS, ()):
        check(args)


def at_least(minimum: int, option: str) -> Callable[[str], int]:
    """An argparse ``type=``: an int that is ``>= minimum``.

    Args:
        minimum (int): Smallest allowed value.
        option (str): Option name, for the message.

    Returns:
        A parser of the option's text. Text that is no int gives argparse's own
        ``invalid int value`` error; a smaller int raises :class:`UsageError`.
    """

    def parse(text: str) -> int:
        value = int(text)
        if value < minimum:
            raise UsageError(f"{option} must be >= {minimum}, got {value}")
        return value

    parse.__name__ = "int"
    return parse
