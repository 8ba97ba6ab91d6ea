"""Sub-layer credits (granularity="sublayer"): every chosen block splits into an attention
credit and an MLP credit that add up to its block-granularity credit, on every family of the
half-block table among the tiny families; all of them add up to delta_p; the L.attn nodes
are the residuals computed independently from each block's own modules; head credits add
up to the attention credit. Tolerances are derived from float32 rounding (tests/_tolerance.py,
captum_iglens.testing), never from what one machine printed."""

from __future__ import annotations

import pytest
import torch
from _tolerance import completeness_tol, f32_tol
from test_sublayer_sites import ATTENTION_SIDE, PARALLEL, _run
from tiny_families import SPECS, make_family

from captum_iglens import IGLens
from captum_iglens._core.pipeline import capture_lens_path
from captum_iglens._utils.format import layer_names
from captum_iglens.lens.sublayer import SublayerUnsupportedError
from captum_iglens.testing import assert_complete
from captum_iglens.testing._bounds import readout_tolerance

FAMILIES = sorted(f for f in {*ATTENTION_SIDE, *PARALLEL} if f in SPECS)
POSITIONS = [-3, -1]


def _ids(batch: int = 2, length: int = 7) -> torch.Tensor:
    return torch.randint(4, 100, (batch, length), generator=torch.Generator().manual_seed(3))


def _levels_bound(lens: IGLens, ids: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """``[B, P, k + 1]``: rounding bound of ``f`` at each node of ``lens``'s path."""
    cap = capture_lens_path(lens.spec, ids, target, POSITIONS, "mean", None)
    tol = readout_tolerance(lens.readout, cap.path.nodes)
    return tol.gather(-1, cap.path.target[:, :, None, None].expand(*tol.shape[:-1], 1))[..., 0]


def _pairs(sub: torch.Tensor, first_is_emb: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Attention and MLP columns of sub-layer credits (the embedding column left out)."""
    rest = sub[..., 1:] if first_is_emb else sub
    return rest[..., 0::2], rest[..., 1::2]


@pytest.mark.parametrize("family", FAMILIES)
def test_attention_plus_mlp_is_the_block_credit(family: str) -> None:
    model = make_family(family).eval()
    ids = _ids()
    block = IGLens(model).attribute_details(ids, positions=POSITIONS)
    lens = IGLens(model, granularity="sublayer")
    sub = lens.attribute_details(ids, target=block.target, positions=POSITIONS)
    n = lens.num_layers
    assert sub.attributions.shape == (2, 2, 2 * n)
    assert layer_names(sub.layer_indices, sub.granularity)[:2] == ["L1.attn", "L1.mlp"]
    assert_complete(sub)
    attn, mlp = _pairs(sub.attributions, False)
    # the block nodes are the same vectors, read out in other chunks: each level within
    # its readout bound, each credit rounded once from float64
    levels = _levels_bound(IGLens(model), ids, block.target)
    bound = (levels[..., 1:] + levels[..., :-1]
             + f32_tol(attn, mlp, block.attributions))
    gap = (attn.double() + mlp.double() - block.attributions.double()).abs()
    assert (gap <= bound).all(), (gap.max(), bound.min())
    # both halves carry credit: neither node is a copy of its neighbour
    assert attn.abs().max() > 1e-4 and mlp.abs().max() > 1e-4


@pytest.mark.parametrize("family", ["llama", "gpt2", "mixtral"])
def test_skipped_blocks_and_embedding(family: str) -> None:
    """Chosen layers [0, 2, n]: the embedding stays one node, the segment before L.attn
    spans the blocks in between; the halves still add up to the block credits."""
    model = make_family(family, n_blocks=4).eval()
    ids = _ids()
    layers = [0, 2, 4]
    block = IGLens(model, layers=layers).attribute_details(ids, positions=POSITIONS)
    sub = IGLens(model, layers=layers, granularity="sublayer").attribute_details(
        ids, target=block.target, positions=POSITIONS)
    assert sub.layer_indices == (0, 3, 4, 7, 8)
    assert layer_names(sub.layer_indices, "sublayer") == [
        "emb", "L2.attn", "L2.mlp", "L4.attn", "L4.mlp"]
    assert_complete(sub)
    attn, mlp = _pairs(sub.attributions, True)
    gap = (attn.double() + mlp.double() - block.attributions[..., 1:].double()).abs()
    levels = _levels_bound(IGLens(model, layers=layers), ids, block.target)
    assert (gap <= levels[..., 2:] + levels[..., 1:-1]
            + f32_tol(attn, mlp, block.attributions[..., 1:])).all()


def _check_attn_levels(family: str) -> None:
    """The lens's f(L.attn) is the readout of L.attn computed from the block's modules."""
    model = make_family(family).eval()
    attention = (ATTENTION_SIDE.get(family) or PARALLEL[family])[0]
    blocks, _site, seen, _half = _run(family, attention)
    ids = torch.randint(0, 100, (2, 7), generator=torch.Generator().manual_seed(3))
    lens = IGLens(model, granularity="sublayer")
    out = lens.attribute_details(ids, positions=POSITIONS)
    with torch.no_grad():
        for i, block in enumerate(blocks, start=1):
            h = seen["in"][i]
            if family in PARALLEL:
                want = h + seen["attn"][i]
            else:
                want = ATTENTION_SIDE[family][1](block, h, seen["attn"][i])
            want = want[:, [p % 7 for p in POSITIONS]]
            logits = lens.readout(want).float().log_softmax(-1)
            expected = logits.gather(-1, out.target[..., None])[..., 0].exp()
            bound = readout_tolerance(lens.readout, want).gather(-1, out.target[..., None])
            got = out.lens_probs[..., 2 * i - 2]
            assert ((got - expected).abs() <= bound[..., 0]).all(), (family, i)


@pytest.mark.parametrize("family", ["llama", "gpt2", "gemma2", "gptj", "bloom", "mixtral"])
def test_attn_node_is_the_independent_half_residual(family: str) -> None:
    _check_attn_levels(family)


def test_a_wrong_half_block_node_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """Reading L.attn at the attention's pre-norm (the block's input) instead of the MLP's
    pre-norm still telescopes, but the node check above fails: the test can fail."""
    from dataclasses import replace

    from captum_iglens.lens.families import FAMILIES, HalfBlockSite

    monkeypatch.setitem(FAMILIES, "llama", replace(
        FAMILIES["llama"], half_block=HalfBlockSite("input", "input_layernorm")))
    with pytest.raises(AssertionError):
        _check_attn_levels("llama")


HEAD_FAMILIES = [f for f in ("llama", "mistral", "mixtral", "qwen2", "qwen3", "phi3",
                             "olmo", "gemma") if f in SPECS]


@pytest.mark.parametrize("family", HEAD_FAMILIES)
@pytest.mark.parametrize("n_steps", [1, 6])
def test_head_credits_add_up_to_the_attention_credit(family: str, n_steps: int) -> None:
    model = make_family(family).eval()
    lens = IGLens(model, granularity="sublayer", heads=True)
    out = lens.attribute_details(_ids(), positions=POSITIONS, n_steps=n_steps)
    n_heads = lens.head_site.n_heads
    assert out.head_credits.shape == (2, 2, lens.num_layers, n_heads)
    attn = out.attributions[..., 0::2]
    parts = torch.cat([out.head_credits, out.head_rest[..., None]], -1)
    gap = (parts.double().sum(-1) - attn.double()).abs()
    assert (gap <= completeness_tol(parts, attn)).all()
    # contiguous blocks without an output bias: the heads hold the attention credit of
    # every block after the first (whose segment also moves from the baseline to h_0)
    assert out.head_credits[..., 1:, :].abs().sum() > 0


def test_head_pieces_are_each_heads_output() -> None:
    """c_h equals o_proj applied to head h's slice alone; a transposed split does not."""
    from captum_iglens._core.heads import capture_head_inputs, head_pieces

    model = make_family("llama").eval()
    lens = IGLens(model, granularity="sublayer", heads=True)
    site, store = lens.head_site, {}
    with torch.no_grad(), capture_head_inputs(lens.decoder_blocks, [1], site, store):
        model(_ids(), use_cache=False)
    z, proj = store[1], lens.decoder_blocks[0].self_attn.o_proj
    pieces = head_pieces(lens.decoder_blocks, site, 1, z)
    width = z.shape[-1] // site.n_heads
    with torch.no_grad():
        for h in range(site.n_heads):
            mask = torch.zeros_like(z)
            mask[..., h * width:(h + 1) * width] = 1
            want = proj(z * mask)
            bound = f32_tol(torch.einsum("bse,de->bsd", (z * mask).abs(), proj.weight.abs()),
                            n_terms=z.shape[-1])
            assert ((pieces[..., h, :] - want.double()).abs() <= bound).all(), h
        wrong = torch.einsum("bshe,dhe->bshd",
                             z.view(*z.shape[:2], width, site.n_heads).transpose(-1, -2),
                             proj.weight.view(-1, site.n_heads, width))
        assert ((wrong[..., 0, :] - proj(z * (torch.arange(z.shape[-1]) < width))).abs()
                > f32_tol(z.abs().sum(-1, keepdim=True), n_terms=z.shape[-1])).any()


def test_reference_ids_keep_the_inputs_half_nodes() -> None:
    """The reference forward runs second: the L.attn nodes stay those of the inputs."""
    model = make_family("llama").eval()
    lens = IGLens(model, granularity="sublayer")
    ids = _ids()
    mean = lens.attribute_details(ids, positions=POSITIONS)
    ref = lens.attribute_details(ids, torch.full_like(ids, 5), target=mean.target,
                                 positions=POSITIONS)
    assert_complete(ref)
    # exact: the same node vectors read out in the same chunk shapes
    assert torch.equal(ref.lens_probs, mean.lens_probs)


def test_bad_settings_are_refused() -> None:
    model = make_family("llama").eval()
    with pytest.raises(ValueError, match=r"\('block', 'sublayer'\)"):
        IGLens(model, granularity="foo")
    with pytest.raises(ValueError, match="granularity='sublayer'"):
        IGLens(model, heads=True)
    with pytest.raises(SublayerUnsupportedError, match="'gpt2'.*heads=False"):
        IGLens(make_family("gpt2"), granularity="sublayer", heads=True)
    with pytest.raises(SublayerUnsupportedError, match="'opt'.*granularity='block'"):
        IGLens(make_family("opt_350m"), granularity="sublayer")


def test_gradient_estimator_and_onset_on_sublayer_nodes() -> None:
    model = make_family("llama").eval()
    lens = IGLens(model, granularity="sublayer")
    ids = _ids()
    attr, delta = lens.attribute(ids, method="gausslegendre", n_steps=32,
                                 return_convergence_delta=True)
    assert attr.shape == (2, 2 * lens.num_layers)
    # exact: the same capture, readout and subtraction on the same shapes
    assert torch.equal(delta, lens.compute_convergence_delta(attr, "mean", ids))
    exact = lens.attribute(ids)
    assert set(lens.onset_layers(exact).tolist()) <= set(lens.node_indices)


def test_gradient_estimate_on_sublayer_nodes_converges() -> None:
    model = make_family("llama", n_blocks=4).eval()
    lens = IGLens(model, granularity="sublayer")
    ids = _ids()
    with pytest.warns(UserWarning, match="not converged"):
        coarse = lens.attribute(ids, method="gausslegendre", n_steps=2,
                                return_convergence_delta=True)[1]
    fine = lens.attribute(ids, method="gausslegendre", n_steps=64,
                          return_convergence_delta=True)[1]
    assert fine.abs().max() < coarse.abs().max() / 10


@pytest.mark.numerics
def test_smollm2_sublayer_and_heads(smollm2) -> None:
    """All 30 blocks of the real model: halves add up to the block credits within the
    readout bounds, everything to delta_p, the 9 heads (+ rest) to each attention credit."""
    from captum_iglens.text.explain_prompt import build_prompt_ids

    model, tokenizer = smollm2
    ids = torch.tensor([build_prompt_ids(tokenizer, "What is the capital of Vietnam?")[0]])
    block_lens = IGLens(model)
    block = block_lens.attribute_details(ids)
    lens = IGLens(model, granularity="sublayer", heads=True)
    sub = lens.attribute_details(ids, target=block.target, n_steps=4)
    assert sub.attributions.shape == (1, 1, 60) and sub.head_credits.shape == (1, 1, 30, 9)
    assert_complete(sub)
    attn, mlp = _pairs(sub.attributions, False)
    cap = capture_lens_path(block_lens.spec, ids, block.target, -1, "mean", None)
    tol = readout_tolerance(block_lens.readout, cap.path.nodes[0, 0])
    levels = tol[:, int(block.target[0, 0])]  # [31]
    gap = (attn.double() + mlp.double() - block.attributions.double()).abs()[0, 0]
    assert (gap <= levels[1:] + levels[:-1] + f32_tol(attn, mlp, block.attributions)[0, 0]).all()
    parts = torch.cat([sub.head_credits, sub.head_rest[..., None]], -1)
    gap = (parts.double().sum(-1) - attn.double()).abs()
    assert (gap <= completeness_tol(parts, attn)).all()
