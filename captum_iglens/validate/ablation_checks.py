"""The built-in checks of :class:`captum_iglens.validate.ablation.BlockAblation` (a mixin).

Every ablation checks itself against references computed another way: the clean row against a
full-sequence forward without cache (and IG-Lens's ``p_final``), one cached ablation per call
against the same ablation through a full-sequence hooked forward, and the zero-ablation drop
of the last block against its IG-Lens credit (both ``f(h_n) - f(h_{n-1})``, the last segment
of the paper's Proposition 1, arXiv:2606.29693). :func:`compare` raises
:class:`AblationCheckError` when a difference exceeds the tolerance.
"""

from __future__ import annotations

from dataclasses import replace
from functools import cached_property
from typing import Any, Optional, Sequence

import torch
from torch import Tensor

from captum_iglens._core.entry import Forward, attribute
from captum_iglens._utils.typing import BaselineSpec
from captum_iglens.lens.layer_readout import LogitLens
from captum_iglens.lens.layers import resolve_layer_indices
from captum_iglens.lens.spec import LensSpec
from captum_iglens.results import IGLensOutput
from captum_iglens.settings import (
    DEFAULT_BASELINE,
    DEFAULT_EFFECT,
    DEFAULT_GRANULARITY,
    DEFAULT_UNITS,
    AttributionSettings,
)
from captum_iglens.validate.ablation_hooks import hooked, target_probs

__all__ = ["AblationCheckError", "AblationChecks", "compare"]


class AblationCheckError(RuntimeError):
    """A built-in consistency check of the ablation failed (the message names which)."""


def compare(name: str, value: Tensor, reference: Tensor, tolerance: float) -> float:
    """Largest ``|value - reference|``; raises unless every one is ``<= tol (1 + |ref|)``.

    Args:
        name (str): What is compared (for the message).
        value (Tensor): The cached result, any shape.
        reference (Tensor): The reference, same number of elements.
        tolerance (float): Relative-absolute tolerance (probability units).

    Returns:
        float: the largest absolute difference (inf for a non-finite one).

    Raises:
        AblationCheckError: a difference above the tolerance.
    """
    reference = torch.as_tensor(reference).detach().to("cpu", value.dtype).reshape(-1)
    err = (value.reshape(-1) - reference).abs()
    worst = float(err.max()) if bool(torch.isfinite(err).all()) else float("inf")
    if not bool((err <= tolerance * (1 + reference.abs())).all()):
        raise AblationCheckError(
            f"Ablation check failed: {name}: largest error {worst:.3g} in probability, "
            f"tolerance {tolerance:.3g}. The cached single-token forward does not "
            "reproduce this model's full forward (unsupported cache or block layout).")
    return worst


class AblationChecks:
    """The built-in checks of an ablation.

    For a class with ``spec``, ``model``, ``blocks``, ``tolerance``, ``_can_keep`` and
    ``_device()``: :class:`~captum_iglens.validate.ablation.BlockAblation`.
    """

    spec: LensSpec
    model: Any
    blocks: Any
    tolerance: float
    _can_keep: bool
    _device: Any

    def _check(self, out: Any, trace: Any, repl: Tensor, spot: int,
               p_final: Optional[Tensor], last_credit: Optional[Tensor]) -> None:
        """The three built-in checks; fills ``out.check_errors`` or raises."""
        clean, spotted = self._full_forward(trace, out, repl, spot)
        errors = out.check_errors
        errors["clean"] = self._compare("clean single-token forward vs full forward",
                                        out.p_clean, clean)
        if p_final is not None:
            errors["p_final"] = self._compare("clean single-token forward vs IG-Lens p_final",
                                              out.p_clean, p_final)
        cached = torch.cat([out.p_each[k][-1, :, spot - 1] for k in out.p_each])
        errors["spot"] = self._compare(f"cached vs full-sequence ablation of block {spot}",
                                       cached, spotted)
        if "zero" in out.drops:
            if last_credit is None:
                ids = trace.input_ids[: max(out.positions) + 1][None].to(self._device())
                details = self.credit_details(ids, out.target[None].to(ids.device),
                                              out.positions)
                last_credit = details.attributions[0, :, -1]
            errors["last_block"] = self._compare(
                "zero-ablation drop of the last block vs its IG-Lens credit",
                out.drops["zero"][:, -1], last_credit)

    @cached_property
    def credit_spec(self) -> LensSpec:
        """The lens of the checks' IG-Lens credits: ``IGLens(model)``'s, built once.

        :attr:`spec`'s model, blocks and readout (not located again) with ``IGLens``'s
        defaults: all ``n`` blocks, probability units, block nodes, the readout effect and
        the logit lens, whatever ``spec`` chose (the checks compare the last block's credit
        ``f(h_n) - f(h_{n-1})`` with its zero ablation).
        """
        spec = self.spec
        return replace(
            spec, layer_indices=resolve_layer_indices(None, spec.decoder_blocks,
                                                      spec.input_embeddings),
            units=DEFAULT_UNITS, check_readout=True, granularity=DEFAULT_GRANULARITY,
            heads=False, half_site=None, head_site=None, effect=DEFAULT_EFFECT,
            lens=LogitLens(spec.readout))

    def credit_details(self, inputs: Tensor, target: Tensor, positions: Sequence[int],
                       baselines: BaselineSpec = DEFAULT_BASELINE,
                       contrast: Optional[Tensor] = None) -> IGLensOutput:
        """IG-Lens details of :attr:`credit_spec`, as ``IGLens(model).attribute_details``.

        Args:
            inputs (Tensor): ``[B, S]`` int64 token ids, on the model's device.
            target (Tensor): ``[B, P]`` int64 target ids.
            positions (sequence of int): The ``P`` explained positions.
            baselines (optional): As :meth:`~captum_iglens.IGLens.attribute`'s. Default:
                ``"mean"``.
            contrast (Tensor, optional): ``[B, P]`` foil ids (``F = p(y) - p(foil)``).

        Returns:
            IGLensOutput: ``[B, P, n]`` credits (default estimator and steps).

        Raises:
            ValueError: as :meth:`~captum_iglens.IGLens.attribute`.
        """
        source = Forward(inputs, target, list(positions), contrast=contrast)
        return attribute(self.credit_spec, source,
                         settings=AttributionSettings(baselines=baselines))[0]

    def _full_forward(self, trace: Any, out: Any, repl: Tensor,
                      spot: int) -> tuple[Tensor, Tensor]:
        """Full-sequence hooked forward, no cache: the reference of the checks.

        Returns the clean ``p`` at every position ``[P]`` and each slab's (kind's or
        donor's) ablation of block ``spot`` at the last position ``[S]``.
        """
        last, n_kinds = out.positions[-1], repl.shape[1]
        ids = trace.input_ids[: max(out.positions) + 1][None].expand(1 + n_kinds, -1)
        keep = sorted(set(out.positions))
        kwargs = {"logits_to_keep": torch.tensor(keep)} if self._can_keep else {}
        plan = {spot: (torch.arange(1, 1 + n_kinds), repl[-1, :, spot - 1])}
        with hooked(self.blocks, plan, last):
            logits = self.model(ids.to(self._device()), use_cache=False, **kwargs).logits
        if logits.shape[1] != len(keep):
            logits = logits[:, keep]
        col = {p: c for c, p in enumerate(keep)}
        clean = target_probs(logits[0, [col[p] for p in out.positions]], out.target)
        spotted = target_probs(logits[1:, col[last]], out.target[-1])
        return clean.cpu(), spotted.cpu()

    def _compare(self, name: str, value: Tensor, reference: Tensor) -> float:
        return compare(name, value, reference, self.tolerance)
