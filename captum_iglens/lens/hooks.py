"""The residual stream: capture ``h_0..h_n`` with hooks, record it while generating, tap it.

``h_0`` is the input of the first decoder block (the embedding output after any
model-specific scaling or position embedding), ``h_l`` the output of block ``l``;
``h_n`` is the residual *before* the final norm. ``outputs.hidden_states[-1]`` is not used:
in transformers 5 it is already normalised for most families, and applying the final norm
to it again normalises twice.

Every hook of this package is registered through :func:`add_forward_hook` /
:func:`add_forward_pre_hook`: it fires only for forward passes run by the thread that
registered it, so a forward of the same model in another thread (another explanation, or a
plain ``generate``) neither fills nor alters what this call records. Hooks that live for a
block of code are held by :func:`held_hooks`, which removes every one of them on exit.
"""

from __future__ import annotations

import threading
from contextlib import contextmanager
from typing import Any, Callable, Iterable, Iterator, Mapping, Optional, Sequence, Union

import torch
from torch import Tensor, nn

from captum_iglens.lens.state import model_state_preserved

__all__ = [
    "HookSet",
    "ResidualShapeError",
    "add_forward_hook",
    "add_forward_pre_hook",
    "capture_residual_stream",
    "check_finite_residuals",
    "forward_with_capture",
    "held_hooks",
    "hidden_of",
    "record_residual_steps",
    "residual_tap",
]


@torch.compiler.disable
def _running_in(owner: int) -> bool:
    """Whether the current thread is ``owner``.

    Run eagerly: ``torch.compile`` cannot trace the thread id, and a traced answer would be
    fixed for every thread.
    """
    return threading.get_ident() == owner


def _this_thread(hook: Callable[..., Any]) -> Callable[..., Any]:
    """``hook``, run only when the forward pass runs in the thread registering it now."""
    owner = threading.get_ident()

    def scoped(*args: Any) -> Any:
        return hook(*args) if _running_in(owner) else None

    return scoped


def add_forward_hook(module: nn.Module, hook: Callable[..., Any],
                     with_kwargs: bool = False) -> Any:
    """``module.register_forward_hook(hook)``, firing for this thread's forward passes only.

    Returns:
        torch.utils.hooks.RemovableHandle: ``handle.remove()`` takes the hook off.
    """
    return module.register_forward_hook(_this_thread(hook), with_kwargs=with_kwargs)


def add_forward_pre_hook(module: nn.Module, hook: Callable[..., Any],
                         with_kwargs: bool = True) -> Any:
    """``module.register_forward_pre_hook(hook)``, for this thread's forward passes only.

    ``with_kwargs`` defaults to True (the hook sees ``(module, args, kwargs)``).

    Returns:
        torch.utils.hooks.RemovableHandle: ``handle.remove()`` takes the hook off.
    """
    return module.register_forward_pre_hook(_this_thread(hook), with_kwargs=with_kwargs)


class HookSet:
    """The hooks registered for one :func:`held_hooks` block; all removed when it closes."""

    def __init__(self) -> None:
        """No hooks yet."""
        self._handles: list[Any] = []

    def forward(self, module: nn.Module, hook: Callable[..., Any],
                with_kwargs: bool = False) -> None:
        """:func:`add_forward_hook` ``(module, hook, with_kwargs)``, held by this set."""
        self._handles.append(add_forward_hook(module, hook, with_kwargs=with_kwargs))

    def pre(self, module: nn.Module, hook: Callable[..., Any],
            with_kwargs: bool = True) -> None:
        """:func:`add_forward_pre_hook` ``(module, hook, with_kwargs)``, held by this set."""
        self._handles.append(add_forward_pre_hook(module, hook, with_kwargs=with_kwargs))

    def remove(self) -> None:
        """Take every held hook off its module (in registration order)."""
        handles, self._handles = self._handles, []
        for handle in handles:
            handle.remove()


@contextmanager
def held_hooks() -> Iterator[HookSet]:
    """A :class:`HookSet` whose hooks are all removed on exit, also when an error is raised.

    Register inside the block (``hooks.forward(module, hook)`` / ``hooks.pre(...)``); a
    registration that fails part-way still removes the hooks registered before it.

    Yields:
        HookSet: empty on entry.
    """
    hooks = HookSet()
    try:
        yield hooks
    finally:
        hooks.remove()


def hidden_of(output: object) -> Tensor:
    """The residual stream ``[B, S, d]`` in a decoder block's output.

    A tensor, the first element of a tuple or list, or the ``hidden_states`` field of a
    model-output object.

    Raises:
        TypeError: an output of another kind.
    """
    if isinstance(output, Tensor):
        return output
    if isinstance(output, (tuple, list)) and output and isinstance(output[0], Tensor):
        return output[0]
    hidden = getattr(output, "hidden_states", None)
    if isinstance(hidden, Tensor):
        return hidden
    raise TypeError(f"Cannot read the residual stream from a block output of type {type(output)}")


def _block_input(args: tuple, kwargs: dict) -> Tensor:
    return args[0] if args else kwargs["hidden_states"]


class ResidualShapeError(ValueError):
    """A decoder block's input or output is not a ``[B, S, d]`` residual stream."""


def _check_shape(index: int, hidden: Tensor, shape: tuple[int, ...], block: nn.Module) -> None:
    """Raise unless ``hidden`` is ``[B, S, d]`` for the input's ``(B, S)``."""
    if hidden.dim() == 3 and tuple(hidden.shape[:2]) == shape:
        return
    where = ("the input of decoder block 1" if index == 0
             else f"the output of decoder block {index}")
    raise ResidualShapeError(
        f"IG-Lens reads one residual vector per token, but {where} "
        f"({type(block).__name__}) has shape {list(hidden.shape)}, not a [B, S, d] = "
        f"[{shape[0]}, {shape[1]}, d] residual stream of the whole input (e.g. a stacked "
        "[n_copies, B, S, d] residual, or positions dropped inside the model). This model "
        "is not supported; no lens readout of its blocks exists."
    )


@contextmanager
def capture_residual_stream(
    blocks: nn.ModuleList,
    layer_indices: Iterable[int],
    device: Optional[torch.device] = None,
    finite: Optional[dict[int, Tensor]] = None,
    mask: Optional[Tensor] = None,
    shape: Optional[tuple[int, ...]] = None,
    positions: Optional[Sequence[int]] = None,
    whole: Iterable[int] = (),
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
        shape (tuple of int, optional): The input's ``(B, S)``: every recorded tensor must be
            ``[B, S, d]``.
        positions (sequence of int, optional): Keep only these ``P`` positions (``[B, P, d]``)
            of every recorded index not in ``whole``, so that memory does not grow with the
            sequence times the layers. Default: all positions.
        whole (iterable of int, optional): Indices kept at every position (e.g. the layer
            a mean baseline averages). Default: none.

    Raises:
        ResidualShapeError: (during the forward pass, with ``shape``) a block's input or
            output is not ``[B, S, d]``, naming the block.

    Yields:
        dict[int, Tensor]: filled during the forward pass with ``h_l`` of shape
        ``[B, S, d]`` (``[B, P, d]`` with ``positions``; detached, the model's dtype). Hooks
        are removed on exit, also when an error is raised.
    """
    wanted, full = set(layer_indices), set(whole)
    store: dict[int, Tensor] = {}
    masks: dict[torch.device, Tensor] = {}

    def keep(index: int, hidden: Tensor) -> None:
        if shape is not None:
            _check_shape(index, hidden, shape, blocks[max(index - 1, 0)])
        hidden = hidden.detach()
        if finite is not None:
            valid = hidden
            if mask is not None and tuple(mask.shape) == tuple(hidden.shape[:2]):
                if hidden.device not in masks:
                    masks[hidden.device] = mask.to(hidden.device).bool()
                valid = hidden[masks[hidden.device]]
            finite[index] = torch.isfinite(valid).all()
        if index in wanted:
            if positions is not None and index not in full:
                hidden = hidden[:, list(positions)]
            store[index] = hidden.to(device) if device is not None else hidden

    indices = range(len(blocks) + 1) if finite is not None else sorted(wanted)
    with held_hooks() as hooks:
        for index in indices:
            _register(hooks, blocks, index, keep)
        yield store


@contextmanager
def record_residual_steps(
    blocks: nn.ModuleList,
    layer_indices: Iterable[int],
    device: Optional[torch.device] = None,
    whole: Iterable[int] = (),
    finite: Optional[dict[int, list[Tensor]]] = None,
) -> Iterator[dict[int, list[Tensor]]]:
    """Record ``h_l`` at every forward pass while open (generation: prompt, then each step).

    Args:
        blocks (nn.ModuleList): The decoder blocks.
        layer_indices (iterable of int): Hidden-state indices (0: the first block's input).
        device (torch.device, optional): Where the recorded residuals are moved.
        whole (iterable of int): Indices recorded at every position of each pass; the others
            only at its last position (where the next token is predicted).
        finite (dict, optional): Filled for *every* index ``0..n`` with one ``[B, s]`` bool
            per pass: whether each position's residual is finite.

    Yields:
        dict[int, list[Tensor]]: per index, one tensor per pass: ``[B, s, d]`` (``whole``) or
        ``[B, 1, d]``; detached, the model's dtype. Hooks are removed on exit.

    Raises:
        ResidualShapeError: a block's input or output is not ``[B, s, d]`` for the pass's
            ``(B, s)`` (block named).
    """
    wanted, full = set(layer_indices), set(whole)
    store: dict[int, list[Tensor]] = {index: [] for index in wanted}
    shape: list[tuple[int, ...]] = []

    def keep(index: int, hidden: Tensor) -> None:
        if index == 0:  # the first block's input opens every pass
            shape[:] = [tuple(hidden.shape[:2])]
        _check_shape(index, hidden, shape[0], blocks[max(index - 1, 0)])
        if finite is not None:
            finite.setdefault(index, []).append(torch.isfinite(hidden.detach()).all(-1))
        if index in wanted:
            hidden = hidden.detach() if index in full else hidden.detach()[:, -1:]
            store[index].append(hidden.to(device) if device is not None else hidden)

    indices = set(range(len(blocks) + 1)) if finite is not None else wanted | {0}
    with held_hooks() as hooks:
        for index in sorted(indices):
            _register(hooks, blocks, index, keep)
        yield store


def _register(hooks: HookSet, blocks: nn.ModuleList, index: int,
              keep: Callable[[int, Tensor], None]) -> None:
    """Hook hidden-state index ``index``: block 1's input for 0, block ``index``'s output."""
    if index == 0:

        def pre_hook(_m: nn.Module, args: tuple, kwargs: dict) -> None:
            keep(0, _block_input(args, kwargs))

        hooks.pre(blocks[0], pre_hook)
        return

    def hook(_m: nn.Module, _a: tuple, output: object) -> None:
        keep(index, hidden_of(output))

    hooks.forward(blocks[index - 1], hook)


def _block_name(model: nn.Module, blocks: nn.ModuleList, index: int) -> str:
    """``"decoder block l (path)"`` for hidden-state index ``l``, path inside the model."""
    block = blocks[index - 1]
    path = next((name for name, mod in model.named_modules() if mod is block), "")
    return f"decoder block {index}" + (f" ({path})" if path else "")


def check_finite_residuals(model: nn.Module, blocks: nn.ModuleList,
                           finite: Mapping[int, Union[bool, Tensor]]) -> None:
    """Raise naming the first hidden-state index whose residual holds NaN or inf.

    ``finite`` maps hidden-state indices to a bool (or 0-dim bool tensor): all finite.

    Raises:
        FloatingPointError: naming the index, its block and what to try.
    """
    for index in sorted(finite):
        if bool(finite[index]):
            continue
        if index == 0:
            where = "the embedding output, the input of decoder block 1"
        else:
            where = f"the output of {_block_name(model, blocks, index)}"
        raise FloatingPointError(
            f"The residual stream at hidden-state index {index} ({where}) contains NaN "
            "or inf (first such layer); the model overflows on this input (try float32 "
            "or bfloat16 instead of float16) or that block's weights are corrupt."
        )


def forward_with_capture(
    model: nn.Module,
    blocks: nn.ModuleList,
    input_ids: Tensor,
    forward_kwargs: dict[str, Any],
    layer_indices: Iterable[int],
    device: Optional[torch.device],
    mask: Optional[Tensor],
    positions: Optional[Sequence[int]] = None,
    whole: Iterable[int] = (),
) -> tuple[dict[int, Tensor], Tensor]:
    """One no-grad, eval-mode forward that records ``h_l`` for ``layer_indices``.

    ``positions`` and ``whole`` are as for :func:`capture_residual_stream`.

    Returns:
        (states, logits): ``{l: [B, S, d]}`` (``[B, P, d]`` at ``positions`` for indices not
        in ``whole``) on ``device`` and the model's logits (all positions, or those
        ``forward_kwargs["logits_to_keep"]`` selects).

    Raises:
        FloatingPointError: NaN or inf in a residual (the first such index is named).
        ResidualShapeError: a block's input or output is not ``[B, S, d]`` (block named).
    """
    finite: dict[int, Tensor] = {}
    with model_state_preserved(model), torch.no_grad():
        with capture_residual_stream(blocks, layer_indices, device, finite=finite, mask=mask,
                                     shape=tuple(input_ids.shape[:2]), positions=positions,
                                     whole=whole) as st:
            output = model(input_ids, **forward_kwargs)
    check_finite_residuals(model, blocks, finite)
    logits = output.logits if hasattr(output, "logits") else output[0]
    return st, logits


@contextmanager
def residual_tap(blocks: nn.ModuleList, index: int) -> Iterator[nn.Module]:
    """An ``nn.Identity`` through which the residual ``h_index`` flows, for Captum's layer hooks.

    Captum's layer methods hook a module's input or output. Decoder blocks are awkward
    targets: GPT-2 and Falcon blocks take extra positional arguments that are ``None``
    (Captum refuses them as layer inputs), and Bloom, MPT and GPT-Neo blocks return tuples
    whose other members are not in the graph (Captum's gradient fails on them). While the
    context is open, the residual stream at hidden-state index ``index`` (0: the input of the
    first block; ``l``: the output of block ``l``) is routed through the yielded identity
    module, whose input and output are that one ``[B, S, d]`` tensor; hooks are removed on exit.
    """
    tap = nn.Identity()

    def pre_hook(_m: nn.Module, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
        if args:
            return (tap(args[0]), *args[1:]), kwargs
        return args, {**kwargs, "hidden_states": tap(kwargs["hidden_states"])}

    def hook(_m: nn.Module, _args: tuple, out: Any) -> Any:
        if isinstance(out, Tensor):
            return tap(out)
        if isinstance(out, tuple) and out and isinstance(out[0], Tensor):
            return (tap(out[0]), *out[1:])
        raise TypeError(f"Cannot tap a decoder block output of type {type(out)}")

    with held_hooks() as hooks:
        if index == 0:
            hooks.pre(blocks[0], pre_hook)
        else:
            hooks.forward(blocks[index - 1], hook)
        yield tap


