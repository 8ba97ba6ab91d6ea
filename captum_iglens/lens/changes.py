"""A lens is built for one model structure: notice when the model was edited since.

``IGLens`` locates the decoder blocks, the final norm and the unembedding once. Pruning a
block, replacing the block list or replacing the final norm afterwards would otherwise
surface as a bare ``KeyError`` or as a readout mismatch whose advice (write a readout by
hand) does not help: the lens is simply stale.

The check is *relative to the lens's own model*: the block list found at its recorded path
inside the model must be the list the lens holds, holding the same block modules, and the
final norm and unembedding located now must be the modules the lens's readout holds. No
``id()`` is recorded, so a copy of a lens (``copy.deepcopy``, ``pickle``, ``torch.save``),
which copies the model together with the lens's references into it, passes the check and
explains the copied model; an edit made to the copy afterwards is still caught. Weights are
read live by the model and the readout alike, so assigning a new weight tensor of the same
shape needs no new lens (both follow it).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional, Protocol

from torch import nn

from captum_iglens.lens.architectures import UnknownArchitectureError, locate_parts

__all__ = ["ModelChangedError", "ModelStructure", "check_unchanged"]

class ModelChangedError(ValueError):
    """The model was edited after the ``IGLens`` that explains it was built."""


def _path_of(model: nn.Module, module: nn.Module) -> Optional[str]:
    """The dotted name of ``module`` inside ``model`` (``None`` when it is not there)."""
    return next((name for name, sub in model.named_modules() if sub is module), None)


@dataclass(frozen=True, eq=False)
class ModelStructure:
    """The located parts as built: block modules, where the block list sits, norm and head.

    Attributes:
        blocks (tuple of nn.Module): The decoder block modules, in order.
        blocks_path (str, optional): The dotted path of the block list inside the model
            (``None`` when the blocks given are not a submodule of the model).
        final_norm (nn.Module, optional): The final norm the readout holds (located only).
        unembed (nn.Module, optional): The unembedding the readout holds (located only).
    """

    blocks: tuple[nn.Module, ...]
    blocks_path: Optional[str]
    final_norm: Optional[nn.Module]
    unembed: Optional[nn.Module]

    @classmethod
    def of(cls, model: nn.Module, blocks: nn.ModuleList, readout: Any,
           located: bool) -> ModelStructure:
        """The structure the lens uses (the norm and head only when it located them)."""
        norm = getattr(readout, "final_norm", None) if located else None
        head = getattr(readout, "unembed", None) if located else None
        return cls(tuple(blocks), _path_of(model, blocks), norm, head)


def _same(now: tuple, built: tuple) -> bool:
    return len(now) == len(built) and all(a is b for a, b in zip(now, built, strict=True))


class BuiltLens(Protocol):
    """What :func:`check_unchanged` reads of a :class:`~captum_iglens.lens.spec.LensSpec`.

    Named here, below the spec, so that this module does not import the spec's.
    """

    @property
    def model(self) -> nn.Module:
        """The explained model."""

    @property
    def decoder_blocks(self) -> nn.ModuleList:
        """The decoder blocks the lens was built on."""

    @property
    def structure(self) -> ModelStructure:
        """The located parts as built."""


def _block_changes(spec: BuiltLens) -> list[str]:
    """What changed in the decoder blocks: the list at its path, or its members."""
    built = spec.structure
    if built.blocks_path is not None:
        try:
            listed = spec.model.get_submodule(built.blocks_path)
        except AttributeError:
            return [f"its decoder block list {built.blocks_path} is gone"]
        if listed is not spec.decoder_blocks:
            count = len(listed) if isinstance(listed, nn.ModuleList) else "?"
            return [f"its decoder blocks changed: {built.blocks_path} is a new list of "
                    f"{count} blocks (the lens was built with {len(built.blocks)})"]
    now = tuple(spec.decoder_blocks)
    if not _same(now, built.blocks):
        where = built.blocks_path or "the decoder block list"
        if len(now) != len(built.blocks):
            return [f"its decoder blocks changed: {where} holds {len(now)} blocks (the lens "
                    f"was built with {len(built.blocks)})"]
        swapped = [i for i, (a, b) in enumerate(zip(now, built.blocks, strict=True))
                   if a is not b]
        return [f"its decoder blocks changed: {where}[{', '.join(map(str, swapped[:5]))}] "
                f"{'is a new block' if len(swapped) == 1 else 'are new blocks'} (block "
                f"{'numbers' if len(swapped) > 1 else 'number'} "
                f"{', '.join(str(i + 1) for i in swapped[:5])})"]
    return []


def check_unchanged(spec: BuiltLens) -> None:
    """Raise if ``spec.model`` no longer has the blocks, final norm or head the spec holds.

    Raises:
        ModelChangedError: naming what changed and saying to build a new ``IGLens``.
    """
    built = spec.structure
    changes = _block_changes(spec)
    if built.final_norm is not None or built.unembed is not None:
        try:
            parts = locate_parts(spec.model)
        except UnknownArchitectureError as err:
            changes.append(f"its final norm or unembedding can no longer be located ({err})")
        else:
            if built.final_norm is not None and parts.final_norm is not built.final_norm:
                changes.append("its final norm was replaced")
            if built.unembed is not None and parts.unembed is not built.unembed:
                changes.append("its unembedding was replaced")
    if changes:
        raise ModelChangedError(
            f"The model changed since this IGLens was built: {'; '.join(changes)}. Build a new "
            "IGLens(model) for the edited model.")
