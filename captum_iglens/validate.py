"""Does IG-Lens credit predict causal importance? Ablation against a prompt set.

IG-Lens credits a block with a conditional marginal, what the final norm and unembedding
can read out of ``h_L`` beyond the previous layer (arXiv:2606.29693); the paper's
falsifiable reading is that the layer it marks (largest credit, onset) hurts more when
ablated than layers it scores lower. This module tests that: it explains every prompt of a
set (chat template, greedy answer), ablates every block at every answer token with
``p_final >= threshold`` (:mod:`captum_iglens.ablation`), and scores per token how well
each predictor ranks the blocks by their drop, against simple baselines. A weak or negative
answer is a legitimate result.

Predictors (``[n]`` scores per token): IG-Lens credit, ``|credit|``, the logit-lens level
``f(h_L)``, the direct effect ``f(h_n) - f(h_n - u_L)``, "first layer" and "last layer"
always, random scores, and the mean drop profile of the *other* prompts. Metrics per token:
Spearman's rho (NaN for constant input), top-1 / top-3 hit (the predictor's top block is
the block with the largest drop / among the three largest), the drop percentile (0-100, 50
by chance) at the predictor's top block and at its onset, and ``|onset - half-drop block|``
in layers (the half-drop block: the first from which the cumulative drop stays at or beyond
half its sum, the rule of IG-Lens's default onset). Summaries: median (hit rates: mean)
with a prompt-clustered bootstrap 95% CI, for all tokens and for tokens whose logit-lens
trajectory is non-monotonic, and paired IG-Lens-minus-predictor differences under the same
bootstrap.
"""

from __future__ import annotations

import json
import math
import time
import warnings
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any, Optional, Sequence, Union

import numpy as np
import torch
from torch import nn
from tqdm.auto import tqdm

from captum_iglens import explain
from captum_iglens.ablation import KINDS, BlockAblation, ReferenceSetError, mean_updates
from captum_iglens.prompts import render_prompt
from captum_iglens.validate_report import ValidationResult
from captum_iglens.validate_stats import METRICS, PREDICTORS, analyse

__all__ = ["METRICS", "PREDICTORS", "ValidationResult", "load_prompts", "max_reference_positions",
           "prompt_lengths", "reference_shortfall", "validate"]

DEFAULT_THRESHOLD = 0.2
DEFAULT_MAX_NEW_TOKENS = 12
DEFAULT_MIN_REFERENCE = 200


def load_prompts(path: Union[str, Path, None] = None) -> list[str]:
    """The validation prompts: the frozen set shipped with the package, or a file.

    Args:
        path (str or Path, optional): A ``.jsonl`` file of objects with a ``"prompt"`` key,
            or a text file with one prompt per line. Default: the package's
            ``data/validation_prompts.jsonl`` (read with :mod:`importlib.resources`).

    Returns:
        list[str]: the prompts, in file order.

    Raises:
        ValueError: if the file holds no prompt or a JSON line has no ``"prompt"`` string.
    """
    if path is None:
        text = (resources.files("captum_iglens") / "data" / "validation_prompts.jsonl"
                ).read_text(encoding="utf-8")
        is_jsonl = True
    else:
        text = Path(path).read_text(encoding="utf-8")
        is_jsonl = str(path).endswith(".jsonl")
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    prompts = [_prompt_of(json.loads(line)) for line in lines] if is_jsonl else lines
    if not prompts or not all(isinstance(p, str) and p.strip() for p in prompts):
        raise ValueError(f"{path or 'the packaged prompt set'} holds no prompt, or a JSON line "
                         "without a non-empty \"prompt\" string.")
    return prompts


def _prompt_of(entry: Any) -> Any:
    return entry.get("prompt") if isinstance(entry, dict) else None


def prompt_lengths(tokenizer: Any, prompts: Sequence[str]) -> list[int]:
    """Token count of each prompt as :func:`validate` explains it (chat template applied).

    Args:
        tokenizer: The model's tokenizer.
        prompts (sequence of str): The prompts.

    Returns:
        list[int]: one count per prompt. The template warnings (no template, a template that
        writes today's date) are left to the explanation itself.
    """
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return [len(render_prompt(tokenizer, prompt, True).ids) for prompt in prompts]


def max_reference_positions(lengths: Sequence[int], max_new_tokens: int) -> int:
    """The most reference positions ``mean`` ablation can find for any prompt of a set.

    A prompt's reference set is every other prompt's sequence (prompt and answer) after
    position 0, and an answer has at most ``max_new_tokens`` tokens: a prompt's set holds at
    most the sum over the others of ``length + max_new_tokens - 1``. The largest such set is
    the shortest prompt's.

    Args:
        lengths (sequence of int): Tokens of each prompt (chat template included), or upper
            bounds of them.
        max_new_tokens (int): Longest answer.

    Returns:
        int: the upper bound (0 for fewer than two prompts).
    """
    spans = [n + max_new_tokens - 1 for n in lengths]
    return sum(spans) - min(spans) if len(spans) > 1 else 0


def reference_shortfall(lengths: Sequence[int], max_new_tokens: int,
                        min_reference: int = DEFAULT_MIN_REFERENCE) -> Optional[str]:
    """Why ``mean`` ablation cannot run on a prompt set; None when it may.

    Mean ablation fails for certain when even the largest reference set of
    :func:`max_reference_positions` falls short of ``min_reference`` (every prompt's own
    set is then too small, whichever tokens pass the threshold).

    Args:
        lengths (sequence of int): As for :func:`max_reference_positions`.
        max_new_tokens (int): Longest answer.
        min_reference (int, optional): Fewest reference positions. Default: 200.

    Returns:
        str or None: the shortfall, counts and the prompts needed, without the remedy.
    """
    most = max_reference_positions(lengths, max_new_tokens)
    if most >= min_reference or len(lengths) < 2:
        return None
    needed = math.ceil(min_reference / (most / (len(lengths) - 1))) + 1
    return (f"mean ablation needs at least {min_reference} reference positions (the other "
            f"prompts' tokens, position 0 excluded), but with these {len(lengths)} prompts and "
            f"answers of at most {max_new_tokens} tokens a prompt's reference set holds at most "
            f"{most} (at least {needed} prompts of this length are needed)")


@dataclass
class _Item:
    """One explained prompt: its IG-Lens result, residual trace and selected answer tokens."""

    result: Any
    trace: Any
    selected: list[int]


@dataclass
class _Data:
    """Per-token arrays over ``N`` selected tokens and ``n`` blocks (columns = blocks 1..n)."""

    credits: list[np.ndarray] = field(default_factory=list)
    lens: list[np.ndarray] = field(default_factory=list)
    direct: list[np.ndarray] = field(default_factory=list)
    drops: dict[str, list[np.ndarray]] = field(default_factory=dict)
    tokens: list[dict[str, Any]] = field(default_factory=list)
    checks: dict[str, float] = field(default_factory=dict)

    def stacked(self, name: str) -> np.ndarray:
        return np.concatenate(getattr(self, name)).astype(np.float64)


def _explain_all(model: nn.Module, tokenizer: Any, prompts: Sequence[str], max_new_tokens: int,
                 threshold: float, ablation: BlockAblation, progress: bool) -> list[_Item]:
    items = []
    for prompt in tqdm(prompts, desc="explain", unit="prompt", disable=not progress):
        result = explain(model, tokenizer, prompt, max_new_tokens=max_new_tokens,
                         chat_template=True)
        trace = ablation.trace(torch.tensor(result.input_ids))
        selected = [t for t, p in enumerate(result.p_final.tolist()) if p >= threshold]
        items.append(_Item(result, trace, selected))
    return items


def _donors(n_items: int, seed: int) -> list[int]:
    """Donor prompt of each prompt for ``resample``: a seeded cycle, never itself."""
    order = np.random.default_rng(seed).permutation(n_items)
    donor = [0] * n_items
    for j, q in enumerate(order):
        donor[int(q)] = int(order[(j + 1) % n_items])
    return donor


def _ablate_item(ablation: BlockAblation, items: list[_Item], p: int, donor: int,
                 kinds: Sequence[str], min_reference: int) -> tuple[Any, torch.Tensor]:
    """Ablate every block at the selected tokens of prompt ``p``.

    ``mean`` uses the other prompts as reference; ``resample`` takes the donor prompt's
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
        d = items[donor].result
        d_pos = [min(d.prompt_length - 1 + t, len(d.input_ids) - 1) for t in item.selected]
        resample = items[donor].trace.updates[d_pos]
    out = ablation.ablate(item.trace, pos, target, kinds, mean, resample,
                          p_final=res.p_final[item.selected],
                          last_credit=res.attributions[item.selected, -1])
    return out, ablation.direct_effects(item.trace, pos, target)


def _ablate_all(ablation: BlockAblation, items: list[_Item], kinds: Sequence[str], seed: int,
                min_reference: int, progress: bool) -> _Data:
    data = _Data(drops={k: [] for k in kinds})
    donors = _donors(len(items), seed)
    total = sum(len(it.selected) for it in items)
    with tqdm(total=total, desc="ablate", unit="token", disable=not progress) as bar:
        for p, item in enumerate(items):
            if not item.selected:
                continue
            out, direct = _ablate_item(ablation, items, p, donors[p], kinds, min_reference)
            res, sel = item.result, item.selected
            data.credits.append(res.attributions[sel].numpy())
            data.lens.append(res.lens_probs[sel].numpy())
            data.direct.append(direct.numpy())
            for kind in kinds:
                data.drops[kind].append(out.drops[kind].numpy())
            for j, t in enumerate(sel):
                data.tokens.append({"prompt_index": p, "token": res.tokens[t],
                                    "token_id": res.token_ids[t], "position": res.positions[t],
                                    "p_final": float(res.p_final[t]),
                                    "onset_layer": int(res.onset_layers[t]),
                                    "donor_prompt_index": donors[p], "row": j})
            for name, err in out.check_errors.items():
                data.checks[name] = max(data.checks.get(name, 0.0), err)
            bar.update(len(sel))
    return data


def _check_settings(kinds: Sequence[str], threshold: float, max_new_tokens: int, n_boot: int,
                    n_prompts: int) -> tuple[str, ...]:
    kinds = tuple(kinds)
    if not kinds or any(k not in KINDS for k in kinds) or len(set(kinds)) != len(kinds):
        raise ValueError(f"kinds must be distinct names among {KINDS}, got {kinds}.")
    if not 0.0 <= threshold <= 1.0:
        raise ValueError(f"threshold is a probability in [0, 1], got {threshold}.")
    if max_new_tokens < 1 or n_boot < 1:
        raise ValueError("max_new_tokens and n_boot must be >= 1.")
    if n_prompts < 2:
        raise ValueError("Validation needs at least 2 prompts (mean and resample ablations and "
                         "the other-prompts predictor use the other prompts).")
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
             kinds: Sequence[str] = KINDS, threshold: float = DEFAULT_THRESHOLD,
             max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS, seed: int = 0, n_boot: int = 1000,
             nonmonotonic_tol: float = 0.05, min_reference: int = DEFAULT_MIN_REFERENCE,
             progress: bool = True) -> ValidationResult:
    """Test whether IG-Lens credit predicts the causal effect of ablating each block.

    Args:
        model (nn.Module): A Hugging Face causal LM (all its blocks are explained).
        tokenizer: Its tokenizer (its chat template is applied).
        prompts (sequence of str, optional): Default: :func:`load_prompts` (the packaged set).
        kinds (sequence of str, optional): Ablation kinds, some of ``("zero", "mean",
            "resample")``. Default: all three.
        threshold (float, optional): Explain answer tokens with ``p_final >=`` this
            (probability). Default: 0.2.
        max_new_tokens (int, optional): Longest greedy answer. Default: 12.
        seed (int, optional): Seeds the donors, the random predictor and the bootstrap.
        n_boot (int, optional): Bootstrap resamples of prompts. Default: 1000.
        nonmonotonic_tol (float, optional): A logit-lens trajectory is non-monotonic when it
            falls more than this (probability) below its running maximum. Default: 0.05.
        min_reference (int, optional): Fewest reference positions for ``mean``. Default: 200.
        progress (bool, optional): Show tqdm progress bars on stderr. Default: True.

    Returns:
        ValidationResult: per-token drops and predictors, metrics and bootstrap summaries.

    Raises:
        ValueError: bad settings, fewer than 2 prompts, or no token above ``threshold``.
        ReferenceSetError: (a ValueError) prompts too few or short for the reference set of
            ``mean``: found before anything is explained where it is certain, else when the
            first token is ablated.
        AblationCheckError: a built-in check of the ablation failed.
    """
    prompts = load_prompts() if prompts is None else [str(p) for p in prompts]
    kinds = _check_settings(kinds, threshold, max_new_tokens, n_boot, len(prompts))
    _check_reference(tokenizer, prompts, kinds, max_new_tokens, min_reference)
    ablation = BlockAblation(model)
    clock = [time.perf_counter()]
    items = _explain_all(model, tokenizer, prompts, max_new_tokens, threshold, ablation,
                         progress)
    clock.append(time.perf_counter())
    data = _ablate_all(ablation, items, kinds, seed, min_reference, progress)
    clock.append(time.perf_counter())
    if not data.tokens:
        raise ValueError(f"No answer token has p_final >= {threshold}: lower the threshold.")
    prompt = np.array([t["prompt_index"] for t in data.tokens])
    onset = np.array([t["onset_layer"] for t in data.tokens]) - 1
    drops = {k: np.concatenate(v).astype(np.float64) for k, v in data.drops.items()}
    analysis = analyse(data.stacked("credits"), data.stacked("lens"), data.stacked("direct"),
                       onset, drops, prompt, n_boot, seed, nonmonotonic_tol)
    clock.append(time.perf_counter())
    for token, flag in zip(data.tokens, analysis["nonmonotonic"], strict=True):
        token["nonmonotonic"] = bool(flag)
    settings = {
        "model": str(getattr(getattr(model, "config", None), "_name_or_path", "")),
        "kinds": list(kinds), "threshold": threshold, "max_new_tokens": max_new_tokens,
        "seed": seed, "n_boot": n_boot, "nonmonotonic_tol": nonmonotonic_tol,
        "min_reference": min_reference, "tolerance": ablation.tolerance,
        "onset_rule": str(getattr(items[0].result, "onset_rule", "mass")),
        "seconds": {name: clock[i + 1] - clock[i]
                    for i, name in enumerate(("explain", "ablate", "analyse"))},
    }
    return ValidationResult(
        kinds=kinds, layer_indices=list(range(1, ablation.num_layers + 1)), prompts=prompts,
        answers=[it.result.answer for it in items], tokens=data.tokens,
        credits=data.stacked("credits"), lens_probs=data.stacked("lens"),
        direct=data.stacked("direct"), drops=drops, metrics=analysis["metrics"],
        summary=analysis["summary"], paired=analysis["paired"], settings=settings,
        check_errors=data.checks)
