"""The pre-stated test of the causal validation: hypotheses, statistics, decision rule.

The paper (arXiv:2606.29693) leaves open whether IG-Lens credit tracks the causal importance
of decoder blocks, and expects it to do so especially where the logit-lens trajectory is
non-monotonic. :data:`PRE_STATED` fixes three hypotheses, one statistic each (two for H1),
and the rule that decides them; it was written into the package before any of its numbers
were computed, and ``iglens validate`` prints it with the verdict. All statistics come from
the validation's one prompt-clustered bootstrap
(:func:`captum_iglens.validate.stats.cluster_bootstrap`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any, Mapping, Optional, Sequence

from captum_iglens.validate.stats import view_name

__all__ = ["EXCLUDED_BLOCK", "MIN_CLUSTERS", "PRE_STATED", "STATISTICS", "Statistic",
           "decision_views", "format_verdict", "verdict"]

PRE_STATED = """\
Pre-stated test (fixed in the package before any of its numbers were computed)
Per answer token each intervention gives one drop per block: ablation p(clean) - p(ablated);
patching the recovered F = p(y) - p(foil). rho: Spearman rho of a predictor and the drops.
H1 Credit ranks the blocks by their drop better than the logit-lens level and than chance.
   Statistics: median over tokens of rho(credit) - rho(lens level), paired per token; and
   median rho(credit) against its chance value 0.
H2 It does so better on tokens whose logit-lens trajectory is non-monotonic (falls > 0.05
   below its running maximum) than on monotonic ones.
   Statistic: median of rho(credit) - rho(lens level) on non-monotonic minus the same on
   monotonic tokens (the gap over the lens level, as the sentence says; before issue 30:
   credit's own rho across the groups, which tests another sentence).
H3 The IG-Lens onset lies nearer the half-drop block h than a random block R does.
   Statistics: median over tokens of E|R - h| - |onset - h| (layers; R uniform over blocks)
   against its chance value (the same median under random onsets, by permutation: about
   +0.7, not 0); and paired, minus the same of "last layer always".
CI: 95% percentile, prompt-clustered bootstrap (1000 resamples of prompts, seed 0; a pair
and its mirror, patch(A) = reverse-patch(B), are one cluster), every difference taken
within each resample. Decision: a hypothesis is supported for a model and intervention
iff the CI of each of its statistics lies entirely above its null value (0, or the chance
value); else not supported; n/a with fewer than 10 clusters or a zero-width CI. Where a
median of discrete values sits on an end of its CI, the mean (CI, null 0) is decided.
Decided without the block tied to its credit by construction: zero ablation without the
last block (its drop is its credit), patching without block 1 (its credit holds the jump
from the corrupted reference); the all-block figures are reported below. Resample ablation
averages K seeded donors. No correction for multiplicity (3 hypotheses x 5 interventions x
2 models): one supported cell among many is weak evidence (the benchmark's pre-registration,
validate/benchmark/prereg.json, corrects for it). rho_tok (shared layer profile removed) is
reported, not decided."""


@dataclass(frozen=True)
class Statistic:
    """One decided (or reported) statistic of the pre-stated test.

    Attributes:
        hypothesis (str): ``"H1"``, ``"H2"``, ``"H3"``, or a reported-only label.
        label (str): What it is, for the table.
        table (str): ``"summary"``, ``"paired"`` (IG-Lens minus ``predictor``),
            ``"contrast"`` (non-monotonic minus monotonic tokens) or ``"contrast paired"``
            (the same of IG-Lens minus ``predictor``).
        predictor (str): The predictor the row is read from.
        metric (str): The per-token metric (:data:`~captum_iglens.validate.stats.METRICS`).
        decided (bool): Whether it enters the decision.
        null (str): ``"zero"`` or ``"chance"`` (the analysis's chance value of ``metric``).
        mean (str): The mean column decided instead where the median sits on an end of its
            own CI (a median of discrete values); its null is 0 (for the onset gain the
            exact chance expectation). Empty: none.
    """

    hypothesis: str
    label: str
    table: str
    predictor: str
    metric: str
    decided: bool = True
    null: str = "zero"
    mean: str = ""


STATISTICS: tuple[Statistic, ...] = (
    Statistic("H1", "rho(credit) - rho(lens level)", "paired", "lens level", "spearman",
              mean="spearman_mean"),
    Statistic("H1", "rho(credit) vs chance 0", "summary", "IG-Lens credit", "spearman",
              mean="spearman_mean"),
    Statistic("H2", "Δrho vs lens: non-mono - mono", "contrast paired", "lens level",
              "spearman", mean="spearman_mean"),
    Statistic("H3", "E|R-h| - |onset-h| vs chance", "summary", "IG-Lens credit",
              "onset_gain", null="chance", mean="onset_gain_mean"),
    Statistic("H3", "onset gain - last layer's", "paired", "last layer", "onset_gain",
              mean="onset_gain_mean"),
    Statistic("rep", "rho_tok(credit) vs chance 0", "summary", "IG-Lens credit",
              "spearman_token", decided=False),
)

#: Fewest clusters (prompts, or pairs with their mirrors) a decision is made on; fewer: n/a.
MIN_CLUSTERS = 10

#: The block whose drop is tied to its credit by construction, per intervention kind
#: (column index, ``-1`` the last); the decision leaves it out.
EXCLUDED_BLOCK: dict[str, int] = {"zero": -1, "patch": 0, "reverse patch": 0}


def decision_views(views: Mapping[str, str], n_blocks: Mapping[str, int]) -> list[str]:
    """The view each intervention kind is decided on, in the kinds' order.

    Args:
        views (mapping): view -> kind, as :func:`~captum_iglens.validate.stats.analyse`
            returns them.
        n_blocks (mapping): kind -> number of blocks.
    """
    kinds = list(dict.fromkeys(views.values()))
    out = []
    for kind in kinds:
        col = EXCLUDED_BLOCK.get(kind)
        out.append(kind if col is None else view_name(kind, col % n_blocks[kind] + 1))
    return out


def _row(stat: Statistic, view: str, summary: Mapping, paired: Mapping,
         contrast: Mapping) -> list[float]:
    if stat.table == "contrast":
        node = contrast.get("summary", {})
    elif stat.table == "contrast paired":
        node = contrast.get("paired", {})
    else:
        node = (summary if stat.table == "summary" else paired).get("all", {})
    return node.get(view, {}).get(stat.predictor, {}).get(stat.metric, [math.nan] * 3)


def verdict(summary: Mapping, paired: Mapping, contrast: Mapping,
            views: Sequence[str], chance: Optional[Mapping] = None,
            n_clusters: Optional[int] = None) -> list[dict[str, Any]]:
    """Apply the decision rule of :data:`PRE_STATED` to bootstrap tables.

    Args:
        summary (mapping): subset -> view -> predictor -> metric -> ``[stat, low, high]``,
            as :func:`~captum_iglens.validate.stats.analyse` returns it.
        paired (mapping): The same for IG-Lens credit minus each predictor.
        contrast (mapping): ``{"summary": view -> ...}``: non-monotonic minus monotonic.
        views (sequence of str): The decided views (:func:`decision_views`).
        chance (mapping, optional): view -> metric -> chance value (the analysis's
            ``chance``); a statistic with ``null="chance"`` and no value here is n/a.
        n_clusters (int, optional): Clusters the tables were resampled from; fewer than
            :data:`MIN_CLUSTERS` makes every decision n/a. Default: not checked.

    Returns:
        list of dict: one per view and statistic: ``view``, ``hypothesis``, ``statistic``,
        ``value``, ``low``, ``high`` (the 95% CI), ``null`` (the value the CI must exceed),
        ``mean_instead`` (the median sat on an end of its CI: the mean and its CI are given
        and decided, against 0),
        ``decided``, and ``supported``: for a decided statistic, True / False for its
        hypothesis as a whole (every decided statistic of it has a CI above its null),
        None (n/a) where a CI is NaN or of zero width, or too few clusters.
    """
    rows = []
    few = n_clusters is not None and n_clusters < MIN_CLUSTERS
    for view in views:
        found, nulls, on_bound = [], [], []
        for stat in STATISTICS:
            row = _row(stat, view, summary, paired, contrast)
            null = ((chance or {}).get(view, {}).get(stat.metric, math.nan)
                    if stat.null == "chance" else 0.0)
            # exact: a median equal to a percentile of its own draws sits on a bound
            bound = bool(stat.mean) and math.isfinite(row[0]) and row[0] in (row[1], row[2])
            if bound:
                row, null = _row(replace(stat, metric=stat.mean), view, summary, paired,
                                 contrast), 0.0
            found.append((stat, row))
            nulls.append(null)
            on_bound.append(bound)
        decision: dict[str, Optional[bool]] = {}
        for (stat, (_, low, high)), null in zip(found, nulls, strict=True):
            if stat.decided:
                usable = (not few and math.isfinite(low) and math.isfinite(high)
                          and math.isfinite(null) and high > low)
                above = low > null if usable else None
                prior = decision.get(stat.hypothesis, True)
                decision[stat.hypothesis] = None if None in (prior, above) else (
                    bool(prior and above))
        for (stat, (value, low, high)), null, bound in zip(found, nulls, on_bound,
                                                           strict=True):
            rows.append({"view": view, "hypothesis": stat.hypothesis, "statistic": stat.label,
                         "value": value, "low": low, "high": high, "null": null,
                         "mean_instead": bound,
                         "decided": stat.decided,
                         "supported": decision.get(stat.hypothesis)})
    return rows


def _ci(value: float, low: float, high: float, fmt: str = "+.2f") -> str:
    if not math.isfinite(value):
        return "n/a"
    bounds = ",".join("n/a" if not math.isfinite(b) else format(b, fmt) for b in (low, high))
    return f"{format(value, fmt)} [{bounds}]"


def format_verdict(rows: Sequence[Mapping[str, Any]], model: str) -> list[str]:
    """The verdict table, lines of at most 100 characters.

    One line per view and statistic. Each decided line holds its hypothesis's decision (H1's
    two statistics are decided together: both lines say the same); a statistic that is
    reported, not decided, says ``reported only``.
    """
    lines = [f"Verdict on {model}",
             "(supported iff every CI of the hypothesis lies above its null: 0 or chance)",
             f"{'intervention':<26}{'hyp':<4}{'statistic':<30}{'median [95% CI]':<20}"
             "decision"]
    for j, row in enumerate(rows):
        decision = "reported only"
        if row["decided"]:
            decision = {True: "supported", False: "not supported", None: "n/a"}[
                row["supported"]]
        if row.get("mean_instead"):
            decision += " (mean)"
        first_of_view = j == 0 or rows[j - 1]["view"] != row["view"]
        lines.append(f"{row['view'] if first_of_view else '':<26}{row['hypothesis']:<4}"
                     f"{row['statistic']:<30}"
                     f"{_ci(row['value'], row['low'], row['high']):<20}{decision}")
    return lines
