"""Total-effect credits: each block's exact share of ``p(y|x) - p(y | updates at reference)``.

IG-Lens's readout credit of block ``L`` is ``f(h_L) - f(h_{L-1})`` (arXiv:2606.29693,
Proposition 1): what the final norm and unembedding read out of ``h_L`` beyond ``h_{L-1}``.
The *total effect* asks what block ``L`` causes through the blocks above it. A gate ``g_L``
on each chosen block's update at the explained position ``i`` (:mod:`~._core.gates`) makes
``F(g)`` the model's own ``p(y)`` at ``i`` with every update at ``g`` between its reference
(``g = 0``, :mod:`~._core.total_refs`) and its clean value (``g = 1``); integrating
``dF/dg`` along ``g = a * 1`` credits each block, and the credits add up to ``F(1) - F(0)``
(:mod:`~._core.total_split`). ``effect="atp"`` returns attribution patching's first-order
estimate ``dF/dg_L`` at ``g = 1`` instead, which does not add up.

Cost: one clean forward with its KV cache, then single-position forwards and backwards over
the cached prefix: ``n_steps + 1`` rows per explained position for the exact split,
``n_steps + 2`` for the gradient estimators, 2 for ``"atp"``; the rows of several positions
of one input share a forward (each row masks the cached columns at and after its own
position), up to ``internal_batch_size`` rows (default :data:`GATE_ROWS`).
"""

from __future__ import annotations

from typing import Any, Optional

import torch
from torch import Tensor

from captum_iglens._core.estimators import is_exact
from captum_iglens._core.gates import GateRows, gated_values, sequence_gated_values
from captum_iglens._core.request import PathRequest
from captum_iglens._core.sublayer_gates import HeadProbe
from captum_iglens._core.targets import normalise_contrast, normalise_target
from captum_iglens._core.total_clean import CleanTrace, clean_trace, lens_levels
from captum_iglens._core.total_refs import reference_updates, sequence_references
from captum_iglens._core.total_split import gradient_credits, path_points, split_steps
from captum_iglens._utils.typing import BaselineSpec, PositionSpec, TargetSpec
from captum_iglens.lens.spec import LensSpec
from captum_iglens.lens.state import model_state_preserved
from captum_iglens.results import IGLensOutput
from captum_iglens.settings import (
    DEFAULT_EFFECT,
    DEFAULT_METHOD,
    DEFAULT_N_STEPS,
    DEFAULT_SCOPE,
    SCOPES,
)

__all__ = ["GATE_ROWS", "SCOPES", "check_gate_options", "grad_drop_estimate", "run_total"]


#: Gated rows per single-position forward when ``internal_batch_size`` is not given (a
#: group of explained positions shares one forward and one read of the weights).
GATE_ROWS = 256



def _split(values: Tensor, grads: Tensor, method: str, effect: str, alphas: Tensor,
           weights: Tensor, heads: Optional[Tensor] = None
           ) -> tuple[Tensor, Tensor, Tensor, Optional[Tensor]]:
    """Credits ``[k]``, ``F(0)``, ``F(1)`` and head credits ``[A, H + 1]`` of one position.

    ``heads`` ``[N, A, H + 1]`` are the head gates' gradients at the path points (the rest
    last); the exact split shares each step's attention credit among them by the same rule
    as the step's change among the nodes, so they add up to the attention credits.
    """
    if effect == "atp":
        return (grads[0].to(values.dtype), values[1], values[0],
                None if heads is None else heads[0])
    if is_exact(method):
        wide = values.double()
        steps = split_steps(wide[1:] - wide[:-1], grads, alphas.to(values.device))  # [T, k']
        split = None if heads is None else split_steps(
            steps[:, 0::2], heads, alphas.to(values.device)).sum(0)
        return steps.sum(0).to(values.dtype), values[0], values[-1], split
    split = None if heads is None else gradient_credits(
        heads.flatten(1), weights).view(heads.shape[1:])
    return gradient_credits(grads, weights).to(values.dtype), values[-2], values[-1], split


def _group_credits(spec: LensSpec, clean: CleanTrace, b: int, columns: list[int],
                   refs: Tensor, ids: Tensor, alphas: Tensor, head_refs: Optional[Tensor],
                   drop: Optional[Tensor] = None) -> tuple[Tensor, Tensor, Optional[Tensor]]:
    """``F`` ``[C, N]``, ``dF/dg`` ``[C, N, k]`` and the head gates' ``[C, N, A, H + 1]``.

    Row ``b``'s ``C`` columns, one forward.
    """
    n_points, k = alphas.shape[0], refs.shape[2]
    gate_dtype = spec.dtype if spec.dtype.is_floating_point else torch.float32
    gates = alphas.to(device=refs.device, dtype=gate_dtype)[:, None].expand(n_points, k)
    rows = GateRows(gates.repeat(len(columns), 1),
                    refs[b, columns].repeat_interleave(n_points, 0),
                    ids[b, columns].repeat_interleave(n_points, 0),
                    spec.units == "log-probability")
    probe = None
    if head_refs is not None and spec.head_site is not None:
        z_ref = head_refs[b, columns].repeat_interleave(n_points, 0)
        probe = HeadProbe(spec.head_site, z_ref,
                          refs.new_zeros(z_ref.shape[0], z_ref.shape[1], refs.shape[-1]))
    inputs = clean.group_inputs(b, columns, n_points)
    values, grads = gated_values(
        spec.model, spec.decoder_blocks, clean.layers, rows, token=inputs["token"],
        kv=inputs["kv"], cache_kw=clean.cache_kw, attention_mask=inputs["attention_mask"],
        position_id=inputs["position_id"], site=clean.site, probe=probe,
        drop=None if drop is None else drop.repeat(len(columns), 1))
    assert grads is not None
    head_grads = None
    if probe is not None:
        assert probe.grads is not None
        head_grads = probe.grads.view(len(columns), n_points, *probe.grads.shape[1:])
    return (values.view(len(columns), n_points), grads.view(len(columns), n_points, k),
            head_grads)


def _grad_drop_points(n_blocks: int) -> tuple[Tensor, Tensor, Tensor]:
    """AtP*'s rows: ``g = 1``, ``g = 0``, then ``g = 1`` with block ``l``'s gradient dropped.

    Returns:
        (alphas, weights, drop): ``[n + 2]`` float64 twice and ``[n + 2, n]`` bool.
    """
    alphas = torch.ones(n_blocks + 2, dtype=torch.float64)
    alphas[1] = 0.0
    drop = torch.zeros(n_blocks + 2, n_blocks, dtype=torch.bool)
    drop[2:] = torch.eye(n_blocks, dtype=torch.bool)
    return alphas, torch.zeros_like(alphas), drop


def grad_drop_estimate(grads: Tensor, node_blocks: Tensor) -> Tensor:
    """AtP* GradDrop, ``1/(n-1) sum_{l != block(node)} |AtP_{-l}(node)|`` (Kramar et al. 2024).

    Eq. 11 of arXiv:2403.00745: ``AtP_{-l}`` is attribution patching with the gradient through
    block ``l``'s computation dropped (it flows through the residual skip only).

    Args:
        grads (Tensor): ``[n, ..., k]`` the nodes' ``dF/dg`` at ``g = 1`` with block ``l``'s
            gradient dropped in row ``l`` (``n`` decoder blocks).
        node_blocks (Tensor): ``[k]`` int64 each node's own block (0-based); its own block's
            row is left out (the paper's convention: dropping the node's own layer zeroes
            its estimate, hence ``n - 1``).

    Returns:
        Tensor: ``[..., k]`` float64, nonnegative (an estimate of ``|drop|``, not signed).
    """
    n = grads.shape[0]
    own = torch.arange(n)[:, None] == node_blocks.cpu()[None, :]          # [n, k]
    own = own.view(n, *([1] * (grads.dim() - 2)), -1).to(grads.device)
    return (grads.double().abs() * own.logical_not()).sum(0) / (n - 1)


def _credits(spec: LensSpec, clean: CleanTrace, refs: Tensor, ids: Tensor, method: str,
             n_steps: int, effect: str, explained: Optional[Tensor], rows_per_forward: int,
             head_refs: Optional[Tensor] = None, grad_drop: bool = False
             ) -> tuple[Tensor, Tensor, Tensor, Optional[Tensor]]:
    """``[B, P, k]`` credits, ``[B, P]`` ``F(0)`` and ``F(1)`` (NaN where not explained).

    With ``head_refs`` (``[B, P, A, H * d_head]`` reference ``o_proj`` inputs) also the head
    credits ``[B, P, A, H + 1]`` (the rest last). ``grad_drop`` (``effect="atp"`` only):
    AtP*'s GradDrop estimates (:func:`grad_drop_estimate`).
    """
    alphas, weights = path_points(method, n_steps, effect)
    drop = None
    n_blocks = len(spec.decoder_blocks)
    if grad_drop:
        alphas, weights, drop = _grad_drop_points(n_blocks)
        layers = torch.tensor(clean.layers) - 1
        node_blocks = layers if refs.shape[2] == len(layers) else layers.repeat_interleave(2)
    batch, n_pos = ids.shape[:2]
    dtype = torch.float64 if spec.dtype == torch.float64 else torch.float32
    credits = torch.full((batch, n_pos, refs.shape[2]), float("nan"), dtype=dtype)
    start = torch.full((batch, n_pos), float("nan"), dtype=dtype)
    end = start.clone()
    heads = None
    if head_refs is not None and spec.head_site is not None:
        heads = torch.full((batch, n_pos, head_refs.shape[2], spec.head_site.n_heads + 1),
                           float("nan"), dtype=dtype)
    per_group = max(1, rows_per_forward // alphas.shape[0])
    for b in range(batch):
        todo = [j for j in range(n_pos) if explained is None or bool(explained[b, j])]
        for first in range(0, len(todo), per_group):
            columns = todo[first:first + per_group]
            values, grads, head_grads = _group_credits(spec, clean, b, columns, refs, ids,
                                                       alphas, head_refs, drop)
            for c, j in enumerate(columns):
                got = _split(values[c], grads[c], method, effect, alphas, weights,
                             None if head_grads is None else head_grads[c])
                if grad_drop:
                    got = (grad_drop_estimate(grads[c, 2:], node_blocks).to(values.dtype),
                           got[1], got[2], None if head_grads is None else
                           grad_drop_estimate(head_grads[c, 2:].transpose(1, 2), layers).T)
                credits[b, j], start[b, j], end[b, j] = (t.cpu() for t in got[:3])
                if heads is not None and got[3] is not None:
                    heads[b, j] = got[3].cpu().to(dtype)
    return credits, start, end, heads


def _sequence_credits(spec: LensSpec, clean: CleanTrace, baselines: object, ids: Tensor,
                      method: str, n_steps: int, effect: str, explained: Optional[Tensor],
                      rows_per_forward: int) -> tuple[Tensor, Tensor, Tensor]:
    """:func:`_credits` with every position's updates gated (``scope="sequence"``).

    For each explained position ``i``, the path points run as full forwards of the prefix
    ``x[:i+1]`` (up to ``rows_per_forward`` rows per forward), each block's update at every
    prefix position gated by the block's one gate.
    """
    request = clean.request
    refs, defined = sequence_references(baselines, clean.updates,
                                        clean.reference_sequence_updates, request.mask,
                                        request.position_ids)
    alphas, weights = path_points(method, n_steps, effect)
    batch, n_pos = ids.shape[:2]
    k = refs.shape[2]
    dtype = torch.float64 if spec.dtype == torch.float64 else torch.float32
    gate_dtype = spec.dtype if spec.dtype.is_floating_point else torch.float32
    credits = torch.full((batch, n_pos, k), float("nan"), dtype=dtype)
    start = torch.full((batch, n_pos), float("nan"), dtype=dtype)
    end = start.clone()
    kept = {name: v for name, v in request.forward_kwargs.items() if name != "logits_to_keep"}
    for b in range(batch):
        for j, pos in enumerate(request.positions):
            if explained is not None and not bool(explained[b, j]):
                continue
            prefix = {name: v[b:b + 1, :pos + 1] if isinstance(v, Tensor) and v.dim() == 2
                      else v for name, v in kept.items()}
            values, grads = [], []
            for first in range(0, alphas.shape[0], rows_per_forward):
                part = alphas[first:first + rows_per_forward]
                gates = part.to(device=refs.device, dtype=gate_dtype)[:, None].expand(-1, k)
                rows = GateRows(gates, refs.new_zeros(0), ids[b, j][None].expand(
                    part.shape[0], -1), spec.units == "log-probability")
                v, g = sequence_gated_values(
                    spec.model, spec.decoder_blocks, clean.layers, rows,
                    input_ids=request.input_ids[b:b + 1, :pos + 1],
                    references=refs[b, :pos + 1].transpose(0, 1), defined=defined[b, :pos + 1],
                    forward_kwargs=prefix)
                values.append(v)
                grads.append(g)
            got = _split(torch.cat(values), torch.cat(grads), method, effect, alphas, weights)
            credits[b, j], start[b, j], end[b, j] = (t.cpu() for t in got[:3])
    return credits, start, end


def _targets(clean: CleanTrace, request: PathRequest, target: TargetSpec,
             contrast: TargetSpec) -> tuple[Tensor, Optional[Tensor], Tensor]:
    """Target ids ``[B, P]``, foil ids (or ``None``) and the ids each row reads ``[B, P, 1|2]``."""
    log_probs = clean.log_probs
    tgt = normalise_target(target, log_probs.shape[0], len(request.positions),
                           log_probs.argmax(-1), log_probs.shape[-1])
    foil = normalise_contrast(contrast, tgt, request.positions, log_probs.shape[-1],
                              request.explained)
    ids = tgt[..., None] if foil is None else torch.stack([tgt, foil], dim=-1)
    return tgt, foil, ids


def check_gate_options(spec: LensSpec, scope: str, grad_drop: bool,
                       method: str = DEFAULT_METHOD, n_steps: int = DEFAULT_N_STEPS) -> None:
    """Refuse a ``scope``, ``grad_drop``, ``method`` or ``n_steps`` ``spec``'s lens ignores.

    A ``method`` or ``n_steps`` away from its default counts as given: attribution patching
    (``effect="atp"``) is first-order and uses neither, so one given with it is refused
    rather than silently ignored.

    Raises:
        ValueError: ``scope`` not one of :data:`SCOPES`; ``scope="sequence"`` for a readout
            lens (it has no gates) or at sub-layer or head granularity; ``grad_drop``
            without ``effect="atp"`` at position scope on a model of >= 2 blocks;
            ``effect="atp"`` with a ``method`` or ``n_steps`` away from its default.
    """
    if spec.effect == "atp" and (method != DEFAULT_METHOD or n_steps != DEFAULT_N_STEPS):
        given = ", ".join(f"{name}={value!r}" for name, value, default in (
            ("method", method, DEFAULT_METHOD), ("n_steps", n_steps, DEFAULT_N_STEPS))
            if value != default)
        raise ValueError(f"effect='atp' was given {given}: AtP "
                         "is first-order (one backward pass) and takes no estimator or "
                         "steps; leave both out, or use effect='total'.")
    if scope not in SCOPES:
        raise ValueError(f"scope must be one of {SCOPES}, got {scope!r}.")
    if grad_drop and (spec.effect != "atp" or scope != DEFAULT_SCOPE
                      or len(spec.decoder_blocks) < 2):
        raise ValueError("grad_drop (AtP*'s GradDrop) modifies attribution patching: use it "
                         "with effect='atp', scope='position' and a model of >= 2 blocks.")
    if scope != DEFAULT_SCOPE and spec.effect == DEFAULT_EFFECT:
        raise ValueError(f"scope={scope!r} says where a total-effect lens's gates act; a "
                         "readout lens (effect='readout') has none: build the lens with "
                         "effect='total' or 'atp', or leave scope='position'.")
    if scope == "sequence" and spec.granularity != "block":
        raise ValueError("scope='sequence' gates whole blocks at every position; sub-layer "
                         "and head gates are position-scope only: use granularity='block' "
                         "or scope='position'.")


def run_total(
    spec: LensSpec, inputs: Tensor, baselines: BaselineSpec, target: TargetSpec,
    additional_forward_args: Any, n_steps: int, method: str,
    internal_batch_size: Optional[int], positions: PositionSpec, top_k: int = 0,
    contrast: TargetSpec = None, explained: Optional[Tensor] = None,
    scope: str = DEFAULT_SCOPE, grad_drop: bool = False,
) -> tuple[IGLensOutput, bool]:
    """Total-effect (or attribution-patching) credits of ``spec``'s chosen blocks.

    Arguments are those of :meth:`~captum_iglens.IGLens.attribute_details`; ``baselines``
    names the reference (``"mean"``, ``"zero"`` or reference token ids) and ``method`` the
    estimator (``"prediction_aware"``: the exact step split). ``internal_batch_size`` is
    the number of gated rows per single-position forward (default :data:`GATE_ROWS`) and
    the readout chunk of the clean logit-lens levels; ``top_k`` acts on those levels.
    ``scope`` (one of :data:`SCOPES`): ``"position"`` gates the updates at the explained
    position ``i`` only (single-position forwards over the clean KV cache);
    ``"sequence"`` gates every block's update at every position up to ``i`` with the
    block's one gate (full forwards of the prefix, ``n_steps + 1`` rows each: about
    ``i + 1`` times the cost; block granularity only; the ``"mean"`` reference leaves
    each document's first two positions ungated, :func:`~captum_iglens._core.total_refs.
    sequence_references`). ``grad_drop`` (with ``effect="atp"``, position scope): AtP*'s
    GradDrop (Kramar et al. 2024, Section 3.1.2, eq. 11), nonnegative estimates of each
    node's ``|drop|`` from ``n`` more backward rows, ``method="atp*"``
    (:func:`grad_drop_estimate`).

    Returns:
        (output, single): ``output.attributions`` ``[B, P, k]`` (probability units unless
        ``spec.units`` says nats), ``p_final = F(1)``, ``p_baseline = F(0)``,
        ``lens_probs`` the clean logit lens ``f(h_L[i])``; ``effect``, ``method`` and
        ``n_steps`` recorded.

    Raises:
        ValueError: as :meth:`~captum_iglens.IGLens.attribute`, plus a reference that is
            not one (:func:`~captum_iglens._core.total_refs.reference_updates`) and
            :func:`~captum_iglens._core.total_clean.clean_trace`'s refusals.
        RuntimeError: the gated forward at ``g = 1`` does not reproduce the model's own
            probability (a family whose KV cache cannot serve single-position forwards).
    """
    check_gate_options(spec, scope, grad_drop)
    request = PathRequest.parse(spec, inputs, positions, baselines, additional_forward_args,
                                explained)
    with model_state_preserved(spec.model):
        clean = clean_trace(spec, request)
        tgt, foil, ids = _targets(clean, request, target, contrast)
        refs, name = reference_updates(baselines, clean.updates, clean.reference_updates,
                                       request.positions, request.mask, request.position_ids)
        head_refs = None
        if clean.head_inputs is not None:
            head_refs, _ = reference_updates(baselines, clean.head_inputs,
                                             clean.reference_head_inputs, request.positions,
                                             request.mask, request.position_ids)
        log, check = spec.units == "log-probability", spec.check_readout
        if scope == "sequence":
            credits, start, end = _sequence_credits(
                spec, clean, baselines, ids, method, n_steps, spec.effect, request.explained,
                internal_batch_size or GATE_ROWS)
            return _output(spec, clean, request, credits, start, end, None, ids, tgt, foil,
                           name, internal_batch_size, top_k, method, n_steps), request.single
        credits, start, end, heads = _credits(
            spec, clean, refs, ids, method, n_steps, spec.effect, request.explained,
            internal_batch_size or GATE_ROWS, head_refs, grad_drop)
        if not clean.check_end(end, ids, log, request.explained, check, strict=False):
            # families whose attention reads absolute cache columns (local windows, some
            # ALiBi layouts) cannot share a forward across positions: one position each
            credits, start, end, heads = _credits(spec, clean, refs, ids, method, n_steps,
                                                  spec.effect, request.explained, 1,
                                                  head_refs, grad_drop)
    out = _output(spec, clean, request, credits, start, end, heads, ids, tgt, foil, name,
                  internal_batch_size, top_k, "atp*" if grad_drop else method, n_steps)
    return out, request.single


def _output(spec: LensSpec, clean: CleanTrace, request: PathRequest, credits: Tensor,
            start: Tensor, end: Tensor, heads: Optional[Tensor], ids: Tensor, tgt: Tensor,
            foil: Optional[Tensor], name: str, internal_batch_size: Optional[int],
            top_k: int, method: str, n_steps: int) -> IGLensOutput:
    """The :class:`IGLensOutput` of the credits, ``F(1)`` checked against the model's own."""
    log, check = spec.units == "log-probability", spec.check_readout
    levels, argmax, top = lens_levels(spec, clean, ids, internal_batch_size, top_k)
    clean.check_end(end, ids, log, request.explained, check)
    top_probs, top_ids = top if top is not None else (None, None)
    return IGLensOutput(
        attributions=credits, convergence_delta=credits.double().sum(-1).to(credits.dtype)
        - (end - start), lens_probs=levels, p_final=end, p_baseline=start,
        target=tgt, positions=request.positions, layer_indices=spec.node_indices,
        granularity=spec.granularity,
        baseline=name, model_argmax=argmax, units=spec.units, contrast=foil,
        effect=spec.effect,
        method=method if method == "atp*" or spec.effect != "atp" else "atp",
        n_steps=1 if spec.effect == "atp" else int(n_steps),
        top_k_probs=top_probs, top_k_ids=top_ids,
        head_credits=None if heads is None else heads[..., :-1],
        head_rest=None if heads is None else heads[..., -1])
