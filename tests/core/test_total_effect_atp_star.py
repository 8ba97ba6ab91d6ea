"""AtP*'s GradDrop on the gated nodes (``run_total(..., grad_drop=True)``, effect="atp").

Checked against an independent implementation: full-sequence forwards, the gates of
tests/core/test_total_effect.py, and block ``l``'s backward path cut at the explained
position by ``h_l = h_{l-1} + (h_l - h_{l-1}).detach()`` (the gradient flows through the
residual skip only); ``c*(L) = 1/(n-1) sum_{l != L} |dF/dg_L with block l dropped|``.
"""

from __future__ import annotations

import pytest
import torch
from tiny_families import make_family
from torch import Tensor, nn

from captum_iglens import IGLens
from captum_iglens._core.total_clean import GATE_CHECK_EPS
from captum_iglens._core.total_effect import run_total
from captum_iglens.lens.architectures import resolve_decoder_blocks
from captum_iglens.lens.hooks import hidden_of

EPS = torch.finfo(torch.float32).eps
SEQ = 9


def _ids(seed: int) -> Tensor:
    return torch.randint(3, 100, (1, SEQ), generator=torch.Generator().manual_seed(seed))


def _grads(model: nn.Module, ids: Tensor, pos: int, target: int, drop: int) -> Tensor:
    """``dF/dg`` at ``g = 1`` (zero reference), block ``drop``'s backward cut (-1: none)."""
    blocks = resolve_decoder_blocks(model)
    gates = torch.ones(len(blocks), requires_grad=True)
    seen = {}
    handles = []
    for L, block in enumerate(blocks):
        def pre(_m, args, kwargs, L=L):
            seen[L] = args[0] if args else kwargs["hidden_states"]

        def post(_m, _a, output, L=L):
            hidden = hidden_of(output).clone()
            before = seen[L][:, pos]
            out = hidden[:, pos]
            if L == drop:
                out = before + (out - before).detach()
            hidden[:, pos] = before + gates[L] * (out - before)
            return hidden if isinstance(output, Tensor) else (hidden, *output[1:])
        handles += [block.register_forward_pre_hook(pre, with_kwargs=True),
                    block.register_forward_hook(post)]
    try:
        logits = model(ids).logits[0, pos]
    finally:
        for h in handles:
            h.remove()
    value = torch.log_softmax(logits.float(), -1)[target].exp()
    (grad,) = torch.autograd.grad(value, gates)
    return grad.double()


@pytest.mark.parametrize("family, n_blocks", [("llama", 4), ("gpt2", 3), ("opt", 3)])
def test_grad_drop_matches_an_independent_implementation(family: str, n_blocks: int) -> None:
    model, ids = make_family(family, seed=3, n_blocks=n_blocks).eval(), _ids(31)
    spec = IGLens(model, effect="atp").spec
    star, _ = run_total(spec, ids, "zero", None, None, 1, "prediction_aware", None,
                        [SEQ - 1, SEQ - 3], grad_drop=True)
    plain, _ = run_total(spec, ids, "zero", None, None, 1, "prediction_aware", None,
                         [SEQ - 1, SEQ - 3])
    assert star.method == "atp*" and star.effect == "atp" and not star.is_decomposition
    for j, pos in enumerate(star.positions):
        target = int(star.target[0, j])
        rows = torch.stack([_grads(model, ids, pos, target, drop) for drop in range(n_blocks)])
        own = torch.eye(n_blocks, dtype=torch.bool)
        want = (rows.abs() * ~own).sum(0) / (n_blocks - 1)
        tol = 4 * GATE_CHECK_EPS * EPS * float(rows.abs().max() + 1e-3)
        assert float((star.attributions[0, j].double() - want).abs().max()) <= tol
        # dropping an upstream block leaves a node's estimate as AtP's; the last block has
        # nothing downstream, so its AtP* is |AtP|
        assert abs(float(star.attributions[0, j, -1]) - abs(float(plain.attributions[0, j,
                                                                                     -1]))) <= tol
        # and somewhere a later block's dropped path changes an estimate (the fix has teeth)
        assert float((rows - _grads(model, ids, pos, target, -1)).abs().max()) > 100 * tol


def test_grad_drop_heads_and_sublayers_are_nonnegative_and_refusals() -> None:
    model, ids = make_family("llama", seed=3, n_blocks=3).eval(), _ids(32)
    spec = IGLens(model, effect="atp", granularity="sublayer", heads=True).spec
    out, _ = run_total(spec, ids, "mean", None, None, 1, "prediction_aware", None, -1,
                       grad_drop=True)
    assert bool((out.attributions >= 0).all()) and bool((out.head_credits >= 0).all())
    assert out.attributions.shape[-1] == 6 and out.head_credits.shape[2] == 3
    total = IGLens(model, effect="total").spec
    with pytest.raises(ValueError, match="effect='atp'"):
        run_total(total, ids, "zero", None, None, 1, "prediction_aware", None, -1,
                  grad_drop=True)
    one = IGLens(make_family("llama", seed=3, n_blocks=1).eval(), effect="atp").spec
    with pytest.raises(ValueError, match=">= 2 blocks"):
        run_total(one, ids, "zero", None, None, 1, "prediction_aware", None, -1,
                  grad_drop=True)
