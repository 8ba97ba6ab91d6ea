"""Prompt pairs of counterfactual patching: a clean and a corrupted prompt and their answers.

Read without torch, so that ``iglens validate`` checks a pairs file before the model loads.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Sequence, Union

import numpy as np

from captum_iglens._utils.lines import split_lines

__all__ = ["PairAlignmentError", "PromptPair", "couple_clusters", "load_pairs"]

_FIELDS = ("id", "category", "clean", "corrupted", "answer", "foil")


class PairAlignmentError(ValueError):
    """Too few prompt pairs whose clean and corrupted prompts align for a tokenizer."""


@dataclass(frozen=True)
class PromptPair:
    """A clean and a corrupted prompt (plain text, no chat template) and their answers.

    Attributes:
        id (str) / category (str): Name and kind (capital, arithmetic, agreement, ...).
        clean (str) / corrupted (str): The prompts; as many tokens each.
        answer (str) / foil (str): The continuation that fits each (its first token is read).
    """

    id: str
    category: str
    clean: str
    corrupted: str
    answer: str
    foil: str


def couple_clusters(pairs: Sequence[PromptPair]) -> np.ndarray:
    """Cluster label of each pair: mirrored couples share one, every other pair its own.

    Pairs ``A`` and ``B`` are a mirrored couple when ``B`` is ``A`` read backwards
    (``B.clean == A.corrupted``, ``B.corrupted == A.clean``, answer and foil swapped):
    then patching ``A`` is exactly reverse-patching ``B``, so the two are one observation
    and the bootstrap must resample them together.

    Returns:
        ndarray: ``[len(pairs)]`` int64 labels ``0, 1, ...`` in order of first appearance.
    """
    labels: dict[frozenset, int] = {}
    out = []
    for p in pairs:
        key = frozenset({(p.clean, p.answer), (p.corrupted, p.foil)})
        out.append(labels.setdefault(key, len(labels)))
    return np.asarray(out, dtype=np.int64)


def load_pairs(path: Union[str, Path, None] = None) -> list[PromptPair]:
    """The prompt pairs: the set shipped with the package, or a ``.jsonl`` file.

    Args:
        path (str or Path, optional): One JSON object per line with the string fields
            ``id``, ``category``, ``clean``, ``corrupted``, ``answer``, ``foil``. Default:
            the package's ``data/patching_pairs.jsonl``.

    Returns:
        list[PromptPair]: in file order.

    Raises:
        ValueError: no pair, a missing or empty field, or an id given twice.
    """
    where = path or "the packaged pair set"
    if path is None:
        text = (resources.files("captum_iglens") / "data" / "patching_pairs.jsonl"
                ).read_text(encoding="utf-8")
    else:
        text = Path(path).read_text(encoding="utf-8")
    pairs = []
    for number, line in enumerate(split_lines(text), start=1):
        if not line.strip():
            continue
        entry = json.loads(line)
        if not isinstance(entry, dict) or not all(
                isinstance(entry.get(k), str) and entry[k] for k in _FIELDS):
            raise ValueError(f"{where}, line {number}: a pair needs the non-empty string "
                             f"fields {', '.join(_FIELDS)}.")
        pairs.append(PromptPair(**{k: entry[k] for k in _FIELDS}))
    ids = [p.id for p in pairs]
    if not pairs or len(set(ids)) != len(ids):
        raise ValueError(f"{where} holds no pair, or an id twice.")
    return pairs
