"""Invariant R on every family in readout.FAMILIES (issue 4, DESIGN.md sections 1 and 3).

Each family is a tiny random model (hidden 64, 2 blocks, vocabulary 128) with perturbed norm
weights and biases, a perturbed head bias where there is one, and non-trivial soft-cap /
scale / multiplier values where the family has them (tests/tiny_families.py).
"""

from __future__ import annotations

import warnings

import pytest
import torch
from _tolerance import f32_tol, logit_magnitude, readout_prob_magnitude, reduction_length
from tiny_families import FAMILY_NAMES, SPECS, make_family
from torch import nn

from captum_iglens import FAMILIES, IGLens, UnknownArchitectureError, resolve_readout
from captum_iglens.lens.architectures import resolve_layout
from captum_iglens.lens.hooks import capture_residual_stream

POSITIONS = [0, 3, 5, -1]


def _build(family: str) -> nn.Module:
    try:
        return make_family(family)
    except (ImportError, AttributeError) as err:  # pragma: no cover - depends on install
        pytest.skip(f"transformers cannot build {family!r} offline here: {err}")


@pytest.fixture(scope="module")
def ids() -> torch.Tensor:
    return torch.randint(3, 128, (2, 8), generator=torch.Generator().manual_seed(7))


@pytest.mark.numerics
@pytest.mark.parametrize("family", FAMILY_NAMES)
def test_invariant_r(family: str, ids: torch.Tensor) -> None:
    """p_final (lens readout of h_n) equals softmax(model logits)[target] to float32 rounding
    at several positions, for the argmax and for a fixed other target; the readout of the
    captured h_n
    reproduces the model's full logits vector; the captured h_0 is the model's own
    hidden_states[0] (embedding scaling / multipliers / project_in included); the model comes
    back in train mode."""
    model = _build(family)
    assert model.training
    lens = IGLens(model, check_readout=False)  # compare here, not through the run-time check
    assert lens.num_layers == 2
    model.eval()
    with torch.no_grad():
        out_model = model(ids, use_cache=False, output_hidden_states=True)
    model.train()
    probs = torch.softmax(out_model.logits.float(), dim=-1)[:, POSITIONS]
    model.eval()
    with torch.no_grad(), capture_residual_stream(lens.decoder_blocks, [0, 2]) as states:
        model(ids, use_cache=False)
        logits = lens.readout(states[2])
    model.train()
    # Same ids and shapes: h_n is the same in every forward pass here; the final norm and
    # head run on other rows (the lens reads out the explained positions, padded to 8).
    n = reduction_length(lens.readout)
    prob_mag = readout_prob_magnitude(lens.readout, states[2][:, POSITIONS])  # [B, P, V]
    for target in (None, 17):
        out = lens.attribute_details(ids, positions=POSITIONS, target=target)
        expected = probs.gather(-1, out.target[..., None])[..., 0]
        mag = prob_mag.gather(-1, out.target[..., None])[..., 0]
        # ~1e-6 here; a dropped soft-cap, scale or bias moves p by > 0.1
        assert ((out.p_final - expected).abs() <= f32_tol(mag, mag, n_terms=n)).all()
    assert model.training, "the model must come back in train mode"

    _, logit_mag = logit_magnitude(lens.readout, states[2])
    tol = f32_tol(logit_mag, logit_mag, n_terms=n)
    assert ((logits - out_model.logits).abs() <= tol).all()
    # h_0: the embedding output (scaled, multiplied or projected) of the same ids, computed
    # by the same modules; its roundings are relative to |h_0| (per op, depth <= n).
    h_0 = states[0].abs().double()
    assert ((states[0] - out_model.hidden_states[0]).abs()
            <= f32_tol(h_0, h_0, n_terms=reduction_length(model))).all()


@pytest.mark.parametrize("family", ["gemma2", "gemma3_text", "cohere", "granite"])
def test_logit_transform_is_needed(family: str, ids: torch.Tensor) -> None:
    """The soft-cap / scale is not a no-op on these configs: dropping it breaks Invariant R,
    and the run-time check says so."""
    model = _build(family).eval()
    readout = resolve_readout(model)
    assert readout.logit_transform is not None
    with torch.no_grad(), capture_residual_stream(IGLens(model).decoder_blocks, [2]) as states:
        logits = model(ids, use_cache=False).logits
    with torch.no_grad():
        raw = readout.unembed(readout.final_norm(states[2]))
    # Dropping the transform moves the logits by > 0.1, far above their float32 bound.
    _, logit_mag = logit_magnitude(readout, states[2])
    tol = f32_tol(logit_mag, logit_mag, n_terms=reduction_length(readout))
    assert (raw - logits).abs().max() > max(0.1, 1e3 * float(tol.max()))
    broken = type(readout)(readout.final_norm, readout.unembed, name=family)
    with pytest.raises(Exception, match="Invariant R failed for architecture"):
        IGLens(model, readout=broken).attribute(ids)


def test_opt_350m_layout(ids: torch.Tensor) -> None:
    """OPT with word_embed_proj_dim != hidden_size and do_layer_norm_before=False: no final
    norm, project_out before the head; skipping project_out cannot even run."""
    model = _build("opt_350m")
    readout = resolve_readout(model)
    assert readout.final_norm is None
    assert len(readout.pre_unembed) == 1 and readout.pre_unembed[0].out_features == 32


def test_head_bias_families_use_it() -> None:
    """Phi and GPT-J heads carry a bias: the resolved unembedding is the model's own head."""
    for family in ("phi", "gptj"):
        model = _build(family)
        readout = resolve_readout(model)
        assert readout.unembed is model.get_output_embeddings()
        assert readout.unembed.bias is not None and readout.unembed.bias.abs().sum() > 0


def test_every_family_has_one_row() -> None:
    """Every model_type the tests build has its row in FAMILIES (no generic fall-back)."""
    import transformers as tf

    for family, (config_name, _, kwargs) in SPECS.items():
        config = getattr(tf, config_name)(**kwargs())
        assert config.model_type in FAMILIES, family


class _Custom(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.stack = nn.ModuleList([nn.Linear(4, 4)])
        self.head = nn.Linear(4, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.stack[0](x))


def test_unknown_architecture_raises_naming_what_was_tried() -> None:
    with pytest.raises(UnknownArchitectureError, match=r"Tried decoder-block paths .*model\.layers"
                       r".*final-norm paths .*model\.norm.*readout="):
        IGLens(_Custom())
    with pytest.raises(UnknownArchitectureError, match="_Custom"):
        resolve_layout(_Custom())


def test_known_family_with_missing_norm_raises() -> None:
    """A known model_type whose final norm is gone or None raises instead of silently using
    an identity norm (only OPT may lack one)."""
    model = _build("llama")
    model.model.norm = None
    with pytest.raises(UnknownArchitectureError, match="model_type='llama'.*'model.norm'"):
        resolve_readout(model)
    del model.model.norm
    with pytest.raises(UnknownArchitectureError, match="model_type='llama'.*'model.norm'"):
        IGLens(model)


@pytest.mark.parametrize("family", FAMILY_NAMES)
def test_generated_answer_is_recorded(family: str) -> None:
    """Recording the generation's own passes works for every family (KV caches of every
    kind: sliding windows, recurrent and state-space blocks, tuple outputs): the greedy
    answers are generate_batch's, one recorded pass per answer token, every token the
    argmax of its pass, Invariant R checked against the recorded logits, the credits add
    up to delta_p, and no hook is left. (Equality with teacher forcing, within the bound of
    two forwards of other shapes: test_run.test_recorded_generation_equals_teacher_forcing_alone.)
    """
    from _tolerance import completeness_tol
    from tiny_tokenizer import word_tokenizer

    from captum_iglens.lens.families import UNRECORDED_GENERATION
    from captum_iglens.text.batched import AnswerJob, explain_recorded
    from captum_iglens.text.generation import generate_batch
    from captum_iglens.text.prompts import render_prompt
    from captum_iglens.text.recorded import generate_recording

    model, tok = _build(family).eval(), word_tokenizer()
    lens = IGLens(model)
    hooks = sum(len(m._forward_hooks) + len(m._forward_pre_hooks) for m in model.modules())
    rendered = [render_prompt(tok, p, chat_template=False) for p in ("w3 w9 w4 w2", "w7")]
    if family in UNRECORDED_GENERATION:
        with pytest.raises(ValueError, match="teacher forcing"):
            generate_recording(lens, tok, [r.ids for r in rendered], 3)
        return
    recording = generate_recording(lens, tok, [r.ids for r in rendered], 3)
    assert recording.answers == generate_batch(model, tok, [r.ids for r in rendered], 3)
    assert recording.logits.shape[1] == max(len(a) for a in recording.answers)
    jobs = [AnswerJob(f"p{i}", r, a, generated=True)
            for i, (r, a) in enumerate(zip(rendered, recording.answers, strict=True))]
    for row in explain_recorded(lens, tok, recording, jobs):
        assert all(row.is_argmax)
        delta_p = row.p_final - row.p_baseline
        assert (row.convergence_delta.abs() <= completeness_tol(row.attributions, delta_p)).all()
    assert hooks == sum(len(m._forward_hooks) + len(m._forward_pre_hooks)
                        for m in model.modules())


def test_recurrent_gemma_answers_are_teacher_forced() -> None:
    """transformers' RecurrentGemma continues the previous generate call's recurrent state in
    a one-token prompt pass: its generated answers are explained by teacher forcing (the
    model's plain forward), so a one-token prompt after another gives exactly the result of
    teacher-forcing its answer alone (the recorded passes were off by 6% of the credits)."""
    from tiny_tokenizer import word_tokenizer

    from captum_iglens import explain

    model, tok = _build("recurrent_gemma").eval(), word_tokenizer()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the answer may not be the plain forward's argmax
        first, second = explain(model, tok, ["w17", "w86"], max_new_tokens=4,
                                chat_template=False)
        alone = explain(model, tok, "w86", target=second.token_ids, chat_template=False)
    assert torch.equal(second.attributions, alone.attributions)
    assert torch.equal(second.p_final, alone.p_final)


def test_gemma4_kv_shared_layers_are_teacher_forced() -> None:
    """Gemma-4 with KV-shared layers: generate's prompt pass keeps only the last position
    before the shared layers, so its passes cannot be recorded (a generated explain used to
    fail with ResidualShapeError); the answer is teacher-forced and equals an explicit
    teacher-forced run of the same answer, bit for bit (the same forward)."""
    import transformers as tf
    from tiny_families import SPECS
    from tiny_tokenizer import word_tokenizer

    from captum_iglens import explain
    from captum_iglens.text.recorded import can_record

    config_name, model_name, kwargs = SPECS["gemma4_text"]
    args = {**kwargs(), "num_hidden_layers": 4, "num_kv_shared_layers": 2,
            "layer_types": ["sliding_attention", "full_attention"] * 2}
    torch.manual_seed(0)
    model = getattr(tf, model_name)(getattr(tf, config_name)(**args)).eval()
    assert not can_record("mean", model)
    tok = word_tokenizer()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        generated = explain(model, tok, "w3 w4 w5 w6", max_new_tokens=3, chat_template=False)
        forced = explain(model, tok, "w3 w4 w5 w6", target=generated.token_ids,
                         chat_template=False)
    assert len(generated.token_ids) == 3
    assert torch.equal(generated.attributions, forced.attributions)
