"""A benchmark cell's fingerprint: what its numbers depend on, and a digest of it.

A cell file records the model's name and weights digest, the analysis code's and the
pre-registration's hashes (:func:`~captum_iglens.validate.benchmark.decide.analysis_version`),
the run's settings and a hash of the task's pairs before filtering. A rerun reuses a cell
whose stored digest is the one these give today; ``--tables-only`` recomputes it from the
stored weights digest without loading the model.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any, Mapping, Sequence

from captum_iglens.validate.benchmark.decide import analysis_version
from captum_iglens.validate.pairs import PromptPair

__all__ = ["cell_fingerprint", "fingerprint_digest", "fingerprint_entries"]


def _pairs_hash(pairs: Sequence[PromptPair]) -> str:
    text = json.dumps([p.__dict__ for p in pairs], sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def fingerprint_entries(family: str, task: str, weights: Any, analysis: Mapping[str, Any],
                        settings: Mapping[str, Any], pairs: Sequence[PromptPair]
                        ) -> dict[str, Any]:
    """A cell fingerprint's entries (no digest), from a weights digest already read."""
    return {"family": family, "task": task, "weights": weights, "analysis": dict(analysis),
            "settings": dict(settings), "pairs": _pairs_hash(pairs)}


def fingerprint_digest(entries: Mapping[str, Any]) -> str:
    """The 16-hex-digit digest of a cell fingerprint's entries (``digest`` left out)."""
    body = {k: v for k, v in entries.items() if k != "digest"}
    return hashlib.sha256(json.dumps(body, sort_keys=True, default=str).encode()).hexdigest()[:16]


def cell_fingerprint(model: Any, family: str, task: str, pairs: Sequence[PromptPair],
                     settings: Mapping[str, Any]) -> dict[str, Any]:
    """What a cell's numbers depend on, and a digest of it.

    Returns:
        dict: ``family``, ``task``, ``weights``
        (:func:`~captum_iglens.run.fingerprint.weights_digest`),
        ``analysis`` (:func:`~captum_iglens.validate.benchmark.decide.analysis_version`),
        ``settings``, ``pairs`` (hash of the task's pairs before filtering), ``digest``.
    """
    from captum_iglens.run.fingerprint import weights_digest

    entries = fingerprint_entries(family, task, weights_digest(model), analysis_version(),
                                  settings, pairs)
    entries["digest"] = fingerprint_digest(entries)
    return entries
