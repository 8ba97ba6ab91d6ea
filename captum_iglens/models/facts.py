"""What a model's name or files tell about it without loading its weights.

The command line checks ``--layers`` / ``--k`` against the number of decoder blocks, and
decides whether a resumed run has anything left to do, before it spends the seconds (or
minutes) a model load costs. The facts come from the registry (named models), or from a
folder's ``config.json``; a ``.gguf`` file gives none (reading its metadata costs about as
much as a load), so its checks wait for the load.

This module imports neither torch nor transformers.
"""

from __future__ import annotations

import difflib
import hashlib
import importlib.util
import json
import os
from pathlib import Path
from typing import Optional

from captum_iglens.models.registry import (
    NAMED_MODELS,
    SMOLLM2_BLOCKS,
    SMOLLM2_FILE,
    SMOLLM2_NAMES,
    SMOLLM2_PACKAGE,
    model_names,
)

__all__ = ["block_count", "cache_dir_for", "cache_root", "close_model_names", "content_digest",
           "embedded_tokenizer_file", "source_id"]

#: ``config.json`` keys that hold the number of decoder blocks, by family.
_BLOCK_KEYS = ("num_hidden_layers", "n_layer", "num_layers")


def cache_root() -> Path:
    """The cache folder of de-quantised models.

    ``$CAPTUM_IGLENS_CACHE``, else ``$XDG_CACHE_HOME/captum_iglens``, else
    ``~/.cache/captum_iglens``.
    """
    env = os.environ.get("CAPTUM_IGLENS_CACHE")
    if env:
        return Path(env)
    xdg = os.environ.get("XDG_CACHE_HOME")
    return Path(xdg) / "captum_iglens" if xdg else Path.home() / ".cache" / "captum_iglens"


def content_digest(path: Path) -> str:
    """SHA-256 of the file's bytes (first 16 hex digits).

    The same file reinstalled elsewhere or later keys the same cache entry.
    """
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 22), b""):
            digest.update(block)
    return digest.hexdigest()[:16]


def cache_dir_for(gguf: Path) -> Path:
    """The cache entry of a GGUF file: ``cache_root() / "<file stem>-<content digest>"``."""
    return cache_root() / f"{gguf.stem}-{content_digest(gguf)}"


def _name(spec: Optional[str]) -> str:
    return spec.strip().lower() if spec is not None else SMOLLM2_NAMES[0]


def block_count(spec: Optional[str]) -> Optional[int]:
    """The number of decoder blocks of the model ``spec`` names, without loading it.

    Args:
        spec (str, optional): As for :func:`captum_iglens.models.loading.load_model`.

    Returns:
        int or None: from the registry (the embedded SmolLM2: 30), or from a model folder's
        ``config.json``; None where the files do not say (a ``.gguf`` file, a folder whose
        config names no block count).
    """
    name = _name(spec)
    if name in SMOLLM2_NAMES:
        return SMOLLM2_BLOCKS
    if name in NAMED_MODELS:
        return NAMED_MODELS[name].n_blocks
    config = Path(str(spec)).expanduser() / "config.json"
    try:
        data = json.loads(config.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    counts = [data.get(key) for key in _BLOCK_KEYS] if isinstance(data, dict) else []
    return next((c for c in counts if isinstance(c, int) and not isinstance(c, bool)), None)


def _model_files(spec: Optional[str]) -> list[Path]:
    """The files a model is loaded from (empty when there are none to name)."""
    name = _name(spec)
    if name in SMOLLM2_NAMES:
        found = importlib.util.find_spec(SMOLLM2_PACKAGE)
        folders = list(found.submodule_search_locations or []) if found is not None else []
        return [Path(f) / SMOLLM2_FILE for f in folders if (Path(f) / SMOLLM2_FILE).is_file()]
    if name in NAMED_MODELS:
        from captum_iglens.models.registry import part_files

        try:
            return part_files(NAMED_MODELS[name])
        except FileNotFoundError:
            return []
    path = Path(str(spec)).expanduser()
    if path.is_dir():
        return sorted(p for p in path.iterdir() if p.is_file())
    return [path] if path.is_file() else []


def source_id(spec: Optional[str]) -> Optional[str]:
    """An identity of the files a model is loaded from: names, sizes, modification times.

    Two runs whose ``source_id`` agree read the very same files (as ``make`` decides), so a
    resumed run can tell that nothing is left to do without loading the model and hashing
    its weights; a rewritten file changes it. It never replaces the weights digest of the
    run fingerprint: it only lets a run skip work when both agree.

    Args:
        spec (str, optional): As for :func:`captum_iglens.models.loading.load_model`.

    Returns:
        str or None: 16 hex digits (BLAKE2b), or None when there is no file to name.
    """
    files = _model_files(spec)
    if not files:
        return None
    digest = hashlib.blake2b(digest_size=8)
    for path in files:
        stat = path.stat()
        digest.update(f"{path.name}|{stat.st_size}|{stat.st_mtime_ns}\n".encode())
    return digest.hexdigest()


def close_model_names(spec: str) -> list[str]:
    """The model names that ``spec`` may be a typo of (:func:`difflib.get_close_matches`).

    Args:
        spec (str): A model name that is not one.

    Returns:
        list[str]: up to three names, closest first.
    """
    return difflib.get_close_matches(spec.strip().lower(), model_names(), n=3, cutoff=0.6)


def embedded_tokenizer_file() -> Optional[Path]:
    """The ``tokenizer.json`` of the embedded SmolLM2's cache entry, where it is cached.

    Returns:
        Path or None: None when the model is not installed or was never loaded (no cache).
    """
    files = _model_files(SMOLLM2_NAMES[0])
    if not files:
        return None
    # one entry of this file name is the usual case (writing an entry removes the stale
    # copies): found without hashing the 100 MB file; else the entry of its content digest
    found = list(cache_root().glob(f"{files[0].stem}-*/tokenizer.json"))
    path = found[0] if len(found) == 1 else cache_dir_for(files[0]) / "tokenizer.json"
    return path if path.is_file() else None
