"""IGLens as a drop-in for Captum's layer methods: call order, references, one home for checks.

Each test fails on an implementation that drifts from Captum's conventions: a different
positional order, a reference that is ignored, a check that exists in one entry point and
not in another.
"""

from __future__ import annotations

import typing
import warnings

import pytest
import torch
from captum.attr import LayerIntegratedGradients
from conftest import make_tiny
from tiny_families import make_family

from captum_iglens import IGLens, compare_completeness

F32_EPS = torch.finfo(torch.float32).eps


def _ids(seed: int = 1, length: int = 9) -> torch.Tensor:
    return torch.randint(3, 128, (1, length), generator=torch.Generator().manual_seed(seed))


def _reference(ids: torch.Tensor, filler: int = 5) -> torch.Tensor:
    ref = torch.full_like(ids, filler)
    ref[:, 0] = ids[:, 0]  # keep the first position, as Captum users keep BOS
    return ref


@pytest.fixture(scope="module")
def llama():
    return make_tiny("llama", n_layers=4)


def _last_probs(model):
    def forward(ids):
        return torch.softmax(model(ids, use_cache=False).logits[:, -1].float(), -1)
    return forward


def test_same_positional_call_as_layer_integrated_gradients(llama) -> None:
    """(ids, reference ids, target) run unchanged on both; IG-Lens adds up to F(x) - F(x')."""
    ids, target = _ids(), 17
    ref = _reference(ids)
    forward = _last_probs(llama)
    lig = LayerIntegratedGradients(forward, llama.model.embed_tokens)
    lig_attr = lig.attribute(ids, ref, target)
    lens = IGLens(llama)
    attr, delta = lens.attribute(ids, ref, target, None, 50, "prediction_aware", None, True)
    assert lig_attr.shape[:2] == ids.shape and attr.shape == (1, 4)
    with torch.no_grad():
        f_x, f_ref = forward(ids)[0, target], forward(ref)[0, target]
    change = float(f_x) - float(f_ref)
    assert abs(change) > 1e-3  # a non-trivial total, so the equality below means something
    # sum of k float32 credits vs a float32 difference: far below 1e-6
    assert abs(float(attr.double().sum()) - change) <= 1e-6
    assert abs(float(delta)) <= 1e-6
    # Captum's argument order for the delta: (attributions, start_point, end_point, target)
    again = lens.compute_convergence_delta(attr, ref, ids, target)
    assert torch.equal(again, delta)
    # and the reference is honoured: another reference gives another total
    other = lens.attribute(ids, _reference(ids, filler=9), target)
    assert abs(float(other.sum() - attr.sum())) > 1e-4


def test_reference_ids_batch_rows_equal_single(llama) -> None:
    ids = torch.cat([_ids(1), _ids(2)])
    ref = _reference(ids)
    lens = IGLens(llama, layers=[0, 2])
    batch = lens.attribute(ids, ref, positions=[-1, -3])
    for row in range(2):
        single = lens.attribute(ids[row:row + 1], ref[row:row + 1], positions=[-1, -3])
        # same rows, other matrix shapes: a few float32 roundings of probabilities <= 1
        torch.testing.assert_close(batch[row], single[0], atol=16 * F32_EPS, rtol=0)


def test_reference_ids_of_wrong_shape_refused(llama) -> None:
    with pytest.raises(ValueError, match="shaped like inputs"):
        IGLens(llama).attribute(_ids(), torch.zeros(1, 4, dtype=torch.long))


def test_one_layer_as_captum_builds_it(llama) -> None:
    lens = IGLens(llama, llama.model.layers[1])
    assert lens.layer_indices == (2, 4)


def test_embedding_alone_warns_and_names_the_fix(llama) -> None:
    with pytest.warns(UserWarning, match="layers=None"):
        lens = IGLens(llama, llama.model.embed_tokens)
    assert lens.layer_indices == (0, 4)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        IGLens(llama, [0])  # an explicit index 0 is a deliberate choice: no warning


def test_captum_surface(llama) -> None:
    lens = IGLens(llama)
    assert IGLens.get_name() == "IG-Lens"
    assert "decoder blocks" in (IGLens.__init__.__doc__ or "")
    assert len(typing.get_overloads(IGLens.attribute)) == 2
    assert hasattr(lens.attribute, "__wrapped__")  # log_usage, as Captum wrappers expect
    with pytest.raises(NotImplementedError):
        lens.attribute_future()
    with pytest.raises(TypeError):
        lens.attribute(_ids(), "mean", None, None, 50, "prediction_aware", None, False, -1)


# ------------------------------------------------------------- compare: the same checks
def test_compare_refuses_float_target_like_iglens(llama) -> None:
    with pytest.raises(TypeError, match="integer token ids"):
        IGLens(llama).attribute(_ids(), target=3.7)
    with pytest.raises(TypeError, match="integer token ids"):
        compare_completeness(llama, _ids(), target=3.7, n_steps=2)


def test_compare_refuses_boolean_position_like_iglens(llama) -> None:
    with pytest.raises(TypeError, match="positions must be"):
        IGLens(llama).attribute(_ids(), positions=True)
    with pytest.raises(TypeError, match="positions must be"):
        compare_completeness(llama, _ids(), position=True, n_steps=2)


def test_compare_on_offloaded_model_equals_plain() -> None:
    from accelerate import cpu_offload

    plain = make_family("llama")
    offloaded = make_family("llama")
    cpu_offload(offloaded, execution_device=torch.device("cpu"))
    assert offloaded.get_input_embeddings().weight.device.type == "meta"
    ids = _ids()
    kwargs = dict(layers=[1, 2], n_steps=4, baselines=7)
    ref = compare_completeness(plain, ids, **kwargs)
    got = compare_completeness(offloaded, ids, **kwargs)
    assert got.target_id == ref.target_id and got.baseline_ids == ref.baseline_ids
    for name, method in ref.methods.items():
        # the same model and arithmetic, other weight placement: float32 roundings only
        torch.testing.assert_close(got[name].per_layer.double(), method.per_layer.double(),
                                   atol=64 * F32_EPS, rtol=0)
    assert got["ig_lens"].completeness_gap <= 1e-6


def test_what_users_naturally_write(llama) -> None:
    """Text as a target names the fix; layers='all' means every block; other strings fail
    with what to write instead."""
    with pytest.raises(TypeError, match="target_token_id"):
        IGLens(llama).attribute(_ids(), target=" Paris")
    assert IGLens(llama, layers="all").layer_indices == IGLens(llama).layer_indices == (1, 2, 3, 4)
    with pytest.raises(TypeError, match="'all'"):
        IGLens(llama, layers="some")
