"""``iglens benchmark``: predictors x tasks x families, resumable per (family, task).

A skeleton of the pre-registered benchmark (``prereg.json``): for each family and task the
task's pairs are filtered for the model (:func:`~captum_iglens.validate.benchmark.tasks.aligned`,
:func:`~captum_iglens.validate.benchmark.tasks.answered`), patched both ways
(:func:`~captum_iglens.validate.patching.patch_pairs`), and every predictor available here
is scored per pair by Spearman's rho with the recovery (patching) and with the reverse drop
(reverse patching), on the blocks of the decided view (block 1 left out, the
pre-registration's excluded block). A cell holds the mean and median rho over pairs, a 95%
CI from the cluster bootstrap (a pair and its mirror one cluster), ``n`` and the minimum
detectable effect. Predictors of the pre-registration not yet scored by this skeleton
(total effect, AtP, AtP*, LayerIntegratedGradients, LayerConductance) are listed with
``"not scored"``, never filled in. Each (family, task) cell file carries a fingerprint (model
name, weights digest, package and analysis-code version, settings, the pairs' hash); a
rerun skips the cells whose file has the same fingerprint.
"""

from __future__ import annotations

import hashlib
import json
import math
from pathlib import Path
from typing import Any, Mapping, Optional, Sequence

import numpy as np

from captum_iglens.validate.benchmark.decide import analysis_version, load_preregistration
from captum_iglens.validate.benchmark.tasks import aligned, answered
from captum_iglens.validate.pairs import PromptPair, couple_clusters
from captum_iglens.validate.stats import cluster_bootstrap

__all__ = ["PATCH_VIEWS", "SCORED", "cell_fingerprint", "cell_path", "hypothesis_verdicts",
           "hypotheses_table", "load_cell", "markdown_table", "run_cell"]

#: The predictors this skeleton scores, in the pre-registration's names.
SCORED: tuple[str, ...] = ("readout credit", "logit-lens level", "direct logit attribution",
                           "last layer always", "other prompts' mean drop profile", "random")
#: The interventions of a pair task and the PairPatch field of each one's drops.
PATCH_VIEWS: dict[str, str] = {"patch": "recovery", "reverse patch": "reverse"}


def _pairs_hash(pairs: Sequence[PromptPair]) -> str:
    text = json.dumps([p.__dict__ for p in pairs], sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


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

    entries = {"family": family, "task": task, "weights": weights_digest(model),
               "analysis": analysis_version(), "settings": dict(settings),
               "pairs": _pairs_hash(pairs)}
    entries["digest"] = hashlib.sha256(
        json.dumps(entries, sort_keys=True, default=str).encode()).hexdigest()[:16]
    return entries


def _next_token(model: Any) -> Any:
    import torch

    def predict(ids: list[int]) -> int:
        device = next(model.parameters()).device
        with torch.no_grad():
            logits = model(torch.tensor([ids], device=device)).logits
        return int(logits[0, -1].argmax())

    return predict


def _rho(scores: np.ndarray, drops: np.ndarray) -> np.ndarray:
    """Per-row Spearman rho (scipy), NaN for a constant row."""
    from scipy.stats import spearmanr

    out = np.full(len(drops), np.nan)
    for i, (s, d) in enumerate(zip(scores, drops, strict=True)):
        if np.ptp(s) > 0 and np.ptp(d) > 0:
            out[i] = spearmanr(s, d).statistic
    return out


def _predictors(patches: Sequence[Any], drops: np.ndarray, clusters: np.ndarray,
                seed: int) -> dict[str, np.ndarray]:
    """``[P, n]`` scores of every predictor of :data:`SCORED` for one intervention."""
    stack = {k: np.stack([getattr(p, k).double().numpy() for p in patches])
             for k in ("credits", "lens", "direct")}
    n_pairs, n = drops.shape
    others = np.zeros_like(drops)
    for c in np.unique(clusters):  # leave the pair and its mirror out
        rest = clusters != c
        others[clusters == c] = drops[rest].mean(0) if rest.any() else 0.0
    return {"readout credit": stack["credits"], "logit-lens level": stack["lens"],
            "direct logit attribution": stack["direct"],
            "last layer always": np.tile(np.arange(n, dtype=np.float64), (n_pairs, 1)),
            "other prompts' mean drop profile": others,
            "random": np.random.default_rng(seed).standard_normal((n_pairs, n))}


def _summary(values: np.ndarray, clusters: np.ndarray, n_boot: int, seed: int,
             power_z: float) -> dict[str, Any]:
    keep = np.isfinite(values)
    values, clusters = values[keep], clusters[keep]
    groups = [np.flatnonzero(clusters == c) for c in np.unique(clusters)]
    cell: dict[str, Any] = {"n": int(len(values)), "clusters": len(groups)}
    if len(groups) < 2:
        return {**cell, "mean": math.nan, "median": math.nan, "low": math.nan,
                "high": math.nan, "mde": math.nan}
    draws, point = cluster_bootstrap(np.stack([values, values], 1), np.array([True, False]),
                                     groups, n_boot, seed, return_draws=True)
    low, high = np.percentile(draws[:, 0], [2.5, 97.5])
    return {**cell, "mean": float(point[0]), "median": float(point[1]), "low": float(low),
            "high": float(high), "mde": float(power_z * np.std(draws[:, 0], ddof=1))}


def run_cell(model: Any, tokenizer: Any, family: str, task: str,
             pairs: Sequence[PromptPair], max_pairs: Optional[int], n_boot: int, seed: int,
             progress: bool = True) -> dict[str, Any]:
    """One (family, task) cell: filter, patch, score every available predictor.

    Args:
        model: The family's model (eval mode).
        tokenizer: Its tokenizer.
        family (str): The family's name, recorded in the cell.
        task (str): The task's name, recorded in the cell.
        pairs (sequence of PromptPair): The task's pairs, before filtering.
        max_pairs (int, optional): Keep at most this many of the filtered pairs (in order).
        n_boot (int): Bootstrap resamples of the 95% CIs.
        seed (int): Seeds the random predictor and the bootstrap.
        progress (bool, optional): Patching's progress bar. Default: True.

    Returns:
        dict: ``counts`` (pairs given, aligned, answered, used), ``scores`` (intervention ->
        predictor -> summary dict or ``"not scored"``), ``check_errors``.

    Raises:
        ValueError: fewer than 2 pairs left after filtering.
    """
    from scipy.stats import norm

    from captum_iglens.validate.ablation import BlockAblation
    from captum_iglens.validate.patching import patch_pairs

    prereg = load_preregistration()
    kept, _ = aligned(tokenizer, pairs)
    good = answered(tokenizer, kept, _next_token(model))
    used = good[:max_pairs] if max_pairs is not None else good
    counts = {"given": len(pairs), "aligned": len(kept), "answered": len(good),
              "used": len(used)}
    if len(used) < 2:
        raise ValueError(f"{family} / {task}: {counts}: fewer than 2 pairs align and are "
                         "answered right by the model; nothing to score.")
    patches, _ = patch_pairs(BlockAblation(model), tokenizer, used, progress)
    clusters = couple_clusters([p.pair for p in patches])
    alpha = prereg.alpha_corrected
    power_z = float(norm.ppf(1 - alpha) + norm.ppf(float(prereg.statistics["power"])))
    scores: dict[str, Any] = {}
    rho: dict[str, dict[str, np.ndarray]] = {}
    for view, field in PATCH_VIEWS.items():
        full = np.stack([getattr(p, field).double().numpy() for p in patches])
        found = _predictors(patches, full, clusters, seed)
        rho[view] = {name: _rho(found[name][:, 1:], full[:, 1:]) for name in SCORED}
        scores[view] = {name: _summary(rho[view][name], clusters, n_boot, seed, power_z)
                        for name in SCORED}
        for entry in prereg.data["predictors"]:
            scores[view].setdefault(entry["name"], "not scored")
    errors = {k: max(p.check_errors[k] for p in patches) for k in patches[0].check_errors}
    return {"family": family, "task": task, "counts": counts, "scores": scores,
            "hypotheses": hypothesis_verdicts(rho, clusters, prereg),
            "per_pair_rho": {v: {k: r.tolist() for k, r in d.items()} for v, d in rho.items()},
            "pair_ids": [p.pair.id for p in patches], "cluster_labels": clusters.tolist(),
            "check_errors": errors, "clusters": int(len(np.unique(clusters)))}


def hypothesis_verdicts(rho: Mapping[str, Mapping[str, np.ndarray]], clusters: np.ndarray,
                        prereg: Any) -> dict[str, dict[str, Any]]:
    """The pre-registered decision of every hypothesis this version can score.

    A rho hypothesis on a scored intervention whose two predictors are scored is decided by
    :func:`~captum_iglens.validate.benchmark.decide.decide` on the per-pair differences of
    rho (the file's resamples, level and minimum n); every other one is ``"n/a"`` with the
    reason ``"not scored by this version"``.

    Args:
        rho (mapping): intervention -> predictor -> ``[P]`` per-pair Spearman rho.
        clusters (ndarray): ``[P]`` cluster of each pair (mirrored couples shared).
        prereg (Preregistration): The rules.

    Returns:
        dict: hypothesis id -> the fields of its
        :class:`~captum_iglens.validate.benchmark.decide.Cell` (and its statement).
    """
    from dataclasses import asdict

    from captum_iglens.validate.benchmark.decide import decide

    out = {}
    for h in prereg.hypotheses:
        view, versus = rho.get(h["intervention"], {}), h["versus"]
        usable = (h["statistic"] == "rho" and isinstance(versus, str)
                  and h["predictor"] in view and versus in view)
        if not usable:
            out[h["id"]] = {"verdict": "n/a", "reason": "not scored by this version",
                            "statement": h["statement"]}
            continue
        cell = decide(view[h["predictor"]] - view[versus], clusters, prereg, h["direction"])
        out[h["id"]] = {**asdict(cell), "statement": h["statement"]}
    return out


def markdown_table(cells: Sequence[Mapping[str, Any]], view: str = "patch") -> str:
    """Predictors x (family, task): ``mean rho [95% CI] (n)`` under one intervention."""
    prereg = load_preregistration()
    names = [p["name"] for p in prereg.data["predictors"]]
    heads = [f"{c['family']} / {c['task']}" for c in cells]
    lines = [f"| predictor ({view}: mean per-pair Spearman rho [95% CI] (n)) | "
             + " | ".join(heads) + " |", "| --- |" + " --- |" * len(cells)]
    for name in names:
        row = []
        for cell in cells:
            s = cell["scores"][view].get(name, "not scored")
            if isinstance(s, str):
                row.append(s)
            elif not math.isfinite(s["mean"]):
                row.append(f"n/a ({s['n']})")
            else:
                row.append(f"{s['mean']:+.2f} [{s['low']:+.2f}, {s['high']:+.2f}] ({s['n']})")
        lines.append(f"| {name} | " + " | ".join(row) + " |")
    return "\n".join(lines)


def hypotheses_table(cells: Sequence[Mapping[str, Any]]) -> str:
    """Hypotheses x (family, task): the pre-registered verdict, the mean and its MDE."""
    prereg = load_preregistration()
    heads = [f"{c['family']} / {c['task']}" for c in cells]
    lines = ["| hypothesis (mean per-pair difference; MDE) | " + " | ".join(heads) + " |",
             "| --- |" + " --- |" * len(cells)]
    for h in prereg.hypotheses:
        row = []
        for cell in cells:
            found = cell.get("hypotheses", {}).get(h["id"], {"verdict": "n/a"})
            value, mde = found.get("value", math.nan), found.get("mde", math.nan)
            row.append(found["verdict"] if not math.isfinite(value) else
                       f"{found['verdict']} ({value:+.2f}; {mde:.2f})")
        lines.append(f"| {h['id']} {h['statement']} | " + " | ".join(row) + " |")
    return "\n".join(lines)


def cell_path(out_dir: Path, family: str, task: str) -> Path:
    """Where the cell of (family, task) is written."""
    safe = "".join(ch if ch.isalnum() or ch in "-_." else "_" for ch in f"{family}__{task}")
    return Path(out_dir) / "cells" / f"{safe}.json"


def load_cell(path: Path, digest: str) -> Optional[dict[str, Any]]:
    """The cell in ``path`` if it holds the fingerprint ``digest``, else None."""
    try:
        cell = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return cell if cell.get("fingerprint", {}).get("digest") == digest else None
