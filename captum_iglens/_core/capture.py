"""One forward pass turned into IG-Lens paths: residuals, baseline, targets, model probs.

For every explained position the path nodes are the baseline ``b`` and the residuals
``h_{L_1}, ..., h_{L_k}`` (pre-final-norm); the model's own probability of each target (and
of each foil, for contrastive targets) is kept for the readout check (Invariant R).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence

import torch
from torch import Tensor

from captum_iglens._core.baseline_rows import baseline_row
from captum_iglens._core.baselines import residual_baseline
from captum_iglens._core.estimators import PathNodes
from captum_iglens._core.request import PathRequest
from captum_iglens._core.targets import normalise_contrast, normalise_target
from captum_iglens._utils.typing import BaselineSpec, TargetSpec
from captum_iglens.lens.hooks import forward_with_capture
from captum_iglens.lens.readout import ModelDistribution
from captum_iglens.lens.spec import LensSpec

__all__ = ["PathCapture", "capture_path", "paths_from_states", "recorded_layers"]


@dataclass(frozen=True)
class PathCapture:
    """The IG-Lens paths of one forward pass (frozen: stages build new ones with ``replace``).

    Attributes:
        path (PathNodes): nodes ``[B, P, k + 1, d]`` (baseline first), targets ``[B, P]``
            and foils ``[B, P]`` (contrastive targets only).
        model_probs (Tensor): ``[B, P]`` float32 ``softmax(model logits)[target]``;
            ``[B, P, 2]`` (target, foil) when contrastive.
        model_argmax (Tensor): ``[B, P]`` int64, the model's own top token at each position.
        positions (list[int]): The ``P`` explained positions (non-negative).
        single (bool): Whether one int position was asked for.
        baseline (str): What the paths start from.
        reference (ModelDistribution, optional): The model's own next-token distribution
            ``[B, P, V]`` at the explained positions, for the readout check.
        explained (Tensor, optional): ``[B, P]`` bool on the CPU: the pairs to read out
            (``None``: all).
    """

    path: PathNodes
    model_probs: Tensor
    model_argmax: Tensor
    positions: list[int]
    single: bool
    baseline: str
    reference: Optional[ModelDistribution] = None
    explained: Optional[Tensor] = None

    def select(self, explained: Tensor) -> PathCapture:
        """The pairs where ``explained [B, P]`` (bool) is True, as one row: ``B = 1``, ``P = N``.

        Row-major order; ``positions`` lists each pair's position.
        """
        def pick(tensor: Tensor) -> Tensor:
            return tensor[explained.to(tensor.device)][None]

        path = self.path
        reference = self.reference
        if reference is not None:
            reference = ModelDistribution(pick(reference.log_probs), pick(reference.logit_max))
        return PathCapture(
            path=PathNodes(pick(path.nodes), pick(path.target), path.log,
                           None if path.contrast is None else pick(path.contrast)),
            model_probs=pick(self.model_probs), model_argmax=pick(self.model_argmax),
            positions=[self.positions[c] for c in explained.nonzero()[:, 1].tolist()],
            single=False, baseline=self.baseline, reference=reference,
        )


def _model_distribution(logits: Tensor, request: PathRequest,
                        device: Optional[torch.device]) -> ModelDistribution:
    """The model's own distribution ``[B, P, V]`` at the explained positions.

    Raises:
        ValueError: the model returned logits at another number of positions than it was
            asked for (a forward that keeps logits its own way).
    """
    kept = request.logit_positions or tuple(range(request.seq_len))
    if logits.shape[1] != len(kept):
        count = logits.shape[1]
        raise ValueError(
            f"The model returned logits at {count} position{'s' * (count != 1)} of the "
            f"{request.seq_len}-token input, but IG-Lens asked for {len(kept)} (positions "
            f"{list(kept)[:6]}): it needs the model's own logits at the explained positions "
            f"{request.positions[:6]} (the default targets and the readout check read them). "
            "The forward keeps logits its own way, ignoring the logits_to_keep IG-Lens "
            "passes: make it return the logits of every position, or of those logits_to_keep "
            "names.")
    if kept != tuple(request.positions):
        where = {pos: col for col, pos in enumerate(kept)}
        logits = logits[:, [where[pos] for pos in request.positions]]
    return ModelDistribution.from_logits(logits.to(device) if device is not None else logits)


def _model_probs(log_probs: Tensor, path: PathNodes) -> Tensor:
    """The model's probability of each target ``[B, P]`` (and foil: ``[B, P, 2]``)."""
    ids = path.ids if path.contrast is not None else path.target[..., None]
    probs = log_probs.gather(-1, ids).exp()
    return probs if path.contrast is not None else probs[..., 0]


def capture_path(spec: LensSpec, request: PathRequest, *, target: TargetSpec,
                 baselines: BaselineSpec, contrast: TargetSpec = None) -> PathCapture:
    """Run the model once (twice with reference ids) and build the paths.

    Args:
        spec (LensSpec): The lens: model, decoder blocks, readout, chosen layers.
        request (PathRequest): The checked inputs (:meth:`PathRequest.parse`).
        target: Target ids, as :meth:`~captum_iglens.IGLens.attribute` takes them.
        baselines: The baseline, as :meth:`~captum_iglens.IGLens.attribute` takes it.
        contrast: Foil ids or ``None``. With ``request.explained``, only those pairs need
            a foil unlike the target.

    Raises:
        ValueError, TypeError: bad targets, foils or baselines (see
            :mod:`captum_iglens._core.targets` and :mod:`captum_iglens._core.baselines`).
        FloatingPointError: NaN or inf in a residual.
        ResidualShapeError: a decoder block's output is not a ``[B, S, d]`` residual stream.
    """
    inputs, pos_list, kwargs = request.input_ids, request.positions, request.forward_kwargs
    needed, whole = recorded_layers(spec.layer_indices, baselines)
    device = spec.readout_device
    states, logits = forward_with_capture(spec.model, spec.decoder_blocks, inputs, kwargs,
                                          needed, device, request.mask, pos_list, whole)
    dist = _model_distribution(logits, request, device)
    base = None
    if request.reference_ids is not None:
        last = spec.num_layers
        ref_states, _ = forward_with_capture(spec.model, spec.decoder_blocks,
                                             request.reference_ids, kwargs, {last}, device,
                                             request.mask, pos_list)
        base = ref_states[last]
    return paths_from_states(
        states, dist, layer_indices=spec.layer_indices, positions=pos_list, mask=request.mask,
        target=target, contrast=contrast, baselines=baselines, explained=request.explained,
        seq_len=request.seq_len, single=request.single, base=base,
        position_ids=request.position_ids)


def recorded_layers(layer_indices: Sequence[int],
                    baselines: BaselineSpec) -> tuple[set[int], set[int]]:
    """The hidden-state indices to record, and those needed at every position.

    The chosen layers, plus what a named baseline reads (``h_0`` for ``"embedding"``, ``h_1``
    at every position for ``"mean"``); the others are needed at the explained positions only.
    """
    needed = set(layer_indices)
    row = baseline_row(baselines)
    reads = row.reads if row is not None else None
    whole = {reads} if reads is not None and row is not None and row.prefix else set()
    if reads is not None:
        needed.add(reads)
    return needed, whole


def paths_from_states(
    states: dict[int, Tensor],
    dist: ModelDistribution,
    *,
    layer_indices: Sequence[int],
    positions: list[int],
    mask: Optional[Tensor],
    target: TargetSpec,
    contrast: TargetSpec,
    baselines: BaselineSpec,
    explained: Optional[Tensor],
    seq_len: int,
    single: bool = False,
    base: Optional[Tensor] = None,
    position_ids: Optional[Tensor] = None,
) -> PathCapture:
    """The IG-Lens paths from residuals recorded in a forward pass (or while generating).

    Args:
        states (dict[int, Tensor]): ``{l: h_l}``, ``[B, P, d]`` at the explained positions,
            ``[B, S, d]`` for the indices :func:`recorded_layers` needs whole.
        dist (ModelDistribution): The model's own distribution ``[B, P, V]`` there.
        layer_indices (sequence of int): The chosen hidden-state indices.
        positions (list of int): The ``P`` explained positions (columns of the sequence).
        mask (Tensor, optional): ``[B, S]`` attention mask (real tokens).
        target: Target ids (see :meth:`~captum_iglens.IGLens.attribute`).
        contrast: Foil ids, or ``None``.
        baselines: The baseline (see :func:`~captum_iglens._core.baselines.residual_baseline`).
        explained (Tensor, optional): ``[B, P]`` bool, the pairs to read out.
        seq_len (int): ``S``.
        single (bool): One int position was asked for.
        base (Tensor, optional): ``[B, P, d]`` path starts from reference ids.
        position_ids (Tensor, optional): ``[B, S]`` the forward's position ids: where they
            restart a packed document begins (the ``"mean"`` baseline stays inside it).

    Raises:
        ValueError, TypeError: bad targets, foils or baselines.
    """
    log_probs = dist.log_probs
    tgt = normalise_target(target, log_probs.shape[0], len(positions), log_probs.argmax(-1),
                           log_probs.shape[-1])
    foil = normalise_contrast(contrast, tgt, positions, log_probs.shape[-1], explained)
    whole = recorded_layers(layer_indices, baselines)[1]
    hidden = torch.stack([states[i][:, positions] if i in whole else states[i]
                          for i in layer_indices], dim=2)
    if base is not None:
        name = "reference ids"
    else:
        base = residual_baseline(baselines, states, positions, mask, hidden, seq_len,
                                 position_ids=position_ids)
        name = baselines if isinstance(baselines, str) else "tensor"
    path = PathNodes(torch.cat([base[:, :, None], hidden], dim=2), tgt, contrast=foil)
    return PathCapture(
        path=path,
        model_probs=_model_probs(log_probs, path),
        model_argmax=log_probs.argmax(-1),
        positions=positions, single=single, baseline=name, reference=dist,
        explained=explained,
    )
