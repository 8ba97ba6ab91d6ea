"""Input records of a dataset run: one prompt (or one document) each, read from a file.

A ``.jsonl`` file holds one JSON object per line::

    {"id": "q1", "prompt": "What is the capital of Vietnam?"}
    {"id": "q2", "prompt": "The capital of France is", "answer": " Paris"}
    {"id": "q3", "prompt": "2 + 2 =", "target": [604], "contrast": " 5"}
    {"id": "d1", "text": "A whole paragraph, every next-token prediction explained."}

- ``id`` (str or int; default: the line number, from 1) names the record in the output;
  ids are unique within a file.
- ``prompt``: answered greedily, then every answer token is explained; or ``text``: a
  document whose next-token predictions are explained (teacher forcing). One of the two.
- ``answer`` (str) or ``target`` (str or token ids): teacher-force this answer instead of
  generating one.
- ``contrast`` (str or token ids): the foil of a contrastive explanation, one token for every
  answer token or one per answer token.
- ``positions`` (list of int): prompt records: which answer tokens to report (indices into
  the answer, negative from its end); text records: which positions' predictions to explain.
- Any other keys are carried to the output under ``"meta"``.

A ``.ndjson`` file (any case of either suffix) is read the same way. Any other file is read as
plain text, one prompt per line (blank lines skipped), ids the line numbers; a line there
that is a JSON record is refused (the file was meant as JSON lines). A line that cannot be
read gets the id ``"line-<number>"``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional, Union

from captum_iglens._utils.lines import split_lines, surrogate_problem

__all__ = [
    "FIELDS", "JSONL_SUFFIXES", "Record", "read_document", "read_records"]

#: File suffixes read as JSON lines (any case); other files hold one prompt a line.
JSONL_SUFFIXES = (".jsonl", ".ndjson")

#: The keys a JSON record may have; others are carried under ``"meta"``.
FIELDS = ("id", "prompt", "text", "answer", "answer_ids", "target", "contrast", "positions")

RecordId = Union[str, int]


@dataclass
class Record:
    """One input record.

    Attributes:
        index (int): Its place in the input, from 0; the output is sorted by it.
        id (str or int): Its id (unique in the input).
        prompt (str, optional): A prompt to answer (or to teacher-force ``answer``/``target``).
        text (str, optional): A document to explain at every position (or ``positions``).
        answer (str, optional): Teacher-forced answer text.
        answer_ids (list[int], optional): Teacher-forced answer as token ids: re-runs a
            result exactly (its ``answer_ids``), where the decoded text may not re-tokenise
            to the same ids (a UTF-8 character split across tokens decodes to U+FFFD).
        target (optional): Teacher-forced answer as text or token ids.
        contrast (optional): Foil text or token ids.
        positions (list[int], optional): Answer tokens (prompt records) or positions (text).
        meta (dict): The record's other keys.
        error (str, optional): Why the record cannot be run (it becomes an error record).
    """

    index: int
    id: RecordId
    prompt: Optional[str] = None
    text: Optional[str] = None
    answer: Optional[str] = None
    answer_ids: Optional[list[int]] = None
    target: Any = None
    contrast: Any = None
    positions: Optional[list[int]] = None
    meta: dict[str, Any] = field(default_factory=dict)
    error: Optional[str] = None

    @property
    def is_document(self) -> bool:
        """A text record (document mode), not a prompt record."""
        return self.text is not None


def _is_int_list(value: Any) -> bool:
    return isinstance(value, list) and all(isinstance(v, int) and not isinstance(v, bool)
                                           for v in value)


def _problem(data: dict[str, Any]) -> Optional[str]:
    """What is wrong with a JSON record, or None."""
    has_prompt, has_text = data.get("prompt") is not None, data.get("text") is not None
    if has_prompt == has_text:
        return "a record needs exactly one of \"prompt\" and \"text\""
    body = data.get("prompt") if has_prompt else data.get("text")
    name = "prompt" if has_prompt else "text"
    if not isinstance(body, str):
        return f"\"{name}\" must be text (a JSON string), got {type(body).__name__} {body!r:.40}"
    if not body.strip():
        return f"the {name} is empty: give some text"
    for key in (name, "answer", "target", "contrast"):
        value = data.get(key)
        broken = surrogate_problem(value, f"\"{key}\"") if isinstance(value, str) else None
        if broken:
            return broken
    given = [k for k in ("answer", "answer_ids", "target") if data.get(k) is not None]
    if len(given) > 1:
        return f"give one of \"answer\", \"answer_ids\" and \"target\", not {given}"
    if has_text and given:
        return ("a text record explains its own next tokens: drop "
                "\"answer\"/\"answer_ids\"/\"target\"")
    return _field_problem(data)


def _field_problem(data: dict[str, Any]) -> Optional[str]:
    """What is wrong with the optional fields' types, or None."""
    ids = data.get("answer_ids")
    if ids is not None and (not _is_int_list(ids) or not ids):
        return "\"answer_ids\" must be a non-empty list of token ids (ints)"
    if data.get("answer") is not None and not isinstance(data["answer"], str):
        return "\"answer\" must be text"
    for key in ("target", "contrast"):
        value = data.get(key)
        if value is not None and not (isinstance(value, str) or _is_int_list(value)
                                      or (isinstance(value, int) and not isinstance(value, bool))):
            return f"\"{key}\" must be text or token ids (an int or a list of ints)"
    positions = data.get("positions")
    if positions is not None and (not _is_int_list(positions) or not positions):
        return "\"positions\" must be a non-empty list of ints"
    return None


def _record(index: int, number: int, line: str) -> Record:
    """Record ``index`` from line ``number`` (its default id)."""
    broken = f"line-{number}"  # the id of a line that cannot be read: no user id clashes
    try:
        data = json.loads(line)
    except json.JSONDecodeError as err:
        return Record(index, broken, error=f"line {number} is not JSON: {err}")
    if not isinstance(data, dict):
        return Record(index, broken, error=f"line {number} is not a JSON object")
    rid = data.get("id", number)
    if isinstance(rid, bool) or not isinstance(rid, (str, int)):
        return Record(index, broken, error=f"line {number}: \"id\" must be a string or an int")
    meta = {k: v for k, v in data.items() if k not in FIELDS}
    problem = _problem(data)
    if problem:
        return Record(index, rid, prompt=data.get("prompt"), meta=meta, error=problem)
    return Record(index, rid, prompt=data.get("prompt"), text=data.get("text"),
                  answer=data.get("answer"), answer_ids=data.get("answer_ids"),
                  target=data.get("target"),
                  contrast=data.get("contrast"), positions=data.get("positions"), meta=meta)


def read_records(path: Union[str, Path]) -> list[Record]:
    """Read the records of a ``.jsonl`` file, or the prompts of a text file (one per line).

    Blank lines are skipped (they do not count as records, but line numbers do).
    A line that is not a valid record becomes a record with ``error`` set: the run reports
    it as an error record and goes on.

    Args:
        path (str or Path): The input file (UTF-8).

    Returns:
        list[Record]: In file order; ``index`` counts the records from 0.

    Raises:
        OSError, UnicodeDecodeError: the file cannot be read.
        ValueError: the file holds no record, two records share an id (resuming a run
            needs unique ids), or a plain-text file holds JSON records.
    """
    path = Path(path)
    # a byte-order mark is dropped; lines end at "\n" only (U+2028 and the other Unicode
    # line boundaries are characters of a record, as JSON Lines and text files define them)
    lines = split_lines(path.read_text(encoding="utf-8-sig"))
    is_jsonl = path.suffix.lower() in JSONL_SUFFIXES
    records: list[Record] = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        if is_jsonl:
            record = _record(len(records), number, line)
        else:
            _refuse_json_as_text(path, number, line)
            record = Record(len(records), number, prompt=line.strip())
        records.append(record)
    if not records:
        raise ValueError(f"{str(path)!r} holds no record: one JSON object or prompt per line.")
    _check_unique(records, path)
    return records


def _refuse_json_as_text(path: Path, number: int, line: str) -> None:
    """A plain-text input whose line is a JSON record was meant as JSON lines: say so."""
    text = line.strip()
    if not (text.startswith("{") and text.endswith("}")):
        return
    try:
        data = json.loads(text)
    except json.JSONDecodeError:
        return
    if isinstance(data, dict) and ("prompt" in data or "text" in data):
        raise ValueError(f"{str(path)!r}: line {number} is a JSON record, but only files named "
                         f"{' or '.join(JSONL_SUFFIXES)} are read as JSON lines (others as one "
                         "prompt a line): rename the file.")


def _check_unique(records: list[Record], path: Path) -> None:
    seen: dict[RecordId, int] = {}
    for record in records:
        if record.id in seen:
            raise ValueError(f"{str(path)!r}: records {seen[record.id] + 1} and "
                             f"{record.index + 1} share the id {record.id!r}; ids must be "
                             "unique (a resumed run skips the ids already done).")
        seen[record.id] = record.index


def read_document(path: Union[str, Path]) -> tuple[str, list[str]]:
    """The text of a document file, line endings normalised, and what was normalised.

    CRLF (Windows) and lone CR (old Mac) line endings become LF and a UTF-8 byte-order mark
    is dropped, so a document gives the same tokens whichever system wrote it; each change
    is named in the returned notes (``iglens run`` records them in the result's
    ``meta["normalised"]`` and warns), never made silently.

    Args:
        path (str or Path): A UTF-8 text file.

    Returns:
        tuple: the text and a list of notes (empty when the file was used as it is).

    Raises:
        OSError: the file cannot be read.
        UnicodeDecodeError: it is not UTF-8.
    """
    raw = Path(path).read_bytes().decode("utf-8")
    notes = []
    if raw.startswith("\ufeff"):
        raw = raw[1:]
        notes.append("a UTF-8 byte-order mark was dropped")
    crlf = raw.count("\r\n")
    if crlf:
        raw = raw.replace("\r\n", "\n")
        notes.append(f"{crlf} CRLF line endings became LF")
    lone = raw.count("\r")
    if lone:
        raw = raw.replace("\r", "\n")
        notes.append(f"{lone} CR line endings became LF")
    return raw, notes
