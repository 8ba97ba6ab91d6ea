"""The half-block residual L.attn (after attention, before the MLP) of every family in the
table equals the residual computed independently from the block's own modules: its input
plus its attention output combined as the family's forward does (sandwich post-norms,
residual multipliers, attention outputs that include the residual, depth scaling). For
parallel blocks the rest of the block, h_L - L.attn, equals the MLP branch run on h_{L-1}."""

from __future__ import annotations

import math

import pytest
import torch
from _tolerance import f32_tol
from tiny_families import SPECS, make_family

from captum_iglens import IGLens
from captum_iglens.lens.sublayer import (
    SublayerUnsupportedError,
    capture_half_residuals,
    half_block_site,
)


def _plain(block, h, a):
    return h + a


def _multiplied(block, h, a):
    return h + a * block.residual_multiplier


def _sandwich(norm):
    return lambda block, h, a: h + getattr(block, norm)(a)


def _beam(block, h, a):
    idx = block.attn_residual_add_idx
    return block.post_attention_layernorm(a) / math.sqrt(idx) + h * math.sqrt((idx - 1) / idx)


def _hyperclovax(block, h, a):
    return h + block.post_norm1(a) * block.residual_multiplier


#: family -> (its attention submodule, how its forward adds the attention output), written
#: from each family's modeling code, independently of captum_iglens.lens.sublayer.
ATTENTION_SIDE = {
    **{f: ("self_attn", _plain) for f in (
        "llama", "mistral", "mixtral", "qwen2", "qwen3", "phi3", "olmo", "gemma", "nanochat",
        "vaultgemma", "opt", "stablelm")},
    **{f: ("self_attn", _multiplied) for f in (
        "granite", "granitemoe", "granitemoeshared", "granite_swa", "granitemoe_swa")},
    **{f: ("self_attn", _sandwich("post_attention_layernorm")) for f in (
        "gemma2", "gemma3_text", "gemma3", "gemma4_text", "olmo2")},
    **{f: ("attn", _plain) for f in ("gpt2", "gpt_bigcode", "gpt_neo", "mpt")},
    "bloom": ("self_attention", lambda block, h, a: a),  # its output includes the residual
    "beam": ("self_attn", _beam),
    "hyperclovax": ("self_attn", _hyperclovax),
}
#: Parallel families: (attention submodule, MLP branch of h_{L-1}).
PARALLEL = {
    "gptj": ("attn", lambda b, h: b.mlp(b.ln_1(h))),
    "codegen": ("attn", lambda b, h: b.mlp(b.ln_1(h))),
    "phi": ("self_attn", lambda b, h: b.mlp(b.input_layernorm(h))),
    "cohere": ("self_attn", lambda b, h: b.mlp(b.input_layernorm(h))),
    "cohere2": ("self_attn", lambda b, h: b.mlp(b.input_layernorm(h))),
    "cohere2_moe": ("self_attn", lambda b, h: b.mlp(b.input_layernorm(h))),
    "falcon": ("self_attention", lambda b, h: b.mlp(b.input_layernorm(h))),
    "falcon_rope": ("self_attention", lambda b, h: b.mlp(b.ln_mlp(h))),
    "gpt_neox": ("attention", lambda b, h: b.mlp(b.post_attention_layernorm(h))),
}
REFUSED = ("opt_350m", "falcon_h1", "recurrent_gemma", "granitemoehybrid")


def _first(output):
    return output[0] if isinstance(output, tuple) else output


def _run(family: str, attention: str):
    model = make_family(family).eval()
    lens = IGLens(model)
    blocks = lens.decoder_blocks
    site = half_block_site(model, blocks)
    ids = torch.randint(0, 100, (2, 7), generator=torch.Generator().manual_seed(3))
    seen: dict[str, dict[int, torch.Tensor]] = {"in": {}, "out": {}, "attn": {}}
    handles = []
    for i, block in enumerate(blocks, start=1):
        handles.append(block.register_forward_pre_hook(
            lambda m, a, k, i=i: seen["in"].__setitem__(i, a[0] if a else k["hidden_states"]),
            with_kwargs=True))
        handles.append(block.register_forward_hook(
            lambda m, a, o, i=i: seen["out"].__setitem__(i, _first(o))))
        handles.append(getattr(block, attention).register_forward_hook(
            lambda m, a, o, i=i: seen["attn"].__setitem__(i, _first(o))))
    half: dict[int, torch.Tensor] = {}
    try:
        with torch.no_grad(), capture_half_residuals(blocks, list(range(1, len(blocks) + 1)),
                                                     site, half):
            model(ids, use_cache=False)
    finally:
        for handle in handles:
            handle.remove()
    return blocks, site, seen, half


def _tol(*tensors: torch.Tensor) -> torch.Tensor:
    # one rounding of each addend, plus the elementwise op of the norm or multiplier
    return f32_tol(*[t.abs() for t in tensors], n_terms=4)


@pytest.mark.parametrize("family", sorted(ATTENTION_SIDE))
def test_sequential_half_residual_is_input_plus_attention(family: str) -> None:
    if family not in SPECS:
        pytest.skip(f"{family} is not among the tiny families")
    attention, combine = ATTENTION_SIDE[family]
    blocks, site, seen, half = _run(family, attention)
    assert site.kind == "input"
    with torch.no_grad():
        for i, block in enumerate(blocks, start=1):
            want = combine(block, seen["in"][i], seen["attn"][i])
            assert ((half[i] - want).abs() <= _tol(seen["in"][i], want)).all(), i
            # the MLP half is what is left: non-trivial in both halves
            assert (half[i] - seen["in"][i]).abs().max() > 1e-3
            assert (seen["out"][i] - half[i]).abs().max() > 1e-3


@pytest.mark.parametrize("family", sorted(PARALLEL))
def test_parallel_half_residual_is_attention_first(family: str) -> None:
    attention, mlp_branch = PARALLEL[family]
    blocks, site, seen, half = _run(family, attention)
    assert site.kind == "parallel"
    with torch.no_grad():
        for i, block in enumerate(blocks, start=1):
            h, out = seen["in"][i], seen["out"][i]
            assert ((half[i] - (h + seen["attn"][i])).abs() <= _tol(h, seen["attn"][i])).all()
            rest, attn = mlp_branch(block, h), seen["attn"][i]
            # in float64, so that only the model's own roundings remain: attn + mlp, + h,
            # and h + attn for L.attn (each within one rounding of its magnitude)
            gap = out.double() - half[i].double() - rest.double()
            assert (gap.abs() <= _tol(out, half[i], rest, attn)).all(), i


@pytest.mark.parametrize("family", REFUSED)
def test_families_outside_the_table_are_refused_by_name(family: str) -> None:
    model = make_family(family)
    with pytest.raises(SublayerUnsupportedError, match="granularity='block'"):
        half_block_site(model, IGLens(model).decoder_blocks)


def test_every_family_is_placed_or_refused() -> None:
    assert set(SPECS) <= set(ATTENTION_SIDE) | set(PARALLEL) | set(REFUSED), (
        "a new family needs a row in captum_iglens.lens.sublayer and here")
