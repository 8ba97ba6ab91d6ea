"""Batched single-token forwards that change the residual stream at one position, row by row.

The engine of :mod:`~captum_iglens.validate.ablation` and :mod:`~.patching`. A row changes
some block outputs ``h_l`` at the explained position ``i`` (``h_l := h_{l-1} + r``, or
``h_0 := r`` for the embedding) and reads the target probabilities there. A causal model
leaves positions before ``i`` unchanged, so a row is a single-token forward over the clean
prefix's KV cache (:class:`~captum_iglens.validate.ablation.ResidualTrace`).

Cheaper rows: a row whose first change is block ``L`` computes blocks ``1..L-1`` exactly as
the clean run does, so it need not compute them. The batch grows instead: the forward starts
with the clean row alone, and after block ``L`` every row whose first change is ``L`` joins
the batch as the clean row's ``h_{L-1}`` plus its replacement (rows changing the embedding
join before block 1). Each row then computes only the blocks above its change, and all rows
of a position share one forward, hence one read of the weights (on a CPU the small batched
matmuls here are bound by that read as much as by the arithmetic). Block ``j`` sees the
clean row and the rows that joined below it; its KV cache is the clean prefix expanded to
that many rows. This relies on the model's loop passing each block's output to the next
block unchanged and on a causal mask and rotary tables that broadcast over the batch (a
batch of one is what the forward is called with): the built-in checks of the callers compare
joined rows with full-sequence forwards. ``grow=False`` runs every row from block 1 instead.
Both agree to float32 rounding (matmuls over batches of other sizes round differently;
tests/test_ablation.py bounds the difference).
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Optional

import torch
from torch import Tensor, nn

from captum_iglens.lens.distribution import wide_log_softmax
from captum_iglens.lens.hooks import held_hooks, hidden_of
from captum_iglens.lens.state import input_device
from captum_iglens.validate.ablation_hooks import (
    _with_hidden,
    _with_input,
    cache_tensors,
    hooked,
    make_cache,
)

__all__ = ["ResidualTrace", "RowPlan", "run_rows", "token_probs", "trace_forward"]


@dataclass
class ResidualTrace:
    """One clean forward over a sequence of ``S`` tokens through ``n`` decoder blocks.

    Attributes:
        input_ids (Tensor): ``[S]`` int64 token ids.
        hidden (Tensor): ``[S, n + 1, d]`` residual stream ``h_0..h_n`` (``h_0`` the input of
            block 1, ``h_l`` the output of block ``l``, pre-final-norm), model dtype.
        kv (list): per block ``(keys, values)``, each ``[1, heads, S, head_dim]``.
    """

    input_ids: Tensor
    hidden: Tensor
    kv: list[tuple[Tensor, Tensor]]

    @property
    def updates(self) -> Tensor:
        """``[S, n, d]`` block updates ``u_L = h_L - h_{L-1}`` for ``L = 1..n``."""
        return self.hidden[:, 1:] - self.hidden[:, :-1]


def trace_forward(model: nn.Module, blocks: nn.ModuleList, ids: Tensor, cache_kw: str,
                  can_keep: bool) -> ResidualTrace:
    """One clean forward of ``ids [S]``: the residual stream and the KV cache.

    Raises:
        ValueError: if the cache does not hold all ``S`` positions (a sliding-window cache).
    """
    record: dict[int, Tensor] = {}
    kwargs = {"logits_to_keep": 1} if can_keep else {}
    device = input_device(model)
    with hooked(blocks, {}, 0, record):
        out = model(ids[None].to(device), use_cache=True, **kwargs)
    cache = out.get(cache_kw) if cache_kw in out else out.get("past_key_values")
    kv = [(k.detach(), v.detach()) for k, v in cache_tensors(cache)]
    if any(k.shape[-2] != ids.shape[0] for k, _ in kv):
        raise ValueError("The model's KV cache does not keep every position (sliding-window "
                         "cache?); position-local cached ablation needs the full prefix.")
    hidden = torch.stack([record[i][0] for i in range(len(blocks) + 1)], dim=1)
    return ResidualTrace(ids, hidden, kv)


@dataclass
class RowPlan:
    """The rows of one batched single-token forward at one position.

    Attributes:
        n_rows (int): ``R``, the batch size.
        start (Tensor): ``[R]`` int64, the first hidden-state index each row changes (``0``:
            the embedding; ``n + 1`` or more: none, a clean row). Rows starting at ``0`` or
            changing nothing run from block 1.
        layers (dict[int, tuple[Tensor, Tensor]]): hidden-state index ``l`` -> ``(rows
            [R_l] int64, repl [R_l, d])``: those rows get ``h_l := h_{l-1} + repl`` at the
            position (``l = 0``: ``h_0 := repl``), model dtype.
    """

    n_rows: int
    start: Tensor
    layers: dict[int, tuple[Tensor, Tensor]]


def token_probs(logits: Tensor, ids: Tensor) -> Tensor:
    """``softmax(logits)`` at token ``ids``, for ``logits [R, V]`` and ``ids [T]``.

    Returns:
        Tensor: ``[R, T]`` probabilities, float32 (float64 for a float64 model), from a
        log-softmax in that dtype, as IG-Lens reads them.
    """
    log_probs = wide_log_softmax(logits)
    return log_probs[:, ids.to(log_probs.device).reshape(-1)].exp()


def _batch_order(plan: RowPlan, n: int) -> Tensor:
    """Batch position -> row id: the clean row 0 first, then the rows by first change.

    Raises:
        ValueError: row 0 changes something, or another row changes nothing.
    """
    start = plan.start
    if int(start[0]) <= n or bool((start[1:] > n).any()):
        raise ValueError("A row plan needs exactly one clean row, row 0 (start > n).")
    return torch.cat([torch.zeros(1, dtype=torch.long),
                      1 + torch.argsort(start[1:], stable=True)])


def _schedule(plan: RowPlan, n: int, order: Tensor) -> tuple[dict, dict, list[int]]:
    """Per hidden-state index ``l``: rows that join there, rows changed there, batch sizes.

    Returns ``joins`` (``l -> repl [J, d]``: rows whose first change is ``l``, in batch
    order), ``changes`` (``l -> (batch index [C], repl [C, d])``: rows already in the
    batch) and ``[B_1..B_n]``, the batch entering each block.
    """
    where = torch.empty_like(order)
    where[order] = torch.arange(order.numel())
    joins, changes = {}, {}
    for layer, (rows, repl) in plan.layers.items():
        first = plan.start[rows] == layer
        if bool((plan.start[rows] > layer).any()):
            raise ValueError(f"A row changes h_{layer} before its start.")
        if bool(first.any()):
            joins[layer] = repl[first][torch.argsort(where[rows[first]])]
        if bool((~first).any()):
            changes[layer] = (where[rows[~first]], repl[~first])
    sizes = [1 + int((plan.start[1:] <= layer - 1).sum()) for layer in range(1, n + 1)]
    return joins, changes, sizes


class _Growing:
    """Hooks that change rows and let new rows join the batch after their start block.

    A joining row of block ``l`` is the clean row's ``h_{l-1}`` plus its replacement (its
    ``h_0`` itself for ``l = 0``), appended to the batch; the changed rows get
    ``h_l := h_{l-1} + repl`` (``h_0 := repl``). Single-token forward: position ``-1``.
    """

    def __init__(self, joins: dict, changes: dict) -> None:
        self.joins, self.changes = joins, changes
        self.inputs: dict[int, Tensor] = {}

    def first_input(self, _m: nn.Module, args: tuple, kwargs: dict) -> Optional[tuple]:
        hidden = args[0] if args else kwargs["hidden_states"]
        if 0 in self.changes:
            rows, repl = self.changes[0]
            hidden = hidden.clone()
            hidden[rows, -1] = repl.to(hidden)
        if 0 in self.joins:
            hidden = torch.cat([hidden, self.joins[0][:, None].to(hidden)], dim=0)
        self.inputs[1] = hidden
        touched = 0 in self.joins or 0 in self.changes
        return _with_input(args, kwargs, hidden) if touched else None

    def keep_input(self, layer: int) -> Callable[..., None]:
        def hook(_m: nn.Module, args: tuple, kwargs: dict) -> None:
            self.inputs[layer] = args[0] if args else kwargs["hidden_states"]
        return hook

    def output(self, layer: int) -> Callable[..., object]:
        def hook(_m: nn.Module, _a: tuple, output: object) -> object:
            hidden = hidden_of(output)
            if layer in self.changes:
                rows, repl = self.changes[layer]
                hidden = hidden.clone()
                hidden[rows, -1] = self.inputs[layer][rows, -1] + repl.to(hidden)
            if layer in self.joins:
                new = self.inputs[layer][:1, -1] + self.joins[layer].to(hidden)
                hidden = torch.cat([hidden, new[:, None]], dim=0)
            return _with_hidden(output, hidden)
        return hook

    @contextmanager
    def on(self, blocks: nn.ModuleList) -> Iterator[None]:
        """The hooks on ``blocks``, removed on exit (also on an error)."""
        with held_hooks() as hooks:
            hooks.pre(blocks[0], self.first_input)
            for layer, block in enumerate(blocks, start=1):
                if layer > 1:
                    hooks.pre(block, self.keep_input(layer))
                hooks.forward(block, self.output(layer))
            yield


def run_rows(model: nn.Module, blocks: nn.ModuleList, cache_kw: str, trace: Any, pos: int,
             plan: RowPlan, ids: Tensor, grow: bool = True) -> Tensor:
    """Run every row of ``plan`` at position ``pos`` and read the probabilities of ``ids``.

    Args:
        model (nn.Module): The causal LM.
        blocks (nn.ModuleList): Its ``n`` decoder blocks.
        cache_kw (str): Name of the forward's cache argument.
        trace (ResidualTrace): The clean forward of the sequence (its KV cache is read).
        pos (int): The position ``i``.
        plan (RowPlan): The rows; row 0 must be the only clean row.
        ids (Tensor): ``[T]`` int64 token ids to read.
        grow (bool, optional): Rows join the batch at their first change, starting from
            the clean row's residual there (see the module docstring). False: every row
            runs from block 1 (the reference). Default: True.

    Returns:
        Tensor: ``[R, T]`` probabilities (float32; float64 for a float64 model), on CPU.

    Raises:
        ValueError: a plan without exactly one clean row (row 0).
    """
    n = len(blocks)
    device = input_device(model)
    order = _batch_order(plan, n)
    if grow:
        joins, changes, sizes = _schedule(plan, n, order)
    else:
        joins, changes, sizes = {}, dict(plan.layers), [plan.n_rows] * n
    batch = 1 if grow else plan.n_rows
    token = trace.input_ids[pos].reshape(1, 1).expand(batch, 1).to(device)
    kwargs = {}
    if pos > 0:
        kwargs[cache_kw] = make_cache([
            (k[:, :, :pos].expand(size, -1, -1, -1), v[:, :, :pos].expand(size, -1, -1, -1))
            for size, (k, v) in zip(sizes, trace.kv, strict=True)])
    with _Growing(joins, changes).on(blocks):
        logits = model(token, use_cache=True, **kwargs).logits[:, -1]
    probs = token_probs(logits, ids).cpu()
    if not grow:
        return probs
    out = torch.empty_like(probs)
    out[order] = probs
    return out
