"""The cluster bootstrap of a summary: CIs of pooled per-layer means, resampling records."""

from __future__ import annotations

import inspect

import numpy as np

__all__ = ["cluster_mean_ci"]

_BATCH_ELEMENTS = 1 << 24  # float64 elements per vectorized bootstrap call (128 MiB)


def cluster_mean_ci(
    sums: np.ndarray, counts: np.ndarray, n_boot: int = 1000, seed: int = 0,
    confidence: float = 0.95,
) -> tuple[np.ndarray, np.ndarray]:
    """Percentile bootstrap CI of a pooled per-layer mean, resampling whole clusters.

    The statistic of a resample of clusters (records) is ``sum of their sums / sum of their
    counts``: the mean over the pooled tokens of the drawn records. Computed with
    :func:`scipy.stats.bootstrap` (``method="percentile"``), in batches that hold at most
    about 128 MiB.

    Args:
        sums (ndarray): ``[R, k]`` per cluster the sum of its tokens' credits.
        counts (ndarray): ``[R]`` per cluster its number of tokens (all > 0).
        n_boot (int, optional): Bootstrap resamples. Default: 1000.
        seed (int, optional): Seed of the resampling. Default: 0.
        confidence (float, optional): Confidence level in (0, 1). Default: 0.95.

    Returns:
        (low, high): ``[k]`` each; NaN with fewer than 2 clusters (a single record says
        nothing about the spread between records).
    """
    from scipy import stats

    n_rec, k = sums.shape
    if n_rec < 2:
        return np.full(k, np.nan), np.full(k, np.nan)

    def pooled_mean(index: np.ndarray, axis: int = -1) -> np.ndarray:
        pick = np.moveaxis(np.asarray(index), axis, -1).astype(np.intp)
        mean = sums[pick].sum(-2) / counts[pick].sum(-1)[..., None]  # [..., k]
        return np.moveaxis(mean, -1, 0)  # [k, ...]

    rng = np.random.default_rng(seed)
    seeded = {"rng": rng} if "rng" in inspect.signature(stats.bootstrap).parameters else {
        "random_state": rng}
    result = stats.bootstrap(
        (np.arange(n_rec),), pooled_mean, n_resamples=n_boot, confidence_level=confidence,
        method="percentile", vectorized=True, axis=-1,
        batch=max(1, _BATCH_ELEMENTS // (n_rec * k)), **seeded,
    )
    return (np.asarray(result.confidence_interval.low, dtype=np.float64).reshape(k),
            np.asarray(result.confidence_interval.high, dtype=np.float64).reshape(k))
