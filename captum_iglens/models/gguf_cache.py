"""De-quantised GGUF models, cached on disk as float32 model folders.

transformers de-quantises a GGUF file to a float32 model (SmolLM2-135M: about 15 s). The
result is written once, as a plain model folder (safetensors shards of at most 1 GB, the
config and the tokenizer), under :func:`cache_root`, so that later starts read it in about a
second. One float32 copy of the model is in memory at any time: the de-quantised model itself
is cached, after its quantisation marks are cleared, and safetensors writes each shard
straight from the tensors' memory.

A cache that cannot be written (a read-only file system, no space left) is not an error: the
model is loaded without caching and one warning names the folder and ``CAPTUM_IGLENS_CACHE``.
A cache that cannot even be read raises :class:`CacheError` with the folder and the fix.

Two processes that start on the same model at once do not both de-quantise it: the entry is
built under a :class:`filelock.FileLock` (a ``<entry>.lock`` file beside the entry), so the
second process waits for the first one's entry and then reads it.
"""

from __future__ import annotations

import errno
import os
import re
import shutil
import sys
import tempfile
import time
import warnings
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterator, Optional

from torch import nn

from captum_iglens.models.facts import cache_dir_for, cache_root, content_digest

__all__ = [
    "CacheError",
    "cache_dir_for",
    "cache_root",
    "cache_lock",
    "cached_or_built",
    "checked_tokenizer",
    "content_digest",
    "dequantise",
    "read_cache",
]

_MAX_SHARD = "1GB"
# Errors that mean "you may not read this", as opposed to "this is damaged".
_UNREADABLE = (errno.EACCES, errno.EPERM)
_WARNED: set[str] = set()  # cache folders already reported as unwritable in this process


class CacheError(OSError):
    """The model cache folder cannot be read; the message names the folder and the fix."""


def checked_tokenizer(tokenizer: Any, folder: Path) -> Any:
    """Refuse a tokenizer without a vocabulary.

    From a folder without tokenizer files transformers may build one that holds only special
    tokens and encodes text to nothing.

    Raises:
        ValueError: the tokenizer encodes ``"hello world"`` to no tokens.
    """
    if not tokenizer("hello world", add_special_tokens=False)["input_ids"]:
        raise ValueError(
            f"The tokenizer loaded from {str(folder)!r} has no vocabulary (it encodes text to no "
            "tokens): save the model's tokenizer into that folder (tokenizer.save_pretrained)."
        )
    return tokenizer


def _unreadable(folder: Path, err: OSError) -> CacheError:
    reason = err.strerror or str(err)
    return CacheError(
        f"The model cache {folder} cannot be read ({reason}): set CAPTUM_IGLENS_CACHE to a "
        f"folder you can read and write, or give read access to {folder}."
    )


def read_cache(folder: Path) -> Optional[tuple[nn.Module, Any]]:
    """The cached (model, tokenizer) in ``folder``, or None when there is none.

    A damaged entry (any loader error but a refused read) is removed, with a warning, and
    None is returned so that the caller rebuilds it.

    Raises:
        CacheError: the folder cannot be read (permission denied).
    """
    try:
        present = (folder / "config.json").is_file()
    except OSError as err:
        raise _unreadable(folder, err) from err
    if not present:
        return None
    from transformers import AutoModelForCausalLM, AutoTokenizer

    try:
        model = AutoModelForCausalLM.from_pretrained(folder, local_files_only=True)
        tokenizer = AutoTokenizer.from_pretrained(folder, local_files_only=True)
        return model.eval(), checked_tokenizer(tokenizer, folder)
    except OSError as err:
        if err.errno in _UNREADABLE:
            raise _unreadable(folder, err) from err
        damage: Exception = err
    except Exception as err:  # a damaged cache (any loader error): rebuild from the GGUF
        damage = err
    warnings.warn(f"The model cache {folder} is damaged ({str(damage).splitlines()[0]}); "
                  "rebuilding it from the GGUF file.", stacklevel=3)
    shutil.rmtree(folder, ignore_errors=True)
    return None


@contextmanager
def cache_lock(folder: Path) -> Iterator[bool]:
    """Hold the lock of the cache entry ``folder`` (the file ``<folder>.lock`` beside it).

    A second process asking for the same entry waits (a note on standard error says for
    what) until the first one releases it. Where the lock file cannot be created (a
    read-only cache) nothing is locked: such a cache is not written either.

    Args:
        folder (Path): The cache entry.

    Yields:
        bool: whether the lock is held.
    """
    from filelock import FileLock, Timeout

    lock = FileLock(str(folder) + ".lock")
    try:
        folder.parent.mkdir(parents=True, exist_ok=True)
        try:
            lock.acquire(timeout=0)
        except Timeout:
            _note(f"waiting for another process that is writing the model cache {folder} "
                  f"(lock file {lock.lock_file}) ...")
            lock.acquire()
    except OSError:  # an unwritable cache folder: no lock, and no cache written either
        yield False
        return
    try:
        yield True
    finally:
        lock.release()


def cached_or_built(folder: Optional[Path],
                    build: Callable[[Optional[Path]], tuple[nn.Module, Any]]
                    ) -> tuple[nn.Module, Any]:
    """The cached (model, tokenizer) of ``folder``, else ``build(folder)``'s, built once.

    The entry is read first without the lock; when it is missing it is read again under
    :func:`cache_lock` (another process may have written it meanwhile) and only then built,
    so that concurrent processes de-quantise a model once.

    Args:
        folder (Path, optional): The cache entry; None: no cache (``build(None)``).
        build (callable): Builds (model, tokenizer) and writes the entry it is given.

    Returns:
        (model, tokenizer), the model in eval mode.

    Raises:
        CacheError: the entry cannot be read.
    """
    if folder is None:
        return build(None)
    loaded = read_cache(folder)
    if loaded is not None:
        return loaded
    with cache_lock(folder):
        return read_cache(folder) or build(folder)


def _dequantise_options() -> dict[str, Any]:
    """Ask for plain float32 weights where transformers could keep GGUF blocks packed.

    transformers >= 5 keeps the blocks packed when the ``kernels`` package is installed; the
    lens needs ordinary ``nn.Linear`` weights. Older versions always de-quantise.
    """
    try:
        from transformers import GgufConfig
    except ImportError:
        return {}
    return {"quantization_config": GgufConfig(dequantize=True)}


def _clear_quantization_marks(model: nn.Module) -> None:
    """Unmark a de-quantised model as quantised, so that save_pretrained accepts it.

    Its weights are plain float32 tensors already; only the marks stay behind (on some
    transformers versions), and save_pretrained refuses a model marked as GGUF-quantised.
    """
    quantizer = getattr(model, "hf_quantizer", None)
    if quantizer is not None:
        quantizer.remove_quantization_config(model)
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config


def _note(message: str) -> None:
    print(f"captum_iglens: {message}", file=sys.stderr, flush=True)


def dequantise(gguf: Path, cache_to: Optional[Path] = None) -> tuple[nn.Module, Any]:
    """De-quantise a GGUF file to a float32 model and its tokenizer; cache it if asked.

    Args:
        gguf (Path): The ``.gguf`` file.
        cache_to (Path, optional): The cache entry to write (:func:`cache_dir_for`). An
            unwritable cache is reported once by a warning, and the model is returned
            anyway. Default: None (no caching).

    Returns:
        (model, tokenizer), the model in eval mode.
    """
    _note(f"de-quantising {gguf.name} to float32 (first use only) ...")
    model, tokenizer = _from_gguf(gguf)
    _clear_quantization_marks(model)
    if cache_to is not None:
        _write_cache(model, tokenizer, cache_to)
    return model.eval(), tokenizer


def _from_gguf(gguf: Path) -> tuple[nn.Module, Any]:
    """The model and tokenizer of transformers' own GGUF load, with plain float32 weights."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name,
                                                 **_dequantise_options())
    return model, tokenizer


def _folder_mb(folder: Path) -> float:
    return sum(f.stat().st_size for f in folder.iterdir() if f.is_file()) / 2**20


def _write_cache(model: nn.Module, tokenizer: Any, target: Path) -> bool:
    """Write the cache entry ``target`` through a temporary sibling folder.

    Returns:
        bool: whether the entry was written (False: the cache is unwritable, reported once).
    """
    start = time.perf_counter()
    tmp: Optional[Path] = None
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=target.name + ".", dir=target.parent))
        model.save_pretrained(tmp, max_shard_size=_MAX_SHARD)  # type: ignore[operator]  # a PreTrainedModel
        tokenizer.save_pretrained(tmp)
        if target.exists():
            shutil.rmtree(target)
        os.replace(tmp, target)
    except OSError as err:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
        _warn_unwritable(target.parent, err)
        return False
    _remove_stale_copies(target)
    _note(f"cached {target.name} in {target.parent} ({_folder_mb(target):.0f} MB written in "
          f"{time.perf_counter() - start:.1f} s; later starts read it, delete it to free the "
          "space)")
    return True


def _warn_unwritable(folder: Path, err: OSError) -> None:
    """Warn, once per folder and process, that the model is loaded without caching."""
    if str(folder) in _WARNED:
        return
    _WARNED.add(str(folder))
    reason = err.strerror or str(err)
    warnings.warn(
        f"The model cache {folder} cannot be written ({reason}): the model is loaded without "
        "caching and will be de-quantised again at every start. Set CAPTUM_IGLENS_CACHE to a "
        "writable folder to cache it.", stacklevel=4,
    )


def _remove_stale_copies(current: Path) -> None:
    """Remove other cached copies of the same model (another content digest).

    Only complete entries named ``<stem>-<16 hex digits>`` are removed, never another
    process's temporary folder.
    """
    stem = current.name.rsplit("-", 1)[0]
    for other in current.parent.glob(f"{stem}-*"):
        digest = other.name[len(stem) + 1:]
        if (other != current and re.fullmatch(r"[0-9a-f]{16}", digest) and other.is_dir()
                and (other / "config.json").exists()):
            shutil.rmtree(other, ignore_errors=True)
