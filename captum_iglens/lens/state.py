"""Where a model computes and what state it carries between calls.

Devices (accelerate offload included), dtype, the forward signature, train/eval modes and
stateful buffers: every forward of this package runs the model in eval mode from its
pristine state and hands it back as it was (:func:`model_state_preserved`).

Stateful buffers: model parts that change with call history are put back per call.

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

import inspect
import threading
import weakref
from contextlib import contextmanager
from typing import Any, Iterator, Mapping, Optional

import torch
from torch import nn

from captum_iglens.lens.architectures import input_embeddings, unwrap_model

__all__ = [
    "dynamic_rope_prefixes",
    "execution_device",
    "forward_parameters",
    "input_device",
    "model_dtype",
    "model_lock",
    "model_state_preserved",
    "pristine_rope",
]

_FIELDS = ("inv_freq", "max_seq_len_cached", "attention_scaling")


def execution_device(module: nn.Module) -> Optional[torch.device]:
    """The device on which ``module`` computes.

    For a module dispatched with accelerate (``device_map``, ``cpu_offload``,
    ``disk_offload``) the parameters may live on the ``meta`` device while an
    ``AlignDevicesHook`` moves them to its ``execution_device`` for each call: that device
    is returned. Otherwise the device of the first parameter or buffer not on ``meta``;
    ``None`` when there is none (a module without tensors).
    """
    for sub in module.modules():
        hook = getattr(sub, "_hf_hook", None)
        hooks = getattr(hook, "hooks", None) or ([hook] if hook is not None else [])
        for one in hooks:
            dev = getattr(one, "execution_device", None)
            if dev is not None:
                return torch.device(dev) if not isinstance(dev, int) else torch.device("cuda", dev)
    for tensor in (*module.parameters(), *module.buffers()):
        if tensor.device.type != "meta":
            return tensor.device
    return None


def input_device(model: nn.Module) -> torch.device:
    """Where token ids go: the input embedding's execution device (CPU when unknown)."""
    emb = input_embeddings(model)
    dev = execution_device(emb) if emb is not None else None
    if dev is None:
        dev = execution_device(model)
    return dev if dev is not None else torch.device("cpu")


def model_dtype(model: nn.Module) -> torch.dtype:
    """The dtype of the model's first floating-point parameter (float32 if none)."""
    for param in model.parameters():
        if param.is_floating_point():
            return param.dtype
    return torch.float32


_LOCKS: weakref.WeakKeyDictionary[nn.Module, threading.RLock] = weakref.WeakKeyDictionary()
_LOCKS_GUARD = threading.Lock()


def model_lock(model: nn.Module) -> threading.RLock:
    """The re-entrant lock under which this package runs ``model``'s forward passes.

    One per model object, created on first use and dropped with the model.
    """
    with _LOCKS_GUARD:
        lock = _LOCKS.get(model)
        if lock is None:
            lock = _LOCKS[model] = threading.RLock()
        return lock


@contextmanager
def model_state_preserved(model: nn.Module) -> Iterator[nn.Module]:
    """Run ``model`` in eval mode, stateful parts pristine, and hand it back as it was.

    Dropout must never change an attribution, nor must an earlier call's state (dynamic
    RoPE's grown frequencies, see :func:`pristine_rope`). The
    ``training`` flag of every submodule and those states are restored, so a user's mix of
    modes survives.

    The modes and states are the model's, shared by every thread: the block is held under
    :func:`model_lock`, so two threads explaining with one model run their forward passes
    one after the other (the second waits, for as long as the first one's forward pass
    takes; the readouts and estimators after it run concurrently). The same thread may
    nest the block.
    """
    with model_lock(model):
        modes = [(module, module.training) for module in model.modules()]
        model.eval()
        try:
            with pristine_rope(model):
                yield model
        finally:
            for module, mode in modes:
                module.training = mode


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


def forward_parameters(model: nn.Module) -> Mapping[str, inspect.Parameter]:
    """The parameters of the model's ``forward``, read through compile and adapter wrappers.

    ``torch.compile(model)`` and PEFT adapters expose ``forward(*args, **kwargs)``; the inner
    model's signature (:func:`~captum_iglens.lens.architectures.unwrap_model`) says which keyword
    arguments (``position_ids``, ``use_cache``, ``logits_to_keep``) the call may pass.
    """
    return inspect.signature(unwrap_model(model).forward).parameters
