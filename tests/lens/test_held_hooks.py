"""``held_hooks``: the one place a block of code holds hooks; every one is removed on exit."""

import pytest
import torch
from torch import nn

from captum_iglens.lens.hooks import held_hooks


def _counts(module: nn.Module) -> tuple[int, int]:
    return len(module._forward_hooks), len(module._forward_pre_hooks)


def test_hooks_fire_inside_and_are_removed_on_exit():
    module = nn.Linear(2, 2)
    seen: list[str] = []
    with held_hooks() as hooks:
        hooks.pre(module, lambda _m, args, kwargs: seen.append("pre"))
        hooks.forward(module, lambda _m, _a, _o: seen.append("post"))
        assert _counts(module) == (1, 1)
        module(torch.zeros(1, 2))
    assert seen == ["pre", "post"]
    assert _counts(module) == (0, 0)
    module(torch.zeros(1, 2))
    assert seen == ["pre", "post"]


def test_hooks_are_removed_when_the_block_raises():
    module = nn.Linear(2, 2)
    with pytest.raises(RuntimeError, match="inside"):
        with held_hooks() as hooks:
            hooks.forward(module, lambda _m, _a, _o: None)
            hooks.pre(module, lambda _m, args, kwargs: None)
            raise RuntimeError("inside")
    assert _counts(module) == (0, 0)


def test_a_failed_registration_removes_the_earlier_hooks():
    module = nn.Linear(2, 2)
    with pytest.raises(AttributeError):
        with held_hooks() as hooks:
            hooks.forward(module, lambda _m, _a, _o: None)
            hooks.forward(object(), lambda _m, _a, _o: None)  # not a module
    assert _counts(module) == (0, 0)
