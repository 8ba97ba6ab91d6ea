"""The result of a causal validation of IG-Lens: table, JSON and figure."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any, Optional

import numpy as np

from captum_iglens.validate_stats import METRICS, PREDICTORS, SUBSETS

__all__ = ["ValidationResult"]

_WIDTH = 100


@dataclass
class ValidationResult:
    """Ablation drops and IG-Lens predictors of ``N`` answer tokens over ``n`` blocks.

    Arrays are float64 numpy, ``[N, n]`` (column ``j`` = block ``j + 1``), probability units.

    Attributes:
        kinds (tuple[str, ...]): Ablation kinds run.
        layer_indices (list[int]): ``1..n``, the ablated blocks (hidden-state indices).
        prompts (list[str]) / answers (list[str]): Each prompt and its greedy answer.
        tokens (list[dict]): Per token: ``prompt_index``, ``token``, ``token_id``,
            ``position``, ``p_final``, ``onset_layer`` (IG-Lens), ``donor_prompt_index``
            (resample), ``nonmonotonic`` (logit-lens trajectory).
        credits / lens_probs / direct (ndarray): IG-Lens credits, logit-lens levels
            ``f(h_L)``, direct effects ``f(h_n) - f(h_n - u_L)``.
        drops (dict[str, ndarray]): kind -> ``p(clean) - p(ablated)``.
        metrics (dict): kind -> predictor -> metric -> ``[N]`` per-token values.
        summary / paired (dict): subset (``"all"``, ``"non-monotonic"``) -> kind ->
            predictor -> metric -> ``[statistic, low, high]`` (95% CI, prompts resampled);
            ``paired`` holds IG-Lens credit minus the predictor, token by token.
        settings (dict): The arguments, the check tolerance and the wall time per phase.
        check_errors (dict[str, float]): Largest error of each built-in ablation check.
    """

    kinds: tuple[str, ...]
    layer_indices: list[int]
    prompts: list[str]
    answers: list[str]
    tokens: list[dict[str, Any]]
    credits: np.ndarray
    lens_probs: np.ndarray
    direct: np.ndarray
    drops: dict[str, np.ndarray]
    metrics: dict[str, Any]
    summary: dict[str, Any]
    paired: dict[str, Any]
    settings: dict[str, Any]
    check_errors: dict[str, float]

    def _count(self, subset: str) -> tuple[int, int]:
        rows = [t for t in self.tokens if subset == "all" or t["nonmonotonic"]]
        return len(rows), len({t["prompt_index"] for t in rows})

    def format_table(self) -> str:
        """The summaries as text, lines of at most 100 characters.

        Per subset and ablation kind: every predictor's metrics, then IG-Lens credit minus
        every other predictor (paired, token by token).
        """
        n_tok, n_prompts = self._count("all")
        s = self.settings
        lines = [
            f"IG-Lens credit vs block ablation: {n_tok} tokens from {n_prompts} prompts "
            f"(p_final >= {s['threshold']:g}), {len(self.layer_indices)} blocks.",
            "Per token, the blocks are ranked by their drop p(clean) - p(ablated) at its position.",
            f"Medians (top-k: means), 95% CIs from a prompt-clustered bootstrap ({s['n_boot']} "
            "resamples).",
            "pct: percentile of the drop at the predictor's top / onset block (50 = chance).",
            "|Δonset|: layers from that onset to the half-drop block (the first block from which",
            "the cumulative drop stays at or beyond half its sum: the rule of IG-Lens's onset).",
        ]
        for subset in SUBSETS:
            for kind in self.kinds:
                lines += ["", *self._summary_block(subset, kind), *self._paired_block(subset, kind)]
        checks = ", ".join(f"{k} {v:.1e}" for k, v in self.check_errors.items())
        lines += ["", f"checks passed (largest |error|): {checks}",
                  f"  tolerance {s['tolerance']:.1e}"]
        return "\n".join(line.rstrip() for line in lines)

    def _summary_block(self, subset: str, kind: str) -> list[str]:
        n_tok, n_prompts = self._count(subset)
        head = f"{kind} ablation, {subset} tokens: {n_tok} tokens, {n_prompts} prompts"
        lines = [head, f"{'predictor':<16}{'Spearman [95% CI]':<22}{'top-1':>6}{'top-3':>6}  "
                       f"{'pct@top [CI]':<15}{'pct@onset [CI]':<15}{'|Δonset|':>8}"]
        for name in PREDICTORS:
            row = self.summary.get(subset, {}).get(kind, {}).get(name, {})
            get = lambda m, r=row: r.get(m, [math.nan] * 3)  # noqa: E731
            lines.append(f"{name:<16}{_ci(get('spearman'), '+.2f'):<22}"
                         f"{_num(get('top1')[0], '.2f'):>6}{_num(get('top3')[0], '.2f'):>6}  "
                         f"{_ci(get('pct_top'), '.0f'):<15}{_ci(get('pct_onset'), '.0f'):<15}"
                         f"{_num(get('onset_dist')[0], '.1f'):>8}")
        return lines

    def _paired_block(self, subset: str, kind: str) -> list[str]:
        lines = [f"{'IG-Lens minus':<16}{'ΔSpearman [CI]':<22}{'Δtop-1 [CI]':<22}"
                 f"{'Δpct@top [CI]':<18}{'Δpct@onset [CI]':<18}"]
        for name in PREDICTORS[1:]:
            row = self.paired.get(subset, {}).get(kind, {}).get(name, {})
            get = lambda m, r=row: r.get(m, [math.nan] * 3)  # noqa: E731
            lines.append(f"{name:<16}{_ci(get('spearman'), '+.2f'):<22}"
                         f"{_ci(get('top1'), '+.2f'):<22}{_ci(get('pct_top'), '+.0f'):<18}"
                         f"{_ci(get('pct_onset'), '+.0f'):<18}")
        return lines

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict, NaN as ``None``.

        Holds the settings, prompts and answers, per-token arrays and metrics, the
        summaries, the paired comparisons and the check errors.
        """
        tokens = []
        for i, token in enumerate(self.tokens):
            entry = dict(token)
            entry.update(credits=self.credits[i], lens_probs=self.lens_probs[i],
                         direct=self.direct[i], drops={k: v[i] for k, v in self.drops.items()},
                         metrics={k: {p: {m: vals[m][i] for m in METRICS}
                                      for p, vals in by_p.items()}
                                  for k, by_p in self.metrics.items()})
            tokens.append(entry)
        return _plain({
            "settings": self.settings, "layers": self.layer_indices, "kinds": self.kinds,
            "predictors": PREDICTORS, "metrics": METRICS, "prompts": self.prompts,
            "answers": self.answers, "summary": self.summary, "paired": self.paired,
            "check_errors": self.check_errors, "tokens": tokens,
        })

    def to_json(self, path: Optional[str] = None, indent: int = 1) -> str:
        """:meth:`to_dict` as strict JSON; also written to ``path`` if given."""
        text = json.dumps(self.to_dict(), indent=indent, allow_nan=False)
        if path is not None:
            with open(path, "w", encoding="utf-8") as handle:
                handle.write(text + "\n")
        return text

    def plot(self, path: Optional[str] = None) -> Any:
        """Draw the per-token correlations and the mean profiles across blocks.

        Left: per-token Spearman rho of every predictor, one box per ablation kind. Right:
        mean IG-Lens credit, direct effect and drop of each kind per block (probability).

        Args:
            path (str, optional): Save the figure there (PNG, PDF, SVG, ...).

        Returns:
            matplotlib ``Figure`` (built without pyplot's global state).
        """
        from matplotlib.figure import Figure

        fig = Figure(figsize=(14, 5), layout="constrained")
        left, right = fig.subplots(1, 2, width_ratios=[1.3, 1])
        width = 0.8 / len(self.kinds)
        for j, kind in enumerate(self.kinds):
            data = [_finite(self.metrics[kind][p]["spearman"]) for p in PREDICTORS]
            where = np.arange(len(PREDICTORS)) + (j - (len(self.kinds) - 1) / 2) * width
            box = left.boxplot(data, positions=where, widths=width * 0.9, patch_artist=True,
                               showfliers=False)
            for patch in box["boxes"]:
                patch.set_facecolor(f"C{j}")
            left.plot([], [], color=f"C{j}", lw=6, label=f"{kind} ablation")
        left.axhline(0, color="0.5", lw=0.8)
        left.set_xticks(range(len(PREDICTORS)), PREDICTORS, rotation=30, ha="right")
        left.set_ylabel("Spearman rho(predictor, drop) per token")
        left.legend(loc="lower left", fontsize=8)
        layers = self.layer_indices
        right.plot(layers, self.credits.mean(0), "k-o", ms=3, label="IG-Lens credit")
        right.plot(layers, self.direct.mean(0), "k--", label="direct effect")
        for j, kind in enumerate(self.kinds):
            right.plot(layers, self.drops[kind].mean(0), color=f"C{j}", label=f"{kind} drop")
        right.set_xlabel("decoder block")
        right.set_ylabel("mean over tokens (probability)")
        right.legend(fontsize=8)
        fig.suptitle(f"IG-Lens credit vs ablation drop ({len(self.tokens)} tokens)")
        if path is not None:
            fig.savefig(path, dpi=120)
        return fig


def _num(value: float, fmt: str) -> str:
    return "n/a" if not math.isfinite(value) else format(value, fmt)


def _ci(triple: list[float], fmt: str) -> str:
    stat, low, high = triple
    if not math.isfinite(stat):
        return "n/a"
    return f"{format(stat, fmt)} [{_num(low, fmt)},{_num(high, fmt)}]"


def _finite(values: np.ndarray) -> np.ndarray:
    return values[np.isfinite(values)]


def _plain(value: Any) -> Any:
    """Numpy arrays and scalars to lists and floats, NaN / inf to ``None``."""
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, np.ndarray):
        return _plain(value.tolist())
    if isinstance(value, (np.bool_, bool)):
        return bool(value)
    if isinstance(value, (np.integer, int)):
        return int(value)
    if isinstance(value, (np.floating, float)):
        return float(value) if math.isfinite(value) else None
    return value
