"""Statistics of the causal validation: predictors, per-token metrics, cluster bootstrap.

Pure numpy / scipy on per-token arrays (``N`` tokens x ``n`` blocks, column ``j`` = block
``j + 1``); :func:`captum_iglens.validate.validate` feeds it. The onset layer is the
paper's (arXiv:2606.29693): the first block where cumulative ``|credit|`` reaches half.
"""

from __future__ import annotations

import warnings
from typing import Any, Sequence

import numpy as np
from scipy import stats

__all__ = ["METRICS", "PREDICTORS", "SUBSETS", "analyse", "cluster_bootstrap", "half_point",
           "nonmonotonic", "token_metrics"]

PREDICTORS: tuple[str, ...] = ("IG-Lens credit", "|credit|", "lens level", "direct effect",
                               "first layer", "last layer", "random", "other prompts")
#: Per-token metrics; ``top1`` / ``top3`` are summarised by their mean, the rest by the median.
METRICS: tuple[str, ...] = ("spearman", "top1", "top3", "pct_top", "pct_onset", "onset_dist")
SUBSETS: tuple[str, ...] = ("all", "non-monotonic")
_RATES = ("top1", "top3")


def half_point(cumulative: np.ndarray) -> np.ndarray:
    """The first column from which a cumulative curve stays at or beyond half its end.

    The rule of IG-Lens's default ("sustained") onset: for ``[N, n]`` cumulative values
    ``C`` with end ``C_n`` and ``s`` its sign, the first ``j`` with ``s C_j' >= s C_n / 2``
    for every ``j' >= j``.

    Returns:
        ndarray: ``[N]`` int columns (0-based); ``n - 1`` at the latest.
    """
    end = cumulative[:, -1:]
    sign = np.where(end < 0, -1.0, 1.0)
    slack = 1e-12 * np.abs(cumulative).max(1, keepdims=True)
    failing = sign * cumulative < sign * 0.5 * end - slack
    n = cumulative.shape[1]
    last_fail = np.where(failing.any(1), n - 1 - np.argmax(failing[:, ::-1], axis=1), -1)
    return np.minimum(last_fail + 1, n - 1)


def _spearman(scores: np.ndarray, drops: np.ndarray) -> np.ndarray:
    """Per-row Spearman rho: the Pearson correlation of the rows' average ranks.

    Equal to :func:`scipy.stats.spearmanr` row by row (ties get average ranks), without its
    all-pairs matrix and p-values; NaN for a constant row.
    """
    a = stats.rankdata(scores, axis=1)
    b = stats.rankdata(drops, axis=1)
    a -= a.mean(1, keepdims=True)
    b -= b.mean(1, keepdims=True)
    norm = np.sqrt((a * a).sum(1) * (b * b).sum(1))
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(norm > 0, (a * b).sum(1) / norm, np.nan)


def _percentile(drops: np.ndarray, cols: np.ndarray) -> np.ndarray:
    """Percentile (0-100, ties halved) of the drop at column ``cols[t]`` among row ``t``."""
    value = drops[np.arange(drops.shape[0]), cols][:, None]
    return 50.0 * ((drops < value).sum(1) + (drops <= value).sum(1)) / drops.shape[1]


def token_metrics(scores: np.ndarray, onset: np.ndarray, drops: np.ndarray
                  ) -> dict[str, np.ndarray]:
    """Per-token agreement of a predictor with the ablation drops.

    Args:
        scores (ndarray): ``[N, n]`` predictor scores (higher = more important).
        onset (ndarray): ``[N]`` int column (0-based block) the predictor marks as onset.
        drops (ndarray): ``[N, n]`` ablation drops, probability units.

    Returns:
        dict: each of :data:`METRICS` -> ``[N]`` float64 (``top1``/``top3`` are 0/1).
    """
    top = scores.argmax(1)
    ranked = np.argsort(-drops, axis=1, kind="stable")
    return {
        "spearman": _spearman(scores, drops),
        "top1": (top == ranked[:, 0]).astype(np.float64),
        "top3": (ranked[:, :3] == top[:, None]).any(1).astype(np.float64),
        "pct_top": _percentile(drops, top),
        "pct_onset": _percentile(drops, onset),
        "onset_dist": np.abs(onset - half_point(drops.cumsum(1))).astype(np.float64),
    }


def nonmonotonic(lens: np.ndarray, tol: float) -> np.ndarray:
    """Whether the logit-lens trajectory falls more than ``tol`` below its running maximum."""
    return (np.maximum.accumulate(lens, axis=1) - lens).max(1) > tol


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


def cluster_bootstrap(columns: np.ndarray, rates: np.ndarray, groups: Sequence[np.ndarray],
                      n_boot: int = 1000, seed: int = 0) -> np.ndarray:
    """Statistic and percentile 95% CI of every column, resampling clusters (prompts).

    Args:
        columns (ndarray): ``[N, C]`` per-token values (NaN ignored).
        rates (ndarray): ``[C]`` bool: the mean for these columns, the median otherwise.
        groups (sequence of ndarray): token row indices of each non-empty cluster; the
            statistic is taken over these rows only (a subset of tokens).
        n_boot (int, optional): Resamples. Default: 1000.
        seed (int, optional): Seed of the resampling. Default: 0.

    Returns:
        ndarray: ``[C, 3]`` (statistic, 2.5th percentile, 97.5th percentile); NaN where no
        token (or no cluster) is available.
    """
    if not groups:
        return np.full((len(rates), 3), np.nan)
    point = _statistic(columns[np.concatenate(list(groups))], rates)
    rng = np.random.default_rng(seed)
    draws = np.empty((n_boot, columns.shape[1]))
    for b in range(n_boot):
        pick = rng.integers(0, len(groups), len(groups))
        draws[b] = _statistic(columns[np.concatenate([groups[g] for g in pick])], rates)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        quantile = np.nanpercentile if np.isnan(draws).any() else np.percentile
        low, high = quantile(draws, [2.5, 97.5], axis=0)
    return np.stack([point, low, high], 1)


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
    """Every (table, kind, predictor, metric) column of the bootstrap.

    The metrics themselves, and the paired differences IG-Lens credit minus each other
    predictor, token by token.
    """
    keys: list[tuple[str, ...]] = []
    cols = []
    for kind, by_name in metrics.items():
        ours = by_name[PREDICTORS[0]]
        for name, values in by_name.items():
            for metric in METRICS:
                keys.append(("summary", kind, name, metric))
                cols.append(values[metric])
                if name != PREDICTORS[0]:
                    keys.append(("paired", kind, name, metric))
                    cols.append(ours[metric] - values[metric])
    return keys, np.stack(cols, axis=1)


def analyse(credits: np.ndarray, lens: np.ndarray, direct: np.ndarray, onset: np.ndarray,
            drops: dict[str, np.ndarray], prompt: np.ndarray, n_boot: int = 1000,
            seed: int = 0, nonmonotonic_tol: float = 0.05) -> dict[str, Any]:
    """Per-token metrics of every predictor and kind, and their bootstrap summaries.

    Returns:
        dict with ``metrics`` (kind -> predictor -> metric -> ``[N]``), ``nonmonotonic``
        (``[N]`` bool), ``summary`` and ``paired`` (subset -> kind -> predictor -> metric
        -> ``[statistic, low, high]``, 95% CI clustered by prompt).
    """
    random = np.random.default_rng(seed).standard_normal(credits.shape)
    metrics = {}
    for kind, kind_drops in drops.items():
        scores = predictor_scores(credits, lens, direct, onset, kind_drops, prompt, random)
        metrics[kind] = {name: token_metrics(s, o, kind_drops) for name, (s, o) in scores.items()}
    keys, columns = _columns(metrics)
    rates = np.array([key[-1] in _RATES for key in keys])
    flags = nonmonotonic(lens, nonmonotonic_tol)
    out: dict[str, Any] = {"metrics": metrics, "nonmonotonic": flags, "summary": {},
                           "paired": {}}
    for subset, mask in zip(SUBSETS, (np.ones_like(flags), flags), strict=True):
        groups = [np.flatnonzero(mask & (prompt == p)) for p in np.unique(prompt)]
        table = cluster_bootstrap(columns, rates, [g for g in groups if len(g)], n_boot, seed)
        for key, row in zip(keys, table, strict=True):
            node = out[key[0]].setdefault(subset, {}).setdefault(key[1], {})
            node.setdefault(key[2], {})[key[3]] = [float(v) for v in row]
    return out
