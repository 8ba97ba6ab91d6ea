"""Position-local block ablation (validate.ablation) against hand-written hooked forwards.

The reference here never uses the KV cache: it runs the whole prefix through the model with
one forward hook that rewrites one block's output at one position, which is the definition
of the ablation. The library's cached single-token batches must agree to 1e-5.
"""

from __future__ import annotations

import pytest
import torch
from _tolerance import f32_tol, reduction_length, sensitivity
from conftest import VOCAB, make_tiny
from torch import nn

from captum_iglens import IGLens, resolve_decoder_blocks
from captum_iglens.validate.ablation import (
    KINDS,
    AblationCheckError,
    BlockAblation,
    mean_updates,
)

N_BLOCKS = 4
POSITIONS = [0, 6, 13]
SEQ = 16


@pytest.fixture(autouse=True)
def one_thread():
    """One intra-op thread: on a shared 2-core machine two OpenMP threads per process
    oversubscribe the cores (several times slower); results do not depend on it."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def _reference(model: nn.Module, ids: torch.Tensor, pos: int, layer: int,
               repl: torch.Tensor, target: int) -> float:
    """p(target) at ``pos`` when block ``layer``'s output there is its input + ``repl``."""
    block = resolve_decoder_blocks(model)[layer - 1]
    seen = {}

    def pre(_m, args, kwargs):
        seen["in"] = args[0] if args else kwargs["hidden_states"]

    def post(_m, _a, output):
        hidden = (output if isinstance(output, torch.Tensor) else output[0]).clone()
        hidden[0, pos] = seen["in"][0, pos] + repl
        return hidden if isinstance(output, torch.Tensor) else (hidden, *output[1:])

    handles = [block.register_forward_pre_hook(pre, with_kwargs=True),
               block.register_forward_hook(post)]
    try:
        with torch.no_grad():
            logits = model(ids[None, : pos + 1], use_cache=False).logits[0, pos]
    finally:
        for handle in handles:
            handle.remove()
    return float(torch.softmax(logits.float(), -1)[target])


@pytest.fixture(params=["llama", "gpt2"])
def setup(request):
    model = make_tiny(request.param, seed=3, n_layers=N_BLOCKS).eval()
    gen = torch.Generator().manual_seed(7)
    sequences = [torch.randint(0, VOCAB, (SEQ,), generator=gen) for _ in range(16)]
    ablation = BlockAblation(model)
    traces = [ablation.trace(s) for s in sequences]
    ids = sequences[0]
    with torch.no_grad():
        target = model(ids[None]).logits[0, POSITIONS].argmax(-1)  # the greedy tokens
    return model, ablation, traces, ids, target


def test_every_kind_matches_a_hooked_full_forward(setup) -> None:
    model, ablation, traces, ids, target = setup
    mean = mean_updates(traces[1:], min_positions=200)
    resample = traces[1].updates[[p + 1 for p in POSITIONS]]  # a donor at another position
    out = ablation.ablate(traces[0], POSITIONS, target, KINDS, mean, resample)
    with torch.no_grad():
        clean = torch.softmax(model(ids[None]).logits[0].float(), -1)[POSITIONS, target]
    assert torch.allclose(out.p_clean, clean, atol=1e-5, rtol=0)
    replacements = {"zero": lambda j: torch.zeros(N_BLOCKS, mean.shape[-1]),
                    "mean": lambda j: mean, "resample": lambda j: resample[j]}
    for kind in KINDS:
        for j, pos in enumerate(POSITIONS):
            for layer in range(1, N_BLOCKS + 1):
                repl = replacements[kind](j)[layer - 1]
                expected = _reference(model, ids, pos, layer, repl, int(target[j]))
                assert abs(float(out.p_ablated[kind][j, layer - 1]) - expected) <= 1e-5
        assert torch.allclose(out.drops[kind], out.p_clean[:, None] - out.p_ablated[kind])
    assert set(out.check_errors) == {"clean", "spot", "last_block"}


def test_last_block_drop_is_its_ig_lens_credit(setup) -> None:
    model, ablation, traces, ids, target = setup
    out = ablation.ablate(traces[0], POSITIONS, target, ("zero",))
    details = IGLens(model).attribute_details(ids[None], target=target[None],
                                              positions=POSITIONS)
    assert torch.allclose(out.drops["zero"][:, -1], details.attributions[0, :, -1].cpu(),
                          atol=1e-6, rtol=0)
    direct = ablation.direct_effects(traces[0], POSITIONS, target)
    assert direct.shape == (len(POSITIONS), N_BLOCKS)
    assert torch.allclose(direct[:, -1], out.drops["zero"][:, -1], atol=1e-6, rtol=0)


def test_the_credit_check_lens_is_built_once_from_the_spec(setup) -> None:
    """The last-block check's lens reuses the ablation's spec (blocks and readout not located
    again) at IGLens(model)'s defaults, whatever that spec chose: a spec of fewer layers in
    log-probability would credit block n with f(h_n) - f(h_{L_{k-1}}) in nats instead."""
    model, _, traces, ids, target = setup
    chosen = IGLens(model, layers=[2, N_BLOCKS], units="log-probability").spec
    ablation = BlockAblation(chosen)
    lens = ablation.credit_spec
    assert lens is ablation.credit_spec  # cached: built once
    assert lens.decoder_blocks is chosen.decoder_blocks and lens.readout is chosen.readout
    default = IGLens(model).spec
    assert lens.layer_indices == default.layer_indices == tuple(range(1, N_BLOCKS + 1))
    assert (lens.units, lens.effect, lens.granularity) == (
        default.units, default.effect, default.granularity)
    mine = ablation.credit_details(ids[None], target[None], POSITIONS)
    theirs = IGLens(model).attribute_details(ids[None], target=target[None],
                                             positions=POSITIONS)
    assert torch.equal(mine.attributions, theirs.attributions)  # exact: one computation
    out = ablation.ablate(traces[0], POSITIONS, target, ("zero",))
    assert out.check_errors["last_block"] <= 1e-6


def test_mean_reference_excludes_position_zero_and_needs_200_positions(setup) -> None:
    _, _, traces, _, _ = setup
    expected = torch.cat([t.updates[1:] for t in traces[1:]]).double().mean(0).float()
    assert torch.allclose(mean_updates(traces[1:]), expected, atol=1e-6)
    with pytest.raises(ValueError, match="at least 200"):
        mean_updates(traces[1:3])


def test_failed_checks_raise(setup) -> None:
    _, ablation, traces, _, target = setup
    with pytest.raises(AblationCheckError, match="p_final"):
        ablation.ablate(traces[0], POSITIONS, target, ("zero",), p_final=torch.zeros(3))
    with pytest.raises(AblationCheckError, match="last block"):
        ablation.ablate(traces[0], POSITIONS, target, ("zero",),
                        last_credit=torch.full((3,), 0.5))


def test_bad_arguments_and_model_state() -> None:
    model = make_tiny("llama", n_layers=2)  # train mode, as constructed
    ablation = BlockAblation(model)
    trace = ablation.trace(torch.arange(10))
    target = torch.tensor([3])
    with pytest.raises(ValueError, match="mean_update"):
        ablation.ablate(trace, [4], target, ("mean",))
    with pytest.raises(ValueError, match="Unknown ablation kind"):
        ablation.ablate(trace, [4], target, ("shuffle",))
    with pytest.raises(ValueError, match="positions"):
        ablation.ablate(trace, [10], target, ("zero",))
    with pytest.raises(ValueError, match="target"):
        ablation.ablate(trace, [3, 4], target, ("zero",))
    ablation.ablate(trace, [4], target, ("zero",))
    assert all(m.training for m in model.modules())


def test_half_precision_checks_are_capped_not_vacuous() -> None:
    model = make_tiny("llama", seed=3, n_layers=2).eval().to(torch.bfloat16)
    ablation = BlockAblation(model)
    # exact: a constant the code sets, no arithmetic
    assert ablation.tolerance == 2e-2  # 256 bfloat16 eps would be 2.0
    trace = ablation.trace(torch.arange(12))
    out = ablation.ablate(trace, [5, 11], torch.tensor([3, 4]), ("zero",))
    assert max(out.check_errors.values()) <= ablation.tolerance


def _all_rows(model, ids: torch.Tensor, pos: int, repl: torch.Tensor,
              target: int) -> torch.Tensor:
    """p(target) at ``pos`` for every (slab, block) ablation by full-sequence hooked forwards
    (no cache, every row from block 1): ``[S * n]``, the rows in the library's order."""
    return torch.stack([_reference_tensor(model, ids, pos, layer, repl[s, layer - 1], target)
                        for s in range(repl.shape[0]) for layer in range(1, repl.shape[1] + 1)])


def _reference_tensor(model, ids, pos, layer, repl, target) -> torch.Tensor:
    """:func:`_reference` as a tensor in the graph (for :func:`sensitivity`)."""
    block = resolve_decoder_blocks(model)[layer - 1]
    seen = {}

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
    return torch.softmax(logits.float(), -1)[target]


def test_rows_started_at_their_block_equal_the_full_recomputation(setup) -> None:
    """A row that ablates block L joins the batch after block L - 1 from the clean row's
    residual (grow=True) instead of recomputing blocks 1..L-1 (grow=False): both are float32
    evaluations of the same probability, each within ``eps sqrt(n) S`` of the exact value
    (S: its sensitivity, tests/_tolerance.py)."""
    model, ablation, traces, ids, target = setup
    mean = mean_updates(traces[1:], min_positions=200)
    donors = torch.stack([traces[q].updates[[p + 1 for p in POSITIONS]] for q in (1, 2)], 1)
    kinds = ("zero", "mean", "resample")
    full = BlockAblation(model, grow=False)
    grown = ablation.ablate(traces[0], POSITIONS, target, kinds, mean, donors)
    again = full.ablate(traces[0], POSITIONS, target, kinds, mean, donors)
    n_terms = reduction_length(model)
    repl, _ = ablation._replacements(traces[0], kinds, len(POSITIONS), mean, donors)
    for j, pos in enumerate(POSITIONS):
        sens = sensitivity(model, lambda j=j, pos=pos: _all_rows(
            model, ids, pos, repl[j], int(target[j])))
        bound = f32_tol(sens, sens, n_terms=n_terms).reshape(-1, N_BLOCKS)
        for s, kind in enumerate(("zero", "mean", "resample", "resample")):
            d = s - 2 if kind == "resample" else 0
            a = grown.p_each[kind][j, d].double()
            b = again.p_each[kind][j, d].double()
            assert bool(((a - b).abs() <= bound[s]).all()), (kind, j)
    # What the test catches: a row started from the wrong residual (h_L instead of
    # h_{L-1}, i.e. block L's update counted twice) moves p by far more than the bound.
    assert float(bound.max()) < 1e-2 * float(grown.drops["zero"].abs().max())


def test_resample_donors_are_averaged(setup) -> None:
    model, ablation, traces, ids, target = setup
    donors = torch.stack([traces[q].updates[[p + 1 for p in POSITIONS]] for q in (1, 2, 3)], 1)
    out = ablation.ablate(traces[0], POSITIONS, target, ("resample",), resample=donors)
    each = out.p_each["resample"]
    assert each.shape == (len(POSITIONS), 3, N_BLOCKS)
    # exact: p_ablated is this very mean of the same tensor
    assert torch.equal(out.p_ablated["resample"], each.mean(1))
    one = ablation.ablate(traces[0], POSITIONS, target, ("resample",), resample=donors[:, 1])
    # Another batch (1 donor instead of 3) rounds differently: within the derived bound.
    for j, pos in enumerate(POSITIONS):
        sens = sensitivity(model, lambda j=j, pos=pos: _all_rows(
            model, ids, pos, donors[j, 1:2], int(target[j])))
        bound = f32_tol(sens, sens, n_terms=reduction_length(model))
        diff = (one.p_ablated["resample"][j] - each[j, 1]).double().abs()
        assert bool((diff <= bound).all())
    with pytest.raises(ValueError, match="P, D, n, d"):
        ablation.ablate(traces[0], POSITIONS, target, ("resample",), resample=donors[:2])
