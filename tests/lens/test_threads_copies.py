"""One model, many threads; copies of a lens; edits after building it.

Serving code explains requests from several threads with one model: every call must give
the numbers of the same call run alone, bit for bit (the recording hooks sit on the shared
decoder blocks while a call runs). A copy of a lens (``copy.deepcopy``, ``pickle``,
``torch.save``) explains the copied model; an edit made after building (or copying) is
refused by name.
"""

from __future__ import annotations

import copy
import io
import pickle
import sys
import threading
from typing import Callable

import pytest
import torch
from conftest import make_tiny
from torch import nn

from captum_iglens import IGLens
from captum_iglens.lens.changes import ModelChangedError

REPEATS = 4


def _ids(length: int, seed: int) -> torch.Tensor:
    return torch.randint(3, 128, (1, length), generator=torch.Generator().manual_seed(seed))


def _numbers(lens: IGLens, ids: torch.Tensor) -> tuple[torch.Tensor, ...]:
    out = lens.attribute_details(ids, positions=[2, -1])
    return out.attributions, out.p_final, out.p_baseline, out.lens_probs


def _in_threads(jobs: list[Callable[[], object]]) -> list[object]:
    """Run ``jobs`` in threads started together, switching often; their results in order."""
    results: list[object] = [None] * len(jobs)
    start = threading.Barrier(len(jobs))

    def run(i: int) -> None:
        start.wait()
        try:
            results[i] = jobs[i]()
        except Exception as err:  # noqa: BLE001 - handed back to the test
            results[i] = err

    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # interleave the threads as finely as the interpreter can
    try:
        threads = [threading.Thread(target=run, args=(i,)) for i in range(len(jobs))]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    finally:
        sys.setswitchinterval(interval)
    return results


def _assert_bitwise(got: object, want: tuple[torch.Tensor, ...]) -> None:
    if isinstance(got, Exception):
        raise got
    assert all(torch.equal(a, b) for a, b in zip(got, want, strict=True))  # type: ignore


@pytest.mark.parametrize("lengths", [(8, 8), (8, 18)], ids=["equal", "unequal"])
@pytest.mark.parametrize(("family", "granularity"),
                         [("llama", "block"), ("llama", "sublayer"), ("gpt2", "block")])
def test_two_threads_give_the_sequential_numbers(lengths: tuple[int, int], family: str,
                                                 granularity: str) -> None:
    """GPT-2 has dropout 0.1 and starts in train mode: a call must not see the mode another
    call hands back while it runs."""
    model = make_tiny(family, n_layers=3)  # train mode, as constructed
    lens = IGLens(model, granularity=granularity)
    prompts = [_ids(length, seed) for seed, length in enumerate(lengths)]
    alone = [_numbers(lens, ids) for ids in prompts]
    for _ in range(REPEATS):
        got = _in_threads([lambda ids=ids: [_numbers(lens, ids) for _ in range(3)]
                           for ids in prompts])
        for runs, want in zip(got, alone, strict=True):
            if isinstance(runs, Exception):
                raise runs
            for run in runs:  # type: ignore[union-attr]
                _assert_bitwise(run, want)
    assert model.training  # handed back in the mode it had


def test_another_threads_plain_forward_does_not_reach_the_hooks() -> None:
    """A forward outside IG-Lens (serving code generating) neither fills nor changes a call."""
    model = make_tiny("llama", n_layers=3).eval()
    lens = IGLens(model)
    ids, other = _ids(8, 0), _ids(18, 1)
    want = _numbers(lens, ids)
    with torch.no_grad():
        plain = model(other, use_cache=False).logits

    def forwards() -> list[torch.Tensor]:
        with torch.no_grad():
            return [model(other, use_cache=False).logits for _ in range(12)]

    explained, forwarded = _in_threads([lambda: [_numbers(lens, ids) for _ in range(4)],
                                        forwards])
    for run in explained:  # type: ignore[union-attr]
        _assert_bitwise(run, want)
    assert all(torch.equal(logits, plain) for logits in forwarded)  # type: ignore[union-attr]


def _torch_round_trip(lens: IGLens) -> IGLens:
    buffer = io.BytesIO()
    torch.save(lens, buffer)
    buffer.seek(0)
    return torch.load(buffer, weights_only=False)


COPIES = {
    "deepcopy": copy.deepcopy,
    "pickle": lambda lens: pickle.loads(pickle.dumps(lens)),
    "torch.save": _torch_round_trip,
}


@pytest.mark.parametrize("family", ["llama", "gpt2", "gemma2", "cohere", "granite"])
@pytest.mark.parametrize("how", list(COPIES))
def test_a_copied_lens_explains_the_copied_model(family: str, how: str) -> None:
    model = make_tiny(family, n_layers=3).eval()
    lens = IGLens(model)
    ids = _ids(9, 2)
    want = lens.attribute_details(ids, positions=[3, -1])
    twin = COPIES[how](lens)
    assert twin.model is not model and twin.spec.decoder_blocks is not lens.spec.decoder_blocks
    got = twin.attribute_details(ids, positions=[3, -1])
    # the same arithmetic on copied weights: bit for bit
    assert torch.equal(got.attributions, want.attributions)
    assert torch.equal(got.p_final, want.p_final)
    # the copy explains its own model: an edit of the copy shows in the copy only
    with torch.no_grad():
        for param in twin.spec.decoder_blocks[1].mlp.parameters():
            param.mul_(2)
    edited = twin.attribute_details(ids, positions=[3, -1])
    assert not torch.equal(edited.attributions, want.attributions)
    assert torch.equal(lens.attribute_details(ids, positions=[3, -1]).attributions,
                       want.attributions)


def _replace_block(model: nn.Module) -> None:
    model.model.layers[1] = copy.deepcopy(model.model.layers[1])


def _replace_norm(model: nn.Module) -> None:
    model.model.norm = copy.deepcopy(model.model.norm)


def _prune_list(model: nn.Module) -> None:
    model.model.layers = nn.ModuleList(list(model.model.layers)[:-1])


EDITS = {
    "block replaced": (_replace_block, "its decoder blocks changed: model.layers[1] is a new "
                       "block (block number 2)"),
    "final norm replaced": (_replace_norm, "its final norm was replaced"),
    "block list replaced": (_prune_list, "its decoder blocks changed: model.layers is a new "
                            "list of 2 blocks (the lens was built with 3)"),
}


@pytest.mark.parametrize("edit", list(EDITS))
@pytest.mark.parametrize("how", ["none", *COPIES])
def test_an_edit_after_building_or_copying_is_refused_by_name(edit: str, how: str) -> None:
    model = make_tiny("llama", n_layers=3).eval()
    lens = IGLens(model)
    if how != "none":
        lens = COPIES[how](lens)
    change, words = EDITS[edit]
    change(lens.model)
    with pytest.raises(ModelChangedError) as info:
        lens.attribute(_ids(6, 3))
    assert words in str(info.value) and "Build a new IGLens(model)" in str(info.value)
    IGLens(lens.model).attribute(_ids(6, 3))  # a new lens explains the edited model


def test_a_new_weight_tensor_is_followed_not_refused() -> None:
    """Weights are read live by the model and the readout: a new tensor needs no new lens."""
    model = make_tiny("llama", n_layers=3).eval()
    twin = copy.deepcopy(IGLens(model))
    ids = _ids(9, 4)
    before = twin.attribute(ids)
    head = twin.model.lm_head
    head.weight = nn.Parameter(head.weight.detach() * 1.5)
    after = twin.attribute_details(ids)
    fresh = IGLens(twin.model).attribute_details(ids)
    assert torch.equal(after.attributions, fresh.attributions)
    assert not torch.equal(after.attributions[:, 0], before)
