"""Baselines: where an IG-Lens path starts, and the Captum methods' reference token ids.

IG-Lens starts its path ``b -> h_{L_1} -> ... -> h_n`` at a point ``b`` of residual space
(arXiv:2606.29693). :func:`residual_baseline` builds ``b`` from a name (``"mean"``,
``"zero"``, ``"embedding"``) or a tensor. Reference token ids ``x'`` (what Captum users pass
to the layer methods) are also accepted: the path then starts at the reference's last-block
residual ``h_n(x')`` at the explained position, so the credits add up to the model's own
change ``F(x) - F(x')``. :func:`input_baseline_ids` builds the default reference of the
Captum comparison.
"""

from __future__ import annotations

from typing import Any, Optional, TypeGuard, Union

import torch
from torch import Tensor, nn

from captum_iglens._core.baseline_rows import BASELINE_ROWS, BaselineRow
from captum_iglens._utils.typing import BaselineSpec
from captum_iglens.lens.architectures import input_embeddings, vocab_size

__all__ = [
    "BASELINES",
    "BASELINE_ROWS",
    "BaselineRow",
    "BASELINE_DESCRIPTIONS",
    "MEAN_BASELINE_LAYER",
    "causal_mean",
    "check_reference_ids",
    "describe_input_baseline",
    "document_starts",
    "input_baseline_ids",
    "is_reference_ids",
    "residual_baseline",
]

#: Named residual-space baselines accepted by :meth:`~captum_iglens.IGLens.attribute`
#: (:data:`captum_iglens.settings.BASELINES`).
BASELINES: tuple[str, ...] = tuple(BASELINE_ROWS)

#: The hidden-state index averaged by the ``"mean"`` baseline (its row's ``reads``): the
#: first block's output, whichever layers are chosen, so a token's total ``delta_p`` never
#: depends on the choice.
MEAN_BASELINE_LAYER: int = BASELINE_ROWS["mean"].reads  # type: ignore[assignment]

#: What each baseline is, in words, for tables, JSON and plots.
BASELINE_DESCRIPTIONS: dict[str, str] = {
    **{name: row.description for name, row in BASELINE_ROWS.items()},
    "tensor": "a residual-space tensor given by the caller",
    "reference ids": "h_n(x'), the last-block residual of the reference token ids",
}


def is_reference_ids(baselines: object) -> TypeGuard[Tensor]:
    """Whether ``baselines`` is a tensor of reference token ids (an integer tensor)."""
    return isinstance(baselines, Tensor) and not (
        baselines.is_floating_point() or baselines.is_complex() or baselines.dtype == torch.bool
    )


def document_starts(position_ids: Optional[Tensor], shape: tuple[int, int],
                    device: torch.device) -> Tensor:
    """``[B, S]`` int64: the first column of the document each position belongs to.

    A row packs several documents when its ``position_ids`` restart (a position id no larger
    than the one before it, as Hugging Face packed batches write them); without
    ``position_ids`` every row is one document that starts at column 0. Left padding
    (position id 0 on every pad) only starts one-column documents of weight 0.
    """
    batch, seq_len = shape
    cols = torch.arange(seq_len, device=device).expand(batch, seq_len)
    if position_ids is None:
        return torch.zeros_like(cols)
    pos = position_ids.to(device).expand(batch, seq_len)
    restart = torch.ones_like(cols, dtype=torch.bool)
    restart[:, 1:] = pos[:, 1:] <= pos[:, :-1]
    return torch.where(restart, cols, torch.zeros_like(cols)).cummax(dim=1).values


def causal_mean(first: Tensor, mask: Optional[Tensor],
                position_ids: Optional[Tensor] = None) -> Tensor:
    """The running mean of ``h_1``: at each position, over the attended positions ``<= p``.

    Only the position's own document counts (see :func:`document_starts`), so position
    ``p``'s mean never reads a later token, another document packed into the row, or
    padding. Sums run in float64 (then cast back), so a row's values do not depend on
    padding or on the length of what follows.

    Args:
        first (Tensor): ``[B, S, d]`` residuals ``h_1``.
        mask (Tensor, optional): ``[B, S]`` attention mask (1: real token).
        position_ids (Tensor, optional): ``[B, S]`` position ids (packed documents).

    Returns:
        Tensor: ``[B, S, d]`` in ``first``'s dtype; a position with no attended position up
        to it in its document gets the zero vector.
    """
    batch, seq_len, _ = first.shape
    weights = (torch.ones(batch, seq_len, dtype=torch.float64, device=first.device)
               if mask is None else mask.to(device=first.device, dtype=torch.float64))
    total = (first.double() * weights[..., None]).cumsum(dim=1)
    count = weights.cumsum(dim=1)
    starts = document_starts(position_ids, (batch, seq_len), first.device)
    before = (starts - 1).clamp(min=0)
    has_before = (starts > 0)
    total = total - torch.where(has_before[..., None],
                                total.gather(1, before[..., None].expand_as(total)), 0.0)
    count = count - torch.where(has_before, count.gather(1, before), 0.0)
    return (total / count.clamp(min=1)[..., None]).to(first.dtype)


def _named_baseline(
    name: str, states: dict[int, Tensor], positions: list[int], mask: Optional[Tensor],
    hidden: Tensor, position_ids: Optional[Tensor],
) -> Tensor:
    if name == "zero":
        return torch.zeros_like(hidden[:, :, 0])
    row = BASELINE_ROWS.get(name)
    if row is not None and row.reads is not None and not row.prefix:
        return states[row.reads]
    if row is not None and row.prefix:
        first = states[row.reads]  # type: ignore[index]
        # only the explained columns and what precedes them are needed
        last = max(positions) + 1
        ids = None if position_ids is None else position_ids[:, :last]
        cut = None if mask is None else mask[:, :last]
        return causal_mean(first[:, :last], cut, ids)[:, positions]
    raise ValueError(
        f"Unknown baseline {name!r}: use one of {BASELINES}, a residual-space tensor or "
        "reference token ids shaped like inputs."
    )


def residual_baseline(
    baselines: BaselineSpec,
    states: dict[int, Tensor],
    positions: list[int],
    mask: Optional[Tensor],
    hidden: Tensor,
    seq_len: int,
    *,
    position_ids: Optional[Tensor] = None,
) -> Tensor:
    """The path start ``b`` at every explained position: ``[B, P, d]``.

    Args:
        baselines (str or Tensor): ``"mean"`` (the causal mean of ``h_1``, the first
            block's output, whichever layers are chosen: at position ``p`` the mean over
            the attended positions ``<= p`` of ``p``'s own document, see
            :func:`causal_mean`), ``"zero"``,
            ``"embedding"`` (``h_0`` at the same position), or a floating tensor of shape
            ``[d]``, ``[B, d]``, ``[B, P, d]`` or ``[B, S, d]``.
        states (dict): Captured residuals: ``h_1`` ``[B, S, d]`` at every position for
            ``"mean"``, ``h_0`` ``[B, P, d]`` at the explained positions for ``"embedding"``.
        positions (list of int): The ``P`` explained positions.
        mask (Tensor, optional): ``[B, S]`` attention mask.
        hidden (Tensor): ``[B, P, k, d]`` residuals at the chosen layers (shape and dtype).
        seq_len (int): The input's length ``S`` (for ``[B, S, d]`` baseline tensors).
        position_ids (Tensor, optional): ``[B, S]``; where they restart, a new document
            begins, and ``"mean"`` reads only the explained position's own document.

    Raises:
        ValueError: an unknown name, a non-finite tensor or a wrong shape.
        TypeError: neither a string nor a tensor.
    """
    if isinstance(baselines, str):
        return _named_baseline(baselines, states, positions, mask, hidden, position_ids)
    if not isinstance(baselines, Tensor):
        raise TypeError(f"baselines must be a string or a tensor, got {type(baselines)}")
    batch, n_pos, _, d = hidden.shape
    if not bool(torch.isfinite(baselines).all()):
        raise ValueError("The baseline tensor contains NaN or inf: give finite values.")
    base = baselines.to(device=hidden.device, dtype=hidden.dtype)
    if base.dim() == 1 and base.shape[0] == d:
        return base.expand(batch, n_pos, d)
    if base.dim() == 2 and tuple(base.shape) == (batch, d):
        return base[:, None, :].expand(batch, n_pos, d)
    if base.dim() == 3 and tuple(base.shape) == (batch, n_pos, d):
        return base
    if base.dim() == 3 and tuple(base.shape) == (batch, seq_len, d):
        return base[:, positions]
    raise ValueError(
        f"A baseline tensor must have shape [d]=[{d}], [B, d]=[{batch}, {d}], "
        f"[B, P, d]=[{batch}, {n_pos}, {d}] or [B, S, d]=[{batch}, {seq_len}, {d}] in "
        f"residual space, or be integer reference token ids shaped like inputs; got "
        f"{tuple(base.shape)}."
    )


def check_reference_ids(reference: Tensor, inputs: Tensor, vocab: Optional[int]) -> Tensor:
    """Reference token ids shaped like ``inputs`` and inside the vocabulary.

    Raises:
        ValueError: another shape, or ids outside ``0..vocab - 1``.
    """
    if tuple(reference.shape) != tuple(inputs.shape):
        raise ValueError(
            f"Reference token ids (baselines) have shape {tuple(reference.shape)}; give ids "
            f"shaped like inputs {tuple(inputs.shape)}, e.g. every token but the special ones "
            "replaced by a filler token."
        )
    reference = reference.to(inputs.device).long()
    if vocab is not None and (reference.min() < 0 or reference.max() >= vocab):
        raise ValueError(f"Reference token ids must be in 0..{vocab - 1}.")
    return reference


# ---------------------------------------------------------------------- Captum input space
def _special_ids(model: nn.Module, tokenizer: Any) -> set[int]:
    ids = set(getattr(tokenizer, "all_special_ids", None) or []) if tokenizer is not None else set()
    config = getattr(model, "config", None)
    for name in ("bos_token_id", "eos_token_id", "pad_token_id"):
        value = getattr(config, name, None)
        values = value if isinstance(value, (list, tuple)) else [value]
        ids.update(int(v) for v in values if v is not None)
    return ids


def _default_filler(model: nn.Module, tokenizer: Any) -> int:
    if tokenizer is not None:
        ids = list(tokenizer(" ", add_special_tokens=False)["input_ids"])
        if len(ids) == 1:
            return int(ids[0])
    config = getattr(model, "config", None)
    for name in ("bos_token_id", "eos_token_id"):
        value = getattr(config, name, None)
        value = value[0] if isinstance(value, (list, tuple)) and value else value
        if value is not None:
            return int(value)  # type: ignore[arg-type]  # a config's token id
    raise ValueError("No tokenizer and no BOS/EOS id in the config: pass baselines=<token id>.")


def _structure_kept(
    input_ids: Tensor, filler: int, special: set[int], attention_mask: Optional[Tensor]
) -> Tensor:
    base = torch.full_like(input_ids, filler)
    device = input_ids.device
    keep = torch.isin(input_ids, torch.tensor(sorted(special), dtype=torch.long, device=device))
    if attention_mask is not None:
        attended = attention_mask.to(device).bool()
        keep |= ~attended
        first = attended.long().argmax(-1)
    else:
        first = torch.zeros(input_ids.shape[0], dtype=torch.long, device=device)
    keep[torch.arange(input_ids.shape[0], device=device), first] = True
    return torch.where(keep, input_ids, base)


def _check_embedding_norms(model: nn.Module, base: Tensor, input_ids: Tensor) -> None:
    embedding = input_embeddings(model)
    moving = base[base != input_ids]
    if not moving.numel() or embedding is None:
        return
    vocab = int(getattr(embedding, "num_embeddings", 0) or moving.max() + 1)
    # Call the module (not .weight): offloaded models keep their weights on ``meta``.
    with torch.no_grad():
        norms = embedding(moving.unique()[None]).float().norm(dim=-1)
        sample = torch.arange(min(vocab, 4096), device=input_ids.device)[None]
        typical = embedding(sample).float().norm(dim=-1).median()
    if bool((norms.cpu() <= 1e-3 * typical.cpu()).any()):
        raise ValueError(
            "A baseline token has a (near) zero input embedding: the path would start where "
            "the pre-norm's gradient is ~1/sqrt(eps) and Captum's estimate would not "
            "converge. Pick another baseline token (e.g. a space), not a zero pad token."
        )


def input_baseline_ids(
    model: nn.Module,
    input_ids: Tensor,
    baselines: Union[None, int, Tensor] = None,
    tokenizer: Any = None,
    keep_special: bool = True,
    attention_mask: Optional[Tensor] = None,
) -> Tensor:
    """The reference ``x'`` in input space, as token ids shaped like ``input_ids``.

    By default the reference keeps the *structure* of the input and blanks its content: the
    first attended position (position 0 without padding), padding, and every special token
    (the tokenizer's ``all_special_ids`` and the config's BOS / EOS / pad ids), i.e. the chat
    template's markers, stay as they are; every other position becomes a filler token:
    ``" "`` (a single space token) with a tokenizer, else the config's BOS (or EOS) id.
    Special tokens at content positions act as extra attention sinks with very large residual
    norms; a reference made only of them (BOS everywhere) gives Captum a badly converging path.

    Args:
        model (nn.Module): The causal LM.
        input_ids (Tensor): ``[B, S]`` token ids.
        baselines (int or Tensor, optional): ``None`` (default, see above); an int: that
            filler token id (structure still kept when ``keep_special``); ids shaped like
            ``input_ids``: used as given.
        tokenizer (optional): For the special ids and the default filler.
        keep_special (bool, optional): Keep the first attended position and special tokens.
            Default: True.
        attention_mask (Tensor, optional): ``[B, S]``; masked positions (left padding) are
            kept and the first attended position counts as position 0.

    Returns:
        Tensor: ``[B, S]`` int64 reference ids.

    Raises:
        ValueError: a wrong shape, an id outside the vocabulary, or a filler token with a
            (near) zero input embedding (the pre-norm's ``1/sqrt(eps)`` regime, where Captum's
            estimate does not converge).
        TypeError: ``baselines`` of another type.
    """
    if isinstance(baselines, Tensor):
        base = baselines.to(input_ids.device).long()
        if base.shape != input_ids.shape:
            raise ValueError(
                f"baselines has shape {tuple(base.shape)}; give token ids shaped like the "
                f"inputs {tuple(input_ids.shape)} or one token id."
            )
    elif baselines is None or (isinstance(baselines, int) and not isinstance(baselines, bool)):
        filler = _default_filler(model, tokenizer) if baselines is None else int(baselines)
        base = torch.full_like(input_ids, filler)
        if keep_special:
            base = _structure_kept(input_ids, filler, _special_ids(model, tokenizer),
                                   attention_mask)
    else:
        raise TypeError(f"baselines must be None, a token id or a tensor of ids, got {baselines!r}")
    vocab = vocab_size(model)
    if vocab is not None and (base.min() < 0 or base.max() >= vocab):
        raise ValueError(f"Baseline token ids must be in 0..{vocab - 1}.")
    _check_embedding_norms(model, base, input_ids)
    return base


def describe_input_baseline(base: Tensor, input_ids: Tensor, tokenizer: Any) -> str:
    """One line naming the filler tokens of a reference and how many positions they fill."""
    changed = base != input_ids
    fillers = sorted(set(base[changed].tolist()))
    names = ", ".join(
        f"{tokenizer.decode([i])!r} (id {i})" if tokenizer is not None else f"id {i}"
        for i in fillers[:3]
    )
    return (f"{names or 'the input itself'} at {int(changed.sum())} of {base.numel()} "
            "positions, the others kept")
