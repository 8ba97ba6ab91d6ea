"""Summary of a results file written by ``iglens run``: one JSON object per line.

A line is either a success, ``{"id", "index", "status": "ok", "seconds", **result}`` where
``result`` is :meth:`~captum_iglens.results.IGLensResult.to_dict` (``layers``, ``units``,
``tokens`` with per-token ``attributions``, ``convergence_delta``, ``onset_layer``, ...), or
a failure, ``{"id", "index", "status": "error", "error", "error_type", "prompt"}``. A run
killed mid-write leaves a torn last line: :func:`load_results` skips it with a warning.

:func:`summarize` pools every explained token of the run: the per-layer mean credit with a
bootstrap confidence interval that resamples records (the tokens of one answer are not
independent) and pools their tokens, the distribution of onset layers, the completeness
over the whole run, the slowest batches and every failure.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Optional, Sequence

import numpy as np

from captum_iglens._utils.format import layer_names, num, shorten
from captum_iglens.run.reader import check_one_run, load_results
from captum_iglens.settings import DEFAULT_EFFECT, DEFAULT_GRANULARITY, settings_from_record
from captum_iglens.summary.bootstrap import cluster_mean_ci
from captum_iglens.summary.report import WIDTH, has_onsets, record_label, record_name, report_lines

__all__ = ["N_SLOWEST", "RunSummary", "load_results", "summarize"]

#: The per-layer value of each effect, in the summary's titles and columns.
EFFECT_CREDIT_NAMES: dict[str, str] = {DEFAULT_EFFECT: "readout credit",
                                       "total": "total effect",
                                       "atp": "AtP estimate (not additive)"}

#: How many of the slowest batches the summary lists.
N_SLOWEST = 5
#: Settings that may differ between records without refusing the run (they are reported).
SETTINGS = ("model", "method", "baseline", "onset_rule", "onset_frac")


# ----------------------------------------------------------------------------- arrays
@dataclass
class _Arrays:
    """The per-token values of one record (``T`` tokens, ``k`` layers), float64."""

    credits: np.ndarray  # [T, k]
    delta_p: np.ndarray  # [T]
    convergence: np.ndarray  # [T]
    onsets: np.ndarray  # [T] hidden-state indices
    lens: Optional[np.ndarray] = None  # [T, k] lens terms of a per-layer readout


def _arrays(record: dict, layers: list[int]) -> _Arrays:
    """The token values of ``record``.

    Raises:
        ValueError: a token without its values, or with a number of credits other than
            ``len(layers)``, or an onset that is not one of ``layers``.
    """
    k = len(layers)
    try:
        tokens = record["tokens"]
        credits = np.array([t["attributions"] for t in tokens], dtype=np.float64)
        credits = credits.reshape(len(tokens), k)
        delta_p = np.array([t["delta_p"] for t in tokens], dtype=np.float64)
        convergence = np.array([t["convergence_delta"] for t in tokens], dtype=np.float64)
        onsets = np.array([t["onset_layer"] for t in tokens] if has_onsets(record) else [],
                          dtype=np.int64)  # AtP's onsets mean nothing: none pooled
        lens = (np.array([t["lens_change"] for t in tokens], dtype=np.float64).reshape(
            len(tokens), k) if tokens and "lens_change" in tokens[0] else None)
    except (KeyError, TypeError, ValueError) as err:
        raise ValueError(f"{record_name(record)}: not an IG-Lens result with {k} "
                         f"credits per token ({type(err).__name__}: {err})") from err
    stray = sorted(set(onsets.tolist()) - set(layers))
    if stray:
        raise ValueError(f"{record_name(record)}: onset layers {stray} are not among "
                         f"its layers {layers}")
    return _Arrays(credits, delta_p, convergence, onsets, lens)


# ----------------------------------------------------------------------------- checks
def _kind(record: dict) -> tuple[tuple[int, ...], str, bool]:
    """What must agree between records: (layers, units, :func:`is_contrastive`)."""
    try:
        layers = tuple(int(i) for i in record["layers"])
    except (KeyError, TypeError, ValueError) as err:
        raise ValueError(f"{record_name(record)}: no valid 'layers' list ({err})") from err
    recorded = settings_from_record(record)  # a key older lines lack: its default
    units = str(recorded.units)
    if recorded.effect != DEFAULT_EFFECT:  # other credits: kept apart
        units += f", effect {recorded.effect}"
    if recorded.granularity != DEFAULT_GRANULARITY:  # sub-layer node indices: apart
        units += f", granularity {recorded.granularity}"
    return layers, units, is_contrastive(record)


def is_contrastive(record: dict) -> bool:
    """Whether a result record explains ``p(y) - p(foil)``.

    It does when it says so (``"contrastive": true``) or a token names its foil
    (``"contrast_id"``).
    """
    tokens = record.get("tokens") or ()
    return bool(record.get("contrastive")) or any(
        isinstance(t, dict) and "contrast_id" in t for t in tokens)


def _kind_words(kind: tuple[tuple[int, ...], str, bool]) -> str:
    layers, units, contrastive = kind
    sub = units.endswith(", granularity sublayer")
    shown = layer_names(layers, "sublayer") if sub else list(layers)
    return (f"layers {shown}, units {units}, "
            f"{'contrastive' if contrastive else 'not contrastive'}")


def _check_compatible(records: Sequence[dict]) -> tuple[tuple[int, ...], str, bool]:
    """The common (layers, units, contrastive) of ``records``.

    Raises:
        ValueError: records that differ in one of them; the message names the ids of each
            group and says to summarize them separately.
    """
    groups: dict[tuple[tuple[int, ...], str, bool], list[str]] = {}
    for record in records:
        groups.setdefault(_kind(record), []).append(record_label(record))
    if len(groups) <= 1:
        return next(iter(groups), ((), "probability", False))
    parts = []
    for kind, ids in groups.items():
        shown = ", ".join(ids[:6]) + (f" and {len(ids) - 6} more" if len(ids) > 6 else "")
        parts.append(f"{_kind_words(kind)}: ids {shown}")
    raise ValueError(
        "cannot pool records whose credits are not comparable (they differ in layers, units "
        f"or contrastive mode): {'; '.join(parts)}. Summarize them separately: "
        "'iglens summarize --only plain' and '--only contrastive' for a run mixing the two; "
        "otherwise write each group's lines to its own file and summarize each"
    )


# ----------------------------------------------------------------------------- summary
@dataclass
class RunSummary:
    """What a results file of ``iglens run`` says, pooled over its ``k`` layers.

    Credits, ``delta_p`` and completeness are in ``units`` (probability, or nats for
    ``"log-probability"``); in contrastive runs they are credits to ``p(y) - p(foil)``.

    Attributes:
        layers (list[int]): The ``k`` hidden-state indices shared by every record.
        units (str): ``"probability"`` or ``"log-probability"``.
        contrastive (bool): The records explain ``p(y) - p(foil)``.
        n_ok (int): Records explained.
        n_failed (int): Records that failed.
        n_tokens (int): Explained tokens over all records.
        n_documents (int): Records in document mode (teacher-forced text).
        mean_credit (list[float]): ``[k]`` mean credit per layer over all tokens (NaN
            without tokens).
        ci_low (list[float]): ``[k]`` lower bound of its CI (NaN with < 2 records).
        ci_high (list[float]): ``[k]`` upper bound.
        mean_delta_p (float): Mean ``delta_p`` over all tokens (the sum of ``mean_credit``
            up to the completeness error).
        onset_counts (list[int]): ``[k]`` tokens whose onset is each layer (AtP: 0s, n/a).
        max_abs_convergence_delta (float): ``max |sum of credits - delta_p|`` over all
            tokens (0 without tokens).
        worst (dict, optional): Where that maximum is: ``{"id", "token"}``.
        slowest_batches (list[dict]): Up to :data:`N_SLOWEST` batches by their time,
            slowest first: ``{"ids", "indices", "records", "seconds", "seconds_per_record",
            "tokens"}``. ``iglens run`` gives every record of a batch (records explained
            together) the same ``seconds``, its share of the batch's time, so records are
            grouped by that value: ``seconds`` is the batch's time (the share times its
            records), ``seconds_per_record`` the share. A document is a batch of one.
        total_seconds (float): Sum of ``seconds`` over the records that have it.
        failures (list[dict]): Every failed record: ``{"id", "index", "error_type",
            "error", "prompt"}``.
        settings (dict): Per name of :data:`SETTINGS`, the distinct values in the run.
        n_boot (int): Bootstrap resamples.
        seed (int): Bootstrap seed.
        confidence (float): Confidence level of the CIs.
        torn (int): Torn lines skipped while loading.
        granularity (str): ``"block"`` or ``"sublayer"`` (``layers`` are then sub-layer node
            indices, named ``L<l>.attn`` / ``L<l>.mlp``).
        effect (str): ``"readout"``, ``"total"`` or ``"atp"`` (records of different effects
            are never pooled).
        mean_lens_change (list[float], optional): ``[k]`` mean lens term per layer (a
            per-layer readout's ``lens_change``; the credits are then block terms, and
            ``mean_credit`` plus it sums to ``mean_delta_p``); None for the logit lens.
    """

    layers: list[int]
    units: str
    contrastive: bool
    n_ok: int
    n_failed: int
    n_tokens: int
    n_documents: int
    mean_credit: list[float]
    ci_low: list[float]
    ci_high: list[float]
    mean_delta_p: float
    onset_counts: list[int]
    max_abs_convergence_delta: float
    worst: Optional[dict]
    slowest_batches: list[dict]
    total_seconds: float
    failures: list[dict]
    settings: dict[str, list] = field(default_factory=dict)
    n_boot: int = 1000
    seed: int = 0
    confidence: float = 0.95
    torn: int = 0
    granularity: str = DEFAULT_GRANULARITY
    effect: str = DEFAULT_EFFECT
    mean_lens_change: Optional[list[float]] = None

    @property
    def layer_names(self) -> list[str]:
        """``"emb"`` for index 0, ``"L<l>"`` for block ``l`` (sub-layer: ``"L<l>.attn"``)."""
        return layer_names(self.layers, self.granularity)

    @property
    def credit_name(self) -> str:
        """What a per-layer value is, by the run's ``effect`` (:data:`EFFECT_CREDIT_NAMES`)."""
        return EFFECT_CREDIT_NAMES.get(self.effect, f"{self.effect} credit")

    @property
    def credit_words(self) -> str:
        """What the credits are, in words, with their units."""
        name = self.credit_name
        if self.units == "probability":
            return f"{name} to {'p(y) - p(foil)' if self.contrastive else 'p(y)'} (probability)"
        return f"{name} to {'log p(y) - log p(foil)' if self.contrastive else 'log p(y)'} (nats)"

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict (NaN as null), one entry per layer under ``"per_layer"``."""
        per_layer = [
            {"layer": layer, "name": name, "mean_credit": num(mean), "ci_low": num(low),
             "ci_high": num(high), "onset_count": None if self.effect == "atp" else count}
            for layer, name, mean, low, high, count in zip(
                self.layers, self.layer_names, self.mean_credit, self.ci_low, self.ci_high,
                self.onset_counts, strict=True)
        ]
        for entry, lens in zip(per_layer, self.mean_lens_change or [], strict=False):
            entry["mean_lens_change"] = num(lens)
        return {
            "records_ok": self.n_ok, "records_failed": self.n_failed, "tokens": self.n_tokens,
            "document_records": self.n_documents, "torn_lines_skipped": self.torn,
            "layers": self.layers, "units": self.units, "contrastive": self.contrastive,
            "settings": self.settings, "per_layer": per_layer,
            **({} if self.granularity == "block" else {"granularity": self.granularity}),
            **({} if self.effect == DEFAULT_EFFECT else {"effect": self.effect}),
            "mean_delta_p": num(self.mean_delta_p),
            "bootstrap": {"n_boot": self.n_boot, "seed": self.seed,
                          "confidence": self.confidence, "method": "percentile",
                          "resampled": "records (their tokens pooled)"},
            "completeness": {"max_abs_convergence_delta": self.max_abs_convergence_delta,
                             "tokens": self.n_tokens, "worst": self.worst},
            "slowest_batches": self.slowest_batches, "total_seconds": self.total_seconds,
            "failures": self.failures,
        }

    def format(self) -> str:
        """The printed report, at most 100 columns wide.

        Counts, the settings, the per-layer table (mean credit, CI, onset count and share),
        the completeness over the run, the slowest batches and every failure.
        """
        return "\n".join(shorten(line, WIDTH) for line in report_lines(self))

    def __str__(self) -> str:
        """The report of :meth:`format`."""
        return self.format()


def summarize(
    records: Sequence[dict], errors: Sequence[dict] = (), n_boot: int = 1000, seed: int = 0,
    confidence: float = 0.95, torn: int = 0, mixed_runs: bool = False,
) -> RunSummary:
    """Pool the records of a run into a :class:`RunSummary`.

    The per-layer mean is over all explained tokens (a record with many tokens, such as a
    document, weighs as much as its tokens). Its CI comes from a percentile bootstrap that
    resamples records and pools their tokens (:func:`cluster_mean_ci`).

    Args:
        records (sequence of dict): The ``"ok"`` lines of :func:`load_results`.
        errors (sequence of dict, optional): The ``"error"`` lines. Default: none.
        n_boot (int, optional): Bootstrap resamples (>= 1). Default: 1000.
        seed (int, optional): Bootstrap seed. Default: 0.
        confidence (float, optional): Confidence level in (0, 1). Default: 0.95.
        torn (int, optional): Torn lines skipped while loading, for the report. Default: 0.
        mixed_runs (bool, optional): Pool records of different run fingerprints (models or
            settings; see :func:`~captum_iglens.run.fingerprint.check_one_run`). Default: False.

    Returns:
        RunSummary

    Raises:
        ValueError: nothing to summarize, ``n_boot`` < 1, ``confidence`` outside (0, 1),
            records that differ in layers, units or contrastive mode (the message names the
            ids of each group), or a record whose tokens do not hold its layers' credits.
        RunMismatchError: records of different runs, unless ``mixed_runs``.
    """
    if not records and not errors:
        raise ValueError("nothing to summarize: no record and no error")
    if n_boot < 1:
        raise ValueError(f"n_boot must be >= 1, got {n_boot}")
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must be in (0, 1), got {confidence}")
    if not mixed_runs:
        check_one_run(records)
    layers_t, units, contrastive = _check_compatible(records)
    units, _, granularity = units.partition(", granularity ")
    units, _, effect = units.partition(", effect ")
    layers = list(layers_t)
    arrays = [_arrays(record, layers) for record in records]
    pooled = _pooled(arrays, len(layers))
    filled = [(a.credits.sum(0), len(a.delta_p)) for a in arrays if len(a.delta_p)]
    sums = np.array([s for s, _ in filled]).reshape(len(filled), len(layers))
    low, high = cluster_mean_ci(sums, np.array([c for _, c in filled], dtype=np.float64),
                                n_boot, seed, confidence)
    with_seconds = [r for r in records if isinstance(r.get("seconds"), (int, float))]
    return RunSummary(
        layers=layers, units=units, contrastive=contrastive, n_ok=len(records),
        effect=effect or DEFAULT_EFFECT, n_failed=len(errors), n_tokens=len(pooled.delta_p),
        n_documents=sum(bool(r.get("document")) for r in records),
        mean_credit=_mean(pooled.credits, len(layers)), ci_low=low.tolist(),
        ci_high=high.tolist(),
        mean_delta_p=float(pooled.delta_p.mean()) if len(pooled.delta_p) else math.nan,
        onset_counts=[int((pooled.onsets == layer).sum()) for layer in layers],
        max_abs_convergence_delta=(float(np.abs(pooled.convergence).max())
                                   if len(pooled.convergence) else 0.0),
        worst=_worst(records, arrays), slowest_batches=_slowest_batches(with_seconds),
        total_seconds=float(sum(r["seconds"] for r in with_seconds)),
        failures=[_failure(e) for e in errors], settings=_settings(records),
        n_boot=n_boot, seed=seed, confidence=confidence, torn=torn,
        granularity=granularity or "block", mean_lens_change=_mean_lens(arrays, len(layers)),
    )


def _mean_lens(arrays: Sequence[_Arrays], k: int) -> Optional[list[float]]:
    """``[k]`` mean lens term over all tokens; None when no record has lens terms."""
    if not any(a.lens is not None for a in arrays):
        return None
    return _mean(np.concatenate([a.lens if a.lens is not None else np.zeros((len(a.delta_p), k))
                                 for a in arrays]), k)


def _pooled(arrays: Sequence[_Arrays], k: int) -> _Arrays:
    """Every record's tokens, concatenated in record order."""
    if not arrays:
        return _Arrays(np.zeros((0, k)), np.zeros(0), np.zeros(0), np.zeros(0, np.int64))
    return _Arrays(*(np.concatenate([getattr(a, name) for a in arrays])
                     for name in ("credits", "delta_p", "convergence", "onsets")))


def _mean(credits: np.ndarray, k: int) -> list[float]:
    return credits.mean(0).tolist() if len(credits) else [math.nan] * k


def _worst(records: Sequence[dict], arrays: Sequence[_Arrays]) -> Optional[dict]:
    """The record id and token index of the largest ``|convergence_delta|``."""
    best: Optional[dict] = None
    value = -1.0
    for record, a in zip(records, arrays, strict=True):
        if len(a.convergence) and float(np.abs(a.convergence).max()) > value:
            value = float(np.abs(a.convergence).max())
            best = {"id": record.get("id"), "index": record.get("index"),
                    "token": int(np.abs(a.convergence).argmax())}
    return best


def _slowest_batches(records: Sequence[dict]) -> list[dict]:
    """The :data:`N_SLOWEST` slowest batches: records sharing one ``seconds`` value.

    Ties keep file order: the batch whose first record comes first.
    """
    batches: dict[float, list[dict]] = {}
    for record in records:
        batches.setdefault(float(record["seconds"]), []).append(record)
    ranked = sorted(batches.items(), key=lambda item: -item[0] * len(item[1]))[:N_SLOWEST]
    return [{"ids": [r.get("id") for r in group], "indices": [r.get("index") for r in group],
             "records": len(group), "seconds": share * len(group), "seconds_per_record": share,
             "tokens": sum(len(r.get("tokens", ())) for r in group)}
            for share, group in ranked]


def _failure(entry: dict) -> dict:
    return {"id": entry.get("id"), "index": entry.get("index"),
            "error_type": entry.get("error_type") or "Error",
            "error": str(entry.get("error", "")), "prompt": entry.get("prompt")}


def _settings(records: Sequence[dict]) -> dict[str, list]:
    """Per name of :data:`SETTINGS`, its distinct values in file order."""
    out: dict[str, list] = {}
    for name in SETTINGS:
        values = [r.get(name) for r in records if r.get(name) is not None]
        out[name] = list(dict.fromkeys(values))
    return out
