"""The ``iglens`` command line: a router over the commands of the registry.

    iglens explain "What is the capital of Vietnam?"     # or: iglens "What is ...?"
    iglens compare --k 4 "What is the capital of Vietnam?"
    iglens --help | --version

The router parses the command line, runs every check registered by the command's option
groups (all before the model is loaded), then calls the command's ``run``. It turns errors
into one-line messages and exit statuses (see :data:`EXIT_STATUS_HELP`).
"""

from __future__ import annotations

import argparse
import difflib
import os
import re
import sys
import textwrap
import warnings
from typing import Optional, Sequence

from captum_iglens._utils.progress import progress_bars
from captum_iglens.cli._common import (
    EXIT_INTERRUPTED,
    EXIT_RUNTIME,
    EXIT_USAGE,
    Parser,
    UsageError,
    exit_status_help,
    run_checks,
)
from captum_iglens.cli._prompt_options import read_prompts
from captum_iglens.cli._registry import COMMANDS, DEFAULT_COMMAND

__all__ = ["COMMANDS", "UsageError", "build_parser", "main", "parse_args", "read_prompts"]


def __getattr__(name: str) -> type[UsageError]:
    """``CliError``: the former name of :class:`UsageError`, deprecated (removed in 0.4.0)."""
    if name == "CliError":
        warnings.warn("captum_iglens.cli.CliError is now captum_iglens.cli.UsageError; import "
                      "that (this alias will be removed in 0.4.0)", DeprecationWarning,
                      stacklevel=2)
        return UsageError
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

EXIT_STATUS_HELP = exit_status_help(
    runtime="runtime error: the model could not be loaded, the computation failed or an "
    "output could not be written",
    usage="usage error: something is wrong in the command line; found before the model is "
    "loaded, except what only the model can tell ('iglens COMMAND --help' says what, for each "
    "command)",
)

_SHORTHAND_HELP = f"""\
'iglens PROMPT ...' is short for 'iglens {DEFAULT_COMMAND} PROMPT ...'. Options go after the
command: 'iglens compare --k 4 PROMPT'. A prompt whose first word is (or looks like) a
command name needs the command: 'iglens {DEFAULT_COMMAND} compare these two'.

"""

#: What an interrupted command leaves (after "iglens: interrupted"): ``run`` resumes, the
#: others write their outputs at the end and start over.
_RESUME = {
    "run": ": the records already in the results file are kept; re-run the same command to "
           "resume",
}
_NO_RESUME = ": this command does not resume; re-run it to start over"

_TOP_LEVEL = ("-h", "--help", "--version")
_NEAR_MISS_CUTOFF = 0.8
_WIDTH = 88


def build_parser() -> argparse.ArgumentParser:
    """The ``iglens`` parser: ``--version`` and one sub-parser per registered command.

    Returns:
        ArgumentParser whose ``error`` raises :class:`UsageError`.
    """
    from captum_iglens import __version__

    parser = Parser(
        prog="iglens",
        description=textwrap.fill(
            "IG-Lens: exact additive attribution of each answer token's probability to the "
            "decoder layers of a causal LM (arXiv:2606.29693), and its comparison with "
            "Captum's layer methods. Runs offline on the embedded SmolLM2-135M-Instruct by "
            "default.", _WIDTH),
        epilog=_SHORTHAND_HELP + EXIT_STATUS_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    commands = parser.add_subparsers(dest="command", title="commands", metavar="COMMAND")
    for name, leaf in COMMANDS.items():
        leaf.add_arguments(commands.add_parser(
            name, help=leaf.HELP, description=textwrap.fill(leaf.DESCRIPTION, _WIDTH),
            epilog=leaf.EXIT_STATUS,
            formatter_class=argparse.RawDescriptionHelpFormatter,
        ))
    return parser


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    """Parse and check ``argv``; nothing is loaded.

    Args:
        argv (sequence of str): The arguments after ``iglens``.

    Returns:
        The checked arguments; ``args.command`` names the command.

    Raises:
        UsageError: anything wrong in the command line (unknown or misplaced command, bad
            option value, options that exclude each other, unwritable output path, ...).
        SystemExit: after printing ``--help`` or ``--version`` (status 0).
    """
    argv = list(argv)
    parser = build_parser()
    command = argv[0] if argv[:1] and argv[0] in COMMANDS else DEFAULT_COMMAND
    try:
        if argv[:1] and (argv[0] in COMMANDS or argv[0] in _TOP_LEVEL):
            args = parser.parse_args(argv)
        else:
            args = _parse_shorthand(parser, argv)
    except UsageError as err:
        from captum_iglens.cli._hints import with_option_hints

        raise UsageError(with_option_hints(str(err), command)) from None
    run_checks(args)
    return args


def _parse_shorthand(parser: argparse.ArgumentParser, argv: list[str]) -> argparse.Namespace:
    """Parse ``iglens PROMPT ...`` as ``iglens explain PROMPT ...``.

    Raises:
        UsageError: a mistyped command as the first word, a command name after options, or
            any other mistake.
    """
    close = _near_miss(argv[0] if argv else "")
    if close:
        raise UsageError(f"unknown command {argv[0]!r}; did you mean {close!r}?")
    try:
        args = parser.parse_args([DEFAULT_COMMAND, *argv])
    except UsageError:
        misplaced = next((word for word in argv if word in COMMANDS), None)
        if misplaced is not None and _parses(parser, misplaced, argv):
            raise _misplaced(misplaced) from None
        raise
    first = args.prompt[0] if args.prompt else ""
    if first in COMMANDS:
        raise _misplaced(first)
    close = _near_miss(first) if argv and argv[0].startswith("-") else None
    if close:  # `iglens --k 4 explian PROMPT`: a mistyped command after the options
        raise UsageError(f"unknown command {first!r}; did you mean {close!r}? (put the command "
                         f"first: 'iglens {close} [options] PROMPT'; a prompt that starts with "
                         f"{first!r} needs it too: 'iglens {DEFAULT_COMMAND} [options] {first} "
                         "...')")
    return args


def _near_miss(word: str) -> Optional[str]:
    """The command that ``word`` looks like a typo of; None if none, or not lower case."""
    if not re.fullmatch(r"[a-z][a-z-]*", word):
        return None
    close = difflib.get_close_matches(word, COMMANDS, n=1, cutoff=_NEAR_MISS_CUTOFF)
    return close[0] if close else None


def _parses(parser: argparse.ArgumentParser, command: str, argv: list[str]) -> bool:
    """Whether ``argv`` parses once ``command`` is moved to the front."""
    rest = list(argv)
    rest.remove(command)
    try:
        parser.parse_args([command, *rest])
    except UsageError:
        return False
    return True


def _misplaced(command: str) -> UsageError:
    return UsageError(
        f"put the command first: 'iglens {command} [options] PROMPT' (options before "
        f"{command!r} are not allowed)"
    )


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Entry point of the ``iglens`` console script and of ``python -m captum_iglens``.

    Args:
        argv (sequence of str, optional): The arguments after ``iglens``. Default: None
            (``sys.argv[1:]``).

    Returns:
        The exit status: 0 success, 1 runtime error, 2 usage error, 130 interrupted.

    Raises:
        Exception: a runtime error, only when the environment sets ``IGLENS_DEBUG``.
    """
    argv = list(sys.argv[1:] if argv is None else argv)
    command = ""
    with warnings.catch_warnings():
        warnings.showwarning = _one_line_warning
        try:
            try:
                args = parse_args(argv)
            except SystemExit as done:  # --help, --version
                return done.code if isinstance(done.code, int) else 0
            command = args.command
            with progress_bars(not getattr(args, "no_progress", False)):
                return COMMANDS[command].run(args)
        except UsageError as err:
            print(f"iglens: error: {err}", file=sys.stderr)
            return EXIT_USAGE
        except KeyboardInterrupt:
            print(f"iglens: interrupted{_RESUME.get(command, _NO_RESUME)}", file=sys.stderr)
            return EXIT_INTERRUPTED
        except BrokenPipeError:  # `iglens ... | head`: the reader left, which is fine
            _silence_stdout()
            return 0
        except Exception as err:
            if os.environ.get("IGLENS_DEBUG"):
                raise
            print(f"iglens: error: {_one_line(err)}", file=sys.stderr)
            return EXIT_RUNTIME


def _silence_stdout() -> None:
    """Point stdout at /dev/null so that Python's exit flush does not fail on the pipe."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):  # stdout is not a file (a test's capture)
        pass
    finally:
        os.close(devnull)


def _one_line(err: Exception) -> str:
    """The first line of ``err``; its type too when it is not an everyday error."""
    message = str(err).splitlines()[0] if str(err) else ""
    expected = (ValueError, TypeError, OSError, RuntimeError, ArithmeticError)
    if not isinstance(err, expected):
        message = f"{type(err).__name__}: {message} (IGLENS_DEBUG=1 shows the traceback)"
    return message or type(err).__name__


def _one_line_warning(message: Warning | str, category: type, *_: object, **__: object) -> None:
    print(f"iglens: warning: {message}", file=sys.stderr)
