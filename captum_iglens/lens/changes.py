"""A lens is built for one model structure: notice when the model was edited since.

``IGLens`` locates the decoder blocks, the final norm and the unembedding once. Pruning a
block or replacing the final norm afterwards would otherwise surface as a bare ``KeyError``
or as a readout mismatch whose advice (write a readout by hand) does not help: the lens is
simply stale.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Optional

from torch import nn

from captum_iglens.lens.architectures import UnknownArchitectureError, locate_parts

__all__ = ["ModelChangedError", "ModelStructure", "check_unchanged"]

if TYPE_CHECKING:
    from captum_iglens.lens.spec import LensSpec


class ModelChangedError(ValueError):
    """The model was edited after the ``IGLens`` that explains it was built."""


@dataclass(frozen=True)
class ModelStructure:
    """Identities of the located parts: block modules, final norm and unembedding."""

    blocks: tuple[int, ...]
    final_norm: Optional[int]
    unembed: Optional[int]

    @classmethod
    def of(cls, model: nn.Module, blocks: nn.ModuleList, readout: Any,
           located: bool) -> ModelStructure:
        """The structure the lens uses (the norm and head only when it located them)."""
        norm = getattr(readout, "final_norm", None) if located else None
        head = getattr(readout, "unembed", None) if located else None
        return cls(tuple(id(b) for b in blocks), None if norm is None else id(norm),
                   None if head is None else id(head))


def check_unchanged(spec: LensSpec) -> None:
    """Raise if ``spec.model`` no longer has the blocks, final norm or head the spec holds.

    Raises:
        ModelChangedError: naming what changed and saying to build a new ``IGLens``.
    """
    built = spec.structure
    now = tuple(id(b) for b in spec.decoder_blocks)
    changes = []
    if now != built.blocks:
        changes.append(f"its decoder blocks changed ({len(built.blocks)} -> {len(now)} blocks, "
                       "or replaced)")
    if built.final_norm is not None or built.unembed is not None:
        try:
            parts = locate_parts(spec.model)
        except UnknownArchitectureError as err:
            changes.append(f"its final norm or unembedding can no longer be located ({err})")
        else:
            if built.final_norm is not None and id(parts.final_norm) != built.final_norm:
                changes.append("its final norm was replaced")
            if built.unembed is not None and id(parts.unembed) != built.unembed:
                changes.append("its unembedding was replaced")
    if changes:
        raise ModelChangedError(
            f"The model changed since this IGLens was built: {'; '.join(changes)}. Build a new "
            "IGLens(model) for the edited model.")
