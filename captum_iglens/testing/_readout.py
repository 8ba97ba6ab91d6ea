"""``assert_readout_exact``: the lens reads out of ``h_n`` the model's own distribution."""

from __future__ import annotations

from typing import Any, Optional, Sequence

import torch
from torch import Tensor, nn

from captum_iglens._core.inputs import forward_kwargs
from captum_iglens.lens.architectures import UnknownArchitectureError, strip_parallel
from captum_iglens.lens.hooks import forward_with_capture
from captum_iglens.lens.readout import LensReadout, resolve_readout
from captum_iglens.lens.state import forward_parameters
from captum_iglens.testing._bounds import readout_tolerance

__all__ = ["assert_readout_exact", "last_residuals"]


def last_residuals(
    lens: Any, input_ids: Tensor, attention_mask: Optional[Tensor] = None,
    positions: Optional[Sequence[int]] = None,
) -> tuple[Tensor, Tensor]:
    """``h_n`` (the last block's output, before the final norm) and the model's logits.

    One eval-mode, no-grad forward with the arguments IG-Lens passes (the mask and the
    position ids derived from it, no cache). Returns ``([B, S, d] or [B, P, d], [B, S, V])``.
    """
    params = forward_parameters(lens.model)
    kwargs, mask = forward_kwargs(params, input_ids, attention_mask)
    n = len(lens.decoder_blocks)
    states, logits = forward_with_capture(lens.model, lens.decoder_blocks, input_ids, kwargs,
                                          [n], None, mask, positions)
    return states[n], logits


def _reference_readout(model: nn.Module, lens: Any) -> nn.Module:
    """The readout whose structure sets the bound: the model's own, as resolved."""
    try:
        return resolve_readout(model)
    except UnknownArchitectureError:  # outside the known families: the lens's, if structured
        if isinstance(lens.readout, LensReadout):
            return lens.readout
        raise


def assert_readout_exact(
    model: nn.Module,
    input_ids: Tensor,
    *,
    lens: Any = None,
    attention_mask: Optional[Tensor] = None,
) -> Tensor:
    r"""Assert Invariant R: the lens readout of ``h_n`` is the model's own next-token distribution.

    At every (attended) position and over the whole vocabulary,
    ``softmax(lens.readout(h_n)) == softmax(model(input_ids).logits)`` within the bound of
    two float readouts of the same residual: ``eps sqrt(n) (M + M)`` per probability, with
    ``n`` the readout's longest dot product and ``M`` the sum of ``|terms|`` carried through the
    model's final norm, projections, unembedding and logit transform (soft-cap, scale) to
    that probability (Higham and Mary 2019; arXiv:2606.29693, section 3). A readout that
    skips the final norm or the soft-cap, reads the wrong position or normalises twice
    fails by orders of magnitude more.

    Args:
        model (nn.Module): A Hugging Face causal LM (its mode is restored).
        input_ids (Tensor): ``[B, S]`` int64 token ids.
        lens (IGLens, optional): Keyword-only. The lens whose readout is checked.
            Default: ``IGLens(model)``.
        attention_mask (Tensor, optional): Keyword-only. ``[B, S]``; masked positions are
            not checked.

    Returns:
        Tensor: ``[B, S]`` float64, ``max_v |p_lens - p_model| / bound`` (<= 1 everywhere).

    Raises:
        AssertionError: some probability differs by more than its bound (the message names
            the row, position and token id, both probabilities, the difference, the bound
            and how many entries fail), or the readout has another vocabulary size.
        UnknownArchitectureError: the model's readout cannot be resolved and the lens has
            no structured readout to bound it with.

    Examples::

        >>> model, tokenizer = tiny_causal_lm("gemma2")
        >>> assert_readout_exact(model, tokenizer("w1 w2 w3", return_tensors="pt").input_ids)
    """
    from captum_iglens import IGLens

    model = strip_parallel(model)
    lens = IGLens(model) if lens is None else lens
    hidden, logits = last_residuals(lens, input_ids, attention_mask)
    reference = _reference_readout(model, lens)
    with torch.no_grad():
        lens_logits = lens.readout(hidden)
        tol = readout_tolerance(reference, hidden)
    if lens_logits.shape != logits.shape:
        raise AssertionError(f"The lens readout gives logits {tuple(lens_logits.shape)}, the "
                             f"model {tuple(logits.shape)}: another vocabulary or positions.")
    diff = (torch.softmax(lens_logits.double(), -1) - torch.softmax(logits.double(), -1)).abs()
    ratio = (diff / tol.clamp_min(1e-300)).nan_to_num(float("inf"))
    if attention_mask is not None:
        ratio = ratio * attention_mask.to(ratio.device, ratio.dtype)[..., None]
    if bool((ratio > 1).any()):
        raise AssertionError(_message(ratio, diff, tol, lens_logits, logits))
    return ratio.amax(-1)


def _message(ratio: Tensor, diff: Tensor, tol: Tensor, lens_logits: Tensor,
             logits: Tensor) -> str:
    flat = int(ratio.argmax())
    b, rest = divmod(flat, ratio.shape[1] * ratio.shape[2])
    s, v = divmod(rest, ratio.shape[2])
    p_lens = float(torch.softmax(lens_logits[b, s].double(), -1)[v])
    p_model = float(torch.softmax(logits[b, s].double(), -1)[v])
    return (
        f"Invariant R fails: the lens readout of h_n is not the model's own distribution at "
        f"{int((ratio > 1).sum())} of {ratio.numel()} (position, token) entries. Worst: row "
        f"{b}, position {s}, token id {v}: lens p = {p_lens:.8g}, model p = {p_model:.8g}, "
        f"|diff| = {float(diff[b, s, v]):.3e} > bound {float(tol[b, s, v]):.3e} (rounding of "
        "two readouts of the same residual). A missing final norm, soft-cap or logit scale, "
        "a double norm or a shifted position gives this.")
