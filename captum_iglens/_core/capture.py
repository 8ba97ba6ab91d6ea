"""One forward pass turned into IG-Lens paths: residuals, baseline, targets, model probs.

For every explained position the path nodes are the baseline ``b`` and the residuals
``h_{L_1}, ..., h_{L_k}`` (pre-final-norm); the model's own probability of each target (and
of each foil, for contrastive targets) is kept for the readout check (Invariant R).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Optional, Sequence

import torch
from torch import Tensor, nn

from captum_iglens._core.baselines import (
    MEAN_BASELINE_LAYER,
    check_reference_ids,
    is_reference_ids,
    residual_baseline,
)
from captum_iglens._core.estimators import PathNodes
from captum_iglens._core.inputs import (
    check_explained,
    check_not_padding,
    check_sequence_length,
    check_token_ids,
    forward_kwargs,
    normalise_positions,
    warn_if_unmasked_padding,
)
from captum_iglens._core.targets import normalise_contrast, normalise_target
from captum_iglens._typing import BaselineSpec, PositionSpec, TargetSpec
from captum_iglens.lens.architectures import unwrap_model, vocab_size
from captum_iglens.lens.context import max_sequence_length
from captum_iglens.lens.hooks import forward_with_capture
from captum_iglens.lens.readout import ModelDistribution
from captum_iglens.lens.state import execution_device, forward_parameters

__all__ = ["PathCapture", "capture_path", "paths_from_states", "recorded_layers"]


@dataclass
class PathCapture:
    """The IG-Lens paths of one forward pass.

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
        def pick(tensor: Optional[Tensor]) -> Optional[Tensor]:
            return None if tensor is None else tensor[explained.to(tensor.device)][None]

        path = self.path
        reference = self.reference
        if reference is not None:
            reference = ModelDistribution(pick(reference.log_probs), pick(reference.logit_max))
        return PathCapture(
            path=PathNodes(pick(path.nodes), pick(path.target), path.log, pick(path.contrast)),
            model_probs=pick(self.model_probs), model_argmax=pick(self.model_argmax),
            positions=[self.positions[c] for c in explained.nonzero()[:, 1].tolist()],
            single=False, baseline=self.baseline, reference=reference,
        )


def _readout_device(readout: Callable[[Tensor], Tensor]) -> Optional[torch.device]:
    return execution_device(readout) if isinstance(readout, nn.Module) else None


def _model_distribution(logits: Tensor, positions: list[int], seq_len: int,
                        device: Optional[torch.device]) -> ModelDistribution:
    if logits.shape[1] == seq_len:
        logits = logits[:, positions]
    return ModelDistribution.from_logits(logits.to(device) if device is not None else logits)


def _model_probs(log_probs: Tensor, path: PathNodes) -> Tensor:
    """The model's probability of each target ``[B, P]`` (and foil: ``[B, P, 2]``)."""
    ids = path.ids if path.contrast is not None else path.target[..., None]
    probs = log_probs.gather(-1, ids).exp()
    return probs if path.contrast is not None else probs[..., 0]


def capture_path(
    model: nn.Module,
    blocks: nn.ModuleList,
    readout: Callable[[Tensor], Tensor],
    layer_indices: tuple[int, ...],
    inputs: Tensor,
    target: TargetSpec,
    positions: PositionSpec,
    baselines: BaselineSpec,
    additional_forward_args: Any,
    contrast: TargetSpec = None,
    explained: Optional[Tensor] = None,
) -> PathCapture:
    """Run the model once (twice with reference ids) and build the paths.

    Arguments are those of :meth:`~captum_iglens.IGLens.attribute_details`, plus the model's
    decoder blocks, its readout and the chosen hidden-state indices. With ``explained``
    (``[B, P]`` bool), only those pairs must be real tokens with a foil unlike the target.

    Raises:
        ValueError, TypeError: bad inputs, positions, targets or baselines (see
            :mod:`captum_iglens._core.inputs` and :mod:`captum_iglens._core.baselines`).
        FloatingPointError: NaN or inf in a residual.
        ResidualShapeError: a decoder block's output is not a ``[B, S, d]`` residual stream.
    """
    vocab = vocab_size(model)
    inputs = check_token_ids(inputs, vocab)
    reference = (check_reference_ids(baselines, inputs, vocab)
                 if is_reference_ids(baselines) else None)
    pos_list, single = normalise_positions(positions, inputs.shape[1])
    params = forward_parameters(model)
    kwargs, mask = forward_kwargs(params, inputs, additional_forward_args)
    check_sequence_length(max_sequence_length(model), inputs, kwargs)
    explained = check_explained(explained, inputs.shape[0], len(pos_list))
    check_not_padding(mask, pos_list, explained)
    config = getattr(unwrap_model(model), "config", None)
    warn_if_unmasked_padding(inputs, pos_list, getattr(config, "pad_token_id", None), mask)
    needed, whole = recorded_layers(layer_indices, baselines)
    # Only the explained positions need the model's own logits: skip the unembedding
    # elsewhere where the model supports it.
    if len(pos_list) < inputs.shape[1] and "logits_to_keep" in params:
        kwargs.setdefault("logits_to_keep", torch.tensor(pos_list, device=inputs.device))
    device = _readout_device(readout)
    states, logits = forward_with_capture(model, blocks, inputs, kwargs, needed, device, mask,
                                          pos_list, whole)
    dist = _model_distribution(logits, pos_list, inputs.shape[1], device)
    tgt = normalise_target(target, inputs.shape[0], len(pos_list), dist.log_probs.argmax(-1),
                           dist.log_probs.shape[-1])
    base = None
    if reference is not None:
        last = len(blocks)
        ref_states, _ = forward_with_capture(model, blocks, reference, kwargs, {last}, device,
                                             mask, pos_list)
        base = ref_states[last]
    return paths_from_states(states, dist, layer_indices, pos_list, mask, tgt, contrast,
                             baselines, explained, inputs.shape[1], single, base,
                             position_ids=kwargs.get("position_ids"))


def recorded_layers(layer_indices: Sequence[int],
                    baselines: BaselineSpec) -> tuple[set[int], set[int]]:
    """The hidden-state indices to record, and those needed at every position.

    The chosen layers, plus what a named baseline reads (``h_0`` for ``"embedding"``, ``h_1``
    at every position for ``"mean"``); the others are needed at the explained positions only.
    """
    needed = set(layer_indices)
    whole = {MEAN_BASELINE_LAYER} if isinstance(baselines, str) and baselines == "mean" else set()
    if isinstance(baselines, str) and baselines in ("embedding", "mean"):
        needed.add(0 if baselines == "embedding" else MEAN_BASELINE_LAYER)
    return needed, whole


def paths_from_states(
    states: dict[int, Tensor],
    dist: ModelDistribution,
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
    *,
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
