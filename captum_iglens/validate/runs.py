"""The ablation pipeline of :func:`captum_iglens.validate.driver.validate`, and its pair check.

Explain every prompt (chat template, greedy answer) and trace its residual stream; ablate
every block at every selected answer token (``zero``, ``mean`` over the other prompts,
``resample`` from seeded donor prompts, averaged); collect the per-token arrays; analyse them
(:func:`captum_iglens.validate.stats.analyse`) and apply the pre-stated test
(:mod:`captum_iglens.validate.verdict`).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable, Optional, Sequence

import numpy as np
import torch
from torch import nn
from tqdm.auto import tqdm

from captum_iglens._utils.progress import progress_enabled
from captum_iglens.text.explain_prompt import explain
from captum_iglens.validate.ablation import BlockAblation, mean_updates
from captum_iglens.validate.patching import PairAlignmentError, PromptPair, pair_ids
from captum_iglens.validate.predictors import add_predictors, effect_scores
from captum_iglens.validate.stats import analyse
from captum_iglens.validate.verdict import EXCLUDED_BLOCK, decision_views, verdict

__all__ = ["AblationRun", "aligned_pairs", "donor_sets", "run_ablation"]


@dataclass
class _Item:
    """One explained prompt: its IG-Lens result, residual trace and selected answer tokens."""

    result: Any
    trace: Any
    selected: list[int]
    effects: dict[str, dict[str, np.ndarray]] = field(default_factory=dict)


@dataclass
class _Data:
    """Per-token arrays over ``N`` selected tokens and ``n`` blocks (columns = blocks 1..n)."""

    credits: list[np.ndarray] = field(default_factory=list)
    lens: list[np.ndarray] = field(default_factory=list)
    direct: list[np.ndarray] = field(default_factory=list)
    drops: dict[str, list[np.ndarray]] = field(default_factory=dict)
    tokens: list[dict[str, Any]] = field(default_factory=list)
    checks: dict[str, float] = field(default_factory=dict)
    #: Effect predictors: ablation kind -> predictor name -> per-prompt ``[P, n]`` scores.
    effects: dict[str, dict[str, list[np.ndarray]]] = field(default_factory=dict)

    def predictors(self) -> dict[str, dict[str, np.ndarray]]:
        """Scores of every recorded token: kind -> predictor name -> ``[N, n]`` float64."""
        return {kind: {name: np.concatenate(parts).astype(np.float64)
                       for name, parts in by_name.items()}
                for kind, by_name in self.effects.items()}

    def stacked(self, name: str) -> np.ndarray:
        return np.concatenate(getattr(self, name)).astype(np.float64)


def _explain_all(model: nn.Module, tokenizer: Any, prompts: Sequence[str], max_new_tokens: int,
                 threshold: float, ablation: BlockAblation, progress: bool,
                 explain_fn: Callable, kinds: Sequence[str] = (),
                 effects: Sequence[str] = ()) -> list[_Item]:
    items = []
    shown = progress and progress_enabled()  # --no-progress switches these off too
    for prompt in tqdm(prompts, desc="explain", unit="prompt", disable=not shown):
        generated = explain_fn(model, tokenizer, prompt, max_new_tokens=max_new_tokens,
                               chat_template=True)
        # The greedy answer explained again with one teacher-forced forward: the ablation's
        # checks compare p_final and the last credit with forwards over the whole sequence,
        # and generation's incremental KV cache is another computation (its rounding is not
        # bounded by the checks' tolerance on every CPU).
        result = explain_fn(model, tokenizer, prompt, max_new_tokens=max_new_tokens,
                            chat_template=True, target=generated.token_ids)
        trace = ablation.trace(torch.tensor(result.input_ids))
        selected = [t for t, p in enumerate(result.p_final.tolist()) if p >= threshold]
        scores = {}
        if selected and effects:
            scores = effect_scores(model, result.input_ids,
                                   [result.positions[t] for t in selected],
                                   [result.token_ids[t] for t in selected], kinds, effects)
        items.append(_Item(result, trace, selected, scores))
    return items


def donor_sets(n_items: int, k: int, seed: int) -> list[list[int]]:
    """``k`` distinct donor prompts for each prompt, never itself, seeded.

    Args:
        n_items (int): Number of prompts.
        k (int): Donors per prompt (``1 <= k < n_items``).
        seed (int): Seed of the draw (``numpy.random.default_rng(seed)``).

    Returns:
        list of list of int: prompt -> its ``k`` donors.

    Raises:
        ValueError: ``k`` out of range.
    """
    if not 1 <= k < n_items:
        raise ValueError(f"donors must be in 1..{n_items - 1} (the other prompts), got {k}.")
    rng = np.random.default_rng(seed)
    return [[int(q) for q in rng.permutation([q for q in range(n_items) if q != p])[:k]]
            for p in range(n_items)]


def _ablate_item(ablation: BlockAblation, items: list[_Item], p: int, donors: list[int],
                 kinds: Sequence[str], min_reference: int) -> tuple[Any, torch.Tensor]:
    """Ablate every block at the selected tokens of prompt ``p``.

    ``mean`` uses the other prompts as reference; ``resample`` takes each donor prompt's
    update at the same answer offset (clipped to the donor's length).
    """
    item, res = items[p], items[p].result
    pos = [res.positions[t] for t in item.selected]
    target = torch.tensor([res.token_ids[t] for t in item.selected])
    mean = None
    if "mean" in kinds:
        mean = mean_updates([it.trace for q, it in enumerate(items) if q != p], min_reference)
    resample = None
    if "resample" in kinds:
        slabs = []
        for q in donors:
            d = items[q].result
            d_pos = [min(d.prompt_length - 1 + t, len(d.input_ids) - 1) for t in item.selected]
            slabs.append(items[q].trace.updates[d_pos])
        resample = torch.stack(slabs, dim=1)
    out = ablation.ablate(item.trace, pos, target, kinds, mean, resample,
                          p_final=res.p_final[item.selected],
                          last_credit=res.attributions[item.selected, -1])
    return out, ablation.direct_effects(item.trace, pos, target)


def _record(data: _Data, item: _Item, p: int, donors: list[int], out: Any,
            direct: torch.Tensor) -> None:
    res, sel = item.result, item.selected
    data.credits.append(res.attributions[sel].numpy())
    data.lens.append(res.lens_probs[sel].numpy())
    data.direct.append(direct.numpy())
    for kind in data.drops:
        data.drops[kind].append(out.drops[kind].numpy())
    for kind, by_name in item.effects.items():
        for name, scores in by_name.items():
            data.effects.setdefault(kind, {}).setdefault(name, []).append(scores)
    for j, t in enumerate(sel):
        data.tokens.append({"prompt_index": p, "token": res.tokens[t],
                            "token_id": res.token_ids[t], "position": res.positions[t],
                            "p_final": float(res.p_final[t]),
                            "onset_layer": int(res.onset_layers[t]),
                            "donor_prompt_indices": donors, "row": j})
    for name, err in out.check_errors.items():
        data.checks[name] = max(data.checks.get(name, 0.0), err)


def _ablate_all(ablation: BlockAblation, items: list[_Item], kinds: Sequence[str], seed: int,
                donors: int, min_reference: int, progress: bool) -> _Data:
    data = _Data(drops={k: [] for k in kinds})
    sets = donor_sets(len(items), donors, seed)
    total = sum(len(it.selected) for it in items)
    shown = progress and progress_enabled()  # --no-progress switches these off too
    with tqdm(total=total, desc="ablate", unit="token", disable=not shown) as bar:
        for p, item in enumerate(items):
            if not item.selected:
                continue
            out, direct = _ablate_item(ablation, items, p, sets[p], kinds, min_reference)
            _record(data, item, p, sets[p], out, direct)
            bar.update(len(item.selected))
    return data


def aligned_pairs(tokenizer: Any, pairs: Sequence[PromptPair]) -> list[PromptPair]:
    """``pairs``, refused before anything runs when fewer than 2 align for this tokenizer."""
    reasons = []
    for pair in pairs:
        try:
            pair_ids(tokenizer, pair)
        except ValueError as err:
            reasons.append(str(err))
    if len(pairs) - len(reasons) < 2:
        raise PairAlignmentError("Patching needs at least 2 pairs whose clean and corrupted "
                                 f"prompts have as many tokens, got {len(pairs) - len(reasons)} ("
                                 f"{'; '.join(reasons[:3]) or 'no pair given'}): give other pairs "
                                 "or leave 'patch' out of the kinds.")
    return list(pairs)


def _ablation_part(data: _Data, n_boot: int, seed: int, tol: float) -> dict[str, Any]:
    """Bootstrap analysis and verdict of the ablation kinds."""
    prompt = np.array([t["prompt_index"] for t in data.tokens])
    onset = np.array([t["onset_layer"] for t in data.tokens]) - 1
    drops = {k: np.concatenate(v).astype(np.float64) for k, v in data.drops.items()}
    analysis = analyse(data.stacked("credits"), data.stacked("lens"), data.stacked("direct"),
                       onset, drops, prompt, n_boot, seed, tol, EXCLUDED_BLOCK)
    add_predictors(analysis, data.predictors(), drops, prompt, n_boot, seed, EXCLUDED_BLOCK)
    n = data.credits[0].shape[1]
    views = decision_views(analysis["views"], {k: n for k in drops})
    analysis["verdict"] = verdict(analysis["summary"], analysis["paired"],
                                  analysis["contrast"], views, chance=analysis["chance"],
                                  n_clusters=len(np.unique(prompt)))
    analysis["drops"] = drops
    return analysis


@dataclass
class AblationRun:
    """What the ablation phase produced: explained prompts, per-token data, analysis."""

    items: list = field(default_factory=list)
    data: Any = None
    analysis: Optional[dict[str, Any]] = None


def stamp() -> tuple[float, float]:
    """``(wall, process CPU)`` seconds now."""
    return time.perf_counter(), time.process_time()


def run_ablation(model: nn.Module, tokenizer: Any, prompts: Sequence[str],
                 kinds: Sequence[str], settings: dict[str, Any], ablation: BlockAblation,
                 clock: dict[str, tuple[float, float]], progress: bool,
                 explain_fn: Callable = explain) -> AblationRun:
    """Explain (with ``explain_fn``), ablate and analyse; ``clock`` gets a stamp per phase.

    ``settings["effects"]`` (keys of :data:`~captum_iglens.validate.predictors.EFFECT_NAMES`)
    adds the total effect and AtP as predictors of the zero and mean ablations
    (:func:`~captum_iglens.validate.predictors.add_predictors`).

    Raises:
        ValueError: no answer token reaches the threshold.
        ReferenceSetError: too few reference positions for ``mean``.
        AblationCheckError: a built-in check failed.
    """
    s = settings
    items = _explain_all(model, tokenizer, prompts, s["max_new_tokens"], s["threshold"],
                         ablation, progress, explain_fn, kinds, s.get("effects", ()))
    clock["explain"] = stamp()
    data = _ablate_all(ablation, items, kinds, s["seed"], s["donors"], s["min_reference"],
                       progress)
    clock["ablate"] = stamp()
    if not data.tokens:
        raise ValueError(f"No answer token has p_final >= {s['threshold']}: lower the "
                         "threshold.")
    part = _ablation_part(data, s["n_boot"], s["seed"], s["nonmonotonic_tol"])
    clock["analyse"] = stamp()
    for token, flag in zip(data.tokens, part["nonmonotonic"], strict=True):
        token["nonmonotonic"] = bool(flag)
    return AblationRun(items, data, part)
