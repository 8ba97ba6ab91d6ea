"""Prompt -> chat template -> greedy answer -> IG-Lens over every answer token."""

from __future__ import annotations

import warnings
from typing import Any, Optional, Sequence, Union

import torch
from torch import nn

from captum_iglens._core.inputs import check_token_ids
from captum_iglens._utils.typing import LayerSpec
from captum_iglens.ig_lens import IGLens
from captum_iglens.lens.architectures import display_name, strip_parallel
from captum_iglens.lens.context import check_context
from captum_iglens.lens.state import input_device
from captum_iglens.results import IGLensResult
from captum_iglens.settings import (
    DEFAULT_BASELINE,
    DEFAULT_EFFECT,
    DEFAULT_GRANULARITY,
    DEFAULT_METHOD,
    DEFAULT_N_STEPS,
    DEFAULT_ONSET_FRAC,
    DEFAULT_ONSET_RULE,
    DEFAULT_UNITS,
)
from captum_iglens.text.batched import AnswerJob, explain_recorded
from captum_iglens.text.generation import DEFAULT_MAX_NEW_TOKENS, end_ids, generate_answer
from captum_iglens.text.packaging import AnswerSpec, result_from_output
from captum_iglens.text.prompts import (
    RenderedPrompt,
    build_prompt_ids,
    check_prompt_type,
    render_prompt,
    target_ids,
    target_token_id,
    target_token_ids,
)
from captum_iglens.text.recorded import can_record, generate_recording

__all__ = [
    "DEFAULT_MAX_NEW_TOKENS",
    "RenderedPrompt",
    "build_prompt_ids",
    "render_prompt",
    "generate_answer",
    "explain",
    "explain_ids",
    "target_token_id",
    "target_token_ids",
]

TargetText = Union[None, str, Sequence[int]]

def explain_ids(
    model: nn.Module,
    prompt_ids: Sequence[int],
    answer_ids: Sequence[int],
    tokenizer: Any = None,
    layers: LayerSpec = None,
    onset_frac: float = DEFAULT_ONSET_FRAC,
    prompt: str = "",
    lens: Optional[IGLens] = None,
    onset_rule: str = DEFAULT_ONSET_RULE,
    top_k: int = 0,
    contrast: Optional[Sequence[int]] = None,
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
        onset_rule (str, optional): ``"sustained"`` (default) or ``"mass"``; see
            :func:`~captum_iglens.onset_layer_indices`.
        top_k (int, optional): Record the logit lens's ``top_k`` tokens at every layer.
            Default: 0.
        contrast (int or sequence of int, optional): Foil token ids, one for every answer
            token or one per answer token: the credits then decompose
            ``p(token) - p(foil)`` (log units: ``log p(token) - log p(foil)``, nats).
            Default: None.
        **attribute_kwargs: Passed to :meth:`~captum_iglens.IGLens.attribute`:
            ``baselines``, ``method``, ``n_steps``, ``internal_batch_size``.

    Returns:
        IGLensResult: ``[T, k]`` credits and logit-lens levels, ``p_final``, onset layers,
        and per token whether it is the argmax of the explained forward.

    Raises:
        ValueError: empty prompt or answer, a contrast of the wrong length, prompt plus
            answer beyond the model's context
            (:func:`~captum_iglens.lens.context.check_context`); and as
            :meth:`~captum_iglens.IGLens.attribute`.
    """
    model = strip_parallel(model)
    if not prompt_ids:
        raise ValueError("The prompt has no tokens: give some text to explain.")
    if not answer_ids:
        raise ValueError("The answer has no tokens: nothing to explain.")
    check_context(model, len(prompt_ids), len(answer_ids), generated=False)
    lens = lens if lens is not None else IGLens(model, layers=layers)
    device = input_device(model)
    full = list(prompt_ids) + list(answer_ids)
    # The last answer token is never an input of an explained prediction: leave it out.
    ids = torch.tensor([full[:-1]], device=device)
    n_prompt = len(prompt_ids)
    positions = list(range(n_prompt - 1, n_prompt - 1 + len(answer_ids)))
    target = torch.tensor([list(answer_ids)], device=device)
    if contrast is not None:
        foils = contrast_per_token(contrast, len(answer_ids))
        attribute_kwargs["contrast"] = torch.tensor([foils], device=device)
    out = lens.attribute_details(ids, target=target, positions=positions, top_k=top_k,
                                 **attribute_kwargs)
    spec = answer_spec(model, prompt, prompt_ids, answer_ids, onset_frac, onset_rule,
                       attribute_kwargs)
    return result_from_output(out, 0, range(len(answer_ids)), spec, tokenizer)


def answer_spec(model: nn.Module, prompt: str, prompt_ids: Sequence[int],
                answer_ids: Sequence[int], onset_frac: float, onset_rule: str,
                attribute_kwargs: dict[str, Any]) -> AnswerSpec:
    """What the result of one explained answer records beside its numbers."""
    n_prompt = len(prompt_ids)
    return AnswerSpec(prompt=prompt, input_ids=list(prompt_ids) + list(answer_ids),
                      prompt_length=n_prompt, token_ids=list(answer_ids),
                      positions=list(range(n_prompt - 1, n_prompt - 1 + len(answer_ids))),
                      method=attribute_kwargs.get("method", DEFAULT_METHOD),
                      n_steps=attribute_kwargs.get("n_steps", DEFAULT_N_STEPS),
                      onset_frac=onset_frac,
                      onset_rule=onset_rule, model_name=display_name(model))


def contrast_per_token(contrast: Any, n_tokens: int) -> list[int]:
    """One foil id per answer token, from one id (repeated) or ``n_tokens`` ids.

    Raises:
        TypeError: foils that are not integer ids.
        ValueError: a number of foils other than 1 or ``n_tokens``.
    """
    ids = target_ids(contrast)
    if len(ids) == 1:
        return ids * n_tokens
    if len(ids) != n_tokens:
        raise ValueError(f"contrast has {len(ids)} foil ids for {n_tokens} answer tokens: give "
                         "one foil (used for every token) or one per answer token.")
    return ids


def explain(
    model: nn.Module,
    tokenizer: Any,
    prompt: Union[str, Sequence[str]],
    max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS,
    layers: LayerSpec = None,
    onset_frac: float = DEFAULT_ONSET_FRAC,
    chat_template: bool = True,
    target: TargetText = None,
    onset_rule: str = DEFAULT_ONSET_RULE,
    template_kwargs: Optional[dict[str, Any]] = None,
    units: str = DEFAULT_UNITS,
    top_k: int = 0,
    contrast: TargetText = None,
    granularity: str = DEFAULT_GRANULARITY,
    heads: bool = False,
    effect: str = DEFAULT_EFFECT,
    layer_readout: Any = None,
    **attribute_kwargs: Any,
) -> Union[IGLensResult, list[IGLensResult]]:
    """Answer ``prompt`` greedily and attribute every answer token with IG-Lens.

    Applies the tokenizer's chat template when it has one (``chat_template=True``), generates
    with transformers' ``generate`` (plain greedy, KV cache, stops at the end token) while
    recording the residual stream of its own passes (:mod:`captum_iglens.text.recorded`), and
    explains every answer token from them: no second forward, and each token is the argmax
    of the pass that is attributed. With a ``target`` (or a tensor or reference-ids
    baseline) the answer is explained with one teacher-forced forward over prompt + answer
    (``use_cache=False``) instead. The result records the exact rendered prompt, whether the
    answer was truncated at ``max_new_tokens``, and per token whether it is the argmax of the
    explained forward (a warning names generated tokens that are not).

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
        onset_rule (str, optional): ``"sustained"`` (default) or ``"mass"``.
        template_kwargs (dict, optional): Chat-template variables, e.g.
            ``{"date_string": "26 Jul 2024"}`` for templates that write today's date.
        units (str, optional): ``"probability"`` (default) or ``"log-probability"`` (nats):
            the readout that is decomposed.
        top_k (int, optional): Record the logit lens's ``top_k`` tokens at every layer
            (``result.top_k_tokens``, JSON). Default: 0.
        contrast (str or sequence of int, optional): The foil of a contrastive explanation,
            "why this token rather than that one": the credits decompose
            ``p(token) - p(foil)`` (``units="log-probability"``: the log-ratio in nats). A
            string is tokenised like ``target`` and must give one token (the foil of every
            answer token) or one token per answer token; ids likewise. Default: None.
        granularity (str, optional): ``"block"`` (default) or ``"sublayer"``: every chosen
            block gets an attention credit and an MLP credit (columns ``L<l>.attn``,
            ``L<l>.mlp``) that add up to its block credit (see
            :class:`~captum_iglens.IGLens`). A sub-layer answer is generated first and then
            explained with one teacher-forced forward over prompt + answer.
        heads (bool, optional): With ``granularity="sublayer"``, per-head credits of every
            attention segment (``result.head_credits``, JSON ``"head_credits"``; Llama-like
            families). Default: False.
        effect (str, optional): ``"readout"`` (default, IG-Lens's readout credits),
            ``"total"`` (each block's exact share of the change of ``p(token)`` when every
            block's update at the token's position goes to its reference: ``baselines``
            ``"mean"``, ``"zero"`` or reference ids) or ``"atp"`` (attribution patching's
            first-order estimates, not a decomposition); see :class:`~captum_iglens.IGLens`.
            A total-effect answer is generated first and then explained with one
            teacher-forced forward.
        layer_readout (str or LayerReadout, optional): The per-layer readout, ``lens`` of
            :class:`~captum_iglens.IGLens` (``"logit"``, ``"tuned"``, ``"jacobian"`` or an
            object). Default: None (the logit lens).
        **attribute_kwargs: Attribution settings, passed to
            :meth:`~captum_iglens.IGLens.attribute` (Captum's LLM-attribution style):
            ``baselines``, ``method``, ``n_steps``, ``internal_batch_size``.

    Returns:
        IGLensResult (or a list of them, one per prompt, for several prompts).

    Raises:
        TypeError: a prompt that is not text (token ids or a tensor: use
            :meth:`IGLens.attribute` for those).
        ValueError: empty prompt or target, no prompts, the model generated no token, or
            the prompt plus ``max_new_tokens`` (or the target) beyond the model's context
            (the same rule as ``iglens run``:
            :func:`~captum_iglens.lens.context.check_context`).

    Examples::

        >>> result = explain(model, tokenizer, "The capital of France is", target=" Paris")
        >>> result.token_ids, result.attributions.shape     # ids of " Paris", [T, k]
        >>> results = explain(model, tokenizer, ["Name a prime.", "Name a colour."],
        ...                   method="gausslegendre", n_steps=64)
    """
    check_prompt_type(prompt)
    model = strip_parallel(model)
    lens = IGLens(model, layers=layers, units=units, granularity=granularity, heads=heads,
                  effect=effect, lens=layer_readout)
    settings = dict(max_new_tokens=max_new_tokens, onset_frac=onset_frac,
                    chat_template=chat_template, target=target, lens=lens, top_k=top_k,
                    onset_rule=onset_rule, template_kwargs=template_kwargs, contrast=contrast,
                    **attribute_kwargs)
    if isinstance(prompt, str):
        return _explain_one(model, tokenizer, prompt, **settings)
    prompts = list(prompt)
    if not prompts:
        raise ValueError("No prompts given.")
    return [_explain_one(model, tokenizer, p, **settings) for p in prompts]


def _answer_ids(
    model: nn.Module, tokenizer: Any, rendered: RenderedPrompt, target: TargetText,
    max_new_tokens: int,
) -> tuple[list[int], bool]:
    """The answer to explain and whether it was generated."""
    if target is None:
        return generate_answer(model, tokenizer, rendered.ids, max_new_tokens), True
    if isinstance(target, str):
        return target_token_ids(tokenizer, target), False
    return target_ids(target), False


def foil_ids(tokenizer: Any, contrast: TargetText) -> Optional[list[int]]:
    """The foil ids of ``contrast``: text tokenised like a target, or ids (None: none).

    Raises:
        ValueError: empty text, or text that tokenises to no token.
        TypeError: ids that are not integers.
    """
    if contrast is None:
        return None
    if isinstance(contrast, str):
        return target_token_ids(tokenizer, contrast)
    return target_ids(contrast)


def _explain_one(
    model: nn.Module, tokenizer: Any, prompt: str, max_new_tokens: int, onset_frac: float,
    chat_template: bool, target: TargetText, lens: IGLens, onset_rule: str,
    template_kwargs: Optional[dict[str, Any]], top_k: int, contrast: TargetText,
    **attribute_kwargs: Any,
) -> IGLensResult:
    rendered = render_prompt(tokenizer, prompt, chat_template, template_kwargs)
    foils = foil_ids(tokenizer, contrast)
    check_token_ids(torch.tensor([rendered.ids]), lens.spec.vocab_size)  # before generate
    if target is None:
        check_context(model, len(rendered.ids), max_new_tokens, generated=True)
    baselines = attribute_kwargs.get("baselines", DEFAULT_BASELINE)
    if target is None and can_record(baselines, model) and lens.spec.recordable:
        # the generation's own passes are recorded: no second, teacher-forced forward
        recording = generate_recording(lens, tokenizer, [rendered.ids], max_new_tokens,
                                       baselines)
        answer = recording.answers[0]
        job = AnswerJob(prompt, rendered, answer, generated=True,
                        foils=None if foils is None else contrast_per_token(foils, len(answer)))
        result = explain_recorded(lens, tokenizer, recording, [job], onset_frac, onset_rule,
                                  top_k, **attribute_kwargs)[0]
        annotate_answer(result, model, tokenizer, rendered, True, max_new_tokens)
        return result
    answer_ids, generated = _answer_ids(model, tokenizer, rendered, target, max_new_tokens)
    result = explain_ids(model, rendered.ids, answer_ids, tokenizer=tokenizer,
                         onset_frac=onset_frac, prompt=prompt, lens=lens,
                         onset_rule=onset_rule, top_k=top_k, contrast=foils,
                         **attribute_kwargs)
    annotate_answer(result, model, tokenizer, rendered, generated, max_new_tokens)
    return result


def annotate_answer(result: IGLensResult, model: nn.Module, tokenizer: Any,
                    rendered: RenderedPrompt, generated: bool, max_new_tokens: int) -> None:
    """Record how the prompt was rendered and the answer obtained, in place.

    A generated answer gets ``max_new_tokens``, ``truncated`` (stopped at the limit before an
    end token) and a warning naming tokens that are not the argmax of the explained forward.
    """
    result.chat_template_used = rendered.chat_template_used
    result.rendered_prompt = rendered.text
    result.template_uses_clock = rendered.uses_clock
    result.generated = generated
    if generated:
        answer_ids = result.input_ids[result.prompt_length:]  # all of it, reported or not
        result.max_new_tokens = max_new_tokens
        result.truncated = (len(answer_ids) >= max_new_tokens
                            and answer_ids[-1] not in end_ids(model, tokenizer))
        _warn_not_argmax(result)


def _warn_not_argmax(result: IGLensResult) -> None:
    wrong = [t for t, ok in enumerate(result.is_argmax) if not ok]
    if wrong:
        warnings.warn(
            f"{len(wrong)} of {len(result.tokens)} generated tokens (positions in the answer "
            f"{wrong[:8]}) are not the argmax of the forward that is attributed "
            "(generation with a KV cache and the full forward differ here, e.g. by a near tie "
            "or a kernel difference); they are marked '*' in the table and is_argmax=false in "
            "the JSON.",
            stacklevel=4,
        )
