"""The prompt options of the iglens commands: one prompt, a prompts file, or a text file."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from captum_iglens._utils.lines import split_lines
from captum_iglens.cli._common import UsageError, add_check


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
        prompts = [line.strip() for line in split_lines(text) if line.strip()]
        if not prompts:
            raise UsageError(f"--prompts-file {args.prompts_file!r} holds no prompt: one per line")
        return prompts
    if getattr(args, "stdin", False):
        prompts = [line.strip() for line in split_lines(sys.stdin.read()) if line.strip()]
        if not prompts:
            raise UsageError("--stdin read no prompt: give one prompt per line")
        return prompts
    prompt = " ".join(args.prompt).strip()
    if not prompt:
        more = ", --stdin, --prompts-file or --loop" if hasattr(args, "stdin") else " to explain"
        raise UsageError(f"the prompt is empty: give a prompt{more}")
    return [prompt]
