"""``collect.first_difference``: the comparison that decides whether a recorded cell is used."""

from __future__ import annotations

import math

import numpy as np

from captum_iglens.validate.benchmark.collect import REL, first_difference


def test_equal_trees_within_the_tolerance_agree() -> None:
    stored = {"a": [1.0, float("nan"), None], "b": {"verdict": "supported", "n": 24,
                                                     "unstable": False}}
    fresh = {"a": [1.0 + REL / 10, float("nan"), None],
             "b": {"verdict": "supported", "n": 24, "unstable": False}}
    assert first_difference(stored, fresh) is None


def test_each_kind_of_difference_is_named_with_its_path() -> None:
    base = {"s": {"mean": 0.5, "ci": [0.1, 0.9]}, "v": "supported", "u": False}

    def differ(**change) -> str:
        fresh = {**base, **change}
        found = first_difference(base, fresh, "cell")
        assert found is not None, change
        return found

    assert differ(s={"mean": 0.5 * (1 + 10 * REL), "ci": [0.1, 0.9]}).startswith("cell/s/mean")
    assert "cell/s/ci" in differ(s={"mean": 0.5, "ci": [0.1]})
    assert differ(v="reversed") == "cell/v: recorded 'supported', recomputed 'reversed'"
    assert differ(u=True).startswith("cell/u")
    assert differ(u=0).startswith("cell/u")  # a bool is not the number 0
    assert differ(extra=1) == "cell/extra: recomputed only"
    fresh = {k: v for k, v in base.items() if k != "v"}
    assert first_difference(base, fresh, "cell") == "cell/v: recorded only"
    assert first_difference({"x": float("nan")}, {"x": 0.0}) is not None
    assert first_difference({"x": 1.0}, {"x": math.nan}) is not None
    assert first_difference({"x": [1.0]}, {"x": np.array([1.0])}) is not None  # not JSON


def test_the_tolerance_is_relative_with_an_absolute_floor() -> None:
    assert first_difference(1e6, 1e6 * (1 + REL / 2)) is None
    assert first_difference(1e6, 1e6 * (1 + 2 * REL)) is not None
    assert first_difference(0.0, 1e-15) is None  # below the 1e-14 floor
    assert first_difference(0.0, 1e-13) is not None


def test_counts_are_exact() -> None:
    assert first_difference({"n": 24}, {"n": 24}) is None
    assert first_difference({"n": 24.0000000001}, {"n": 24}) is not None  # not a count
    assert first_difference({"n": 24}, {"n": 24.0}) is not None
