"""Invariant R on every family in readout.FAMILIES (issue 4, DESIGN.md sections 1 and 3).

Each family is a tiny random model (hidden 64, 2 blocks, vocabulary 128) with perturbed norm
weights and biases, a perturbed head bias where there is one, and non-trivial soft-cap /
scale / multiplier values where the family has them (tests/tiny_families.py).
"""

from __future__ import annotations

import pytest
import torch
from tiny_families import FAMILY_NAMES, SPECS, make_family
from torch import nn

from captum_iglens import FAMILIES, IGLens, UnknownArchitectureError, resolve_readout
from captum_iglens.architectures import resolve_layout
from captum_iglens.residual import capture_residual_stream

POSITIONS = [0, 3, 5, -1]


def _build(family: str) -> nn.Module:
    try:
        return make_family(family)
    except (ImportError, AttributeError) as err:  # pragma: no cover - depends on install
        pytest.skip(f"transformers cannot build {family!r} offline here: {err}")


@pytest.fixture(scope="module")
def ids() -> torch.Tensor:
    return torch.randint(3, 128, (2, 8), generator=torch.Generator().manual_seed(7))


@pytest.mark.parametrize("family", FAMILY_NAMES)
def test_invariant_r(family: str, ids: torch.Tensor) -> None:
    """p_final (lens readout of h_n) equals softmax(model logits)[target] to 1e-6 at several
    positions, for the argmax and for a fixed other target; the readout of the captured h_n
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
    for target in (None, 17):
        out = lens.attribute_details(ids, positions=POSITIONS, target=target)
        expected = probs.gather(-1, out.target[..., None])[..., 0]
        torch.testing.assert_close(out.p_final, expected, atol=1e-6, rtol=0)
    assert model.training, "the model must come back in train mode"

    model.eval()
    with torch.no_grad(), capture_residual_stream(lens.decoder_blocks, [0, 2]) as states:
        model(ids, use_cache=False)
        logits = lens.readout(states[2])
    torch.testing.assert_close(logits, out_model.logits, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(states[0], out_model.hidden_states[0], atol=1e-6, rtol=0)


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
    assert (raw - logits).abs().max() > 0.1
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
