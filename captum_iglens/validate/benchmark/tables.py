"""The benchmark's tables and figure: Markdown per intervention, the hypotheses, a figure.

Read from the cells :func:`~captum_iglens.validate.benchmark.runner.run_cell` writes.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np

from captum_iglens.validate.benchmark.analysis import (
    INTERVENTIONS,
    PRIMARY_UNIT,
    predictor_names,
)
from captum_iglens.validate.benchmark.decide import load_preregistration

__all__ = ["figure", "hypotheses_table", "markdown_tables"]


def _fmt(s: Any) -> str:
    if not isinstance(s, Mapping):
        return str(s)
    if not math.isfinite(s.get("mean", math.nan)):
        return f"n/a ({s.get('n', 0)})"
    if not math.isfinite(s.get("low", math.nan)):
        return f"{s['mean']:+.2f} ({s['n']})"
    return f"{s['mean']:+.2f} [{s['low']:+.2f}, {s['high']:+.2f}] ({s['n']})"


def _table(title: str, names: Sequence[str], cells: Sequence[Mapping[str, Any]],
           get: Any) -> str:
    heads = [f"{c['family']} / {c['task']}" for c in cells]
    lines = [f"| {title} | " + " | ".join(heads) + " |", "| --- |" + " --- |" * len(cells)]
    for name in names:
        lines.append(f"| {name} | " + " | ".join(_fmt(get(c, name)) for c in cells) + " |")
    return "\n".join(lines)


def markdown_tables(cells: Sequence[Mapping[str, Any]]) -> dict[str, str]:
    """Predictors x (family, task), one table per intervention (Markdown).

    Each entry is ``mean [95% CI] (n)``: per-token Spearman rho in the intervention's
    primary unit on its decided view; the deletion (keep) table holds the
    comprehensiveness (sufficiency) area; the magnitude table the infidelity.
    """
    prereg = load_preregistration()
    names = predictor_names(prereg)
    out = {}
    for kind in INTERVENTIONS:
        unit = PRIMARY_UNIT(prereg, kind)
        out[kind] = _table(
            f"{kind} ({unit}): mean per-token Spearman rho [95% CI] (n)", names, cells,
            lambda c, name, k=kind, u=unit: c["scores"].get(k, {}).get(u, {}).get(
                "decided", {}).get(name, "not measured"))
    for kind, stat in (("deletion", "comprehensiveness"), ("keep", "sufficiency")):
        unit = PRIMARY_UNIT(prereg, kind)
        out[kind] = _table(f"{kind}: {stat} area ({unit}) [95% CI] (n)", names, cells,
                           lambda c, name, s=stat, u=unit: c["curves"][s].get(name, {}).get(
                               u, "not measured"))
    out["magnitude"] = _table("magnitude: infidelity (probability^2) [95% CI] (n)", names,
                              cells, lambda c, name: c["magnitude"].get(name, "not measured"))
    out["hypotheses"] = hypotheses_table(cells)
    return out


def hypotheses_table(cells: Sequence[Mapping[str, Any]]) -> str:
    """Hypotheses x (family, task): the verdict, the mean difference, its MDE and n."""
    prereg = load_preregistration()
    heads = [f"{c['family']} / {c['task']}" for c in cells]
    lines = ["| hypothesis (verdict (mean; MDE; n)) | " + " | ".join(heads) + " |",
             "| --- |" + " --- |" * len(cells)]
    for h in prereg.hypotheses:
        row = []
        for cell in cells:
            found = cell.get("hypotheses", {}).get(h["id"], {"verdict": "n/a"})
            value, mde = found.get("value", math.nan), found.get("mde", math.nan)
            text = found["verdict"]
            if math.isfinite(value):
                text += f" ({value:+.3g}; {mde:.2g}; {found.get('n_tokens', 0)})"
            if found.get("unstable"):
                text += " unstable"
            row.append(text)
        lines.append(f"| {h['id']} {h['statement']} | " + " | ".join(row) + " |")
    return "\n".join(lines)


def figure(cells: Sequence[Mapping[str, Any]], path: Path) -> Path:
    """Heat maps of the mean rho, predictors x (family, task), one panel per intervention.

    Written with matplotlib's Agg backend to ``path`` (PNG); returns ``path``.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    prereg = load_preregistration()
    names = predictor_names(prereg)
    heads = [f"{c['family']}\n{c['task']}" for c in cells]
    fig, axes = plt.subplots(1, len(INTERVENTIONS), figsize=(3.2 * len(INTERVENTIONS) + 3, 5),
                             sharey=True, squeeze=False)
    for ax, kind in zip(axes[0], INTERVENTIONS, strict=True):
        unit = PRIMARY_UNIT(prereg, kind)
        grid = np.full((len(names), len(cells)), np.nan)
        for j, cell in enumerate(cells):
            view = cell["scores"].get(kind, {}).get(unit, {}).get("decided", {})
            for i, name in enumerate(names):
                grid[i, j] = view.get(name, {}).get("mean", np.nan)
        image = ax.imshow(grid, vmin=-1, vmax=1, cmap="RdBu_r", aspect="auto")
        ax.set_title(f"{kind}\n({unit})", fontsize=9)
        ax.set_xticks(range(len(cells)), heads, fontsize=7, rotation=90)
        ax.set_yticks(range(len(names)), names, fontsize=8)
    fig.colorbar(image, ax=axes[0].tolist(), label="mean per-token Spearman rho")
    path = Path(path)
    fig.savefig(path, dpi=120, bbox_inches="tight")
    plt.close(fig)
    return path
