"""Captum's LLM tutorial (gradient half), re-expressed on SmolLM2 with IG-Lens swapped in.

Captum's tutorial builds ``LayerIntegratedGradients`` on the embedding, wraps it in
``LLMGradientAttribution``, passes ``TextTokenInput(prompt, tokenizer, skip_tokens=...)``
and a target text, then plots ``plot_token_attr`` and ``plot_seq_attr``. The same pattern
with ``IGLens`` and ``LLMIGLensAttribution`` must honour the TextTokenInput reference,
carry what completeness needs, and add up row by row.
"""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import pytest  # noqa: E402
import torch  # noqa: E402
from captum.attr import LLMGradientAttribution, TextTokenInput  # noqa: E402

from captum_iglens import IGLens, LLMIGLensAttribution  # noqa: E402
from captum_iglens.testing import assert_complete  # noqa: E402

PROMPT = "Dave lives in Palm Coast, FL and is a lawyer. His personal interests include"
TARGET = " playing golf, hiking, and cooking."


@pytest.fixture(scope="module")
def setup(smollm2):
    model, tokenizer = smollm2
    lens = IGLens(model, layers=[0, 10, 20, 30])
    return model, tokenizer, LLMIGLensAttribution(lens, tokenizer)


def _probs(model, ids: torch.Tensor, n_prompt: int, target: list[int]) -> torch.Tensor:
    with torch.no_grad():
        probs = model(ids, use_cache=False).logits[0, n_prompt - 1:].float().softmax(-1)
    return probs[torch.arange(len(target)), torch.tensor(target)]


def test_tutorial_pattern_adds_up_to_the_models_own_change(setup) -> None:
    model, tokenizer, llm_attr = setup
    space = tokenizer(" ", add_special_tokens=False)["input_ids"][0]
    inp = TextTokenInput(PROMPT, tokenizer, baselines=space)
    res = llm_attr.attribute(inp, target=TARGET)
    target = tokenizer(TARGET, add_special_tokens=False)["input_ids"]
    assert res.input_tokens == ["emb", "L10", "L20", "L30"]
    assert len(res.output_tokens) == len(target)
    # Each row, with the reference's own readout set apart (baseline_attr = -p(y|x')),
    # adds up to its token's delta_p, within the bound derived from float32 rounding ...
    assert_complete(res)
    assert res.convergence_delta.abs().max() <= 1e-6
    # ... which is the model's own change F(x) - F(x') from plain forwards of the prompt and
    # of the reference (every prompt token replaced by the baseline token), same answer.
    prompt = tokenizer.encode(PROMPT, return_tensors="pt")
    answer = torch.tensor([target[:-1]])
    f_x = _probs(model, torch.cat([prompt, answer], 1), prompt.shape[1], target)
    f_ref = _probs(model, torch.cat([torch.full_like(prompt, space), answer], 1),
                   prompt.shape[1], target)
    # float32 softmax of the same logits in two code paths: a few eps of a probability
    torch.testing.assert_close(res.delta_p, f_x - f_ref, atol=1e-5, rtol=0)
    assert (f_x - f_ref).abs().max() > 1e-2  # a real change, not a vacuous one
    fig, _ = res.plot_token_attr()
    fig2, _ = res.plot_seq_attr()
    assert fig is not None and fig2 is not None


def test_reference_is_honoured(setup) -> None:
    _, tokenizer, llm_attr = setup
    space = tokenizer(" ", add_special_tokens=False)["input_ids"][0]
    a = llm_attr.attribute(TextTokenInput(PROMPT, tokenizer, baselines=space), target=TARGET)
    b = llm_attr.attribute(TextTokenInput(PROMPT, tokenizer), target=TARGET)  # baseline id 0
    assert (a.p_baseline - b.p_baseline).abs().max() > 1e-4
    # skip_tokens are kept in the reference: skipping every prompt token leaves x' = x for
    # the prompt, so the first answer token has no change to explain.
    ids = tokenizer.encode(PROMPT)
    kept = llm_attr.attribute(TextTokenInput(PROMPT, tokenizer, baselines=space,
                                             skip_tokens=list(set(ids))), target=TARGET)
    assert abs(float(kept.delta_p[0])) <= 1e-6


def test_wrapper_keywords(setup) -> None:
    _, tokenizer, llm_attr = setup
    inp = TextTokenInput(PROMPT, tokenizer)
    res = llm_attr.attribute(inp, target=" playing", return_convergence_delta=True)
    assert res.convergence_delta.shape == (1,)
    with pytest.raises(TypeError, match="TextTokenInput"):
        llm_attr.attribute(inp, target=" playing", skip_tokens=[1])
    with pytest.raises(TypeError, match="hidden-state index"):
        llm_attr.attribute(inp, target=" playing", attribute_to_layer_input=True)
    with pytest.raises(TypeError, match="LLMIGLensAttribution.attribute"):
        llm_attr.attribute(inp, target=" playing", bogus=1)


def test_captum_own_wrapper_refuses_iglens(setup) -> None:
    """Why the README leads with LLMIGLensAttribution: Captum's class refuses IGLens."""
    model, tokenizer, _ = setup
    with pytest.raises(AssertionError):
        LLMGradientAttribution(IGLens(model), tokenizer)
