"""``assert_complete``: IG-Lens credits add up to what they decompose (Proposition 1)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

import torch
from torch import Tensor

from captum_iglens._utils.format import layer_names
from captum_iglens.results import (
    CompletenessBatch,
    CompletenessReport,
    IGLensLLMAttributionResult,
    IGLensOutput,
    IGLensResult,
)
from captum_iglens.results._bounds import bound_words, isclose_bound, worst_layer

__all__ = ["assert_complete"]


@dataclass
class _Credits:
    """Any result seen as ``N`` predictions: credits ``[N, k]`` and their totals ``[N]``."""

    attributions: Tensor
    delta_p: Tensor
    rows: list[str]
    layers: list[str]
    levels: Optional[Tensor] = None  # [N, k + 1]: f(b), f(h_L1), ..., f(h_Lk)
    extra_roundings: int = 0  # roundings beyond the credits' own (a split first column)


def _from_output(out: IGLensOutput) -> _Credits:
    batch, n_pos, k = out.attributions.shape
    rows = [f"row {b}, position {out.positions[p]}, target id {int(out.target[b, p])}"
            for b in range(batch) for p in range(n_pos)]
    levels = torch.cat([out.p_baseline[..., None], out.lens_probs], -1).reshape(-1, k + 1)
    return _Credits(out.attributions.reshape(-1, k), out.delta_p.reshape(-1), rows,
                    layer_names(out.layer_indices, out.granularity), levels)


def _from_result(res: IGLensResult) -> _Credits:
    rows = [f"answer token {t} {res.tokens[t]!r} (position {res.positions[t]})"
            for t in range(len(res.tokens))]
    levels = torch.cat([res.p_baseline[:, None], res.lens_probs], -1)
    return _Credits(res.attributions, res.delta_p, rows, res.layer_names, levels)


def _from_captum(res: Any, delta_p: Optional[Tensor]) -> _Credits:
    """Captum's ``LLMAttributionResult``: the rows of ``token_attr``.

    IG-Lens's result sets the baseline readout apart in ``baseline_attr``: it counts.
    """
    attr, layers = res.token_attr, list(res.input_tokens)
    if isinstance(res, IGLensLLMAttributionResult):
        attr = torch.cat([res.baseline_attr[:, None].to(attr.dtype), attr], -1)
        layers = ["x' (baseline readout)", *layers]
        delta_p = res.delta_p if delta_p is None else delta_p
        rows = [f"output token {t} {tok!r}" for t, tok in enumerate(res.output_tokens)]
        # the first column, credit + f(b), was rounded once more
        return _Credits(attr, torch.as_tensor(delta_p), rows, layers, extra_roundings=1)
    if attr is None or delta_p is None:
        raise TypeError("A Captum LLMAttributionResult needs token_attr and delta_p: pass "
                        "assert_complete(result, delta_p) with the [T] totals.")
    rows = [f"output token {t} {tok!r}" for t, tok in enumerate(res.output_tokens)]
    return _Credits(attr, torch.as_tensor(delta_p), rows, layers)


def _from_tensor(attr: Tensor, delta_p: Any) -> _Credits:
    if delta_p is None:
        raise TypeError("assert_complete(attributions, delta_p): a tensor of credits needs the "
                        "totals delta_p it should add up to (shaped attributions.shape[:-1]).")
    delta_p = torch.as_tensor(delta_p, dtype=torch.float64)
    if attr.dim() < 1 or tuple(delta_p.shape) != tuple(attr.shape[:-1]):
        raise ValueError(f"delta_p has shape {tuple(delta_p.shape)}, expected "
                         f"{tuple(attr.shape[:-1])} (attributions.shape[:-1]).")
    index = [tuple(ix) for ix in torch.cartesian_prod(
        *[torch.arange(n) for n in attr.shape[:-1]]).reshape(-1, attr.dim() - 1).tolist()]
    rows = [f"index {ix if len(ix) > 1 else ix[0]}" for ix in index] if index else ["index ()"]
    k = attr.shape[-1]
    return _Credits(attr.reshape(-1, k), delta_p.reshape(-1), rows,
                    [f"column {j}" for j in range(k)])


def _credits(obj: Any, delta_p: Any) -> _Credits:
    """Dispatch on the result type; ``delta_p`` overrides a result's own totals."""
    from captum.attr import LLMAttributionResult

    if isinstance(obj, IGLensOutput) and delta_p is None:
        return _from_output(obj)
    if isinstance(obj, IGLensResult) and delta_p is None:
        return _from_result(obj)
    if isinstance(obj, LLMAttributionResult):
        return _from_captum(obj, delta_p)
    if isinstance(obj, (IGLensOutput, IGLensResult)):
        return _from_tensor(obj.attributions, delta_p)
    if isinstance(obj, Tensor):
        return _from_tensor(obj, delta_p)
    raise TypeError(
        f"assert_complete takes an IGLensOutput, IGLensResult, CompletenessReport, "
        f"CompletenessBatch, LLMAttributionResult or a tensor of credits, got {type(obj)}; "
        "for attribute(..., return_convergence_delta=True) pass the attributions with "
        "delta_p, not the (attributions, delta) tuple.")


def assert_complete(
    output_or_attributions: Any,
    delta_p: Optional[Any] = None,
    *,
    rtol: Optional[float] = None,
    atol: Optional[float] = None,
) -> Optional[Tensor]:
    r"""Assert that IG-Lens credits add up to the change they decompose (Proposition 1).

    For every explained prediction ``|sum_j c_j - delta_p| <= bound``. The default bound
    follows from floating-point rounding of the credits, not from a constant:
    ``u (k sum_j |c_j| + |delta_p|)`` with ``u = eps / 2`` of the credits' dtype (float32:
    ``2**-24``), the error of ``k`` once-rounded credits summed in any order (Higham 2002,
    section 4.2). It grows with the credits and the layers, and a wrong credit (a dropped
    segment, a shifted position, a gradient estimator's discretisation) stands far above it.

    Args:
        output_or_attributions: What to check: an
            :class:`~captum_iglens.results.IGLensOutput` (``attribute_details``), an
            :class:`~captum_iglens.results.IGLensResult` (``explain``), an
            :class:`~captum_iglens.results.IGLensLLMAttributionResult`
            (``LLMIGLensAttribution``; its ``baseline_attr`` counts), a Captum
            ``LLMAttributionResult`` with ``delta_p``, a
            :class:`~captum_iglens.results.CompletenessReport` or
            :class:`~captum_iglens.results.CompletenessBatch` (their ``assert_complete``),
            or a tensor of credits ``[..., k]`` (float32 or float64, probability or nats).
        delta_p (Tensor, optional): ``[...]`` the totals, ``attributions.shape[:-1]``;
            required for a tensor, taken from the result otherwise. Predictions whose
            ``delta_p`` is NaN (ragged batches) are skipped.
        rtol (float, optional): Keyword-only. With ``atol``, ``torch.isclose``'s bound
            ``atol + rtol |delta_p|`` replaces the derived one (a ``None`` counts as 0).
        atol (float, optional): Keyword-only. See ``rtol``.

    Returns:
        Tensor or None: ``[N]`` float64 gaps ``|sum - delta_p|`` of the ``N`` predictions
        (flattened), for further assertions; ``None`` for a report.

    Raises:
        AssertionError: some prediction does not add up. The message counts them and names
            the worst (largest gap over bound): its token or (row, position, target), the
            sum, ``delta_p``, gap and bound, and the worst layer: the credit that differs
            most from its own segment's change of the lens readout (when the result carries
            the levels), else the largest credit.
        TypeError: an unsupported object, or a tensor without ``delta_p``.
        ValueError: ``delta_p`` of the wrong shape, a negative tolerance, or no prediction
            with a finite ``delta_p``.

    Examples::

        >>> out = IGLens(model).attribute_details(ids, positions=[-2, -1])
        >>> assert_complete(out)                       # derived float32 bound
        >>> attr = IGLens(model).attribute(ids)        # [B, k]
        >>> assert_complete(attr, delta_p)             # a tensor needs its totals
    """
    if isinstance(output_or_attributions, (CompletenessReport, CompletenessBatch)):
        if delta_p is not None:
            raise TypeError("A completeness report carries its totals: pass no delta_p.")
        output_or_attributions.assert_complete(rtol=rtol, atol=atol)
        return None
    c = _credits(output_or_attributions, delta_p)
    delta = c.delta_p.detach().double().cpu()
    attr = c.attributions.detach().cpu()
    gap = (attr.double().sum(-1) - delta).abs()
    bound = isclose_bound(attr, delta, rtol, atol)
    if rtol is None and atol is None and c.extra_roundings:
        u = torch.finfo(attr.dtype).eps / 2
        bound = bound + c.extra_roundings * u * attr.double().abs().sum(-1)
    valid = torch.isfinite(delta)
    if not bool(valid.any()):
        raise ValueError("No prediction to check: every delta_p is NaN.")
    bad = valid & ~(gap <= bound)  # a NaN credit fails
    if bool(bad.any()):
        ratio = torch.where(bad, (gap / bound.clamp_min(1e-300)).nan_to_num(float("inf")),
                            torch.zeros_like(gap))
        raise AssertionError(_message(c, int(ratio.argmax()), gap, bound, int(bad.sum()),
                                      int(valid.sum()), bound_words(rtol, atol, attr.dtype)))
    return gap


def _message(c: _Credits, i: int, gap: Tensor, bound: Tensor, n_bad: int, n_valid: int,
             how: str) -> str:
    levels = c.levels[i] if c.levels is not None else None
    return (f"IG-Lens credits do not add up to delta_p for {n_bad} of {n_valid} predictions. "
            f"Worst: {c.rows[i]}: sum of credits {float(c.attributions[i].double().sum()):+.8g}"
            f" vs delta_p {float(c.delta_p[i]):+.8g}, gap {float(gap[i]):.3e} > bound "
            f"{float(bound[i]):.3e} ({how}); worst "
            f"{worst_layer(c.attributions[i], levels, c.layers)}.")
