"""Forward hooks, KV-cache copies and target probabilities for the block ablation.

``h_0`` is the input of the first decoder block, ``h_l`` the output of block ``l`` (the
residual stream before the final norm); a block's residual update is ``h_l - h_{l-1}``.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Callable, Iterator, Optional

import torch
from torch import Tensor, nn

from captum_iglens.lens.distribution import wide_log_softmax
from captum_iglens.lens.hooks import held_hooks, hidden_of
from captum_iglens.lens.kv_cache import cache_tensors, make_cache
from captum_iglens.lens.state import model_state_preserved

__all__ = ["cache_tensors", "eval_mode", "hooked", "make_cache", "target_probs"]


def _with_hidden(output: object, hidden: Tensor) -> object:
    """``output`` with its residual stream replaced by ``hidden``, same structure."""
    if isinstance(output, Tensor):
        return hidden
    return type(output)((hidden, *output[1:]))  # type: ignore[index, call-arg]  # a tuple


@contextmanager
def eval_mode(model: nn.Module) -> Iterator[None]:
    """Run ``model`` without gradients in the state every attribution runs it in.

    :func:`~captum_iglens.lens.state.model_state_preserved`: eval mode, dynamic RoPE at its
    trained-context frequencies, under the model's lock; every submodule's train/eval flag
    and the RoPE state are restored on exit. Dropout, or a grown RoPE left by an earlier
    call, must never change an ablation.
    """
    with model_state_preserved(model), torch.no_grad():
        yield


def _with_input(args: tuple, kwargs: dict, hidden: Tensor) -> tuple[tuple, dict]:
    """A block's ``(args, kwargs)`` with its input residual stream replaced by ``hidden``."""
    if args:
        return (hidden, *args[1:]), kwargs
    return args, {**kwargs, "hidden_states": hidden}


@contextmanager
def hooked(blocks: nn.ModuleList, plan: dict[int, tuple[Tensor, Tensor]], pos: int,
            record: Optional[dict[int, Tensor]] = None) -> Iterator[None]:
    """Forward hooks on every block that ablate its update at one position.

    Args:
        blocks (nn.ModuleList): The ``n`` decoder blocks.
        plan (dict): block ``l`` (1-based) -> ``(rows [R] int64, repl [R, d])``: rows ``rows``
            get ``h_l[rows, pos] := h_{l-1}[rows, pos] + repl`` (``repl = 0`` removes the
            update), and the later blocks run on the changed stream.
        pos (int): The sequence position (``-1`` for a single-token forward).
        record (dict, optional): Filled with every ``h_l`` ``[B, S, d]``, ``l = 0..n``.

    Hooks are removed on exit, also when an error is raised.
    """
    inputs: dict[int, Tensor] = {}

    def pre(layer: int) -> Callable[..., None]:
        def hook(_m: nn.Module, args: tuple, kwargs: dict) -> None:
            inputs[layer] = args[0] if args else kwargs["hidden_states"]
            if record is not None and layer == 1:
                record[0] = inputs[layer].detach()
        return hook

    def post(layer: int) -> Callable[..., object]:
        def hook(_m: nn.Module, _a: tuple, output: object) -> object:
            hidden = hidden_of(output)
            if layer in plan:
                rows, repl = plan[layer]
                hidden = hidden.clone()
                hidden[rows, pos] = inputs[layer][rows, pos] + repl
            if record is not None:
                record[layer] = hidden.detach()
            return _with_hidden(output, hidden)
        return hook

    with held_hooks() as hooks:
        for layer, block in enumerate(blocks, start=1):
            hooks.pre(block, pre(layer))
            hooks.forward(block, post(layer))
        yield


def target_probs(logits: Tensor, target: Tensor) -> Tensor:
    """``softmax(logits)[target]`` for ``logits [R, V]`` and ``target [R]`` or a 0-dim id.

    Returns:
        Tensor: ``[R]`` probabilities, float32 (float64 for a float64 model).
    """
    log_probs = wide_log_softmax(logits)
    index = target.to(log_probs.device).reshape(-1, 1).expand(log_probs.shape[0], 1)
    return log_probs.gather(-1, index)[:, 0].exp()
