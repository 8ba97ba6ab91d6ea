"""Per-token metrics of the causal validation: how well one predictor ranks the blocks.

Numpy / scipy on ``[N, n]`` arrays (``N`` tokens x ``n`` blocks, column ``j`` = block
``j + 1``, probability units); :mod:`captum_iglens.validate.stats` summarises them. The onset
rule is IG-Lens's default (arXiv:2606.29693), the one function
:func:`~captum_iglens._core.onset.sustained_columns`: the first block from which the
cumulative credit stays at or beyond half its sum.
"""

from __future__ import annotations

from typing import Optional

import numpy as np
import torch
from scipy import stats

from captum_iglens._core.onset import sustained_columns
from captum_iglens.settings import DEFAULT_ONSET_FRAC

__all__ = ["METRICS", "half_point", "nonmonotonic", "onset_gain", "profile_free_spearman",
           "token_metrics"]

#: Per-token metrics; ``top1`` / ``top3`` are summarised by their mean, the rest by the median.
METRICS: tuple[str, ...] = ("spearman", "spearman_token", "top1", "top3", "pct_top",
                            "pct_onset", "onset_dist", "onset_gain")


def half_point(cumulative: np.ndarray) -> np.ndarray:
    """The first column from which a cumulative curve stays at or beyond half its end.

    The rule of IG-Lens's default ("sustained") onset: for ``[N, n]`` cumulative values
    ``C`` with end ``C_n`` and ``s`` its sign, the first ``j`` with ``s C_j' >= s C_n / 2``
    for every ``j' >= j``.

    Returns:
        ndarray: ``[N]`` int columns (0-based); ``n - 1`` at the latest.
    """
    curve = torch.from_numpy(np.asarray(cumulative, dtype=np.float64))
    scale = curve.abs().amax(-1, keepdim=True)
    return sustained_columns(curve, DEFAULT_ONSET_FRAC, scale).numpy()


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


def profile_free_spearman(scores: np.ndarray, drops: np.ndarray,
                          prompt: Optional[np.ndarray]) -> np.ndarray:
    """Per-token rank correlation after removing the layer profile shared across prompts.

    Each token's blocks are ranked (average ranks) by the predictor and by the drop; from
    each rank the block's mean rank over the tokens of the *other* prompts is subtracted
    (leave-one-prompt-out, so that neither the token nor its prompt's other tokens enter
    the profile it is compared against); the result is the Pearson correlation of the two
    residual rank vectors. A predictor that only knows the typical profile (which blocks
    matter for tokens in general) scores about 0 here although its plain Spearman rho can
    be high. Ranks keep the measure free of each token's scale (``p_final`` varies by a
    factor 5 between tokens) and need no fitted slope, unlike a partial correlation.

    Args:
        scores (ndarray): ``[N, n]`` predictor scores.
        drops (ndarray): ``[N, n]`` drops.
        prompt (ndarray, optional): ``[N]`` prompt of each token; ``None``: all NaN.

    Returns:
        ndarray: ``[N]`` float64; NaN for a token whose residual ranks are constant (a
        predictor with the same ranking for every token) or with no other prompt.
    """
    if prompt is None:
        return np.full(scores.shape[0], np.nan)
    residual = []
    for values in (scores, drops):
        ranks = stats.rankdata(values, axis=1)
        out = np.full_like(ranks, np.nan)
        for p in np.unique(prompt):
            rest = prompt != p
            if rest.any():
                out[prompt == p] = ranks[prompt == p] - ranks[rest].mean(0)
        residual.append(out - out.mean(1, keepdims=True))
    a, b = residual
    norm = np.sqrt((a * a).sum(1) * (b * b).sum(1))
    scale = np.abs(a).sum(1) * np.abs(b).sum(1)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(norm > 1e-9 * scale, (a * b).sum(1) / norm, np.nan)


def onset_gain(onset: np.ndarray, half: np.ndarray, n: int) -> np.ndarray:
    """How much nearer the onset is to the half-drop block than a random block, in layers.

    ``E|R - h| - |onset - h|`` with ``R`` uniform over the ``n`` blocks: the exact chance
    expectation, so no random draw (and no seed) enters. Positive: the onset is nearer.

    Returns:
        ndarray: ``[N]`` float64, layers.
    """
    blocks = np.arange(n)
    expected = np.abs(blocks[None, :] - half[:, None]).mean(1)
    return expected - np.abs(onset - half)


def token_metrics(scores: np.ndarray, onset: np.ndarray, drops: np.ndarray,
                  prompt: Optional[np.ndarray] = None) -> dict[str, np.ndarray]:
    """Per-token agreement of a predictor with the ablation drops.

    Args:
        scores (ndarray): ``[N, n]`` predictor scores (higher = more important).
        onset (ndarray): ``[N]`` int column (0-based block) the predictor marks as onset.
        drops (ndarray): ``[N, n]`` ablation drops, probability units.
        prompt (ndarray, optional): ``[N]`` prompt of each token, for ``spearman_token``
            (:func:`profile_free_spearman`; NaN without it).

    Returns:
        dict: each of :data:`METRICS` -> ``[N]`` float64. ``top1`` is 1 where the
        predictor's highest-scoring block is the block with the largest drop, ``top3``
        where it is among the three largest drops (0 otherwise).
    """
    top = scores.argmax(1)
    ranked = np.argsort(-drops, axis=1, kind="stable")
    half = half_point(drops.cumsum(1))
    return {
        "spearman": _spearman(scores, drops),
        "spearman_token": profile_free_spearman(scores, drops, prompt),
        "top1": (top == ranked[:, 0]).astype(np.float64),
        "top3": (ranked[:, :3] == top[:, None]).any(1).astype(np.float64),
        "pct_top": _percentile(drops, top),
        "pct_onset": _percentile(drops, onset),
        "onset_dist": np.abs(onset - half).astype(np.float64),
        "onset_gain": onset_gain(onset, half, drops.shape[1]),
    }


def nonmonotonic(lens: np.ndarray, tol: float) -> np.ndarray:
    """Whether the logit-lens trajectory falls more than ``tol`` below its running maximum."""
    return (np.maximum.accumulate(lens, axis=1) - lens).max(1) > tol
