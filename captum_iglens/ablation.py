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
position (``K`` kinds x ``n`` blocks, plus one clean row) run as one batch.

Built-in checks, run on every call (:class:`AblationCheckError` when one fails): the clean
row reproduces the model's own probability; a cached ablation equals the same ablation
through a full-sequence hooked forward (one layer per call); and the zero-ablation drop of
the last block equals its IG-Lens credit: both are ``f(h_n) - f(h_{n-1})`` (the
telescoping of the paper's Proposition 1, last segment).
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Optional, Sequence

import torch
from torch import Tensor, nn

from captum_iglens import IGLens, resolve_decoder_blocks, resolve_readout
from captum_iglens._ablation_hooks import (
    cache_tensors,
    eval_mode,
    hooked,
    make_cache,
    target_probs,
)

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


class AblationCheckError(RuntimeError):
    """A built-in consistency check of the ablation failed (the message names which)."""


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
class ResidualTrace:
    """One clean forward over a sequence of ``S`` tokens through ``n`` decoder blocks.

    Attributes:
        input_ids (Tensor): ``[S]`` int64 token ids.
        hidden (Tensor): ``[S, n + 1, d]`` residual stream ``h_0..h_n`` (``h_0`` the input of
            block 1, ``h_l`` the output of block ``l``, pre-final-norm), model dtype.
        kv (list): per block ``(keys, values)``, each ``[1, heads, S, head_dim]``.
    """

    input_ids: Tensor
    hidden: Tensor
    kv: list[tuple[Tensor, Tensor]]

    @property
    def updates(self) -> Tensor:
        """``[S, n, d]`` block updates ``u_L = h_L - h_{L-1}`` for ``L = 1..n``."""
        return self.hidden[:, 1:] - self.hidden[:, :-1]


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
    """

    drops: dict[str, Tensor]
    p_ablated: dict[str, Tensor]
    p_clean: Tensor
    target: Tensor
    positions: list[int]
    layer_indices: tuple[int, ...]
    check_errors: dict[str, float]


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
    return (sum(r.sum(0) for r in rows) / count).to(traces[0].hidden.dtype)


class BlockAblation:
    """Ablate each decoder block's residual update at explained positions of a causal LM.

    Args:
        model (nn.Module): A Hugging Face causal LM whose forward takes a KV cache
            (``cache`` or ``past_key_values``) and whose blocks :func:`resolve_decoder_blocks`
            finds.
        tolerance_eps (float, optional): Check tolerance in units of the model dtype's
            machine epsilon, capped at :data:`CHECK_TOLERANCE_CAP` (2e-2) for half precision.
            Default: :data:`CHECK_TOLERANCE_EPS` (about 3.1e-5 in float32).

    Raises:
        UnknownArchitectureError: if the decoder blocks or the readout cannot be located.

    Examples::

        >>> ablation = BlockAblation(model)
        >>> trace = ablation.trace(ids)                       # ids: [S] prompt + answer
        >>> out = ablation.ablate(trace, positions=[41], target=torch.tensor([ids[42]]),
        ...                       kinds=("zero",))
        >>> out.drops["zero"].shape                           # [P, n]
    """

    def __init__(self, model: nn.Module, tolerance_eps: float = CHECK_TOLERANCE_EPS) -> None:
        """Locate the blocks and readout; see the class docstring for the arguments."""
        self.model = model
        self.blocks = resolve_decoder_blocks(model)
        self.readout = resolve_readout(model)
        params = inspect.signature(model.forward).parameters
        self._cache_kw = "cache" if "cache" in params else "past_key_values"
        self._can_keep = "logits_to_keep" in params
        dtype = next((p.dtype for p in model.parameters() if p.is_floating_point()),
                     torch.float32)
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
        record: dict[int, Tensor] = {}
        kwargs = {"logits_to_keep": 1} if self._can_keep else {}
        with eval_mode(self.model), hooked(self.blocks, {}, 0, record):
            out = self.model(ids[None].to(self._device()), use_cache=True, **kwargs)
        cache = out.get("cache") if "cache" in out else out.get("past_key_values")
        kv = [(k.detach(), v.detach()) for k, v in cache_tensors(cache)]
        if any(k.shape[-2] != ids.shape[0] for k, _ in kv):
            raise ValueError("The model's KV cache does not keep every position (sliding-window "
                             "cache?); position-local cached ablation needs the full prefix.")
        hidden = torch.stack([record[i][0] for i in range(self.num_layers + 1)], dim=1)
        return ResidualTrace(ids, hidden, kv)

    def _device(self) -> torch.device:
        return self.model.get_input_embeddings().weight.device

    def _run_position(self, trace: ResidualTrace, pos: int, target: Tensor,
                      repl: Tensor) -> Tensor:
        """Clean row + ``K x n`` ablated rows at ``pos``: one cached single-token forward.

        ``repl`` is ``[K, n, d]``; row ``1 + k n + (l - 1)`` ablates block ``l`` with kind
        ``k``. Returns the ``[1 + K n]`` probabilities of ``target``.
        """
        n_kinds, n = repl.shape[:2]
        batch = 1 + n_kinds * n
        plan = {layer: (torch.arange(n_kinds) * n + layer, repl[:, layer - 1])
                for layer in range(1, n + 1)}
        ids = trace.input_ids[pos].reshape(1, 1).expand(batch, 1).to(self._device())
        kwargs = {}
        if pos > 0:
            kwargs[self._cache_kw] = make_cache([
                (k[:, :, :pos].expand(batch, -1, -1, -1), v[:, :, :pos].expand(batch, -1, -1, -1))
                for k, v in trace.kv])
        with hooked(self.blocks, plan, -1):
            logits = self.model(ids, use_cache=True, **kwargs).logits[:, -1]
        return target_probs(logits, target)

    def _replacements(self, trace: ResidualTrace, kinds: Sequence[str], n_pos: int,
                      mean_update: Optional[Tensor], resample: Optional[Tensor]) -> Tensor:
        """``[P, K, n, d]`` replacement updates, one ``[n, d]`` slab per kind and position."""
        _, n1, d = trace.hidden.shape
        shape = (n_pos, n1 - 1, d)
        parts = []
        for kind in kinds:
            if kind == "zero":
                part = torch.zeros(shape)
            elif kind == "mean" and mean_update is not None:
                part = torch.as_tensor(mean_update).expand(shape)
            elif kind == "resample" and resample is not None:
                part = torch.as_tensor(resample)
            elif kind in KINDS:
                need = "mean_update [n, d]" if kind == "mean" else "resample [P, n, d]"
                raise ValueError(f"{kind} ablation needs its replacement: pass {need}.")
            else:
                raise ValueError(f"Unknown ablation kind {kind!r}: use some of {KINDS}.")
            if tuple(part.shape) != shape:
                raise ValueError(f"The {kind} replacement has shape {tuple(part.shape)}, "
                                 f"expected {list(shape)} ([P, n, d]) or [n, d] for mean.")
            parts.append(part.to(trace.hidden))
        return torch.stack(parts, dim=1)

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
            resample (Tensor, optional): ``[P, n, d]`` donor updates for ``resample``.
            p_final (Tensor, optional): ``[P]`` IG-Lens ``p_final``, also checked if given.
            last_credit (Tensor, optional): ``[P]`` IG-Lens credit of the last block (all
                layers, default estimator); computed with :class:`~captum_iglens.IGLens` when
                ``None`` and ``zero`` is among the kinds.
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
        repl = self._replacements(trace, kinds, len(pos), mean_update, resample)
        with eval_mode(self.model):
            probs = torch.stack([self._run_position(trace, p, target[j], repl[j])
                                 for j, p in enumerate(pos)]).cpu()
            n = self.num_layers
            ablated = probs[:, 1:].reshape(len(pos), len(kinds), n)
            out = AblationOutput(
                drops={k: probs[:, :1] - ablated[:, j] for j, k in enumerate(kinds)},
                p_ablated={k: ablated[:, j] for j, k in enumerate(kinds)},
                p_clean=probs[:, 0], target=target, positions=pos,
                layer_indices=tuple(range(1, n + 1)), check_errors={})
            spot = spot_layer if spot_layer is not None else 1 + max(pos) % n
            self._check(out, trace, repl, spot, p_final, last_credit)
        return out

    def _check(self, out: AblationOutput, trace: ResidualTrace, repl: Tensor, spot: int,
               p_final: Optional[Tensor], last_credit: Optional[Tensor]) -> None:
        """The three built-in checks; fills ``out.check_errors`` or raises."""
        clean, spotted = self._full_forward(trace, out, repl, spot)
        errors = out.check_errors
        errors["clean"] = self._compare("clean single-token forward vs full forward",
                                        out.p_clean, clean)
        if p_final is not None:
            errors["p_final"] = self._compare("clean single-token forward vs IG-Lens p_final",
                                              out.p_clean, p_final)
        cached = torch.stack([out.p_ablated[k][-1, spot - 1] for k in out.p_ablated])
        errors["spot"] = self._compare(f"cached vs full-sequence ablation of block {spot}",
                                       cached, spotted)
        if "zero" in out.drops:
            if last_credit is None:
                ids = trace.input_ids[: max(out.positions) + 1][None].to(self._device())
                details = IGLens(self.model).attribute_details(
                    ids, target=out.target[None].to(ids.device), positions=out.positions)
                last_credit = details.attributions[0, :, -1]
            errors["last_block"] = self._compare(
                "zero-ablation drop of the last block vs its IG-Lens credit",
                out.drops["zero"][:, -1], last_credit)

    def _full_forward(self, trace: ResidualTrace, out: AblationOutput, repl: Tensor,
                      spot: int) -> tuple[Tensor, Tensor]:
        """Full-sequence hooked forward, no cache: the reference of the checks.

        Returns the clean ``p`` at every position ``[P]`` and each kind's ablation of block
        ``spot`` at the last position ``[K]``.
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
        reference = torch.as_tensor(reference).detach().to("cpu", value.dtype).reshape(-1)
        err = (value.reshape(-1) - reference).abs()
        worst = float(err.max()) if bool(torch.isfinite(err).all()) else float("inf")
        if not bool((err <= self.tolerance * (1 + reference.abs())).all()):
            raise AblationCheckError(
                f"Ablation check failed: {name}: largest error {worst:.3g} in probability, "
                f"tolerance {self.tolerance:.3g}. The cached single-token forward does not "
                "reproduce this model's full forward (unsupported cache or block layout).")
        return worst

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
