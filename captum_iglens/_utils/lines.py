r"""Lines of a dataset file as its format defines them, and text that cannot be encoded.

:meth:`str.splitlines` breaks at every Unicode line boundary (U+2028, U+2029, U+0085,
``\x0b``, ``\x0c``, ``\x1c``-``\x1e``), not only at ``"\n"``: a prompt holding one of
them became two records, and a valid JSON line holding a raw U+2028 inside a string became
two halves that are not JSON. JSON Lines (https://jsonlines.org) and POSIX text files end a
line at ``"\n"`` only; ``"\r\n"`` is a line end too (the trailing ``"\r"`` is dropped).
"""

from __future__ import annotations

from typing import Optional

__all__ = ["split_lines", "surrogate_problem"]


def split_lines(text: str) -> list[str]:
    r"""The lines of ``text``, split at ``"\n"`` only (a trailing ``"\r"`` dropped).

    Args:
        text (str): A file's text.

    Returns:
        list[str]: the lines without their line ends; U+2028, U+2029, U+0085, form feeds and
        the other Unicode line boundaries stay inside their line. A final line end does not
        start an empty last line.
    """
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    return [line[:-1] if line.endswith("\r") else line for line in lines]


def surrogate_problem(text: str, name: str) -> Optional[str]:
    r"""Why ``text`` cannot be tokenised because it holds a lone surrogate; None if it can.

    A JSON escape such as ``"\ud83d"`` without its pair decodes to a lone UTF-16 surrogate,
    which is no character: it cannot be encoded as UTF-8, and tokenizers refuse it with a
    bare type error.

    Args:
        text (str): The text.
        name (str): What the text is (``"the prompt"``, ``"\"answer\""``), for the message.

    Returns:
        str or None: the problem, naming the code point and where it is.
    """
    for place, char in enumerate(text):
        if "\ud800" <= char <= "\udfff":
            return (f"{name} holds a lone surrogate U+{ord(char):04X} at character {place} "
                    f"(an unpaired \\u{ord(char):04x} escape), which is not text: write the "
                    "character itself, or both halves of its surrogate pair")
    return None
