"""compare_completeness: IG-Lens vs Captum's layer methods on a tiny Llama (perturbed norms)."""

from __future__ import annotations

import json
import math

import matplotlib

matplotlib.use("Agg")

import pytest  # noqa: E402
import torch  # noqa: E402
from captum.attr import LayerConductance, LayerIntegratedGradients  # noqa: E402
from conftest import make_tiny  # noqa: E402

from captum_iglens import IGLens  # noqa: E402
from captum_iglens.compare import (  # noqa: E402
    CompletenessReport,
    compare_completeness,
    input_baseline_ids,
)

N_STEPS = 32


def _ids() -> torch.Tensor:
    return torch.randint(3, 128, (1, 9), generator=torch.Generator().manual_seed(1))


@pytest.fixture(scope="module")
def tiny4():
    return make_tiny("llama", n_layers=4)  # train mode, as constructed


@pytest.fixture(scope="module")
def report(tiny4) -> CompletenessReport:
    return compare_completeness(tiny4, _ids(), n_steps=N_STEPS)


def _direct_forward(model, target: int):
    """An independent Captum forward: probability of ``target`` at the last position."""

    def forward(x, mask):
        key = "inputs_embeds" if x.is_floating_point() else "input_ids"
        out = model(**{key: x}, attention_mask=mask, use_cache=False)
        return out.logits[:, -1].float().softmax(-1)[:, target]

    return forward


def test_ig_lens_is_complete_and_matches_iglens(report, tiny4) -> None:
    ig = report["ig_lens"]
    assert report.layer_indices == [1, 2, 3, 4]
    assert ig.completeness_gap <= 1e-6
    # By default IG-Lens starts at the shared reference x' (its last-block residual).
    assert report.lens_baseline == "reference ids"
    reference = torch.tensor([report.baseline_ids])
    out = IGLens(tiny4).attribute_details(_ids(), reference, target=report.target_id,
                                          positions=[-1])
    torch.testing.assert_close(ig.per_layer, out.attributions[0, 0].float(), atol=1e-7, rtol=0)
    assert ig.total == pytest.approx(float(out.delta_p[0, 0]), abs=1e-7)
    # ... so its total is the one every Captum method decomposes: F(x) - F(x').
    assert ig.total == pytest.approx(report.f_input - report.f_baseline, abs=1e-6)
    # a complete method with non-trivial credits: not all credit sits in one layer
    assert (ig.per_layer.abs() > 1e-3).sum() >= 2


def test_lig_each_layer_total_is_the_whole_change(report) -> None:
    lig = report["layer_integrated_gradients"]
    change = report.f_input - report.f_baseline
    assert abs(change) > 0.02, "the seed must give a non-tiny F(x) - F(x')"
    assert lig.total == pytest.approx(change, abs=1e-7)
    # every block output is a full cut: each single-layer total ~ F(x) - F(x')
    for credit, delta in zip(lig.per_layer.tolist(), lig.convergence_deltas.tolist(), strict=True):
        assert credit == pytest.approx(change, abs=2e-3)
        assert abs(delta) < 1e-3
    # ... so the sum over k = 4 layers is about 4 times the change, far from it
    assert lig.completeness_gap > 0.5 * abs(change)
    assert lig.layer_sum == pytest.approx(4 * change, rel=0.05)


def test_layer_conductance_runs_and_reports_deltas(report) -> None:
    lc = report["layer_conductance"]
    k = len(report.layer_indices)
    assert lc.convergence_deltas is not None and lc.convergence_deltas.shape == (k,)
    assert torch.isfinite(lc.convergence_deltas).all()
    assert lc.per_layer_time_s is not None and len(lc.per_layer_time_s) == k
    # Captum's delta is "sum of that layer run's attributions - (F(x) - F(x'))"
    torch.testing.assert_close(
        lc.per_layer - lc.convergence_deltas,
        torch.full((k,), lc.total, dtype=torch.float64), atol=1e-5, rtol=0,
    )
    assert lc.total == pytest.approx(report.f_input - report.f_baseline, abs=1e-5)
    assert lc.completeness_gap > 0.5 * abs(lc.total)


def test_logit_lens_levels_end_at_the_model_probability(report, tiny4) -> None:
    lens = report["logit_lens"]
    assert not lens.is_credit and math.isnan(lens.completeness_gap)
    assert float(lens.per_layer[-1]) == pytest.approx(report.f_input, abs=1e-5)
    assert lens.total == pytest.approx(report.f_input, abs=1e-5)
    with torch.no_grad():
        p = tiny4.eval()(_ids()).logits[0, -1].softmax(-1)
    tiny4.train()
    assert report.target_id == int(p.argmax())
    assert report.f_input == pytest.approx(float(p.max()), abs=1e-5)


def test_model_mode_is_restored(report, tiny4) -> None:
    assert tiny4.training  # make_tiny returns train mode; the comparison restores it


def test_numbers_are_captums_own(report, tiny4) -> None:
    """The report's LIG (layer 2) and LayerConductance (layer 3) equal direct Captum calls."""
    ids, mask = _ids(), torch.ones(1, 9, dtype=torch.long)
    base = torch.tensor([report.baseline_ids])
    fwd = _direct_forward(tiny4, report.target_id)
    tiny4.eval()
    try:
        lig = LayerIntegratedGradients(fwd, tiny4.model.layers[1])
        attr, delta = lig.attribute(ids, base, additional_forward_args=(mask,), n_steps=N_STEPS,
                                    return_convergence_delta=True)
        emb = tiny4.get_input_embeddings()
        lc = LayerConductance(fwd, tiny4.model.layers[2])
        attr_c, delta_c = lc.attribute(emb(ids).detach(), emb(base).detach(),
                                       additional_forward_args=(mask,), n_steps=N_STEPS,
                                       return_convergence_delta=True)
    finally:
        tiny4.train()
    r_lig, r_lc = report["layer_integrated_gradients"], report["layer_conductance"]
    assert float(r_lig.per_layer[1]) == pytest.approx(float(attr.sum()), abs=1e-6)
    assert float(r_lig.convergence_deltas[1]) == pytest.approx(float(delta), abs=1e-6)
    assert float(r_lc.per_layer[2]) == pytest.approx(float(attr_c.detach().sum()), abs=1e-6)
    assert float(r_lc.convergence_deltas[2]) == pytest.approx(float(delta_c), abs=1e-6)


def test_layer_zero_is_the_embedding_output(tiny4) -> None:
    """Index 0 attributes to the input of the first block (= the embedding output in Llama)."""
    ids = _ids()
    rep = compare_completeness(tiny4, ids, layers=[0, 4], n_steps=16,
                               methods=["layer_integrated_gradients"])
    assert rep.layer_indices == [0, 4]
    base = torch.tensor([rep.baseline_ids])
    fwd = _direct_forward(tiny4, rep.target_id)
    tiny4.eval()
    try:
        lig = LayerIntegratedGradients(fwd, tiny4.get_input_embeddings())
        attr = lig.attribute(ids, base, additional_forward_args=(torch.ones_like(ids),),
                             n_steps=16)
    finally:
        tiny4.train()
    assert float(rep["layer_integrated_gradients"].per_layer[0]) == pytest.approx(
        float(attr.sum()), abs=1e-5
    )


def test_gradient_estimator_and_method_order(tiny4) -> None:
    rep = compare_completeness(tiny4, _ids(), layers=[2, 4], n_steps=N_STEPS,
                               methods=["ig_lens_gradient", "ig_lens"])
    assert list(rep.methods) == ["ig_lens_gradient", "ig_lens"]
    grad, exact = rep["ig_lens_gradient"], rep["ig_lens"]
    torch.testing.assert_close(grad.per_layer, exact.per_layer, atol=1e-4, rtol=0)
    assert grad.completeness_gap < 1e-4 and exact.completeness_gap <= 1e-6


def test_baseline_keeps_structure_and_refuses_zero_embeddings(tiny4) -> None:
    ids = torch.tensor([[1, 50, 60, 2, 70]])  # 1 = BOS, 2 = EOS (special, kept)
    base = input_baseline_ids(tiny4, ids, 9)
    assert base.tolist() == [[1, 9, 9, 2, 9]]
    assert input_baseline_ids(tiny4, ids).tolist() == [[1, 1, 1, 2, 1]]  # no tokenizer: BOS
    # pad id 0 has an all-zero embedding row in the tiny Llama
    assert float(tiny4.get_input_embeddings().weight[0].detach().norm()) == 0.0
    with pytest.raises(ValueError, match="zero input embedding"):
        input_baseline_ids(tiny4, ids, 0)
    with pytest.raises(ValueError, match="zero input embedding"):
        compare_completeness(tiny4, ids, baselines=0, methods=["layer_integrated_gradients"])


def test_errors(tiny4) -> None:
    with pytest.raises(ValueError, match="Unknown methods"):
        compare_completeness(tiny4, _ids(), methods=["saliency"])
    with pytest.raises(ValueError, match=r"\[1, S\]"):
        compare_completeness(tiny4, _ids().repeat(2, 1))
    with pytest.raises(ValueError, match="(?i)position"):
        compare_completeness(tiny4, _ids(), position=9)
    with pytest.raises(ValueError, match="n_steps"):
        compare_completeness(tiny4, _ids(), n_steps=1)


def test_dict_table_and_plot(report) -> None:
    data = json.loads(json.dumps(report.to_dict()))
    assert data["layers"] == [1, 2, 3, 4] and data["units"] == "probability"
    lig = data["methods"]["layer_integrated_gradients"]
    assert lig["sum"] == pytest.approx(sum(lig["per_layer"]))
    assert lig["completeness_gap"] == pytest.approx(abs(lig["sum"] - lig["total"]))
    assert data["methods"]["logit_lens"]["completeness_gap"] is None
    table = report.format_table()
    assert str(report) == table
    for label in ("IG-Lens", "LayerIG", "LayerCond", "lens p", "|sum-total|", "δ LayerIG"):
        assert label in table
    rows = {line.split("|")[0].strip(): line for line in table.splitlines() if "|" in line}
    assert set(["L1", "L2", "L3", "L4", "sum", "time s"]) <= set(rows)
    # one reference for every method: the total they all decompose is shown once
    assert "total" not in rows
    assert f"total F(x) - F(x') = {report.f_input - report.f_baseline:+.6f}" in table
    assert f"{report['ig_lens'].layer_sum:+.6f}" in rows["sum"]
    fig = report.plot()
    from matplotlib.figure import Figure

    assert isinstance(fig, Figure)
    ax = fig.axes[0]
    bars = [p for p in ax.patches if p.get_width() > 0]
    assert len(bars) == 4 * 3  # k layers x 3 credit methods
    heights = sorted(round(b.get_height(), 6) for b in bars)
    expected = sorted(
        round(float(v), 6) for m in report.methods.values() if m.is_credit for v in m.per_layer
    )
    assert heights == pytest.approx(expected, abs=1e-6)
    totals = sorted(line.get_ydata()[0] for line in ax.get_lines() if line.get_linestyle() == "--")
    assert totals == pytest.approx(sorted(m.total for m in report.methods.values() if m.is_credit))


def test_left_padding_gives_the_unpadded_numbers(tiny4, report) -> None:
    """The attention mask (and position ids from it) reach every method's forward."""
    ids = _ids()
    padded = torch.cat([torch.zeros(1, 2, dtype=torch.long), ids], dim=1)  # pad id 0
    mask = torch.cat([torch.zeros(1, 2, dtype=torch.long), torch.ones_like(ids)], dim=1)
    rep = compare_completeness(tiny4, padded, additional_forward_args=mask, n_steps=N_STEPS,
                               methods=["ig_lens", "layer_integrated_gradients"])
    assert rep.target_id == report.target_id
    assert rep.baseline_ids[:2] == [0, 0]  # pads are kept, never used as moving baseline
    assert rep.f_input == pytest.approx(report.f_input, abs=1e-5)
    assert rep.f_baseline == pytest.approx(report.f_baseline, abs=1e-5)
    torch.testing.assert_close(rep["ig_lens"].per_layer, report["ig_lens"].per_layer,
                               atol=1e-5, rtol=0)
    torch.testing.assert_close(rep["layer_integrated_gradients"].per_layer,
                               report["layer_integrated_gradients"].per_layer, atol=1e-4, rtol=0)


@pytest.mark.parametrize("family", ["gpt2", "falcon", "bloom", "mpt", "gpt_neo", "opt_350m"])
def test_compare_runs_on_blocks_with_tuple_outputs_and_none_inputs(family):
    """GPT-2/Falcon blocks take None positional inputs, Bloom/MPT/GPT-Neo return tuples with
    tensors outside the graph: Captum's hooks go on the residual stream itself instead."""
    from tiny_families import make_family

    model = make_family(family)
    ids = torch.randint(3, 128, (1, 7), generator=torch.Generator().manual_seed(0))
    report = compare_completeness(model, ids, layers=[0, 1, 2], n_steps=8, baselines=5)
    ig, lig = report["ig_lens"], report["layer_integrated_gradients"]
    assert ig.completeness_gap <= 1e-6
    # Captum's own delta: each run's sum minus its own F(x) - F(x').
    torch.testing.assert_close(lig.per_layer - lig.convergence_deltas,
                               torch.full_like(lig.per_layer, lig.total), atol=1e-5, rtol=0)
    assert abs(lig.per_layer[-1] - lig.total) <= 5e-3  # the last block output: a full cut
    assert torch.isfinite(report["layer_conductance"].per_layer).all()
