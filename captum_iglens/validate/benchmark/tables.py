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

__all__ = ["figure", "hypotheses_table", "lens_json", "lens_tables", "markdown_tables"]


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


def _verdict(found: Mapping[str, Any]) -> str:
    value, mde = found.get("value", math.nan), found.get("mde", math.nan)
    text = str(found["verdict"])
    if math.isfinite(value):
        text += f" ({value:+.3g}; {mde:.2g}; {found.get('n_tokens', 0)})"
    if found.get("unstable"):
        text += " unstable"
    return text


def _lens_index(lens_cells: Sequence[Mapping[str, Any]]) -> dict[tuple, Mapping[str, Any]]:
    return {(c["family"], c["task"], c["kind"]): c for c in lens_cells}


def lens_tables(cells: Sequence[Mapping[str, Any]],
                lens_cells: Sequence[Mapping[str, Any]]) -> str:
    """The lens addendum's block (Markdown): its rows per intervention, infidelity, L1/L2.

    One table per single-block intervention (primary unit, decided view, as
    :func:`markdown_tables`) holding the logit lens's readout credit and each lens's row,
    the infidelity, and the addendum's hypotheses decided at its own level; a family
    without a fitted lens reads ``n/a (no fitted lens)``.
    """
    from captum_iglens.validate.benchmark.addendum import load_lens_addendum

    add = load_lens_addendum()
    index = _lens_index(lens_cells)
    kinds = [p for p in add.addendum["predictors"]
             if any(c["kind"] == p["kind"] for c in lens_cells)]
    names = ["readout credit"] + [p["name"] for p in kinds]

    def entry(cell: Mapping[str, Any], name: str, get: Any) -> Any:
        if name == "readout credit":
            return get(cell, name)
        kind = next(p["kind"] for p in kinds if p["name"] == name)
        found = index.get((cell["family"], cell["task"], kind))
        if found is None:
            return "not run or left out"
        if found["status"] != "ok":
            return "n/a (no fitted lens)"
        return get(found, name)

    blocks = [f"## Lens addendum ({add.source}, written {add.addendum['date']} before any "
              "benchmark run with a tuned or Jacobian lens; scored on the cells' stored "
              "drops; its own Bonferroni correction over "
              f"{add.n_cells} cells)"]
    for kind in INTERVENTIONS:
        unit = PRIMARY_UNIT(add, kind)
        blocks.append(_table(
            f"lens addendum, {kind} ({unit}): mean per-token Spearman rho [95% CI] (n)",
            names, cells, lambda c, name, k=kind, u=unit: entry(
                c, name, lambda x, nm: x["scores"].get(k, {}).get(u, {}).get(
                    "decided", {}).get(nm, "not measured"))))
    blocks.append(_table("lens addendum, magnitude: infidelity (probability^2) [95% CI] (n)",
                         names, cells, lambda c, name: entry(
                             c, name, lambda x, nm: x["magnitude"].get(nm, "not measured"))))
    heads = [f"{c['family']} / {c['task']}" for c in cells]
    lines = ["| lens addendum hypothesis (verdict (mean; MDE; n)) | " + " | ".join(heads)
             + " |", "| --- |" + " --- |" * len(cells)]
    for h in add.hypotheses:
        kind = next(p["kind"] for p in add.addendum["predictors"]
                    if p["name"] == h["predictor"])
        row = []
        for cell in cells:
            found = index.get((cell["family"], cell["task"], kind))
            row.append("not run or left out" if found is None else _verdict(
                found.get("hypotheses", {}).get(h["id"], {"verdict": "n/a"})))
        lines.append(f"| {h['id']} {h['statement']} | " + " | ".join(row) + " |")
    blocks.append("\n".join(lines))
    return "\n\n".join(blocks)


def lens_json(lens_cells: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The addendum's part of ``benchmark.json``: its source, SHA-256 and the lens cells.

    The per-pair rows stay in the lens files.
    """
    from captum_iglens.validate.benchmark.addendum import load_lens_addendum

    add = load_lens_addendum()
    return {"addendum": add.source, "sha256": add.sha256, "n_cells": add.n_cells,
            "cells": [{k: v for k, v in c.items() if k not in ("rows", "lens_change")}
                      for c in lens_cells]}


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


def mark_missing(ax: Any, grid: np.ndarray) -> None:
    """Write "n/a" on the heat map's cells without a value (NaN), which imshow leaves blank.

    Blank would read as rho near 0 on the diverging colour map (a family with no fitted lens,
    a predictor that failed).
    """
    for i, j in zip(*np.nonzero(np.isnan(grid)), strict=True):
        ax.text(j, i, "n/a", ha="center", va="center", fontsize=6, color="0.35")


def figure(cells: Sequence[Mapping[str, Any]], path: Path,
           lens_cells: Sequence[Mapping[str, Any]] = ()) -> Path:
    """Heat maps of the mean rho, predictors x (family, task), one panel per intervention.

    With ``lens_cells`` (the lens addendum), its rows follow, labelled ``addendum: ...``
    ("n/a" where a family has no fitted lens). Written with matplotlib's Agg backend to
    ``path`` (PNG); returns ``path``.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    prereg = load_preregistration()
    names = predictor_names(prereg)
    index = _lens_index(lens_cells)
    extra = sorted({(c["kind"], c["name"]) for c in lens_cells})
    labels = names + [f"addendum: {name}" for _, name in extra]
    heads = [f"{c['family']}\n{c['task']}" for c in cells]
    fig, axes = plt.subplots(1, len(INTERVENTIONS), figsize=(3.2 * len(INTERVENTIONS) + 3, 5),
                             sharey=True, squeeze=False)
    for ax, kind in zip(axes[0], INTERVENTIONS, strict=True):
        unit = PRIMARY_UNIT(prereg, kind)
        grid = np.full((len(labels), len(cells)), np.nan)
        for j, cell in enumerate(cells):
            view = cell["scores"].get(kind, {}).get(unit, {}).get("decided", {})
            for i, name in enumerate(names):
                grid[i, j] = view.get(name, {}).get("mean", np.nan)
            for i, (lens_kind, name) in enumerate(extra, start=len(names)):
                found = index.get((cell["family"], cell["task"], lens_kind), {})
                grid[i, j] = found.get("scores", {}).get(kind, {}).get(unit, {}).get(
                    "decided", {}).get(name, {}).get("mean", np.nan)
        image = ax.imshow(grid, vmin=-1, vmax=1, cmap="RdBu_r", aspect="auto")
        mark_missing(ax, grid)
        ax.set_title(f"{kind}\n({unit})", fontsize=9)
        ax.set_xticks(range(len(cells)), heads, fontsize=7, rotation=90)
        ax.set_yticks(range(len(labels)), labels, fontsize=8)
    fig.colorbar(image, ax=axes[0].tolist(), label="mean per-token Spearman rho")
    path = Path(path)
    fig.savefig(path, dpi=120, bbox_inches="tight")
    plt.close(fig)
    return path
