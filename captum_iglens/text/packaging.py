"""One row of an :class:`IGLensOutput` packaged as the :class:`IGLensResult` of one answer.

``explain`` (one prompt) and the batched dataset path (many prompts in one padded forward)
both end here, so a row of a batch and a single-prompt run give the same result object.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Any, Optional, Sequence

import torch

from captum_iglens._core.baselines import BASELINE_DESCRIPTIONS
from captum_iglens._core.onset import onset_layer_indices
from captum_iglens._core.total_refs import REFERENCE_DESCRIPTIONS
from captum_iglens._utils.format import as_cpu
from captum_iglens.results.explanation import IGLensResult
from captum_iglens.results.output import IGLensOutput
from captum_iglens.settings import (
    DEFAULT_ONSET_FRAC,
    DEFAULT_ONSET_RULE,
    AttributionSettings,
)
from captum_iglens.text.prompts import decode_token, padded_vocab_rows, token_labels

__all__ = ["AnswerSpec", "result_from_output"]


@dataclass(frozen=True)
class AnswerSpec:
    """What a result records beside the numbers: the sequence and the settings used.

    Attributes:
        prompt (str): The user's prompt (before any chat template), or a document's text.
        input_ids (list[int]): The whole unpadded sequence: prompt (template applied) and
            answer.
        prompt_length (int): Number of prompt tokens; the answer is the rest.
        token_ids (list[int]): The ``T`` explained targets.
        positions (list[int]): Where each is predicted, in ``input_ids``.
        onset_frac (float): Fraction of the onset rule.
        onset_rule (str): ``"sustained"`` or ``"mass"``.
        model_name (str): The model's display name.
    """

    prompt: str
    input_ids: list[int]
    prompt_length: int
    token_ids: list[int]
    positions: list[int]
    onset_frac: float = DEFAULT_ONSET_FRAC
    onset_rule: str = DEFAULT_ONSET_RULE
    model_name: str = ""


def result_from_output(out: IGLensOutput, row: int, columns: Sequence[int], spec: AnswerSpec,
                       tokenizer: Any = None,
                       settings: Optional[AttributionSettings] = None) -> IGLensResult:
    """The :class:`IGLensResult` of row ``row``, explained positions ``columns`` of ``out``.

    Args:
        out (IGLensOutput): ``[B, P, k]`` credits and the rest of one IG-Lens pass.
        row (int): The batch row, ``0 <= row < B``.
        columns (sequence of int): ``T`` indices into the ``P`` explained positions, one per
            answer token, in answer order.
        spec (AnswerSpec): Sequence, targets and report settings; ``len(spec.token_ids) ==
            T`` (the estimator and its steps are ``out``'s).
        tokenizer (optional): Decodes the answer and its tokens (ids as text without one).
        settings (AttributionSettings, optional): The settings ``out`` was made with: their
            ``scope`` and ``grad_drop`` are recorded (``out`` does not hold them). Default:
            None (the defaults).

    Returns:
        IGLensResult: credits ``[T, k]`` and the rest as float32 CPU tensors, in ``out``'s
        units; positions are those of the unpadded ``spec.input_ids``.

    Raises:
        ValueError: if ``columns``, targets and positions differ in length.
    """
    cols = list(columns)
    targets = list(spec.token_ids)
    if not len(cols) == len(targets) == len(spec.positions):
        raise ValueError(f"{len(cols)} explained columns for {len(targets)} targets at "
                         f"{len(spec.positions)} positions.")
    attributions = as_cpu(out.attributions[row, cols])
    onsets = onset_layer_indices(attributions, out.layer_indices, spec.onset_frac,
                                 spec.onset_rule)
    answer = list(spec.input_ids[spec.prompt_length:])
    if tokenizer is not None:
        _warn_if_padded_rows(tokenizer, [*answer, *targets])
    return IGLensResult(
        prompt=spec.prompt,
        answer=tokenizer.decode(answer, skip_special_tokens=True) if tokenizer else "",
        prompt_length=spec.prompt_length,
        input_ids=list(spec.input_ids),
        tokens=token_labels(tokenizer, targets) if tokenizer else [str(i) for i in targets],
        token_ids=targets,
        positions=list(spec.positions),
        layer_indices=list(out.layer_indices),
        attributions=attributions,
        lens_probs=as_cpu(out.lens_probs[row, cols]),
        p_final=as_cpu(out.p_final[row, cols]),
        p_baseline=as_cpu(out.p_baseline[row, cols]),
        convergence_delta=as_cpu(out.convergence_delta[row, cols]),
        onset_layers=[int(o) for o in onsets.tolist()],
        method=out.method,
        baseline=out.baseline,
        baseline_description=_describe(out),
        n_steps=out.n_steps,
        onset_frac=spec.onset_frac,
        onset_rule=spec.onset_rule,
        model_name=spec.model_name,
        is_argmax=_is_argmax(out, row, cols),
        units=out.units,
        granularity=out.granularity,
        effect=out.effect,
        scope=(settings or AttributionSettings()).scope,
        grad_drop=(settings or AttributionSettings()).grad_drop,
        **_head_fields(out, row, cols),
        lens_change=None if out.lens_change is None else as_cpu(out.lens_change[row, cols]),
        lens=out.lens,
        **_top_k_fields(out, row, cols, tokenizer),
        **_contrast_fields(out, row, cols, tokenizer),
    )


def _warn_if_padded_rows(tokenizer: Any, ids: Sequence[int]) -> None:
    """Warn when answer tokens are vocabulary rows that no token has (text would drop them)."""
    rows = sorted(set(padded_vocab_rows(tokenizer, ids)))
    if rows:
        warnings.warn(
            f"Answer token ids {rows[:5]} are padded vocabulary rows: the model has rows "
            f"beyond the tokenizer's {len(tokenizer)} tokens (its output embedding was "
            "resized, e.g. with pad_to_multiple_of), and no token exists for them. Their "
            f"labels read {decode_token(tokenizer, rows[0])!r}, the answer text leaves them "
            "out; their credits are the model's own numbers.", stacklevel=3)


def _describe(out: IGLensOutput) -> str:
    """The baseline (readout) or the gates' reference (total effect, AtP), in words."""
    words = BASELINE_DESCRIPTIONS if out.effect == "readout" else REFERENCE_DESCRIPTIONS
    return words.get(out.baseline, out.baseline)


def _is_argmax(out: IGLensOutput, row: int, cols: list[int]) -> list[bool]:
    if out.model_argmax is None:
        return []
    return (out.model_argmax[row, cols] == out.target[row, cols]).tolist()


def _head_fields(out: IGLensOutput, row: int, cols: list[int]) -> dict[str, Any]:
    if out.head_credits is None or out.head_rest is None:
        return {}
    return {"head_credits": as_cpu(out.head_credits[row, cols]),
            "head_rest": as_cpu(out.head_rest[row, cols])}


def _top_k_fields(out: IGLensOutput, row: int, cols: list[int],
                  tokenizer: Any) -> dict[str, Any]:
    if out.top_k_ids is None or out.top_k_probs is None:
        return {}
    ids = out.top_k_ids[row, cols].cpu()
    decode = (lambda i: decode_token(tokenizer, i)) if tokenizer is not None else str
    tokens = [[[decode(int(i)) for i in layer] for layer in token] for token in ids.tolist()]
    return {"top_k_ids": ids, "top_k_probs": as_cpu(out.top_k_probs[row, cols]),
            "top_k_tokens": tokens}


def _contrast_fields(out: IGLensOutput, row: int, cols: list[int],
                     tokenizer: Any) -> dict[str, Any]:
    contrast: Optional[torch.Tensor] = getattr(out, "contrast", None)
    if contrast is None:
        return {}
    ids = [int(i) for i in contrast[row, cols].tolist()]
    tokens = token_labels(tokenizer, ids) if tokenizer else [str(i) for i in ids]
    return {"contrast_ids": ids, "contrast_tokens": tokens}
