"""Position-local ablation of decoder-block updates: the causal test of IG-Lens credit.

IG-Lens (arXiv:2606.29693) credits block ``L`` with what the final norm and unembedding
read out of ``h_L`` beyond the previous layer, a conditional marginal, not a causal effect.
Here the update ``u_L = h_L - h_{L-1}`` is changed at the explained position ``i`` only,
the later blocks run on the changed stream, and ``drop_L = p(y | clean) - p(y | ablated)``
at ``i`` (probability units). Three kinds: ``zero`` (``h_L[i] := h_{L-1}[i]``, the update
removed), ``mean`` (``u_L[i]`` replaced by its mean over other sequences) and ``resample``
(``u_L[i]`` from another sequence at a matching position). A causal model leaves positions
before ``i`` unchanged and ``p(y)`` at ``i`` depends on positions ``<= i`` only, so each
ablation is a single-token forward over the clean prefix's KV cache, and all ablations of a
position (``K`` kinds x ``n`` blocks, plus one clean row) run as one batched single-token
forward. An ablation of block ``L`` leaves blocks ``1..L-1`` as they were, so its row joins
the batch only after block ``L - 1``, from the clean row's residual there
(:mod:`captum_iglens.validate.ablation_rows`), instead of recomputing blocks ``1..L-1``.
``resample`` may take several donors per position; its probability is then their average.

Built-in checks, run on every call (:class:`AblationCheckError` when one fails): the clean
row reproduces the model's own probability; a cached ablation equals the same ablation
through a full-sequence hooked forward (one layer per call); and the zero-ablation drop of
the last block equals its IG-Lens credit: both are ``f(h_n) - f(h_{n-1})`` (the
telescoping of the paper's Proposition 1, last segment). The spot-checked row and the last
block's row both join the batch late, so the checks cover that too.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional, Sequence

import torch
from torch import Tensor, nn

from captum_iglens.lens.spec import LensSpec
from captum_iglens.lens.state import forward_parameters, input_device
from captum_iglens.validate.ablation_checks import AblationCheckError, AblationChecks
from captum_iglens.validate.ablation_hooks import eval_mode, target_probs
from captum_iglens.validate.ablation_rows import ResidualTrace, RowPlan, run_rows, trace_forward

__all__ = ["KINDS", "AblationCheckError", "AblationOutput", "BlockAblation", "ReferenceSetError",
           "ResidualTrace", "mean_updates"]

#: Ablation kinds, in the order :meth:`BlockAblation.ablate` reports them.
KINDS: tuple[str, ...] = ("zero", "mean", "resample")

#: Check tolerance in units of the model dtype's machine epsilon (float32: about 3.1e-5),
#: applied as ``|a - b| <= tol * (1 + |b|)`` to probabilities. Batched single-token and
#: full-sequence forwards round differently (observed up to about 4e-6 on SmolLM2).
CHECK_TOLERANCE_EPS = 256

#: Cap of the check tolerance (probability): 256 eps would be vacuous in float16 (0.25) and
#: bfloat16 (2.0); half-precision single-token and full forwards differ by about 1e-3.
CHECK_TOLERANCE_CAP = 2e-2


class ReferenceSetError(ValueError):
    """Too few reference positions for ``mean`` ablation.

    Args:
        shortfall (str): What falls short, with the counts (kept as ``shortfall``, for callers
            that name their own remedy).
        remedy (str): What to do; the message is ``"{shortfall}: {remedy}"``.
    """

    def __init__(self, shortfall: str, remedy: str) -> None:
        """See the class docstring."""
        super().__init__(f"{shortfall}: {remedy}")
        self.shortfall = shortfall


@dataclass
class AblationOutput:
    """Ablation of every block at ``P`` positions (probability units, float32 CPU tensors).

    Attributes:
        drops (dict[str, Tensor]): kind -> ``[P, n]`` ``p_clean - p_ablated``.
        p_ablated (dict[str, Tensor]): kind -> ``[P, n]`` probability after the ablation.
        p_clean (Tensor): ``[P]`` clean probability of the target (from the same batch).
        target (Tensor): ``[P]`` int64 target ids.
        positions (list[int]): the explained positions.
        layer_indices (tuple[int, ...]): ``1..n``, the ablated blocks (hidden-state indices).
        check_errors (dict[str, float]): largest absolute error of each built-in check.
        p_each (dict[str, Tensor]): kind -> ``[P, D, n]`` probability after each of its
            ``D`` replacements (``D > 1`` for ``resample`` with several donors; ``p_ablated``
            is their mean).
    """

    drops: dict[str, Tensor]
    p_ablated: dict[str, Tensor]
    p_clean: Tensor
    target: Tensor
    positions: list[int]
    layer_indices: tuple[int, ...]
    check_errors: dict[str, float]
    p_each: dict[str, Tensor] = field(default_factory=dict)


def mean_updates(traces: Sequence[ResidualTrace], min_positions: int = 200) -> Tensor:
    """Mean block update over a reference set, for ``mean`` ablation.

    Position 0 is excluded: it is an attention-sink position whose update can be hundreds
    of times larger than elsewhere.

    Args:
        traces (sequence of ResidualTrace): The reference sequences (not the explained one).
        min_positions (int, optional): Fewest positions accepted. Default: 200.

    Returns:
        Tensor: ``[n, d]`` mean of ``u_L`` over positions ``1..S-1`` of every trace, model
        dtype (accumulated in float64).

    Raises:
        ReferenceSetError: (a ValueError) if the traces hold fewer than ``min_positions``
            positions after 0.
    """
    rows = [t.updates[1:].double() for t in traces]
    count = sum(r.shape[0] for r in rows)
    if count < min_positions:
        raise ReferenceSetError(
            f"mean ablation needs at least {min_positions} reference positions (position 0 "
            f"excluded); the reference set has {count}", "give more or longer reference "
            "sequences (validate: more prompts), lower min_positions (validate: min_reference), "
            "or ablate with 'zero' or 'resample', which need no reference set.")
    return (sum(r.sum(0) for r in rows) / count).to(traces[0].hidden.dtype)  # type: ignore[union-attr]  # rows: tensors


class BlockAblation(AblationChecks):
    """Ablate each decoder block's residual update at explained positions of a causal LM.

    Args:
        model (nn.Module or LensSpec): A Hugging Face causal LM whose forward takes a KV
            cache (``cache`` or ``past_key_values``) and whose blocks
            :func:`~captum_iglens.lens.architectures.resolve_decoder_blocks` finds, or the
            :class:`~captum_iglens.lens.spec.LensSpec` of one (``IGLens(model).spec``: its
            blocks and readout are used, not located again).
        tolerance_eps (float, optional): Check tolerance in units of the model dtype's
            machine epsilon, capped at :data:`CHECK_TOLERANCE_CAP` (2e-2) for half precision.
            Default: :data:`CHECK_TOLERANCE_EPS` (about 3.1e-5 in float32).
        grow (bool, optional): Each ablation row joins the batch after block ``L - 1``
            from the clean row's residual (True), or recomputes blocks ``1..L-1`` (False,
            about 1.5 times slower). Results agree to float32 rounding. Default: True.

    Raises:
        UnknownArchitectureError: if the decoder blocks or the readout cannot be located.

    Examples::

        >>> ablation = BlockAblation(model)
        >>> trace = ablation.trace(ids)                       # ids: [S] prompt + answer
        >>> out = ablation.ablate(trace, positions=[41], target=torch.tensor([ids[42]]),
        ...                       kinds=("zero",))
        >>> out.drops["zero"].shape                           # [P, n]
    """

    def __init__(self, model: nn.Module | LensSpec,
                 tolerance_eps: float = CHECK_TOLERANCE_EPS, grow: bool = True) -> None:
        """Take the blocks and readout of the spec; see the class docstring for the arguments."""
        spec = model if isinstance(model, LensSpec) else LensSpec.from_model(model)
        self.spec = spec
        self.model = spec.model
        self.blocks = spec.decoder_blocks
        self.readout = spec.readout
        self.grow = bool(grow)
        params = forward_parameters(self.model)
        self._cache_kw = "cache" if "cache" in params else "past_key_values"
        self._can_keep = "logits_to_keep" in params
        dtype = spec.dtype
        self.tolerance = min(float(tolerance_eps) * torch.finfo(dtype).eps, CHECK_TOLERANCE_CAP)

    @property
    def num_layers(self) -> int:
        """``n``, the number of decoder blocks."""
        return len(self.blocks)

    def trace(self, input_ids: Tensor) -> ResidualTrace:
        """One clean forward: the residual stream at every position and the KV cache.

        Args:
            input_ids (Tensor): ``[S]`` or ``[1, S]`` int64 token ids.

        Returns:
            ResidualTrace: ``h_0..h_n`` ``[S, n + 1, d]`` (model dtype) and the cache.

        Raises:
            ValueError: if the model's cache does not hold all ``S`` positions (a
                sliding-window cache), which the cached ablations need.
        """
        ids = torch.as_tensor(input_ids).reshape(-1)
        with eval_mode(self.model):
            return trace_forward(self.model, self.blocks, ids, self._cache_kw, self._can_keep)

    def _device(self) -> torch.device:
        return input_device(self.model)

    def run_plan(self, trace: ResidualTrace, pos: int, plan: RowPlan, ids: Tensor) -> Tensor:
        """Run the rows of ``plan`` at ``pos``: one cached single-token forward.

        Args:
            trace (ResidualTrace): The clean forward of the sequence.
            pos (int): The position.
            plan (RowPlan): The rows and their changes of the residual stream (row 0 the
                only clean row).
            ids (Tensor): ``[T]`` int64 token ids whose probabilities are read.

        Returns:
            Tensor: ``[R, T]`` probabilities (float32; float64 for a float64 model), CPU.

        Raises:
            ValueError: a plan without exactly one clean row, row 0.
        """
        with eval_mode(self.model):
            return run_rows(self.model, self.blocks, self._cache_kw, trace, pos, plan,
                            torch.as_tensor(ids).reshape(-1), self.grow)

    def _run_position(self, trace: ResidualTrace, pos: int, target: Tensor,
                      repl: Tensor) -> Tensor:
        """Clean row + ``S x n`` ablated rows at ``pos``.

        ``repl`` is ``[S, n, d]`` (one slab per kind or donor); row ``1 + s n + (l - 1)``
        ablates block ``l`` with slab ``s``. Returns the ``[1 + S n]`` probabilities.
        """
        n_slabs, n = repl.shape[:2]
        layers = {layer: (torch.arange(n_slabs) * n + layer, repl[:, layer - 1])
                  for layer in range(1, n + 1)}
        start = torch.cat([torch.tensor([n + 1]), torch.arange(1, n + 1).repeat(n_slabs)])
        plan = RowPlan(1 + n_slabs * n, start, layers)
        return self.run_plan(trace, pos, plan, torch.as_tensor(target).reshape(1))[:, 0]

    def _replacements(self, trace: ResidualTrace, kinds: Sequence[str], n_pos: int,
                      mean_update: Optional[Tensor], resample: Optional[Tensor]
                      ) -> tuple[Tensor, dict[str, list[int]]]:
        """``[P, S, n, d]`` replacement slabs and the slabs of each kind.

        One slab per kind, ``D`` for ``resample`` with ``[P, D, n, d]`` donors.
        """
        _, n1, d = trace.hidden.shape
        shape = (n_pos, n1 - 1, d)
        parts: list[Tensor] = []
        slabs: dict[str, list[int]] = {}
        for kind in kinds:
            part = self._replacement(kind, shape, mean_update, resample)
            slabs[kind] = list(range(len(parts), len(parts) + part.shape[1]))
            parts.extend(part.to(trace.hidden).unbind(1))
        return torch.stack(parts, dim=1), slabs

    @staticmethod
    def _replacement(kind: str, shape: tuple[int, int, int], mean_update: Optional[Tensor],
                     resample: Optional[Tensor]) -> Tensor:
        """``[P, D, n, d]`` replacements of one kind (``D = 1`` but for resample donors)."""
        if kind == "zero":
            return torch.zeros(shape)[:, None]
        if kind == "mean" and mean_update is not None:
            part = torch.as_tensor(mean_update).expand(shape)
        elif kind == "resample" and resample is not None:
            part = torch.as_tensor(resample)
            part = part[:, None] if part.dim() == 3 else part
            if part.dim() == 4 and tuple(part.shape[:1] + part.shape[2:]) == shape:
                return part
        elif kind in KINDS:
            need = "mean_update [n, d]" if kind == "mean" else "resample [P, n, d]"
            raise ValueError(f"{kind} ablation needs its replacement: pass {need}.")
        else:
            raise ValueError(f"Unknown ablation kind {kind!r}: use some of {KINDS}.")
        if tuple(part.shape) != shape:
            raise ValueError(f"The {kind} replacement has shape {tuple(part.shape)}, expected "
                             f"{list(shape)} ([P, n, d]; [n, d] for mean, [P, D, n, d] for "
                             "resample donors).")
        return part[:, None]

    def ablate(self, trace: ResidualTrace, positions: Sequence[int], target: Tensor,
               kinds: Sequence[str] = KINDS, mean_update: Optional[Tensor] = None,
               resample: Optional[Tensor] = None, p_final: Optional[Tensor] = None,
               last_credit: Optional[Tensor] = None,
               spot_layer: Optional[int] = None) -> AblationOutput:
        """Ablate every block, one kind at a time, at each of ``P`` positions of ``trace``.

        Args:
            trace (ResidualTrace): From :meth:`trace` on the explained sequence.
            positions (sequence of int): Explained positions ``i`` (``0 <= i < S``).
            target (Tensor): ``[P]`` int64 token ids whose probability at ``i`` is read.
            kinds (sequence of str, optional): Some of :data:`KINDS`. Default: all three.
            mean_update (Tensor, optional): ``[n, d]`` for ``mean``, see :func:`mean_updates`.
            resample (Tensor, optional): ``[P, n, d]`` donor updates for ``resample``, or
                ``[P, D, n, d]`` for ``D`` donors (the probabilities are averaged).
            p_final (Tensor, optional): ``[P]`` IG-Lens ``p_final``, also checked if given.
                It must come from a teacher-forced forward over the whole sequence
                (``explain(..., target=ids)``, :meth:`~captum_iglens.IGLens.attribute`), not
                from a generation's recorded passes: their incremental KV cache rounds
                differently, by more than the check's tolerance on some CPUs.
            last_credit (Tensor, optional): ``[P]`` IG-Lens credit of the last block (all
                layers, default estimator), teacher-forced like ``p_final``; computed with
                :class:`~captum_iglens.IGLens` when ``None`` and ``zero`` is among the kinds.
            spot_layer (int, optional): Block of the full-sequence spot check (at the last
                position). Default: ``1 + max(positions) % n``, so that runs vary it.

        Returns:
            AblationOutput: drops ``[P, n]`` per kind, in probability units.

        Raises:
            ValueError: bad positions, targets, kinds or replacement shapes.
            AblationCheckError: a built-in check failed.
        """
        pos = [int(p) for p in positions]
        seq = trace.input_ids.shape[0]
        if not pos or any(not 0 <= p < seq for p in pos):
            raise ValueError(f"positions must be a non-empty list in 0..{seq - 1}, got {pos}.")
        target = torch.as_tensor(target).reshape(-1).long()
        if target.shape[0] != len(pos):
            raise ValueError(f"target has {target.shape[0]} ids for {len(pos)} positions.")
        repl, slabs = self._replacements(trace, kinds, len(pos), mean_update, resample)
        probs = torch.stack([self._run_position(trace, p, target[j], repl[j])
                             for j, p in enumerate(pos)]).cpu()
        n = self.num_layers
        each = probs[:, 1:].reshape(len(pos), repl.shape[1], n)
        p_each = {k: each[:, s] for k, s in slabs.items()}
        p_ablated = {k: v.mean(1) for k, v in p_each.items()}
        out = AblationOutput(
            drops={k: probs[:, :1] - v for k, v in p_ablated.items()}, p_ablated=p_ablated,
            p_clean=probs[:, 0], target=target, positions=pos,
            layer_indices=tuple(range(1, n + 1)), check_errors={}, p_each=p_each)
        spot = spot_layer if spot_layer is not None else 1 + max(pos) % n
        with eval_mode(self.model):
            self._check(out, trace, repl, spot, p_final, last_credit)
        return out

    def direct_effects(self, trace: ResidualTrace, positions: Sequence[int],
                       target: Tensor) -> Tensor:
        """Direct effect of each block, ``f(h_n) - f(h_n - u_L)``, at each position.

        The update is removed from the final residual with the later blocks frozen.

        Args:
            trace (ResidualTrace): From :meth:`trace`.
            positions (sequence of int): ``P`` positions.
            target (Tensor): ``[P]`` int64 target ids.

        Returns:
            Tensor: ``[P, n]`` float32 CPU, probability units (block ``n``: its IG-Lens credit).
        """
        target = torch.as_tensor(target).reshape(-1).long()
        rows = []
        with eval_mode(self.model):
            for j, pos in enumerate(positions):
                h_n = trace.hidden[pos, -1]
                points = torch.cat([h_n[None], h_n[None] - trace.updates[pos]])
                probs = target_probs(self.readout(points), target[j]).cpu()
                rows.append(probs[0] - probs[1:])
        return torch.stack(rows).float()
