"""The lens addendum (prereg_lenses.json): read exactly, decided by decide.py's machinery."""

from __future__ import annotations

import hashlib
import json
from importlib import resources

import numpy as np
import pytest

from captum_iglens.validate.benchmark import decide as decide_module
from captum_iglens.validate.benchmark.addendum import lens_predictor, load_lens_addendum
from captum_iglens.validate.benchmark.decide import decide, load_preregistration

_FILE = resources.files("captum_iglens.validate.benchmark") / "prereg_lenses.json"


def test_the_loader_reads_exactly_the_shipped_file() -> None:
    raw = _FILE.read_bytes()
    add = load_lens_addendum()
    assert add.sha256 == hashlib.sha256(raw).hexdigest()
    assert add.to_dict()["addendum"] == json.loads(raw)
    base = load_preregistration()
    assert add.base_sha256 == base.sha256
    with pytest.raises(TypeError):  # frozen
        add.data["statistics"]["alpha"] = 0.5  # type: ignore[index]


def test_it_states_what_the_brief_asks_for() -> None:
    add, base = load_lens_addendum(), load_preregistration()
    assert add.addendum["date"] == "2026-12-04"
    assert "before any benchmark run with a tuned or Jacobian lens" in add.addendum["written"]
    assert [h["id"] for h in add.hypotheses] == ["L1", "L2"]
    for h, kind in zip(add.hypotheses, ("tuned", "jacobian"), strict=True):
        assert h["predictor"] == lens_predictor(add, kind)["name"]
        assert (h["versus"], h["intervention"], h["statistic"], h["direction"]) == (
            "readout credit", "mean", "rho", "greater")
    # its own correction: 2 hypotheses x 3 tasks x 3 required families
    assert add.n_cells == 2 * 3 * 3 == add.addendum["decision"]["n_cells"]
    assert add.alpha_corrected * add.n_cells == pytest.approx(base.statistics["alpha"])
    # every other number is prereg.json's, by key
    for key in ("statistics", "seeds", "views", "interventions", "primary_unit", "tasks",
                "families"):
        assert add.to_dict()[key] == base.to_dict()[key]
    texts = [v for v in add.to_dict()["addendum"]["decision"].values() if isinstance(v, str)]
    assert not any(ch.isdigit() for text in texts for ch in text)  # no copied number
    with pytest.raises(ValueError, match="pre-states"):
        lens_predictor(add, "logit")


def test_its_decisions_are_decide_py_s_at_its_own_level() -> None:
    add, base = load_lens_addendum(), load_preregistration()
    rng = np.random.default_rng(0)
    values = 0.05 + rng.standard_normal(120)
    clusters = np.repeat(np.arange(30), 4)
    # the addendum uses decide.decide itself, with its own Bonferroni level
    assert decide_module.decide is decide
    got, ref = decide(values, clusters, add), decide(values, clusters, base)
    assert got.n_tokens == ref.n_tokens == 120
    # a wider corrected level (18 cells, not 36) gives a bound nearer the mean
    assert ref.bound < got.bound < got.value
    assert decide_module.required_resamples(add) < decide_module.required_resamples(base)


def test_a_file_that_extends_another_prereg_is_refused(tmp_path) -> None:
    data = json.loads(_FILE.read_bytes())
    data["extends"]["sha256"] = "0" * 64
    path = tmp_path / "a.json"
    path.write_text(json.dumps(data), encoding="utf-8")
    with pytest.raises(ValueError, match="extends a prereg.json"):
        load_lens_addendum(path)
    data = json.loads(_FILE.read_bytes())
    data["decision"]["n_cells"] = 36
    path.write_text(json.dumps(data), encoding="utf-8")
    with pytest.raises(ValueError, match="n_cells"):
        load_lens_addendum(path)
