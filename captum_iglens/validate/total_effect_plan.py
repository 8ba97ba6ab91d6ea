"""Pre-registered test of the total-effect credits and attribution patching (issue 29).

Written and committed *before* the measurement it describes was run; the measurement script
(``benchmarks/bench_total_effect_ablation.py``) reads its thresholds from here, so they
cannot drift after the numbers are seen.

What is measured, on the embedded SmolLM2-135M-Instruct, one thread:

* Prompts: the packaged validation prompts (``captum_iglens/data/validation_prompts.jsonl``,
  the set ``iglens validate`` uses), chat template, greedy answers of at most
  ``VALIDATE_MAX_NEW_TOKENS`` tokens; the answer tokens with ``p_final >= VALIDATE_THRESHOLD``
  are scored (the tokens ``iglens validate`` ablates).
* Drops: for each scored token and each block ``L = 1..30``, the position-local ablation drop
  ``p(y | clean) - p(y | block L's update at i replaced)`` from
  :class:`~captum_iglens.validate.ablation.BlockAblation`: ``zero`` (update removed) and
  ``mean`` (the update replaced by its mean over the other prompts, positions >= 1, as
  ``iglens validate`` computes it); also ``causal mean`` (replaced by the causal running mean
  of the update over the earlier positions of the same sequence, the first left out: the
  total effect's own ``"mean"`` reference).
* Predictors, per token a vector over the 30 blocks: the readout credit (``IGLens(model)``
  defaults), the total-effect credit (``effect="total"``, exact step split, 8 steps) and AtP
  (``effect="atp"``), each with the reference that matches the ablation (``"zero"`` for zero
  ablation, ``"mean"`` for both mean ablations).
* Scores: per token, Spearman's rho between predictor and drop over the 30 blocks
  (``scipy.stats.spearmanr``), and top-1 (the predictor's largest block is the drop's largest
  block); reported as the median rho and the mean top-1 over tokens.

Thresholds (the issue's acceptance figures), for the mean ablation of ``iglens validate``:
median rho of the total effect >= 0.6 and its top-1 >= 0.6; AtP's median rho >= 0.65. Each
is reported as met or not met; nothing is tuned after the run.
"""

from __future__ import annotations

__all__ = ["PREREGISTRATION"]

PREREGISTRATION: dict = {
    "issue": 29,
    "model": "SmolLM2-135M-Instruct (embedded)",
    "prompts": "packaged validation prompts, chat template, greedy",
    "tokens": "answer tokens with p_final >= VALIDATE_THRESHOLD",
    "n_steps_total": 8,
    "ablations": ["zero", "mean", "causal mean"],
    "predictors": ["readout", "total", "atp"],
    "scores": ["median per-token Spearman rho over 30 blocks", "mean top-1 hit"],
    "thresholds": {
        "mean": {"total_rho": 0.6, "total_top1": 0.6, "atp_rho": 0.65},
    },
}
