"""Forward arguments that change what the model keeps: a caller's KV cache, logits_to_keep.

A caller's ``past_key_values`` (a shared prefix) holds no residual stream, so the default
causal "mean" baseline would average the new tokens only: it is refused by name, with what
to pass instead, and the caller's cache is left as it was. ``logits_to_keep`` /
``num_logits_to_keep`` never change a number: the lens asks for the explained positions'
logits itself, and a forward that returns others is refused naming what it returned.
"""

from __future__ import annotations

import pytest
import torch
from conftest import make_tiny
from transformers import DynamicCache, LlamaForCausalLM

from captum_iglens import IGLens

PREFIX, NEW = 5, 4


def _ids(length: int, seed: int = 0) -> torch.Tensor:
    return torch.randint(3, 128, (1, length), generator=torch.Generator().manual_seed(seed))


def _prefix_cache(model: torch.nn.Module, prefix: torch.Tensor) -> DynamicCache:
    with torch.no_grad():
        return model(prefix, use_cache=True).past_key_values


@pytest.mark.parametrize("family", ["llama", "gpt2"])
@pytest.mark.parametrize("form", ["dict", "dict with the full mask", "captum tuple"])
def test_a_callers_cache_is_refused_by_name(family: str, form: str) -> None:
    model = make_tiny(family, n_layers=3).eval()
    text = _ids(PREFIX + NEW)
    prefix, new = text[:, :PREFIX], text[:, PREFIX:]
    cache = _prefix_cache(model, prefix)
    full_mask = torch.ones_like(text)
    args = {"dict": {"past_key_values": cache},
            "dict with the full mask": {"past_key_values": cache, "attention_mask": full_mask},
            "captum tuple": (full_mask, cache)}[form]
    if form == "captum tuple" and family != "gpt2":
        pytest.skip("the cache is the second positional parameter of GPT-2's forward only")
    with pytest.raises(ValueError) as info:
        IGLens(model).attribute(new, additional_forward_args=args, positions=[0, -1])
    message = str(info.value)
    name = "cache" if form == "captum tuple" else "past_key_values"  # GPT-2's parameter name
    assert f"passes {name} (a cache of 5 earlier positions)" in message
    assert f"without {name}" in message and "positions=" in message
    assert "attention_mask has shape" not in message
    assert cache.get_seq_length() == PREFIX  # the caller's cache is left as it was


def test_the_advice_explains_the_cached_prediction() -> None:
    """The whole text, last tokens explained: the prediction the cached forward makes."""
    model = make_tiny("llama", n_layers=3).eval()
    text = _ids(PREFIX + NEW)
    cache = _prefix_cache(model, text[:, :PREFIX])
    with torch.no_grad():
        cached = model(text[:, PREFIX:], past_key_values=cache).logits
    out = IGLens(model).attribute_details(text, positions=list(range(-NEW, 0)))
    # the same next-token predictions as the cached forward of the new tokens
    assert torch.equal(out.target, cached.argmax(-1))
    assert out.target.unique().numel() > 1  # not one token everywhere: the check can fail


@pytest.mark.parametrize("name", ["logits_to_keep", "num_logits_to_keep"])
@pytest.mark.parametrize("keep", [1, 3])
@pytest.mark.parametrize("granularity", ["block", "sublayer"])
def test_logits_to_keep_changes_no_number(name: str, keep: int, granularity: str) -> None:
    model = make_tiny("llama", n_layers=3).eval()
    lens = IGLens(model, granularity=granularity)
    ids = _ids(8, 1)
    want = lens.attribute_details(ids, positions=[3, -1])
    got = lens.attribute_details(ids, additional_forward_args={name: keep}, positions=[3, -1])
    # the caller's value is replaced by the lens's own (the explained positions): the same
    # forward, bit for bit
    assert torch.equal(got.attributions, want.attributions)
    assert torch.equal(got.p_final, want.p_final)
    assert torch.equal(got.target, want.target)


class _KeepsLastOnly(LlamaForCausalLM):
    """A forward that returns the last position's logits whatever it is asked."""

    def forward(self, input_ids=None, logits_to_keep=0, **kwargs):  # type: ignore[override]
        return super().forward(input_ids, logits_to_keep=1, **kwargs)


def test_a_forward_that_keeps_other_logits_is_refused_naming_them() -> None:
    source = make_tiny("llama", n_layers=3).eval()
    model = _KeepsLastOnly(source.config).eval()
    model.load_state_dict(source.state_dict())
    with pytest.raises(ValueError) as info:
        IGLens(model).attribute(_ids(8, 2), positions=[3, -1])
    message = str(info.value)
    assert "returned logits at 1 position of the 8-token input" in message
    assert "asked for 2 (positions [3, 7])" in message
