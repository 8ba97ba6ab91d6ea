"""The one registry of ``iglens`` commands: name -> leaf module.

A leaf module defines ``HELP`` (one line for ``iglens --help``), ``DESCRIPTION`` and
``EXIT_STATUS`` (what each exit status means for it; both for ``iglens NAME --help``),
``add_arguments(parser)`` (its options, built from the option groups of
:mod:`captum_iglens.cli._options`, which also register their checks) and ``run(args) -> int``
(load the model, compute, print; it gets arguments that have already passed every check).
Adding a command is one row in :data:`COMMANDS` plus its leaf module.
"""

from __future__ import annotations

import argparse
from typing import Protocol

from captum_iglens.cli import benchmark, compare, explain, fit_lens, run, summarize, validate

__all__ = ["COMMANDS", "DEFAULT_COMMAND", "Command"]


class Command(Protocol):
    """What the router needs from a leaf module."""

    HELP: str
    DESCRIPTION: str
    EXIT_STATUS: str

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        """Add the command's options to its parser."""

    def run(self, args: argparse.Namespace) -> int:
        """Run the command on checked arguments; return the exit status."""


#: Command name -> leaf module, in the order ``iglens --help`` lists them.
COMMANDS: dict[str, Command] = {
    "explain": explain,
    "compare": compare,
    "validate": validate,
    "run": run,
    "summarize": summarize,
    "benchmark": benchmark,
    "fit-lens": fit_lens,
}

#: The command that ``iglens PROMPT ...`` (no command name first) runs.
DEFAULT_COMMAND = "explain"
