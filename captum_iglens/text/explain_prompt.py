"""Prompt -> chat template -> greedy answer -> IG-Lens over every answer token."""

from __future__ import annotations

import warnings
from dataclasses import replace
from typing import Any, Optional, Sequence, Union

import torch
from torch import nn

from captum_iglens._core.entry import Forward, attribute
from captum_iglens._core.inputs import check_token_ids
from captum_iglens._core.total_effect import check_gate_options
from captum_iglens._utils.typing import BaselineSpec, LayerSpec
from captum_iglens.ig_lens import IGLens
from captum_iglens.lens.architectures import display_name, strip_parallel
from captum_iglens.lens.context import check_context
from captum_iglens.lens.state import input_device
from captum_iglens.results import IGLensResult
from captum_iglens.settings import (
    DEFAULT_ONSET_FRAC,
    DEFAULT_ONSET_RULE,
    AttributionSettings,
    GenerationSettings,
    ReportSettings,
    report_settings,
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
    *,
    baselines: Optional[BaselineSpec] = None,
    method: Optional[str] = None,
    n_steps: Optional[int] = None,
    internal_batch_size: Optional[int] = None,
    settings: Optional[AttributionSettings] = None,
    report: Optional[ReportSettings] = None,
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
        top_k (int, optional): Record the levels' readout's ``top_k`` tokens per layer.
            Default: 0.
        contrast (int or sequence of int, optional): Foil token ids, one for every answer
            token or one per answer token: the credits then decompose
            ``p(token) - p(foil)`` (log units: ``log p(token) - log p(foil)``, nats).
            Default: None.
        baselines (str or Tensor, optional): Keyword-only, as for
            :meth:`~captum_iglens.IGLens.attribute`. Default: ``"mean"``.
        method (str, optional): Keyword-only: the estimator. Default: ``"prediction_aware"``.
        n_steps (int, optional): Keyword-only: its steps per segment. Default: 50.
        internal_batch_size (int, optional): Keyword-only: readout rows per chunk.
        settings (AttributionSettings, optional): Keyword-only: the attribution settings
            in one object (its ``method``, ``n_steps``, ``baselines`` and
            ``internal_batch_size``; the lens's own units, granularity and effect decide).
            Each of the four above given replaces its field.
        report (ReportSettings, optional): Keyword-only: ``onset_frac``, ``onset_rule`` and
            ``top_k`` in one object (:class:`~captum_iglens.settings.ReportSettings`),
            instead of those arguments (given both, ``ValueError``).

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
    foils = None if contrast is None else torch.tensor(
        [contrast_per_token(contrast, len(answer_ids))], device=device)
    chosen = (settings or AttributionSettings()).updated(
        baselines=baselines, method=method, n_steps=n_steps,
        internal_batch_size=internal_batch_size)
    shown = report_settings(report, onset_frac=onset_frac, onset_rule=onset_rule, top_k=top_k)
    out, _ = attribute(lens.spec, Forward(ids, target=target, positions=positions,
                                          contrast=foils), settings=chosen, top_k=shown.top_k)
    spec = answer_spec(model, prompt, prompt_ids, answer_ids, shown)
    return result_from_output(out, 0, range(len(answer_ids)), spec, tokenizer, chosen)


def answer_spec(model: nn.Module, prompt: str, prompt_ids: Sequence[int],
                answer_ids: Sequence[int], report: ReportSettings) -> AnswerSpec:
    """What the result of one explained answer records beside its numbers."""
    n_prompt = len(prompt_ids)
    return AnswerSpec(prompt=prompt, input_ids=list(prompt_ids) + list(answer_ids),
                      prompt_length=n_prompt, token_ids=list(answer_ids),
                      positions=list(range(n_prompt - 1, n_prompt - 1 + len(answer_ids))),
                      onset_frac=report.onset_frac, onset_rule=report.onset_rule,
                      model_name=display_name(model))


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
    units: Optional[str] = None,
    top_k: int = 0,
    contrast: TargetText = None,
    granularity: Optional[str] = None,
    heads: Optional[bool] = None,
    effect: Optional[str] = None,
    layer_readout: Any = None,
    *,
    baselines: Optional[BaselineSpec] = None,
    method: Optional[str] = None,
    n_steps: Optional[int] = None,
    internal_batch_size: Optional[int] = None,
    scope: Optional[str] = None,
    grad_drop: Optional[bool] = None,
    settings: Optional[AttributionSettings] = None,
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
        top_k (int, optional): Record the levels' readout's ``top_k`` tokens at every layer
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
        layer_readout (str or LayerReadout, optional): ``lens`` of :class:`~captum_iglens.IGLens`
            (``"logit"``, ``"tuned"``, ``"jacobian"`` or an object). Default: the logit lens.
        baselines (str or Tensor, optional): Keyword-only, as for
            :meth:`~captum_iglens.IGLens.attribute`. Default: ``"mean"``.
        method (str, optional): Keyword-only: the estimator. Default: ``"prediction_aware"``.
        n_steps (int, optional): Keyword-only: its steps per segment. Default: 50.
        internal_batch_size (int, optional): Keyword-only: readout rows per chunk.
        scope (str, optional): Keyword-only, with ``effect="total"`` or ``"atp"``:
            ``"position"`` (default: gates at the token's position) or ``"sequence"`` (every
            position up to it; see :class:`~captum_iglens.settings.AttributionSettings`).
        grad_drop (bool, optional): Keyword-only, with ``effect="atp"``: AtP*'s GradDrop
            (``method`` recorded as ``"atp*"``). Default: False.
        settings (AttributionSettings, optional): Keyword-only: all of them in one object;
            each argument above that is given (``units`` to ``effect`` too) replaces its field.

    Returns:
        IGLensResult (or a list of them, one per prompt, for several prompts).

    Raises:
        TypeError: a prompt that is not text (token ids or a tensor: use
            :meth:`IGLens.attribute` for those).
        ValueError: empty prompt or target, no prompts, the model generated no token, the
            prompt plus ``max_new_tokens`` (or the target) beyond the model's context (as
            ``iglens run``: :func:`~captum_iglens.lens.context.check_context`); a ``scope``,
            ``grad_drop``, ``method`` or ``n_steps`` the lens refuses or ignores (AtP takes
            no steps: :func:`~captum_iglens._core.total_effect.check_gate_options`).

    Examples::

        >>> result = explain(model, tokenizer, "The capital of France is", target=" Paris")
        >>> result.token_ids, result.attributions.shape     # ids of " Paris", [T, k]
        >>> results = explain(model, tokenizer, ["A prime?", "A colour?"], method="gausslegendre")
    """
    check_prompt_type(prompt)
    model = strip_parallel(model)
    chosen = (settings or AttributionSettings()).updated(
        baselines=baselines, method=method, n_steps=n_steps,
        internal_batch_size=internal_batch_size, units=units, granularity=granularity,
        heads=heads, effect=effect, scope=scope, grad_drop=grad_drop)
    lens = IGLens(model, layers=layers, lens=layer_readout, **chosen.lens_options())
    check_gate_options(lens.spec, chosen.scope, chosen.grad_drop,  # before generating
                       chosen.method, chosen.n_steps)
    report = ReportSettings(onset_frac, onset_rule, top_k)
    generation = GenerationSettings(max_new_tokens, chat_template, template_kwargs)

    def one(text: str) -> IGLensResult:
        return _explain_one(model, tokenizer, text, lens=lens, settings=chosen, report=report,
                            generation=generation, target=target, contrast=contrast)

    if isinstance(prompt, str):
        return one(prompt)
    prompts = list(prompt)
    if not prompts:
        raise ValueError("No prompts given.")
    return [one(p) for p in prompts]


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
    model: nn.Module, tokenizer: Any, prompt: str, *, lens: IGLens,
    settings: AttributionSettings, report: ReportSettings, generation: GenerationSettings,
    target: TargetText, contrast: TargetText,
) -> IGLensResult:
    max_new_tokens = generation.max_new_tokens
    rendered = render_prompt(tokenizer, prompt, generation.chat_template,
                             generation.template_kwargs)
    foils = foil_ids(tokenizer, contrast)
    check_token_ids(torch.tensor([rendered.ids]), lens.spec.vocab_size)  # before generate
    if target is None:
        check_context(model, len(rendered.ids), max_new_tokens, generated=True)
    baselines = settings.baselines
    if target is None and can_record(baselines, model) and lens.spec.recordable:
        # the generation's own passes are recorded: no second, teacher-forced forward
        recording = generate_recording(lens, tokenizer, [rendered.ids], max_new_tokens,
                                       baselines)
        answer = recording.answers[0]
        job = AnswerJob(prompt, rendered, answer, generated=True,
                        foils=None if foils is None else contrast_per_token(foils, len(answer)))
        result = explain_recorded(lens, tokenizer, recording, [job], settings=settings,
                                  report=report)[0]
        return annotate_answer(result, model, tokenizer, rendered, True, max_new_tokens)
    answer_ids, generated = _answer_ids(model, tokenizer, rendered, target, max_new_tokens)
    result = explain_ids(model, rendered.ids, answer_ids, tokenizer=tokenizer, prompt=prompt,
                         lens=lens, contrast=foils, settings=settings, report=report)
    return annotate_answer(result, model, tokenizer, rendered, generated, max_new_tokens)


def annotate_answer(result: IGLensResult, model: nn.Module, tokenizer: Any,
                    rendered: RenderedPrompt, generated: bool,
                    max_new_tokens: int) -> IGLensResult:
    """``result`` with how the prompt was rendered and the answer obtained: a new result.

    A generated answer gets ``max_new_tokens``, ``truncated`` (stopped at the limit before an
    end token) and a warning naming tokens that are not the argmax of the explained forward.
    ``result`` itself is not changed.
    """
    answer_ids = result.input_ids[result.prompt_length:]  # all of it, reported or not
    done = replace(
        result, chat_template_used=rendered.chat_template_used,
        rendered_prompt=rendered.text, template_uses_clock=rendered.uses_clock,
        generated=generated,
        max_new_tokens=max_new_tokens if generated else result.max_new_tokens,
        truncated=(len(answer_ids) >= max_new_tokens
                   and answer_ids[-1] not in end_ids(model, tokenizer)) if generated
        else result.truncated)
    if generated:
        _warn_not_argmax(done)
    return done


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
