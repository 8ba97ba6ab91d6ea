"""``--template-date``: the date a chat template writes into the prompt, checked and pinned.

Templates such as Llama 3.1's write ``date_string`` into the system prompt in the form
``26 Jul 2024`` (day, English month abbreviation, year), and today's date when it is not
given. The option takes a date in that form (checked while parsing, before anything is
loaded); once the tokenizer is loaded, :func:`warn_unused_template_date` says when the pin
has no effect.
"""

from __future__ import annotations

import argparse
import sys
import warnings
from datetime import datetime
from typing import Any

from captum_iglens.cli._common import UsageError

__all__ = ["DATE_FORMAT", "check_template_date", "parse_template_date",
           "warn_unused_template_date"]

#: The form of ``date_string`` in the chat templates that read it ("26 Jul 2024").
DATE_FORMAT = "%d %b %Y"
_EXAMPLE = "26 Jul 2024"


def parse_template_date(text: str) -> str:
    """An argparse ``type=``: a date as ``DD Mon YYYY``, returned in that exact form.

    Args:
        text (str): The option's text, e.g. ``"26 Jul 2024"`` or ``"5 jul 2024"``.

    Returns:
        str: the date written as the templates write it (``"05 Jul 2024"``).

    Raises:
        UsageError: text that is no such date (``"yesterday"``, ``"2024-07-26"``).
    """
    try:
        date = datetime.strptime(" ".join(text.split()), DATE_FORMAT)
    except ValueError as err:
        raise UsageError(
            f"--template-date {text!r} is not a date in the form the chat templates write: "
            f"day, month abbreviation, year, e.g. '{_EXAMPLE}'"
        ) from err
    return date.strftime(DATE_FORMAT)


parse_template_date.__name__ = "date"


def check_template_date(args: argparse.Namespace) -> None:
    """Refuse ``--template-date`` with ``--no-chat-template`` (no template writes the date).

    Raises:
        UsageError: both options are given.
    """
    if getattr(args, "template_date", None) and getattr(args, "no_chat_template", False):
        raise UsageError("--template-date pins the date the chat template writes: it has no "
                         "effect with --no-chat-template; drop one of them")


def _template_texts(tokenizer: Any) -> list[str]:
    template = getattr(tokenizer, "chat_template", None)
    return [str(t) for t in template.values()] if isinstance(template, dict) else (
        [template] if template else [])


def warn_unused_template_date(args: argparse.Namespace, tokenizer: Any) -> None:
    """Warn on stderr when ``--template-date`` cannot change the prompt of this model.

    The pin reaches a template through its ``date_string`` variable or its ``strftime_now``
    clock (:func:`~captum_iglens.text.prompts.pinned_clock`); a template with neither writes no
    date. The library's own warning of the same fact (``render_prompt``: "date_string=...
    has no effect") is then silenced for the rest of the command, so that it is said once.

    Args:
        args (Namespace): The checked arguments (``template_date`` may be absent).
        tokenizer: The loaded model's tokenizer.
    """
    from captum_iglens.text.prompts import template_uses_clock

    if not getattr(args, "template_date", None):
        return
    texts = _template_texts(tokenizer)
    if template_uses_clock(tokenizer):
        return  # the pin reaches date_string and strftime_now alike
    if not texts:
        why = "this model's tokenizer has no chat template"
    else:
        why = "this model's chat template writes no date"
    print(f"iglens: warning: --template-date {args.template_date!r} has no effect: {why}",
          file=sys.stderr)
    # said once: not again by render_prompt for every prompt (the router's catch_warnings
    # scopes this filter to the command)
    warnings.filterwarnings("ignore", message=r"date_string=.* has no effect",
                            category=UserWarning)
