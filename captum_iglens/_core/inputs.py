"""Normalising what users pass: token ids, layers, positions, forward arguments.

Pure functions shared by :class:`~captum_iglens.IGLens`, the Captum comparison and the text
level, so that every entry point accepts and refuses the same things with the same message.
Target and foil ids: :mod:`captum_iglens._core.targets`.
"""

from __future__ import annotations

import inspect
import warnings
from typing import Any, Mapping, Optional, Sequence

import numpy as np
import torch
from torch import Tensor

from captum_iglens._utils.typing import PositionSpec, is_int

__all__ = [
    "single_position",
    "CACHE_ARGUMENTS",
    "warn_if_unmasked_padding",
    "check_explained",
    "check_not_padding",
    "check_top_k",
    "check_sequence_length",
    "check_token_ids",
    "forward_kwargs",
    "normalise_positions",
    "position_ids_from_mask",
    "refuse_caller_cache",
]


def check_token_ids(inputs: object, vocab: Optional[int]) -> Tensor:
    """Check token ids ``[B, S]``: an integer tensor, non-empty, inside the vocabulary.

    Raises:
        TypeError: not a tensor, or not integer ids.
        ValueError: not 2-D, empty, or ids outside ``0..vocab - 1``.
    """
    if not isinstance(inputs, Tensor):
        raise TypeError(f"inputs must be a tensor of token ids [B, S], got {type(inputs)}")
    if inputs.dim() != 2:
        raise ValueError(_shape_advice(inputs))
    if inputs.dtype.is_floating_point or inputs.dtype == torch.bool:
        raise TypeError(f"inputs must be integer token ids, got dtype {inputs.dtype}")
    if inputs.shape[1] == 0 or inputs.shape[0] == 0:
        raise ValueError(f"inputs is empty (shape {tuple(inputs.shape)}): give at least one token.")
    if vocab is not None and (inputs.min() < 0 or inputs.max() >= vocab):
        bad = inputs[(inputs < 0) | (inputs >= vocab)].unique().tolist()
        raise ValueError(
            f"Token ids {bad[:5]} are outside the vocabulary (ids 0..{vocab - 1}); was "
            "the input tokenised with this model's tokenizer?"
        )
    return inputs


def _shape_advice(inputs: Tensor) -> str:
    """What token ids of the wrong number of dimensions are, and what to pass instead."""
    shape = tuple(inputs.shape)
    if inputs.dim() == 1:
        return (f"inputs must be token ids of shape [B, S], got shape {shape}; use "
                "inputs.unsqueeze(0) for a single sequence.")
    if inputs.dim() == 3 and inputs.dtype.is_floating_point:
        return (f"inputs must be token ids of shape [B, S], got a {inputs.dtype} tensor of "
                f"shape {shape}: that looks like input embeddings [B, S, d] (inputs_embeds). "
                "IG-Lens runs the model from its token ids (the residual stream starts at the "
                "model's own embedding): pass the input_ids, e.g. "
                "tokenizer(text, return_tensors='pt').input_ids.")
    return (f"inputs must be token ids of shape [B, S], got {inputs.dim()} dimensions "
            f"(shape {shape}).")


def _plain_positions(positions: PositionSpec) -> PositionSpec:
    """``positions`` with tensors and arrays as Python ints or lists.

    Raises:
        TypeError: a float or bool tensor.
    """
    if isinstance(positions, Tensor):
        if positions.is_floating_point() or positions.dtype == torch.bool:
            raise TypeError(f"positions must be integers, got a {positions.dtype} tensor.")
        positions = positions.item() if positions.dim() == 0 else positions.tolist()  # type: ignore[assignment]  # ints: checked below
    if isinstance(positions, np.ndarray):
        positions = positions.tolist()
    return positions


def single_position(positions: PositionSpec) -> bool:
    """Whether ``positions`` is one int (a 0-d tensor included): results drop the ``P`` axis."""
    return is_int(_plain_positions(positions))


def normalise_positions(positions: PositionSpec, seq_len: int) -> tuple[list[int], bool]:
    """Non-negative explained positions, and whether a single int was given.

    Raises:
        TypeError: positions that are not integers (bools and floats included).
        ValueError: empty, or outside the sequence.
    """
    positions = _plain_positions(positions)
    single = is_int(positions)
    if not single and not isinstance(positions, (list, tuple, range)):
        raise TypeError(f"positions must be an int or a sequence of ints, got {positions!r}.")
    raw = [positions] if single else list(positions)  # type: ignore[arg-type]
    if not raw:
        raise ValueError("positions is empty: give at least one position.")
    out = []
    for pos in raw:
        if not is_int(pos):
            raise TypeError(f"Positions must be integers, got {pos!r}.")
        index = int(pos) + seq_len if int(pos) < 0 else int(pos)
        if not 0 <= index < seq_len:
            raise ValueError(
                f"Position {pos} is outside the sequence of length {seq_len} "
                f"(valid: {-seq_len}..{seq_len - 1})."
            )
        out.append(index)
    return out, single


def check_top_k(top_k: object, vocab: Optional[int]) -> None:
    """Refuse a ``top_k`` that is not an int in ``0..V``.

    Raises:
        ValueError: naming the value.
    """
    if not is_int(top_k) or not 0 <= top_k <= (vocab or top_k):
        raise ValueError(f"top_k must be an int in 0..V, got {top_k!r}")


def check_explained(explained: Optional[Tensor], batch: int, n_pos: int) -> Optional[Tensor]:
    """The ``[B, P]`` bool mask of explained (row, position) pairs, on the CPU, or ``None``.

    Raises:
        TypeError: not a bool tensor.
        ValueError: not of shape ``[B, P]``, or no pair explained.
    """
    if explained is None:
        return None
    if not isinstance(explained, Tensor) or explained.dtype != torch.bool:
        got = (f"a {explained.dtype} tensor" if isinstance(explained, Tensor)
               else type(explained).__name__)
        raise TypeError(f"explained must be a bool tensor [B, P], got {got}.")
    if explained.is_meta:
        raise ValueError("explained is on the meta device: give its values (a CPU or "
                         "accelerator bool tensor).")
    if tuple(explained.shape) != (batch, n_pos):
        raise ValueError(f"explained has shape {tuple(explained.shape)}, expected "
                         f"[{batch}, {n_pos}]: one flag per row and explained position.")
    if not bool(explained.any()):
        raise ValueError("explained is False everywhere: explain at least one pair.")
    return explained.detach().cpu()


def position_ids_from_mask(mask: Tensor) -> Tensor:
    """``position_ids`` ``[B, S]`` for a (left-)padded batch: 0 at each row's first token."""
    return (mask.long().cumsum(-1) - 1).clamp(min=0)


_VARIADIC = (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)


def _kwargs_from_args(
    additional_forward_args: Any, params: Mapping[str, inspect.Parameter]
) -> dict[str, Any]:
    if additional_forward_args is None:
        return {}
    if isinstance(additional_forward_args, Tensor):
        return {"attention_mask": additional_forward_args}
    if isinstance(additional_forward_args, dict):
        return dict(additional_forward_args)
    if isinstance(additional_forward_args, (tuple, list)):
        # The attention mask first (GPT-2, Bloom, Falcon and GPT-J take the KV cache second).
        rest = [n for n, p in params.items() if p.kind not in _VARIADIC
                and n not in ("self", "input_ids", "attention_mask")]
        names = ["attention_mask", *rest]
        _check_positional_extras(additional_forward_args, names, params)
        return {n: v for n, v in zip(names, additional_forward_args, strict=False) if v is not None}
    raise TypeError(
        "additional_forward_args must be an attention mask tensor, a tuple of positional "
        f"arguments or a dict of keyword arguments, got {type(additional_forward_args)}"
    )


_SCALARS = ((bool, "bool"), (int, "int"), (float, "float"), (str, "str"))


def _check_positional_extras(
    args: Sequence[Any], names: Sequence[str], params: Mapping[str, inspect.Parameter]
) -> None:
    """Refuse Captum-style extras the forward cannot take, before transformers crashes.

    Element ``i >= 1`` of the tuple goes to the forward's ``names[i]`` parameter, as Captum
    would pass it (``model(inputs, *additional_forward_args)``). A Python scalar for a
    parameter annotated without its type (``-1`` as ``position_ids`` or the KV cache) and
    a tuple longer than the parameters are refused, naming the parameter.

    Raises:
        TypeError: a scalar the parameter does not take.
        ValueError: more elements than the forward has parameters.
    """
    if len(args) > len(names):
        raise ValueError(
            f"additional_forward_args has {len(args)} elements; the forward takes the "
            f"attention mask and {len(names) - 1} more ({', '.join(names[1:6])}, ...).")
    for i, (name, value) in enumerate(zip(names, args, strict=False)):
        if i == 0 or value is None or isinstance(value, Tensor):
            continue
        annotation = params[name].annotation
        words = "" if annotation is inspect.Parameter.empty else str(annotation)
        kind = next((word for typ, word in _SCALARS if isinstance(value, typ)), None)
        if words and kind is not None and kind not in words:
            raise TypeError(
                f"additional_forward_args[{i}] = {value!r} goes to the forward's {name!r} "
                f"parameter ({words}), as Captum passes the tuple positionally after the "
                "inputs (model(inputs, *additional_forward_args)); it takes no "
                f"{type(value).__name__}. The tuple's first element is the attention mask; "
                "explained positions go to positions=..., other forward arguments in a dict "
                "of keyword arguments.")


def forward_kwargs(
    params: Mapping[str, inspect.Parameter], input_ids: Tensor, additional_forward_args: Any
) -> tuple[dict[str, Any], Optional[Tensor]]:
    """Keyword arguments for ``model(input_ids, **kwargs)`` and the attention mask.

    ``additional_forward_args`` is an attention mask ``[B, S]``, a dict of keyword arguments,
    or a Captum-style tuple whose first element is the attention mask (``None`` for none) and
    whose further elements follow the forward's parameters after ``input_ids``, with
    ``attention_mask`` left out (for every family, also those whose second parameter is the KV
    cache). With a mask, ``position_ids`` are derived from it for models whose forward takes
    them (left padding); ``use_cache=False`` is set where the forward takes it. ``params``
    come from :func:`forward_parameters` (wrappers unwrapped).

    Raises:
        TypeError: an unsupported type, or a tuple element its forward parameter cannot
            take (``(mask, -1)``: ``-1`` would be ``position_ids``), naming the parameter.
        ValueError: a mask whose shape differs from ``input_ids``, a tuple longer than
            the forward's parameters, or a KV cache (see :func:`refuse_caller_cache`).
    """
    kwargs = _kwargs_from_args(additional_forward_args, params)
    refuse_caller_cache(kwargs)
    mask = kwargs.get("attention_mask")
    if mask is not None:
        if mask.shape != input_ids.shape:
            raise ValueError(
                f"attention_mask has shape {tuple(mask.shape)}, expected "
                f"{tuple(input_ids.shape)} (the shape of inputs)."
            )
        if "position_ids" in params and "position_ids" not in kwargs:
            kwargs["position_ids"] = position_ids_from_mask(mask)
    if "use_cache" in params:
        kwargs["use_cache"] = False
    return kwargs, mask


#: Forward arguments that carry a cache of earlier positions (KV or recurrent state).
CACHE_ARGUMENTS = ("past_key_values", "past_key_value", "cache", "layer_past", "cache_params")


def _cache_length(cache: object) -> str:
    """``" N"`` for a transformers ``Cache`` or legacy tuples of ``N`` positions, else ``""``."""
    try:
        if callable(getattr(cache, "get_seq_length", None)):
            return f" {int(cache.get_seq_length())}"  # type: ignore[attr-defined]
        if isinstance(cache, (tuple, list)):
            return f" {int(cache[0][0].shape[-2])}"
    except (IndexError, TypeError, AttributeError, RuntimeError):
        pass
    return ""


def refuse_caller_cache(kwargs: Mapping[str, Any]) -> None:
    """Refuse a cache of earlier positions (``past_key_values`` for a shared prefix).

    The path needs the residual stream of the positions a baseline reads (the causal
    ``"mean"`` averages ``h_1`` over every position up to the explained one, the prefix's
    included), which a KV cache does not hold; and the forward would append the new
    tokens to the caller's cache.

    Raises:
        ValueError: naming the argument and what to pass instead.
    """
    for name in CACHE_ARGUMENTS:
        if kwargs.get(name) is not None:
            raise ValueError(
                f"additional_forward_args passes {name} (a cache of{_cache_length(kwargs[name])} "
                "earlier positions): IG-Lens does not take a caller's cache. Its baselines "
                "need the residual stream of every position up to the explained one (the "
                "default causal 'mean' would average the new tokens only), which the cache "
                "does not hold, and the forward would append the new tokens to your cache. "
                f"Pass the whole text (prefix + new tokens) as inputs without {name}, with its "
                "full attention mask, and choose the explained tokens with positions=... "
                "(e.g. positions=list(range(-n_new, 0)) for the last n_new tokens).")


def check_sequence_length(limit: Optional[int], input_ids: Tensor, kwargs: Mapping[str, Any],
                          context: Optional[int] = None) -> None:
    """Refuse inputs longer than the model can position, before any forward pass.

    Args:
        limit (int, optional): :func:`~captum_iglens.lens.context.max_sequence_length`
            (``None``: no position table).
        input_ids (Tensor): ``[B, S]`` token ids.
        kwargs (mapping): The forward's keyword arguments; with ``position_ids`` (derived
            from a left-padded mask) the largest position counts, else the length ``S``.
        context (int, optional): :func:`~captum_iglens.lens.context.context_length`, the
            trained context (rotary models: ``max_position_embeddings``), the limit of
            ``explain`` and ``iglens run`` too. Default: None (not checked).

    Raises:
        ValueError: naming the length and the limit.
    """
    position_ids = kwargs.get("position_ids")
    length = (int(position_ids.max()) + 1 if isinstance(position_ids, Tensor)
              and position_ids.numel() else int(input_ids.shape[1]))
    if limit is not None and length > limit:
        raise ValueError(
            f"The input is {length} tokens long but this model positions at most {limit} "
            "tokens (its position table has no row beyond that): shorten the input to "
            f"{limit} tokens or fewer."
        )
    if context is not None and length > context:
        raise ValueError(
            f"The input is {length} tokens long, past this model's trained context of "
            f"{context} tokens (its config's max_position_embeddings): positions beyond it "
            "are extrapolation, so the credits would describe the model outside its "
            "training, and the time and memory grow with the square of the length (tens of "
            f"minutes on a CPU). Shorten the input to {context} tokens or fewer, as explain "
            "and iglens run require."
        )


def check_not_padding(mask: Optional[Tensor], positions: list[int],
                      explained: Optional[Tensor] = None) -> None:
    """Refuse explained positions where the attention mask is 0.

    Args:
        mask (Tensor, optional): ``[B, S]`` the attention mask.
        positions (list of int): The ``P`` explained positions (non-negative).
        explained (Tensor, optional): ``[B, P]`` bool, the (row, position) pairs that are
            explained (default: all).

    Raises:
        ValueError: naming the first padded (row, position).
    """
    if mask is None:
        return
    padded_at = mask[:, positions] == 0
    if explained is not None:
        padded_at &= explained.to(padded_at.device)
    padded = padded_at.nonzero()
    if padded.numel():
        row, col = padded[0].tolist()
        raise ValueError(
            f"Position {positions[col]} of row {row} is padding (attention_mask is 0 there): "
            "explain positions of real tokens; with left padding, negative positions such as "
            "-1 address the last tokens of every row."
        )


def warn_if_unmasked_padding(inputs: Tensor, positions: list[int], pad_id: Optional[int],
                             mask: Optional[Tensor]) -> None:
    """Warn when, with no attention mask, an explained position holds the pad token id.

    Right-padded ids passed without their mask would explain the prediction *after* the
    pads; the model's ``config.pad_token_id`` names them. (A warning, not an error: some
    models pad with their end token, which a real text can also hold.)

    Args:
        inputs (Tensor): ``[B, S]`` token ids.
        positions (list of int): The explained positions.
        pad_id (int, optional): ``config.pad_token_id`` (``None``: nothing to check).
        mask (Tensor, optional): The attention mask; with one, padding is refused elsewhere.
    """
    if mask is not None or pad_id is None or not isinstance(pad_id, int):
        return
    hits = (inputs[:, positions] == pad_id).nonzero()
    if hits.numel():
        row, col = hits[0].tolist()
        warnings.warn(
            f"Position {positions[col]} of row {row} holds the pad token id {pad_id} and no "
            "attention mask was given: if these ids are padded, pass the attention mask "
            "(additional_forward_args=mask) so that the real tokens are explained.",
            stacklevel=4)
