"""``iglens benchmark``: predictors x interventions x tasks x families, resumable per cell.

The pre-registered benchmark (``prereg.json``). For each family and task the task's pairs
are filtered for the model (:func:`~captum_iglens.validate.benchmark.tasks.aligned`,
:func:`~captum_iglens.validate.benchmark.tasks.answered`); every kept pair is one token, its
clean prompt's answer at the last position, measured by :func:`measure_cell`:

* single-block zero, mean (the other prompts' mean update, positions >= 1) and resample
  (4 seeded donors' updates at the answer position, probabilities averaged) ablation of the
  clean prompt, per seed of the pre-registration;
* counterfactual patching both ways
  (:func:`~captum_iglens.validate.patching.patch_pair`, whose built-in checks run, and the
  same rows read in three units);
* joint top-k deletion and keep curves of every predictor's ranking, and the joint zero
  ablation of 32 random block subsets per seed (the magnitude metric);
* the model-based predictors of :mod:`~captum_iglens.validate.benchmark.predict`.

:func:`~captum_iglens.validate.benchmark.analysis.analyse` scores and decides them. Each
(family, task) cell file carries a fingerprint (model name, weights digest, package and
analysis-code version, settings, the pairs' hash); a rerun skips the cells whose file has
the same fingerprint. :func:`~captum_iglens.validate.benchmark.cost.cost_model` counts
the forwards of a cell before it runs.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Mapping, Optional, Sequence

import numpy as np

from captum_iglens.validate.benchmark.analysis import (
    PATCHINGS,
    analyse,
    derived_predictors,
    random_scores,
)
from captum_iglens.validate.benchmark.decide import load_preregistration
from captum_iglens.validate.benchmark.families import (
    FAMILY_MODELS,
    family_runs_task,
    required_families,
)
from captum_iglens.validate.benchmark.fingerprint import (
    cell_fingerprint,
    fingerprint_digest,
    fingerprint_entries,
)
from captum_iglens.validate.benchmark.measure import UNITS
from captum_iglens.validate.benchmark.tasks import aligned, answered
from captum_iglens.validate.pairs import PromptPair, couple_clusters

__all__ = ["DONORS", "FAMILY_MODELS", "SUBSETS", "cell_fingerprint", "cell_path",
           "family_runs_task", "fingerprint_digest", "fingerprint_entries", "load_cell",
           "measure_cell", "required_families", "run_cell", "seeds_of",
           "write_cell"]

#: Donor prompts of resample ablation (pre-registered: 4).
DONORS = 4
#: Random block subsets per token and seed of the magnitude metric (pre-registered: 32).
SUBSETS = 32
def _next_token(model: Any) -> Any:
    import torch

    def predict(ids: list[int]) -> int:
        device = next(model.parameters()).device
        with torch.no_grad():
            logits = model(torch.tensor([ids], device=device)).logits
        return int(logits[0, -1].argmax())

    return predict




def seeds_of(prereg: Any, seed: int = 0) -> list[int]:
    """The seeds a cell is measured and decided with: ``seed``, then ``seed_robustness``."""
    return [int(seed)] + [int(s) for s in prereg.data["seeds"]["seed_robustness"]
                          if int(s) != int(seed)]


def _donors(j: int, n_tokens: int, seed: int, count: int) -> list[int]:
    """``count`` other tokens of token ``j`` (fewer when there are not enough), seeded."""
    others = [k for k in range(n_tokens) if k != j]
    rng = np.random.default_rng([seed, j])
    return [others[int(k)] for k in rng.permutation(len(others))[:count]]


def measure_cell(model: Any, tokenizer: Any, pairs: Sequence[PromptPair],
                 seeds: Sequence[int], progress: bool = True,
                 captum_steps: Optional[int] = None) -> dict[str, Any]:
    """Every intervention and model-based predictor of a cell's pairs (see the module).

    Args:
        model: The family's model (eval mode).
        tokenizer: Its tokenizer.
        pairs (sequence of PromptPair): Filtered pairs (equal token counts, answered).
        seeds (sequence of int): Seeds of the donors, subsets and random rankings.
        progress (bool, optional): Progress bars (tqdm). Default: True.
        captum_steps (int, optional): Steps of each Captum layer run (default
            :data:`~captum_iglens.validate.benchmark.predict.CAPTUM_STEPS`).

    Returns:
        dict: the measurements :func:`~captum_iglens.validate.benchmark.analysis.analyse`
        reads (arrays as nested lists), plus ``check_errors`` and ``predictor_errors``.

    Raises:
        AblationCheckError: a built-in check failed.
    """
    import torch
    from tqdm.auto import tqdm

    from captum_iglens._utils.progress import progress_enabled
    from captum_iglens.validate.ablation import BlockAblation
    from captum_iglens.validate.ablation_checks import compare
    from captum_iglens.validate.benchmark import measure
    from captum_iglens.validate.benchmark.predict import CAPTUM_STEPS, token_predictors
    from captum_iglens.validate.metrics import nonmonotonic
    from captum_iglens.validate.patching import pair_ids, patch_pair

    shown = progress and progress_enabled()
    ablation = BlockAblation(model)
    n, n_tok = ablation.num_layers, len(pairs)
    ids = [pair_ids(tokenizer, p) for p in pairs]
    # pass 0: every clean prompt's updates (mean ablation's sums, resample's donors)
    last, sums, counts = [], [], []
    for clean, _, _, _ in tqdm(ids, desc="trace", unit="prompt", disable=not shown):
        t = ablation.trace(torch.tensor(clean))
        last.append(t.updates[-1].double())
        sums.append(t.updates[1:].double().sum(0))
        counts.append(t.updates.shape[0] - 1)
    total, count = torch.stack(sums).sum(0), sum(counts)
    eye = measure.eye_masks(n)
    drops: dict[str, list] = {k: [] for k in ("zero", "mean", *(f"resample#{s}" for s in seeds),
                                              *PATCHINGS)}
    preds: dict[str, dict[str, list]] = {}
    subsets: dict[str, dict[str, list]] = {str(s): {"masks": [], "drops": []} for s in seeds}
    checks: dict[str, float] = {}
    errors: dict[str, str] = {}
    lens_rows: list[np.ndarray] = []
    for j, (pair, (clean, corrupted, y, foil)) in enumerate(
            zip(tqdm(pairs, desc="measure", unit="pair", disable=not shown), ids,
                strict=True)):
        pos = len(clean) - 1
        t_clean = ablation.trace(torch.tensor(clean))
        t_corr = ablation.trace(torch.tensor(corrupted))
        patch = patch_pair(ablation, tokenizer, pair, spot_layer=1 + j % n)
        for k, v in patch.check_errors.items():
            checks[k] = max(checks.get(k, 0.0), v)
        mean_u = ((total - sums[j]) / max(count - counts[j], 1)).to(t_clean.hidden.dtype)
        donors = {s: [last[k] for k in _donors(j, n_tok, s, DONORS)] for s in seeds}
        got, masks = _ablation_rows(ablation, t_clean, pos, y, mean_u, donors, j)
        for name, value in got.items():
            if name.startswith("subsets#"):
                subsets[name.split("#")[1]]["drops"].append(value)
                subsets[name.split("#")[1]]["masks"].append(masks[name])
            else:
                drops[name].append(value)
        repl = t_clean.updates[pos][None].expand(n, -1, -1)
        den = measure.row_units(ablation, t_corr, pos, eye, repl, y, foil)
        rev = measure.row_units(ablation, t_clean, pos, eye,
                                t_corr.updates[pos][None].expand(n, -1, -1), y, foil)
        drops["patch"].append({u: den[u][1:] - den[u][0] for u in UNITS})
        drops["reverse patch"].append({u: rev[u][0] - rev[u][1:] for u in UNITS})
        checks["benchmark rows"] = max(checks.get("benchmark rows", 0.0), compare(
            "benchmark patching rows vs patch_pair", torch.from_numpy(
                drops["patch"][-1]["probability"]), patch.recovery.double(),
            ablation.tolerance))
        found = token_predictors(model, tokenizer, ablation, t_clean, clean, corrupted, y, foil,
                                 patch, captum_steps or CAPTUM_STEPS, errors)
        for group, by_name in found.items():
            for name, scores in by_name.items():
                preds.setdefault(group, {}).setdefault(name, []).append(scores)
        lens_rows.append(found["mean"]["logit-lens level"])
    data: dict[str, Any] = {
        "n": n, "drops": {k: measure.stack_units(v) for k, v in drops.items()},
        "predictors": {g: {k: np.stack(v) for k, v in d.items()} for g, d in preds.items()},
        "subsets": {s: {k: np.stack(v) for k, v in d.items()} for s, d in subsets.items()},
        "clusters": {"prompt": _prompt_clusters(pairs),
                     "pair": couple_clusters(list(pairs)).tolist()},
        "nonmonotonic": nonmonotonic(np.stack(lens_rows), NONMONOTONIC_TOL).tolist(),
        "pair_ids": [p.id for p in pairs], "check_errors": checks, "predictor_errors": errors}
    data["curves"] = _curves(ablation, pairs, ids, data, seeds, shown)
    return _lists(data)


def _ablation_rows(ablation: Any, trace: Any, pos: int, y: int, mean_u: Any,
                   donors: Mapping[int, Sequence[Any]], j: int
                   ) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """One token's zero, mean, resample (per seed) and subset rows, one batched forward.

    Returns ``(drops, masks)``: name (``"zero"``, ``"mean"``, ``"resample#s"``,
    ``"subsets#s"``) -> unit -> ``[n]`` drops (subsets: ``[M]`` probability drops), and
    the subsets' masks ``[M, n]``.
    """
    import torch

    from captum_iglens.validate.benchmark import measure

    n, d = ablation.num_layers, trace.hidden.shape[-1]
    dtype = trace.hidden.dtype
    eye = measure.eye_masks(n)
    masks, repls = [eye, eye], [torch.zeros(n, n, d, dtype=dtype),
                                mean_u[None].expand(n, -1, -1)]
    spans, at = {"zero": (0, n), "mean": (n, 2 * n)}, 2 * n
    subset_masks = {}
    for s, updates in donors.items():
        for u in updates:
            masks.append(eye)
            repls.append(u.to(dtype)[None].expand(n, -1, -1))
        spans[f"resample#{s}"] = (at, at + n * len(updates))
        at += n * len(updates)
        sub = measure.random_subsets(n, SUBSETS, np.random.default_rng([s, j, 1]))
        masks.append(sub)
        repls.append(torch.zeros(SUBSETS, n, d, dtype=dtype))
        spans[f"subsets#{s}"] = (at, at + SUBSETS)
        subset_masks[f"subsets#{s}"] = sub
        at += SUBSETS
    rows = measure.row_units(ablation, trace, pos, np.concatenate(masks), torch.cat(repls), y)
    clean = {u: rows[u][0] for u in UNITS}
    out: dict[str, Any] = {}
    for name, (a, b) in spans.items():
        part = {u: rows[u][1 + a:1 + b] for u in UNITS}
        if name.startswith("subsets#"):
            out[name] = clean["probability"] - part["probability"]
        elif name.startswith("resample#"):  # the donors' probabilities averaged
            mean_p = part["probability"].reshape(-1, n).mean(0)
            out[name] = {"probability": clean["probability"] - mean_p,
                         "log-probability": clean["log-probability"] - np.log(mean_p),
                         "logit difference": clean["logit difference"]
                         - part["logit difference"].reshape(-1, n).mean(0)}
        else:
            out[name] = {u: clean[u] - part[u] for u in UNITS}
    return out, subset_masks


#: Logit-lens trajectories falling more than this below their running maximum are
#: non-monotonic (``iglens validate``'s default, probability units).
NONMONOTONIC_TOL = 0.05


def _prompt_clusters(pairs: Sequence[PromptPair]) -> list[int]:
    seen: dict[str, int] = {}
    return [seen.setdefault(p.clean, len(seen)) for p in pairs]


def _curves(ablation: Any, pairs: Sequence[PromptPair], ids: Sequence[Any],
            data: Mapping[str, Any], seeds: Sequence[int], shown: bool) -> dict[str, Any]:
    """Deletion and keep curves of every ranking (the zero group's, the derived ones)."""
    import torch
    from tqdm.auto import tqdm

    from captum_iglens.validate.benchmark import measure

    n_tok, n = len(pairs), int(data["n"])
    zdrops = np.asarray(data["drops"]["zero"]["probability"])
    rankings = dict(data["predictors"]["zero"])
    derived = derived_predictors(zdrops, np.asarray(data["clusters"]["prompt"]), int(seeds[0]))
    rankings.update({k: v for k, v in derived.items() if k != "random"})
    for s in seeds:
        rankings[f"random#{s}"] = random_scores(int(s), n_tok, n)
    out: dict[str, Any] = {k: {"deletion": [], "keep": []} for k in rankings}
    for j, (clean, _, y, _) in enumerate(tqdm(ids, desc="curves", unit="pair",
                                              disable=not shown)):
        trace = ablation.trace(torch.tensor(clean))
        vocab = measure.vocab_ids(ablation, trace)
        for name, scores in rankings.items():
            delete, keep = measure.joint_masks(np.asarray(scores)[j])
            rows = measure.row_units(ablation, trace, len(clean) - 1,
                                     np.concatenate([delete, keep]), None, y, vocab=vocab)
            out[name]["deletion"].append({u: rows[u][0] - rows[u][1:n + 2] for u in UNITS})
            out[name]["keep"].append({u: rows[u][0] - rows[u][n + 2:] for u in UNITS})
    return {k: {part: measure.stack_units(v) for part, v in d.items()} for k, d in out.items()}


def _lists(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _lists(v) for k, v in value.items()}
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, (np.floating, np.integer, np.bool_)):
        return value.item()
    return value


def _arrays(value: Any) -> Any:
    """Nested lists of numbers back to arrays (a cell file read for re-analysis)."""
    if isinstance(value, dict):
        return {k: _arrays(v) for k, v in value.items()}
    if isinstance(value, list) and value and not isinstance(value[0], (str, dict)):
        return np.asarray(value, dtype=np.float64 if not isinstance(
            np.asarray(value).flat[0], (bool, np.bool_)) else bool)
    return value


def run_cell(model: Any, tokenizer: Any, family: str, task: str,
             pairs: Sequence[PromptPair], max_pairs: Optional[int], n_boot: int, seed: int,
             progress: bool = True, captum_steps: Optional[int] = None,
             n_boot_decide: Optional[int] = None) -> dict[str, Any]:
    """One (family, task) cell: filter, measure, score and decide.

    Args:
        model: The family's model (eval mode).
        tokenizer: Its tokenizer.
        family (str): The family's name, recorded in the cell.
        task (str): The task's name, recorded in the cell.
        pairs (sequence of PromptPair): The task's pairs, before filtering.
        max_pairs (int, optional): Keep at most this many of the filtered pairs (in order).
        n_boot (int): Bootstrap resamples of the tables' 95% CIs.
        seed (int): The first seed (the pre-registration's is 0); the file's
            ``seed_robustness`` seeds follow (:func:`seeds_of`).
        progress (bool, optional): Progress bars. Default: True.
        captum_steps (int, optional): Steps of each Captum layer run.
        n_boot_decide (int, optional): Resamples of the decisions (default: the file's).

    Returns:
        dict: ``counts`` (pairs given, aligned, answered, used), ``measurements``,
        ``scores``, ``curves``, ``magnitude``, ``hypotheses``, ``per_token``,
        ``check_errors``, ``predictor_errors``, ``seeds``.

    Raises:
        ValueError: fewer than 2 pairs left after filtering.
        AblationCheckError: a built-in check failed.
    """
    prereg = load_preregistration()
    used, counts = filtered_pairs(model, tokenizer, pairs, max_pairs)
    if len(used) < 2:
        raise ValueError(f"{family} / {task}: {counts}: fewer than 2 pairs align and are "
                         "answered right by the model; nothing to score.")
    seeds = seeds_of(prereg, seed)
    data = measure_cell(model, tokenizer, used, seeds, progress, captum_steps)
    found = analyse(_arrays(data), prereg, n_boot, seeds, n_boot_decide)
    return {"family": family, "task": task, "counts": counts, "seeds": seeds,
            "clusters": {k: int(len(set(v))) for k, v in data["clusters"].items()},
            "check_errors": data["check_errors"],
            "predictor_errors": data["predictor_errors"], **found, "measurements": data}


def filtered_pairs(model: Any, tokenizer: Any, pairs: Sequence[PromptPair],
                   max_pairs: Optional[int]) -> tuple[list[PromptPair], dict[str, int]]:
    """The pairs a cell uses (aligned, answered, at most ``max_pairs``) and the counts."""
    kept, _ = aligned(tokenizer, pairs)
    good = answered(tokenizer, kept, _next_token(model))
    used = good[:max_pairs] if max_pairs is not None else good
    return used, {"given": len(pairs), "aligned": len(kept), "answered": len(good),
                  "used": len(used)}


def write_cell(path: Path, cell: Mapping[str, Any]) -> None:
    """Write a cell: its measurements gzipped beside it, the rest as JSON in ``path``."""
    import gzip

    light = {k: v for k, v in cell.items() if k not in ("measurements", "per_token")}
    heavy = {k: cell[k] for k in ("measurements", "per_token") if k in cell}
    path = Path(path)
    with gzip.open(path.with_suffix(".measurements.json.gz"), "wt", encoding="utf-8") as fh:
        json.dump(heavy, fh, allow_nan=True)
    path.write_text(json.dumps(light, indent=1, allow_nan=True), encoding="utf-8")


def cell_path(out_dir: Path, family: str, task: str) -> Path:
    """Where the cell of (family, task) is written."""
    safe = "".join(ch if ch.isalnum() or ch in "-_." else "_" for ch in f"{family}__{task}")
    return Path(out_dir) / "cells" / f"{safe}.json"


def load_cell(path: Path, digest: str) -> Optional[dict[str, Any]]:
    """The cell in ``path`` if it holds the fingerprint ``digest``, else None."""
    try:
        cell = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return cell if cell.get("fingerprint", {}).get("digest") == digest else None
