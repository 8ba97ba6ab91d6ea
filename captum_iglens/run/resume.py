"""What a resumed run can decide before its model loads: settings, the lock, work left.

A results file of ``iglens run`` records on every line the run's fingerprint: the model's
weights digest (known only once the model is loaded) and every setting the command line
decides. The settings are compared here, without torch, before the load, so that resuming
with another ``--k`` or ``--method`` is refused in a second rather than after the load; so is
an output another process holds the lock of. A run whose every record is already done, by
the same settings and the same model files (:func:`captum_iglens.models.facts.source_id`),
has nothing left to do and does not load the model at all.
"""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path
from typing import Any, Mapping, Optional, Sequence

from captum_iglens.settings import (
    DEFAULT_EFFECT,
    DEFAULT_GRANULARITY,
    DEFAULT_LENS,
    DEFAULT_SCOPE,
    AttributionSettings,
    GenerationSettings,
    ReportSettings,
    method_is_exact,
    settings_from_record,
)

__all__ = ["ATP_IGNORED", "FINGERPRINT_KEYS", "SETTINGS_KEYS", "fingerprint_settings",
           "ignored_keys", "input_hash", "lock_holder", "nothing_left", "planned_entries",
           "record_fields", "resume_mismatch", "settings_mismatch"]

#: The fingerprint entries that must agree for a resume (versions of torch and transformers
#: are recorded but not compared: an upgrade between two sittings of one run is allowed).
FINGERPRINT_KEYS = ("package", "model", "weights", "dtype", "layers", "units", "method",
                    "n_steps", "baselines", "max_new_tokens", "chat_template", "template_kwargs",
                    "onset_frac", "onset_rule", "top_k", "stride")
#: The entries that come from the run's settings (the command line), not from the model.
SETTINGS_KEYS = FINGERPRINT_KEYS[6:]
#: Entries recorded (and compared) only away from their default, so that runs at the
#: default keep the digests they always had.
OPTIONAL_KEYS = {"granularity": DEFAULT_GRANULARITY, "effect": DEFAULT_EFFECT,
                 "lens": DEFAULT_LENS, "scope": DEFAULT_SCOPE, "grad_drop": False}


def _jsonable(value: Any) -> Any:
    torch = sys.modules.get("torch")  # a tensor can only come from a caller that imported it
    if torch is not None and isinstance(value, torch.Tensor):
        data = value.detach().cpu().contiguous()
        return f"tensor{tuple(data.shape)}:" + hashlib.blake2b(
            data.reshape(-1).view(torch.uint8).numpy().tobytes(), digest_size=8).hexdigest()
    return value


def input_hash(fields: Mapping[str, Any]) -> str:
    """A hash of one record's input (prompt, text, answer, target, contrast, positions...)."""
    text = json.dumps({k: _jsonable(v) for k, v in fields.items()}, sort_keys=True,
                      default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def fingerprint_settings(attribution: AttributionSettings, report: ReportSettings,
                         generation: GenerationSettings, *, stride: int,
                         lens: str = DEFAULT_LENS,
                         lens_key: Optional[str] = None) -> dict[str, Any]:
    """The settings mapping of a run's fingerprint (for the run and the check before the load).

    Args:
        attribution (AttributionSettings): The estimator, its steps, the baseline, the
            lens's granularity and effect, and the gates' scope and ``grad_drop``.
        report (ReportSettings): Onset rule and fraction, top-k.
        generation (GenerationSettings): Answer length, chat template and its variables.
        stride (int): Document mode's step between explained positions.
        lens (str): The per-layer readout's kind (recorded only when it is not ``"logit"``).
        lens_key (str, optional): Which readout of that kind
            (:func:`~captum_iglens.lens.layer_readout.lens_key`: a fitted lens's tensor
            digest), recorded as ``lens_digest`` next to a non-logit ``lens``; None: unknown
            (before the model is loaded).

    Returns:
        dict: the keys of :data:`SETTINGS_KEYS`, ``granularity`` when it is not ``"block"``,
        ``effect`` when it is not ``"readout"``, ``scope`` when it is not ``"position"``
        and ``grad_drop`` when True.
    """
    granularity, effect = attribution.granularity, attribution.effect
    return {"method": attribution.method, "n_steps": attribution.n_steps,
            "baselines": attribution.baselines, "max_new_tokens": generation.max_new_tokens,
            "chat_template": generation.chat_template,
            "template_kwargs": generation.template_kwargs, "onset_frac": report.onset_frac,
            "onset_rule": report.onset_rule, "top_k": report.top_k, "stride": stride,
            **({} if granularity == DEFAULT_GRANULARITY else {"granularity": granularity}),
            **({} if effect == DEFAULT_EFFECT else {"effect": effect}),
            **({} if lens == DEFAULT_LENS else {"lens": lens}),
            **({} if lens == DEFAULT_LENS or lens_key is None else {"lens_digest": lens_key}),
            **{key: getattr(attribution, key) for key in ("scope", "grad_drop")
               if getattr(attribution, key) != OPTIONAL_KEYS[key]}}


def record_fields(record: Any) -> dict[str, Optional[Any]]:
    """The input fields of a record that its numbers depend on."""
    keys = ("prompt", "text", "answer", "answer_ids", "target", "contrast", "positions")
    return {key: getattr(record, key, None) for key in keys}


def planned_entries(settings: Mapping[str, Any], units: str,
                    layers: Optional[Sequence[int]] = None) -> dict[str, Any]:
    """The fingerprint entries a run will record that do not depend on the loaded model.

    Args:
        settings (mapping): As for :func:`captum_iglens.run.fingerprint.run_fingerprint`.
        units (str): ``"probability"`` or ``"log-probability"``.
        layers (sequence of int, optional): The hidden-state indices, where the number of
            blocks is known before the load; None leaves them out.

    Returns:
        dict: ``package``, ``units``, the entries of :data:`SETTINGS_KEYS` (``n_steps`` None
        for the exact estimator), ``layers`` when given and ``granularity`` when it is not
        ``"block"``, as the fingerprint records them.
    """
    from captum_iglens import __version__

    entries: dict[str, Any] = {"package": __version__, "units": units}
    if layers is not None:
        entries["layers"] = list(layers)
    for key in SETTINGS_KEYS:
        entries[key] = _jsonable(settings.get(key))
    effect = settings_from_record(settings).effect  # the default when absent
    method = entries["method"]
    if effect == DEFAULT_EFFECT and (method is None or method_is_exact(method)):
        entries["n_steps"] = None  # an exact readout estimator does not depend on it
    for key, default in OPTIONAL_KEYS.items():
        value = settings.get(key) or default
        if value != default:  # runs at the default keep the digests they always had
            entries[key] = value
    return entries


#: Entries attribution patching does not read (first-order: no estimator, no steps).
ATP_IGNORED = ("method", "n_steps")


def ignored_keys(theirs: Mapping[str, Any], mine: Mapping[str, Any]) -> tuple[str, ...]:
    """Fingerprint entries not compared: :data:`ATP_IGNORED` when both runs are AtP runs."""
    both_atp = all(f.get("effect") == "atp" for f in (theirs, mine))
    return ATP_IGNORED if both_atp else ()


def settings_mismatch(theirs: Mapping[str, Any], planned: Mapping[str, Any]) -> list[str]:
    """What differs between a line's fingerprint and the planned entries, one item each.

    Two AtP runs are not told apart by ``method`` or ``n_steps`` (AtP reads neither).
    """
    diffs = []
    skipped = ignored_keys(theirs, planned)
    for key in (*FINGERPRINT_KEYS, *OPTIONAL_KEYS):
        if (key not in planned and key not in OPTIONAL_KEYS) or key in skipped:
            continue
        mine = planned.get(key, OPTIONAL_KEYS.get(key))
        other = theirs.get(key, OPTIONAL_KEYS.get(key))
        if json.dumps(other, sort_keys=True, default=str) != json.dumps(
                mine, sort_keys=True, default=str):
            diffs.append(f"{key}: {other!r} there, {mine!r} now")
    return diffs


def resume_mismatch(lines: Sequence[Mapping[str, Any]], planned: Mapping[str, Any],
                    path: Path) -> Optional[str]:
    """Why ``path`` cannot be resumed with these settings; None when its lines agree.

    Only the entries in ``planned`` are compared (the weights digest is left to the check
    after the load); lines without a fingerprint are left to it too.
    """
    for line in lines:
        theirs = line.get("run")
        if not isinstance(theirs, Mapping):
            continue
        diffs = settings_mismatch(theirs, planned)
        if diffs:
            return (f"{path} holds results of another run ({'; '.join(diffs)}): resuming would "
                    "mix their numbers. Write to another --output, or delete the file to start "
                    "over.")
    return None


def lock_holder(path: Path) -> Optional[Path]:
    """The lock file of ``path`` when another process holds it (a run writing it); else None.

    The lock is only probed: a missing lock file is not created, a free one is left as is.
    """
    lock = path.with_name(f"{path.name}.lock")
    try:
        import fcntl
    except ImportError:  # Windows: runs take no lock there
        return None
    try:
        handle = open(lock, "rb")
    except OSError:
        return None
    with handle:
        try:
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return lock
        except OSError:
            return None
        fcntl.flock(handle.fileno(), fcntl.LOCK_UN)
    return None


def nothing_left(lines: Sequence[Mapping[str, Any]], hashes: Mapping[Any, str],
                 planned: Mapping[str, Any], source: Optional[str]) -> bool:
    """Whether every record is done, by this run's settings and the same model files.

    Args:
        lines: The complete lines of the output.
        hashes: Record id -> :func:`input_hash` of its input, for every record, in input
            order.
        planned: :func:`planned_entries` with ``layers``.
        source: :func:`captum_iglens.models.facts.source_id` of the model (None: unknown).

    Returns:
        bool: True when every id has one line with its input hash, in input order, and
        every line records the planned settings, ``source`` and one digest; False when
        anything is unknown or differs (the run then loads the model and decides).
    """
    if source is None or "layers" not in planned or not lines:
        return False
    if "lens" in planned:  # recorded only away from the logit lens
        return False  # which fitted lens is only known with the model: load it and compare
    ids = [line.get("id") for line in lines]
    done = {line.get("id"): line.get("input_hash") for line in lines}
    if len(done) != len(ids) or any(done.get(rid) != h for rid, h in hashes.items()):
        return False  # an id twice (a merge is due), or a record to run
    order = {rid: n for n, rid in enumerate(hashes)}
    known = [order[rid] for rid in ids if rid in order]
    if known != sorted(known):
        return False  # not yet merged in input order
    for line in lines:
        theirs = line.get("run")
        if (not isinstance(theirs, Mapping) or theirs.get("source") != source
                or settings_mismatch(theirs, planned)):
            return False
    digests = {line["run"].get("digest") for line in lines}
    return len(digests) == 1
