"""Per-layer reports of a conversion: predictor recall/precision (the paper's Figure 16)
and grouping quality, as Markdown + CSV + PNG in one directory.

matplotlib is optional (the `plot` / `test` extras): without it the PNG is skipped and
the caller is told so, the tables are always written.
"""
from __future__ import annotations

import csv
import math
from pathlib import Path

from .grouping import LayerGrouping
from .predictor import LayerPredictor


def layer_rows(predictors: list[LayerPredictor | None],
               groupings: list[LayerGrouping]) -> list[dict[str, float | int | str]]:
    rows: list[dict[str, float | int | str]] = []
    for il, (p, g) in enumerate(zip(predictors, groupings)):
        row: dict[str, float | int | str] = {"layer": il}
        if p is not None:
            row.update(rank=p.rank, recall=round(p.recall, 4), precision=round(p.precision, 4),
                       predicted_density=round(p.density, 4),
                       mask_density=round(p.target_density, 4))
        if not math.isnan(g.intra_freq):  # reordered (not --no-reorder): the kept grouping's scores
            row.update(grouping=g.method, intra_freq=round(g.intra_freq, 5),
                       intra_random=round(g.intra_random, 5))
            if not math.isnan(g.intra):  # METIS tried on this layer
                row["intra_metis"] = round(g.intra, 5)
        rows.append(row)
    return rows


def write_layer_report(directory: Path, predictors: list[LayerPredictor | None],
                       groupings: list[LayerGrouping], title: str) -> list[Path]:
    """layers.csv, layers.md and (if matplotlib is installed) predictors.png."""
    directory.mkdir(parents=True, exist_ok=True)
    rows = layer_rows(predictors, groupings)
    cols = list(dict.fromkeys(k for r in rows for k in r))
    written = []
    with open(directory / "layers.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=cols)
        w.writeheader()
        w.writerows(rows)
    written.append(directory / "layers.csv")
    md = [f"# {title}", "", "| " + " | ".join(cols) + " |", "|" + " --- |" * len(cols)]
    md += ["| " + " | ".join(str(r.get(c, "")) for c in cols) + " |" for r in rows]
    (directory / "layers.md").write_text("\n".join(md) + "\n")
    written.append(directory / "layers.md")
    png = plot_predictors(directory / "predictors.png", predictors, title)
    if png:
        written.append(png)
    return written


def plot_predictors(path: Path, predictors: list[LayerPredictor | None], title: str) -> Path | None:
    """Recall, precision and densities per layer (Figure 16 style); None without matplotlib."""
    pts = [(il, p) for il, p in enumerate(predictors) if p is not None]
    if not pts:
        return None
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    layers = [il for il, _ in pts]
    fig, ax = plt.subplots(figsize=(8, 4))
    ax.plot(layers, [p.recall for _, p in pts], "o-", label="recall")
    ax.plot(layers, [p.precision for _, p in pts], "s-", label="precision")
    ax.plot(layers, [p.density for _, p in pts], "^--", label="predicted density")
    ax.plot(layers, [p.target_density for _, p in pts], ":", label="mask density")
    ax.set_xlabel("layer")
    ax.set_ylim(0, 1.02)
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
