"""The cluster bootstrap of a summary: CIs of pooled per-layer means, resampling records."""

from __future__ import annotations

import numpy as np

from captum_iglens.validate.stats import cluster_draws

__all__ = ["cluster_mean_ci"]

_BATCH_ELEMENTS = 1 << 24  # float64 elements per vectorized batch of resamples (128 MiB)


def cluster_mean_ci(
    sums: np.ndarray, counts: np.ndarray, n_boot: int = 1000, seed: int = 0,
    confidence: float = 0.95,
) -> tuple[np.ndarray, np.ndarray]:
    """Percentile bootstrap CI of a pooled per-layer mean, resampling whole clusters.

    The statistic of a resample of clusters (records) is ``sum of their sums / sum of their
    counts``: the mean over the pooled tokens of the drawn records. The resamples are the
    package's one cluster draw (:func:`captum_iglens.validate.stats.cluster_draws`), the
    one :func:`~captum_iglens.validate.stats.cluster_bootstrap` takes, so a pooled mean
    gets the same interval from both for the same seed; computed in batches that hold at
    most about 128 MiB.

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
    n_rec, k = sums.shape
    if n_rec < 2:
        return np.full(k, np.nan), np.full(k, np.nan)
    pick = cluster_draws(n_rec, n_boot, seed)
    batch = max(1, _BATCH_ELEMENTS // (n_rec * k))
    draws = np.concatenate([sums[pick[b:b + batch]].sum(1)
                            / counts[pick[b:b + batch]].sum(1)[:, None]
                            for b in range(0, n_boot, batch)])
    tail = 100 * (1 - confidence) / 2
    low, high = np.percentile(draws, [tail, 100 - tail], axis=0)
    return np.asarray(low, dtype=np.float64), np.asarray(high, dtype=np.float64)
