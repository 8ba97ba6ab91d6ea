"""The estimator and baseline registries tell the truth and are read live.

A row's ``min_steps`` is what the estimator accepts (gradient rules need 2 grid points per
segment), ``METHODS`` / ``settings.methods()`` and the CLI's ``--method`` choices include an
estimator registered after import, and the baseline rows say which residual the capture
records.
"""

from __future__ import annotations

import sys

import pytest
import torch
from conftest import make_tiny

from captum_iglens import IGLens, register_estimator, settings
from captum_iglens._core.baseline_rows import BASELINE_ROWS, gate_references
from captum_iglens._core.capture import recorded_layers
from captum_iglens._core.estimators import ESTIMATORS, METHODS
from captum_iglens.cli import UsageError, parse_args
from captum_iglens.run.fingerprint import run_fingerprint
from captum_iglens.run.resume import planned_entries


@pytest.fixture
def registered():
    name = "node_differences_registry_test"

    def differences(readout, path, probs, method, n_steps, chunk):
        return probs[..., 1:] - probs[..., :-1]

    register_estimator(name, differences, exact=True, min_steps=3)
    yield name
    ESTIMATORS.pop(name, None)


def test_gradient_rows_state_the_steps_they_accept() -> None:
    model = make_tiny("llama").eval()
    lens, ids = IGLens(model), torch.tensor([[3, 4, 5, 6]])
    for name, row in ESTIMATORS.items():
        assert row.min_steps == (1 if row.exact else 2), name
        assert row.cost == ("nodes" if row.exact else "gradient"), name
    with pytest.raises(ValueError, match="n_steps must be an int >= 2"):
        lens.attribute(ids, method="riemann_left", n_steps=1)
    with pytest.warns(UserWarning, match="not converged"):  # accepted, coarse
        lens.attribute(ids, method="riemann_left", n_steps=ESTIMATORS["riemann_left"].min_steps)


def test_a_registered_estimator_is_live_everywhere(registered) -> None:
    assert registered in METHODS and registered in settings.METHODS
    assert registered in settings.methods() and registered in tuple(settings.METHODS)
    assert settings.method_min_steps(registered) == 3
    assert ESTIMATORS[registered].cost == "nodes"
    args = parse_args(["explain", "What?", "--method", registered, "--n-steps", "3"])
    assert args.method == registered
    # the row's min_steps is what the CLI checks
    with pytest.raises(UsageError, match="--n-steps >= 3"):
        parse_args(["explain", "What?", "--method", registered, "--n-steps", "2"])
    model = make_tiny("llama").eval()
    ids = torch.tensor([[3, 4, 5, 6]])
    with pytest.raises(ValueError, match=">= 3"):
        IGLens(model).attribute(ids, method=registered, n_steps=2)


def test_the_exact_flag_is_read_from_the_row(registered, monkeypatch) -> None:
    """``settings.method_is_exact`` (resume's reader, no torch needed) says what each row
    says; resume's planned entries and the run's fingerprint then drop ``n_steps`` for the
    same rows (a registered gradient rule keeps it: its credits depend on it)."""
    gradient = "gradient_rule_registry_test"
    register_estimator(gradient, lambda *a: None, exact=False)
    try:
        for name, row in ESTIMATORS.items():
            assert settings.method_is_exact(name) is row.exact, name
        assert settings.method_is_exact(registered) and not settings.method_is_exact(gradient)
        assert not settings.method_is_exact("no_such_estimator_test")
        model = make_tiny("llama").eval()
        for name, kept in ((registered, None), (settings.DEFAULT_METHOD, None),
                           (gradient, 7), ("riemann_left", 7)):
            chosen = {"method": name, "n_steps": 7}
            assert planned_entries(chosen, "probability")["n_steps"] == kept, name
            assert run_fingerprint(model, layers=[1, 2], units="probability",
                                   settings=chosen)["n_steps"] == kept
        # before the registry is imported (iglens run's checks before the load)
        monkeypatch.delitem(sys.modules, "captum_iglens._core.estimators")
        assert {n: settings.method_is_exact(n) for n in settings.BUILTIN_MIN_STEPS} == {
            n: ESTIMATORS[n].exact for n in settings.BUILTIN_MIN_STEPS}
    finally:
        ESTIMATORS.pop(gradient, None)


def test_an_unregistered_method_is_refused_by_the_cli() -> None:
    with pytest.raises(UsageError, match="invalid choice: 'no_such_estimator_test'"):
        parse_args(["explain", "What?", "--method", "no_such_estimator_test"])


def test_register_estimator_refuses_untrue_rows() -> None:
    with pytest.raises(ValueError, match="min_steps"):
        register_estimator("bad_steps_test", lambda *a: None, exact=True, min_steps=0)
    with pytest.raises(ValueError, match="cost"):
        register_estimator("bad_cost_test", lambda *a: None, exact=True, cost="free")
    assert "bad_steps_test" not in METHODS and "bad_cost_test" not in METHODS


def test_baseline_rows_are_what_the_capture_records() -> None:
    assert tuple(BASELINE_ROWS) == settings.BASELINES
    assert recorded_layers([2, 3], "embedding") == ({0, 2, 3}, set())
    assert recorded_layers([2, 3], "mean") == ({1, 2, 3}, {1})
    assert recorded_layers([2, 3], "zero") == ({2, 3}, set())
    assert gate_references() == ("mean", "zero")
