"""Teach IG-Lens a family it does not know: one row, taken whole.

:func:`register_family` adds one :class:`ArchitectureLayout` row to the family table
(:data:`~captum_iglens.lens.families.FAMILIES`, keyed by ``config.model_type``): where the
family's parts are, its logit transform, its half-block residual (``granularity="sublayer"``),
its head split (``heads=True``), whether its generation can be recorded and whether its KV
cache can carry a document. Every consumer reads that row, so one call is the whole of it.
Every check a built-in family gets still runs on a registered one: the readout of ``h_n`` is
compared with the model's own distribution on every call (Invariant R), so a wrong row is
refused, never silently used.
"""

from __future__ import annotations

from dataclasses import replace as _replace
from typing import Optional

from captum_iglens.lens.families import FAMILIES, ArchitectureLayout, HalfBlockSite

__all__ = ["ArchitectureLayout", "HalfBlockSite", "register_family"]


def register_family(model_type: str, layout: ArchitectureLayout, *,
                    half_block: Optional[HalfBlockSite] = None, replace: bool = False) -> None:
    """Add a transformers family (``config.model_type``) to the family table, as one row.

    Args:
        model_type (str): The family's ``config.model_type``.
        layout (ArchitectureLayout): The family's row: dotted paths (relative to the model)
            of its decoder blocks and final norm, any projection before the unembedding, the
            logit transform its ``forward`` applies, and its ``half_block`` site, ``heads``
            split, ``unrecorded`` and ``uncached`` facts (see :class:`ArchitectureLayout`).
            ``dataclasses.replace(FAMILIES["llama"], ...)`` copies a built-in row.
        half_block (HalfBlockSite, optional): Shorthand for ``layout``'s ``half_block``
            (``HalfBlockSite("input", "<mlp pre-norm>")`` for a sequential block,
            ``HalfBlockSite("parallel", "<attention>")`` for a block whose attention and MLP
            read the same input); it replaces the row's. Without a site, sub-layer credits
            stay refused for the family.
        replace (bool, optional): Allow replacing a family already in the table.
            Default: False.

    Raises:
        ValueError: ``model_type`` is already in the table and ``replace`` is False; a
            half-block site of another kind than ``"input"`` or ``"parallel"``.
        TypeError: ``layout`` is not an :class:`ArchitectureLayout`.
    """
    if not isinstance(layout, ArchitectureLayout):
        raise TypeError(f"layout must be an ArchitectureLayout, got {type(layout).__name__}.")
    if model_type in FAMILIES and not replace:
        raise ValueError(f"The family {model_type!r} is in the table already: pass "
                         "replace=True to change its row.")
    if half_block is not None:
        layout = _replace(layout, half_block=half_block)
    site = layout.half_block
    if isinstance(site, HalfBlockSite) and site.kind not in ("input", "parallel"):
        raise ValueError(f"half_block.kind={site.kind!r}: use 'input' or 'parallel'.")
    if layout.heads is not None and (len(layout.heads) != 2
                                     or not all(isinstance(p, str) for p in layout.heads)):
        raise ValueError(f"heads={layout.heads!r}: give (attention, projection) attribute "
                         "names, e.g. ('self_attn', 'o_proj').")
    FAMILIES[model_type] = layout
