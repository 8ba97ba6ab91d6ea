"""The text level as people run it: stored generation settings, appended end tokens, chat
templates that write the date, truncated answers, readable tokens, the table and JSON."""

from __future__ import annotations

import json
import warnings

import pytest
import torch
from tiny_families import make_family
from tiny_tokenizer import word_tokenizer

from captum_iglens import IGLensResult, explain
from captum_iglens.text.prompts import render_prompt, token_labels

CLOCK_TEMPLATE = (
    "{% if date_string is not defined %}{% set date_string = strftime_now('%d %b %Y') %}"
    "{% endif %}Today: {{ date_string }}\n{% for m in messages %}{{ m['content'] }}{% endfor %}"
)


def _quiet_explain(*args, **kwargs):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return explain(*args, **kwargs)


@pytest.mark.parametrize("penalty", [1.3, 2.0])
def test_stored_repetition_penalty_does_not_change_the_greedy_answer(penalty: float) -> None:
    """A checkpoint's generation_config (e.g. repetition_penalty) must not apply: every
    generated token is the argmax of the forward that is then attributed."""
    model = make_family("llama", n_blocks=2)
    tok = word_tokenizer()
    model.generation_config.repetition_penalty = penalty
    model.generation_config.eos_token_id = None  # run the full 24 tokens
    result = _quiet_explain(model, tok, "w1 w2 w3 w1 w2", max_new_tokens=24,
                            chat_template=False)
    assert result.generated and len(result.token_ids) == 24
    assert all(result.is_argmax), result.is_argmax
    with torch.no_grad():
        logits = model.eval()(torch.tensor([result.input_ids]), use_cache=False).logits[0]
    assert logits[result.positions].argmax(-1).tolist() == result.token_ids
    assert model.generation_config.repetition_penalty == penalty  # handed back as it was
    # the penalty does change what generate() gives when it applies: the test can fail
    with torch.no_grad():
        penalised = model.generate(torch.tensor([result.input_ids[:5]]), max_new_tokens=24,
                                   do_sample=False, pad_token_id=0)[0, 5:].tolist()
    assert penalised != result.token_ids


def test_appended_end_token_is_not_explained() -> None:
    """A tokenizer with add_eos_token appends </s>: the explained prediction must follow
    the prompt's last real token, not the end token."""
    tok = word_tokenizer()
    plain = render_prompt(tok, "w1 w2 w3", chat_template=False)
    tok_eos = word_tokenizer()
    tok_eos._tokenizer.post_processor = __import__(
        "tokenizers.processors", fromlist=["TemplateProcessing"]).TemplateProcessing(
        single="$A <eos>", special_tokens=[("<eos>", 2)])
    assert tok_eos("w1 w2 w3")["input_ids"][-1] == 2  # the tokenizer really appends it
    with_eos = render_prompt(tok_eos, "w1 w2 w3", chat_template=False)
    assert with_eos.ids == plain.ids == [5, 6, 7]
    model = make_family("llama")
    result = _quiet_explain(model, tok_eos, "w1 w2 w3", target=[20], chat_template=False)
    assert result.positions == [2] and result.input_ids == [5, 6, 7, 20]


def test_clock_template_warns_records_and_can_be_pinned() -> None:
    tok = word_tokenizer(chat_template=CLOCK_TEMPLATE)
    model = make_family("llama")
    with pytest.warns(UserWarning, match="today's date"):
        result = explain(model, tok, "w1 w2", target=[20])
    assert result.template_uses_clock and result.rendered_prompt.startswith("Today: ")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        pinned = explain(model, tok, "w1 w2", target=[20],
                         template_kwargs={"date_string": "26 Jul 2024"})
    assert pinned.rendered_prompt.startswith("Today: 26 Jul 2024")
    assert not pinned.template_uses_clock
    assert pinned.to_dict()["rendered_prompt"] == pinned.rendered_prompt


def test_truncated_answer_is_marked() -> None:
    model = make_family("llama")
    tok = word_tokenizer()
    model.generation_config.eos_token_id = None
    result = _quiet_explain(model, tok, "w1 w2", max_new_tokens=3, chat_template=False)
    assert result.truncated and result.max_new_tokens == 3
    assert "answer truncated" in result.format_table()
    assert result.to_dict()["truncated"] is True
    given = _quiet_explain(model, tok, "w1 w2", target=[20, 21, 22], chat_template=False)
    assert not given.truncated and not given.generated


def test_table_fits_100_columns_prints_zeros_and_has_a_legend() -> None:
    model = make_family("llama", n_blocks=4)
    tok = word_tokenizer()
    result = _quiet_explain(model, tok, "w1 w2 w3", target=[10, 11, 12, 13, 14, 15],
                            chat_template=False)
    result.attributions[0, 0] = -1e-9  # rounds to zero: printed "0", never "-0.00000"
    table = result.format_table()
    assert max(len(line) for line in table.splitlines()) <= 100
    assert "-0.00000" not in table and "+0.00000" not in table
    for word in ("IG:", "lens p:", "Δp:", "onset:", "sustained"):
        assert word in table
    assert "*" in table  # given tokens that are not the argmax are marked


def test_log_probability_table_names_its_total_and_units() -> None:
    model = make_family("llama", n_blocks=4)
    result = _quiet_explain(model, word_tokenizer(), "w1 w2 w3", target=[10, 11, 12],
                            chat_template=False, units="log-probability")
    table = result.format_table()
    rows = {line.split("|")[0].strip(): line for line in table.splitlines() if "|" in line}
    assert "Δlog p" in rows and "log p" in rows and "Δp" not in rows
    assert f"{float(result.delta_p[0]):+.6f}" in rows["Δlog p"]
    legend = " ".join(table.split())
    assert "Δlog p: log p minus the readout at the baseline (log-probability, nats)" in legend
    assert "0.5·Δlog p" in legend and "max |sum - Δlog p|" in legend
    assert "Δp" not in table
    assert all(len(line) <= 100 for line in table.splitlines())


def test_partial_utf8_tokens_are_labelled_readably(smollm2) -> None:
    _, tokenizer = smollm2
    ids = tokenizer("🙂 ok", add_special_tokens=False)["input_ids"]
    pieces = [tokenizer.decode([i]) for i in ids]
    assert any("\ufffd" in p for p in pieces)  # the emoji is split into byte pieces
    labels = token_labels(tokenizer, ids)
    assert not any("\ufffd" in label for label in labels)
    assert labels[0].startswith("<🙂 1/")


def test_json_round_trip() -> None:
    model = make_family("llama")
    tok = word_tokenizer()
    result = _quiet_explain(model, tok, "w1 w2", target=[20, 21], chat_template=False)
    again = IGLensResult.from_dict(json.loads(result.to_json()))
    assert again.token_ids == result.token_ids and again.is_argmax == result.is_argmax
    torch.testing.assert_close(again.attributions, result.attributions)
    assert again.format_table() == result.format_table()


def test_log_probability_units_telescope_and_match_log_of_the_probability_run() -> None:
    """The telescoping holds for any scalar readout: in nats the credits add up to
    log p_final - log f(b), and the levels are the logs of the probability run's levels."""
    from captum_iglens import IGLens

    model = make_family("llama", n_blocks=3)
    ids = torch.randint(4, 128, (2, 7), generator=torch.Generator().manual_seed(5))
    prob = IGLens(model).attribute_details(ids, positions=[3, -1])
    nats = IGLens(model, units="log-probability").attribute_details(ids, positions=[3, -1])
    assert nats.units == "log-probability"
    # log of float32 probabilities vs float32 log-softmax: a few eps relative to |log p|
    torch.testing.assert_close(nats.lens_probs, prob.lens_probs.log(), atol=1e-5, rtol=1e-5)
    assert nats.convergence_delta.abs().max() <= 1e-5  # exact in float64 differences
    torch.testing.assert_close(nats.attributions.sum(-1).double(),
                               (prob.p_final.log() - prob.p_baseline.log()).double(),
                               atol=1e-5, rtol=0)
    grad = IGLens(model, units="log-probability").attribute(
        ids, method="gausslegendre", n_steps=64, positions=[3, -1])
    torch.testing.assert_close(grad, nats.attributions, atol=5e-3, rtol=0)


def test_top_k_tokens_per_layer() -> None:
    model = make_family("llama", n_blocks=3)
    tok = word_tokenizer()
    result = _quiet_explain(model, tok, "w1 w2", target=[20, 21], chat_template=False, top_k=3)
    assert result.top_k_ids.shape == (2, 3, 3) and result.top_k_probs.shape == (2, 3, 3)
    # the last layer's top-1 is the model's own argmax, and probabilities are sorted
    assert result.top_k_probs[..., 0].ge(result.top_k_probs[..., 1]).all()
    with torch.no_grad():
        logits = model.eval()(torch.tensor([result.input_ids[:-1]]), use_cache=False).logits[0]
    assert result.top_k_ids[:, -1, 0].tolist() == logits[result.positions].argmax(-1).tolist()
    data = result.to_dict()
    assert data["tokens"][0]["top_k"][-1][0]["token"] == result.top_k_tokens[0][-1][0]


def test_generated_answer_is_explained_from_its_own_passes() -> None:
    """A generated answer costs the generation's passes only (one per answer token): the
    residuals are recorded there, not in a second, teacher-forced forward; a given target
    costs exactly that one forward. (That both give the same numbers, within the bound of two
    forwards of other shapes: test_run.test_recorded_generation_equals_teacher_forcing_alone.)
    """
    model, tok = make_family("llama").eval(), word_tokenizer()
    calls: list[int] = []
    handle = model.register_forward_pre_hook(lambda _m, _a: calls.append(1))
    try:
        generated = _quiet_explain(model, tok, "w3 w9 w4", max_new_tokens=4,
                                   chat_template=False)
        n_generated, calls[:] = len(calls), []
        forced = _quiet_explain(model, tok, "w3 w9 w4", target=generated.token_ids,
                                chat_template=False)
    finally:
        handle.remove()
    assert n_generated == len(generated.token_ids) and len(calls) == 1
    assert generated.generated and not forced.generated and all(generated.is_argmax)
    assert forced.token_ids == generated.token_ids


def test_float64_generated_answer_is_teacher_forced() -> None:
    """generate returns float32 logits, too coarse for a float64 model's readout check
    (1e-9): a float64 model's generated answer is explained by teacher forcing, in float64,
    exactly as when the same answer is given."""
    model, tok = make_family("gpt2").eval().to(torch.float64), word_tokenizer()
    generated = _quiet_explain(model, tok, "w1 w2 w3", max_new_tokens=3, chat_template=False)
    forced = _quiet_explain(model, tok, "w1 w2 w3", target=generated.token_ids,
                            chat_template=False)
    assert generated.generated and generated.attributions.dtype == torch.float64
    assert torch.equal(generated.attributions, forced.attributions)


def test_explain_refuses_what_iglens_run_refuses_beyond_the_context() -> None:
    """One context rule for every text entry point: explain, explain_ids and iglens run."""
    from captum_iglens.text.explain_prompt import explain_ids

    model = make_family("llama", seed=0, n_blocks=2).eval()
    model.config.max_position_embeddings = 12
    tokenizer = word_tokenizer()
    fits = " ".join(f"w{i}" for i in range(4))  # 4 tokens + 8 new = 12: fits exactly
    result = _quiet_explain(model, tokenizer, fits, max_new_tokens=8, chat_template=False)
    assert len(result.tokens) >= 1
    longer = " ".join(f"w{i}" for i in range(5))
    with pytest.raises(ValueError, match="13 tokens, but this model's context is 12"):
        explain(model, tokenizer, longer, max_new_tokens=8, chat_template=False)
    with pytest.raises(ValueError, match="the 8-token answer"):
        explain_ids(model, list(range(5, 10)), list(range(10, 18)))
    assert explain_ids(model, list(range(5, 9)), list(range(10, 18))).attributions.shape[0] == 8


STRFTIME_TEMPLATE = (
    "Today: {{ strftime_now('%d %B %Y') }}\n{% for m in messages %}{{ m['content'] }}"
    "{% endfor %}"
)


def test_a_date_pin_pins_templates_that_call_strftime_now() -> None:
    """Granite-3.1 / Mistral-Small-3.1 / SmolLM3-style templates call strftime_now directly
    (no date_string variable): the pin reaches them through the template's clock."""
    tok = word_tokenizer(chat_template=STRFTIME_TEMPLATE)
    with pytest.warns(UserWarning, match="writes today's date"):
        today = render_prompt(tok, "w1 w2")
    assert today.uses_clock
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a pin that works: no warning
        pinned = render_prompt(tok, "w1 w2", template_kwargs={"date_string": "26 Jul 2024"})
    assert pinned.text.startswith("Today: 26 July 2024\n") and not pinned.uses_clock
    # the clock is only pinned while rendering
    again = render_prompt(tok, "w1 w2", template_kwargs={"date_string": "01 Jan 2025"})
    assert again.text.startswith("Today: 01 January 2025\n")
    # a pin the template cannot use says so
    plain = word_tokenizer(chat_template="{% for m in messages %}{{ m['content'] }}{% endfor %}")
    with pytest.warns(UserWarning, match="has no effect"):
        render_prompt(plain, "w1 w2", template_kwargs={"date_string": "26 Jul 2024"})
