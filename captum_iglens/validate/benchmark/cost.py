"""The benchmark's cost model: the forwards a cell will run, before it runs."""

from __future__ import annotations

from typing import Any, Optional, Sequence

from captum_iglens.validate.benchmark.decide import load_preregistration
from captum_iglens.validate.benchmark.runner import DONORS, SUBSETS, filtered_pairs, seeds_of
from captum_iglens.validate.pairs import PromptPair

__all__ = ["cell_cost", "cost_model"]


def cost_model(n_blocks: int, n_pairs: int, seq_len: int, n_seeds: int = 3,
               captum_steps: Optional[int] = None, donors: int = DONORS,
               subsets: int = SUBSETS) -> dict[str, int]:
    """Forwards one cell costs, by kind, before it runs (the benchmark's cost model).

    Three kinds, per pair with ``n`` blocks, ``S`` seeds, ``D`` donors, ``M`` subsets:

    * **cached rows**: single-token forwards over the clean KV cache, batched per call
      (:meth:`~captum_iglens.validate.ablation.BlockAblation.run_plan`), counted exactly:
      ablation ``1 + 2n + S (D n + M)``, :func:`~captum_iglens.validate.patching.patch_pair`
      ``2 (n + 3)``, the three-unit patching rows ``2 (n + 1)``, the curves ``(11 + S)
      (1 + 2n)`` (9 model predictors, last layer, the other prompts' profile, a random
      ranking per seed; the empty ``k = 0`` deletion and ``k = n`` keep rows are the clean
      row);
    * **gated rows**: the total effect's single-position rows with a backward, per reference
      group (3): position scope ``8 + 1``, AtP ``2``, AtP* ``2 + n`` (an estimate from
      :mod:`captum_iglens._core.total_effect`'s docstring);
    * **sequence forwards** of the whole prompt: traces and IG-Lens (``8``), the sequence
      scope ``3 (8 + 1)`` (with a backward), and the Captum layer runs ``2 methods x 2
      references x n x steps`` (each with a backward; the mean group reuses the zero
      group's reference).

    Returns:
        dict: per kind and component for ``n_pairs`` pairs; ``cached_rows``,
        ``gated_rows``, ``sequence_forwards`` the totals; ``seq_len`` as given.
    """
    from captum_iglens.validate.benchmark.predict import CAPTUM_STEPS, TOTAL_STEPS

    n, s = int(n_blocks), int(n_seeds)
    d = min(int(donors), max(int(n_pairs) - 1, 0))
    steps = CAPTUM_STEPS if captum_steps is None else int(captum_steps)
    cached = {"ablation": 1 + 2 * n + s * (d * n + subsets), "patch_pair": 2 * (n + 3),
              "patching units": 2 * (n + 1), "curves": (11 + s) * (1 + 2 * n)}
    gated = {"total effect and AtP": 3 * ((TOTAL_STEPS + 1) + 2 + (2 + n))}
    seq = {"traces and IG-Lens": 8, "sequence scope": 3 * (TOTAL_STEPS + 1),
           "Captum layer methods": 2 * 2 * n * steps}
    out = {f"cached rows: {k}": v * n_pairs for k, v in cached.items()}
    out.update({f"gated rows: {k}": v * n_pairs for k, v in gated.items()})
    out.update({f"sequence forwards: {k}": v * n_pairs for k, v in seq.items()})
    out["cached_rows"] = sum(cached.values()) * n_pairs
    out["gated_rows"] = sum(gated.values()) * n_pairs
    out["sequence_forwards"] = sum(seq.values()) * n_pairs
    out["seq_len"] = int(seq_len)
    return out


def cell_cost(model: Any, tokenizer: Any, pairs: Sequence[PromptPair],
              max_pairs: Optional[int], captum_steps: Optional[int] = None) -> dict[str, Any]:
    """:func:`cost_model` of one cell after filtering (``counts`` added)."""
    from captum_iglens.validate.ablation import BlockAblation

    used, counts = filtered_pairs(model, tokenizer, pairs, max_pairs)
    seq = max((len(tokenizer(p.clean).input_ids) for p in used), default=0)
    n_seeds = len(seeds_of(load_preregistration()))
    return {"counts": counts, **cost_model(BlockAblation(model).num_layers, len(used), seq,
                                           n_seeds, captum_steps)}
