"""The readout seam: a per-layer readout plugs in through one argument, and still adds up.

With a readout ``g_L`` per layer the credits are block terms ``g_{L_j}(h_{L_j}) -
g_{L_j}(h_{L_{j-1}})`` and ``lens_change`` holds the lens terms ``g_{L_j}(h_{L_{j-1}}) -
g_{L_{j-1}}(h_{L_{j-1}})``; together they telescope to ``f(h_n) - g_0(b)``. Each term is a
float64 difference of float32 readouts rounded to float32 (``<= eps/2 |term|``) and the
telescoping sum of the unrounded terms is exact, so ``|sum - delta| <= eps * sum |terms|``.
The default seam (the logit lens) runs the estimator's row once, as before: bit for bit.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from conftest import make_tiny
from torch import Tensor, nn

from captum_iglens import IGLens
from captum_iglens._core.estimators import ESTIMATORS, read_nodes
from captum_iglens._core.pipeline import capture_lens_path, readout_chunk
from captum_iglens.lens.layer_readout import LayerReadout, LogitLens
from captum_iglens.lens.readout import resolve_readout

EPS = torch.finfo(torch.float32).eps
IDS = torch.tensor([[3, 4, 5, 6, 7, 8], [9, 10, 11, 12, 13, 14]])
POSITIONS = [1, 3, 5]


class AffineTranslators:
    """``g_L(h) = readout(h + A_L h + b_L)`` (a fixed random tuned-lens-style translator per
    layer), the identity at the last layer ``n``."""

    def __init__(self, model: nn.Module, scale: float = 0.3, seed: int = 0) -> None:
        self.readout = resolve_readout(model)
        d, n = model.config.hidden_size, model.config.num_hidden_layers
        gen = torch.Generator().manual_seed(seed)
        self.n = n
        self.maps = [(scale * torch.randn(d, d, generator=gen) / d ** 0.5,
                      scale * torch.randn(d, generator=gen)) for _ in range(n)]

    def __call__(self, hidden: Tensor, layer: int) -> Tensor:
        if layer == self.n:
            return self.readout(hidden)
        a, b = self.maps[layer]
        return self.readout(hidden + hidden @ a.T + b)


class Identity:
    """A per-layer readout that reads every layer as the model does (not the LogitLens)."""

    def __init__(self, model: nn.Module) -> None:
        self.readout = resolve_readout(model)

    def __call__(self, hidden: Tensor, layer: int) -> Tensor:
        return self.readout(hidden)


@pytest.fixture(scope="module")
def model() -> nn.Module:
    return make_tiny("llama").eval()


def _check_adds_up(out, bound_scale: float = 1.0) -> None:
    credits, lens = out.attributions.double(), out.lens_change.double()
    delta = (out.p_final - out.p_baseline).double()
    err = (credits.sum(-1) + lens.sum(-1) - delta).abs()
    bound = bound_scale * EPS * (credits.abs().sum(-1) + lens.abs().sum(-1) + delta.abs())
    assert (err <= bound).all(), float((err - bound).max())


def test_a_per_layer_readout_adds_up_with_its_lens_terms(model) -> None:
    lens = AffineTranslators(model)
    assert isinstance(lens, LayerReadout)
    for units in ("probability", "log-probability"):
        out = IGLens(model, lens=lens, units=units).attribute_details(IDS, positions=POSITIONS)
        assert out.lens_change is not None and out.lens_change.shape == out.attributions.shape
        # the translators change the readout: the lens terms are not zero (a seam that ignored
        # the layer would give zeros and fail here)
        assert float(out.lens_change[..., :-1].abs().min()) > 1e-6, units
        _check_adds_up(out)
        # the baseline is read at layer 0: p_baseline = g_0(b), not f(b)
        default = IGLens(model, units=units).attribute_details(IDS, positions=POSITIONS)
        assert float((out.p_baseline - default.p_baseline).abs().max()) > 1e-6
        # f(h_n) is the model's own (Invariant R checked): the same numbers
        assert torch.equal(out.p_final, default.p_final)  # exact: the same readout of h_n


def test_the_lens_terms_are_the_readout_changes(model) -> None:
    """Segment j's lens term is g_{L_j}(h_{L_{j-1}}) - g_{L_{j-1}}(h_{L_{j-1}}), computed here."""
    lens = AffineTranslators(model)
    ig = IGLens(model, lens=lens)
    out = ig.attribute_details(IDS, positions=POSITIONS)
    cap = capture_lens_path(ig.spec, IDS, None, POSITIONS, "mean", None)
    nodes, target = cap.path.nodes, cap.path.target
    layers = (0, *ig.spec.layer_indices)

    def g(layer: int, h: Tensor) -> Tensor:
        read = ig.spec.readout_at(layer)
        with torch.no_grad():
            return read(h).float().log_softmax(-1).gather(-1, target[..., None])[..., 0].exp()

    for j in range(1, len(layers)):
        start = nodes[:, :, j - 1]
        want = g(layers[j], start).double() - g(layers[j - 1], start).double()
        # two float32 readouts of the same rows in other batches: eps * (|g| + |g|) <= 2 eps
        # per probability, plus the term's own rounding
        bound = 4 * EPS * (1 + want.abs())
        assert ((out.lens_change[..., j - 1].double() - want).abs() <= bound).all(), j


def test_an_identity_per_layer_readout_gives_the_logit_lens_credits(model) -> None:
    out = IGLens(model, lens=Identity(model)).attribute_details(IDS, positions=POSITIONS)
    default = IGLens(model).attribute_details(IDS, positions=POSITIONS)
    # the same rows read by the same readout: the lens terms are exactly zero
    assert torch.equal(out.lens_change, torch.zeros_like(out.lens_change))  # exact: same rows
    # the credits are the default's up to the batching of the readout (eps per probability,
    # two readouts per credit)
    diff = (out.attributions - default.attributions).abs()
    assert (diff <= 4 * EPS).all(), float(diff.max())
    assert default.lens_change is None


@pytest.mark.filterwarnings("ignore:IG-Lens.s riemann_trapezoid estimate has not converged")
def test_the_default_seam_is_the_estimator_row_bit_for_bit(model) -> None:
    ig = IGLens(model)
    assert isinstance(ig.spec.lens, LogitLens) and not ig.spec.per_layer
    explicit = IGLens(model, lens=LogitLens(ig.spec.readout))
    for method, n_steps in (("prediction_aware", 1), ("riemann_trapezoid", 4)):
        out = ig.attribute_details(IDS, positions=POSITIONS, method=method, n_steps=n_steps)
        again = explicit.attribute_details(IDS, positions=POSITIONS, method=method,
                                           n_steps=n_steps)
        cap = capture_lens_path(ig.spec, IDS, None, POSITIONS, "mean", None)
        chunk = readout_chunk(ig.spec, None)
        probs = read_nodes(ig.spec.readout, cap.path, chunk).values
        direct = ESTIMATORS[method].estimate(ig.spec.readout, cap.path, probs, method,
                                             n_steps, chunk)
        assert torch.equal(out.attributions, direct)  # exact: the row called as before
        assert torch.equal(again.attributions, out.attributions)  # exact: the same code path
        assert out.lens_change is None


def test_a_gradient_estimator_reads_each_segment_through_its_layer(model) -> None:
    lens = AffineTranslators(model)
    exact = IGLens(model, lens=lens).attribute_details(IDS, positions=POSITIONS)
    grad = IGLens(model, lens=lens).attribute_details(IDS, positions=POSITIONS,
                                                      method="gausslegendre", n_steps=32)
    assert torch.equal(grad.lens_change, exact.lens_change)  # exact: the same node readouts
    # Gauss-Legendre with 32 nodes on a smooth readout: its block terms converge to the
    # exact ones (the discretisation error, not rounding, is what is left)
    assert float((grad.attributions - exact.attributions).abs().max()) < 1e-4


def test_a_per_layer_readout_is_refused_where_it_is_not_defined(model) -> None:
    lens = AffineTranslators(model)
    with pytest.raises(ValueError, match="granularity='block'"):
        IGLens(model, lens=lens, granularity="sublayer")
    with pytest.raises(ValueError, match="effect='readout'"):
        IGLens(model, lens=lens, effect="total")
    with pytest.raises(TypeError, match="lens must be callable"):
        IGLens(model, lens=3)  # type: ignore[arg-type]
    # a copy of the spec keeps its seam
    spec = IGLens(model, lens=lens).spec
    assert replace(spec, check_readout=False).lens is lens


def test_the_top_k_tokens_are_read_through_the_levels_readout(model) -> None:
    """Under a per-layer lens the top-k of layer L are g_L's, the readout of the levels.

    With the top-1 token of layer j as the target, layer j's level ``g_{L_j}(h_{L_j})`` is its
    top-1 probability: two float32 softmaxes of the same logits (``exp(log_softmax)`` against
    ``softmax``, in other batches), ``<= 4 eps`` on a probability.
    """
    lens = AffineTranslators(model)
    ig = IGLens(model, lens=lens)
    out = ig.attribute_details(IDS, positions=POSITIONS, top_k=3)
    plain = IGLens(model).attribute_details(IDS, positions=POSITIONS, top_k=3)
    assert out.top_k_probs is not None and out.top_k_ids is not None
    assert plain.top_k_probs is not None
    k = out.attributions.shape[-1]
    # the translators change what the first layer reads (a logit-lens top-k would fail below)
    assert float((out.top_k_probs[..., 0, 0] - plain.top_k_probs[..., 0, 0]).abs().max()) > 1e-4
    for j in range(k):
        top1 = out.top_k_ids[..., j, 0]
        level = ig.attribute_details(IDS, target=top1, positions=POSITIONS).lens_probs[..., j]
        err = (level.double() - out.top_k_probs[..., j, 0].double()).abs()
        assert (err <= 4 * EPS).all(), (j, float(err.max()))
        # and it is the most probable token of g_L: no other token of its top-k above it
        assert (out.top_k_probs[..., j, 1:] <= out.top_k_probs[..., j, :1]).all()
