"""From text to token ids: chat template, prompt ids, target ids, readable token labels.

Everything here is tokenizer-side: the exact text the model sees (``render_prompt``, with the
chat template's variables recorded and pinnable), the prompt's ids without a trailing end
token that some tokenizers append, target strings as ids (a leading space matters), and
labels for tokens that are not printable on their own (pieces of one UTF-8 character).
"""

from __future__ import annotations

import re
import warnings
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Iterator, Optional, Sequence

import torch

from captum_iglens._utils.typing import is_int

__all__ = [
    "RenderedPrompt",
    "check_prompt_type",
    "build_prompt_ids",
    "decode_token",
    "padded_vocab_rows",
    "render_prompt",
    "target_ids",
    "target_token_id",
    "target_token_ids",
    "template_uses_clock",
    "token_labels",
    "pinned_clock",
]

#: Chat-template names through which a template reads the clock (Llama-3.1/3.2, Granite 3.x).
_CLOCK = re.compile(r"strftime_now|date_string|now\(\)")


@dataclass(frozen=True)
class RenderedPrompt:
    """The exact prompt the model sees.

    Attributes:
        text (str): The rendered text (chat template applied, or the raw prompt).
        ids (list[int]): Its token ids (no end token appended).
        chat_template_used (bool): Whether the chat template wrapped the prompt.
        uses_clock (bool): The template writes today's date and no date was pinned.
    """

    text: str
    ids: list[int]
    chat_template_used: bool
    uses_clock: bool = False


def template_uses_clock(tokenizer: Any) -> bool:
    """Whether the tokenizer's chat template reads the clock (writes today's date)."""
    template = getattr(tokenizer, "chat_template", None)
    texts = template.values() if isinstance(template, dict) else [template or ""]
    return any(_CLOCK.search(str(t)) for t in texts)


#: The form of a pinned date, as Llama-3.1-style templates write it ("26 Jul 2024").
DATE_FORMAT = "%d %b %Y"


@contextmanager
def pinned_clock(date_string: Optional[str]) -> Iterator[None]:
    """Make a chat template's ``strftime_now`` read ``date_string`` instead of the clock.

    Llama-3.1-style templates take the date from their ``date_string`` variable; others
    (Granite-3.1, Mistral-Small-3.1, SmolLM3 style) call ``strftime_now`` directly, which a
    variable cannot reach. transformers' ``strftime_now`` calls ``datetime.now()`` of its
    module at render time: inside this block that returns the pinned date (noon, local
    time), so both kinds of template write it, in any ``strftime`` format.

    Args:
        date_string (str, optional): ``"DD Mon YYYY"`` (e.g. ``"26 Jul 2024"``); ``None``
            leaves the clock alone.

    Raises:
        ValueError: a date not in that form.
    """
    if date_string is None:
        yield
        return
    try:
        day = datetime.strptime(str(date_string), DATE_FORMAT).replace(hour=12)
    except ValueError as err:
        raise ValueError(f"date_string={date_string!r} is not a date like '26 Jul 2024' "
                         "(day, month abbreviation, year).") from err
    from transformers.utils import chat_template_utils

    class _Pinned(datetime):
        @classmethod
        def now(cls, tz: Any = None) -> datetime:  # type: ignore[override]  # noqa: D102
            return day if tz is None else day.replace(tzinfo=tz)

    saved = chat_template_utils.datetime
    chat_template_utils.datetime = _Pinned  # type: ignore[misc]  # the template's clock, pinned
    try:
        yield
    finally:
        chat_template_utils.datetime = saved  # type: ignore[misc]  # the module's own clock back


def _nonempty(ids: list[int], prompt: str) -> list[int]:
    if not ids:
        raise ValueError(
            f"The tokenizer turned the prompt {prompt[:40]!r} into no tokens: is it the model's "
            "own tokenizer, with its vocabulary files?"
        )
    return ids


def _without_appended_eos(tokenizer: Any, ids: list[int], text: str) -> list[int]:
    """Drop an end token the tokenizer appended (``add_eos_token=True``) to a raw prompt."""
    eos, eos_text = getattr(tokenizer, "eos_token_id", None), getattr(tokenizer, "eos_token", "")
    if len(ids) > 1 and eos is not None and ids[-1] == eos and not (
        eos_text and text.rstrip().endswith(eos_text)
    ):
        return ids[:-1]
    return ids


def render_prompt(
    tokenizer: Any,
    prompt: str,
    chat_template: bool = True,
    template_kwargs: Optional[dict[str, Any]] = None,
) -> RenderedPrompt:
    """The exact text and ids of ``prompt``, in the chat template when the tokenizer has one.

    Args:
        tokenizer: The model's tokenizer.
        prompt (str): The user's prompt.
        chat_template (bool, optional): Apply the chat template. Default: True.
        template_kwargs (dict, optional): Variables for the chat template, e.g.
            ``{"date_string": "26 Jul 2024"}`` to pin a template that writes today's date.

    Returns:
        RenderedPrompt: text, ids (an end token appended by the tokenizer is removed, so the
        explained prediction follows the prompt's last real token), whether the template was
        used and whether it reads the clock.

    Warns:
        UserWarning: no chat template (the raw prompt is used), a template that writes
            today's date without ``date_string`` pinned, or a pinned ``date_string`` that a
            template without a date cannot use. A pin reaches templates that read the
            variable and those that call ``strftime_now`` (:func:`pinned_clock`).

    Raises:
        ValueError: an empty prompt, or a tokenizer that turns it into no tokens.
    """
    if not isinstance(prompt, str) or not prompt.strip():
        raise ValueError("The prompt is empty: give some text to explain.")
    if chat_template and getattr(tokenizer, "chat_template", None):
        pinned = dict(template_kwargs or {})
        if "date_string" in pinned and not template_uses_clock(tokenizer):
            warnings.warn(f"date_string={pinned['date_string']!r} has no effect: this "
                          "tokenizer's chat template writes no date.", stacklevel=3)
        with pinned_clock(pinned.get("date_string")):
            text = tokenizer.apply_chat_template(
                [{"role": "user", "content": prompt}], tokenize=False,
                add_generation_prompt=True, **pinned,
            )
        clock = template_uses_clock(tokenizer) and "date_string" not in pinned
        if clock:
            warnings.warn(
                "The chat template writes today's date into the prompt: the same prompt gives "
                "other ids (and credits) on another day. Pin it with "
                "template_kwargs={'date_string': '26 Jul 2024'} (CLI: --template-date).",
                stacklevel=3,
            )
        ids = _nonempty(list(tokenizer(text, add_special_tokens=False)["input_ids"]), prompt)
        return RenderedPrompt(text, ids, True, clock)
    if chat_template:
        warnings.warn("The tokenizer has no chat template; explaining the raw prompt.",
                      stacklevel=3)
    ids = _without_appended_eos(tokenizer, list(tokenizer(prompt)["input_ids"]), prompt)
    return RenderedPrompt(prompt, _nonempty(ids, prompt), False)


def build_prompt_ids(
    tokenizer: Any, prompt: str, chat_template: bool = True
) -> tuple[list[int], bool]:
    """Token ids of ``prompt`` and whether the chat template was used (see :func:`render_prompt`).

    Raises:
        ValueError: if the prompt is empty or only white space.
    """
    rendered = render_prompt(tokenizer, prompt, chat_template)
    return rendered.ids, rendered.chat_template_used


def _tokenizer_size(tokenizer: Any) -> Optional[int]:
    try:
        return int(len(tokenizer))
    except TypeError:
        return None


def padded_vocab_rows(tokenizer: Any, ids: Sequence[int]) -> list[int]:
    """The ids in ``ids`` that no token has: rows ``>= len(tokenizer)`` of the vocabulary.

    A model whose embedding was resized with ``pad_to_multiple_of`` has more output rows
    than the tokenizer has tokens; the tokenizer decodes such an id to ``""``.
    """
    size = _tokenizer_size(tokenizer)
    return [] if size is None else [int(i) for i in ids if int(i) >= size]


def decode_token(tokenizer: Any, token_id: int) -> str:
    """``tokenizer.decode([token_id])``, or ``"<vocab row N: no token>"`` for a padded row."""
    if padded_vocab_rows(tokenizer, [token_id]):
        return f"<vocab row {int(token_id)}: no token>"
    return tokenizer.decode([token_id])


def token_labels(tokenizer: Any, ids: Sequence[int]) -> list[str]:
    """Readable labels of ``ids`` decoded one by one.

    A token that is part of one UTF-8 character decodes to ``"\ufffd"`` on its own; a run of
    such tokens that decodes to clean text together is labelled ``"<text 1/2>"``,
    ``"<text 2/2>"``; what stays unreadable is labelled with its id (``"<id 1234>"``); a
    padded vocabulary row, which no token has, ``"<vocab row 49157: no token>"``.
    """
    pieces = [decode_token(tokenizer, i) for i in ids]
    labels = list(pieces)
    t = 0
    while t < len(ids):
        if "\ufffd" not in pieces[t]:
            t += 1
            continue
        end = t + 1
        while end < len(ids) and "\ufffd" in pieces[end] and end - t < 4:
            end += 1
        joined = tokenizer.decode(list(ids[t:end]))
        for r in range(t, end):
            labels[r] = (f"<{joined} {r - t + 1}/{end - t}>" if "\ufffd" not in joined
                         else f"<id {int(ids[r])}>")
        t = end
    return labels


def target_ids(target: Any) -> list[int]:
    """Token ids given as an int, a sequence of ints or an integer tensor (never coerced)."""
    values = target.tolist() if isinstance(target, torch.Tensor) else target
    values = [values] if is_int(values) else list(values)
    if not values or not all(is_int(v) for v in values):
        raise TypeError(f"target must be text or integer token ids, got {target!r}")
    return [int(v) for v in values]


def _describe_ids(tokenizer: Any, ids: Sequence[int]) -> str:
    pieces = [tokenizer.decode([i]) for i in ids]
    return ", ".join(f"{i} ({piece!r})" for i, piece in zip(ids, pieces, strict=True))


def target_token_ids(tokenizer: Any, text: str) -> list[int]:
    """Token ids of a target string, without special tokens.

    A leading space matters: ``" Paris"`` and ``"Paris"`` are
    different tokens in byte-level BPE vocabularies, so the ids are what should be reported.

    Warns:
        UserWarning: ``text`` holds U+FFFD (decoded from a split UTF-8 character): its ids
            are not the ones it was decoded from.

    Raises:
        ValueError: if ``text`` is empty or tokenises to no token.
    """
    if not isinstance(text, str) or not text:
        raise ValueError("The target string is empty: give the text of the token to explain.")
    if "\ufffd" in text:
        warnings.warn(
            f"The text {text[:40]!r} holds U+FFFD replacement characters: it was decoded from "
            "tokens that split a UTF-8 character, and tokenising it again gives other ids. To "
            "re-run an answer exactly, pass its token ids (answer_ids in a run record, or "
            "target=[ids]).", stacklevel=3)
    ids = list(tokenizer(text, add_special_tokens=False)["input_ids"])
    if not ids:
        raise ValueError(f"The target {text!r} tokenises to no token.")
    return ids


def target_token_id(tokenizer: Any, text: str) -> int:
    """The single token id of ``text``, for ``IGLens.attribute(target=...)``.

    Raises:
        ValueError: if ``text`` tokenises to several tokens; the message lists their ids and
            pieces, and points to ``explain(..., target=text)``, which explains each of them
            as a teacher-forced answer. Mind the leading space: ``" Paris"`` vs ``"Paris"``.
    """
    ids = target_token_ids(tokenizer, text)
    if len(ids) != 1:
        raise ValueError(
            f"The target {text!r} tokenises to {len(ids)} tokens: {_describe_ids(tokenizer, ids)}. "
            "IG-Lens explains one token id at a time: pass one of these ids as target, or use "
            "explain(model, tokenizer, prompt, target=text) to explain each token of it in "
            "turn. A leading space gives a different token (' Paris' vs 'Paris')."
        )
    return ids[0]


def check_prompt_type(prompt: object) -> None:
    """Refuse a prompt that is not text (token ids, a tensor), naming what to call instead.

    Raises:
        TypeError: ``prompt`` is neither a str nor a sequence of str.
    """
    if isinstance(prompt, str) or (isinstance(prompt, (list, tuple))
                                   and all(isinstance(p, str) for p in prompt)):
        return
    shape = getattr(prompt, "shape", None)
    got = (f"a {type(prompt).__name__} of shape {tuple(shape)}" if shape is not None
           else f"{type(prompt).__name__} {prompt!r:.60}")
    raise TypeError(
        f"explain(model, tokenizer, prompt) takes the prompt as text (a str, or a list of str), "
        f"got {got}. To explain token ids, use IGLens(model).attribute(input_ids, target=...); "
        "or decode them first: explain(model, tokenizer, tokenizer.decode(input_ids[0])).")
