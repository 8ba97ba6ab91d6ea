"""Total-effect credits (IGLens(effect="total")) and attribution patching (effect="atp").

Everything is checked against an independent gate implementation written here: its own
hooks on the decoder blocks, full-sequence forwards (no KV cache), one path point at a time,
its own step loop and split rule. The package runs single-position forwards over the clean
KV cache, batched over the path points, so the two share no code past the model itself.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator

import pytest
import torch
from tiny_families import make_family
from torch import Tensor, nn

from captum_iglens import IGLens
from captum_iglens._core.total_clean import GATE_CHECK_EPS
from captum_iglens.lens.architectures import resolve_decoder_blocks
from captum_iglens.lens.hooks import hidden_of
from captum_iglens.lens.readout import resolve_readout

FAMILIES = ("llama", "gpt2", "opt", "gpt_neox", "bloom", "phi")
EPS = torch.finfo(torch.float32).eps
SEQ = 9


def _model(family: str) -> nn.Module:
    return make_family(family, seed=3).eval()


def _ids(seed: int = 0, batch: int = 1) -> Tensor:
    return torch.randint(3, 100, (batch, SEQ), generator=torch.Generator().manual_seed(seed))


# ------------------------------------------------------------------ the independent gates
@contextmanager
def _gated(model: nn.Module, pos: int, gates: Tensor, refs: Tensor,
           site: str = "update") -> Iterator[dict[int, Tensor]]:
    """Full-sequence hooks: block L's output at ``pos`` is ``in + r + g (out - in - r)``.

    ``site="input"`` is a deliberately wrong gate (the block's *input* at ``pos`` scaled
    instead of its update), for the test that the independent check catches it.
    """
    blocks = resolve_decoder_blocks(model)
    seen: dict[int, Tensor] = {}
    handles = []
    for layer, block in enumerate(blocks, start=1):
        def pre(_m, args, kwargs, layer=layer):
            hidden = args[0] if args else kwargs["hidden_states"]
            if site == "input":
                hidden = hidden.clone()
                hidden[:, pos] = refs[layer - 1] + gates[layer - 1] * (hidden[:, pos]
                                                                       - refs[layer - 1])
            seen[layer] = hidden
            return ((hidden, *args[1:]), kwargs) if args else (args, {**kwargs,
                                                                      "hidden_states": hidden})

        def post(_m, _a, output, layer=layer):
            hidden = hidden_of(output)
            if site == "update":
                before, r = seen[layer][:, pos], refs[layer - 1]
                hidden = hidden.clone()
                hidden[:, pos] = before + r + gates[layer - 1] * (hidden[:, pos] - before - r)
            return hidden if isinstance(output, Tensor) else (hidden, *output[1:])
        handles.append(block.register_forward_pre_hook(pre, with_kwargs=True))
        handles.append(block.register_forward_hook(post))
    try:
        yield seen
    finally:
        for handle in handles:
            handle.remove()


def _clean_stream(model: nn.Module, ids: Tensor) -> list[Tensor]:
    """``h_0..h_n`` ``[S, d]`` of row 0, from hooks on a full-sequence forward."""
    blocks = resolve_decoder_blocks(model)
    record: dict[int, Tensor] = {}
    handles = [blocks[0].register_forward_pre_hook(
        lambda _m, a, k: record.__setitem__(0, (a[0] if a else k["hidden_states"])[0].detach()),
        with_kwargs=True)]
    for layer, block in enumerate(blocks, start=1):
        handles.append(block.register_forward_hook(
            lambda _m, _a, o, layer=layer: record.__setitem__(layer, hidden_of(o)[0].detach())))
    with torch.no_grad():
        model(ids)
    for handle in handles:
        handle.remove()
    return [record[i] for i in range(len(blocks) + 1)]


def _f_and_grad(model: nn.Module, ids: Tensor, pos: int, target: int, gates: Tensor,
                refs: Tensor, site: str = "update") -> tuple[float, Tensor]:
    """``F(g) = p(y)`` at ``pos`` and ``dF/dg`` from one full-sequence forward."""
    gates = gates.clone().requires_grad_(True)
    with _gated(model, pos, gates, refs, site):
        logits = model(ids).logits[0, pos]
    wide = torch.float64 if logits.dtype == torch.float64 else torch.float32
    value = torch.log_softmax(logits.to(wide), -1)[target].exp()
    (grad,) = torch.autograd.grad(value, gates)
    return float(value.detach()), grad.detach()


def _independent(model: nn.Module, ids: Tensor, pos: int, target: int, refs: Tensor,
                 n_steps: int, site: str = "update") -> tuple[Tensor, list[float]]:
    """The exact step split with its own loop: trapezoid term + leftover by |G|."""
    k = refs.shape[0]
    points = [_f_and_grad(model, ids, pos, target, torch.full((k,), t / n_steps), refs, site)
              for t in range(n_steps + 1)]
    credits = torch.zeros(k, dtype=torch.float64)
    for (f0, g0), (f1, g1) in zip(points[:-1], points[1:], strict=True):
        term = (g0.double() + g1.double()) / 2 / n_steps
        left = (f1 - f0) - float(term.sum())
        weight = term.abs()
        credits += term + left * (weight / weight.sum() if weight.sum() > 0 else 1.0 / k)
    return credits, [f for f, _ in points]


def _completeness_bound(out) -> Tensor:
    """float32 rounding of ``sum credits - (F(1) - F(0))``: each credit and each end once."""
    return 2 * EPS * (out.attributions.abs().sum(-1) + out.p_final.abs()
                      + out.p_baseline.abs())


def _gate_tol(values: Tensor) -> Tensor:
    """Full-sequence vs cached single-position forwards: the package's own check rule."""
    return GATE_CHECK_EPS * EPS * (1 + values.abs())


# ------------------------------------------------------------------ tests
@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("baseline", ["zero", "mean"])
def test_exact_split_is_complete_at_any_step_count(family: str, baseline: str) -> None:
    model, ids = _model(family), _ids()
    lens = IGLens(model, effect="total")
    for n_steps in (1, 4, 8, 32):
        out = lens.attribute_details(ids, baseline, n_steps=n_steps, positions=[-1, -4])
        gap = (out.attributions.double().sum(-1) - (out.p_final - out.p_baseline).double())
        assert bool((gap.abs() <= _completeness_bound(out)).all()), (n_steps, gap)
        assert bool((out.convergence_delta.abs() <= _completeness_bound(out)).all())
        assert out.effect == "total" and out.method == "prediction_aware"
        assert out.n_steps == n_steps


def _refs_for(model: nn.Module, ids: Tensor, pos: int, baseline: str) -> Tensor:
    stream = _clean_stream(model, ids)
    updates = torch.stack([stream[L][:pos] - stream[L - 1][:pos]
                           for L in range(1, len(stream))])  # [n, pos, d]
    if baseline == "zero":
        return torch.zeros(updates.shape[0], updates.shape[-1])
    return updates[:, 1:].double().mean(1).float()  # positions 1..pos-1: the sink left out


@pytest.mark.parametrize("family", (*FAMILIES, "gpt_neo", "mpt"))
@pytest.mark.parametrize("baseline", ["zero", "mean"])
def test_matches_an_independent_gate_implementation(family: str, baseline: str) -> None:
    # two positions: the package runs them in one forward (each row masking the cached
    # columns at and after its own position), or one each where the family needs it
    # (GPT-Neo's local attention, MPT's ALiBi)
    model, ids = _model(family), _ids(1)
    n_steps = 4
    out = IGLens(model, effect="total").attribute_details(ids, baseline, n_steps=n_steps,
                                                          positions=[SEQ - 1, SEQ - 4])
    for j, pos in enumerate(out.positions):
        target = int(out.target[0, j])
        credits, values = _independent(model, ids, pos, target,
                                       _refs_for(model, ids, pos, baseline), n_steps)
        ends = torch.tensor([values[0], values[-1]])
        assert torch.allclose(torch.stack([out.p_baseline[0, j], out.p_final[0, j]]), ends,
                              rtol=0, atol=float(_gate_tol(ends).max()))
        # each credit: n_steps + 1 values and gradients, each within the forwards' rounding
        tol = (n_steps + 1) * float(_gate_tol(torch.tensor(values)).max()) * 4
        assert float((out.attributions[0, j].double() - credits).abs().max()) <= tol


def test_a_wrong_gate_site_is_caught_by_the_independent_check() -> None:
    model, ids = _model("llama"), _ids(1)
    pos, n_steps = SEQ - 1, 4
    out = IGLens(model, effect="total").attribute_details(ids, "mean", n_steps=n_steps,
                                                          positions=pos)
    refs = _refs_for(model, ids, pos, "mean")
    target = int(out.target[0, 0])
    wrong, values = _independent(model, ids, pos, target, refs, n_steps, site="input")
    tol = (n_steps + 1) * float(_gate_tol(torch.tensor(values)).max()) * 4
    assert float((out.attributions[0, 0].double() - wrong).abs().max()) > 100 * tol


@pytest.mark.parametrize("family", ["llama", "gpt2"])
def test_gradient_estimators_converge_to_the_exact_split(family: str) -> None:
    model, ids = _model(family), _ids(2)
    lens = IGLens(model, effect="total")
    exact = lens.attribute_details(ids, "zero", n_steps=512, positions=-1).attributions[0, 0]
    diffs = []
    for n_steps in (8, 32, 128):
        est = lens.attribute_details(ids, "zero", n_steps=n_steps, method="riemann_middle",
                                     positions=-1)
        diffs.append(float((est.attributions[0, 0] - exact).abs().max()))
    assert diffs[0] > diffs[1] > diffs[2], diffs
    # at 512 steps, within the quadrature error (second order: a quarter of the 256-step gap
    # times the Richardson factor 4/3, plus float32 rounding of 512 gradient terms)
    mid = {n: lens.attribute_details(ids, "zero", n_steps=n, method="riemann_middle",
                                     positions=-1).attributions[0, 0] for n in (256, 512)}
    quad = float((mid[256] - mid[512]).abs().max()) / 3 * 4
    round_off = 512 * EPS * float(mid[512].abs().max() + 1)
    assert float((mid[512] - exact).abs().max()) <= quad + round_off


@pytest.mark.parametrize("family", FAMILIES)
def test_zero_reference_total_is_p_minus_the_embedding_readout(family: str) -> None:
    model, ids = _model(family), _ids(4)
    out = IGLens(model, effect="total").attribute_details(ids, "zero", n_steps=8,
                                                          positions=[-1, -3])
    with torch.no_grad():
        probs = torch.softmax(model(ids).logits[0].float(), -1)
    h0 = _clean_stream(model, ids)[0]
    with torch.no_grad():
        base = torch.softmax(resolve_readout(model)(h0).float(), -1)
    for j, pos in enumerate(out.positions):
        y = int(out.target[0, j])
        expected = probs[pos, y] - base[pos, y]
        tol = _gate_tol(probs[pos, y]) + _gate_tol(base[pos, y]) + _completeness_bound(out)[0, j]
        assert abs(float(out.attributions[0, j].sum()) - float(expected)) <= float(tol)


@pytest.mark.parametrize("family", ["llama", "gpt_neox", "opt"])
def test_mean_reference_start_is_the_mean_ablated_forward(family: str) -> None:
    model, ids = _model(family), _ids(5)
    pos = SEQ - 2
    out = IGLens(model, effect="total").attribute_details(ids, "mean", n_steps=2, positions=pos)
    refs = _refs_for(model, ids, pos, "mean")
    blocks = resolve_decoder_blocks(model)
    seen: dict[int, Tensor] = {}
    handles = []
    for layer, block in enumerate(blocks, start=1):
        handles.append(block.register_forward_pre_hook(
            lambda _m, a, k, layer=layer: seen.__setitem__(layer, a[0] if a else
                                                           k["hidden_states"]),
            with_kwargs=True))

        def post(_m, _a, output, layer=layer):
            hidden = hidden_of(output).clone()
            hidden[:, pos] = seen[layer][:, pos] + refs[layer - 1]
            return hidden if isinstance(output, Tensor) else (hidden, *output[1:])
        handles.append(block.register_forward_hook(post))
    with torch.no_grad():
        p = torch.softmax(model(ids).logits[0, pos].float(), -1)[int(out.target[0, 0])]
    for handle in handles:
        handle.remove()
    assert abs(float(out.p_baseline[0, 0]) - float(p)) <= float(_gate_tol(p))


def test_padded_batch_rows_equal_single_rows() -> None:
    model = _model("llama")
    ids = _ids(6, batch=2)
    mask = torch.ones_like(ids)
    mask[1, :2] = 0
    lens = IGLens(model, effect="total")
    both = lens.attribute_details(ids, "mean", None, mask, n_steps=4, positions=[-1, -2])
    alone = lens.attribute_details(ids[1:, 2:], "mean", n_steps=4, positions=[-1, -2])
    tol = 8 * float(_gate_tol(both.p_final[1]).max())
    assert float((both.attributions[1] - alone.attributions[0]).abs().max()) <= tol


def test_reference_ids_gate_to_the_corrupted_prompts_updates() -> None:
    model, ids = _model("llama"), _ids(7)
    corrupt = ids.clone()
    corrupt[0, 2:5] = 7
    pos = SEQ - 1
    out = IGLens(model, effect="total").attribute_details(ids, corrupt, n_steps=4,
                                                          positions=pos)
    stream = _clean_stream(model, corrupt)
    refs = torch.stack([stream[L][pos] - stream[L - 1][pos] for L in range(1, len(stream))])
    credits, values = _independent(model, ids, pos, int(out.target[0, 0]), refs, 4)
    assert out.baseline == "reference ids"
    tol = 5 * float(_gate_tol(torch.tensor(values)).max()) * 4
    assert float((out.attributions[0, 0].double() - credits).abs().max()) <= tol


def test_refusals_name_what_to_do() -> None:
    model, ids = _model("llama"), _ids()
    with pytest.raises(ValueError, match="effect="):
        IGLens(model, effect="causal")
    with pytest.raises(ValueError, match="embedding"):
        IGLens(model, layers=[0, 2], effect="total").attribute(ids, "zero")
    with pytest.raises(ValueError, match="reference of the total effect"):
        IGLens(model, effect="total").attribute(ids, "embedding")
    with pytest.raises(ValueError, match="attention sink"):
        IGLens(model, effect="total").attribute(ids, "mean", positions=1)


def test_readout_default_is_unchanged() -> None:
    model, ids = _model("llama"), _ids()
    plain = IGLens(model).attribute(ids, positions=[-1, -2])
    named = IGLens(model, effect="readout").attribute(ids, positions=[-1, -2])
    assert torch.equal(plain, named)


def _grad_at_residual(model: nn.Module, ids: Tensor, pos: int, target: int) -> list[Tensor]:
    """``grad_{h_L[pos]} p(y)`` for every block, from zero leaves added on a full forward."""
    blocks = resolve_decoder_blocks(model)
    d = _clean_stream(model, ids)[0].shape[-1]
    leaves = [torch.zeros(d, requires_grad=True) for _ in blocks]
    handles = []
    for layer, block in enumerate(blocks):
        def post(_m, _a, output, layer=layer):
            hidden = hidden_of(output).clone()
            hidden[:, pos] = hidden[:, pos] + leaves[layer]
            return hidden if isinstance(output, Tensor) else (hidden, *output[1:])
        handles.append(block.register_forward_hook(post))
    value = torch.softmax(model(ids).logits[0, pos].float(), -1)[target]
    grads = torch.autograd.grad(value, leaves)
    for handle in handles:
        handle.remove()
    return list(grads)


@pytest.mark.parametrize("family", ["llama", "gpt2", "bloom"])
@pytest.mark.parametrize("baseline", ["zero", "mean"])
def test_atp_is_the_gradient_dot_the_update_change(family: str, baseline: str) -> None:
    model, ids = _model(family), _ids(8)
    pos = SEQ - 1
    out = IGLens(model, effect="atp").attribute_details(ids, baseline, positions=pos)
    target = int(out.target[0, 0])
    stream = _clean_stream(model, ids)
    refs = _refs_for(model, ids, pos, baseline)
    grads = _grad_at_residual(model, ids, pos, target)
    expected = torch.stack([grads[L - 1] @ (stream[L][pos] - stream[L - 1][pos] - refs[L - 1])
                            for L in range(1, len(stream))])
    mag = torch.stack([grads[L - 1].abs() @ (stream[L][pos] - stream[L - 1][pos]
                                             - refs[L - 1]).abs()
                       for L in range(1, len(stream))])
    tol = GATE_CHECK_EPS * EPS * (mag + 1e-3)
    assert bool(((out.attributions[0, 0] - expected).abs() <= tol).all())
    assert out.effect == "atp" and not out.is_decomposition
    assert "not a decomposition" in out.delta_meaning
    # its delta is the gap to delta_p, which an estimate need not close
    gap = out.attributions[0, 0].sum() - (out.p_final[0, 0] - out.p_baseline[0, 0])
    assert abs(float(out.convergence_delta[0, 0] - gap)) <= 4 * EPS


def test_atp_matches_finite_differences_of_the_gate() -> None:
    # GPT-2 LayerNorm runs in the model dtype (Llama RMSNorm rounds through float32,
    # which would swamp a float64 difference quotient)
    model = make_family("gpt2", seed=3, dtype=torch.float64).eval()
    ids, pos = _ids(9), SEQ - 1
    out = IGLens(model, effect="atp").attribute_details(ids, "zero", positions=pos)
    target = int(out.target[0, 0])
    n = len(resolve_decoder_blocks(model))
    refs = torch.zeros(n, 64, dtype=torch.float64)
    h = 1e-5
    for L in range(n):
        down = torch.ones(n, dtype=torch.float64)
        down[L] -= h
        up = torch.ones(n, dtype=torch.float64)
        up[L] += h
        f_up, _ = _f_and_grad(model, ids, pos, target, up, refs)
        f_down, _ = _f_and_grad(model, ids, pos, target, down, refs)
        # central difference: error O(h^2 F3) ~ 1e-10 plus rounding eps64 / h ~ 1e-11
        assert abs((f_up - f_down) / (2 * h) - float(out.attributions[0, 0, L])) <= 1e-8


def test_captum_convergence_delta_agrees_with_attribute() -> None:
    model, ids = _model("llama"), _ids(10)
    lens = IGLens(model, effect="total")
    attr, delta = lens.attribute(ids, "zero", n_steps=8, positions=[-1, -2],
                                 return_convergence_delta=True)
    again = lens.compute_convergence_delta(attr, "zero", ids, positions=[-1, -2])
    # F(0) and F(1) are re-read in a batch of another size: each within the gate rule
    out = lens.attribute_details(ids, "zero", n_steps=8, positions=[-1, -2])
    tol = _gate_tol(out.p_final) + _gate_tol(out.p_baseline) + _completeness_bound(out)
    assert bool(((again - delta).abs() <= tol).all())
    assert lens.has_convergence_delta() and lens.effect == "total"


# ------------------------------------------------------------------ sub-layer gates
_HALF = {"llama": "post_attention_layernorm", "gpt2": "ln_2", "opt": "final_layer_norm"}


def _sub_f_and_grad(model: nn.Module, family: str, ids: Tensor, pos: int, target: int,
                    gates: Tensor, refs: Tensor) -> tuple[float, Tensor]:
    """Full-sequence sub-layer gates: ``gates``/``refs`` ``[2n]`` (attention, MLP per block).

    The MLP's pre-norm gets the gated half residual; the block output is rebuilt as the gated
    half residual plus the gated MLP update (the MLP update read as output minus the ungated
    half residual the block added it to).
    """
    gates = gates.clone().requires_grad_(True)
    blocks = resolve_decoder_blocks(model)
    seen: dict = {}
    handles = []
    for layer, block in enumerate(blocks):
        a, m = 2 * layer, 2 * layer + 1

        def pre_block(_m, args, kwargs, layer=layer):
            seen[("in", layer)] = args[0] if args else kwargs["hidden_states"]

        def pre_half(_m, args, kwargs, layer=layer, a=a):
            mid = args[0] if args else kwargs["hidden_states"]
            flat = mid.dim() == 2
            mid3 = mid.reshape(seen[("in", layer)].shape)
            before = seen[("in", layer)][:, pos]
            gated = before + refs[a] + gates[a] * (mid3[:, pos] - before - refs[a])
            seen[("mid", layer)], seen[("old", layer)] = gated, mid3[:, pos]
            new = mid3.clone()
            new[:, pos] = gated
            new = new.reshape(mid.shape) if flat else new
            return ((new, *args[1:]), kwargs) if args else (args, {**kwargs,
                                                                   "hidden_states": new})

        def post(_m, _a, output, layer=layer, m=m):
            hidden = hidden_of(output).clone()
            mlp = hidden[:, pos] - seen[("old", layer)]
            mid = seen[("mid", layer)]
            hidden[:, pos] = mid + refs[m] + gates[m] * (mlp - refs[m])
            return hidden if isinstance(output, Tensor) else (hidden, *output[1:])
        handles.append(block.register_forward_pre_hook(pre_block, with_kwargs=True))
        handles.append(getattr(block, _HALF[family]).register_forward_pre_hook(
            pre_half, with_kwargs=True))
        handles.append(block.register_forward_hook(post))
    try:
        logits = model(ids).logits[0, pos]
    finally:
        for handle in handles:
            handle.remove()
    value = torch.log_softmax(logits.float(), -1)[target].exp()
    (grad,) = torch.autograd.grad(value, gates)
    return float(value.detach()), grad.detach()


@pytest.mark.parametrize("family", sorted(_HALF))
def test_sublayer_gates_match_an_independent_implementation(family: str) -> None:
    model, ids = _model(family), _ids(11)
    n_steps, pos = 4, SEQ - 1
    lens = IGLens(model, effect="total", granularity="sublayer")
    out = lens.attribute_details(ids, "zero", n_steps=n_steps, positions=[pos, pos - 2])
    assert out.layer_indices == (1, 2, 3, 4) and out.granularity == "sublayer"
    assert bool((out.convergence_delta.abs() <= _completeness_bound(out)).all())
    n = len(resolve_decoder_blocks(model))
    refs = torch.zeros(2 * n, _clean_stream(model, ids)[0].shape[-1])
    for j, p in enumerate(out.positions):
        points = [_sub_f_and_grad(model, family, ids, p, int(out.target[0, j]),
                                  torch.full((2 * n,), t / n_steps), refs)
                  for t in range(n_steps + 1)]
        credits = torch.zeros(2 * n, dtype=torch.float64)
        for (f0, g0), (f1, g1) in zip(points[:-1], points[1:], strict=True):
            term = (g0.double() + g1.double()) / 2 / n_steps
            weight = term.abs()
            credits += term + ((f1 - f0) - float(term.sum())) * weight / weight.sum()
        values = torch.tensor([f for f, _ in points])
        tol = (n_steps + 1) * float(_gate_tol(values).max()) * 4
        assert float((out.attributions[0, j].double() - credits).abs().max()) <= tol
    # the whole-block gates reach the same F(1); with every update removed, F(0) = f(h_0)
    block = IGLens(model, effect="total").attribute_details(ids, "zero", n_steps=2,
                                                            positions=[pos, pos - 2])
    assert bool(((out.p_final - block.p_final).abs() <= 2 * _gate_tol(block.p_final)).all())
    assert bool(((out.p_baseline - block.p_baseline).abs()
                 <= 2 * _gate_tol(block.p_baseline)).all())


def test_sublayer_gates_refuse_parallel_blocks() -> None:
    with pytest.raises(ValueError, match="parallel blocks"):
        IGLens(_model("gptj"), effect="total", granularity="sublayer").attribute(_ids(), "zero")


def test_causal_update_mean_equals_a_position_by_position_mean() -> None:
    from captum_iglens._core.total_refs import causal_update_mean

    gen = torch.Generator().manual_seed(0)
    updates = torch.randn(2, 9, 3, 5, generator=gen)
    mask = torch.ones(2, 9, dtype=torch.long)
    mask[1, :2] = 0  # left padding in row 1
    # row 0 packs two documents (positions restart at column 4); row 1 is one document
    position_ids = torch.tensor([[0, 1, 2, 3, 0, 1, 2, 3, 4], [0, 0, 0, 1, 2, 3, 4, 5, 6]])
    positions = [6, 8]  # row 0: document 2 only (columns 5..), never document 1
    got = causal_update_mean(updates, positions, mask, position_ids)
    first = {0: [0, 4], 1: [2]}  # each document's first real column: the sink, left out
    for b in range(2):
        for j, pos in enumerate(positions):
            begin = max(s for s in first[b] if s <= pos)
            want = updates[b, begin + 1:pos].double().mean(0)
            # both accumulate in float64 and round once to float32
            assert bool(((got[b, j].double() - want).abs()
                         <= EPS * want.abs() + 1e-12).all()), (b, pos)
