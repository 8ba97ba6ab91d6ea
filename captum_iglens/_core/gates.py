"""Gates on decoder-block updates at one position: ``F(g)`` and ``dF/dg`` in one forward.

The total-effect path (:mod:`captum_iglens._core.total_effect`) gates each chosen block
``L``'s update at the explained position ``i``::

    h_L[i] = h_{L-1}[i] + r_L + g_L (u_L[i] - r_L)
    u_L[i] = block_L(gated stream)[i] - h_{L-1}[i]

``h_{L-1}[i]`` is the block's (already gated) input, ``r_L`` the reference update. Earlier
positions are untouched and later ones cannot change ``p(y)`` at ``i`` in a causal model, so
a row of gates is one single-position forward over the clean prefix's KV cache; ``R`` rows
(path points) run as one batch, and one backward pass gives ``dF/dg`` for every row (rows are
independent). ``F`` is the model's own readout of its last block at ``i``: ``p(y)``,
``log p(y)`` or ``p(y) - p(foil)``.
"""

from __future__ import annotations

from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Optional, Sequence

import torch
from torch import Tensor, nn

from captum_iglens._core.sublayer_gates import HeadProbe, sublayer_gate_hooks, with_hidden
from captum_iglens.lens.distribution import wide_log_softmax
from captum_iglens.lens.hooks import held_hooks, hidden_of
from captum_iglens.lens.kv_cache import make_cache
from captum_iglens.lens.readout import lens_values
from captum_iglens.lens.sublayer import HalfBlockSite

__all__ = ["GateRows", "gated_values", "sequence_gated_values", "with_hidden"]


@dataclass
class GateRows:
    """``R`` rows of gates at one explained position, and what they read.

    Attributes:
        gates (Tensor): ``[R, k]`` gate values (one per gated block), float.
        references (Tensor): ``[R, k, d]`` reference updates ``r_L`` of each row.
        ids (Tensor): ``[R, 1]`` target ids, or ``[R, 2]`` (target, foil).
        log (bool): ``F`` in log-probability (nats) instead of probability.
    """

    gates: Tensor
    references: Tensor
    ids: Tensor
    log: bool = False


class _DropGrad(torch.autograd.Function):
    """``hidden`` unchanged; backward: rows with ``keep = 0`` send the gradient to ``before``.

    GradDrop (AtP*, Kramar et al. 2024, Section 3.1.2): a block's output ``h_l = h_{l-1} +
    u_l`` passes the gradient through the residual skip only (to ``before = h_{l-1}``), not
    through the block's computation ``u_l``; rows with ``keep = 1`` are untouched.
    """

    @staticmethod
    def forward(ctx: Any, before: Tensor, hidden: Tensor, keep: Tensor) -> Tensor:
        ctx.save_for_backward(keep)
        return hidden.clone()

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor, Tensor, None]:
        (keep,) = ctx.saved_tensors
        keep = keep.to(grad)[:, None]
        return grad * (1 - keep), grad * keep, None


@contextmanager
def _grad_drop_hooks(blocks: nn.ModuleList, drop: Tensor) -> Iterator[None]:
    """Row ``r`` drops the gradient through block ``l``'s computation where ``drop[r, l]``.

    Registered before the gate hooks, so the gates see the block's output with its backward
    path cut (the value is unchanged).
    """
    inputs: dict[int, Tensor] = {}

    def pre(index: int) -> Callable[..., None]:
        def hook(_m: nn.Module, args: tuple, kwargs: dict) -> None:
            inputs[index] = args[0] if args else kwargs["hidden_states"]
        return hook

    def post(index: int) -> Callable[..., object]:
        def hook(_m: nn.Module, _a: tuple, output: object) -> object:
            hidden = hidden_of(output)
            before = inputs.pop(index)[:, -1].to(hidden)
            keep = drop[:, index].logical_not().to(hidden.dtype)
            last = _DropGrad.apply(before, hidden[:, -1], keep)
            return with_hidden(output, torch.cat([hidden[:, :-1], last[:, None]], dim=1))
        return hook

    with held_hooks() as hooks:
        for index, block in enumerate(blocks):
            if bool(drop[:, index].any()):
                hooks.pre(block, pre(index), with_kwargs=True)
                hooks.forward(block, post(index))
        yield


@contextmanager
def _gate_hooks(blocks: nn.ModuleList, layers: Sequence[int], gates: Tensor,
                references: Tensor, defined: Optional[Tensor] = None) -> Iterator[None]:
    """Hooks gating block ``layers[j]``'s update by ``gates[:, j]`` at the last ``P`` positions.

    ``gates`` ``[R, k]``; ``references`` ``[R or 1, k, P, d]``, each row's (or every row's)
    reference update of block ``layers[j]`` at each of the forward's last ``P`` positions
    (``P = 1``: the explained position of a single-position forward; ``P = S``: every
    position, ``scope="sequence"``); ``defined`` ``[P]`` bool (False: that position's update
    stays clean), ``None``: all gated. Earlier positions pass through unchanged.
    """
    inputs: dict[int, Tensor] = {}
    window = references.shape[2]

    def pre(layer: int) -> Callable[..., None]:
        def hook(_m: nn.Module, args: tuple, kwargs: dict) -> None:
            inputs[layer] = args[0] if args else kwargs["hidden_states"]
        return hook

    def post(j: int, layer: int) -> Callable[..., object]:
        def hook(_m: nn.Module, _a: tuple, output: object) -> object:
            hidden = hidden_of(output)
            first = hidden.shape[1] - window
            before, now = inputs[layer][:, first:], hidden[:, first:]
            ref = references[:, j].to(hidden)
            gate = gates[:, j, None, None].to(hidden)
            gated = before + ref + gate * (now - before - ref)
            if defined is not None:
                gated = torch.where(defined.to(hidden.device)[None, :, None], gated, now)
            if first:
                gated = torch.cat([hidden[:, :first], gated], dim=1)
            return with_hidden(output, gated)
        return hook

    with held_hooks() as hooks:
        for j, layer in enumerate(layers):
            block = blocks[layer - 1]
            hooks.pre(block, pre(layer), with_kwargs=True)
            hooks.forward(block, post(j, layer))
        yield


def gated_values(
    model: nn.Module, blocks: nn.ModuleList, layers: Sequence[int], rows: GateRows, *,
    token: Tensor, kv: list[tuple[Tensor, Tensor]], cache_kw: str,
    attention_mask: Tensor, position_id: Optional[Tensor] = None, grad: bool = True,
    site: Optional[HalfBlockSite] = None, probe: Optional[HeadProbe] = None,
    drop: Optional[Tensor] = None,
) -> tuple[Tensor, Optional[Tensor]]:
    """``F`` at every row of gates, and its gradient ``dF/dg``: one forward (and backward).

    Args:
        model (nn.Module): The causal LM (in eval mode; its state is the caller's to keep).
        blocks (nn.ModuleList): Its ``n`` decoder blocks.
        layers (sequence of int): The ``k`` gated hidden-state indices (``1..n``).
        rows (GateRows): The gates, references and target.
        token (Tensor): ``[R, 1]`` each row's token id at its explained position ``i``.
        kv (list): Per block ``(keys, values)`` ``[1, heads, c, head_dim]`` of the clean
            prefix (``c = 0``: none), shared by every row.
        cache_kw (str): The forward's cache argument name.
        attention_mask (Tensor): ``[R, c + 1]``: which cached columns each row attends to,
            and its own (last) column.
        position_id (Tensor, optional): ``[R, 1]`` each row's position id.
        grad (bool, optional): Also return ``dF/dg``. Default: True.
        site (HalfBlockSite, optional): Gate each block's attention and MLP updates
            separately (:mod:`captum_iglens._core.sublayer_gates`; ``2k`` gates). Default:
            ``None``, whole blocks.
        probe (HeadProbe, optional): Head gates of the attention updates (with ``site``):
            ``probe.grads`` is then set to ``[R, k, H + 1]`` float64 ``dF/dg_h`` of every
            head and the rest (:meth:`HeadProbe.head_gradients`).
        drop (Tensor, optional): ``[R, n]`` bool: row ``r`` drops the gradient through
            decoder block ``l``'s computation at ``i`` where ``drop[r, l]`` (GradDrop of
            AtP*; values unchanged). Default: ``None``, none.

    Returns:
        (values, grads): ``[R]`` ``F`` (float32; float64 for a float64 model) and
        ``[R, k]`` ``dF/dg`` in the gates' dtype (``None`` without ``grad``).
    """
    n_rows = rows.gates.shape[0]
    kwargs: dict = {"use_cache": True, "attention_mask": attention_mask}
    if kv and kv[0][0].shape[-2]:
        kwargs[cache_kw] = make_cache([(k.expand(n_rows, -1, -1, -1),
                                        v.expand(n_rows, -1, -1, -1)) for k, v in kv])
    if position_id is not None:
        kwargs["position_ids"] = position_id
    gates = rows.gates.detach().requires_grad_(grad)
    live = GateRows(gates, rows.references, rows.ids, rows.log)
    hooks = (_gate_hooks(blocks, layers, gates, rows.references[:, :, None]) if site is None
             else sublayer_gate_hooks(blocks, layers, site, live, probe))
    if probe is not None:
        probe.probes = probe.probes.detach().requires_grad_(grad)
    dropping = (_grad_drop_hooks(blocks, drop) if drop is not None and bool(drop.any())
                else nullcontext())
    with torch.set_grad_enabled(grad), dropping, hooks:
        logits = model(token, **kwargs).logits[:, -1]
        log_probs = wide_log_softmax(logits)
        values = lens_values(log_probs, rows.ids, rows.log)
        if not grad:
            return values.detach(), None
        if probe is None:
            (grads,) = torch.autograd.grad(values.sum(), gates)
            return values.detach(), grads
        grads, at_mid = torch.autograd.grad(values.sum(), [gates, probe.probes])
    probe.grads = probe.head_gradients(blocks, layers, at_mid, grads[:, 0::2])
    return values.detach(), grads


def sequence_gated_values(
    model: nn.Module, blocks: nn.ModuleList, layers: Sequence[int], rows: GateRows, *,
    input_ids: Tensor, references: Tensor, defined: Tensor, forward_kwargs: dict,
) -> tuple[Tensor, Tensor]:
    """``F`` and ``dF/dg`` with every position's update gated (``scope="sequence"``).

    One full forward of the prefix ``x[:i+1]`` per row of gates (all rows in one batch)
    and one backward pass; ``F`` is read at the prefix's last position ``i``.

    Args:
        model (nn.Module): The causal LM (in eval mode).
        blocks (nn.ModuleList): Its decoder blocks.
        layers (sequence of int): The ``k`` gated hidden-state indices.
        rows (GateRows): ``R`` rows of gates ``[R, k]`` and their target ids (its
            ``references`` are unused here).
        input_ids (Tensor): ``[1, i + 1]`` the prefix.
        references (Tensor): ``[k, i + 1, d]`` each block's reference update at every
            position of the prefix.
        defined (Tensor): ``[i + 1]`` bool: positions whose updates are gated (the others,
            padding or positions without a reference, stay clean).
        forward_kwargs (dict): The forward's arguments for the prefix (``[1, i + 1]``
            attention mask, position ids; ``use_cache=False``), expanded to the rows here.

    Returns:
        (values, grads): ``[R]`` ``F`` (float32; float64 for a float64 model) and
        ``[R, k]`` ``dF/dg``.
    """
    n_rows = rows.gates.shape[0]
    kwargs = {k: v.expand(n_rows, *v.shape[1:]) if isinstance(v, Tensor) else v
              for k, v in forward_kwargs.items()}
    gates = rows.gates.detach().requires_grad_(True)
    with torch.enable_grad(), _gate_hooks(blocks, layers, gates, references[None], defined):
        logits = model(input_ids.expand(n_rows, -1), **kwargs).logits[:, -1]
        values = lens_values(wide_log_softmax(logits), rows.ids, rows.log)
        (grads,) = torch.autograd.grad(values.sum(), gates)
    return values.detach(), grads
