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
from dataclasses import dataclass
from typing import Any, Mapping, Optional, Sequence

from captum_iglens.validate.stats import view_name

__all__ = ["EXCLUDED_BLOCK", "PRE_STATED", "STATISTICS", "Statistic", "decision_views",
           "format_verdict", "verdict"]

PRE_STATED = """\
Pre-stated test (fixed in the package before any of its numbers were computed)
Per answer token each intervention gives one drop per block: ablation p(clean) - p(ablated);
patching the recovered F = p(y) - p(foil). rho: Spearman rho of a predictor and the drops.
H1 Credit ranks the blocks by their drop better than the logit-lens level and than chance.
   Statistics: median over tokens of rho(credit) - rho(lens level), paired per token; and
   median rho(credit) against its chance value 0.
H2 It does so better on tokens whose logit-lens trajectory is non-monotonic (falls > 0.05
   below its running maximum) than on monotonic ones.
   Statistic: median rho(credit) on non-monotonic minus median on monotonic tokens.
H3 The IG-Lens onset lies nearer the half-drop block h than a random block R does.
   Statistic: median over tokens of E|R - h| - |onset - h| (layers; R uniform over blocks).
CI: 95% percentile, prompt-clustered bootstrap (1000 resamples of prompts, seed 0), every
difference taken within each resample. Decision: a hypothesis is supported for a model and
intervention iff the CI of each of its statistics lies entirely above 0; else not
supported (n/a: too few tokens). Decided without the block tied to its credit by
construction: zero ablation without the last block (its drop is its credit), patching
without block 1 (its credit holds the jump from the corrupted reference); the all-block
figures are reported below. Resample ablation averages K seeded donors. No correction for
multiplicity (3 hypotheses x 5 interventions x 2 models): one supported cell among many
is weak evidence. rho_tok (shared layer profile removed) is reported, not decided."""


@dataclass(frozen=True)
class Statistic:
    """One decided (or reported) statistic of the pre-stated test.

    Attributes:
        hypothesis (str): ``"H1"``, ``"H2"``, ``"H3"``, or a reported-only label.
        label (str): What it is, for the table.
        table (str): ``"summary"``, ``"paired"`` (IG-Lens minus ``predictor``) or
            ``"contrast"`` (non-monotonic minus monotonic tokens).
        predictor (str): The predictor the row is read from.
        metric (str): The per-token metric (:data:`~captum_iglens.validate.stats.METRICS`).
        decided (bool): Whether it enters the decision.
    """

    hypothesis: str
    label: str
    table: str
    predictor: str
    metric: str
    decided: bool = True


STATISTICS: tuple[Statistic, ...] = (
    Statistic("H1", "rho(credit) - rho(lens level)", "paired", "lens level", "spearman"),
    Statistic("H1", "rho(credit) vs chance 0", "summary", "IG-Lens credit", "spearman"),
    Statistic("H2", "rho(credit): non-mono - mono", "contrast", "IG-Lens credit", "spearman"),
    Statistic("H3", "E|R - h| - |onset - h| (layers)", "summary", "IG-Lens credit",
              "onset_gain"),
    Statistic("rep.", "rho_tok(credit) vs chance 0", "summary", "IG-Lens credit",
              "spearman_token", decided=False),
)

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
    else:
        node = (summary if stat.table == "summary" else paired).get("all", {})
    return node.get(view, {}).get(stat.predictor, {}).get(stat.metric, [math.nan] * 3)


def verdict(summary: Mapping, paired: Mapping, contrast: Mapping,
            views: Sequence[str]) -> list[dict[str, Any]]:
    """Apply the decision rule of :data:`PRE_STATED` to bootstrap tables.

    Args:
        summary (mapping): subset -> view -> predictor -> metric -> ``[stat, low, high]``,
            as :func:`~captum_iglens.validate.stats.analyse` returns it.
        paired (mapping): The same for IG-Lens credit minus each predictor.
        contrast (mapping): ``{"summary": view -> ...}``: non-monotonic minus monotonic.
        views (sequence of str): The decided views (:func:`decision_views`).

    Returns:
        list of dict: one per view and statistic: ``view``, ``hypothesis``, ``statistic``,
        ``value``, ``low``, ``high`` (the 95% CI), ``decided``, and ``supported``: for a
        decided statistic, True / False for its hypothesis as a whole (every decided
        statistic of it has a CI above 0), None where a CI is NaN.
    """
    rows = []
    for view in views:
        found = [(stat, _row(stat, view, summary, paired, contrast)) for stat in STATISTICS]
        decision: dict[str, Optional[bool]] = {}
        for stat, (_, low, _high) in found:
            if stat.decided:
                above = None if not math.isfinite(low) else low > 0
                prior = decision.get(stat.hypothesis, True)
                decision[stat.hypothesis] = None if None in (prior, above) else (
                    bool(prior and above))
        for stat, (value, low, high) in found:
            rows.append({"view": view, "hypothesis": stat.hypothesis, "statistic": stat.label,
                         "value": value, "low": low, "high": high, "decided": stat.decided,
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
    lines = [f"Verdict on {model} (supported iff every CI of the hypothesis lies above 0)",
             f"{'intervention':<26}{'hyp':<5}{'statistic':<32}{'median [95% CI]':<21}"
             "decision"]
    for j, row in enumerate(rows):
        decision = "reported only"
        if row["decided"]:
            decision = {True: "supported", False: "not supported", None: "n/a"}[
                row["supported"]]
        first_of_view = j == 0 or rows[j - 1]["view"] != row["view"]
        lines.append(f"{row['view'] if first_of_view else '':<26}{row['hypothesis']:<5}"
                     f"{row['statistic']:<32}"
                     f"{_ci(row['value'], row['low'], row['high']):<21}{decision}")
    return lines
