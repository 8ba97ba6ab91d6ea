"""``assert_telescopes_like_captum``: IG-Lens's total is each Captum layer run's own total."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional, Sequence, Union

import torch
from torch import Tensor, nn

from captum_iglens._utils.typing import LayerSpec, PositionSpec, TargetSpec, is_int
from captum_iglens.lens.readout import resolve_readout
from captum_iglens.results import CAPTUM_LAYER_METHODS, CompletenessBatch, CompletenessReport
from captum_iglens.testing._bounds import readout_tolerance
from captum_iglens.testing._readout import last_residuals

__all__ = ["TelescopeCheck", "assert_telescopes_like_captum"]

_U32 = torch.finfo(torch.float32).eps / 2
_U64 = torch.finfo(torch.float64).eps / 2


@dataclass(frozen=True)
class TelescopeCheck:
    """What :func:`assert_telescopes_like_captum` checked, for further assertions.

    Attributes:
        gaps (dict[str, Tensor]): Per method (``"ig_lens"`` and each Captum layer method),
            the completeness gap ``|sum over layers - total|`` (probability, float64),
            ``[B]`` for an int position, else ``[B, P]``. IG-Lens's is rounding; a Captum
            layer method's is about ``(k - 1) |total|``, as each layer run decomposes the
            whole change.
        total (Tensor): ``F(x) - F(x')``, shaped like the gaps.
        result (CompletenessReport or CompletenessBatch): The comparison itself.
    """

    gaps: dict[str, Tensor]
    total: Tensor
    result: Union[CompletenessReport, CompletenessBatch]

    def __getitem__(self, name: str) -> Tensor:
        """``gaps[name]``."""
        return self.gaps[name]


def _total_bounds(model: nn.Module, input_ids: Tensor, reference_ids: Tensor,
                  mask: Optional[Tensor], reports: list[CompletenessReport]) -> list[float]:
    """Per report: how far IG-Lens's total may sit from a forward's, by rounding.

    IG-Lens's ``f(h_n(x)) - f(h_n(x'))`` and a forward's ``F(x) - F(x')`` read out the same
    two residuals: two readouts of each, and the float32 difference.
    """
    from captum_iglens import IGLens

    lens = IGLens(model)
    readout = resolve_readout(model)
    positions = sorted({rep.position for rep in reports})
    h_x, _ = last_residuals(lens, input_ids, mask, positions)
    h_b, _ = last_residuals(lens, reference_ids, mask, positions)
    with torch.no_grad():
        tol_x, tol_b = readout_tolerance(readout, h_x), readout_tolerance(readout, h_b)
    out = []
    for rep in reports:
        j = positions.index(rep.position)
        readouts = float(tol_x[rep.row, j, rep.target_id] + tol_b[rep.row, j, rep.target_id])
        out.append(readouts + 2 * _U32 * abs(rep["ig_lens"].total))
    return out


def _captum_totals(rep: CompletenessReport, name: str) -> tuple[Tensor, Tensor]:
    """Each layer run's own ``F(x) - F(x')`` (its sum minus its delta) and its rounding bound.

    Captum sums a run's ``N`` float32 attributions (``<= (N - 1) u sum|a|``), subtracts the
    float32 difference ``F(x) - F(x')`` (``<= u |total|``) and rounds the delta
    (``<= u |delta|``); the report's float64 sum adds ``(N - 1) u64 sum|a|``.
    """
    m = rep[name]
    if m.convergence_deltas is None or m.abs_sums is None or m.n_terms is None:
        raise ValueError(f"{name!r} carries no per-layer convergence deltas to check.")
    totals = m.per_layer.double() - m.convergence_deltas.double()
    n = torch.tensor(m.n_terms, dtype=torch.float64) - 1
    bound = (n * (_U32 + _U64) * m.abs_sums.double()
             + _U32 * (totals.abs() + m.convergence_deltas.double().abs()))
    return totals, bound


def assert_telescopes_like_captum(
    model: nn.Module,
    input_ids: Tensor,
    *,
    layers: LayerSpec,
    reference_ids: Tensor,
    n_steps: int,
    target: TargetSpec = None,
    position: PositionSpec = -1,
    attention_mask: Optional[Tensor] = None,
    methods: Sequence[str] = CAPTUM_LAYER_METHODS,
) -> TelescopeCheck:
    r"""Assert that IG-Lens decomposes exactly what each Captum layer run decomposes.

    Runs :func:`~captum_iglens.compare_completeness` (Captum's own
    ``LayerIntegratedGradients`` and ``LayerConductance``, one decoder layer at a time, on
    the same ids, reference, position and target) and asserts, at every prediction:

    - IG-Lens's credits add up to its total ``f(h_n(x)) - f(h_n(x'))`` within the float
      bound (Proposition 1 of arXiv:2606.29693);
    - that total equals every Captum layer run's own ``F(x) - F(x')`` (its attribution sum
      minus its convergence delta) within the rounding of both: two readouts of the same
      residuals (``eps sqrt(n) M``, see :func:`assert_readout_exact`) plus Captum's float32
      sum of its ``N`` attributions (``(N - 1) u sum|a|``) and its delta's roundings.

    Args:
        model (nn.Module): A Hugging Face causal LM.
        input_ids (Tensor): ``[B, S]`` int64 token ids.
        layers: Keyword-only. As for :class:`~captum_iglens.IGLens` (hidden-state indices or
            decoder blocks).
        reference_ids (Tensor): Keyword-only. ``[B, S]`` int64 reference ``x'`` (Captum's
            ``baselines``); its tokens must not have zero input embeddings.
        n_steps (int): Keyword-only. Captum's integration steps per layer run (>= 2).
        target (optional): Keyword-only. Target ids (int, ``[B]`` or ``[B, P]``); default
            the model's argmax.
        position (int or sequence of int, optional): Keyword-only. Default: -1.
        attention_mask (Tensor, optional): Keyword-only. ``[B, S]`` (left padding).
        methods (sequence of str, optional): Keyword-only. Captum layer methods to compare
            with. Default: both.

    Returns:
        TelescopeCheck: ``check[name]`` is method ``name``'s completeness gap (``[B]`` or
        ``[B, P]``, probability), ``check.total`` the shared ``F(x) - F(x')``.

    Raises:
        AssertionError: IG-Lens does not add up, or its total differs from a Captum layer
            run's (the message names the method, layer, row, position, both totals and the
            bound).
        ValueError: as :func:`~captum_iglens.compare_completeness`.

    Examples::

        >>> check = assert_telescopes_like_captum(model, ids, layers=[1, 2],
        ...                                       reference_ids=ref, n_steps=16)
        >>> assert (check["layer_integrated_gradients"] > 0.5 * check.total.abs()).all()
    """
    from captum_iglens.compare.driver import compare_completeness

    result = compare_completeness(model, input_ids, target, position, layers, reference_ids,
                                  n_steps, attention_mask, methods=["ig_lens", *methods,
                                                                    "logit_lens"])
    result.assert_complete()
    reports = [result] if isinstance(result, CompletenessReport) else list(result)
    bounds = _total_bounds(model, input_ids, reference_ids, attention_mask, reports)
    failures = [msg for rep, bound in zip(reports, bounds, strict=True)
                for msg in _differences(rep, methods, bound)]
    if failures:
        raise AssertionError(f"{len(failures)} Captum layer run(s) decompose another total "
                             "than IG-Lens:\n" + "\n".join(failures))
    return _check(result, reports, methods, is_int(position))


def _differences(rep: CompletenessReport, methods: Sequence[str], bound: float) -> list[str]:
    out = []
    ig = rep["ig_lens"].total
    for name in methods:
        totals, captum = _captum_totals(rep, name)
        err = (totals - ig).abs()
        for j in torch.nonzero(~(err <= bound + captum)).reshape(-1).tolist():
            out.append(
                f"{rep[name].label} at layer {rep.layer_names[j]} (row {rep.row}, position "
                f"{rep.position}, target id {rep.target_id}): its F(x) - F(x') = "
                f"{float(totals[j]):+.8g}, IG-Lens's total {ig:+.8g}, difference "
                f"{float(err[j]):.3e} > bound {bound + float(captum[j]):.3e}")
    return out


def _check(result: Any, reports: list[CompletenessReport], methods: Sequence[str],
           single: bool) -> TelescopeCheck:
    """The gaps and totals, ``[B]`` for an int position, else ``[B, P]``."""
    n_rows = 1 if isinstance(result, CompletenessReport) else result.n_rows
    shape = (n_rows,) if single else (n_rows, -1)

    def shaped(values: list[float]) -> Tensor:
        return torch.tensor(values, dtype=torch.float64).reshape(shape)

    gaps = {name: shaped([rep[name].completeness_gap for rep in reports])
            for name in ("ig_lens", *methods)}
    return TelescopeCheck(gaps, shaped([rep.f_input - rep.f_baseline for rep in reports]),
                          result)
