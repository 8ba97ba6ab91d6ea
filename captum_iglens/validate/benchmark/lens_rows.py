"""The lens addendum's rows: the readout credit under a tuned or Jacobian lens, per cell.

``iglens benchmark --lenses tuned,jacobian`` adds, for every (family, task) cell, one file
per lens kind, ``OUT/cells/<family>__<task>__lens-<kind>.json``
(:func:`lens_path`): the pre-stated predictor of ``prereg_lenses.json``
(:func:`~captum_iglens.validate.benchmark.addendum.load_lens_addendum`) computed on the
cell's pairs (:func:`credit_rows`: the block terms of ``IGLens(model, lens=...)``, per
reference group as the logit-lens readout credit of
:mod:`~captum_iglens.validate.benchmark.predict`), scored against the cell's *stored*
measurements (no intervention is re-run: the rows join the measurements and go through
:func:`~captum_iglens.validate.benchmark.analysis.per_token` and
:func:`~captum_iglens.validate.benchmark.analysis.hypotheses` under the addendum's rules),
and its hypothesis (L1 tuned, L2 Jacobian) decided at the addendum's level. A file is keyed
by the cell's digest, the fitted lens's digest
(:func:`~captum_iglens.lens.layer_readout.lens_identity`) and the addendum's SHA-256: a rerun
skips it when all match. A family with no fitted lens gets an ``n/a`` file naming the
``iglens fit-lens`` command; the benchmark never fits one.
"""

from __future__ import annotations

import gzip
import hashlib
import json
from pathlib import Path
from typing import Any, Mapping, Optional, Sequence, Union

import numpy as np

from captum_iglens.validate.benchmark.addendum import (
    LensAddendum,
    lens_predictor,
    load_lens_addendum,
)
from captum_iglens.validate.benchmark.analysis import CLUSTER_OF, hypotheses, per_token, summarise
from captum_iglens.validate.pairs import PromptPair

__all__ = ["LENS_KINDS", "credit_rows", "find_lens", "lens_fingerprint", "lens_path",
           "load_lens_cell", "pairs_of_cell", "read_measurements", "run_lens_cell",
           "score_rows"]

#: The lens kinds the addendum pre-states (those ``iglens fit-lens --kind`` fits).
LENS_KINDS: tuple[str, ...] = ("tuned", "jacobian")
#: The logit-lens predictor the lens rows are compared with.
_VERSUS = "readout credit"


def lens_path(out_dir: Path, family: str, task: str, kind: str) -> Path:
    """Where the lens rows of (family, task) and ``kind`` are written."""
    safe = "".join(ch if ch.isalnum() or ch in "-_." else "_" for ch in f"{family}__{task}")
    return Path(out_dir) / "cells" / f"{safe}__lens-{kind}.json"


def find_lens(model: Any, kind: str, spec: str) -> tuple[Any, str]:
    """The newest fitted lens of ``kind`` for ``model`` in the cache, or why there is none.

    Args:
        model: The family's model.
        kind (str): ``"tuned"`` or ``"jacobian"``.
        spec (str): The model as the user named it (for the ``iglens fit-lens`` command).

    Returns:
        (lens, message): the :class:`~captum_iglens.lens.translators.FittedLens` and ``""``,
        or ``None`` and a message naming ``iglens fit-lens --kind K --model M``.
    """
    from captum_iglens.lens.fit import named_lens

    try:
        return named_lens(model, kind), ""
    except ValueError as err:
        return None, (f"no {kind} lens is fitted for {spec}: run `iglens fit-lens --kind "
                      f"{kind} --model {spec}` first (the benchmark never fits one; {err})")


def credit_rows(model: Any, tokenizer: Any, pairs: Sequence[PromptPair],
                lens: Union[None, str, Any], progress: bool = False
                ) -> dict[str, dict[str, np.ndarray]]:
    """The readout credit of every pair under ``lens``, per reference group.

    As the logit-lens readout credit of
    :func:`~captum_iglens.validate.benchmark.predict.token_predictors`: ``IGLens(model,
    lens=lens)`` defaults at the clean answer for the ``"zero"`` and ``"mean"`` groups;
    contrastive ``p(y) - p(foil)`` from the corrupted prompt as the baseline for
    ``"patch"`` (float32, as :func:`~captum_iglens.validate.patching.patch_pair` keeps it).

    Args:
        model: The causal LM (eval mode).
        tokenizer: Its tokenizer.
        pairs (sequence of PromptPair): The cell's pairs, in its order.
        lens (None, str or LayerReadout): What ``IGLens(model, lens=...)`` takes.
        progress (bool, optional): A progress bar. Default: False.

    Returns:
        dict: ``"credits"`` and ``"lens_change"`` -> group (``"zero"``, ``"mean"``,
        ``"patch"``) -> ``[N, n]`` float64 (probability units).

    Raises:
        ValueError: as :func:`~captum_iglens.validate.patching.pair_ids`.
    """
    import torch
    from tqdm.auto import tqdm

    from captum_iglens.ig_lens import IGLens
    from captum_iglens.validate.patching import pair_ids

    explainer = IGLens(model, lens=lens)
    device = next(model.parameters()).device
    out: dict[str, dict[str, list]] = {k: {"zero": [], "patch": []}
                                       for k in ("credits", "lens_change")}
    for pair in tqdm(pairs, desc="lens rows", unit="pair", disable=not progress):
        clean, corrupted, y, foil = pair_ids(tokenizer, pair)
        pos = len(clean) - 1
        ids = torch.tensor([clean], device=device)
        plain = explainer.attribute_details(ids, target=torch.tensor([[y]]), positions=[pos])
        contrastive = explainer.attribute_details(
            ids, baselines=torch.tensor([corrupted], device=device),
            target=torch.tensor([[y]]), contrast=torch.tensor([[foil]]), positions=[pos])
        for key in out:
            for group, details in (("zero", plain), ("patch", contrastive)):
                value = getattr(details, "attributions" if key == "credits" else key)
                if value is None:  # the logit lens has no lens terms
                    value = torch.zeros_like(details.attributions)
                row = value.reshape(-1).detach().cpu()
                out[key][group].append((row.float() if group == "patch" else row).double()
                                       .numpy())
    rows = {k: {g: np.stack(v) for g, v in d.items()} for k, d in out.items()}
    for by_group in rows.values():
        by_group["mean"] = by_group["zero"]  # IGLens defaults: no reference to match
    return rows


def read_measurements(cell_file: Path) -> dict[str, Any]:
    """A cell's stored measurements (``.measurements.json.gz`` beside it), as arrays."""
    from captum_iglens.validate.benchmark.runner import _arrays

    heavy = Path(cell_file).with_suffix(".measurements.json.gz")
    with gzip.open(heavy, "rt", encoding="utf-8") as fh:
        return dict(_arrays(json.load(fh)["measurements"]))


def pairs_of_cell(measurements: Mapping[str, Any], pairs: Sequence[PromptPair]
                  ) -> list[PromptPair]:
    """The task's pairs the cell used, in its order (by the ``pair_ids`` it stored).

    Raises:
        ValueError: a stored id is not among ``pairs``, or ``pairs`` repeats an id.
    """
    by_id = {p.id: p for p in pairs}
    if len(by_id) != len(pairs):
        raise ValueError("the task's pairs repeat an id: the cell's pairs cannot be named.")
    missing = [i for i in measurements["pair_ids"] if i not in by_id]
    if missing:
        raise ValueError(f"the cell used pairs {missing[:3]} that the task no longer holds: "
                         "rerun the cell.")
    return [by_id[i] for i in measurements["pair_ids"]]


def lens_fingerprint(cell: Mapping[str, Any], kind: str, identity: Optional[Mapping[str, Any]],
                     addendum: LensAddendum) -> dict[str, Any]:
    """What a lens file depends on: the cell's digest, the lens's identity, the addendum."""
    entries = {"cell": cell["fingerprint"]["digest"], "kind": kind,
               "lens": dict(identity) if identity else None,
               "addendum_sha256": addendum.sha256,
               "preregistration_sha256": addendum.base_sha256,
               "module_sha256": hashlib.sha256(Path(__file__).read_bytes()).hexdigest()}
    entries["digest"] = hashlib.sha256(
        json.dumps(entries, sort_keys=True, default=str).encode()).hexdigest()[:16]
    return entries


def load_lens_cell(path: Path, digest: str) -> Optional[dict[str, Any]]:
    """The lens file in ``path`` if it holds the fingerprint ``digest``, else None."""
    try:
        found = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return found if found.get("fingerprint", {}).get("digest") == digest else None


def score_rows(data: Mapping[str, Any], rows: Mapping[str, np.ndarray], name: str,
               addendum: LensAddendum, n_boot: int, seeds: Sequence[int],
               n_boot_decide: Optional[int] = None) -> dict[str, Any]:
    """Score one lens predictor's rows against a cell's stored measurements.

    Args:
        data (mapping): The cell's measurements (:func:`read_measurements`).
        rows (mapping): Group -> ``[N, n]`` the predictor's scores.
        name (str): The addendum's predictor name.
        addendum (LensAddendum): The rules.
        n_boot (int): Resamples of the tables' 95% intervals.
        seeds (sequence of int): The cell's seeds (the first decides; the others re-decide).
        n_boot_decide (int, optional): Resamples of the decision. Default: the file's.

    Returns:
        dict: ``scores`` (intervention -> unit -> view -> ``name`` and ``"readout credit"``
        -> summary), ``magnitude`` (the same two names -> infidelity summary) and
        ``hypotheses`` (the addendum's hypothesis of ``name`` -> decision, with
        ``seed_verdicts`` and ``unstable``).
    """
    from scipy.stats import norm

    merged = dict(data)
    merged["predictors"] = {g: {**by_name, name: np.asarray(rows[g], np.float64)}
                            for g, by_name in data["predictors"].items()}
    power_z = float(norm.ppf(1 - addendum.alpha_corrected)
                    + norm.ppf(float(addendum.statistics["power"])))
    seed = int(seeds[0])
    values = per_token(merged, seed, addendum)
    shown = (name, _VERSUS)
    clusters = {k: np.asarray(v) for k, v in data["clusters"].items()}
    scores = {kind: {u: {view: {k: summarise(by_name[k], clusters[CLUSTER_OF[kind]], n_boot,
                                             seed, power_z) for k in shown if k in by_name}
                         for view, by_name in by_view.items()}
                     for u, by_view in by_unit.items()}
              for kind, by_unit in values["rho"].items()}
    magnitude = {k: summarise(values["infidelity"][k], clusters["prompt"], n_boot, seed,
                              power_z) for k in shown if k in values["infidelity"]}
    ids = [h["id"] for h in addendum.hypotheses if h["predictor"] == name]
    decided = {k: v for k, v in hypotheses(values, merged, addendum, seed,
                                           n_boot_decide).items() if k in ids}
    for cell in decided.values():
        cell["seed_verdicts"] = {str(seed): cell["verdict"]}
    for other in seeds[1:]:
        again = hypotheses(per_token(merged, int(other), addendum), merged, addendum,
                           int(other), n_boot_decide)
        for hid, cell in decided.items():
            cell["seed_verdicts"][str(other)] = again[hid]["verdict"]
    for cell in decided.values():
        cell["unstable"] = len(set(cell["seed_verdicts"].values())) > 1
    return {"scores": scores, "magnitude": magnitude, "hypotheses": decided}


def _not_available(addendum: LensAddendum, name: str, message: str) -> dict[str, Any]:
    return {"status": "n/a", "message": message,
            "hypotheses": {h["id"]: {"verdict": "n/a", "reason": message,
                                     "statement": h["statement"]}
                           for h in addendum.hypotheses if h["predictor"] == name}}


def run_lens_cell(model: Any, tokenizer: Any, cell: Mapping[str, Any], cell_file: Path,
                  pairs: Sequence[PromptPair], kind: str, spec: str, out_dir: Path,
                  n_boot: int, progress: bool = False, n_boot_decide: Optional[int] = None,
                  lens: Any = None) -> tuple[dict[str, Any], bool]:
    """The lens file of one cell and lens ``kind``: computed, or reused when it matches.

    Args:
        model: The family's model (eval mode).
        tokenizer: Its tokenizer.
        cell (mapping): The cell (with its ``fingerprint``, ``family``, ``task``, ``seeds``).
        cell_file (Path): Its file (its measurements lie beside it).
        pairs (sequence of PromptPair): The task's pairs (before filtering).
        kind (str): ``"tuned"`` or ``"jacobian"``.
        spec (str): The model as the user named it (the ``iglens fit-lens`` hint).
        out_dir (Path): The benchmark's output folder.
        n_boot (int): Resamples of the tables' 95% intervals.
        progress (bool, optional): A progress bar. Default: False.
        n_boot_decide (int, optional): Resamples of the decision. Default: the file's.
        lens (optional): A readout to use instead of the cache's (tests: a planted lens).

    Returns:
        (dict, bool): the lens file's content (``family``, ``task``, ``kind``, ``name``,
        ``fingerprint``, ``status`` ``"ok"`` / ``"n/a"``, ``rows``, ``lens_change``,
        ``scores``, ``magnitude``, ``hypotheses``) and whether it was reused.

    Raises:
        ValueError: a kind the addendum does not pre-state; the cell's pairs not found.
    """
    from captum_iglens.lens.layer_readout import lens_identity

    addendum = load_lens_addendum()
    name = lens_predictor(addendum, kind)["name"]
    message = ""
    if lens is None:
        lens, message = find_lens(model, kind, spec)
    fingerprint = lens_fingerprint(cell, kind, lens_identity(lens) if lens is not None
                                   else None, addendum)
    path = lens_path(out_dir, cell["family"], cell["task"], kind)
    found = load_lens_cell(path, fingerprint["digest"])
    if found is not None:
        return found, True
    head = {"family": cell["family"], "task": cell["task"], "kind": kind, "name": name,
            "fingerprint": fingerprint}
    if lens is None:
        result = {**head, **_not_available(addendum, name, message)}
    else:
        data = read_measurements(cell_file)
        rows = credit_rows(model, tokenizer, pairs_of_cell(data, pairs), lens, progress)
        scored = score_rows(data, rows["credits"], name, addendum, n_boot, cell["seeds"],
                            n_boot_decide)
        result = {**head, "status": "ok",
                  "rows": {g: v.tolist() for g, v in rows["credits"].items()},
                  "lens_change": {g: v.tolist() for g, v in rows["lens_change"].items()},
                  **scored}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=1, allow_nan=True), encoding="utf-8")
    return json.loads(path.read_text(encoding="utf-8")), False
