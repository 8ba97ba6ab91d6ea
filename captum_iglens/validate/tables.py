"""Text tables of the causal validation (lines of at most 100 characters).

Pure formatting of the analysis dicts of :func:`captum_iglens.validate.stats.analyse`
(with the effect predictors of :func:`captum_iglens.validate.predictors.add_predictors`):
for one view (an intervention on all its blocks, or without the block tied to its credit)
the predictors' metrics, IG-Lens minus each predictor (paired per token), and monotonic vs
non-monotonic tokens side by side with their difference.
"""

from __future__ import annotations

import math
from typing import Any, Callable, Mapping, Sequence

from captum_iglens.validate.predictors import predictor_names

__all__ = ["LEGEND", "ci", "num", "paired_block", "summary_block", "trajectory_block"]

LEGEND = (
    "rho: per-token Spearman rho of the predictor and the drop over the blocks. rho_tok: the",
    "same after removing the shared layer profile (each block's mean rank over the other",
    "prompts' tokens subtracted from both rank vectors): the token-specific part (n/a for",
    "predictors that rank every token alike, and for the other prompts' profile itself).",
    "top-1 / top-3: share of tokens whose largest-drop block is the predictor's top block /",
    "whose predictor's top block is among the three largest drops. pct@top, pct@ons:",
    "percentile (50 = chance) of the drop at the predictor's top / onset block. |Δons|: layers",
    "from the onset to the half-drop block (the first block from which the cumulative drop",
    "stays at or beyond half its sum, the rule of IG-Lens's onset); vs rnd: a random block's",
    "expected distance minus the onset's (> 0: the onset is nearer). Medians (top-k: means),",
    "95% CIs from a prompt-clustered bootstrap.",
)


def num(value: float, fmt: str) -> str:
    """``value`` formatted, ``"n/a"`` when not finite."""
    return "n/a" if not math.isfinite(value) else format(value, fmt)


def ci(triple: Sequence[float], fmt: str) -> str:
    """``"stat [low,high]"``, ``"n/a"`` when the statistic is not finite."""
    stat, low, high = triple
    if not math.isfinite(stat):
        return "n/a"
    return f"{format(stat, fmt)} [{num(low, fmt)},{num(high, fmt)}]"


def _getter(node: Mapping[str, Any]) -> Callable[[str], Any]:
    return lambda metric: node.get(metric, [math.nan] * 3)


def summary_block(summary: Mapping, view: str, head: str) -> list[str]:
    """Every predictor's metrics on one view (all tokens), under the line ``head``."""
    lines = [head, f"{'predictor':<16}{'rho [95% CI]':<21}{'rho_tok [95% CI]':<21}"
                   f"{'top-1':>6}{'top-3':>6}{'pct@top':>8}{'pct@ons':>8}{'|Δons|':>7}"
                   f"{'vs rnd':>7}"]
    for name in predictor_names(summary):
        get = _getter(summary.get("all", {}).get(view, {}).get(name, {}))
        lines.append(f"{name:<16}{ci(get('spearman'), '+.2f'):<21}"
                     f"{ci(get('spearman_token'), '+.2f'):<21}"
                     f"{num(get('top1')[0], '.2f'):>6}{num(get('top3')[0], '.2f'):>6}"
                     f"{num(get('pct_top')[0], '.0f'):>8}{num(get('pct_onset')[0], '.0f'):>8}"
                     f"{num(get('onset_dist')[0], '.1f'):>7}"
                     f"{num(get('onset_gain')[0], '+.1f'):>7}")
    return lines


def paired_block(paired: Mapping, view: str) -> list[str]:
    """IG-Lens credit minus each predictor, token by token, on one view (all tokens)."""
    lines = [f"{'IG-Lens minus':<16}{'Δrho [CI]':<21}{'Δrho_tok [CI]':<21}"
             f"{'Δtop-1 [CI]':<21}{'Δpct@top [CI]':<18}"]
    for name in predictor_names(paired)[1:]:
        get = _getter(paired.get("all", {}).get(view, {}).get(name, {}))
        lines.append(f"{name:<16}{ci(get('spearman'), '+.2f'):<21}"
                     f"{ci(get('spearman_token'), '+.2f'):<21}"
                     f"{ci(get('top1'), '+.2f'):<21}{ci(get('pct_top'), '+.0f'):<18}")
    return lines


def trajectory_block(summary: Mapping, contrast: Mapping, view: str,
                     counts: tuple[int, int]) -> list[str]:
    """Monotonic vs non-monotonic tokens side by side, and their difference, on one view.

    Args:
        summary (mapping): subset -> view -> predictor -> metric -> triple.
        contrast (mapping): ``{"summary": view -> ...}``: non-monotonic minus monotonic.
        view (str): The view.
        counts (tuple): (monotonic, non-monotonic) token counts.
    """
    lines = [f"{view}: monotonic ({counts[0]} tokens) vs non-monotonic ({counts[1]}) "
             "logit-lens trajectories",
             f"{'predictor':<16}{'rho monotonic':<21}{'rho non-mono':<21}"
             f"{'non - mono [CI]':<21}{'top-1 m / n':>12}{'Δtop-1':>8}"]
    for name in predictor_names(summary):
        mono = _getter(summary.get("monotonic", {}).get(view, {}).get(name, {}))
        non = _getter(summary.get("non-monotonic", {}).get(view, {}).get(name, {}))
        diff = _getter(contrast.get("summary", {}).get(view, {}).get(name, {}))
        top = f"{num(mono('top1')[0], '.2f')} / {num(non('top1')[0], '.2f')}"
        lines.append(f"{name:<16}{ci(mono('spearman'), '+.2f'):<21}"
                     f"{ci(non('spearman'), '+.2f'):<21}{ci(diff('spearman'), '+.2f'):<21}"
                     f"{top:>12}{num(diff('top1')[0], '+.2f'):>8}")
    return lines
