"""Join the `kairox workload --compare` reports of the old and the new silu-7b fit against every
trace into one table (fit.csv, fit.md) and one figure (fit_distances.png): per model and
statistic, the trace's value, each workload's and their distances, and per model the score
fit_silu.py minimises (the sum of the SCORED distances, windows relative).

    python docs/benchmarks/workload-fit/summarize.py bench-out/workload-fit docs/benchmarks/workload-fit

REPORTS holds one directory per model with old/ and new/ reports (compare.csv each).
"""
from __future__ import annotations

import csv
import sys
from pathlib import Path

from fit_silu import RELATIVE, SCORED

#: models in the order of the table; the first three are SiLU (fitted), Gemma is GeGLU
MODELS = ("smollm2-135m", "qwen2.5-coder-0.5b", "qwen2.5-coder-1.5b", "gemma-3-270m")
LABELS = {"smollm2-135m": "SmolLM2-135M", "qwen2.5-coder-0.5b": "Qwen2.5-Coder-0.5B",
          "qwen2.5-coder-1.5b": "Qwen2.5-Coder-1.5B", "gemma-3-270m": "Gemma-3-270M (GeGLU)"}


def read(path: Path) -> dict[str, dict[str, str]]:
    """compare.csv by metric."""
    with open(path) as f:
        return {r["metric"]: r for r in csv.DictReader(f)}


def scored(metric: str, row: dict[str, str]) -> float:
    """The distance as the fit's score counts it."""
    d = float(row["distance"])
    return d / abs(float(row["trace"])) if metric in RELATIVE else d


def main() -> None:
    reports, out = Path(sys.argv[1]), Path(sys.argv[2])
    rows, scores = [], {}
    for m in MODELS:
        old, new = read(reports / m / "old" / "compare.csv"), read(reports / m / "new" / "compare.csv")
        scores[m] = tuple(sum(scored(k, r[k]) for k in SCORED if r.get(k, {}).get("distance"))
                          for r in (old, new))
        for k, r in new.items():
            o = old[k]
            rows.append({"model": m, "metric": k, "trace": r["trace"], "workload_old": o["workload"],
                         "workload_new": r["workload"], "distance_old": o["distance"],
                         "distance_new": r["distance"], "scored": int(k in SCORED)})
    with open(out / "fit.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    for m, (o, n) in scores.items():
        print(f"{m}: score old {o:.3f} new {n:.3f}")
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    fig, axes = plt.subplots(1, len(MODELS), figsize=(16, 5.5), sharey=True, layout="constrained")
    for ax, m in zip(axes, MODELS):
        mine = [r for r in rows if r["model"] == m and r["scored"]]
        y = range(len(mine))
        ax.barh([i + 0.2 for i in y], [scored(r["metric"], {"distance": r["distance_old"], "trace": r["trace"]})
                                       for r in mine], height=0.4, label="old (default model only)")
        ax.barh([i - 0.2 for i in y], [scored(r["metric"], {"distance": r["distance_new"], "trace": r["trace"]})
                                       for r in mine], height=0.4, label="new (three SiLU models)")
        ax.set_yticks(list(y), [r["metric"] for r in mine], fontsize=8)
        ax.invert_yaxis()
        ax.set_title(f"{LABELS[m]}\nscore {scores[m][0]:.2f} -> {scores[m][1]:.2f}", fontsize=9)
        ax.set_xlabel("distance (windows: relative)")
    axes[0].legend(fontsize=8, loc="lower right")
    fig.suptitle("silu-7b vs real traces (4 x 256 steps, thresholds at 50%): distances per statistic")
    fig.savefig(out / "fit_distances.png", dpi=110)


if __name__ == "__main__":
    main()
