"""Head gates of the total effect and AtP (granularity="sublayer", heads=True).

Checked against an independent gate implementation written here: full-sequence forwards,
a pre-hook on each block's ``o_proj`` that gates every head's slice of its input at the
explained position (``z_h = z'_h + g_h (z_h - z'_h)``), a forward hook on ``o_proj`` that
gates what no head holds (the bias's change, ``r_a - W_o z' - b``), and the MLP update gated
at the block output; ``dF/dg`` of every head, rest and MLP gate straight from autograd, and
its own two-level step split. The package instead adds a zero probe to the gated half
residual and dots its gradient with ``W_o[:, h] (z_h - z'_h)`` over a KV cache.
"""

from __future__ import annotations

import pytest
import torch
from tiny_families import make_family
from torch import Tensor, nn

from captum_iglens import IGLens
from captum_iglens._core.total_clean import GATE_CHECK_EPS
from captum_iglens.lens.architectures import resolve_decoder_blocks
from captum_iglens.lens.hooks import hidden_of
from captum_iglens.lens.sublayer import HEAD_FAMILIES
from captum_iglens.testing.tiny import FAMILY_NAMES

HEAD_TINY = tuple(f for f in FAMILY_NAMES if f in HEAD_FAMILIES)
EPS = torch.finfo(torch.float32).eps
SEQ = 9


def _ids(seed: int) -> Tensor:
    return torch.randint(3, 100, (1, SEQ), generator=torch.Generator().manual_seed(seed))


def _model(family: str) -> nn.Module:
    return make_family(family, seed=3).eval()


def _clean(model: nn.Module, ids: Tensor) -> dict:
    """Row 0's ``h_{L-1}``, ``L.attn``, ``h_L`` and ``o_proj`` input ``[S, .]`` per block."""
    rec: dict = {}
    handles = []
    for L, block in enumerate(resolve_decoder_blocks(model)):
        handles += [
            block.register_forward_pre_hook(lambda _m, a, k, L=L: rec.__setitem__(
                ("in", L), (a[0] if a else k["hidden_states"])[0].detach()), with_kwargs=True),
            block.post_attention_layernorm.register_forward_pre_hook(
                lambda _m, a, L=L: rec.__setitem__(("mid", L), a[0][0].detach())),
            block.self_attn.o_proj.register_forward_pre_hook(
                lambda _m, a, L=L: rec.__setitem__(("z", L), a[0][0].detach())),
            block.register_forward_hook(lambda _m, _a, o, L=L: rec.__setitem__(
                ("out", L), hidden_of(o)[0].detach()))]
    with torch.no_grad():
        model(ids)
    for h in handles:
        h.remove()
    return rec


def _refs(model: nn.Module, rec: dict, pos: int, baseline: str) -> list[dict]:
    """Per block ``r_a``, ``z'`` and ``r_m`` (zero, or the mean over positions 1..pos-1)."""
    out = []
    for L in range(len(resolve_decoder_blocks(model))):
        att = rec[("mid", L)] - rec[("in", L)]
        mlp = rec[("out", L)] - rec[("mid", L)]
        pieces = {"a": att, "z": rec[("z", L)], "m": mlp}
        if baseline == "zero":
            out.append({k: torch.zeros_like(v[0]) for k, v in pieces.items()})
        else:
            out.append({k: v[1:pos].double().mean(0).float() for k, v in pieces.items()})
    return out


def _f_and_grads(model: nn.Module, ids: Tensor, pos: int, target: int, alpha: float,
                 refs: list[dict], n_heads: int, wrong: bool = False) -> tuple[float, Tensor]:
    """``F`` and ``dF/dg`` ``[n, H + 2]`` (heads, rest, MLP) with every gate at ``alpha``.

    ``wrong=True`` gates the heads' ``o_proj`` slices at every position up to ``pos`` (a
    wrong site for the position-scope gates: the earlier positions' keys and values move).
    """
    blocks = resolve_decoder_blocks(model)
    gates = torch.full((len(blocks), n_heads + 2), alpha, requires_grad=True)
    seen: dict = {}
    handles = []
    for L, block in enumerate(blocks):
        proj = block.self_attn.o_proj

        def z_gate(_m, args, L=L):
            z = args[0].clone()
            ref = refs[L]["z"]
            per_head = gates[L, :n_heads].repeat_interleave(z.shape[-1] // n_heads)
            at = slice(0, pos + 1) if wrong else pos
            z[:, at] = ref + per_head * (z[:, at] - ref)
            return (z,)

        def rest_gate(m, _a, output, L=L):
            rest = refs[L]["a"] - nn.functional.linear(refs[L]["z"], m.weight, m.bias)
            out = output.clone()
            out[:, pos] = out[:, pos] + (1 - gates[L, n_heads]) * rest
            return out

        def mid(_m, args, L=L):
            seen[L] = args[0][:, pos]

        def mlp_gate(_m, _a, output, L=L):
            hidden = hidden_of(output).clone()
            r = refs[L]["m"]
            hidden[:, pos] = seen[L] + r + gates[L, n_heads + 1] * (hidden[:, pos] - seen[L] - r)
            return hidden if isinstance(output, Tensor) else (hidden, *output[1:])
        handles += [proj.register_forward_pre_hook(z_gate),
                    proj.register_forward_hook(rest_gate),
                    block.post_attention_layernorm.register_forward_pre_hook(mid),
                    block.register_forward_hook(mlp_gate)]
    try:
        logits = model(ids).logits[0, pos]
    finally:
        for h in handles:
            h.remove()
    value = torch.log_softmax(logits.float(), -1)[target].exp()
    (grad,) = torch.autograd.grad(value, gates)
    return float(value.detach()), grad.detach().double()


def _step_split(change: Tensor, g0: Tensor, g1: Tensor, da: float) -> Tensor:
    term = (g0 + g1) / 2 * da
    weight = term.abs()
    return term + (change - term.sum(-1, keepdim=True)) * weight / weight.sum(-1, keepdim=True)


def _independent(model, ids, pos, target, refs, n_heads, n_steps, wrong=False):
    """Node credits ``[2n]`` (attention, MLP per block) and head credits ``[n, H + 1]``."""
    points = [_f_and_grads(model, ids, pos, target, t / n_steps, refs, n_heads, wrong)
              for t in range(n_steps + 1)]
    n = points[0][1].shape[0]
    nodes = torch.zeros(2 * n, dtype=torch.float64)
    heads = torch.zeros(n, n_heads + 1, dtype=torch.float64)
    for (f0, g0), (f1, g1) in zip(points[:-1], points[1:], strict=True):
        def node(g):  # the attention node's gradient is its heads' and rest's together
            return torch.stack([g[:, :n_heads + 1].sum(-1), g[:, -1]], dim=1).flatten()
        step = _step_split(torch.tensor([f1 - f0], dtype=torch.float64), node(g0), node(g1),
                           1 / n_steps)
        nodes += step
        heads += _step_split(step[0::2, None], g0[:, :n_heads + 1], g1[:, :n_heads + 1],
                             1 / n_steps)
    return nodes, heads, torch.tensor([f for f, _ in points]), points[-1][1]


def _gate_tol(values: Tensor) -> float:
    return float((GATE_CHECK_EPS * EPS * (1 + values.abs())).max())


@pytest.mark.parametrize("family", HEAD_TINY)
@pytest.mark.parametrize("baseline", ["zero", "mean"])
def test_head_credits_match_an_independent_o_proj_gate(family: str, baseline: str) -> None:
    model, ids = _model(family), _ids(12)
    n_steps = 4
    lens = IGLens(model, effect="total", granularity="sublayer", heads=True)
    out = lens.attribute_details(ids, baseline, n_steps=n_steps, positions=[SEQ - 1, SEQ - 3])
    n_heads = out.head_credits.shape[-1]
    rec = _clean(model, ids)
    for j, pos in enumerate(out.positions):
        refs = _refs(model, rec, pos, baseline)
        nodes, heads, values, _ = _independent(model, ids, pos, int(out.target[0, j]), refs,
                                               n_heads, n_steps)
        tol = (n_steps + 1) * _gate_tol(values) * 4
        assert float((out.attributions[0, j].double() - nodes).abs().max()) <= tol
        got = torch.cat([out.head_credits[0, j], out.head_rest[0, j, :, None]], -1).double()
        assert float((got - heads).abs().max()) <= tol, (got, heads)


@pytest.mark.parametrize("family", HEAD_TINY)
def test_head_credits_add_up_at_any_step_count(family: str) -> None:
    model, ids = _model(family), _ids(13)
    lens = IGLens(model, effect="total", granularity="sublayer", heads=True)
    for n_steps in (1, 4, 8, 32):
        out = lens.attribute_details(ids, "mean", n_steps=n_steps, positions=[-1, -2])
        att = out.attributions[..., 0::2].double()
        heads = out.head_credits.double().sum(-1) + out.head_rest.double()
        # float32 rounding of each head credit, the rest and the attention credit once
        bound = 2 * EPS * (out.head_credits.abs().sum(-1) + out.head_rest.abs() + att.abs())
        assert bool(((heads - att).abs() <= bound).all()), n_steps
        gap = out.attributions.double().sum(-1) - (out.p_final - out.p_baseline).double()
        whole = 2 * EPS * (out.attributions.abs().sum(-1) + out.p_final.abs()
                           + out.p_baseline.abs())
        assert bool((gap.abs() <= whole).all()), n_steps


@pytest.mark.parametrize("family", ["llama", "qwen2", "gemma"])
def test_head_atp_is_the_gradient_dot_each_heads_change(family: str) -> None:
    model, ids = _model(family), _ids(14)
    pos = SEQ - 1
    out = IGLens(model, effect="atp", granularity="sublayer",
                 heads=True).attribute_details(ids, "mean", positions=pos)
    n_heads = out.head_credits.shape[-1]
    refs = _refs(model, _clean(model, ids), pos, "mean")
    value, grads = _f_and_grads(model, ids, pos, int(out.target[0, 0]), 1.0, refs, n_heads)
    got = torch.cat([out.head_credits[0, 0], out.head_rest[0, 0, :, None]], -1).double()
    tol = 4 * _gate_tol(torch.tensor([value]))
    assert float((got - grads[:, :n_heads + 1]).abs().max()) <= tol
    # the heads and the rest add up to the attention node's own AtP estimate
    att = out.attributions[0, 0, 0::2].double()
    assert float((got.sum(-1) - att).abs().max()) <= 2 * EPS * float(got.abs().sum() + 1)


def test_a_wrong_head_site_is_caught() -> None:
    # the heads' o_proj slices gated at every position up to i (so the earlier positions'
    # keys and values move with the gates): the independent check must tell it apart
    model, ids = _model("llama"), _ids(12)
    pos = SEQ - 1
    out = IGLens(model, effect="total", granularity="sublayer",
                 heads=True).attribute_details(ids, "zero", n_steps=4, positions=pos)
    n_heads = out.head_credits.shape[-1]
    refs = _refs(model, _clean(model, ids), pos, "zero")
    _, wrong, values, _ = _independent(model, ids, pos, int(out.target[0, 0]), refs,
                                       n_heads, 4, wrong=True)
    got = torch.cat([out.head_credits[0, 0], out.head_rest[0, 0, :, None]], -1).double()
    tol = 5 * _gate_tol(values) * 4
    assert float((got - wrong).abs().max()) > 100 * tol


def test_head_gates_with_reference_ids_take_the_corrupted_prompts_o_proj_input() -> None:
    model, ids = _model("llama"), _ids(15)
    corrupt = ids.clone()
    corrupt[0, 2:5] = 7
    pos, n_steps = SEQ - 1, 4
    out = IGLens(model, effect="total", granularity="sublayer",
                 heads=True).attribute_details(ids, corrupt, n_steps=n_steps, positions=pos)
    n_heads = out.head_credits.shape[-1]
    rec = _clean(model, corrupt)
    refs = [{"a": rec[("mid", L)][pos] - rec[("in", L)][pos], "z": rec[("z", L)][pos],
             "m": rec[("out", L)][pos] - rec[("mid", L)][pos]}
            for L in range(len(resolve_decoder_blocks(model)))]
    nodes, heads, values, _ = _independent(model, ids, pos, int(out.target[0, 0]), refs,
                                           n_heads, n_steps)
    tol = (n_steps + 1) * _gate_tol(values) * 4
    got = torch.cat([out.head_credits[0, 0], out.head_rest[0, 0, :, None]], -1).double()
    assert out.baseline == "reference ids"
    assert float((out.attributions[0, 0].double() - nodes).abs().max()) <= tol
    assert float((got - heads).abs().max()) <= tol
