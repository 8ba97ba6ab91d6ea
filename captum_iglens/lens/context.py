"""How long a sequence the model takes, checked before a prompt is explained.

The position limit and the context (dynamic RoPE's stretch included).
"""

from __future__ import annotations

from typing import Optional

from torch import nn

from captum_iglens.lens.architectures import (
    CONTEXT_ATTRIBUTES,
    UnknownArchitectureError,
    _get_path,
    resolve_layout,
    unwrap_model,
)
from captum_iglens.lens.families import (
    POSITION_TABLES,
)

__all__ = ["check_context", "context_length", "max_sequence_length"]


def max_sequence_length(model: nn.Module) -> Optional[int]:
    """The longest token sequence the model can position, or ``None`` for no fixed limit.

    A learned absolute position table next to the decoder blocks (GPT-2's and GPT-Neo's
    ``wpe``, OPT's ``embed_positions`` less its offset of 2, GPT-BigCode's ``wpe``) and the
    fixed-size tables a row names (GPT-J's sinusoids, MPT's ALiBi) set the limit; rotary and
    on-the-fly ALiBi families have none. Models whose layout is unknown give ``None``.
    """
    inner = unwrap_model(model)
    try:
        layout = resolve_layout(inner)
    except UnknownArchitectureError:
        return None
    parent_path = layout.blocks.rpartition(".")[0]
    parent = _get_path(inner, parent_path) if parent_path else inner
    limits = []
    for name in POSITION_TABLES:
        table = _get_path(parent, name) if isinstance(parent, nn.Module) else None
        if isinstance(table, nn.Embedding):
            limits.append(table.num_embeddings - int(getattr(table, "offset", 0) or 0))
    value = _get_path(inner, f"config.{layout.max_length}") if layout.max_length else None
    if isinstance(value, int) and not isinstance(value, bool):
        limits.append(value)
    return min(limits) if limits else None


def context_length(model: nn.Module) -> Optional[int]:
    """The longest sequence the model is meant for, or ``None`` when nothing says.

    Its position table (:func:`max_sequence_length`), else its config's trained context
    (``max_position_embeddings`` and alike; times ``factor`` for dynamic NTK RoPE, which is
    configured to rescale up to that length). Rotary models run past their trained context,
    but their numbers there are extrapolation and their attention memory grows with the
    square of the length: dataset runs refuse such records instead of spending hours on them.
    """
    fixed = max_sequence_length(model)
    if fixed is not None:
        return fixed
    config = getattr(unwrap_model(model), "config", None)
    config = getattr(config, "text_config", None) or config
    for name in CONTEXT_ATTRIBUTES:
        value = getattr(config, name, None)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value * _dynamic_rope_factor(config)
    return None


def _dynamic_rope_factor(config: object) -> int:
    """How far dynamic NTK RoPE is configured to extend the trained context (1: not at all).

    A ``"dynamic"`` rope type rescales its frequencies for sequences up to ``factor`` times
    ``max_position_embeddings``: the length it is configured for. Other scalings (``llama3``,
    ``yarn``, ``longrope``) already state their extended length in the config.
    """
    params = getattr(config, "rope_parameters", None) or getattr(config, "rope_scaling", None)
    if not isinstance(params, dict) or "dynamic" not in str(params.get("rope_type", "")):
        return 1
    factor = params.get("factor", 1)
    return max(1, int(factor)) if isinstance(factor, (int, float)) else 1


def check_context(model: nn.Module, n_prompt: int, n_answer: int, *, generated: bool) -> None:
    """Refuse a prompt and answer that do not fit the model's trained context.

    The one context rule of every text entry point (``explain``, ``explain_ids``,
    ``iglens run``): the prompt plus the answer (for a generated answer, plus
    ``max_new_tokens``, the most it can grow to) must fit :func:`context_length`.
    Beyond it a rotary model still runs, but its numbers are extrapolation.

    Args:
        model (nn.Module): The causal LM.
        n_prompt (int): Prompt tokens (chat template included).
        n_answer (int): Answer tokens, or ``max_new_tokens`` when ``generated``.
        generated (bool): Whether ``n_answer`` is a generation budget.

    Raises:
        ValueError: naming both lengths, the context and what to shorten.
    """
    limit = context_length(model)
    needed = n_prompt + n_answer
    if limit is None or needed <= limit:
        return
    what = f"max_new_tokens={n_answer}" if generated else f"the {n_answer}-token answer"
    shorten = "lower max_new_tokens" if generated else "shorten the answer"
    raise ValueError(f"The prompt is {n_prompt} tokens; with {what} that is {needed} tokens, "
                     f"but this model's context is {limit} tokens: shorten the prompt or "
                     f"{shorten}.")
