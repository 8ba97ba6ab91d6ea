"""Prompt -> chat template -> greedy answer -> IG-Lens over every answer token."""

from __future__ import annotations

import warnings
from typing import Any, Optional, Sequence, Union

import torch
from torch import nn

from captum_iglens._inputs import LayerSpec, is_int
from captum_iglens.architectures import display_name
from captum_iglens.ig_lens import IGLens
from captum_iglens.residual import input_device, model_state_preserved
from captum_iglens.results import IGLensResult
from captum_iglens.results._format import as_cpu

__all__ = [
    "build_prompt_ids",
    "generate_answer",
    "explain",
    "explain_ids",
    "target_token_id",
    "target_token_ids",
]

TargetText = Union[None, str, Sequence[int]]


def _target_ids(target: Any) -> list[int]:
    """Token ids given as an int, a sequence of ints or an integer tensor (never coerced)."""
    values = target.tolist() if isinstance(target, torch.Tensor) else target
    values = [values] if is_int(values) else list(values)
    if not values or not all(is_int(v) for v in values):
        raise TypeError(f"target must be text or integer token ids, got {target!r}")
    return [int(v) for v in values]


def _describe_ids(tokenizer: Any, ids: Sequence[int]) -> str:
    pieces = [tokenizer.decode([i]) for i in ids]
    return ", ".join(f"{i} ({piece!r})" for i, piece in zip(ids, pieces, strict=True))


def target_token_ids(tokenizer: Any, text: str) -> list[int]:
    """Token ids of a target string, without special tokens.

    A leading space matters: ``" Paris"`` and ``"Paris"`` are
    different tokens in byte-level BPE vocabularies, so the ids are what should be reported.

    Raises:
        ValueError: if ``text`` is empty or tokenises to no token.
    """
    if not isinstance(text, str) or not text:
        raise ValueError("The target string is empty: give the text of the token to explain.")
    ids = list(tokenizer(text, add_special_tokens=False)["input_ids"])
    if not ids:
        raise ValueError(f"The target {text!r} tokenises to no token.")
    return ids


def target_token_id(tokenizer: Any, text: str) -> int:
    """The single token id of ``text``, for ``IGLens.attribute(target=...)``.

    Raises:
        ValueError: if ``text`` tokenises to several tokens; the message lists their ids and
            pieces, and points to ``explain(..., target=text)``, which explains each of them
            as a teacher-forced answer. Mind the leading space: ``" Paris"`` vs ``"Paris"``.
    """
    ids = target_token_ids(tokenizer, text)
    if len(ids) != 1:
        raise ValueError(
            f"The target {text!r} tokenises to {len(ids)} tokens: {_describe_ids(tokenizer, ids)}. "
            "IG-Lens explains one token id at a time: pass one of these ids as target, or use "
            "explain(model, tokenizer, prompt, target=text) to explain each token of it in "
            "turn. A leading space gives a different token (' Paris' vs 'Paris')."
        )
    return ids[0]


def build_prompt_ids(
    tokenizer: Any, prompt: str, chat_template: bool = True
) -> tuple[list[int], bool]:
    """Token ids of ``prompt``, wrapped in the tokenizer's chat template when it has one.

    Returns:
        (ids, used_template): the prompt ids and whether a chat template was applied. A
        tokenizer without a chat template falls back to the raw prompt with a warning.

    Raises:
        ValueError: if the prompt is empty or only white space.
    """
    if not isinstance(prompt, str) or not prompt.strip():
        raise ValueError("The prompt is empty: give some text to explain.")
    if chat_template and getattr(tokenizer, "chat_template", None):
        text = tokenizer.apply_chat_template(
            [{"role": "user", "content": prompt}], tokenize=False, add_generation_prompt=True
        )
        return _nonempty(list(tokenizer(text, add_special_tokens=False)["input_ids"]), prompt), True
    if chat_template:
        warnings.warn(
            "The tokenizer has no chat template; explaining the raw prompt.", stacklevel=2
        )
    return _nonempty(list(tokenizer(prompt)["input_ids"]), prompt), False


def _nonempty(ids: list[int], prompt: str) -> list[int]:
    if not ids:
        raise ValueError(
            f"The tokenizer turned the prompt {prompt[:40]!r} into no tokens: is it the model's "
            "own tokenizer, with its vocabulary files?"
        )
    return ids


def generate_answer(
    model: nn.Module, tokenizer: Any, prompt_ids: Sequence[int], max_new_tokens: int = 64
) -> list[int]:
    """Greedy answer with transformers' ``generate`` (KV cache, attention mask, stops at EOS).

    Returns the generated token ids (the EOS token included when the model emitted it).
    """
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
    ids = torch.tensor([list(prompt_ids)], device=input_device(model))
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    with model_state_preserved(model), torch.no_grad():
        out = model.generate(
            input_ids=ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=max_new_tokens,
            do_sample=False,
            pad_token_id=pad,
            use_cache=True,
        )
    return out[0, ids.shape[1]:].tolist()


def explain_ids(
    model: nn.Module,
    prompt_ids: Sequence[int],
    answer_ids: Sequence[int],
    tokenizer: Any = None,
    layers: LayerSpec = None,
    onset_frac: float = 0.5,
    prompt: str = "",
    lens: Optional[IGLens] = None,
    **attribute_kwargs: Any,
) -> IGLensResult:
    """IG-Lens over every token of ``answer_ids`` with one teacher-forced forward.

    Answer token ``t`` is the target at position ``len(prompt_ids) - 1 + t`` of
    ``prompt_ids + answer_ids``.

    Args:
        model (nn.Module): A Hugging Face causal LM.
        prompt_ids (sequence of int): The prompt's token ids (chat template included).
        answer_ids (sequence of int): The answer's token ids, each explained in turn.
        tokenizer (optional): To decode tokens for the result.
        layers (optional): As for :class:`~captum_iglens.IGLens` (ignored with ``lens``).
        onset_frac (float, optional): Fraction for the onset layer. Default: 0.5.
        prompt (str, optional): The prompt text, recorded in the result.
        lens (IGLens, optional): A lens to reuse.
        **attribute_kwargs: Passed to :meth:`~captum_iglens.IGLens.attribute`:
            ``baselines``, ``method``, ``n_steps``, ``internal_batch_size``.

    Returns:
        IGLensResult: ``[T, k]`` credits and logit-lens levels, ``p_final``, onset layers.

    Raises:
        ValueError: empty prompt or answer; and as :meth:`~captum_iglens.IGLens.attribute`.
    """
    if not prompt_ids:
        raise ValueError("The prompt has no tokens: give some text to explain.")
    if not answer_ids:
        raise ValueError("The answer has no tokens: nothing to explain.")
    lens = lens if lens is not None else IGLens(model, layers=layers)
    device = input_device(model)
    full = list(prompt_ids) + list(answer_ids)
    # The last answer token is never an input of an explained prediction: leave it out, so
    # that the "mean" baseline averages the same positions as an attribution of that prefix.
    ids = torch.tensor([full[:-1]], device=device)
    n_prompt = len(prompt_ids)
    positions = list(range(n_prompt - 1, n_prompt - 1 + len(answer_ids)))
    target = torch.tensor([list(answer_ids)], device=device)
    out = lens.attribute_details(ids, target=target, positions=positions, **attribute_kwargs)
    attributions = as_cpu(out.attributions[0])
    decode = (lambda i: tokenizer.decode([i])) if tokenizer is not None else str
    answer = tokenizer.decode(list(answer_ids), skip_special_tokens=True) if tokenizer else ""
    return IGLensResult(
        prompt=prompt,
        answer=answer,
        prompt_length=n_prompt,
        input_ids=full,
        tokens=[decode(i) for i in answer_ids],
        token_ids=list(answer_ids),
        positions=positions,
        layer_indices=list(lens.layer_indices),
        attributions=attributions,
        lens_probs=as_cpu(out.lens_probs[0]),
        p_final=as_cpu(out.p_final[0]),
        p_baseline=as_cpu(out.p_baseline[0]),
        convergence_delta=as_cpu(out.convergence_delta[0]),
        onset_layers=[int(o) for o in lens.onset_layers(attributions, onset_frac).tolist()],
        method=attribute_kwargs.get("method", "prediction_aware"),
        baseline=out.baseline,
        n_steps=attribute_kwargs.get("n_steps", 50),
        onset_frac=onset_frac,
        model_name=display_name(model),
    )


def explain(
    model: nn.Module,
    tokenizer: Any,
    prompt: Union[str, Sequence[str]],
    max_new_tokens: int = 64,
    layers: LayerSpec = None,
    onset_frac: float = 0.5,
    chat_template: bool = True,
    target: TargetText = None,
    **attribute_kwargs: Any,
) -> Union[IGLensResult, list[IGLensResult]]:
    """Answer ``prompt`` greedily and attribute every answer token with IG-Lens.

    Applies the tokenizer's chat template when it has one (``chat_template=True``), generates
    with transformers' ``generate`` (greedy, KV cache, stops at EOS), then explains all
    answer tokens with one teacher-forced forward over prompt + answer (``use_cache=False``).

    Args:
        model (nn.Module): A Hugging Face causal LM.
        tokenizer: Its tokenizer.
        prompt (str or sequence of str): One prompt, or several (a list of results back).
        max_new_tokens (int, optional): Longest answer. Default: 64.
        layers (optional): As for :class:`~captum_iglens.IGLens`. Default: all blocks.
        onset_frac (float, optional): Fraction for the onset layer. Default: 0.5.
        chat_template (bool, optional): Use the chat template if there is one. Default: True.
        target (str or sequence of int, optional): Explain this answer instead of the
            generated one (no generation): a string is tokenised without special tokens
            (a leading space matters) and *each* of its tokens is explained as a
            teacher-forced continuation; ``result.token_ids`` reports the ids. For a single
            id use :func:`target_token_id` with :meth:`~captum_iglens.IGLens.attribute`.
            Default: None (greedy answer).
        **attribute_kwargs: Attribution settings, passed to
            :meth:`~captum_iglens.IGLens.attribute` (Captum's LLM-attribution style):
            ``baselines``, ``method``, ``n_steps``, ``internal_batch_size``.

    Returns:
        IGLensResult (or a list of them, one per prompt, for several prompts).

    Raises:
        ValueError: empty prompt or target, no prompts, or the model generated no token.

    Examples::

        >>> result = explain(model, tokenizer, "The capital of France is", target=" Paris")
        >>> result.token_ids, result.attributions.shape     # ids of " Paris", [T, k]
        >>> results = explain(model, tokenizer, ["Name a prime.", "Name a colour."],
        ...                   method="gausslegendre", n_steps=64)
    """
    lens = IGLens(model, layers=layers)
    settings = dict(max_new_tokens=max_new_tokens, onset_frac=onset_frac,
                    chat_template=chat_template, target=target, lens=lens, **attribute_kwargs)
    if isinstance(prompt, str):
        return _explain_one(model, tokenizer, prompt, **settings)
    prompts = list(prompt)
    if not prompts:
        raise ValueError("No prompts given.")
    return [_explain_one(model, tokenizer, p, **settings) for p in prompts]


def _explain_one(
    model: nn.Module,
    tokenizer: Any,
    prompt: str,
    max_new_tokens: int,
    onset_frac: float,
    chat_template: bool,
    target: TargetText,
    lens: IGLens,
    **attribute_kwargs: Any,
) -> IGLensResult:
    prompt_ids, used = build_prompt_ids(tokenizer, prompt, chat_template)
    if target is None:
        answer_ids = generate_answer(model, tokenizer, prompt_ids, max_new_tokens)
    elif isinstance(target, str):
        answer_ids = target_token_ids(tokenizer, target)
    else:
        answer_ids = _target_ids(target)
    result = explain_ids(model, prompt_ids, answer_ids, tokenizer=tokenizer,
                         onset_frac=onset_frac, prompt=prompt, lens=lens, **attribute_kwargs)
    result.chat_template_used = used
    return result
