"""The benchmark's statistics: per-token agreement of every predictor, summaries, decisions.

Input is one (family, task) cell's *measurements* (:func:`~captum_iglens.validate.
benchmark.runner.measure_cell`, plain arrays, so that a test can plant them):

* ``drops``: intervention -> unit -> ``[N, n]`` (``"zero"``, ``"mean"``, ``"resample#s"``
  per seed ``s``, ``"patch"`` (recovery), ``"reverse patch"``);
* ``predictors``: reference group (``"zero"``, ``"mean"``, ``"patch"``) -> name -> ``[N, n]``;
* ``curves``: ranking name -> ``"deletion"`` / ``"keep"`` -> unit -> ``[N, n + 1]`` drops
  after ablating the top ``k`` (every block but the top ``k``) jointly, ``k = 0..n``;
  ``"random#s"`` per seed;
* ``subsets``: ``"s"`` -> ``masks`` ``[N, M, n]`` and ``drops`` ``[N, M]`` (probability),
  the joint zero ablation of random block subsets;
* ``nonmonotonic`` ``[N]`` and the cluster labels ``prompt`` / ``pair`` ``[N]``.

Per token: Spearman rho of predictor and drops over the blocks of a view (all blocks, and
the pre-registration's decided view without the intervention's excluded block), the onset
gain (:func:`~captum_iglens.validate.metrics.onset_gain`; a predictor's onset is the
half-point of its cumulative scores, "last layer always"'s the last block), the
comprehensiveness and sufficiency areas (mean over ``k``) and the infidelity
``mean_S (sum_{L in S} a_L - drop(S))^2`` (the formula of
:func:`captum.metrics.infidelity` with the block mask as the perturbation). "last layer
always", the other clusters' mean drop profile and random are made here
(:func:`derived_predictors`). Summaries: mean and median, cluster-bootstrap 95% interval,
``n``, minimum detectable effect; hypotheses through
:func:`~captum_iglens.validate.benchmark.decide.decide`.
"""

from __future__ import annotations

import math
from dataclasses import asdict
from typing import Any, Mapping, Optional, Sequence

import numpy as np

from captum_iglens.validate.benchmark.decide import Preregistration, decide
from captum_iglens.validate.metrics import half_point, onset_gain
from captum_iglens.validate.stats import cluster_bootstrap

__all__ = ["ABLATIONS", "CLUSTER_OF", "GROUP_OF", "INTERVENTIONS", "PATCHINGS",
           "PRIMARY_UNIT", "analyse", "derived_predictors", "excluded_blocks", "infidelity",
           "per_token", "predictor_names", "random_scores", "row_spearman", "summarise"]

ABLATIONS: tuple[str, ...] = ("zero", "mean", "resample")
PATCHINGS: tuple[str, ...] = ("patch", "reverse patch")
#: The single-block interventions scored by rho.
INTERVENTIONS: tuple[str, ...] = ABLATIONS + PATCHINGS
#: Intervention -> the predictors' reference group.
GROUP_OF: dict[str, str] = {"zero": "zero", "mean": "mean", "resample": "mean",
                            "patch": "patch", "reverse patch": "patch", "deletion": "zero",
                            "keep": "zero", "magnitude": "zero"}
#: Intervention -> the cluster labels its tokens are resampled by.
CLUSTER_OF: dict[str, str] = {k: "pair" if k in PATCHINGS else "prompt" for k in GROUP_OF}


def excluded_blocks(prereg: Preregistration) -> dict[str, int]:
    """Intervention -> the block (column) its decided view leaves out (pre-registered)."""
    return {i["name"]: int(i["excluded_block"]) for i in prereg.data["interventions"]
            if "excluded_block" in i}


def PRIMARY_UNIT(prereg: Preregistration, intervention: str) -> str:  # noqa: N802
    """The pre-registered primary unit of an intervention."""
    units = prereg.data["primary_unit"]
    if intervention in PATCHINGS:
        return units["patching"]
    if intervention in ("deletion", "keep"):
        return units["curves"]
    return units["ablation"]


def predictor_names(prereg: Preregistration) -> list[str]:
    """The pre-registration's predictors, in its order."""
    return [p["name"] for p in prereg.data["predictors"]]


def random_scores(seed: int, n_tokens: int, n: int) -> np.ndarray:
    """The random predictor: ``[N, n]`` standard normal scores of ``default_rng(seed)``."""
    return np.random.default_rng(seed).standard_normal((n_tokens, n))


def others_mean(drops: np.ndarray, clusters: np.ndarray) -> np.ndarray:
    """Each token's predictor: the mean drop profile of the tokens of the other clusters."""
    out = np.zeros_like(drops, dtype=np.float64)
    for c in np.unique(clusters):
        rest = clusters != c
        out[clusters == c] = np.nanmean(drops[rest], axis=0) if rest.any() else np.nan
    return out


def derived_predictors(drops: np.ndarray, clusters: np.ndarray, seed: int
                       ) -> dict[str, np.ndarray]:
    """``last layer always``, ``other prompts' mean drop profile`` and ``random``, ``[N, n]``."""
    n_tokens, n = drops.shape
    return {"last layer always": np.tile(np.arange(1, n + 1, dtype=np.float64), (n_tokens, 1)),
            "other prompts' mean drop profile": others_mean(drops, clusters),
            "random": random_scores(seed, n_tokens, n)}


def row_spearman(scores: np.ndarray, drops: np.ndarray) -> np.ndarray:
    """Per-row Spearman rho (average ranks for ties, as :func:`scipy.stats.spearmanr`).

    Returns:
        ndarray: ``[N]`` float64; NaN for a row that is constant or holds a NaN.
    """
    from scipy.stats import rankdata

    a, b = np.asarray(scores, np.float64), np.asarray(drops, np.float64)
    bad = np.asarray(~(np.isfinite(a).all(1) & np.isfinite(b).all(1)), bool)
    a, b = np.where(bad[:, None], 0.0, a), np.where(bad[:, None], 0.0, b)
    ra, rb = rankdata(a, axis=1), rankdata(b, axis=1)
    ra, rb = ra - ra.mean(1, keepdims=True), rb - rb.mean(1, keepdims=True)
    den = np.sqrt((ra ** 2).sum(1) * (rb ** 2).sum(1))
    with np.errstate(invalid="ignore", divide="ignore"):
        rho = (ra * rb).sum(1) / den
    rho[bad | ~(den > 0)] = np.nan
    return np.clip(rho, -1.0, 1.0)


def infidelity(scores: np.ndarray, masks: np.ndarray, joint: np.ndarray) -> np.ndarray:
    """``[N]``: ``mean over subsets of (sum of the subset's scores - its joint drop)^2``.

    Yeh et al. 2019's infidelity (the formula of :func:`captum.metrics.infidelity`, not
    normalised) with the perturbation ``I`` the subset's indicator on the blocks: the
    predictor's ``I . a`` against the drop of ablating the subset jointly.

    Args:
        scores (ndarray): ``[N, n]`` per-block scores (probability units).
        masks (ndarray): ``[N, M, n]`` bool subsets.
        joint (ndarray): ``[N, M]`` drops of the subsets ablated jointly.
    """
    pred = np.einsum("nmk,nk->nm", np.asarray(masks, np.float64),
                     np.asarray(scores, np.float64))
    return ((pred - np.asarray(joint, np.float64)) ** 2).mean(1)


def summarise(values: np.ndarray, clusters: np.ndarray, n_boot: int, seed: int,
              power_z: float) -> dict[str, Any]:
    """Mean, median, 95% cluster-bootstrap intervals, ``n``, clusters, MDE of per-token values.

    ``mde`` is ``power_z`` times the bootstrap standard error of the mean (``power_z =
    z(1 - alpha_corrected) + z(power)``); ``median_on_bound`` flags a median equal to an end
    of its own interval (then only the mean is read).
    """
    values, clusters = np.asarray(values, np.float64), np.asarray(clusters)
    keep = np.isfinite(values)
    values, clusters = values[keep], clusters[keep]
    groups = [np.flatnonzero(clusters == c) for c in np.unique(clusters)]
    cell: dict[str, Any] = {"n": int(len(values)), "clusters": len(groups)}
    nan = math.nan
    if len(groups) < 2:
        return {**cell, "mean": float(np.mean(values)) if len(values) else nan,
                "median": nan, "low": nan, "high": nan, "median_low": nan,
                "median_high": nan, "median_on_bound": False, "mde": nan}
    draws, point = cluster_bootstrap(np.stack([values, values], 1), np.array([True, False]),
                                     groups, n_boot, seed, return_draws=True)
    low, high = np.percentile(draws[:, 0], [2.5, 97.5])
    m_low, m_high = np.percentile(draws[:, 1], [2.5, 97.5])
    median = float(point[1])
    tol = 4 * np.finfo(np.float64).eps * max(1.0, abs(median))
    return {**cell, "mean": float(point[0]), "median": median, "low": float(low),
            "high": float(high), "median_low": float(m_low), "median_high": float(m_high),
            "median_on_bound": bool(min(abs(median - m_low), abs(median - m_high)) <= tol),
            "mde": float(power_z * np.std(draws[:, 0], ddof=1))}


def _view(matrix: np.ndarray, excluded: Optional[int]) -> np.ndarray:
    if excluded is None:
        return matrix
    return np.delete(matrix, excluded % matrix.shape[1], axis=1)


def _rho_part(data: Mapping[str, Any], kind: str, seed: int, prereg: Preregistration,
              out: dict[str, Any]) -> None:
    """Rho (every unit and view) and, for patching, the onset gain of one intervention."""
    names = predictor_names(prereg)
    excl = excluded_blocks(prereg).get(kind)
    key = f"resample#{seed}" if kind == "resample" else kind
    if key not in data["drops"]:
        return
    group = data["predictors"][GROUP_OF[kind]]
    cl = np.asarray(data["clusters"][CLUSTER_OF[kind]])
    by_unit = {}
    for unit, drops in data["drops"][key].items():
        drops = np.asarray(drops, np.float64)
        scores = {**{k: np.asarray(v, np.float64) for k, v in group.items()},
                  **derived_predictors(drops, cl, seed)}
        present = [name for name in names if name in scores]
        by_unit[unit] = {view: {name: row_spearman(_view(scores[name], ex), _view(drops, ex))
                                for name in present}
                         for view, ex in (("all", None), ("decided", excl))}
        if kind in PATCHINGS and unit == PRIMARY_UNIT(prereg, kind):
            d = _view(drops, excl)
            half = half_point(np.nan_to_num(d).cumsum(1))
            gains = {}
            for name in present:
                sc = _view(scores[name], excl)
                onset = half_point(np.nan_to_num(sc).cumsum(1))
                if name == "last layer always":  # it names the last block, whatever the rule
                    onset = np.full(len(sc), sc.shape[1] - 1)
                g = onset_gain(onset, half, d.shape[1])
                gains[name] = np.where(np.isfinite(sc).all(1) & np.isfinite(d).all(1), g,
                                       np.nan)
            out["onset_gain"][kind] = gains
    out["rho"][kind] = by_unit


def _curve_part(data: Mapping[str, Any], seed: int, prereg: Preregistration,
                out: dict[str, Any]) -> None:
    """Comprehensiveness and sufficiency areas, and the infidelity, of one seed."""
    for name, curve in data.get("curves", {}).items():
        if "#" in name:
            base, s = name.split("#")
            if int(s) != seed:
                continue
            name = base
        for stat, part in (("comprehensiveness", "deletion"), ("sufficiency", "keep")):
            out[stat][name] = {u: np.asarray(v, np.float64).mean(1)
                               for u, v in curve[part].items()}
    subsets = data.get("subsets", {}).get(str(seed))
    if subsets is None or "zero" not in data["drops"]:
        return
    zdrops = np.asarray(data["drops"]["zero"]["probability"], np.float64)
    scores = {**{k: np.asarray(v, np.float64) for k, v in data["predictors"]["zero"].items()},
              **derived_predictors(zdrops, np.asarray(data["clusters"]["prompt"]), seed)}
    for name in predictor_names(prereg):
        if name in scores:
            out["infidelity"][name] = infidelity(scores[name], subsets["masks"],
                                                 subsets["drops"])


def per_token(data: Mapping[str, Any], seed: int, prereg: Preregistration
              ) -> dict[str, Any]:
    """Every per-token value of one seed: rho, onset gain, areas, infidelity.

    Returns:
        dict: ``rho`` (intervention -> unit -> view (``"all"`` / ``"decided"``) -> name ->
        ``[N]``), ``onset_gain`` (patching -> name -> ``[N]``, decided view, primary unit),
        ``comprehensiveness`` / ``sufficiency`` (name -> unit -> ``[N]``), ``infidelity``
        (name -> ``[N]``).
    """
    out: dict[str, Any] = {"rho": {}, "onset_gain": {}, "comprehensiveness": {},
                           "sufficiency": {}, "infidelity": {}}
    for kind in INTERVENTIONS:
        _rho_part(data, kind, seed, prereg, out)
    _curve_part(data, seed, prereg, out)
    return out


def _statistic(h: Mapping[str, Any], values: Mapping[str, Any], data: Mapping[str, Any],
               prereg: Preregistration) -> tuple[Any, Any, float, str]:
    """``(values [N], clusters [N], null, reason)`` of one hypothesis; reason when n/a."""
    kind, stat, pred, versus = h["intervention"], h["statistic"], h["predictor"], h["versus"]
    clusters = np.asarray(data["clusters"][CLUSTER_OF.get(kind, "prompt")])
    if stat == "rho" or stat.startswith("rho gap"):
        view = values["rho"].get(kind, {}).get(PRIMARY_UNIT(prereg, kind), {}).get(
            "decided", {})
        if pred not in view or versus not in view:
            return None, None, 0.0, f"{kind}: not measured in this cell"
        diff = view[pred] - view[versus]
        if stat == "rho":
            return diff, clusters, 0.0, ""
        flags = np.asarray(data["nonmonotonic"], bool)
        ok = np.isfinite(diff)
        frac_nm = float((flags & ok).sum()) / max(int(ok.sum()), 1)
        if not 0 < frac_nm < 1:
            return None, None, 0.0, "no token in one of the two trajectory groups"
        weights = np.where(flags, 1.0 / frac_nm, -1.0 / (1.0 - frac_nm))
        return diff * weights, clusters, 0.0, ""
    if stat == "onset gain":
        gains = values["onset_gain"].get(kind, {})
        if pred not in gains:
            return None, None, 0.0, f"{kind}: not measured in this cell"
        if versus == "chance":
            return gains[pred], clusters, 0.0, ""
        return gains[pred] - gains[versus], clusters, 0.0, ""
    table = {"comprehensiveness": "comprehensiveness", "infidelity": "infidelity"}[stat]
    found = values[table]
    if pred not in found or versus not in found:
        return None, None, 0.0, f"{kind}: not measured in this cell"
    a, b = found[pred], found[versus]
    if isinstance(a, Mapping):
        unit = PRIMARY_UNIT(prereg, kind)
        a, b = a[unit], b[unit]
    return a - b, clusters, 0.0, ""


def hypotheses(values: Mapping[str, Any], data: Mapping[str, Any], prereg: Preregistration,
               seed: int, n_boot: Optional[int] = None) -> dict[str, dict[str, Any]]:
    """Every pre-registered hypothesis decided on one seed's per-token values.

    A hypothesis with two comparators (B6: chance and "last layer always") is decided on
    each (``parts``) and is supported only when both are; its reported numbers are the
    first comparator's.

    Returns:
        dict: id -> the :class:`~captum_iglens.validate.benchmark.decide.Cell` fields,
        ``statement`` and (B6) ``parts``.
    """
    out = {}
    for h in prereg.hypotheses:
        comparators = h["versus"] if isinstance(h["versus"], (list, tuple)) else [h["versus"]]
        parts = []
        for versus in comparators:
            v, cl, null, reason = _statistic({**h, "versus": versus}, values, data, prereg)
            if v is None:
                parts.append({"verdict": "n/a", "reason": reason, "versus": versus})
                continue
            cell = decide(v, cl, prereg, h["direction"], null, n_boot, seed)
            parts.append({**asdict(cell), "versus": versus})
        first = dict(parts[0])
        verdicts = [p["verdict"] for p in parts]
        if "n/a" in verdicts:
            first["verdict"] = "n/a"
            first["reason"] = "; ".join(p.get("reason", "") for p in parts if p.get("reason"))
        elif all(v == "supported" for v in verdicts):
            first["verdict"] = "supported"
        elif "reversed" in verdicts and "supported" not in verdicts:
            first["verdict"] = "reversed"
        else:
            first["verdict"] = "not supported"
        first["statement"] = h["statement"]
        if len(parts) > 1:
            first["parts"] = parts
        out[h["id"]] = first
    return out


def analyse(data: Mapping[str, Any], prereg: Preregistration, n_boot: int,
            seeds: Sequence[int], n_boot_decide: Optional[int] = None) -> dict[str, Any]:
    """Scores, curves, magnitude and decisions of one cell's measurements.

    Args:
        data (mapping): The measurements (module docstring).
        prereg (Preregistration): The rules.
        n_boot (int): Resamples of the table's 95% intervals.
        seeds (sequence of int): The first decides and fills the tables; the others
            (the pre-registration's ``seed_robustness``) re-decide with their own random
            predictor, donors, subsets and bootstrap, and a verdict that moves is flagged
            ``unstable``.
        n_boot_decide (int, optional): Resamples of the decisions. Default: the file's.

    Returns:
        dict: ``scores`` (intervention -> unit -> view -> predictor -> summary), ``curves``
        (``comprehensiveness`` / ``sufficiency`` -> predictor -> unit -> summary),
        ``magnitude`` (predictor -> summary), ``hypotheses`` (id -> decision, with
        ``seed_verdicts`` and ``unstable``), ``per_token`` (the first seed's values).
    """
    from scipy.stats import norm

    alpha = prereg.alpha_corrected
    power_z = float(norm.ppf(1 - alpha) + norm.ppf(float(prereg.statistics["power"])))
    seed = int(seeds[0])
    values = per_token(data, seed, prereg)
    clusters = {k: np.asarray(v) for k, v in data["clusters"].items()}
    scores: dict[str, Any] = {}
    for kind, by_unit in values["rho"].items():
        cl = clusters[CLUSTER_OF[kind]]
        scores[kind] = {u: {view: {name: summarise(r, cl, n_boot, seed, power_z)
                                   for name, r in by_name.items()}
                            for view, by_name in by_view.items()}
                        for u, by_view in by_unit.items()}
    curves: dict[str, Any] = {}
    for stat in ("comprehensiveness", "sufficiency"):
        curves[stat] = {name: {u: summarise(v, clusters["prompt"], n_boot, seed, power_z)
                               for u, v in by_unit.items()}
                        for name, by_unit in values[stat].items()}
    magnitude = {name: summarise(v, clusters["prompt"], n_boot, seed, power_z)
                 for name, v in values["infidelity"].items()}
    decided = hypotheses(values, data, prereg, seed, n_boot_decide)
    for other in seeds[1:]:
        again = hypotheses(per_token(data, int(other), prereg), data, prereg, int(other),
                           n_boot_decide)
        for hid, cell in decided.items():
            cell.setdefault("seed_verdicts", {str(seed): cell["verdict"]})
            cell["seed_verdicts"][str(other)] = again[hid]["verdict"]
    for cell in decided.values():
        cell["unstable"] = len(set(cell.get("seed_verdicts", {}).values())) > 1
    return {"scores": scores, "curves": curves, "magnitude": magnitude,
            "hypotheses": decided, "per_token": _jsonable(values)}


def _jsonable(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {k: _jsonable(v) for k, v in value.items()}
    if isinstance(value, np.ndarray):
        return value.tolist()
    return value
