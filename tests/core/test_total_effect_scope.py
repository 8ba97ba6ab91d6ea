"""``scope="sequence"``: every block's update at every position up to ``i`` gated together.

Write ``G(e, g)`` for ``F`` with the earlier positions' gates ``e`` and position ``i``'s gates
``g``. Position scope is ``F_pos(g) = G(1, g)``, sequence scope ``F_seq(g) = G(g, g)``. At
``g = 0`` every update at ``i`` is its reference and ``h_0[i]`` is the embedding, so ``h_n[i]``
does not depend on the earlier positions: ``G(e, 0) = G(1, 0)``, and both scopes split the
same change ``F(1) - F(0)``. At ``g = 1`` the chain rule gives
``dF_seq/dg_L = dF_pos/dg_L + sum_{q < i} dG/de_{L,q}``: AtP of the two scopes differs by
exactly the earlier positions' gate gradients. Both facts, and the credits, are checked
against an independent implementation here (full-sequence hooks, per-position gates).
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
FAMILIES = ("llama", "gpt2", "opt", "gpt_neox", "bloom", "phi")


def _ids(seed: int) -> Tensor:
    return torch.randint(3, 100, (1, SEQ), generator=torch.Generator().manual_seed(seed))


def _run(model: nn.Module, ids: Tensor, baseline: str, scope: str, n_steps: int = 4,
         effect: str = "total", positions=(SEQ - 1, SEQ - 3)):
    spec = IGLens(model, effect=effect).spec
    out, _ = run_total(spec, ids, baseline, None, None, n_steps, "prediction_aware", None,
                       list(positions), scope=scope)
    return out


def _updates(model: nn.Module, ids: Tensor) -> Tensor:
    """``[n, S, d]`` every block's clean update (row 0), from hooks on a full forward."""
    seen, out = {}, {}
    handles = []
    for L, block in enumerate(resolve_decoder_blocks(model)):
        handles.append(block.register_forward_pre_hook(
            lambda _m, a, k, L=L: seen.__setitem__(L, (a[0] if a else k["hidden_states"])[0]),
            with_kwargs=True))
        handles.append(block.register_forward_hook(
            lambda _m, _a, o, L=L: out.__setitem__(L, hidden_of(o)[0] - seen[L])))
    with torch.no_grad():
        model(ids)
    for h in handles:
        h.remove()
    return torch.stack([out[L] for L in range(len(out))])


def _refs(updates: Tensor, baseline: str) -> tuple[Tensor, Tensor]:
    """``[n, S, d]`` per-position references and ``[S]`` which positions are gated."""
    if baseline == "zero":
        return torch.zeros_like(updates), torch.ones(updates.shape[1], dtype=torch.bool)
    refs = torch.zeros_like(updates)
    for q in range(2, updates.shape[1]):  # positions 1..q-1: the sink (0) left out
        refs[:, q] = updates[:, 1:q].double().mean(1).float()
    defined = torch.arange(updates.shape[1]) >= 2
    return refs, defined


def _g(model: nn.Module, ids: Tensor, pos: int, target: int, gates: Tensor, refs: Tensor,
       defined: Tensor) -> tuple[float, Tensor]:
    """``G`` with per-position gates ``gates [n, pos + 1]``, and ``dG/dgates``."""
    gates = gates.clone().requires_grad_(True)
    seen = {}
    handles = []
    for L, block in enumerate(resolve_decoder_blocks(model)):
        def pre(_m, args, kwargs, L=L):
            seen[L] = args[0] if args else kwargs["hidden_states"]

        def post(_m, _a, output, L=L):
            hidden = hidden_of(output)
            new = hidden.clone()
            for q in range(pos + 1):
                if defined[q]:
                    before, r = seen[L][:, q], refs[L, q]
                    new[:, q] = before + r + gates[L, q] * (hidden[:, q] - before - r)
            return new if isinstance(output, Tensor) else (new, *output[1:])
        handles += [block.register_forward_pre_hook(pre, with_kwargs=True),
                    block.register_forward_hook(post)]
    try:
        logits = model(ids[:, :pos + 1]).logits[0, -1]
    finally:
        for h in handles:
            h.remove()
    value = torch.log_softmax(logits.float(), -1)[target].exp()
    (grad,) = torch.autograd.grad(value, gates)
    return float(value.detach()), grad.detach().double()


def _tol(values: Tensor, n_steps: int) -> float:
    return (n_steps + 1) * float((GATE_CHECK_EPS * EPS * (1 + values.abs())).max()) * 4


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("baseline", ["zero", "mean"])
def test_sequence_scope_matches_an_independent_implementation(family, baseline) -> None:
    model, ids, n_steps = make_family(family, seed=3).eval(), _ids(21), 4
    out = _run(model, ids, baseline, "sequence", n_steps)
    refs, defined = _refs(_updates(model, ids), baseline)
    n = refs.shape[0]
    for j, pos in enumerate(out.positions):
        target = int(out.target[0, j])
        points = [_g(model, ids, pos, target, torch.full((n, pos + 1), t / n_steps), refs,
                     defined) for t in range(n_steps + 1)]
        credits = torch.zeros(n, dtype=torch.float64)
        for (f0, g0), (f1, g1) in zip(points[:-1], points[1:], strict=True):
            term = (g0.sum(1) + g1.sum(1)) / 2 / n_steps  # dF_seq/dg_L: all its gates
            w = term.abs()
            credits += term + ((f1 - f0) - float(term.sum())) * w / w.sum()
        values = torch.tensor([f for f, _ in points])
        assert float((out.attributions[0, j].double() - credits).abs().max()) <= _tol(
            values, n_steps)


@pytest.mark.parametrize("family", ["llama", "gpt2", "bloom"])
def test_sequence_scope_is_complete_and_splits_the_same_change(family) -> None:
    model, ids = make_family(family, seed=3).eval(), _ids(22)
    for baseline in ("zero", "mean"):
        pos_scope = _run(model, ids, baseline, "position", 8)
        for n_steps in (1, 4, 8, 32):
            out = _run(model, ids, baseline, "sequence", n_steps)
            gap = out.attributions.double().sum(-1) - (out.p_final - out.p_baseline).double()
            bound = 2 * EPS * (out.attributions.abs().sum(-1) + out.p_final.abs()
                               + out.p_baseline.abs())
            assert bool((gap.abs() <= bound).all()), (baseline, n_steps)
            # G(e, 0) = G(1, 0): the same F(0) and F(1) as position scope
            for a, b in ((out.p_baseline, pos_scope.p_baseline),
                         (out.p_final, pos_scope.p_final)):
                tol = 2 * GATE_CHECK_EPS * EPS * (1 + b.abs())
                assert bool(((a - b).abs() <= tol).all())
        # ... but another split of it (the earlier positions' gates move along the path)
        assert float((out.attributions - pos_scope.attributions).abs().max()) > 1e-4


@pytest.mark.parametrize("baseline", ["zero", "mean"])
def test_atp_of_the_scopes_differs_by_the_earlier_positions_gate_gradients(baseline) -> None:
    model, ids = make_family("llama", seed=3).eval(), _ids(23)
    pos = SEQ - 1
    seq = _run(model, ids, baseline, "sequence", effect="atp", positions=[pos])
    loc = _run(model, ids, baseline, "position", effect="atp", positions=[pos])
    refs, defined = _refs(_updates(model, ids), baseline)
    value, grads = _g(model, ids, pos, int(seq.target[0, 0]),
                      torch.ones(refs.shape[0], pos + 1), refs, defined)
    earlier = grads[:, :pos].sum(1)
    # cached vs full forwards: the gate rule times the gradients' and F's magnitudes
    tol = GATE_CHECK_EPS * EPS * (float(grads.abs().sum()) + abs(value))
    diff = (seq.attributions[0, 0] - loc.attributions[0, 0]).double()
    assert float((diff - earlier).abs().max()) <= tol
    assert float(earlier.abs().max()) > 5 * tol  # the earlier positions do matter here
    # nothing at i reads the last block's earlier outputs: its difference is rounding only
    assert float(earlier[-1]) == 0.0  # exact: no path from those gates to F
    # and position i's own gate gradient is position scope's AtP
    assert float((grads[:, pos] - loc.attributions[0, 0].double()).abs().max()) <= tol


def test_scope_refusals() -> None:
    model, ids = make_family("llama", seed=3).eval(), _ids(24)
    spec = IGLens(model, effect="total").spec
    with pytest.raises(ValueError, match="scope must be one of"):
        run_total(spec, ids, "zero", None, None, 2, "prediction_aware", None, -1,
                  scope="prefix")
    sub = IGLens(model, effect="total", granularity="sublayer").spec
    with pytest.raises(ValueError, match="granularity='block'"):
        run_total(sub, ids, "zero", None, None, 2, "prediction_aware", None, -1,
                  scope="sequence")


def test_sequence_scope_with_reference_ids_gates_every_position_to_the_corrupted_updates(
) -> None:
    model, ids, n_steps = make_family("llama", seed=3).eval(), _ids(25), 4
    corrupt = ids.clone()
    corrupt[0, 1:4] = 9
    spec = IGLens(model, effect="total").spec
    out, _ = run_total(spec, ids, corrupt, None, None, n_steps, "prediction_aware", None,
                       SEQ - 1, scope="sequence")
    refs, pos = _updates(model, corrupt), SEQ - 1
    defined = torch.ones(SEQ, dtype=torch.bool)
    points = [_g(model, ids, pos, int(out.target[0, 0]),
                 torch.full((refs.shape[0], pos + 1), t / n_steps), refs, defined)
              for t in range(n_steps + 1)]
    credits = torch.zeros(refs.shape[0], dtype=torch.float64)
    for (f0, g0), (f1, g1) in zip(points[:-1], points[1:], strict=True):
        term = (g0.sum(1) + g1.sum(1)) / 2 / n_steps
        w = term.abs()
        credits += term + ((f1 - f0) - float(term.sum())) * w / w.sum()
    values = torch.tensor([f for f, _ in points])
    assert out.baseline == "reference ids"
    assert abs(float(out.p_baseline[0, 0]) - values[0].item()) <= _tol(values, 0)
    assert float((out.attributions[0, 0].double() - credits).abs().max()) <= _tol(values,
                                                                                  n_steps)
