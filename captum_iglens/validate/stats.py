"""Statistics of the causal validation: predictors, per-token metrics, cluster bootstrap.

Pure numpy / scipy on per-token arrays (``N`` tokens x ``n`` blocks, column ``j`` = block
``j + 1``); :func:`captum_iglens.validate.driver.validate` feeds it. The onset layer is the
paper's (arXiv:2606.29693): the first block from which the cumulative credit stays at or
beyond half its sum.

Views: every intervention kind is scored on all its blocks and, where one block's drop is
tied to its credit by construction, also without that block (``exclude``): under zero
ablation the last block's drop *is* its credit (both ``f(h_n) - f(h_{n-1})``), and under
patching block 1's contrastive credit holds the jump from the corrupted reference's last
residual to the clean ``h_1``. The view without it is named ``"<kind> w/o block <L>"``.
"""

from __future__ import annotations

import warnings
from typing import Any, Mapping, Optional, Sequence

import numpy as np

from captum_iglens.validate.metrics import (
    METRICS,
    half_point,
    nonmonotonic,
    onset_gain,
    profile_free_spearman,
    token_metrics,
)

__all__ = ["MEANS", "METRICS", "PREDICTORS", "SUBSETS", "analyse", "cluster_bootstrap",
           "cluster_draws", "half_point", "nonmonotonic", "onset_gain", "onset_gain_chance",
           "profile_free_spearman", "token_metrics", "view_name"]

PREDICTORS: tuple[str, ...] = ("IG-Lens credit", "|credit|", "lens level", "direct effect",
                               "first layer", "last layer", "random", "other prompts")
SUBSETS: tuple[str, ...] = ("all", "monotonic", "non-monotonic")
#: Means beside the medians: ``"<metric>_mean"`` is the mean over tokens of ``<metric>``,
#: read where a median of discrete values sits on an end of its own CI.
MEANS: dict[str, str] = {"spearman_mean": "spearman", "onset_gain_mean": "onset_gain"}
_RATES = ("top1", "top3", *MEANS)


def view_name(kind: str, block: int) -> str:
    """Name of the view of ``kind`` without ``block`` (1-based), e.g. ``"zero w/o block 30"``."""
    return f"{kind} w/o block {block}"


def _statistic(columns: np.ndarray, rates: np.ndarray) -> np.ndarray:
    """Mean of the ``rates`` columns, median of the others, NaN ignored (fast path without)."""
    nan = np.isnan(columns).any(0)
    out = np.full(columns.shape[1], np.nan)
    if not len(columns):
        return out
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        out[rates] = np.nanmean(columns[:, rates], 0)
        out[~rates & ~nan] = np.median(columns[:, ~rates & ~nan], 0)
        if (~rates & nan).any():
            out[~rates & nan] = np.nanmedian(columns[:, ~rates & nan], 0)
    return out


def cluster_draws(n_clusters: int, n_boot: int, seed: int) -> np.ndarray:
    """The resampled clusters of every bootstrap of the package: ``[n_boot, n_clusters]``.

    Row ``b`` holds the cluster indices of resample ``b``, drawn with replacement by
    ``numpy.random.default_rng(seed)``. :func:`cluster_bootstrap` (the validation's tables
    and verdicts, the benchmark's decisions) and
    :func:`captum_iglens.summary.bootstrap.cluster_mean_ci` (summaries) both resample
    with it, so the same seed gives the same resamples.
    """
    return np.random.default_rng(seed).integers(0, n_clusters, (n_boot, n_clusters))


def onset_gain_chance(half: np.ndarray, n: int, draws: int = 2000, seed: int = 0) -> float:
    """Chance value of the median onset gain: its expectation under uniform random onsets.

    :func:`onset_gain` is zero in expectation per token, but its median over tokens is not
    (the distribution of ``E|R - h| - |R' - h|`` is skewed), so a median must be compared
    with this value, not with 0: the mean over ``draws`` seeded permutations of the median
    over tokens of the gain of an onset drawn uniformly over the ``n`` blocks.

    Args:
        half (ndarray): ``[N]`` half-drop column of each token (0-based).
        n (int): Blocks.
        draws (int, optional): Random onsets per token. Default: 2000.
        seed (int, optional): Default: 0.

    Returns:
        float: layers; NaN without tokens.
    """
    half = np.asarray(half)
    if not len(half):
        return float("nan")
    onsets = np.random.default_rng(seed).integers(0, n, (draws, len(half)))
    expected = np.abs(np.arange(n)[None, :] - half[:, None]).mean(1)
    return float(np.median(expected[None, :] - np.abs(onsets - half[None, :]), axis=1).mean())


def cluster_bootstrap(columns: np.ndarray, rates: np.ndarray, groups: Sequence[np.ndarray],
                      n_boot: int = 1000, seed: int = 0,
                      split: Optional[np.ndarray] = None,
                      return_draws: bool = False) -> Any:
    """Statistic and percentile 95% CI of every column, resampling clusters (prompts).

    The one cluster bootstrap of the validation: the H1-H3 tests
    (:mod:`captum_iglens.validate.verdict`) and every table use it.

    Args:
        columns (ndarray): ``[N, C]`` per-token values (NaN ignored).
        rates (ndarray): ``[C]`` bool: the mean for these columns, the median otherwise.
        groups (sequence of ndarray): token row indices of each non-empty cluster; the
            statistic is taken over these rows only (a subset of tokens).
        n_boot (int, optional): Resamples. Default: 1000.
        seed (int, optional): Seed of the resampling. Default: 0.
        split (ndarray, optional): ``[N]`` bool. The statistic is then the difference
            ``stat(rows with split) - stat(rows without)``, both from the same resampled
            clusters (a difference between two token subsets, paired by prompt).

        return_draws (bool, optional): Return ``(draws [n_boot, C], statistic [C])``
            instead of the percentile table (for other levels). Default: False.

    Returns:
        ndarray: ``[C, 3]`` (statistic, 2.5th percentile, 97.5th percentile); NaN where no
        token (or no cluster) is available.
    """
    if not groups:
        return np.full((len(rates), 3), np.nan)

    def statistic(rows: np.ndarray) -> np.ndarray:
        if split is None:
            return _statistic(columns[rows], rates)
        return (_statistic(columns[rows[split[rows]]], rates)
                - _statistic(columns[rows[~split[rows]]], rates))

    point = statistic(np.concatenate(list(groups)))
    picks = cluster_draws(len(groups), n_boot, seed)
    rows = np.concatenate(list(groups))
    if split is None and not np.isnan(columns[rows]).any():
        draws = _weighted_draws(columns, rates, groups, picks)
    else:
        draws = np.empty((n_boot, columns.shape[1]))
        for b, pick in enumerate(picks):
            draws[b] = statistic(np.concatenate([groups[g] for g in pick]))
    if return_draws:
        return draws, point
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        quantile = np.nanpercentile if np.isnan(draws).any() else np.percentile
        low, high = quantile(draws, [2.5, 97.5], axis=0)
    return np.stack([point, low, high], 1)


_BATCH_ELEMENTS = 1 << 22  # resample x token weights held at once by _weighted_draws


def _weighted_draws(columns: np.ndarray, rates: np.ndarray, groups: Sequence[np.ndarray],
                    picks: np.ndarray) -> np.ndarray:
    """The statistic of every resample without concatenating rows (no NaN, no split).

    A resample is a multiplicity per cluster; a token weighs its cluster's. The mean is the
    weighted mean; the median is read from the cumulative weights of each column's sorted
    tokens: the two middle ranks of the concatenated resample, averaged as ``np.median``
    does, so the values are those of the loop over concatenations.
    """
    rows = np.concatenate(list(groups))
    label = np.concatenate([np.full(len(g), j) for j, g in enumerate(groups)])
    values = columns[rows]  # [N, C]
    n_boot, n_groups = picks.shape
    draws = np.empty((n_boot, columns.shape[1]))
    sizes = np.array([len(g) for g in groups], dtype=np.float64)
    sums = np.stack([values[label == j][:, rates].sum(0) for j in range(n_groups)])
    order = np.argsort(values, axis=0, kind="stable")
    medians = np.flatnonzero(~rates)
    step = max(1, _BATCH_ELEMENTS // max(len(rows), n_groups))
    for b in range(0, n_boot, step):
        part = picks[b:b + step]
        offsets = part + n_groups * np.arange(len(part))[:, None]
        counts = np.bincount(offsets.reshape(-1), minlength=len(part) * n_groups).reshape(
            len(part), n_groups)  # resample x cluster multiplicities
        if rates.any():
            draws[b:b + step, rates] = (counts @ sums) / (counts @ sizes)[:, None]
        for c in medians:
            cum = np.cumsum(counts[:, label[order[:, c]]], axis=1)  # [b, N]
            total = cum[:, -1]
            lower = (cum <= ((total - 1) // 2)[:, None]).sum(1)
            upper = (cum <= (total // 2)[:, None]).sum(1)
            sorted_values = values[order[:, c], c]
            draws[b:b + step, c] = (sorted_values[lower] + sorted_values[upper]) / 2
    return draws


def predictor_scores(credits: np.ndarray, lens: np.ndarray, direct: np.ndarray,
                     onset: np.ndarray, drops: np.ndarray, prompt: np.ndarray,
                     random: np.ndarray) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Every predictor of :data:`PREDICTORS`: ``[N, n]`` scores and ``[N]`` onset column.

    Args:
        credits (ndarray): ``[N, n]`` IG-Lens credits, probability units.
        lens (ndarray): ``[N, n]`` logit-lens levels ``f(h_L)``.
        direct (ndarray): ``[N, n]`` direct effects ``f(h_n) - f(h_n - u_L)``.
        onset (ndarray): ``[N]`` IG-Lens onset column (0-based).
        drops (ndarray): ``[N, n]`` drops of one ablation kind (for "other prompts").
        prompt (ndarray): ``[N]`` prompt index of each token.
        random (ndarray): ``[N, n]`` random scores.

    Onsets, all by the rule of :func:`half_point`: IG-Lens's own (cumulative credit); the
    lens level itself; the cumulative direct effects and the other prompts' drop profile;
    block 1, block ``n`` and the random top block for the three baselines.
    """
    n_tok, n = credits.shape
    layers = np.broadcast_to(np.arange(n, dtype=np.float64), (n_tok, n))
    others = np.zeros_like(drops)
    for p in np.unique(prompt):
        rest = prompt != p
        others[prompt == p] = drops[rest].mean(0) if rest.any() else 0.0
    return {
        "IG-Lens credit": (credits, onset), "|credit|": (np.abs(credits), onset),
        "lens level": (lens, half_point(lens)),
        "direct effect": (direct, half_point(direct.cumsum(1))),
        "first layer": (-layers, np.zeros(n_tok, dtype=int)),
        "last layer": (layers.copy(), np.full(n_tok, n - 1)),
        "random": (random, random.argmax(1)),
        "other prompts": (others, half_point(others.cumsum(1))),
    }


def _columns(metrics: dict[str, dict[str, dict[str, np.ndarray]]]
             ) -> tuple[list[tuple[str, ...]], np.ndarray]:
    """Every (table, view, predictor, metric) column of the bootstrap.

    The metrics themselves (and the means of :data:`MEANS`), and the paired differences
    IG-Lens credit minus each other predictor, token by token.
    """
    keys: list[tuple[str, ...]] = []
    cols = []
    for view, by_name in metrics.items():
        ours = by_name[PREDICTORS[0]]
        for name, values in by_name.items():
            for metric in (*METRICS, *MEANS):
                of = MEANS.get(metric, metric)
                keys.append(("summary", view, name, metric))
                cols.append(values[of])
                if name != PREDICTORS[0]:
                    keys.append(("paired", view, name, metric))
                    cols.append(ours[of] - values[of])
    return keys, np.stack(cols, axis=1)


def _views(drops: Mapping[str, np.ndarray], exclude: Mapping[str, int]
           ) -> list[tuple[str, str, np.ndarray]]:
    """``(view, kind, columns)``: every kind on all blocks, then without its excluded one."""
    views = []
    for kind, kind_drops in drops.items():
        n = kind_drops.shape[1]
        views.append((kind, kind, np.arange(n)))
        if kind in exclude:
            col = exclude[kind] % n
            views.append((view_name(kind, col + 1), kind, np.delete(np.arange(n), col)))
    return views


def _view_metrics(arrays: Mapping[str, np.ndarray], onset: np.ndarray, cols: np.ndarray,
                  kind_drops: np.ndarray, prompt: np.ndarray, random: np.ndarray
                  ) -> dict[str, dict[str, np.ndarray]]:
    """Every predictor's metrics on the blocks ``cols`` (onsets recomputed on a subset)."""
    full = len(cols) == kind_drops.shape[1]
    sub = {k: v[:, cols] for k, v in arrays.items()}
    own_onset = onset if full else half_point(sub["credits"].cumsum(1))
    drops = kind_drops[:, cols]
    scores = predictor_scores(sub["credits"], sub["lens"], sub["direct"], own_onset, drops,
                              prompt, random[:, cols])
    out = {name: token_metrics(s, o, drops, prompt) for name, (s, o) in scores.items()}
    # The other prompts' profile is itself built from the drops the residual ranks remove:
    # its profile-free rho is negative by construction, not a measurement.
    out["other prompts"]["spearman_token"] = np.full(len(drops), np.nan)
    return out


def analyse(credits: np.ndarray, lens: np.ndarray, direct: np.ndarray, onset: np.ndarray,
            drops: dict[str, np.ndarray], prompt: np.ndarray, n_boot: int = 1000,
            seed: int = 0, nonmonotonic_tol: float = 0.05,
            exclude: Optional[Mapping[str, int]] = None) -> dict[str, Any]:
    """Per-token metrics of every predictor and view, and their bootstrap summaries.

    Args:
        credits (ndarray): ``[N, n]`` IG-Lens credits (probability units).
        lens (ndarray): ``[N, n]`` logit-lens levels ``f(h_L)``.
        direct (ndarray): ``[N, n]`` direct effects ``f(h_n) - f(h_n - u_L)``.
        onset (ndarray): ``[N]`` IG-Lens onset column (0-based), all blocks.
        drops (dict): kind -> ``[N, n]`` drops (or recoveries) of that intervention.
        prompt (ndarray): ``[N]`` prompt (cluster) of each token.
        n_boot (int, optional): Bootstrap resamples. Default: 1000.
        seed (int, optional): Seeds the random predictor and the bootstrap. Default: 0.
        nonmonotonic_tol (float, optional): See :func:`nonmonotonic`. Default: 0.05.
        exclude (mapping, optional): kind -> column whose block is also left out in a
            second view (``-1``: the last block). Default: none.

    Returns:
        dict with ``metrics`` (view -> predictor -> metric -> ``[N]``), ``nonmonotonic``
        (``[N]`` bool), ``views`` (view -> kind), ``summary`` and ``paired`` (subset -> view
        -> predictor -> metric -> ``[statistic, low, high]``, 95% CI clustered by prompt)
        ``contrast`` (view -> predictor -> metric -> the same for the difference
        non-monotonic minus monotonic tokens, summary columns and paired ones under
        ``"summary"`` / ``"paired"``) and ``chance`` (view -> ``{"onset_gain": value}``,
        :func:`onset_gain_chance` of the view's half-drop blocks).
    """
    random = np.random.default_rng(seed).standard_normal(credits.shape)
    arrays = {"credits": credits, "lens": lens, "direct": direct}
    views = _views(drops, exclude or {})
    metrics = {view: _view_metrics(arrays, onset, cols, drops[kind], prompt, random)
               for view, kind, cols in views}
    keys, columns = _columns(metrics)
    rates = np.array([key[-1] in _RATES for key in keys])
    flags = nonmonotonic(lens, nonmonotonic_tol)
    chance = {view: {"onset_gain": onset_gain_chance(
        half_point(drops[kind][:, cols].cumsum(1)), len(cols), seed=seed)}
        for view, kind, cols in views}
    out: dict[str, Any] = {"metrics": metrics, "nonmonotonic": flags, "summary": {},
                           "chance": chance,
                           "paired": {}, "contrast": {"summary": {}, "paired": {}},
                           "views": {view: kind for view, kind, _ in views}}
    masks = (np.ones_like(flags), ~flags, flags)
    for subset, mask in zip(SUBSETS, masks, strict=True):
        table = cluster_bootstrap(columns, rates, _groups(prompt, mask), n_boot, seed)
        _store(out, keys, table, subset)
    table = cluster_bootstrap(columns, rates, _groups(prompt, np.ones_like(flags)), n_boot,
                              seed, split=flags)
    _store(out["contrast"], keys, table, None)
    return out


def _groups(prompt: np.ndarray, mask: np.ndarray) -> list[np.ndarray]:
    """Row indices of each prompt's tokens within ``mask`` (empty prompts dropped)."""
    groups = [np.flatnonzero(mask & (prompt == p)) for p in np.unique(prompt)]
    return [g for g in groups if len(g)]


def _store(out: dict, keys: list[tuple[str, ...]], table: np.ndarray,
           subset: Optional[str]) -> None:
    """File each bootstrap row under ``out[table][subset][view][predictor][metric]``."""
    for key, row in zip(keys, table, strict=True):
        node = out[key[0]]
        if subset is not None:
            node = node.setdefault(subset, {})
        node = node.setdefault(key[1], {}).setdefault(key[2], {})
        node[key[3]] = [float(v) for v in row]
