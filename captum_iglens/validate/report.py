"""The result of a causal validation of IG-Lens: verdict, tables, JSON and figure."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Optional, Sequence

import numpy as np

from captum_iglens.validate.pairs import couple_clusters
from captum_iglens.validate.predictors import predictor_names
from captum_iglens.validate.stats import METRICS, analyse
from captum_iglens.validate.tables import LEGEND, paired_block, summary_block, trajectory_block
from captum_iglens.validate.verdict import (
    EXCLUDED_BLOCK,
    PRE_STATED,
    decision_views,
    format_verdict,
    verdict,
)

__all__ = ["ValidationResult", "analyse_patches"]

_PATCH_KINDS = ("patch", "reverse patch")


def analyse_patches(patches: Sequence[Any], skipped: Sequence[str], n_boot: int, seed: int,
                    nonmonotonic_tol: float) -> dict[str, Any]:
    """Bootstrap analysis and verdict of counterfactual patching, one cluster per pair.

    A pair and its mirror (:func:`~captum_iglens.validate.pairs.couple_clusters`) are one
    cluster: patching one is reverse-patching the other.

    Args:
        patches (sequence of PairPatch): From :func:`~captum_iglens.validate.patching.patch_pairs`.
        skipped (sequence of str): Why pairs were skipped.
        n_boot (int): Bootstrap resamples.
        seed (int): Seed of the random predictor and the bootstrap.
        nonmonotonic_tol (float): Of the contrastive logit-lens trajectory ``F(h_L)``.

    Returns:
        dict: ``pairs`` (per pair: id, category, position, target, foil, ``f_clean``,
        ``f_corrupted``, ``embedding_recovery``, ``onset_layer``, ``nonmonotonic``),
        ``skipped``, the ``[N, n]`` arrays ``credits``, ``lens``, ``direct``, ``drops``
        (``"patch"``: recovery, ``"reverse patch"``), the analysis of
        :func:`~captum_iglens.validate.stats.analyse` (``metrics``, ``summary``, ``paired``,
        ``contrast``, ``views``), ``verdict`` and ``check_errors``.

    Raises:
        ValueError: fewer than 2 pairs.
    """
    if len(patches) < 2:
        raise ValueError(f"Patching needs at least 2 pairs whose tokens align, got "
                         f"{len(patches)} ({'; '.join(skipped) or 'no pair given'}).")

    def stack(name: str) -> np.ndarray:
        return np.stack([getattr(p, name).double().numpy() for p in patches])

    credits, lens, direct = stack("credits"), stack("lens"), stack("direct")
    drops = {"patch": stack("recovery"), "reverse patch": stack("reverse")}
    onset = np.array([p.onset for p in patches])
    clusters = couple_clusters([p.pair for p in patches])  # a pair and its mirror: one
    out = analyse(credits, lens, direct, onset, drops, clusters, n_boot, seed,
                  nonmonotonic_tol, {k: EXCLUDED_BLOCK[k] for k in _PATCH_KINDS})
    n = credits.shape[1]
    out["verdict"] = verdict(out["summary"], out["paired"], out["contrast"],
                             decision_views(out["views"], {k: n for k in _PATCH_KINDS}),
                             chance=out["chance"], n_clusters=len(np.unique(clusters)))
    out["clusters"] = clusters.tolist()
    out.update(credits=credits, lens=lens, direct=direct, drops=drops, skipped=list(skipped))
    out["pairs"] = [{"id": p.pair.id, "category": p.pair.category, "clean": p.pair.clean,
                     "corrupted": p.pair.corrupted, "position": p.position,
                     "target": p.target, "foil": p.foil, "f_clean": p.f_clean,
                     "f_corrupted": p.f_corrupted, "embedding_recovery": p.embedding_recovery,
                     "onset_layer": p.onset + 1, "nonmonotonic": bool(flag)}
                    for p, flag in zip(patches, out["nonmonotonic"], strict=True)]
    out["check_errors"] = {k: max(p.check_errors[k] for p in patches)
                           for k in patches[0].check_errors}
    return out


@dataclass
class ValidationResult:
    """Interventions and IG-Lens predictors of ``N`` answer tokens over ``n`` blocks.

    Arrays are float64 numpy, ``[N, n]`` (column ``j`` = block ``j + 1``), probability units.

    Attributes:
        kinds (tuple[str, ...]): Ablation kinds run.
        layer_indices (list[int]): ``1..n``, the blocks (hidden-state indices).
        prompts (list[str]) / answers (list[str]): Each prompt and its greedy answer.
        tokens (list[dict]): Per ablated token: ``prompt_index``, ``token``, ``token_id``,
            ``position``, ``p_final``, ``onset_layer`` (IG-Lens), ``donor_prompt_indices``
            (resample), ``nonmonotonic`` (logit-lens trajectory).
        credits / lens_probs / direct (ndarray): IG-Lens credits, logit-lens levels
            ``f(h_L)``, direct effects ``f(h_n) - f(h_n - u_L)``.
        analysis (dict, optional): The ablation's :func:`~captum_iglens.validate.stats.
            analyse` output plus ``verdict`` and ``drops`` (None without ablation kinds).
        settings (dict): The arguments, the check tolerance, the wall time per phase and
            ``provenance`` (:func:`~captum_iglens.validate.inputs.provenance`).
        check_errors (dict[str, float]): Largest error of each built-in ablation check.
        patching (dict, optional): :func:`analyse_patches` (None without ``"patch"``).
        predictors (dict): Effect predictors beside the built-in ones: ablation kind ->
            name (``"total effect"``, ``"AtP"``) -> ``[N, n]`` scores
            (:mod:`captum_iglens.validate.predictors`); scored in :attr:`summary` like the
            others.
    """

    kinds: tuple[str, ...]
    layer_indices: list[int]
    prompts: list[str]
    answers: list[str]
    tokens: list[dict[str, Any]]
    credits: np.ndarray
    lens_probs: np.ndarray
    direct: np.ndarray
    analysis: Optional[dict[str, Any]]
    settings: dict[str, Any]
    check_errors: dict[str, float]
    patching: Optional[dict[str, Any]] = None
    predictors: dict[str, dict[str, np.ndarray]] = field(default_factory=dict)

    def _part(self, key: str) -> Any:
        return (self.analysis or {}).get(key, {})

    @property
    def drops(self) -> dict[str, np.ndarray]:
        """Ablation kind -> ``[N, n]`` ``p(clean) - p(ablated)`` (resample: donors' mean)."""
        return self._part("drops")

    @property
    def metrics(self) -> dict[str, Any]:
        """Per-token values: view -> predictor -> metric -> ``[N]``."""
        return self._part("metrics")

    @property
    def summary(self) -> dict[str, Any]:
        """Bootstrap summaries: subset -> view -> predictor -> metric -> ``[stat, low, high]``."""
        return self._part("summary")

    @property
    def paired(self) -> dict[str, Any]:
        """As :attr:`summary`, for IG-Lens credit minus each predictor, token by token."""
        return self._part("paired")

    @property
    def verdict(self) -> list[dict[str, Any]]:
        """The rows of the pre-stated test: ablation views, then patching views."""
        return list(self._part("verdict") or []) + list((self.patching or {}).get("verdict",
                                                                                   []))

    def format_verdict(self) -> str:
        """The pre-stated test and its verdict on this model, as text."""
        return "\n".join([PRE_STATED, "",
                          *format_verdict(self.verdict, str(self.settings.get("model")))])

    def _counts(self, flags: np.ndarray, prompt: np.ndarray) -> str:
        return f"{len(flags)} tokens from {len(set(prompt.tolist()))} prompts"

    def _view_lines(self, part: dict[str, Any], what: str) -> list[str]:
        flags = np.asarray(part["nonmonotonic"])
        counts = (int((~flags).sum()), int(flags.sum()))
        lines: list[str] = []
        for view in part["views"]:
            lines += ["", *summary_block(part["summary"], view, f"{view} {what}"),
                      *paired_block(part["paired"], view)]
        for view in part["views"]:
            lines += ["", *trajectory_block(part["summary"], part["contrast"], view, counts)]
        return lines

    def format_table(self) -> str:
        """The verdict, then every table, as text (lines of at most 100 characters)."""
        s = self.settings
        resample = "resample" in self.kinds  # donors mean nothing to the other kinds
        lines = [f"IG-Lens credit vs causal interventions on {s.get('model')}, "
                 f"{len(self.layer_indices)} blocks.",
                 f"This run: {s['n_boot']} bootstrap resamples, seed {s['seed']}"
                 + (f", {s['donors']} resample donors." if resample else "."),
                 self.format_verdict(), "", *LEGEND, *self._effect_legend()]
        if self.analysis is not None:
            prompt = np.array([t["prompt_index"] for t in self.tokens])
            head = (f"ABLATION: {self._counts(prompt, prompt)} (p_final >= "
                    f"{s['threshold']:g}); drop = p(clean) - p(ablated) at the token")
            lines += ["", head + (";" if resample else ".")]
            if resample:
                lines.append(f"resample: the mean over {s['donors']} donor prompts (seed "
                             f"{s['seed']})")
            lines += self._view_lines(self.analysis, "ablation")
        if self.patching is not None:
            lines += ["", *self._patch_head(), *self._view_lines(self.patching, "(pairs)")]
        checks = [f"{k} {v:.1e}" for k, v in self._all_checks().items()]
        lines += ["", "checks passed (largest |error|, tolerance "
                  f"{s['tolerance']:.1e} (1 + |reference|)):"]
        lines += ["  " + ", ".join(checks[i:i + 5]) for i in range(0, len(checks), 5)]
        return "\n".join(line.rstrip() for line in lines)

    def _effect_legend(self) -> list[str]:
        if not self.predictors:
            return []
        return ["total effect: exact share of the drop when every block's update at the token",
                "goes to its reference (8 steps); AtP: first-order estimate of each single-block",
                "drop (not additive); both with the ablation's reference (zero; causal mean for",
                "mean), scored only where the ablation is zero or mean; the readout credit decides",
                "H1-H3."]

    def _patch_head(self) -> list[str]:
        pairs = self.patching["pairs"]  # type: ignore[index]  # called when patching ran
        f_c = np.median([p["f_clean"] for p in pairs])
        f_x = np.median([p["f_corrupted"] for p in pairs])
        return [f"PATCHING: {len(pairs)} pairs ({len(self.patching['skipped'])} skipped); F = "  # type: ignore[index]  # as above
                f"p(y) - p(foil) at the last prompt token,",
                f"median clean {f_c:+.2f}, corrupted {f_x:+.2f}. patch: F recovered in the "
                "corrupted run when one block's", "clean update is patched in; reverse patch: F "
                "lost in the clean run when its corrupted update is.", "Credit: contrastive "
                "IG-Lens from the corrupted reference; cluster = pair."]

    def _all_checks(self) -> dict[str, float]:
        checks = dict(self.check_errors)
        for k, v in (self.patching or {}).get("check_errors", {}).items():
            checks[f"patch {k}"] = v
        return checks

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict, NaN as ``None``.

        Holds the settings (with the provenance), prompts and answers, per-token arrays
        and metrics, the summaries, paired comparisons, the monotonic / non-monotonic
        contrasts, the verdict, the patching pairs and analysis, and the check errors.
        """
        tokens = []
        for i, token in enumerate(self.tokens):
            entry = dict(token)
            entry.update(credits=self.credits[i], lens_probs=self.lens_probs[i],
                         direct=self.direct[i], drops={k: v[i] for k, v in self.drops.items()},
                         predictors={k: {name: v[i] for name, v in by_name.items()}
                                     for k, by_name in self.predictors.items()},
                         metrics={k: {p: {m: vals[m][i] for m in METRICS}
                                      for p, vals in by_p.items()}
                                  for k, by_p in self.metrics.items()})
            tokens.append(entry)
        ablation = {k: v for k, v in (self.analysis or {}).items()
                    if k not in ("metrics", "drops", "nonmonotonic")}
        return _plain({
            "settings": self.settings, "layers": self.layer_indices, "kinds": self.kinds,
            "predictors": predictor_names(self.summary), "metrics": METRICS,
            "pre_stated_test": PRE_STATED,
            "verdict": self.verdict, "prompts": self.prompts, "answers": self.answers,
            "ablation": ablation, "patching": self.patching, "check_errors": self._all_checks(),
            "tokens": tokens,
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

        Left: per-token Spearman rho of every predictor, one box per ablation view. Right:
        mean IG-Lens credit, direct effect and drop of each kind per block (probability).

        Args:
            path (str, optional): Save the figure there (PNG, PDF, SVG, ...).

        Returns:
            matplotlib ``Figure`` (built without pyplot's global state).
        """
        from captum_iglens.validate.plot import plot_validation

        return plot_validation(self, path)


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
        return float(value) if np.isfinite(value) else None
    return value
