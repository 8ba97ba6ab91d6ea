"""Counterfactual patching (captum_iglens.validate.patching) against hand-written hooked forwards.

Tolerances are derived (tests/_tolerance.py): the patched rows run cached single-token
forwards whose batches differ from the references', so they agree to float32 rounding, which
is bounded by the sensitivity of what is computed. Each test also checks that the error it
exists to catch (a wrong block, a lost update) stands far above its bound.
"""

from __future__ import annotations

import json

import pytest
import torch
from _tolerance import (
    EPS32,
    completeness_tol,
    f32_tol,
    readout_sensitivity,
    reduction_length,
    sensitivity,
)
from conftest import VOCAB, make_tiny
from tiny_tokenizer import word_tokenizer

from captum_iglens import resolve_decoder_blocks
from captum_iglens.validate.ablation import AblationCheckError, BlockAblation
from captum_iglens.validate.ablation_rows import token_probs
from captum_iglens.validate.patching import (
    PromptPair,
    _plan,
    load_pairs,
    pair_ids,
    patch_pair,
)

N_BLOCKS = 4


@pytest.fixture(autouse=True)
def one_thread():
    """One intra-op thread: on a shared 2-core machine two OpenMP threads per process
    oversubscribe the cores; results do not depend on it."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def _contrast(probs: torch.Tensor) -> torch.Tensor:
    return probs[..., 0].double() - probs[..., 1].double()


def _restore_bound(ablation: BlockAblation, source, pos: int, ids: torch.Tensor) -> float:
    """Bound on |F(all patched) - F(readout of the source's h_n)|.

    The patched row builds ``h_L := fl(h_{L-1} + fl(h_L^s - h_{L-1}^s))`` from the exact copy
    ``h_0^s``: each step adds at most ``u (|u_L| + |h_L|)`` to the drift from ``h_L^s``
    (``eps = 2u`` covers the second-order terms); to first order ``F`` moves by
    ``|grad F| . drift``. The two readouts (batched model head vs one row) round
    differently, each within ``f32_tol`` of its sensitivity.
    """
    hidden = source.hidden[pos].double()  # [n + 1, d]
    updates = hidden[1:] - hidden[:-1]
    drift = EPS32 * (updates.abs() + hidden[1:].abs()).sum(0)
    h_n = source.hidden[pos, -1].detach().clone().requires_grad_(True)
    with torch.enable_grad():
        probs = torch.softmax(ablation.readout(h_n[None]).double(), -1)[0, ids]
        (grad,) = torch.autograd.grad(probs[0] - probs[1], h_n)
    first = float((grad.double().abs() * drift).sum())
    sens = sum(readout_sensitivity(ablation.readout, source.hidden[pos, -1:], ids[j:j + 1])
               for j in range(2))
    return first + float(f32_tol(sens, sens, n_terms=reduction_length(ablation.readout)))


@pytest.fixture(params=["llama", "gpt2"])
def pair_runs(request):
    model = make_tiny(request.param, seed=5, n_layers=N_BLOCKS).eval()
    gen = torch.Generator().manual_seed(11)
    clean = torch.randint(4, VOCAB, (12,), generator=gen)
    corrupted = clean.clone()
    corrupted[2:5] = torch.randint(4, VOCAB, (3,), generator=gen)
    ablation = BlockAblation(model)
    with torch.no_grad():
        y = int(model(clean[None]).logits[0, -1].argmax())
        order = model(corrupted[None]).logits[0, -1].argsort(descending=True)
    foil = int(order[0]) if int(order[0]) != y else int(order[1])
    return model, ablation, clean, corrupted, torch.tensor([y, foil])


def test_patching_everything_restores_the_other_run_exactly(pair_runs) -> None:
    _, ablation, clean, corrupted, ids = pair_runs
    pos, n = len(clean) - 1, N_BLOCKS
    t_clean, t_corr = ablation.trace(clean), ablation.trace(corrupted)
    for base, source in ((t_corr, t_clean), (t_clean, t_corr)):
        rows = _contrast(ablation.run_plan(base, pos, _plan(source, pos), ids))
        assert rows.shape == (n + 3,)
        with torch.no_grad():
            reference = _contrast(token_probs(ablation.readout(source.hidden[pos, -1:]),
                                              ids))[0]
        bound = _restore_bound(ablation, source, pos, ids)
        assert abs(float(rows[-1] - reference)) <= bound
        # What the test catches: the other run's F (an update lost) is far outside it.
        assert bound < 1e-3 * abs(float(rows[0] - reference))


def _hooked_contrast(model, ids: torch.Tensor, pos: int, layer: int, repl: torch.Tensor,
                     read: torch.Tensor) -> torch.Tensor:
    """F at ``pos`` when block ``layer``'s output there is its input + ``repl`` (no cache);
    layer 0: no change. The definition of one patch, written independently."""
    handles = []
    if layer:
        block, seen = resolve_decoder_blocks(model)[layer - 1], {}

        def pre(_m, args, kwargs):
            seen["in"] = args[0] if args else kwargs["hidden_states"]

        def post(_m, _a, output):
            hidden = (output if isinstance(output, torch.Tensor) else output[0]).clone()
            hidden[0, pos] = seen["in"][0, pos] + repl
            return hidden if isinstance(output, torch.Tensor) else (hidden, *output[1:])

        handles = [block.register_forward_pre_hook(pre, with_kwargs=True),
                   block.register_forward_hook(post)]
    try:
        logits = model(ids[None, : pos + 1], use_cache=False).logits[0, pos]
    finally:
        for handle in handles:
            handle.remove()
    probs = torch.softmax(logits.float(), -1)[read]
    return probs


def test_every_patch_matches_a_hooked_full_forward(pair_runs) -> None:
    model, ablation, clean, corrupted, ids = pair_runs
    pos = len(clean) - 1
    t_clean, t_corr = ablation.trace(clean), ablation.trace(corrupted)
    rows = _contrast(ablation.run_plan(t_corr, pos, _plan(t_clean, pos), ids))
    n_terms = reduction_length(model)
    for layer in range(0, N_BLOCKS + 1):
        repl = t_clean.updates[pos, layer - 1] if layer else None

        def forward(layer=layer, repl=repl):
            return _hooked_contrast(model, corrupted, pos, layer, repl, ids)

        sens = sensitivity(model, forward).sum()  # |dF| <= |dp_y| + |dp_foil|
        with torch.no_grad():
            expected = _contrast(forward()[None])[0]
        row = rows[1 + layer] if layer else rows[0]
        assert abs(float(row - expected)) <= float(f32_tol(sens, sens, n_terms=n_terms))
    # The patches differ from each other and from no patch by far more than the bound.
    assert float((rows[2:N_BLOCKS + 2] - rows[0]).abs().max()) > 1e-4


def test_patch_pair_checks_itself_and_its_credits_add_up(pair_runs) -> None:
    model, ablation, *_ = pair_runs
    tokenizer = word_tokenizer()
    pair = PromptPair("p0", "test", "w1 w2 w3 w4 w5", "w9 w2 w3 w4 w5", " w7", " w8")
    out = patch_pair(ablation, tokenizer, pair, spot_layer=2)
    assert set(out.check_errors) == {"clean", "spot", "restore"}
    assert max(out.check_errors.values()) <= ablation.tolerance
    n = N_BLOCKS
    assert out.recovery.shape == out.reverse.shape == out.credits.shape == (n,)
    assert out.lens.shape == out.direct.shape == (n,)
    gap = torch.tensor(out.f_clean - out.f_corrupted)
    bound = completeness_tol(out.credits[None], gap[None])[0]
    assert abs(float(out.credits.double().sum() - gap)) <= float(bound)
    # The lens level of the last block is F(clean); the direct effect of the last block is
    # its credit (both F(h_n) - F(h_{n-1})).
    assert abs(float(out.lens[-1]) - out.f_clean) <= ablation.tolerance
    assert abs(float(out.direct[-1] - out.credits[-1])) <= ablation.tolerance
    with pytest.raises(AblationCheckError, match="restore|spot|clean"):
        broken = BlockAblation(model)
        broken.tolerance = 0.0  # no float32 computation meets a zero tolerance
        patch_pair(broken, tokenizer, pair)


def test_pairs_must_align() -> None:
    tokenizer = word_tokenizer()
    short = PromptPair("p", "x", "w1 w2 w3", "w1 w2", " w7", " w8")
    with pytest.raises(ValueError, match="do not align"):
        pair_ids(tokenizer, short)
    same = PromptPair("p", "x", "w1 w2 w3", "w4 w2 w3", " w7", " w7")
    with pytest.raises(ValueError, match="same token"):
        pair_ids(tokenizer, same)
    clean, corrupted, y, foil = pair_ids(tokenizer, PromptPair("p", "x", "w1 w2", "w3 w2",
                                                               " w7", " w8"))
    assert len(clean) == len(corrupted) == 2 and (y, foil) == (11, 12)


def test_packaged_pairs_and_pair_files(tmp_path) -> None:
    pairs = load_pairs()
    assert len(pairs) >= 30 and len({p.id for p in pairs}) == len(pairs)
    assert {p.category for p in pairs} >= {"capital", "arithmetic", "agreement"}
    bad = tmp_path / "p.jsonl"
    bad.write_text(json.dumps({"id": "a", "clean": "x"}) + "\n", encoding="utf-8")
    with pytest.raises(ValueError, match="line 1"):
        load_pairs(bad)
    twice = tmp_path / "t.jsonl"
    entry = {"id": "a", "category": "c", "clean": "x", "corrupted": "y", "answer": " a",
             "foil": " b"}
    twice.write_text((json.dumps(entry) + "\n") * 2, encoding="utf-8")
    with pytest.raises(ValueError, match="twice"):
        load_pairs(twice)


def test_packaged_pairs_align_for_smollm2(smollm2) -> None:
    _, tokenizer = smollm2
    for pair in load_pairs():
        clean, corrupted, y, foil = pair_ids(tokenizer, pair)
        assert len(clean) == len(corrupted) and y != foil
