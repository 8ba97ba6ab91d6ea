"""Teach IG-Lens a family it does not know: where its parts are, and its half-block residual.

:func:`register_family` adds a row to the family table (:data:`~captum_iglens.lens.families.
FAMILIES`, keyed by ``config.model_type``) and, optionally, to the table of half-block sites
that ``granularity="sublayer"`` reads (:mod:`captum_iglens.lens.sublayer`). Every check a
built-in family gets still runs on a registered one: the readout of ``h_n`` is compared with
the model's own distribution on every call (Invariant R), so a wrong row is refused, never
silently used.
"""

from __future__ import annotations

from typing import Optional

from captum_iglens.lens.families import FAMILIES, ArchitectureLayout
from captum_iglens.lens.sublayer import REGISTERED_SITES, HalfBlockSite

__all__ = ["ArchitectureLayout", "HalfBlockSite", "register_family"]


def register_family(model_type: str, layout: ArchitectureLayout, *,
                    half_block: Optional[HalfBlockSite] = None, replace: bool = False) -> None:
    """Add a transformers family (``config.model_type``) to the tables IG-Lens reads.

    Args:
        model_type (str): The family's ``config.model_type``.
        layout (ArchitectureLayout): Dotted paths (relative to the model) of its decoder
            blocks and final norm, any projection before the unembedding, and the logit
            transform its ``forward`` applies (see :class:`ArchitectureLayout`).
        half_block (HalfBlockSite, optional): Where ``L.attn`` lives, for
            ``granularity="sublayer"``: ``HalfBlockSite("input", "<mlp pre-norm>")`` for a
            sequential block (the input of that submodule), ``HalfBlockSite("parallel",
            "<attention>")`` for a block whose attention and MLP read the same input. Without
            it, sub-layer credits stay refused for the family.
        replace (bool, optional): Allow replacing a family already in the table.
            Default: False.

    Raises:
        ValueError: ``model_type`` is already in the table and ``replace`` is False; a
            ``half_block`` of another kind than ``"input"`` or ``"parallel"``.
        TypeError: ``layout`` is not an :class:`ArchitectureLayout`.
    """
    if not isinstance(layout, ArchitectureLayout):
        raise TypeError(f"layout must be an ArchitectureLayout, got {type(layout).__name__}.")
    if model_type in FAMILIES and not replace:
        raise ValueError(f"The family {model_type!r} is in the table already: pass "
                         "replace=True to change its row.")
    if half_block is not None and half_block.kind not in ("input", "parallel"):
        raise ValueError(f"half_block.kind={half_block.kind!r}: use 'input' or 'parallel'.")
    FAMILIES[model_type] = layout
    if half_block is not None:
        REGISTERED_SITES[model_type] = half_block
