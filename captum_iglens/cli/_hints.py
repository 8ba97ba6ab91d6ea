"""Hints for an option the command does not take: which command takes it, or a near miss.

``iglens explain --batch-size 4 PROMPT`` gets argparse's ``unrecognized arguments:
--batch-size``; the hint adds that ``--batch-size`` is an option of ``iglens run``, and a
mistyped option gets the closest of the command's own (:func:`difflib.get_close_matches`).
"""

from __future__ import annotations

import difflib
import re

from captum_iglens.cli._common import Parser
from captum_iglens.cli._registry import COMMANDS

__all__ = ["with_option_hints"]

_CUTOFF = 0.6


def _options(command: str) -> set[str]:
    parser = Parser(prog=f"iglens {command}", add_help=True)
    COMMANDS[command].add_arguments(parser)
    return {flag for action in parser._actions for flag in action.option_strings}


def with_option_hints(message: str, command: str) -> str:
    """``message`` with a hint for every ``--option`` that ``command`` does not take.

    Args:
        message (str): argparse's error message (``unrecognized arguments: ...``).
        command (str): The command whose parser refused them.

    Returns:
        str: the message, followed by which command takes each option, or the closest of
        ``command``'s own options; unchanged for other messages.
    """
    found = re.fullmatch(r"unrecognized arguments: (.*)", message)
    if not found or command not in COMMANDS:
        return message
    own = _options(command)
    hints = []
    for token in found.group(1).split():
        flag = token.split("=", 1)[0]
        if not flag.startswith("--"):
            continue
        owners = [name for name in COMMANDS if name != command and flag in _options(name)]
        close = difflib.get_close_matches(flag, sorted(own), n=1, cutoff=_CUTOFF)
        if owners:
            where = " and ".join(f"'iglens {name}'" for name in owners)
            hints.append(f"{flag} is an option of {where}, not of 'iglens {command}'")
        elif close:
            hints.append(f"{flag}: did you mean {close[0]}?")
    if not hints:
        return message
    return f"{message}; {'; '.join(hints)} (see 'iglens {command} --help')"
