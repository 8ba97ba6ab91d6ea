"""Issue 4: half precision, batching, accelerate dispatch, model state and bad input."""

from __future__ import annotations

import argparse
import warnings

import pytest
import torch
from _tolerance import (
    completeness_tol,
    credit_sensitivity,
    f32_tol,
    lens_nodes,
    node_sensitivity,
    quantization_tol,
    readout_prob_magnitude,
    readout_sensitivity,
    reduction_length,
)
from conftest import make_tiny
from tiny_families import make_family
from tiny_tokenizer import word_tokenizer
from torch import nn

from captum_iglens import IGLens
from captum_iglens.cli import UsageError, read_prompts
from captum_iglens.lens.architectures import vocab_size
from captum_iglens.lens.state import execution_device, model_dtype
from captum_iglens.text.explain_prompt import build_prompt_ids, explain, target_token_id

POSITIONS = [2, 5, -1]


@pytest.fixture(scope="module")
def ids() -> torch.Tensor:
    return torch.randint(3, 128, (2, 8), generator=torch.Generator().manual_seed(3))


# ---------------------------------------------------------------------------- precision
@pytest.mark.numerics
@pytest.mark.parametrize("family", ["llama", "gpt2", "bloom"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision(family: str, dtype: torch.dtype, ids: torch.Tensor) -> None:
    """Half models: float32 credits and delta; completeness against the float32 softmax of
    the same hidden states; p_final is the half model's own probability (softmax in
    float32); credits close to the float32 model's. Bounds: tests/_tolerance.py."""
    ref_lens = IGLens(make_family(family))
    ref = ref_lens.attribute_details(ids, positions=POSITIONS)
    model = make_family(family, dtype=dtype)
    lens = IGLens(model)
    out = lens.attribute_details(ids, positions=POSITIONS, target=ref.target)
    assert out.attributions.dtype == out.convergence_delta.dtype == torch.float32
    assert out.p_final.dtype == torch.float32
    bound = completeness_tol(out.attributions, out.delta_p)  # float32 credits summed
    assert (out.convergence_delta.abs() <= bound).all()
    assert ((out.attributions.sum(-1) - (out.p_final - out.p_baseline)).abs() <= bound).all()
    with torch.no_grad():
        logits = model.eval()(ids, use_cache=False).logits
    assert logits.dtype == dtype
    own = torch.softmax(logits.float(), -1)[:, POSITIONS].gather(-1, ref.target[..., None])[..., 0]
    # The same half h_n through the same half norm and head on other rows: each half result
    # rounds once (CPU kernels accumulate in float32), so eps_half times the readout's sum of
    # |terms|, plus the float32 accumulation and softmax.
    h_n = lens_nodes(lens, ids, POSITIONS, "zero")[:, :, -1]
    mag = readout_prob_magnitude(lens.readout, h_n).gather(-1, ref.target[..., None])[..., 0]
    tol = (f32_tol(mag, mag, eps=torch.finfo(dtype).eps)
           + f32_tol(mag, mag, n_terms=reduction_length(lens.readout)))
    assert ((out.p_final - own).abs() <= tol).all()
    # Half weights and activations against float32: every weight and value rounded once,
    # independently (6 sigma of the first-order error): per credit 4e-4..7e-3 (float16) and
    # 3e-3..6e-2 (bfloat16) here, observed at most a fifth of it, credits up to 0.25.
    l2 = node_sensitivity(ref_lens, ids, POSITIONS, ref.target, order=2)
    tol = quantization_tol(credit_sensitivity(l2), torch.finfo(dtype).eps)
    assert ((out.attributions - ref.attributions).abs() <= tol).all()
    attr, delta = lens.attribute(ids, method="gausslegendre", n_steps=8,
                                 return_convergence_delta=True)
    assert attr.dtype == delta.dtype == torch.float32 and torch.isfinite(attr).all()


# ---------------------------------------------------------------------------- batching
def _padded(lengths: tuple[int, ...]) -> tuple[list[torch.Tensor], torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(5)
    seqs = [torch.randint(3, 128, (n,), generator=gen) for n in lengths]
    width = max(lengths)
    ids = torch.zeros(len(seqs), width, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for row, seq in enumerate(seqs):
        ids[row, width - len(seq):] = seq
        mask[row, width - len(seq):] = 1
    return seqs, ids, mask


def _padded_tol(lens: IGLens, ids: torch.Tensor, mask: torch.Tensor, target: torch.Tensor,
                baseline: str) -> torch.Tensor:
    """Node sensitivities ``[B, 2, k + 1]`` of a left-padded batch at positions -2, -1."""
    return node_sensitivity(lens, ids, [-2, -1], target, baseline, mask)


@pytest.mark.numerics
@pytest.mark.parametrize("family", ["gpt2", "llama", "gpt_neox", "bloom", "mpt", "falcon", "opt"])
def test_left_padded_batch_equals_single(family: str) -> None:
    """Each row of a left-padded batch (mask -> position ids, alibi from the mask) equals its
    single-prompt result: credits, p_final, delta, for the mean and embedding baselines.
    The two runs differ in every matrix shape, so the bound is eps sqrt(n) times the sum of
    |terms| of the whole forward pass for each (tests/_tolerance.py): at most 1e-3 here,
    while a wrong mask, position ids or baseline moves p_final or a credit by > 0.05."""
    model = make_family(family)
    lens = IGLens(model, layers=[0, 1, 2])
    n = reduction_length(model)
    seqs, ids, mask = _padded((7, 4, 9))
    for baseline in ("mean", "embedding"):
        batch = lens.attribute_details(ids, positions=[-2, -1], baselines=baseline,
                                       additional_forward_args=mask)
        # One magnitude for both runs: a row's padded positions add exact zeros (masked),
        # so its sum of |terms| is the single prompt's.
        sens = _padded_tol(lens, ids, mask, batch.target, baseline)
        credit_tol = f32_tol(credit_sensitivity(sens), credit_sensitivity(sens), n_terms=n)
        p_tol = f32_tol(sens[..., -1], sens[..., -1], n_terms=n)
        for row, seq in enumerate(seqs):
            one = lens.attribute_details(seq[None], positions=[-2, -1], baselines=baseline)
            assert ((batch.attributions[row] - one.attributions[0]).abs()
                    <= credit_tol[row]).all()
            assert ((batch.p_final[row] - one.p_final[0]).abs() <= p_tol[row]).all()
            torch.testing.assert_close(batch.target[row], one.target[0])


def test_gpt2_batch_needs_position_ids() -> None:
    """The derived position ids matter: forcing GPT-2's default positions on a left-padded
    row changes p_final (so the equality above is not vacuous)."""
    model = make_family("gpt2")
    lens = IGLens(model)
    seqs, ids, mask = _padded((7, 4, 9))
    good = lens.attribute_details(ids, additional_forward_args=mask)
    default_pos = torch.arange(ids.shape[1])[None].expand_as(ids)
    bad = lens.attribute_details(ids, target=good.target, additional_forward_args={
        "attention_mask": mask, "position_ids": default_pos})
    # far above the padded-batch bound of the test above (both runs of this batch)
    sens = _padded_tol(lens, ids, mask, good.target[:, -1:].expand(-1, 2), "mean")[1, 1, -1]
    tol = f32_tol(sens, sens, n_terms=reduction_length(model))
    assert (good.p_final[1] - bad.p_final[1]).abs().max() > 1e2 * tol


# ---------------------------------------------------------------------------- accelerate
@pytest.mark.parametrize("family", ["llama", "gpt2", "opt_350m"])
def test_accelerate_cpu_offload_identical(family: str, ids: torch.Tensor) -> None:
    """cpu_offload puts every parameter on 'meta'; the lens finds the execution device, the
    vocabulary and dtype, and gives identical credits for both estimators."""
    from accelerate import cpu_offload

    ref_lens = IGLens(make_family(family))
    model = make_family(family)
    cpu_offload(model, execution_device=torch.device("cpu"))
    assert model.get_output_embeddings().weight.device.type == "meta"
    lens = IGLens(model)
    assert execution_device(lens.readout) == torch.device("cpu")
    assert vocab_size(model) == 128 and model_dtype(model) == torch.float32
    for method in ("prediction_aware", "riemann_trapezoid"):
        ref = ref_lens.attribute_details(ids, positions=POSITIONS, method=method, n_steps=4)
        out = lens.attribute_details(ids, positions=POSITIONS, method=method, n_steps=4)
        # accelerate only moves the weights: the same float32 operations run on the same
        # values in the same shapes, so the results are identical, not merely close
        torch.testing.assert_close(out.attributions, ref.attributions, atol=0, rtol=0)
        torch.testing.assert_close(out.p_final, ref.p_final, atol=0, rtol=0)


def test_accelerate_device_map_with_disk_offload(tmp_path, ids: torch.Tensor) -> None:
    """dispatch_model with a device_map over CPU, block 1 offloaded to disk: identical."""
    from accelerate import dispatch_model

    ref = IGLens(make_family("llama")).attribute_details(ids, positions=POSITIONS)
    model = make_family("llama")
    device_map = {"model.embed_tokens": "cpu", "model.layers.0": "disk", "model.layers.1": "cpu",
                  "model.norm": "cpu", "model.rotary_emb": "cpu", "lm_head": "cpu"}
    model = dispatch_model(model, device_map=device_map, offload_dir=str(tmp_path),
                           main_device="cpu")
    out = IGLens(model).attribute_details(ids, positions=POSITIONS)
    # the same operations on the same values and shapes (see the test above): identical
    torch.testing.assert_close(out.attributions, ref.attributions, atol=0, rtol=0)


# ---------------------------------------------------------------------------- model state
def _hook_count(model: nn.Module) -> int:
    return sum(len(m._forward_hooks) + len(m._forward_pre_hooks) for m in model.modules())


def test_train_mode_dropout_and_state(ids: torch.Tensor) -> None:
    """GPT-2 with dropout 0.1 in train mode: two calls agree exactly and equal the eval-mode
    result; the mixed train/eval flags, requires_grad flags and .grad come back untouched
    and no hook is left, for the default and a gradient estimator."""
    model = make_tiny("gpt2")
    # exact: the config's own default, no arithmetic
    assert model.config.resid_pdrop == 0.1 and model.training
    model.transformer.h[0].eval()  # a user's mix of modes must survive
    model.transformer.wte.weight.requires_grad_(False)
    modes = {n: m.training for n, m in model.named_modules()}
    flags = {n: p.requires_grad for n, p in model.named_parameters()}
    hooks = _hook_count(model)
    lens = IGLens(model)
    first = lens.attribute(ids, positions=POSITIONS)
    second = lens.attribute(ids, positions=POSITIONS)
    grad_attr = lens.attribute(ids, positions=POSITIONS, method="riemann_middle", n_steps=4)
    assert torch.equal(first, second)
    assert {n: m.training for n, m in model.named_modules()} == modes
    assert {n: p.requires_grad for n, p in model.named_parameters()} == flags
    assert all(p.grad is None for p in model.parameters())
    assert _hook_count(model) == hooks
    model.eval()
    torch.testing.assert_close(lens.attribute(ids, positions=POSITIONS), first, atol=0, rtol=0)
    assert torch.isfinite(grad_attr).all()


def test_state_restored_after_error(ids: torch.Tensor) -> None:
    """A NaN-poisoned block raises FloatingPointError naming the layer and module path; the
    model is handed back in train mode with no hook left and requires_grad untouched."""
    model = make_family("llama")
    hooks = _hook_count(model)
    with torch.no_grad():
        model.model.layers[1].mlp.down_proj.weight[0, 0] = float("nan")
    lens = IGLens(model, layers=[0, 1, 2])
    with pytest.raises(FloatingPointError, match=r"hidden-state index 2 .*model\.layers\.1"):
        lens.attribute(ids)
    assert model.training and all(m.training for m in model.modules())
    assert _hook_count(model) == hooks
    assert all(p.requires_grad and p.grad is None for p in model.parameters())


def test_nan_named_even_when_layer_not_chosen(ids: torch.Tensor) -> None:
    """The first non-finite block is named even if it is not among the chosen layers."""
    model = make_family("gpt2")
    with torch.no_grad():
        model.transformer.h[0].mlp.c_proj.weight.fill_(float("inf"))
    with pytest.raises(FloatingPointError, match=r"index 1 .*transformer\.h\.0"):
        IGLens(model, layers=[2]).attribute(ids)


def test_nan_named_while_generating() -> None:
    """explain() records the generation's own passes: there too the first non-finite block
    is named although it is not a chosen layer, and the model keeps no hook."""
    model, tok = make_family("gpt2").eval(), word_tokenizer()
    hooks = _hook_count(model)
    with torch.no_grad():
        model.transformer.h[0].mlp.c_proj.weight.fill_(float("inf"))
    with pytest.raises(FloatingPointError, match=r"index 1 .*transformer\.h\.0"):
        explain(model, tok, "w1 w2 w3", layers=[2], chat_template=False, max_new_tokens=3)
    assert _hook_count(model) == hooks


def test_nan_at_an_early_prompt_position_named_while_generating() -> None:
    """An inf embedding row of the prompt's first token: the recorded passes name the
    embedding (index 0), as a teacher-forced forward does, not the first block whose output
    at the last position it reaches."""
    model, tok = make_family("llama").eval(), word_tokenizer()
    with torch.no_grad():
        model.model.embed_tokens.weight[tok.convert_tokens_to_ids("w1")] = float("inf")
    for target in (None, "w4 w5"):
        with pytest.raises(FloatingPointError, match=r"hidden-state index 0 \(the embedding"):
            explain(model, tok, "w1 w2 w3", target=target, chat_template=False,
                    max_new_tokens=3)


def test_nan_in_readout_is_reported(ids: torch.Tensor) -> None:
    model = make_family("llama")
    with torch.no_grad():
        model.model.norm.weight[0] = float("nan")
    with pytest.raises(FloatingPointError, match="lens readout .*NaN"):
        IGLens(model).attribute(ids)


# ---------------------------------------------------------------------------- bad input
@pytest.fixture(scope="module")
def lens() -> IGLens:
    return IGLens(make_family("llama"))


def test_empty_inputs(lens: IGLens) -> None:
    with pytest.raises(ValueError, match="inputs is empty"):
        lens.attribute(torch.zeros(1, 0, dtype=torch.long))


def test_empty_prompt_text() -> None:
    with pytest.raises(ValueError, match="prompt is empty"):
        build_prompt_ids(word_tokenizer(), "   ")
    with pytest.raises(ValueError, match="prompt is empty"):
        explain(make_family("llama"), word_tokenizer(), "")


def test_token_ids_outside_vocab(lens: IGLens) -> None:
    with pytest.raises(ValueError, match=r"Token ids \[128\] are outside the vocabulary"):
        lens.attribute(torch.tensor([[5, 6, 128]]))
    with pytest.raises(ValueError, match=r"Token ids \[-1\] are outside"):
        lens.attribute(torch.tensor([[5, -1, 7]]))


def test_target_outside_vocab(lens: IGLens, ids: torch.Tensor) -> None:
    with pytest.raises(ValueError, match=r"Target token ids \[500\] are outside the vocabulary"):
        lens.attribute(ids, target=500)


def test_layers_out_of_range_or_twice() -> None:
    model = make_family("llama")
    with pytest.raises(ValueError, match="Layer index 3 is out of range: this model has 2"):
        IGLens(model, layers=[3])
    with pytest.raises(ValueError, match="Layer index -4 is out of range"):
        IGLens(model, layers=[-4])
    with pytest.raises(ValueError, match="Layer 1 is given twice"):
        IGLens(model, layers=[1, model.model.layers[0]])
    with pytest.raises(ValueError, match=r"not one of the model's 2 decoder blocks.*0\.\.2"):
        IGLens(model, layers=[nn.Linear(2, 2)])


def test_baseline_wrong_shape(lens: IGLens, ids: torch.Tensor) -> None:
    with pytest.raises(ValueError, match=r"must have shape \[d\]=\[64\].*got \(63,\)"):
        lens.attribute(ids, baselines=torch.zeros(63))
    with pytest.raises(ValueError, match="Unknown baseline 'median'"):
        lens.attribute(ids, baselines="median")


def test_unknown_method(lens: IGLens, ids: torch.Tensor) -> None:
    with pytest.raises(ValueError, match="Unknown method 'riemann'.*prediction_aware"):
        lens.attribute(ids, method="riemann")


def test_positions_outside(lens: IGLens, ids: torch.Tensor) -> None:
    with pytest.raises(ValueError, match="Position 8 is outside the sequence of length 8"):
        lens.attribute(ids, positions=[0, 8])
    with pytest.raises(ValueError, match="Position -9 is outside"):
        lens.attribute(ids, positions=-9)


def test_no_chat_template_falls_back_with_warning() -> None:
    tok = word_tokenizer()
    with pytest.warns(UserWarning, match="no chat template; explaining the raw prompt"):
        prompt_ids, used = build_prompt_ids(tok, "w1 w2 w3")
    assert not used and prompt_ids == [5, 6, 7]


def test_multi_token_string_target_refused_with_ids() -> None:
    tok = word_tokenizer()
    assert target_token_id(tok, "w7") == 11
    with pytest.raises(ValueError, match=r"tokenises to 2 tokens: 11 \('w7'\), 12 \('w8'\)"):
        target_token_id(tok, "w7 w8")
    with pytest.raises(ValueError, match="target string is empty"):
        target_token_id(tok, "")


@pytest.mark.numerics
def test_multi_token_string_target_explained_each() -> None:
    """explain(..., target=text) explains every token of the target, teacher-forced: the ids
    are reported, rows match IGLens on prompt + target at the right positions, and the
    credits add up."""
    tok = word_tokenizer()
    model = make_family("llama")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        result = explain(model, tok, "w1 w2 w3", target="w7 w8 w9")
    assert result.token_ids == [11, 12, 13]
    assert result.attributions.shape == (3, 2)
    assert (result.convergence_delta.abs()
            <= completeness_tol(result.attributions, result.delta_p)).all()
    # The last target token is never an input: the teacher-forced sequence stops before it.
    full = torch.tensor([[5, 6, 7, 11, 12]])
    lens = IGLens(model)
    ref = lens.attribute_details(full, positions=[2, 3, 4], target=torch.tensor([[11, 12, 13]]))
    # the same ids, shapes and positions: at most the readout's rounding, in other chunks
    nodes = lens_nodes(lens, full, [2, 3, 4])
    sens = credit_sensitivity(readout_sensitivity(lens.readout, nodes, ref.target))[0]
    tol = f32_tol(sens, sens, n_terms=reduction_length(lens.readout))
    assert ((result.attributions - ref.attributions[0]).abs() <= tol).all()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        several = explain(model, tok, ["w1 w2", "w3"], target=[20])
    assert [r.prompt for r in several] == ["w1 w2", "w3"]
    assert [r.token_ids for r in several] == [[20], [20]]
    for bad in ([3.7], [True], "w1 w2".split()):
        with pytest.raises(TypeError, match="integer token ids"):
            explain(model, tok, "w1", target=bad, chat_template=False)
    single = explain(model, tok, "w1 w2", target=20, chat_template=False)
    assert single.token_ids == [20]


def test_cli_prompts_file(tmp_path) -> None:
    path = tmp_path / "prompts.txt"
    path.write_text("first prompt\n\n  second prompt  \n", encoding="utf-8")
    args = argparse.Namespace(prompts_file=str(path), stdin=False, prompt=[])
    assert read_prompts(args) == ["first prompt", "second prompt"]
    (tmp_path / "empty.txt").write_text("\n \n", encoding="utf-8")
    with pytest.raises(UsageError, match="holds no prompt"):
        read_prompts(argparse.Namespace(prompts_file=str(tmp_path / "empty.txt"), stdin=False,
                                        prompt=[]))
    with pytest.raises(UsageError, match="cannot read --prompts-file"):
        read_prompts(argparse.Namespace(prompts_file=str(tmp_path / "nope.txt"), stdin=False,
                                        prompt=[]))


def test_explain_on_offloaded_model() -> None:
    """The text level finds the input device of a cpu_offload'ed model (weights on 'meta')
    and gives the plain model's credits."""
    from accelerate import cpu_offload

    tok = word_tokenizer()
    plain = make_family("gpt2")
    offloaded = make_family("gpt2")
    cpu_offload(offloaded, execution_device=torch.device("cpu"))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ref = explain(plain, tok, "w1 w2 w3", target="w4 w5")
        out = explain(offloaded, tok, "w1 w2 w3", target="w4 w5")
    # accelerate only moves the weights: the same operations on the same values, identical
    torch.testing.assert_close(out.attributions, ref.attributions, atol=0, rtol=0)
