"""Does IG-Lens credit predict causal importance? Ablation and patching, a pre-stated test.

IG-Lens credits a block with a conditional marginal, what the final norm and unembedding
can read out of ``h_L`` beyond the previous layer (arXiv:2606.29693); the paper's open
question is whether that tracks the block's causal importance, especially for tokens whose
logit-lens trajectory is non-monotonic. This module answers it with the test fixed in
:mod:`captum_iglens.validate.verdict` (H1-H3, their statistics and decision rule) on two
kinds of intervention:

* **Ablation** (:mod:`captum_iglens.validate.ablation`): every prompt of a set is explained (chat
  template, greedy answer), and at every answer token with ``p_final >= threshold`` every
  block's update is ablated at that position: ``zero``, ``mean`` (over the other prompts)
  or ``resample`` (from ``donors`` other prompts at the same answer offset, seeded, their
  probabilities averaged). The drop is ``p(clean) - p(ablated)``.
* **Patching** (:mod:`captum_iglens.validate.patching`): for prompt pairs, one block's update from
  the clean run patched into the corrupted run at the last position (and the reverse),
  against IG-Lens's contrastive credit from the corrupted reference.

Per token and intervention, predictors (IG-Lens credit, ``|credit|``, the logit-lens level,
the direct effect, first / last layer, random, the other prompts' drop profile) are scored
by :mod:`captum_iglens.validate.metrics` and summarised with a prompt-clustered bootstrap
(:mod:`captum_iglens.validate.stats`), on all blocks and without the block tied to its
credit by construction, for all, monotonic and non-monotonic tokens. A weak or negative
answer is a legitimate result.
"""

from __future__ import annotations

from typing import Any, Optional, Sequence

import numpy as np
from torch import nn

from captum_iglens.settings import (
    DEFAULT_ONSET_RULE,
    VALIDATE_DONORS,
    VALIDATE_MAX_NEW_TOKENS,
    VALIDATE_THRESHOLD,
)
from captum_iglens.text.explain_prompt import explain
from captum_iglens.validate.ablation import KINDS, BlockAblation, ReferenceSetError
from captum_iglens.validate.inputs import (
    DEFAULT_MIN_REFERENCE,
    load_prompts,
    max_reference_positions,
    prompt_lengths,
    provenance,
    reference_shortfall,
)
from captum_iglens.validate.patching import (
    PromptPair,
    load_pairs,
    patch_pairs,
)
from captum_iglens.validate.predictors import DEFAULT_EFFECTS, EFFECT_NAMES
from captum_iglens.validate.report import ValidationResult, analyse_patches
from captum_iglens.validate.runs import (
    AblationRun,
    _Data,
    aligned_pairs,
    donor_sets,
    run_ablation,
    stamp,
)
from captum_iglens.validate.stats import METRICS, PREDICTORS
from captum_iglens.validate.verdict import EXCLUDED_BLOCK

__all__ = ["INTERVENTIONS", "METRICS", "PREDICTORS", "ValidationResult", "donor_sets",
           "load_prompts", "max_reference_positions", "prompt_lengths", "reference_shortfall",
           "validate"]

DEFAULT_THRESHOLD = VALIDATE_THRESHOLD
DEFAULT_MAX_NEW_TOKENS = VALIDATE_MAX_NEW_TOKENS
#: Resample donors per prompt (their probabilities averaged).
DEFAULT_DONORS = VALIDATE_DONORS
#: Interventions of :func:`validate`: the ablation kinds and counterfactual patching.
INTERVENTIONS: tuple[str, ...] = (*KINDS, "patch")


def _check_settings(kinds: Sequence[str], threshold: float, max_new_tokens: int, n_boot: int,
                    n_prompts: int, donors: int) -> tuple[str, ...]:
    kinds = tuple(kinds)
    if not kinds or any(k not in INTERVENTIONS for k in kinds) or len(set(kinds)) != len(kinds):
        raise ValueError(f"kinds must be distinct names among {INTERVENTIONS}, got {kinds}.")
    if not 0.0 <= threshold <= 1.0:
        raise ValueError(f"threshold is a probability in [0, 1], got {threshold}.")
    if max_new_tokens < 1 or n_boot < 1:
        raise ValueError("max_new_tokens and n_boot must be >= 1.")
    if n_prompts < 2:
        raise ValueError("Validation needs at least 2 prompts (mean and resample ablations and "
                         "the other-prompts predictor use the other prompts).")
    if donors < 1:
        raise ValueError(f"donors must be >= 1, got {donors}.")
    return kinds


def _check_reference(tokenizer: Any, prompts: Sequence[str], kinds: Sequence[str],
                     max_new_tokens: int, min_reference: int) -> None:
    """Refuse, before anything is explained, a set too small for ``mean``'s reference."""
    shortfall = "mean" in kinds and reference_shortfall(
        prompt_lengths(tokenizer, prompts), max_new_tokens, min_reference)
    if shortfall:
        raise ReferenceSetError(shortfall, "use kinds without 'mean' (zero and resample need "
                                "no reference set), more prompts, or a smaller min_reference.")


def validate(model: nn.Module, tokenizer: Any, prompts: Optional[Sequence[str]] = None,
             kinds: Sequence[str] = INTERVENTIONS, threshold: float = DEFAULT_THRESHOLD,
             max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS, seed: int = 0, n_boot: int = 1000,
             nonmonotonic_tol: float = 0.05, min_reference: int = DEFAULT_MIN_REFERENCE,
             progress: bool = True, donors: int = DEFAULT_DONORS,
             pairs: Optional[Sequence[PromptPair]] = None, prompts_file: Optional[str] = None,
             pairs_file: Optional[str] = None, grow: bool = True,
             effects: Sequence[str] = DEFAULT_EFFECTS) -> ValidationResult:
    """Test whether IG-Lens credit predicts the causal effect of intervening on each block.

    Args:
        model (nn.Module): A Hugging Face causal LM (all its blocks are explained).
        tokenizer: Its tokenizer (its chat template is applied to the prompts).
        prompts (sequence of str, optional): Default: :func:`load_prompts` of
            ``prompts_file`` (the packaged set when that is None).
        kinds (sequence of str, optional): Some of :data:`INTERVENTIONS`: ``"zero"``,
            ``"mean"``, ``"resample"`` ablation and ``"patch"`` (both directions).
            Default: all four.
        threshold (float, optional): Ablate answer tokens with ``p_final >=`` this
            (probability). Default: 0.2.
        max_new_tokens (int, optional): Longest greedy answer. Default: 12.
        seed (int, optional): Seeds the donors, the random predictor and the bootstrap.
        n_boot (int, optional): Bootstrap resamples of prompts. Default: 1000.
        nonmonotonic_tol (float, optional): A logit-lens trajectory is non-monotonic when it
            falls more than this (probability) below its running maximum. Default: 0.05.
        min_reference (int, optional): Fewest reference positions for ``mean``. Default: 200.
        progress (bool, optional): Show tqdm progress bars on stderr. Default: True.
        donors (int, optional): Resample donors per prompt, averaged; at most the other
            prompts (the number used is recorded in the settings). Default: 4.
        pairs (sequence of PromptPair, optional): Patching pairs. Default:
            :func:`~captum_iglens.validate.patching.load_pairs` of ``pairs_file``.
        prompts_file (str, optional): Where the prompts come from (read when ``prompts``
            is None; recorded with its SHA-256). Default: the packaged set.
        pairs_file (str, optional): The same for the pairs. Default: the packaged set.
        grow (bool, optional): Each ablation row starts from the clean residual below its
            block (True) or recomputes every block below (False, the slower reference;
            results agree to float32 rounding). Default: True.
        effects (sequence of str, optional): Effect predictors scored beside the readout
            credit on the zero and mean ablations (issue 29's pre-registered test,
            :mod:`captum_iglens.validate.predictors`): ``"total"`` (the total effect, exact
            split, 8 steps; "total effect" in the tables) and ``"atp"`` (attribution
            patching; "AtP"), each with the matching reference. ``()`` skips them (they
            cost about as much as the readout explanation each). Default: both.

    Returns:
        ValidationResult: per-token drops, predictors, metrics, bootstrap summaries, the
        verdict of the pre-stated test, patching and the provenance.

    Raises:
        ValueError: bad settings, fewer than 2 prompts, or no token above ``threshold``.
        PairAlignmentError: (a ValueError) fewer than 2 patching pairs whose clean and
            corrupted prompts have as many tokens for this tokenizer (before any run).
        ReferenceSetError: (a ValueError) prompts too few or short for the reference set of
            ``mean``: found before anything is explained where it is certain, else when the
            first token is ablated.
        AblationCheckError: a built-in check of the ablation or the patching failed.
    """
    prompts = load_prompts(prompts_file) if prompts is None else [str(p) for p in prompts]
    effects = tuple(effects)
    if any(e not in EFFECT_NAMES for e in effects):
        raise ValueError(f"effects must be among {tuple(EFFECT_NAMES)}, got {effects}.")
    kinds = _check_settings(kinds, threshold, max_new_tokens, n_boot, len(prompts), donors)
    ablating = tuple(k for k in kinds if k in KINDS)
    _check_reference(tokenizer, prompts, ablating, max_new_tokens, min_reference)
    if "patch" in kinds:
        pairs = aligned_pairs(tokenizer, load_pairs(pairs_file) if pairs is None else pairs)
    ablation = BlockAblation(model, grow=grow)
    settings: dict[str, Any] = {
        "kinds": list(kinds), "threshold": threshold, "max_new_tokens": max_new_tokens,
        "seed": seed, "n_boot": n_boot, "donors": min(donors, len(prompts) - 1),
        "nonmonotonic_tol": nonmonotonic_tol, "min_reference": min_reference,
        "effects": list(effects), **_fixed_settings(seed, ablation)}
    clock = {"start": stamp()}
    run = AblationRun(data=_Data())
    if ablating:
        run = run_ablation(model, tokenizer, prompts, ablating, settings, ablation, clock,
                           progress, explain)
    patching = None
    if "patch" in kinds:
        patches, skipped = patch_pairs(ablation, tokenizer, pairs or [], progress)
        patching = analyse_patches(patches, skipped, n_boot, seed, nonmonotonic_tol)
        clock["patch"] = stamp()
    _finish_settings(settings, clock, provenance(
        model, prompts, prompts_file, pairs if "patch" in kinds else None, pairs_file,
        settings))
    return _result(run, ablating, ablation.num_layers, prompts, settings, patching)


def _result(run: AblationRun, kinds: tuple[str, ...], n: int, prompts: list[str],
            settings: dict[str, Any], patching: Optional[dict[str, Any]]) -> ValidationResult:
    data = run.data

    def stacked(name: str) -> np.ndarray:
        return data.stacked(name) if data.tokens else np.zeros((0, n))

    return ValidationResult(
        kinds=kinds, layer_indices=list(range(1, n + 1)), prompts=prompts,
        answers=[it.result.answer for it in run.items], tokens=data.tokens,
        credits=stacked("credits"), lens_probs=stacked("lens"), direct=stacked("direct"),
        analysis=run.analysis, settings=settings, check_errors=data.checks,
        patching=patching, predictors=data.predictors() if data.tokens else {})


def _fixed_settings(seed: int, ablation: BlockAblation) -> dict[str, Any]:
    """The settings no argument chooses: what each seed seeds, the check tolerance, ..."""
    return {"seeds": {"donors": seed, "random_predictor": seed, "bootstrap": seed},
            "tolerance": ablation.tolerance, "grow": ablation.grow,
            "excluded_block": dict(EXCLUDED_BLOCK), "onset_rule": DEFAULT_ONSET_RULE}


def _finish_settings(settings: dict[str, Any], clock: dict[str, tuple[float, float]],
                     prov: dict[str, Any]) -> None:
    """Add the wall and CPU seconds of each phase, the provenance and the model's name."""
    names = list(clock)
    for key, col in (("seconds", 0), ("cpu_seconds", 1)):
        settings[key] = {names[i + 1]: clock[names[i + 1]][col] - clock[names[i]][col]
                         for i in range(len(names) - 1)}
    settings["provenance"] = prov
    settings["model"] = prov["model"]
