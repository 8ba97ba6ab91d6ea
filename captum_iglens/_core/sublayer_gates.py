"""Sub-layer gates: the attention and the MLP update of a block gated separately at ``i``.

For sequential blocks (the MLP branch reads the half-way residual ``L.attn``, read at the
input of the family's submodule, :mod:`captum_iglens.lens.sublayer`)::

    L.attn[i] = h_{L-1}[i] + r_a + g_a (a_L[i] - r_a)        a_L: the attention update
    h_L[i]    = L.attn[i] + r_m + g_m (m_L[i] - r_m)         m_L: the MLP update of the gated L.attn

A pre-hook on the submodule changes its input (the MLP then reads the gated ``L.attn``); the
block adds its MLP output to its own copy of the ungated ``L.attn``, so the block's hook adds
the change back before gating the MLP update. Parallel blocks (attention and MLP reading the
same input) have no such residual and are refused.

Head gates (``heads=True``): the attention update is ``o_proj(z) = sum_h W_o[:, h] z_h (+ b)``;
gating each head's slice of the ``o_proj`` input, ``z_h = z'_h + g_h (z_h - z'_h)`` (``z'``
the reference's ``o_proj`` input, so the reference update is ``W_o z' + b``), gives
``dF/dg_h = grad_{L.attn[i]} F . W_o[:, h] (z_h - z'_h)``: the gradient at the gated half
residual dotted with the head's contribution to the update's change. On the path every head
gate equals the attention gate, so ``F`` is the sub-layer gates' own; a zero probe added to the
gated ``L.attn`` gives that gradient (:class:`HeadProbe`) and ``o_proj``'s input at ``i`` gives
``z_h``. ``sum_h dF/dg_h`` is ``dF/dg_attn`` but for the rest ``grad . (a - r_a - sum_h
W_o[:, h] (z_h - z'_h))`` (the bias's change, rounding), reported beside the heads.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Callable, Iterator, Optional, Protocol, Sequence

import torch
from torch import Tensor, nn

from captum_iglens.lens.hooks import held_hooks, hidden_of
from captum_iglens.lens.sublayer import HalfBlockSite, HeadSite, _projection

__all__ = ["HeadProbe", "sublayer_gate_hooks", "with_hidden"]


@dataclass
class HeadProbe:
    """What head gates read in a gated forward of ``R`` rows over ``k`` blocks.

    Attributes:
        site (HeadSite): Where the heads meet (``self_attn.o_proj``).
        references (Tensor): ``[R, k, H * d_head]`` reference ``o_proj`` inputs ``z'``.
        probes (Tensor): ``[R, k, d]`` zeros added to each gated ``L.attn`` (leaves whose
            gradient is ``grad_{L.attn[i]} F``).
        inputs (dict): Filled by the forward: block ``j`` -> ``[R, H * d_head]`` the gated
            ``o_proj`` input at the last position.
        grads (Tensor, optional): Set after the backward: ``[R, k, H + 1]`` float64.
    """

    site: HeadSite
    references: Tensor
    probes: Tensor
    inputs: dict[int, Tensor] = field(default_factory=dict)
    grads: Optional[Tensor] = None

    def head_gradients(self, blocks: nn.ModuleList, layers: Sequence[int], probe_grads: Tensor,
                       attention_grads: Tensor) -> Tensor:
        """``[R, k, H + 1]`` float64 ``dF/dg_h`` of every head, then the rest.

        Args:
            blocks (nn.ModuleList): The decoder blocks.
            layers (sequence of int): The ``k`` gated hidden-state indices.
            probe_grads (Tensor): ``[R, k, d]`` ``grad_{L.attn[i]} F``.
            attention_grads (Tensor): ``[R, k]`` ``dF/dg_attn`` (the rest is its part that no
                head holds).
        """
        out = []
        heads = self.site.n_heads
        for j, layer in enumerate(layers):
            proj = _projection(blocks[layer - 1], self.site)
            assert isinstance(proj, nn.Linear)  # head_site checked every block
            weight = proj.weight.detach().double()
            back = probe_grads[:, j].double() @ weight                      # [R, H * d_head]
            change = self.inputs[j].double() - self.references[:, j].double()
            per_head = (back * change).view(back.shape[0], heads, -1).sum(-1)  # [R, H]
            rest = attention_grads[:, j].double() - per_head.sum(-1)
            out.append(torch.cat([per_head, rest[:, None]], dim=-1))
        return torch.stack(out, dim=1)


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


def _probed(mid: Tensor, probe: Optional[HeadProbe], j: int) -> Tensor:
    """``mid`` plus block ``j``'s zero probe (whose gradient is ``grad_{L.attn[i]} F``)."""
    return mid if probe is None else mid + probe.probes[:, j].to(mid)


def _head_input(probe: HeadProbe, j: int) -> Callable[..., None]:
    """A pre-hook on ``o_proj`` recording its input at the last position as block ``j``'s."""
    def hook(_m: nn.Module, args: tuple, kwargs: dict) -> None:
        probe.inputs[j] = _last(args[0] if args else kwargs["input"]).detach()
    return hook


@contextmanager
def sublayer_gate_hooks(blocks: nn.ModuleList, layers: Sequence[int], site: HalfBlockSite,
                        rows: _Gates, probe: Optional[HeadProbe] = None) -> Iterator[None]:
    """Hooks gating each chosen block's attention and MLP updates at the last position.

    Block ``layers[j]``'s attention update gets ``rows.gates[:, 2j]`` and reference
    ``rows.references[:, 2j]``, its MLP update ``[:, 2j + 1]`` (a
    :class:`~captum_iglens._core.gates.GateRows`). With a :class:`HeadProbe`, its zero
    probes are added to each gated ``L.attn`` and ``o_proj``'s input at the last position is
    recorded. Hooks are removed on exit.
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
            new = _probed(before + ref + gate * (old - before - ref), probe, j)
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
            if probe is not None:
                hooks.pre(_projection(block, probe.site), _head_input(probe, j), with_kwargs=True)
            hooks.pre(getattr(block, site.module), half(j, layer), with_kwargs=True)
            hooks.forward(block, block_out(j, layer))
        yield
