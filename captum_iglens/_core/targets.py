"""Normalising target and foil token ids: every form ``target=`` and ``contrast=`` take.

Shared by :class:`~captum_iglens.IGLens`, the Captum comparison and the text level, so that
every entry point accepts and refuses the same ids with the same message.
"""

from __future__ import annotations

from typing import Optional, Sequence

import numpy as np
import torch
from torch import Tensor

from captum_iglens._utils.typing import TargetSpec

__all__ = ["normalise_contrast", "normalise_target"]


def _target_tensor(target: object, device: torch.device, name: str = "target") -> Tensor:
    if isinstance(target, str):
        raise TypeError(
            f"{name}={target!r} is text: IG-Lens takes token ids. Use "
            "captum_iglens.text.explain_prompt.target_token_id(tokenizer, text) for one token, or "
            "explain(model, tokenizer, prompt, target=text) for each token of a text."
        )
    if isinstance(target, (bool, np.bool_, float)):
        raise TypeError(f"{name} must be integer token ids, got {target!r}.")
    tgt = torch.as_tensor(target, device=device)
    if tgt.is_floating_point() or tgt.is_complex() or tgt.dtype == torch.bool:
        raise TypeError(
            f"{name} must be integer token ids, got {tgt.dtype}; for text use "
            "captum_iglens.text.explain_prompt.target_token_id(tokenizer, text)."
        )
    return tgt.long()


def normalise_target(
    target: TargetSpec, batch: int, n_pos: int, default: Tensor, vocab: int,
    name: str = "target",
) -> Tensor:
    """Target ids ``[B, P]`` (int64): ``default`` (the argmax) for ``None``.

    Accepts an int, ``[B]`` (one id per row) or ``[B, P]``; ``name`` (``"target"`` or
    ``"contrast"``) is the argument named in messages.

    Raises:
        TypeError: text, floats or bools.
        ValueError: a wrong shape, or ids outside ``0..vocab - 1``.
    """
    if target is None:
        return default
    tgt = _target_tensor(target, default.device, name)
    if tgt.dim() == 0:
        tgt = tgt.expand(batch, n_pos)
    elif tgt.dim() == 1:
        if tgt.shape[0] != batch:
            raise ValueError(
                f"{name} has {tgt.shape[0]} entries but there are {batch} inputs; give "
                f"{name} of shape [B] or [B, P]."
            )
        tgt = tgt[:, None].expand(batch, n_pos)
    elif tuple(tgt.shape) != (batch, n_pos):
        raise ValueError(
            f"{name} has shape {tuple(tgt.shape)}, expected [B]={batch} or "
            f"[B, P]=[{batch}, {n_pos}]."
        )
    if tgt.min() < 0 or tgt.max() >= vocab:
        bad = tgt[(tgt < 0) | (tgt >= vocab)].unique().tolist()
        raise ValueError(
            f"{name.capitalize()} token ids {bad[:5]} are outside the vocabulary "
            f"(ids 0..{vocab - 1})."
        )
    return tgt.contiguous()


def normalise_contrast(
    contrast: TargetSpec, target: Tensor, positions: Sequence[int], vocab: int,
    explained: Optional[Tensor] = None,
) -> Optional[Tensor]:
    """Foil ids ``[B, P]`` (int64) for a contrastive target, or ``None`` for none.

    ``contrast`` takes every form ``target`` takes (:func:`normalise_target`).

    Args:
        contrast: The foil ids: an int, ``[B]`` or ``[B, P]``; ``None`` for none.
        target (Tensor): ``[B, P]`` the normalised target ids.
        positions (sequence of int): The ``P`` explained positions, for messages.
        vocab (int): The vocabulary size.
        explained (Tensor, optional): ``[B, P]`` bool, the pairs where a foil must differ
            from the target (default: all).

    Raises:
        TypeError: text, floats or bools.
        ValueError: a wrong shape, ids outside ``0..vocab - 1``, or a foil equal to the
            target (``F = p(y) - p(foil)`` is then identically 0).
    """
    if contrast is None:
        return None
    foil = normalise_target(contrast, target.shape[0], target.shape[1], target, vocab,
                            name="contrast")
    equal = foil == target
    if explained is not None:
        equal &= explained.to(equal.device)
    same = equal.nonzero()
    if same.numel():
        row, col = same[0].tolist()
        raise ValueError(
            f"contrast equals the target (token id {int(target[row, col])}) at row {row}, "
            f"position {positions[col]}: F = p(y) - p(foil) is identically 0 there; give a "
            "foil token that differs from the target at every explained position."
        )
    return foil
