"""The baseline registry: one row of facts per named residual-space baseline (no torch).

Every fact about a named baseline is read from its :class:`BaselineRow` in
:data:`BASELINE_ROWS`: which residual it reads (what the capture records), whether a recorded
generation can serve it, whether it is causal, whether it can be a total-effect gate's
reference, and how it is described. The CLI's checks read these rows before torch is imported.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from captum_iglens.settings import BASELINES

__all__ = ["BASELINE_ROWS", "BaselineRow", "baseline_row", "gate_references",
           "recordable_baselines"]


@dataclass(frozen=True)
class BaselineRow:
    """What a named baseline is.

    Attributes:
        reads (int, optional): The hidden-state index ``L`` whose residual it reads (``None``:
            it reads no residual, e.g. the zero vector).
        prefix (bool): It reads that residual at every position up to the explained one (the
            running mean), not only at the explained position.
        recordable (bool): The residuals recorded while generating an answer serve it.
        causal (bool): It depends on no position after the explained one.
        gate_reference (bool): It can be the reference of ``effect="total"``/``"atp"`` gates.
        description (str): In words, for tables, JSON and plots.
    """

    reads: Optional[int]
    prefix: bool
    recordable: bool
    causal: bool
    gate_reference: bool
    description: str


#: Named baseline -> its row, in the order of :data:`~captum_iglens.settings.BASELINES`.
BASELINE_ROWS: dict[str, BaselineRow] = {
    "mean": BaselineRow(1, prefix=True, recordable=True, causal=True, gate_reference=True,
                        description="causal mean of h_1 (first block output): over the "
                        "attended positions up to the explained one, in its own document"),
    "zero": BaselineRow(None, prefix=False, recordable=True, causal=True, gate_reference=True,
                        description="the zero vector of residual space"),
    "embedding": BaselineRow(0, prefix=False, recordable=True, causal=True,
                             gate_reference=False,
                             description="h_0 (the embedding stream) at the same position"),
}
assert tuple(BASELINE_ROWS) == BASELINES, "one row per name of settings.BASELINES"


def baseline_row(baselines: object) -> Optional[BaselineRow]:
    """The row of a named baseline; ``None`` for anything else (a tensor, reference ids)."""
    return BASELINE_ROWS.get(baselines) if isinstance(baselines, str) else None


def recordable_baselines() -> tuple[str, ...]:
    """The named baselines a recorded generation can serve."""
    return tuple(name for name, row in BASELINE_ROWS.items() if row.recordable)


def gate_references() -> tuple[str, ...]:
    """The named baselines that can be a total-effect gate's reference."""
    return tuple(name for name, row in BASELINE_ROWS.items() if row.gate_reference)
