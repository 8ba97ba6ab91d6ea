"""``wide_log_softmax``: the one widened log-softmax the package reads probabilities from."""

import pytest
import torch

from captum_iglens.lens.distribution import wide_dtype, wide_log_softmax


@pytest.mark.parametrize("dtype, wide", [(torch.float16, torch.float32),
                                         (torch.bfloat16, torch.float32),
                                         (torch.float32, torch.float32),
                                         (torch.float64, torch.float64)])
def test_widens_before_the_softmax(dtype, wide):
    logits = (torch.randn(3, 50, generator=torch.Generator().manual_seed(0)) * 8).to(dtype)
    out = wide_log_softmax(logits)
    assert wide_dtype(dtype) is wide and out.dtype is wide
    # The same operations as the copies it replaced: bitwise equal.
    assert torch.equal(out, torch.log_softmax(logits.to(wide), dim=-1))


def test_keeps_a_probability_half_precision_loses():
    # p = e^-20 / (1 + e^-20) ~ 2.1e-9: below float16's smallest subnormal (6e-8), so a
    # float16 softmax rounds it to 0, the widened one keeps it to float32 precision.
    logits = torch.tensor([[0.0, -20.0]], dtype=torch.float16)
    assert torch.softmax(logits, dim=-1)[0, 1].item() == 0.0  # exact: underflow to zero
    expected = -20.0 - torch.log1p(torch.exp(torch.tensor(-20.0, dtype=torch.float64))).item()
    got = wide_log_softmax(logits)[0, 1].item()
    assert abs(got - expected) <= 4 * torch.finfo(torch.float32).eps * 20.0


def test_stays_in_the_autograd_graph():
    logits = torch.randn(2, 5, dtype=torch.float16, requires_grad=True)
    wide_log_softmax(logits)[:, 0].sum().backward()
    assert logits.grad is not None and logits.grad.dtype is torch.float16
