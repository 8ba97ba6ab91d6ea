"""Model parts that change with call history, put back to their pristine state per call.

Dynamic NTK RoPE (``rope_type`` ``"dynamic"``, transformers' ``dynamic_rope_update``) grows
its ``inv_freq`` buffer for the longest sequence it has seen and keeps it until a call
shorter than the trained context resets it: a call between the two lengths then runs with
the frequencies an earlier, longer call left behind (transformers issue #25306), and the
same explanation gives other numbers depending on what ran before it. Every forward and
generation of this package therefore starts from the pristine frequencies
(``original_inv_freq``, ``max_seq_len_cached = original_max_seq_len``) and hands the model
back with the state it had.

The other history-dependent kinds in transformers 5 are covered elsewhere: ``longrope``
picks its frequencies from the current length on every call (no history); key/value and
recurrent caches are never passed between calls (``use_cache=False``, or one fresh cache per
``generate``); RecurrentGemma's one-token generation pass continues module state and is
never recorded (teacher forcing instead).
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Any, Iterator

from torch import nn

__all__ = ["dynamic_rope_prefixes", "pristine_rope"]

_FIELDS = ("inv_freq", "max_seq_len_cached", "attention_scaling")


def dynamic_rope_prefixes(module: nn.Module) -> list[str]:
    """The attribute prefixes of ``module``'s dynamic RoPE states (``""`` or ``"<layer type>_"``).

    Empty for modules that are not rotary embeddings with a dynamic ``rope_type``.
    """
    rope_type = getattr(module, "rope_type", None)
    if isinstance(rope_type, str):
        return [""] if "dynamic" in rope_type and hasattr(module, "original_inv_freq") else []
    if isinstance(rope_type, dict):
        return [f"{kind}_" for kind, name in rope_type.items()
                if isinstance(name, str) and "dynamic" in name
                and hasattr(module, f"{kind}_original_inv_freq")]
    return []


def _snapshot(module: nn.Module, prefix: str) -> dict[str, Any]:
    return {name: getattr(module, f"{prefix}{name}", None) for name in _FIELDS}


def _restore(module: nn.Module, prefix: str, state: dict[str, Any]) -> None:
    for name, value in state.items():
        if value is None:
            continue
        if name == "inv_freq":
            module.register_buffer(f"{prefix}inv_freq", value, persistent=False)
        else:
            setattr(module, f"{prefix}{name}", value)


def _reset(module: nn.Module, prefix: str) -> None:
    current = getattr(module, f"{prefix}inv_freq")
    original = getattr(module, f"{prefix}original_inv_freq")
    module.register_buffer(f"{prefix}inv_freq", original.to(current.device).clone(),
                           persistent=False)
    setattr(module, f"{prefix}max_seq_len_cached", module.original_max_seq_len)


@contextmanager
def pristine_rope(model: nn.Module) -> Iterator[nn.Module]:
    """Run ``model`` with every dynamic RoPE at its trained-context frequencies.

    On entry each dynamic rotary embedding gets its ``original_inv_freq`` back (and
    ``max_seq_len_cached`` its original length), so the call's numbers do not depend on the
    calls before it; on exit the state the model had is restored, so a user's model is
    left as it was found. Models without dynamic RoPE are untouched.

    Args:
        model (nn.Module): Any model (wrappers included: every submodule is visited).

    Yields:
        nn.Module: ``model``.
    """
    found = [(module, prefix) for module in model.modules()
             for prefix in dynamic_rope_prefixes(module)]
    saved = [(module, prefix, _snapshot(module, prefix)) for module, prefix in found]
    for module, prefix in found:
        _reset(module, prefix)
    try:
        yield model
    finally:
        for module, prefix, state in saved:
            _restore(module, prefix, state)
