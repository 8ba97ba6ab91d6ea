"""The verdict code of the benchmark: it reads the pre-registration file and nothing else.

The hypotheses, statistics and decision rules live in ``prereg.json`` (package data beside
this module), committed before any benchmark run on the new tasks and families.
:func:`load_preregistration` returns it as a frozen :class:`Preregistration` that carries
the SHA-256 of the exact bytes it was read from; :func:`decide` applies the decision rule
with the numbers it holds (alpha, Bonferroni cells, minimum clusters and tokens, resamples);
:func:`analysis_version` is what every result records: the package version and the
SHA-256 of this module's source and of the file.
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from types import MappingProxyType
from typing import Any, Mapping, Optional, Union

import numpy as np

__all__ = ["Cell", "Preregistration", "analysis_version", "decide", "load_preregistration",
           "required_resamples"]

_PACKAGE = "captum_iglens.validate.benchmark"
_FILE = "prereg.json"


def _freeze(value: Any) -> Any:
    if isinstance(value, dict):
        return MappingProxyType({k: _freeze(v) for k, v in value.items()})
    if isinstance(value, list):
        return tuple(_freeze(v) for v in value)
    return value


def _thaw(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {k: _thaw(v) for k, v in value.items()}
    if isinstance(value, tuple):
        return [_thaw(v) for v in value]
    return value


@dataclass(frozen=True)
class Preregistration:
    """The pre-registration as read: its content (read-only) and the hash of its bytes.

    Attributes:
        data (mapping): The file's JSON object, nested mappings read-only, lists as tuples.
        sha256 (str): SHA-256 (hex) of the bytes the object was parsed from.
        source (str): Where they came from (the package file, or a path).
    """

    data: Mapping[str, Any]
    sha256: str
    source: str

    def to_dict(self) -> dict[str, Any]:
        """A plain, mutable copy of :attr:`data` (equal to ``json.loads`` of the file)."""
        return _thaw(self.data)

    @property
    def statistics(self) -> Mapping[str, Any]:
        """The ``statistics`` section (alpha, resamples, minimum n, power, ...)."""
        return self.data["statistics"]

    @property
    def hypotheses(self) -> tuple[Mapping[str, Any], ...]:
        """The hypotheses, each with its predictor, comparator, intervention, direction."""
        return self.data["hypotheses"]

    @property
    def n_cells(self) -> int:
        """Bonferroni cells: hypotheses x tasks x required families."""
        families = [f for f in self.data["families"] if f.get("required", True)]
        return len(self.hypotheses) * len(self.data["tasks"]) * len(families)

    @property
    def alpha_corrected(self) -> float:
        """One-sided level of each cell: ``alpha / n_cells``."""
        return float(self.statistics["alpha"]) / self.n_cells


def load_preregistration(path: Union[str, Path, None] = None) -> Preregistration:
    """Read the pre-registration: the package's ``prereg.json``, or another file to compare.

    Args:
        path (str or Path, optional): A JSON file of the same schema. Default: the file
            shipped with the package.

    Returns:
        Preregistration: frozen, with the SHA-256 of the bytes read.

    Raises:
        ValueError: not a JSON object, or a key the decision rule reads is missing.
    """
    if path is None:
        raw = (resources.files(_PACKAGE) / _FILE).read_bytes()
        source = f"{_PACKAGE}/{_FILE}"
    else:
        raw, source = Path(path).read_bytes(), str(path)
    data = json.loads(raw.decode("utf-8"))
    missing = [k for k in ("hypotheses", "statistics", "decision", "tasks", "families",
                           "predictors", "interventions", "metric_units", "seeds")
               if not isinstance(data, dict) or k not in data]
    if missing:
        raise ValueError(f"{source}: not a pre-registration (missing {', '.join(missing)}).")
    stats_missing = [k for k in ("alpha", "n_boot", "min_tail_draws", "min_clusters",
                                 "min_tokens", "power") if k not in data["statistics"]]
    if stats_missing:
        raise ValueError(f"{source}: statistics lack {', '.join(stats_missing)}.")
    return Preregistration(_freeze(data), hashlib.sha256(raw).hexdigest(), source)


def required_resamples(prereg: Preregistration) -> int:
    """Fewest bootstrap resamples that put ``min_tail_draws`` draws beyond the corrected bound."""
    return math.ceil(int(prereg.statistics["min_tail_draws"]) / prereg.alpha_corrected)


def analysis_version(prereg: Optional[Preregistration] = None) -> dict[str, str]:
    """What a result records of the code that decided it.

    Returns:
        dict: ``package`` (``captum_iglens.__version__``), ``verdict_module_sha256`` (this
        module's source), ``bootstrap_module_sha256`` (:mod:`captum_iglens.validate.stats`,
        the bootstrap it calls), ``preregistration_sha256`` (the file read).
    """
    from captum_iglens import __version__
    from captum_iglens.validate import stats

    prereg = prereg or load_preregistration()
    source = Path(__file__).read_bytes()
    return {"package": __version__, "verdict_module_sha256": hashlib.sha256(source).hexdigest(),
            "bootstrap_module_sha256": hashlib.sha256(
                Path(stats.__file__).read_bytes()).hexdigest(),
            "preregistration_sha256": prereg.sha256}


@dataclass(frozen=True)
class Cell:
    """The decision of one hypothesis on one (task, family), with what it was read from.

    Attributes:
        verdict (str): ``"supported"``, ``"not supported"``, ``"reversed"`` (not supported,
            and beyond the null the other way) or ``"n/a"``.
        value (float): The decided statistic (the mean of the per-token values).
        bound (float): Its one-sided corrected bootstrap bound in the stated direction.
        low / high (float): Two-sided ``1 - alpha_corrected`` interval.
        median (float): The median of the per-token values (reported).
        median_on_bound (bool): The median equals an end of its own interval.
        mde (float): Minimum detectable effect (``alpha_corrected``, the stated power).
        n_tokens / n_clusters (int): What it was computed from.
        reason (str): Why ``n/a``, else empty.
    """

    verdict: str
    value: float
    bound: float
    low: float
    high: float
    median: float
    median_on_bound: bool
    mde: float
    n_tokens: int
    n_clusters: int
    reason: str = ""


def decide(values: np.ndarray, clusters: np.ndarray, prereg: Preregistration,
           direction: str = "greater", null: float = 0.0, n_boot: Optional[int] = None,
           seed: Optional[int] = None) -> Cell:
    """Apply the pre-registered decision rule to the per-token values of one cell.

    Args:
        values (ndarray): ``[N]`` per-token statistic (e.g. paired rho difference); NaN
            left out.
        clusters (ndarray): ``[N]`` cluster label of each token (prompt, or mirrored couple).
        prereg (Preregistration): The rules (:func:`load_preregistration`).
        direction (str, optional): ``"greater"`` or ``"less"`` than ``null``.
        null (float, optional): The null value (0, or a chance value). Default: 0.
        n_boot (int, optional): Resamples. Default: the file's ``n_boot``.
        seed (int, optional): Bootstrap seed. Default: the file's bootstrap seed.

    Returns:
        Cell: the verdict and what it was read from.

    Raises:
        ValueError: ``direction`` not ``"greater"`` / ``"less"``, or shapes that differ.
    """
    from scipy.stats import norm

    from captum_iglens.validate.stats import cluster_bootstrap

    if direction not in ("greater", "less"):
        raise ValueError(f"direction is 'greater' or 'less', got {direction!r}.")
    values, clusters = np.asarray(values, np.float64), np.asarray(clusters)
    if values.shape != clusters.shape or values.ndim != 1:
        raise ValueError(f"values {values.shape} and clusters {clusters.shape} must be equal 1-d.")
    st = prereg.statistics
    alpha = prereg.alpha_corrected
    n_boot = int(st["n_boot"]) if n_boot is None else int(n_boot)
    seed = int(prereg.data["seeds"]["bootstrap"]) if seed is None else int(seed)
    keep = np.isfinite(values)
    values, clusters = values[keep], clusters[keep]
    groups = [np.flatnonzero(clusters == c) for c in np.unique(clusters)]
    n_tok, n_cl = len(values), len(groups)
    nan = math.nan

    def na(reason: str, **found: float) -> Cell:
        return Cell("n/a", found.get("value", nan), nan, nan, nan, found.get("median", nan),
                    False, nan, n_tok, n_cl, reason)

    if n_tok < int(st["min_tokens"]) or n_cl < int(st["min_clusters"]):
        return na(f"{n_tok} tokens in {n_cl} clusters: fewer than {st['min_tokens']} tokens "
                  f"or {st['min_clusters']} clusters")
    if n_boot < required_resamples(prereg):
        return na(f"{n_boot} resamples cannot resolve the corrected level {alpha:.2g} "
                  f"(need {required_resamples(prereg)})")
    draws, point = cluster_bootstrap(values[:, None].repeat(2, 1), np.array([True, False]),
                                     groups, n_boot, seed, return_draws=True)
    mean_d, med_d = draws[:, 0], draws[:, 1]
    low, high = np.quantile(mean_d, [alpha / 2, 1 - alpha / 2])
    m_low, m_high = np.quantile(med_d, [alpha / 2, 1 - alpha / 2])
    value, median = float(point[0]), float(point[1])
    if not high > low:  # exact: a zero-width interval says nothing about the spread
        return na("zero-width interval", value=value, median=median)
    sign = 1.0 if direction == "greater" else -1.0
    bound = float(np.quantile(mean_d, alpha if sign > 0 else 1 - alpha))
    other = float(np.quantile(mean_d, 1 - alpha if sign > 0 else alpha))
    se = float(np.std(mean_d, ddof=1))
    mde = (float(norm.ppf(1 - alpha)) + float(norm.ppf(float(st["power"])))) * se
    if sign * (bound - null) > 0:
        verdict = "supported"
    elif sign * (other - null) < 0:
        verdict = "reversed"
    else:
        verdict = "not supported"
    on_bound = bool(min(abs(median - m_low), abs(median - m_high))
                    <= 4 * np.finfo(np.float64).eps * max(1.0, abs(median)))
    return Cell(verdict, value, bound, float(low), float(high), median, on_bound, mde,
                n_tok, n_cl)

