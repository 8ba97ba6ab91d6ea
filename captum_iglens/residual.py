"""Capture of the residual stream with forward hooks on the decoder blocks.

``h_0`` is the input of the first decoder block (the embedding output after any
model-specific scaling or position embedding), ``h_l`` the output of block ``l``;
``h_n`` is the residual *before* the final norm. ``outputs.hidden_states[-1]`` is not used:
in transformers 5 it is already normalised for most families (DESIGN.md section 3, item 1).
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Iterable, Iterator, Optional

import torch
from torch import Tensor, nn

__all__ = ["capture_residual_stream", "execution_device", "model_state_preserved"]


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


def _hidden_from_output(output: object) -> Tensor:
    if isinstance(output, Tensor):
        return output
    if isinstance(output, (tuple, list)) and output and isinstance(output[0], Tensor):
        return output[0]
    hidden = getattr(output, "hidden_states", None)
    if isinstance(hidden, Tensor):
        return hidden
    raise TypeError(f"Cannot read the residual stream from a block output of type {type(output)}")


@contextmanager
def capture_residual_stream(
    blocks: nn.ModuleList,
    layer_indices: Iterable[int],
    device: Optional[torch.device] = None,
    finite: Optional[dict[int, Tensor]] = None,
    mask: Optional[Tensor] = None,
) -> Iterator[dict[int, Tensor]]:
    """Record the residual stream ``h_l`` for the requested hidden-state indices.

    Args:
        blocks (nn.ModuleList): The ``n`` decoder blocks of the model.
        layer_indices (iterable of int): Hidden-state indices in ``0..n`` to record
            (0 = input of the first block, ``l`` = output of block ``l``).
        device (torch.device, optional): Where to move each captured tensor (the readout's
            device, for models dispatched over several devices).
        finite (dict, optional): If given, filled for *every* index ``0..n`` with a 0-dim
            bool tensor on the block's device: whether ``h_l`` is free of NaN and inf (at the
            positions where ``mask`` is nonzero). No host synchronisation is forced, so the
            first non-finite block can be named after the forward pass.
        mask (Tensor, optional): ``[B, S]`` attention mask for the ``finite`` check.

    Yields:
        dict[int, Tensor]: filled during the forward pass with ``h_l`` of shape
        ``[B, S, d]`` (detached, the model's dtype). Hooks are removed on exit, also when an
        error is raised.
    """
    wanted = set(layer_indices)
    store: dict[int, Tensor] = {}
    masks: dict[torch.device, Tensor] = {}

    def keep(index: int, hidden: Tensor) -> None:
        hidden = hidden.detach()
        if finite is not None:
            valid = hidden
            if mask is not None and tuple(mask.shape) == tuple(hidden.shape[:2]):
                if hidden.device not in masks:
                    masks[hidden.device] = mask.to(hidden.device).bool()
                valid = hidden[masks[hidden.device]]
            finite[index] = torch.isfinite(valid).all()
        if index in wanted:
            store[index] = hidden.to(device) if device is not None else hidden

    indices = range(len(blocks) + 1) if finite is not None else sorted(wanted)
    handles = []
    try:
        for index in indices:
            if index == 0:

                def pre_hook(_m: nn.Module, args: tuple, kwargs: dict) -> None:
                    keep(0, args[0] if args else kwargs["hidden_states"])

                handles.append(blocks[0].register_forward_pre_hook(pre_hook, with_kwargs=True))
            else:

                def hook(_m: nn.Module, _a: tuple, output: object, _i: int = index) -> None:
                    keep(_i, _hidden_from_output(output))

                handles.append(blocks[index - 1].register_forward_hook(hook))
        yield store
    finally:
        for handle in handles:
            handle.remove()


@contextmanager
def model_state_preserved(model: nn.Module) -> Iterator[nn.Module]:
    """Run ``model`` in eval mode and hand it back in the train/eval mode it had.

    Dropout must never change an attribution (DESIGN.md section 3, item 4). The
    ``training`` flag of every submodule is restored, so a user's mix of modes survives.
    """
    modes = [(module, module.training) for module in model.modules()]
    model.eval()
    try:
        yield model
    finally:
        for module, mode in modes:
            module.training = mode
