"""Sub-layer gates: the attention and the MLP update of a block gated separately at ``i``.

For sequential blocks (the MLP branch reads the half-way residual ``L.attn``, read at the
input of the family's submodule, :mod:`captum_iglens.lens.sublayer`)::

    L.attn[i] = h_{L-1}[i] + r_a + g_a (a_L[i] - r_a)        a_L: the attention update
    h_L[i]    = L.attn[i] + r_m + g_m (m_L[i] - r_m)         m_L: the MLP update of the gated L.attn

A pre-hook on the submodule changes its input (the MLP then reads the gated ``L.attn``); the
block adds its MLP output to its own copy of the ungated ``L.attn``, so the block's hook adds
the change back before gating the MLP update. Parallel blocks (attention and MLP reading the
same input) have no such residual and are refused.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Callable, Iterator, Protocol, Sequence

import torch
from torch import Tensor, nn

from captum_iglens.lens.hooks import held_hooks, hidden_of
from captum_iglens.lens.sublayer import HalfBlockSite

__all__ = ["sublayer_gate_hooks", "with_hidden"]


def with_hidden(output: object, hidden: Tensor) -> object:
    """A decoder block's ``output`` with its residual stream replaced by ``hidden``."""
    if isinstance(output, Tensor):
        return hidden
    if isinstance(output, tuple):
        return type(output)((hidden, *output[1:]))
    raise TypeError(f"Cannot replace the residual stream of a block output of type "
                    f"{type(output)}")


def _last(hidden: Tensor) -> Tensor:
    """``[R, d]`` the last position of ``[R, s, d]`` (or the rows of a flattened ``[R, d]``)."""
    return hidden[:, -1] if hidden.dim() == 3 else hidden


def _with_last(hidden: Tensor, last: Tensor) -> Tensor:
    if hidden.dim() == 3:
        return torch.cat([hidden[:, :-1], last[:, None]], dim=1)
    return last


class _Gates(Protocol):
    """What the hooks read of a :class:`~captum_iglens._core.gates.GateRows`."""

    gates: Tensor
    references: Tensor


@contextmanager
def sublayer_gate_hooks(blocks: nn.ModuleList, layers: Sequence[int], site: HalfBlockSite,
                        rows: _Gates) -> Iterator[None]:
    """Hooks gating each chosen block's attention and MLP updates at the last position.

    Block ``layers[j]``'s attention update gets ``rows.gates[:, 2j]`` and reference
    ``rows.references[:, 2j]``, its MLP update ``[:, 2j + 1]`` (a
    :class:`~captum_iglens._core.gates.GateRows`). Hooks are removed on exit.
    """
    inputs: dict[int, Tensor] = {}
    moved: dict[int, tuple[Tensor, Tensor]] = {}

    def block_in(layer: int) -> Callable[..., None]:
        def hook(_m: nn.Module, args: tuple, kwargs: dict) -> None:
            inputs[layer] = args[0] if args else kwargs["hidden_states"]
        return hook

    def half(j: int, layer: int) -> Callable[..., tuple]:
        def hook(_m: nn.Module, args: tuple, kwargs: dict) -> tuple:
            mid = args[0] if args else kwargs["hidden_states"]
            before = inputs[layer][:, -1].to(mid)
            ref, gate = rows.references[:, 2 * j].to(mid), rows.gates[:, 2 * j, None].to(mid)
            old = _last(mid)
            new = before + ref + gate * (old - before - ref)
            moved[layer] = (new, new - old)
            mid = _with_last(mid, new)
            return ((mid, *args[1:]), kwargs) if args else (args, {**kwargs,
                                                                  "hidden_states": mid})
        return hook

    def block_out(j: int, layer: int) -> Callable[..., object]:
        def hook(_m: nn.Module, _a: tuple, output: object) -> object:
            hidden = hidden_of(output)
            new_mid, shift = moved.pop(layer)
            out = hidden[:, -1] + shift.to(hidden)
            ref = rows.references[:, 2 * j + 1].to(hidden)
            gate = rows.gates[:, 2 * j + 1, None].to(hidden)
            last = new_mid.to(hidden) + ref + gate * (out - new_mid.to(hidden) - ref)
            return with_hidden(output, torch.cat([hidden[:, :-1], last[:, None]], dim=1))
        return hook

    with held_hooks() as hooks:
        for j, layer in enumerate(layers):
            block = blocks[layer - 1]
            hooks.pre(block, block_in(layer), with_kwargs=True)
            hooks.pre(getattr(block, site.module), half(j, layer), with_kwargs=True)
            hooks.forward(block, block_out(j, layer))
        yield
