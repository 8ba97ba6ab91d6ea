"""The clean forward of the total-effect path: residual updates, KV cache, model probabilities.

One forward over the whole input records every chosen block's input and output at every
position (the updates ``u_L = h_L - h_{L-1}`` that the gates scale and the ``"mean"``
reference averages) and the KV cache that the single-position gated forwards attend to
(:mod:`captum_iglens._core.gates`); reference token ids get one more forward for their
updates at the explained positions.
"""

from __future__ import annotations

from contextlib import ExitStack
from dataclasses import dataclass
from typing import Any, Optional

import torch
from torch import Tensor

from captum_iglens._core.heads import capture_head_inputs
from captum_iglens._core.pipeline import readout_chunk
from captum_iglens._core.request import PathRequest
from captum_iglens.lens.distribution import wide_log_softmax
from captum_iglens.lens.hooks import capture_residual_stream, check_finite_residuals
from captum_iglens.lens.kv_cache import cache_tensors
from captum_iglens.lens.readout import readout_probs, readout_top_k
from captum_iglens.lens.spec import LensSpec
from captum_iglens.lens.state import forward_parameters
from captum_iglens.lens.sublayer import HalfBlockSite, capture_half_residuals

__all__ = ["CleanTrace", "check_gated_spec", "clean_trace", "lens_levels",
           "GATE_CHECK_EPS"]

#: ``F(1)`` (the gated path at ``g = 1``, single-position forward over the KV cache) must
#: reproduce the model's own probability to ``GATE_CHECK_EPS * eps * (1 + |p|)``: batched
#: single-position and full-sequence forwards round differently (the block ablation's
#: check uses the same rule, :data:`captum_iglens.validate.ablation.CHECK_TOLERANCE_EPS`).
GATE_CHECK_EPS = 256

_PASSED = {"attention_mask", "position_ids", "use_cache", "logits_to_keep"}


def check_gated_spec(spec: LensSpec, kwargs: dict) -> str:
    """Refuse what the gated path cannot do; return the forward's cache argument name.

    Raises:
        ValueError: the embedding among the chosen layers, sub-layer nodes, forward
            arguments other than the attention mask and position ids, or a forward that
            takes no KV cache.
    """
    if 0 in spec.layer_indices:
        raise ValueError(f"effect={spec.effect!r} gates decoder-block updates; hidden-state "
                         "index 0 (the embedding) is not one: choose blocks 1..n only.")
    site = spec.half_site
    if spec.granularity != "block" and (site is None or site.kind != "input"):
        raise ValueError(f"effect={spec.effect!r} gates whole blocks, or the attention and MLP "
                         "updates (and heads) of sequential blocks (granularity='sublayer'); "
                         "parallel blocks are not implemented yet: use granularity='block'.")
    extra = sorted(set(kwargs) - _PASSED)
    if extra:
        raise ValueError(f"effect={spec.effect!r} passes only the attention mask and position "
                         f"ids to its single-position forwards; got {extra}.")
    params = forward_parameters(spec.model)
    for name in ("cache", "past_key_values"):
        if name in params:
            return name
    raise ValueError(f"effect={spec.effect!r} needs a forward that takes a KV cache "
                     "(past_key_values); this model's does not.")


@dataclass
class CleanTrace:
    """The clean forward of ``B`` inputs, as the gated forwards need it.

    Attributes:
        layers (tuple of int): The ``k`` gated hidden-state indices.
        updates (Tensor): ``[B, S, k', d]`` clean updates of the gated nodes (``k' = k``
            blocks, or ``2k``: each block's attention and MLP updates).
        nodes (Tensor): ``[B, P, k', d]`` clean residuals after each gated node.
        kv (list): Per block ``(keys, values)`` ``[B, heads, S, head_dim]``.
        log_probs (Tensor): ``[B, P, V]`` the model's own log-probabilities (float32+).
        request (PathRequest): The checked inputs.
        cache_kw (str): The forward's cache argument.
        takes_position_ids (bool): Whether the forward takes ``position_ids``.
        site (HalfBlockSite, optional): Sub-layer gates' half-block site (``None``: blocks).
        reference_updates (Tensor, optional): ``[B, P, k, d]`` updates of reference ids.
        head_inputs (Tensor, optional): ``[B, S, k, H * d_head]`` each gated block's
            ``o_proj`` input (``heads=True``).
        reference_head_inputs (Tensor, optional): ``[B, P, k, H * d_head]`` those of the
            reference ids at the explained positions.
        reference_sequence_updates (Tensor, optional): ``[B, S, k, d]`` the reference ids'
            updates at every position (``scope="sequence"``).
    """

    layers: tuple[int, ...]
    updates: Tensor
    nodes: Tensor
    kv: list[tuple[Tensor, Tensor]]
    log_probs: Tensor
    request: PathRequest
    cache_kw: str
    reference_updates: Optional[Tensor] = None
    takes_position_ids: bool = True
    site: Optional[HalfBlockSite] = None
    head_inputs: Optional[Tensor] = None
    reference_head_inputs: Optional[Tensor] = None
    reference_sequence_updates: Optional[Tensor] = None

    def group_inputs(self, b: int, columns: list[int], n_points: int) -> dict:
        """Single-position forward inputs of row ``b``'s explained columns, ``n_points`` each.

        The rows of all ``columns`` share one cache, the clean prefix up to the farthest
        position ``i_max``; a row of position ``i`` masks the cached columns ``i..i_max - 1``
        out (as padding) and takes position id ``i``, so it attends to exactly its own
        prefix. Rows are ordered column-major: ``n_points`` rows per column.

        Returns:
            dict: ``token`` ``[R, 1]``, ``kv`` (per block ``[1, heads, i_max, head_dim]``),
            ``attention_mask`` ``[R, i_max + 1]`` and ``position_id`` ``[R, 1]`` (``None``
            when the forward takes no ``position_ids``).
        """
        request = self.request
        pos = torch.tensor([request.positions[j] for j in columns],
                           device=request.input_ids.device)
        last = int(pos.max())
        cols = torch.arange(last + 1, device=pos.device)
        mask = (cols[None, :] < pos[:, None]) | (cols[None, :] == last)
        if request.mask is not None:
            prefix = request.mask[b, :last + 1].to(mask.device).bool()
            mask = mask & torch.cat([prefix[:last], prefix.new_ones(1)])[None, :]
        ids = request.position_ids
        position = None
        if self.takes_position_ids:
            position = (pos if ids is None else ids[b].to(pos.device)[pos])[:, None]
        return {
            "token": request.input_ids[b, pos][:, None].repeat_interleave(n_points, 0),
            "kv": [(k[b:b + 1, :, :last], v[b:b + 1, :, :last]) for k, v in self.kv],
            "attention_mask": mask.long().repeat_interleave(n_points, 0),
            "position_id": None if position is None else position.repeat_interleave(n_points, 0),
        }

    def check_end(self, end: Tensor, ids: Tensor, log: bool, explained: Optional[Tensor],
                  verify: bool = True, strict: bool = True) -> bool:
        """Refuse ``F(1)`` ``[B, P]`` unlike the model's own ``F`` (the KV-cache path).

        Returns:
            bool: Whether it agrees (``strict=False``; ``strict=True`` raises instead).

        Raises:
            RuntimeError: naming the largest difference and its tolerance (``strict``).
        """
        if not verify:
            return True
        picked = self.log_probs.gather(-1, ids.to(self.log_probs.device)).cpu()
        own = picked if log else picked.exp()
        own = own[..., 0] if own.shape[-1] == 1 else own[..., 0] - own[..., 1]
        keep = torch.ones_like(end, dtype=torch.bool) if explained is None else explained
        err = (end - own.to(end.dtype)).abs()[keep]
        tol = GATE_CHECK_EPS * torch.finfo(end.dtype).eps * (1 + own.abs()[keep])
        if bool((err > tol).any()):
            if not strict:
                return False
            raise RuntimeError(
                f"The gated single-position forward at g = 1 gives F = p(y) off the model's "
                f"own by {float(err.max()):.3g} (tolerance {float(tol.max()):.3g}): this "
                "family's KV cache or block outputs cannot serve the total-effect path.")
        return True


def _forward(spec: LensSpec, ids: Tensor, request: PathRequest, needed: set[int],
             cache_kw: str, cache: bool) -> tuple[dict[Any, Tensor], Optional[list], Tensor]:
    """One forward of ``ids``: residuals, the KV cache (with ``cache``) and the logits.

    The residuals are ``h_l`` ``[B, S, d]``, for sub-layer gates ``L.attn`` under the key
    ``("mid", L)``, and with ``spec.heads`` ``o_proj``'s input under ``("z", L)``.
    """
    kwargs = {**request.forward_kwargs, "use_cache": cache}
    finite: dict[int, Tensor] = {}
    half: dict = {}
    layers = sorted(L for L in needed if L in spec.layer_indices)
    with ExitStack() as stack:
        stack.enter_context(torch.no_grad())
        states: dict[Any, Tensor] = stack.enter_context(capture_residual_stream(
            spec.decoder_blocks, needed, finite=finite, mask=request.mask,
            shape=tuple(ids.shape[:2]), whole=needed))
        if spec.half_site is not None:
            stack.enter_context(capture_half_residuals(spec.decoder_blocks, layers,
                                                       spec.half_site, half))
        heads: dict[int, Tensor] = {}
        if spec.heads and spec.head_site is not None:
            stack.enter_context(capture_head_inputs(spec.decoder_blocks, layers,
                                                    spec.head_site, heads))
        output = spec.model(ids, **kwargs)
    check_finite_residuals(spec.model, spec.decoder_blocks, finite)
    states.update({("mid", L): h.detach() for L, h in half.items()})
    states.update({("z", L): z.detach() for L, z in heads.items()})
    if not cache:
        return states, None, output.logits
    found = output.get(cache_kw) if cache_kw in output else output.get("past_key_values")
    try:
        kv = [(k.detach(), v.detach()) for k, v in cache_tensors(found)]
    except (TypeError, AttributeError) as err:
        raise ValueError("The model's cache is not a key-value cache of every block (a "
                         "recurrent or hybrid family?); the total-effect path needs one.") from err
    if any(k.shape[-2] != ids.shape[1] for k, _ in kv) or len(kv) != spec.num_layers:
        raise ValueError("The model's KV cache does not keep every position of every block "
                         "(a sliding-window cache?); the total-effect path needs the full "
                         "prefix.")
    return states, kv, output.logits


def _updates(states: dict, layers: tuple[int, ...], sublayer: bool) -> Tensor:
    """``[B, S, k, d]`` ``h_L - h_{L-1}``, or ``[B, S, 2k, d]`` for sub-layer gates.

    Sub-layer: the attention and MLP updates ``L.attn - h_{L-1}`` and ``h_L - L.attn`` of
    each block in turn.
    """
    if not sublayer:
        return torch.stack([states[L] - states[L - 1] for L in layers], dim=2)
    parts = []
    for L in layers:
        mid = states[("mid", L)].to(states[L])
        parts += [mid - states[L - 1], states[L] - mid]
    return torch.stack(parts, dim=2)


def _nodes(states: dict, layers: tuple[int, ...], sublayer: bool) -> list[Tensor]:
    """The gated nodes' clean residuals ``[B, S, d]`` (sub-layer: ``L.attn`` then ``h_L``)."""
    if not sublayer:
        return [states[L] for L in layers]
    return [h for L in layers for h in (states[("mid", L)].to(states[L]), states[L])]


def clean_trace(spec: LensSpec, request: PathRequest) -> CleanTrace:
    """The clean forward (and the reference ids' forward) of ``request``.

    Raises:
        ValueError: :func:`check_gated_spec`'s refusals, or a cache that drops positions.
        FloatingPointError: NaN or inf in a residual.
    """
    cache_kw = check_gated_spec(spec, request.forward_kwargs)
    layers = tuple(spec.layer_indices)
    sub = spec.granularity == "sublayer"
    needed = set(layers) | {L - 1 for L in layers}
    states, kv, logits = _forward(spec, request.input_ids, request, needed, cache_kw, True)
    pos = request.positions
    if logits.shape[1] == request.seq_len:
        logits = logits[:, pos]
    ref = ref_z = ref_all = None
    if request.reference_ids is not None:
        ref_states, _, _ = _forward(spec, request.reference_ids, request, needed, cache_kw,
                                    False)
        ref_all = _updates(ref_states, layers, sub)
        ref = ref_all[:, pos]
        if spec.heads:
            ref_z = torch.stack([ref_states[("z", L)] for L in layers], dim=2)[:, pos]
    assert kv is not None
    return CleanTrace(
        layers=layers, updates=_updates(states, layers, sub),
        nodes=torch.stack([h[:, pos] for h in _nodes(states, layers, sub)], dim=2), kv=kv,
        log_probs=wide_log_softmax(logits.detach()), request=request,
        cache_kw=cache_kw, reference_updates=ref,
        takes_position_ids="position_ids" in forward_parameters(spec.model),
        site=spec.half_site if sub else None,
        head_inputs=torch.stack([states[("z", L)] for L in layers], dim=2) if spec.heads
        else None, reference_head_inputs=ref_z, reference_sequence_updates=ref_all)


def lens_levels(spec: LensSpec, clean: CleanTrace, ids: Tensor,
                internal_batch_size: Optional[int], top_k: int
                ) -> tuple[Tensor, Tensor, Optional[tuple[Tensor, Tensor]]]:
    """The clean logit lens at the chosen blocks, and the model's argmax.

    Returns:
        (levels, argmax, top): ``F(h_L[i])`` ``[B, P, k]``, ``[B, P]`` int64, and the top
        ``top_k`` probabilities and ids ``[B, P, k, top_k]`` (``None`` for ``top_k = 0``).
    """
    nodes = clean.nodes
    batch, n_pos, k, d = nodes.shape
    chunk = readout_chunk(spec, internal_batch_size)
    flat = nodes.reshape(-1, d)
    rows = ids.to(flat.device)[:, :, None].expand(batch, n_pos, k, ids.shape[-1])
    rows = rows.reshape(-1, ids.shape[-1])
    rows = rows[:, 0] if rows.shape[-1] == 1 else rows
    levels = readout_probs(spec.readout, flat, rows, chunk,
                           log=spec.units == "log-probability").view(batch, n_pos, k).cpu()
    top = None
    if top_k:
        probs, top_ids = readout_top_k(spec.readout, flat, top_k, chunk)
        top = (probs.view(batch, n_pos, k, top_k).cpu(), top_ids.view(batch, n_pos, k, top_k)
               .cpu())
    return levels, clean.log_probs.argmax(-1).cpu(), top
