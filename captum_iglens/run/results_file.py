"""The output of a dataset run: a JSON-lines file that is appended to, resumed and merged.

Each result is one line, written whole, flushed and synced before the next record starts,
so a run killed at any moment loses at most the records in flight. A last line without its
newline, or that is not JSON, is a torn write: it is cut off when the run resumes and is
never read as data. Several processes each append to their own part file next to the output
(``OUTPUT.part-<rank>``); :meth:`ResultsFile.finalize` merges the output and every part into
the output, one line per record id, in input order, and removes the parts.
"""

from __future__ import annotations

import errno
import json
import os
import warnings
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator, Optional, Union

__all__ = [
    "NotAResultsFile",
    "ResultsFile",
    "ResultsWriteError",
    "OutputLockedError",
    "RunMismatchError",
    "check_results_file",
    "read_lines",
]


class OutputLockedError(RuntimeError):
    """Another process holds the output's lock (it is writing the same results file)."""


class RunMismatchError(ValueError):
    """Results of another run: another model, package version or numeric setting."""


class NotAResultsFile(ValueError):
    """A file given as the results of ``iglens run`` that is something else."""


class ResultsWriteError(OSError):
    """The results cannot be written: one line naming the file, the reason and the fix.

    Args:
        path (Path): The file being written.
        err (OSError): The error of the write.
    """

    _FIXES = {getattr(errno, name): fix for name, fix in (
        ("ENOSPC", "free space on its disk"), ("EDQUOT", "free space in your quota"),
        ("EACCES", "make its folder writable"), ("EPERM", "make its folder writable"),
        ("EROFS", "remount its disk writable")) if hasattr(errno, name)}

    def __init__(self, path: Path, err: OSError) -> None:
        """See the class docstring."""
        super().__init__(err.errno, err.strerror or str(err), str(path))
        self.path, self.reason = Path(path), err.strerror or str(err)

    def message(self, elsewhere: str = "write the results elsewhere") -> str:
        """The one-line message, ``elsewhere`` naming how to write the results elsewhere."""
        fix = self._FIXES.get(self.errno or 0)
        then = f"{fix}, then run again (the run resumes), or {elsewhere}" if fix else elsewhere
        return f"cannot write results to {self.path}: {self.reason}; {then}"

    def __str__(self) -> str:
        """See :meth:`message`."""
        return self.message()


@contextmanager
def _writing(path: Path) -> Iterator[None]:
    """Turn an OSError of the block into a :class:`ResultsWriteError` naming ``path``."""
    try:
        yield
    except ResultsWriteError:
        raise
    except OSError as err:
        raise ResultsWriteError(path, err) from err


def _json(raw: bytes) -> Optional[Any]:
    """The JSON value of ``raw``, or None when it is no complete JSON value."""
    try:
        return json.loads(raw)
    except ValueError:  # JSONDecodeError and UnicodeDecodeError (a cut UTF-8 character)
        return None


def _parse(raw: bytes) -> Optional[dict[str, Any]]:
    """A result line as a dict, or None when it is damaged (cut short, not a JSON object)."""
    value = _json(raw) if raw.endswith(b"\n") else None
    return value if isinstance(value, dict) else None


def _scan(data: bytes) -> tuple[list[dict[str, Any]], int, int]:
    """The good lines of ``data``, the damaged lines before the last, and the torn tail.

    Returns:
        (records, damaged, torn): parsed lines (blank ones skipped), how many lines before
        the last are damaged (skipped), and how many bytes the damaged last line spans.
    """
    raws = data.splitlines(keepends=True)
    records, damaged, torn = [], 0, 0
    for n, raw in enumerate(raws):
        if not raw.strip():
            continue
        value = _parse(raw)
        if value is not None:
            records.append(value)
        elif n == len(raws) - 1:
            torn = len(raw)
        else:
            damaged += 1
    return records, damaged, torn


def read_lines(path: Union[str, Path], warn: bool = True) -> tuple[list[dict[str, Any]], int]:
    """The complete records of a results file and the number of torn bytes at its end.

    Blank lines are skipped; so are damaged lines (cut short, or not a JSON object) before
    the last one, with a warning; a damaged last line is a torn write, reported in bytes.

    Args:
        path (str or Path): The file (none yet: no record).
        warn (bool, optional): Warn about damaged lines. Default: True.

    Returns:
        (records, torn): the parsed lines, and how many bytes the torn last line spans.
    """
    path = Path(path)
    if not path.exists():
        return [], 0
    records, damaged, torn = _scan(path.read_bytes())
    if damaged and warn:
        warnings.warn(f"{path}: skipped {damaged} damaged line(s) before the last one (not "
                      "complete JSON objects); their records run again.", stacklevel=2)
    return records, torn


def check_results_file(path: Union[str, Path]) -> None:
    """Refuse to write into an existing file that is not the output of ``iglens run``.

    Raises:
        NotAResultsFile: (a ValueError) the file is not empty and its first line is not a
            result line (a JSON object with ``"id"`` and ``"status"``), e.g. a notes file given
            as ``--output``.
    """
    path = Path(path)
    if not path.is_file() or path.stat().st_size == 0:
        return
    with open(path, "rb") as handle:
        first = next((line for line in handle if line.strip()), b"")
    value = _parse(first if first.endswith(b"\n") else first + b"\n")
    if not first or (value is not None and "id" in value and "status" in value):
        return
    raise NotAResultsFile(f"{str(path)!r} exists and is not a results file of `iglens run` "
                          "(its first line is not a result): give a new path, or the output of "
                          "an earlier run to resume it.")


class ResultsFile:
    """Append-only results of one process of a run, and the merge of all of them.

    Args:
        path (str or Path): The output file (``.jsonl``).
        rank (int, optional): This process's rank. Default: 0.
        world_size (int, optional): Number of processes. With more than one, each appends
            to ``OUTPUT.part-<rank>``. Default: 1.
    """

    def __init__(self, path: Union[str, Path], rank: int = 0, world_size: int = 1) -> None:
        """See the class docstring."""
        self.path = Path(path)
        self.own = (self.path if world_size == 1
                    else self.path.with_name(f"{self.path.name}.part-{rank}"))
        self._handle: Optional[Any] = None
        self._warned: set[Path] = set()  # damaged lines are reported once per file
        #: Entries added to every line written (the run fingerprint, ``{"run": ...}``).
        self.stamp: dict[str, Any] = {}
        #: Record id -> hash of its input, written as the line's ``input_hash``.
        self.input_hashes: dict[Any, str] = {}

    def _read(self, file: Path) -> tuple[list[dict[str, Any]], int]:
        lines = read_lines(file, warn=file not in self._warned)
        self._warned.add(file)
        return lines

    def parts(self) -> list[Path]:
        """The part files next to the output, from this or an earlier run."""
        return sorted(self.path.parent.glob(f"{self.path.name}.part-*"))

    def done_ids(self) -> set[Any]:
        """Ids with a complete line in the output or any part file (errors included)."""
        return {line.get("id") for line in self.lines()}

    def lines(self) -> list[dict[str, Any]]:
        """Every complete line of the output and its part files, in file order."""
        return [line for file in [self.path, *self.parts()] for line in self._read(file)[0]]

    def open(self) -> None:
        """Open this process's file for appending, cutting off a torn last line first.

        Warns:
            UserWarning: when a torn line is cut off (its record will be run again).

        Raises:
            NotAResultsFile: the file exists but is not a results file (see
                :func:`check_results_file`).
            ResultsWriteError: the file cannot be opened for writing.
        """
        check_results_file(self.own)
        _, torn = self._read(self.own)
        with _writing(self.own):
            if torn:
                warnings.warn(f"{self.own}: cut off a torn last line ({torn} bytes) from an "
                              "interrupted run; its record runs again.", stacklevel=2)
                with open(self.own, "r+b") as handle:
                    handle.truncate(self.own.stat().st_size - torn)
            self._handle = open(self.own, "a", encoding="utf-8")

    def append(self, line: dict[str, Any]) -> None:
        """Write one result as one line, then flush and sync it to disk.

        Raises:
            ResultsWriteError: the line cannot be written (a full disk, ...); the file is
                closed, and a part of the line left in it is cut off when the run resumes.
        """
        if self._handle is None:
            self.open()
        line = {**line, **self.stamp}
        if line.get("id") in self.input_hashes:
            line["input_hash"] = self.input_hashes[line["id"]]
        handle = self._handle
        try:
            with _writing(self.own):
                handle.write(json.dumps(line) + "\n")  # type: ignore[union-attr]
                handle.flush()  # type: ignore[union-attr]
                os.fsync(handle.fileno())  # type: ignore[union-attr]
        except ResultsWriteError:
            self._handle = None
            try:  # closes the file even when its last flush fails again
                handle.close()  # type: ignore[union-attr]
            except OSError:
                pass
            raise

    def close(self) -> None:
        """Close this process's file."""
        if self._handle is not None:
            self._handle.close()
            self._handle = None

    def _all_lines(self) -> Iterator[tuple[Any, str]]:
        for file in [self.path, *self.parts()]:
            for line in self._read(file)[0]:
                yield line.get("id"), json.dumps(line)

    def finalize(self, order: dict[Any, int]) -> int:
        """Merge the output and the part files: one line per id, in input order.

        Where an id has several lines (its record's input changed and it ran again), the
        last one written is kept. Lines whose id is not in ``order`` (records no longer in
        the input) are kept after the others. The merged file replaces the output
        atomically, then the parts are removed.

        Args:
            order (dict): Record id -> its index in the input.

        Returns:
            int: The number of lines written.

        Raises:
            ResultsWriteError: the merged file cannot be written (the output and the parts
                are left as they were, so the run can be resumed).
        """
        self.close()
        first: dict[Any, str] = {}
        for rid, text in self._all_lines():
            first.pop(rid, None)  # the latest line of an id wins, in its own place
            first[rid] = text
        known = sorted((order[rid], text) for rid, text in first.items() if rid in order)
        rest = [text for rid, text in first.items() if rid not in order]
        tmp = self.path.with_name(f"{self.path.name}.merging")
        with _writing(self.path):
            try:
                with open(tmp, "w", encoding="utf-8") as handle:
                    for text in [t for _, t in known] + rest:
                        handle.write(text + "\n")
                    handle.flush()
                    os.fsync(handle.fileno())
                os.replace(tmp, self.path)
            finally:
                tmp.unlink(missing_ok=True)
            for part in self.parts():
                part.unlink()
        return len(known) + len(rest)


