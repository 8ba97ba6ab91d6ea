"""CompletenessReport: IG-Lens and Captum's layer methods side by side, one table."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional, Sequence

import torch
from torch import Tensor

from captum_iglens._utils.format import fmt, layer_names, num
from captum_iglens.results._bounds import bound_words, isclose_bound, worst_layer

__all__ = ["CAPTUM_LAYER_METHODS", "CompletenessReport", "MethodCompleteness"]

#: Methods whose per-layer runs carry Captum's own convergence delta.
CAPTUM_LAYER_METHODS = ("layer_integrated_gradients", "layer_conductance")


@dataclass
class MethodCompleteness:
    """One method's numbers in a :class:`CompletenessReport` (probability units throughout).

    Attributes:
        name (str): Method key (one of :data:`COMPARE_METHODS`).
        label (str): Short column label.
        per_layer (Tensor): ``[k]`` credit per layer (for ``logit_lens``: the level
            ``f(h_L)``, which is not a credit and does not add up).
        total (float): The method's own total change: ``F(x) - F(x')`` for the Captum
            methods, ``Δp = f(h_n) - f(b)`` for IG-Lens, ``p_final`` for the logit lens.
        convergence_deltas (Tensor, optional): Captum's convergence delta per layer run,
            ``[k]`` (``sum of that run's attributions - total``); for IG-Lens ``[1]``, the
            delta of its single path (``sum - Δp``); ``None`` for the logit lens.
        wall_time_s (float): Seconds spent on the method (all its layers).
        per_layer_time_s (list[float], optional): Seconds per layer run (Captum methods).
        is_credit (bool): ``False`` for levels (logit lens): no sum or gap is reported.
        abs_sums (Tensor, optional): ``[k]`` float64 ``sum |a|`` over the attributions of
            each Captum layer run, for the rounding bound of Captum's float32 sums.
        n_terms (list[int], optional): Number of attribution elements of each layer run.
    """

    name: str
    label: str
    per_layer: Tensor
    total: float
    convergence_deltas: Optional[Tensor] = None
    wall_time_s: float = float("nan")
    per_layer_time_s: Optional[list[float]] = None
    is_credit: bool = True
    abs_sums: Optional[Tensor] = None
    n_terms: Optional[list[int]] = None

    @property
    def layer_sum(self) -> float:
        """Sum of the per-layer credits over the chosen layers (NaN for levels)."""
        return float(self.per_layer.double().sum()) if self.is_credit else float("nan")

    @property
    def completeness_gap(self) -> float:
        """``|sum over layers - total|`` (NaN for levels)."""
        return abs(self.layer_sum - self.total) if self.is_credit else float("nan")

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict (NaN becomes ``None``)."""
        return {
            "label": self.label,
            "per_layer": [float(x) for x in self.per_layer],
            "sum": num(self.layer_sum),
            "total": float(self.total),
            "completeness_gap": num(self.completeness_gap),
            "convergence_deltas": (
                None if self.convergence_deltas is None
                else [float(x) for x in self.convergence_deltas]
            ),
            "wall_time_s": num(self.wall_time_s),
            "per_layer_time_s": self.per_layer_time_s,
            "is_credit": self.is_credit,
        }


@dataclass
class CompletenessReport:
    """The side-by-side result of :func:`compare_completeness`.

    Attributes:
        layer_indices (list[int]): The ``k`` hidden-state indices (0 = input of the first
            block, ``l`` = output of block ``l``).
        position (int): The explained position (non-negative).
        target_id (int): The target token id.
        target_token (str): The target token as text (``""`` without a tokenizer).
        input_ids (list[int]): The explained token ids.
        baseline_ids (list[int]): The Captum methods' input-space baseline token ids.
        baseline_description (str): Which filler token replaced how many positions.
        f_input (float): ``F(x)``, the model's probability of the target.
        f_baseline (float): ``F(x')``, the same at the baseline ids.
        n_steps (int): Integration steps of the Captum methods (and of IG-Lens's gradient
            estimator).
        lens_baseline (str): IG-Lens's baseline: ``"reference ids"`` when it starts at the
            Captum reference ``x'`` (the default: one total for every method), else a
            residual-space baseline name or ``"tensor"``.
        methods (dict[str, MethodCompleteness]): Per method, in run order.
        model_name (str): The model's name.
        target_source (str): ``"model argmax"`` when ``target=None`` let the model choose,
            ``"given"`` otherwise (``iglens compare`` says ``"greedy answer token"`` for the
            token of the answer it generated greedily).
        row (int): The row of the batch this report explains (0 for one sequence).
        rtol, atol (float, optional): The completeness tolerance of :attr:`passed` and
            :meth:`assert_complete`; both ``None`` (default): the bound derived from float
            rounding, ``u (k sum|c| + |total|)``.
    """

    layer_indices: list[int]
    position: int
    target_id: int
    target_token: str
    input_ids: list[int]
    baseline_ids: list[int]
    f_input: float
    f_baseline: float
    n_steps: int
    lens_baseline: str
    baseline_description: str = ""
    methods: dict[str, MethodCompleteness] = field(default_factory=dict)
    model_name: str = ""
    target_source: str = "given"
    row: int = 0
    rtol: Optional[float] = None
    atol: Optional[float] = None

    @property
    def layer_names(self) -> list[str]:
        """``"emb"`` for index 0, ``"L<l>"`` for the output of block ``l``."""
        return layer_names(self.layer_indices)

    def __getitem__(self, name: str) -> MethodCompleteness:
        """The numbers of method ``name`` (a key of :data:`COMPARE_METHODS`)."""
        return self.methods[name]

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict.

        Settings and, per method, per-layer credit, sum, total, gap, convergence deltas and
        wall time.
        """
        return {
            "model": self.model_name,
            "layers": [int(i) for i in self.layer_indices],
            "layer_names": self.layer_names,
            "position": int(self.position),
            "target_id": int(self.target_id),
            "target_token": self.target_token,
            "target_source": self.target_source,
            "row": int(self.row),
            "input_ids": [int(i) for i in self.input_ids],
            "baseline_ids": [int(i) for i in self.baseline_ids],
            "baseline_description": self.baseline_description,
            "F_input": float(self.f_input),
            "F_baseline": float(self.f_baseline),
            "n_steps": int(self.n_steps),
            "lens_baseline": self.lens_baseline,
            "units": "probability",
            "methods": {name: m.to_dict() for name, m in self.methods.items()},
        }

    @property
    def shared_reference(self) -> bool:
        """Whether IG-Lens started at the Captum reference ``x'`` (one total for all)."""
        return self.lens_baseline == "reference ids"

    def _columns(self) -> list[tuple[str, list[str]]]:
        cols: list[tuple[str, list[str]]] = []
        for m in self.methods.values():
            cols.append((m.label, [f"{float(x):+.6f}" for x in m.per_layer]))
            if m.name in CAPTUM_LAYER_METHODS:
                cols.append((f"δ {m.label}", [f"{float(x):+.1e}" for x in m.convergence_deltas]))  # type: ignore[union-attr]  # Captum layer methods have them
        return cols

    def _header(self) -> str:
        row = f"row {self.row}, " if self.row else ""
        head = (f"target {self.target_token!r} (id {self.target_id}, {self.target_source}) at "
                f"{row}position {self.position}; F(x) = {self.f_input:.6f}, F(x') = "
                f"{self.f_baseline:.6f}; ")
        if self.shared_reference:
            return head + (
                f"one reference x' for every method ({self.baseline_description}; IG-Lens "
                f"starts at h_n(x')): total F(x) - F(x') = {self.f_input - self.f_baseline:+.6f};"
                f" n_steps = {self.n_steps}")
        return head + (f"Captum baseline: {self.baseline_description}; IG-Lens baseline: "
                       f"{self.lens_baseline}; n_steps = {self.n_steps}")

    def _footer(self) -> dict[str, list[str]]:
        footer: dict[str, list[str]] = {"sum": [], "total": [], "|sum-total|": [], "time s": []}
        for m in self.methods.values():
            footer["sum"].append(fmt(m.layer_sum, "+.6f"))
            footer["total"].append(fmt(m.total, "+.6f"))
            footer["|sum-total|"].append(fmt(m.completeness_gap, ".2e"))
            footer["time s"].append(fmt(m.wall_time_s, ".3f"))
            if m.name in CAPTUM_LAYER_METHODS:
                for values in footer.values():
                    values.append("")
        if self.shared_reference:
            del footer["total"]
        return footer

    def format_table(self) -> str:
        """The comparison as a text table.

        One row per layer, one column per method (and the Captum convergence delta of each
        layer run), then the sum over layers, each method's own total (shown once in the
        header when every method shares one reference), the completeness gap and the wall
        time per method.
        """
        cols = self._columns()
        widths = [max(12, len(label), *(len(v) for v in values)) for label, values in cols]
        first = max(11, *(len(n) for n in self.layer_names))

        def row(label: str, cells: Sequence[str]) -> str:
            pairs = zip(cells, widths, strict=True)
            return f"{label:>{first}} |" + "".join(f" {c:>{w}} |" for c, w in pairs)

        head = row("layer", [label for label, _ in cols])
        lines = [self._header(), head, "-" * len(head)]
        lines += [row(name, [values[j] for _, values in cols])
                  for j, name in enumerate(self.layer_names)]
        lines.append("-" * len(head))
        lines += [row(label, cells) for label, cells in self._footer().items()]
        lines.append(
            "|sum-total|: each method's sum over layers against the total F(x) - F(x') it "
            "decomposes; lens p: logit-lens levels, not credits."
            if self.shared_reference else
            "total: each method's own change, F(x) - F(x') for the Captum methods, "
            "Δp = f(h_n) - f(b) for IG-Lens, p for the logit lens (levels, not credits)."
        )
        lines += [self._check_line(name) for name in self.checked_methods()]
        return "\n".join(lines)

    # ---------------------------------------------------------------- completeness checks
    def checked_methods(self) -> list[str]:
        """The methods :attr:`passed` checks: IG-Lens's (``ig_lens``, ``ig_lens_gradient``).

        Captum's layer methods are not expected to add up over layers (each layer run
        decomposes the whole change); name them in :meth:`assert_complete` to see it fail.
        """
        return [name for name in self.methods if name.startswith("ig_lens")]

    def _tolerances(self, rtol: Optional[float], atol: Optional[float]
                    ) -> tuple[Optional[float], Optional[float]]:
        return (self.rtol, self.atol) if rtol is None and atol is None else (rtol, atol)

    def completeness_bound(self, name: str, rtol: Optional[float] = None,
                           atol: Optional[float] = None) -> float:
        """The bound on ``|sum over layers - total|`` of method ``name`` (probability).

        ``rtol`` / ``atol`` as given, else the report's, else the bound derived from the
        rounding of the method's credits (:func:`~captum_iglens.results._bounds.
        completeness_bound`: ``u (k sum|c| + |total|)``, ``u`` of their dtype).

        Raises:
            KeyError: ``name`` is not in the report.
            ValueError: ``name`` is a level (the logit lens), which has no sum.
        """
        m = self.methods[name]
        if not m.is_credit:
            raise ValueError(f"{name!r} holds levels, not credits: there is no sum to check.")
        rtol, atol = self._tolerances(rtol, atol)
        total = torch.tensor(m.total, dtype=torch.float64)
        return float(isclose_bound(m.per_layer, total, rtol, atol))

    def _levels(self, name: str) -> Optional[Tensor]:
        """``[f(b), f(h_L1), ...]`` of IG-Lens's path, when the logit lens ran."""
        lens = self.methods.get("logit_lens")
        if lens is None or not name.startswith("ig_lens"):
            return None
        start = lens.total - self.methods[name].total  # f(b) = f(h_n) - Δp
        return torch.cat([torch.tensor([start], dtype=torch.float64),
                          lens.per_layer.double()])

    def failures(self, methods: Optional[Sequence[str]] = None, rtol: Optional[float] = None,
                 atol: Optional[float] = None) -> list[str]:
        """One message per method whose layers do not add up to its total (empty: passed).

        Args:
            methods (sequence of str, optional): Default: :meth:`checked_methods`.
            rtol (float, optional): See :meth:`completeness_bound`.
            atol (float, optional): See :meth:`completeness_bound`.
        """
        out = []
        for name in self.checked_methods() if methods is None else methods:
            m, bound = self.methods[name], self.completeness_bound(name, rtol, atol)
            if m.completeness_gap <= bound:  # NaN fails too
                continue
            how = bound_words(*self._tolerances(rtol, atol), m.per_layer.dtype)
            row = f"row {self.row}, "
            out.append(
                f"{m.label} does not add up for target {self.target_token!r} (id "
                f"{self.target_id}, {self.target_source}) at {row}position {self.position}: "
                f"sum over layers {m.layer_sum:+.8g} vs total {m.total:+.8g}, gap "
                f"{m.completeness_gap:.3e} > bound {bound:.3e} ({how}); worst "
                f"{worst_layer(m.per_layer, self._levels(name), self.layer_names)}.")
        return out

    @property
    def passed(self) -> bool:
        """Whether every IG-Lens method adds up within its bound (:meth:`failures` empty)."""
        return not self.failures()

    def assert_complete(self, methods: Optional[Sequence[str]] = None, *,
                        rtol: Optional[float] = None, atol: Optional[float] = None) -> None:
        """Raise ``AssertionError`` unless each method's layers add up to its total.

        Args:
            methods (sequence of str, optional): Default: the IG-Lens methods
                (:meth:`checked_methods`). Naming a Captum layer method shows that its
                per-layer totals do not add up.
            rtol (float, optional): See :meth:`completeness_bound`.
            atol (float, optional): See :meth:`completeness_bound`.

        Raises:
            AssertionError: naming the method, target, position, gap, bound and the worst
                layer.
            ValueError: nothing to check (no IG-Lens method), or a level method named.
        """
        names = self.checked_methods() if methods is None else list(methods)
        if not names:
            raise ValueError("The report has no IG-Lens method to check; pass methods=[...].")
        failures = self.failures(names, rtol, atol)
        if failures:
            raise AssertionError("\n".join(failures))

    def _check_line(self, name: str) -> str:
        m, bound = self.methods[name], self.completeness_bound(name)
        verdict = "passed" if m.completeness_gap <= bound else "FAILED"
        how = bound_words(self.rtol, self.atol, m.per_layer.dtype).split(",")[0]
        return (f"check {m.label}: |sum-total| {m.completeness_gap:.2e} <= {bound:.2e} "
                f"({how}): {verdict}")

    def __str__(self) -> str:
        """The table, :meth:`format_table`."""
        return self.format_table()

    def plot(self, ax: Any = None, title: Optional[str] = None) -> Any:
        """Grouped bars per layer per method, the total they decompose, the lens levels.

        The shared total ``F(x) - F(x')`` is drawn once (each method's own total when
        IG-Lens has a baseline of its own); the logit-lens levels get a panel of their own.
        Delegates to :func:`captum_iglens.plot.credits.plot_completeness`. Returns the matplotlib
        ``Figure`` (created without pyplot's global state unless ``ax`` is given).
        """
        from captum_iglens.plot.completeness import plot_completeness

        return plot_completeness(self, ax=ax, title=title)
