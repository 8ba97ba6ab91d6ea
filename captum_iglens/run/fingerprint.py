"""What produced a results file: a run fingerprint, record input hashes, and a run lock.

A results file of ``iglens run`` is resumed by skipping the ids already in it. That is only
sound when the lines already written were produced by the same model and settings, and from
the same inputs. Every line therefore carries the run's fingerprint (model name, a content
hash of its weights, the package version, every setting that changes numbers) and a hash of
its record's input; :func:`check_resume` refuses a resume whose fingerprint differs, saying
what differs, and an id whose input changed is run again. :func:`run_lock` keeps a second
process from writing the same output at the same time.
"""

from __future__ import annotations

import hashlib
import json
import os
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator, Mapping, Sequence

import torch
from torch import nn

from captum_iglens._core.estimators import is_exact
from captum_iglens.lens.architectures import display_name, unwrap_model
from captum_iglens.lens.weights import weights_digest
from captum_iglens.run.results_file import OutputLockedError, RunMismatchError
from captum_iglens.run.resume import (
    FINGERPRINT_KEYS,
    OPTIONAL_KEYS,
    _jsonable,
    ignored_keys,
    input_hash,
    record_fields,
)
from captum_iglens.settings import (
    DEFAULT_EFFECT,
    DEFAULT_GRANULARITY,
    DEFAULT_LENS,
    settings_from_record,
)

__all__ = [
    "FINGERPRINT_KEYS",
    "RunMismatchError",
    "check_resume",
    "input_hash",
    "record_fields",
    "run_fingerprint",
    "run_lock",
    "weights_digest",
]


def run_fingerprint(model: nn.Module, *, layers: Sequence[int], units: str,
                    settings: Mapping[str, Any]) -> dict[str, Any]:
    """The fingerprint of a run: what its numbers depend on, and a digest of it.

    Args:
        model (nn.Module): The explained model.
        layers (sequence of int): The chosen hidden-state indices.
        units (str): ``"probability"`` or ``"log-probability"``.
        settings (mapping): The run's settings: ``method``, ``n_steps``, ``baselines``,
            ``max_new_tokens``, ``chat_template``, ``template_kwargs``, ``onset_frac``,
            ``onset_rule``, ``top_k``, ``stride`` (missing ones are recorded as ``None``),
            and ``granularity`` (recorded and compared when it is not ``"block"``) and
            ``effect`` (recorded and compared when it is not ``"readout"``; the total
            effect's exact split depends on ``n_steps``, so it is kept then), ``scope``
            and ``grad_drop`` (likewise, away from ``"position"`` and False), and ``lens``
            (the per-layer readout's kind, recorded and compared when it is not ``"logit"``,
            with ``lens_digest``, which fitted lens: its tensors' digest).

    Returns:
        dict: the entries of :data:`FINGERPRINT_KEYS`, ``torch`` and ``transformers``
        versions, and ``digest`` (16 hex digits over the compared entries).
    """
    import transformers

    from captum_iglens import __version__

    dtype = next((str(p.dtype) for p in unwrap_model(model).parameters()), "none")
    entries: dict[str, Any] = {
        "package": __version__, "model": display_name(model), "weights": weights_digest(model),
        "dtype": dtype, "layers": list(layers), "units": units,
    }
    for key in FINGERPRINT_KEYS[6:]:
        entries[key] = _jsonable(settings.get(key))
    recorded = settings_from_record(settings)  # granularity and effect: default when absent
    effect, granularity = recorded.effect, recorded.granularity
    if effect == DEFAULT_EFFECT and (entries["method"] is None or is_exact(entries["method"])):
        entries["n_steps"] = None  # an exact readout estimator does not depend on it
    compared_keys: tuple[str, ...] = FINGERPRINT_KEYS
    if granularity != DEFAULT_GRANULARITY:  # block runs keep the digests they always had
        entries["granularity"] = granularity
        compared_keys = (*FINGERPRINT_KEYS, "granularity")
    if effect != DEFAULT_EFFECT:  # readout runs keep the digests they always had
        entries["effect"] = effect
        compared_keys = (*compared_keys, "effect")
    lens = settings.get("lens")
    if lens not in (None, DEFAULT_LENS):  # logit-lens runs keep the digests they always had
        entries["lens"] = lens
        compared_keys = (*compared_keys, "lens")
        if settings.get("lens_digest") is not None:  # which fitted lens, not only its kind
            entries["lens_digest"] = settings["lens_digest"]
            compared_keys = (*compared_keys, "lens_digest")
    for key in ("scope", "grad_drop"):  # likewise: recorded only away from the default
        if getattr(recorded, key) != OPTIONAL_KEYS[key]:
            entries[key] = getattr(recorded, key)
            compared_keys = (*compared_keys, key)
    compared = json.dumps([entries[k] for k in compared_keys], sort_keys=True, default=str)
    entries["digest"] = hashlib.sha256(compared.encode()).hexdigest()[:16]
    entries["torch"] = torch.__version__
    entries["transformers"] = transformers.__version__
    return entries


def check_resume(lines: Sequence[Mapping[str, Any]], fingerprint: Mapping[str, Any],
                 path: Path) -> None:
    """Refuse to resume ``path`` when its lines were written by another run.

    Args:
        lines: The complete lines already in the output (and its part files).
        fingerprint: This run's :func:`run_fingerprint`.
        path: The output, for the message.

    Raises:
        RunMismatchError: a line's fingerprint differs (the message lists what differs), or
            a line has none (written by an older version, which recorded none).
    """
    for line in lines:
        theirs = line.get("run")
        if not isinstance(theirs, Mapping):
            raise RunMismatchError(
                f"{path} was written by an older version that recorded no run fingerprint, "
                "so resuming it could mix two models' or settings' numbers: write to another "
                "--output, or delete the file to start over.")
        if theirs.get("digest") == fingerprint["digest"]:
            continue
        skipped = ignored_keys(theirs, fingerprint)  # two AtP runs: method, n_steps unread
        diffs = [f"{key}: {theirs.get(key)!r} there, {fingerprint.get(key)!r} now"
                 for key in FINGERPRINT_KEYS
                 if key not in skipped and theirs.get(key) != fingerprint.get(key)]
        for key, default in OPTIONAL_KEYS.items():
            mine, other = (f.get(key, default) for f in (fingerprint, theirs))
            if mine != other:
                diffs.append(f"{key}: {other!r} there, {mine!r} now")
        if theirs.get("lens_digest") != fingerprint.get("lens_digest"):
            diffs.append(f"lens_digest (which fitted lens): {theirs.get('lens_digest')!r} "
                         f"there, {fingerprint.get('lens_digest')!r} now")
        if skipped and not diffs:
            continue  # AtP runs that differ only in what AtP does not read
        raise RunMismatchError(
            f"{path} holds results of another run ({'; '.join(diffs) or 'other settings'}): "
            "resuming would mix their numbers. Write to another --output, or delete the file "
            "to start over.")


@contextmanager
def run_lock(path: Path, enabled: bool = True) -> Iterator[None]:
    """Hold an exclusive lock on ``PATH.lock`` while a run writes ``path``.

    Raises:
        OutputLockedError: another process holds the lock (a second run on the same output
            would do the same work twice and interleave its lines); a ``RuntimeError``.
    """
    if not enabled:
        yield
        return
    try:
        import fcntl
    except ImportError:  # Windows: no advisory locks here; runs are not protected
        yield
        return
    lock = path.with_name(f"{path.name}.lock")
    handle = open(lock, "a+", encoding="utf-8")
    try:
        try:
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError as err:
            raise OutputLockedError(
                f"Another process is writing {path} (it holds {lock}): wait for it to finish, "
                "or write to another --output.") from err
        handle.seek(0)
        handle.truncate()
        handle.write(str(os.getpid()))
        handle.flush()
        yield
    finally:
        handle.close()
        lock.unlink(missing_ok=True)
