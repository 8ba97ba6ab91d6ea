"""register_family teaches IG-Lens a family it cannot locate; register_estimator adds a method.

A tiny Llama is wrapped so that its parts sit at paths no generic rule tries
(``inner.model.layers``) under a new ``model_type``: unknown before registration, and after it
the same operations as the bare model (bit for bit), sub-layer credits included.
"""

from __future__ import annotations

import copy

import pytest
import torch
from conftest import make_tiny
from torch import nn

from captum_iglens import IGLens, UnknownArchitectureError, register_estimator, register_family
from captum_iglens._core.estimators import ESTIMATORS
from captum_iglens.lens.families import FAMILIES
from captum_iglens.lens.registry import ArchitectureLayout, HalfBlockSite
from captum_iglens.lens.sublayer import SublayerUnsupportedError


class _Wrapped(nn.Module):
    def __init__(self, inner: nn.Module, model_type: str) -> None:
        super().__init__()
        self.inner = inner
        self.config = copy.deepcopy(inner.config)
        self.config.model_type = model_type

    def forward(self, input_ids, attention_mask=None, **kwargs):
        return self.inner(input_ids=input_ids, attention_mask=attention_mask, **kwargs)

    def get_input_embeddings(self) -> nn.Module:
        return self.inner.get_input_embeddings()

    def get_output_embeddings(self) -> nn.Module:
        return self.inner.get_output_embeddings()


@pytest.fixture
def wrapped():
    kind = "wrapped_llama_test"
    yield _Wrapped(make_tiny("llama").eval(), kind), kind
    FAMILIES.pop(kind, None)


def test_a_registered_family_runs_as_the_bare_model(wrapped) -> None:
    model, kind = wrapped
    ids = torch.tensor([[3, 4, 5, 6, 7]])
    with pytest.raises(UnknownArchitectureError, match="Cannot locate the decoder blocks"):
        IGLens(model)
    register_family(kind, ArchitectureLayout("inner.model.layers", "inner.model.norm"),
                    half_block=HalfBlockSite("input", "post_attention_layernorm"))
    bare = IGLens(model.inner)
    for granularity in ("block", "sublayer"):
        got = IGLens(model, granularity=granularity).attribute_details(ids)
        want = IGLens(model.inner, granularity=granularity).attribute_details(ids)
        # the very same modules called with the same arguments: bit for bit
        assert torch.equal(got.attributions, want.attributions)  # exact: same operations
    assert bare.spec.granularity == "block"


def test_register_family_refuses_what_it_cannot_use(wrapped) -> None:
    model, kind = wrapped
    with pytest.raises(ValueError, match="in the table already"):
        register_family("llama", ArchitectureLayout("model.layers", "model.norm"))
    with pytest.raises(TypeError, match="ArchitectureLayout"):
        register_family(kind, {"blocks": "inner.model.layers"})  # type: ignore[arg-type]
    register_family(kind, ArchitectureLayout("inner.model.layers", "inner.model.norm"))
    with pytest.raises(SublayerUnsupportedError, match="wrapped_llama_test"):
        IGLens(model, granularity="sublayer")  # no half-block site registered


def test_register_estimator_adds_a_method_with_its_facts() -> None:
    def halves(readout, path, probs, method, n_steps, chunk):
        # the exact estimator's credits, computed here as the node differences
        return probs[..., 1:] - probs[..., :-1]

    register_estimator("node_differences_test", halves, exact=True)
    try:
        model = make_tiny("llama").eval()
        ids = torch.tensor([[3, 4, 5, 6]])
        lens = IGLens(model)
        got = lens.attribute(ids, method="node_differences_test")
        want = lens.attribute(ids)
        assert torch.equal(got, want)  # exact: the default computes these differences
        with torch.inference_mode():  # an exact estimator needs no gradient
            lens.attribute(ids, method="node_differences_test")
        with pytest.raises(ValueError, match="exists"):
            register_estimator("node_differences_test", halves, exact=True)
    finally:
        ESTIMATORS.pop("node_differences_test", None)


@pytest.fixture
def renamed():
    """A tiny Llama whose config names a family the table does not know."""
    kind = "renamed_llama_test"
    model = make_tiny("llama").eval()
    model.config = copy.deepcopy(model.config)
    model.config.model_type = kind
    yield model, kind
    FAMILIES.pop(kind, None)


def test_one_register_family_call_is_the_whole_row(renamed) -> None:
    """Llama's row registered under a new name: block, sub-layer and head credits all work,
    add up, and read the model's own distribution at ``h_n``."""
    from dataclasses import replace

    model, kind = renamed
    ids = torch.tensor([[3, 4, 5, 6, 7]])
    with pytest.raises(SublayerUnsupportedError, match=kind):
        IGLens(model, granularity="sublayer")  # located generically, but no half-block site
    register_family(kind, replace(FAMILIES["llama"]))  # one call, the whole row
    with torch.no_grad():
        logits = model(input_ids=ids).logits.float()
    own = logits.log_softmax(-1).exp()
    for granularity, heads in (("block", False), ("sublayer", False), ("sublayer", True)):
        out = IGLens(model, granularity=granularity, heads=heads).attribute_details(
            ids, positions=[1, 4])
        target = out.target
        model_p = own[0, [1, 4]].gather(-1, target[0, :, None])[:, 0]
        # Invariant R: f(h_n) is the model's own probability (float32 readout, |p| <= 1)
        eps = torch.finfo(torch.float32).eps
        assert ((out.p_final[0] - model_p).abs() <= 64 * eps).all(), granularity
        # completeness: the exact estimator's credits add up to delta_p; each of the k
        # credits is a float64 difference rounded to float32 (<= eps/2 * |credit|)
        total = out.attributions.double().sum(-1)
        delta = (out.p_final - out.p_baseline).double()
        bound = eps * (out.attributions.double().abs().sum(-1) + delta.abs())
        assert ((total - delta).abs() <= bound).all(), granularity
        if heads:
            assert out.head_credits is not None and out.head_credits.shape[-1] == 4
    # the rows name every fact: recordable, cached, no refusal
    row = FAMILIES[kind]
    assert row.unrecorded is None and row.uncached is None and row.heads == ("self_attn", "o_proj")
