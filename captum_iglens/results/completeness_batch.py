"""CompletenessBatch: one :class:`CompletenessReport` per explained row and position."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterator, Optional, Sequence

import torch
from torch import Tensor

from captum_iglens.results.completeness import CompletenessReport

__all__ = ["CompletenessBatch"]


@dataclass
class CompletenessBatch:
    """The comparison over a batch and several positions: one report per prediction.

    :func:`~captum_iglens.compare_completeness` returns it for ``inputs`` of ``B > 1`` rows
    or a sequence of positions; reports are ordered row by row, positions in the order
    given (``reports[b * P + p]``).

    Attributes:
        reports (list[CompletenessReport]): One per (row, position), each with its ``row``,
            ``position``, target and every method's numbers (probability units).
        n_rows (int): ``B``.
        positions (list[int]): The ``P`` explained positions (non-negative, per row the
            same; rows may be left-padded).
    """

    reports: list[CompletenessReport] = field(default_factory=list)
    n_rows: int = 0
    positions: list[int] = field(default_factory=list)

    def __len__(self) -> int:
        """``B * P``."""
        return len(self.reports)

    def __iter__(self) -> Iterator[CompletenessReport]:
        """The reports, row by row."""
        return iter(self.reports)

    def __getitem__(self, index: int) -> CompletenessReport:
        """Report ``index`` (``b * P + p``); see :meth:`report` for ``(row, position)``."""
        return self.reports[index]

    def report(self, row: int, position: int) -> CompletenessReport:
        """The report of ``row`` at ``position`` (as given, negative counts from the end).

        Raises:
            KeyError: no such row and position.
        """
        for rep in self.reports:
            length = len(rep.input_ids)
            if rep.row == row and rep.position == position % length:
                return rep
        raise KeyError(f"no report for row {row}, position {position}")

    def gaps(self, name: str) -> Tensor:
        """``[B, P]`` float64 completeness gaps ``|sum over layers - total|`` of ``name``."""
        values = [rep.methods[name].completeness_gap for rep in self.reports]
        return torch.tensor(values, dtype=torch.float64).reshape(self.n_rows, -1)

    def failures(self, methods: Optional[Sequence[str]] = None, rtol: Optional[float] = None,
                 atol: Optional[float] = None) -> list[str]:
        """Every report's failure messages (see :meth:`CompletenessReport.failures`)."""
        return [msg for rep in self.reports for msg in rep.failures(methods, rtol, atol)]

    @property
    def passed(self) -> bool:
        """Whether every report passed (IG-Lens adds up at every row and position)."""
        return all(rep.passed for rep in self.reports)

    def assert_complete(self, methods: Optional[Sequence[str]] = None, *,
                        rtol: Optional[float] = None, atol: Optional[float] = None) -> None:
        """Raise ``AssertionError`` unless every report's methods add up.

        The message counts the failing predictions and gives the worst one first (largest
        gap over bound), with its row, position, target and worst layer.

        Raises:
            AssertionError: some prediction does not add up.
            ValueError: as :meth:`CompletenessReport.assert_complete`.
        """
        ratios = []
        for rep in self.reports:
            names = rep.checked_methods() if methods is None else list(methods)
            if not names:
                raise ValueError("The reports have no IG-Lens method; pass methods=[...].")
            for name in names:
                gap = rep.methods[name].completeness_gap
                ratio = gap / max(rep.completeness_bound(name, rtol, atol), 1e-300)
                ratios.append((ratio if ratio == ratio else float("inf"), rep, name))
        failing = [(r, rep, name) for r, rep, name in ratios if not r <= 1.0]
        if failing:
            failing.sort(key=lambda item: -item[0])
            _, rep, name = failing[0]
            worst = rep.failures([name], rtol, atol)[0]
            raise AssertionError(f"{len(failing)} of {len(ratios)} checks failed; the worst: "
                                 f"{worst}")

    def format_table(self) -> str:
        """Every report's table (:meth:`CompletenessReport.format_table`), one after another."""
        return "\n\n".join(rep.format_table() for rep in self.reports)

    def __str__(self) -> str:
        """The tables, :meth:`format_table`."""
        return self.format_table()

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict: ``{"n_rows", "positions", "reports": [report dicts]}``."""
        return {"n_rows": self.n_rows, "positions": list(self.positions),
                "reports": [rep.to_dict() for rep in self.reports]}
