"""Effect predictors of the causal validation: the total effect and AtP beside the readout.

Issue 29's pre-registered test (:mod:`captum_iglens.validate.total_effect_plan`) scores, per
answer token, the total-effect credit (``IGLens(effect="total")``, exact step split, 8 steps)
and attribution patching (``effect="atp"``) against each ablation's drops, each with the
reference that matches the ablation: ``"zero"`` for zero ablation, ``"mean"`` (the causal
running mean of the update) for mean ablation. Resample ablation and patching have no
matching reference and get no effect predictor.

The interface is one mapping, **ablation kind -> predictor name -> ``[N, n]`` scores**
(tokens x blocks, probability units, higher = more important), scored here with the same
per-token metrics (:func:`~captum_iglens.validate.metrics.token_metrics`, onset by the
half-point rule of the predictor's cumulative scores) and the same prompt-clustered bootstrap
(:func:`~captum_iglens.validate.stats.cluster_bootstrap`) as the built-in predictors, and
filed beside them in the analysis (``metrics``, ``summary``, ``paired`` as IG-Lens credit
minus the predictor, ``contrast``), which the tables iterate over.
"""

from __future__ import annotations

from typing import Any, Mapping, Optional, Sequence

import numpy as np
import torch
from torch import nn

from captum_iglens.ig_lens import IGLens
from captum_iglens.settings import DEFAULT_N_STEPS
from captum_iglens.validate.metrics import METRICS, half_point, token_metrics
from captum_iglens.validate.stats import PREDICTORS, SUBSETS, cluster_bootstrap, view_name

__all__ = ["DEFAULT_EFFECTS", "EFFECT_NAMES", "EFFECT_REFERENCES", "EFFECT_STEPS",
           "add_predictors", "effect_scores", "predictor_names"]

#: ``effect`` of :class:`~captum_iglens.IGLens` -> its predictor's name in the tables.
EFFECT_NAMES: dict[str, str] = {"total": "total effect", "atp": "AtP"}
#: The effect predictors :func:`~captum_iglens.validate.driver.validate` scores by default.
DEFAULT_EFFECTS: tuple[str, ...] = tuple(EFFECT_NAMES)
#: Ablation kind -> the gate reference that matches it (the pre-registration's rule).
EFFECT_REFERENCES: dict[str, str] = {"zero": "zero", "mean": "mean"}
#: Steps of the total effect's exact split (pre-registered: ``n_steps_total``).
EFFECT_STEPS = 8
_RATES = ("top1", "top3")


def effect_scores(model: nn.Module, input_ids: Sequence[int], positions: Sequence[int],
                  token_ids: Sequence[int], kinds: Sequence[str], effects: Sequence[str]
                  ) -> dict[str, dict[str, np.ndarray]]:
    """Each effect predictor's ``[P, n]`` scores at the ``P`` ablated positions of one prompt.

    Args:
        model (nn.Module): The causal LM (all its blocks gated).
        input_ids (sequence of int): The prompt and answer, as explained.
        positions (sequence of int): The positions whose prediction is ablated.
        token_ids (sequence of int): The answer token predicted at each position.
        kinds (sequence of str): The ablation kinds run; those of
            :data:`EFFECT_REFERENCES` get predictors.
        effects (sequence of str): Keys of :data:`EFFECT_NAMES`.

    Returns:
        dict: kind -> predictor name -> ``[P, n]`` float64 (probability units); NaN rows
        where the reference is not defined (the ``"mean"`` reference at a position with no
        earlier position but the attention sink).
    """
    ids = torch.tensor([list(input_ids)])
    out: dict[str, dict[str, np.ndarray]] = {}
    for kind in kinds:
        if kind not in EFFECT_REFERENCES:
            continue
        for effect in effects:
            lens = IGLens(model, effect=effect)
            # the exact split's steps; AtP is first-order and refuses any
            steps = EFFECT_STEPS if effect == "total" else DEFAULT_N_STEPS

            def run(pos: list[int], ys: list[int]) -> np.ndarray:
                got = lens.attribute_details(ids, EFFECT_REFERENCES[kind],  # noqa: B023
                                             target=torch.tensor([ys]), positions=pos,
                                             n_steps=steps)  # noqa: B023
                return got.attributions[0].double().numpy()
            try:
                scores = run(list(positions), list(token_ids))
            except ValueError:  # one position without a reference: the others one by one
                rows = []
                for pos, y in zip(positions, token_ids, strict=True):
                    try:
                        rows.append(run([pos], [y])[0])
                    except ValueError:
                        rows.append(np.full(len(lens.spec.layer_indices), np.nan))
                scores = np.stack(rows)
            out.setdefault(kind, {})[EFFECT_NAMES[effect]] = scores
    return out


def _views(analysis: Mapping[str, Any], kinds: Sequence[str],
           exclude: Mapping[str, int], n: int) -> list[tuple[str, str, np.ndarray]]:
    """``(view, kind, columns)`` of the analysis's views whose kind has predictors."""
    out = []
    for view, kind in analysis["views"].items():
        if kind not in kinds:
            continue
        cols = np.arange(n)
        if view != kind:
            col = exclude[kind] % n
            assert view == view_name(kind, col + 1)
            cols = np.delete(cols, col)
        out.append((view, kind, cols))
    return out


def add_predictors(analysis: dict[str, Any], predictors: Mapping[str, Mapping[str, np.ndarray]],
                   drops: Mapping[str, np.ndarray], prompt: np.ndarray, n_boot: int,
                   seed: int, exclude: Optional[Mapping[str, int]] = None) -> None:
    """Score ``predictors`` on every view of their ablation kind and file them in ``analysis``.

    Args:
        analysis (dict): :func:`~captum_iglens.validate.stats.analyse`'s output (changed in
            place: ``metrics``, ``summary``, ``paired`` and ``contrast`` get the new names).
        predictors (mapping): kind -> predictor name -> ``[N, n]`` scores.
        drops (mapping): kind -> ``[N, n]`` drops.
        prompt (ndarray): ``[N]`` prompt (cluster) of each token.
        n_boot (int): Bootstrap resamples (as the analysis's).
        seed (int): Bootstrap seed (as the analysis's).
        exclude (mapping, optional): kind -> the block left out of a second view.
    """
    kinds = [k for k in predictors if k in drops]
    if not kinds:
        return
    n = next(iter(drops.values())).shape[1]
    keys: list[tuple[str, ...]] = []
    cols = []
    for view, kind, blocks in _views(analysis, kinds, exclude or {}, n):
        ours = analysis["metrics"][view][PREDICTORS[0]]
        for name, scores in predictors[kind].items():
            sub = np.asarray(scores, dtype=np.float64)[:, blocks]
            missing = np.asarray(np.isnan(sub).any(axis=1))
            filled = np.where(missing[:, None], 0.0, sub)
            values = token_metrics(filled, half_point(filled.cumsum(1)),
                                   drops[kind][:, blocks], prompt)
            for metric in METRICS:  # a token without the predictor counts for nothing
                values[metric] = np.where(missing, np.nan, values[metric])
            analysis["metrics"][view][name] = values
            for metric in METRICS:
                keys += [("summary", view, name, metric), ("paired", view, name, metric)]
                cols += [values[metric], ours[metric] - values[metric]]
    if not keys:
        return
    columns = np.stack(cols, axis=1)
    rates = np.array([key[-1] in _RATES for key in keys])
    flags = np.asarray(analysis["nonmonotonic"], dtype=bool)
    for subset, mask in zip(SUBSETS, (np.ones_like(flags), ~flags, flags), strict=True):
        _file(analysis, keys, cluster_bootstrap(columns, rates, _groups(prompt, mask),
                                                n_boot, seed), subset)
    _file(analysis["contrast"], keys, cluster_bootstrap(
        columns, rates, _groups(prompt, np.ones_like(flags)), n_boot, seed, split=flags), None)


def _groups(prompt: np.ndarray, mask: np.ndarray) -> list[np.ndarray]:
    groups = [np.flatnonzero(mask & (prompt == p)) for p in np.unique(prompt)]
    return [g for g in groups if len(g)]


def _file(out: dict, keys: list[tuple[str, ...]], table: np.ndarray,
          subset: Optional[str]) -> None:
    for key, row in zip(keys, table, strict=True):
        node = out.setdefault(key[0], {})
        if subset is not None:
            node = node.setdefault(subset, {})
        node = node.setdefault(key[1], {}).setdefault(key[2], {})
        node[key[3]] = [float(v) for v in row]


def predictor_names(summary: Mapping[str, Any]) -> list[str]:
    """The built-in predictors, then every other predictor found in ``summary`` (in order)."""
    names = list(PREDICTORS)
    for by_view in summary.values():
        for by_name in by_view.values():
            names += [name for name in by_name if name not in names]
    return names
