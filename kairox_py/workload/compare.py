"""`kairox workload --compare TRACE`: a workload's statistics next to a recorded trace's.

Three figures, each with the workload and the trace side by side (PNG; matplotlib is
optional, the CSV and Markdown are always written):

* ``fig8_compare.png``: reactivation P(active at t+d | active at t) by frequency rank and d
  (KAIROX Figure 8), and the difference;
* ``fig4_compare.png``: cold activations per step of the first sequence, three layers
  (KAIROX Figure 4), as a share of the layer's neurons so that shapes may differ;
* ``cdf_compare.png``: the frequency CDF per layer (mean) and model-wide (PowerInfer Figure 5).

Distances (``compare.csv``, ``compare.md``): for every scalar statistic the absolute
difference; for the curves the mean absolute difference of the reactivation matrices, the
largest vertical gap between the CDFs (Kolmogorov-Smirnov style) and between the
distributions of per-step cold shares.
"""
from __future__ import annotations

import csv
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .stats import Stats
from ..sim.figures import _plt  # matplotlib on the Agg backend, or None without it


@dataclass(frozen=True)
class Row:
    """One line of the comparison: a statistic of both and how far apart they are."""

    metric: str
    workload: float
    trace: float
    distance: float
    what: str


#: what each scalar means (the report's last column)
DESCRIPTIONS = {
    "active_share": "share of neurons active per step",
    "hot80_layer": "share of a layer's neurons carrying 80% of its activations",
    "hot80_model": "the same over all layers pooled",
    "window_hot": "mean run of consecutive active steps, hot neurons",
    "window_cold": "the same, cold neurons",
    "one_hit_share": "activations with no other within +-2 steps",
    "one_hit_cold": "the same, cold neurons",
    "react_cold_d1": "P(active at t+1 | active at t), cold neurons",
    "react_cold_d2": "the same at t+2",
    "react_cold_d3": "the same at t+3",
    "react_cold_max_d3+": "largest of d = 3..8",
    "react_hot_d1": "P(active at t+1 | active at t), hottest rank bin",
    "jaccard_adjacent": "Jaccard distance of adjacent steps' active sets",
    "hotset_jaccard": "Jaccard distance of different sequences' hot sets",
    "cold_mean_share": "cold activations per layer and step / neurons",
    "cold_cv": "their coefficient of variation over steps",
    "cold_peak": "largest cold count of any layer and step",
    "cold_peak_share": "the same / neurons",
    "cold_peak_typical": "median over layers of each layer's peak / neurons",
    "cold_floor_share": "5th percentile of a layer's cold counts / neurons",
    "cold_jump_share": "largest change between adjacent steps / neurons",
    "cold_lag1": "lag-1 autocorrelation of the cold counts",
    "cold_burst_len": "mean run of steps above twice the median",
    "recall": "predicted among active",
    "precision": "active among predicted",
    "predicted_share": "share of neurons predicted per step",
}


def _ks(a: np.ndarray, b: np.ndarray) -> float:
    """Largest gap between the empirical distribution functions of samples a and b."""
    a, b = np.sort(a.reshape(-1)), np.sort(b.reshape(-1))
    grid = np.concatenate([a, b])
    fa = np.searchsorted(a, grid, side="right") / max(len(a), 1)
    fb = np.searchsorted(b, grid, side="right") / max(len(b), 1)
    return float(np.abs(fa - fb).max()) if len(grid) else float("nan")


def compare(wl: Stats, tr: Stats) -> list[Row]:
    """The distances between a workload's statistics and a trace's."""
    rows = []
    sw, st = wl.summary(), tr.summary()
    for k in sw:
        if k in st:
            a, b = sw[k], st[k]
            rows.append(Row(k, a, b, abs(a - b) if np.isfinite(a) and np.isfinite(b) else float("nan"),
                            DESCRIPTIONS.get(k, "")))
    both = np.isfinite(wl.react) & np.isfinite(tr.react) if wl.react.shape == tr.react.shape else None
    if both is not None and both.any():
        rows.append(Row("react_mae", float("nan"), float("nan"),
                        float(np.abs(wl.react - tr.react)[both].mean()),
                        "mean |difference| of the Figure 8 matrices (rank bins x d)"))
    rows.append(Row("cdf_gap_layer", float("nan"), float("nan"),
                    float(np.abs(wl.cdf_layer - tr.cdf_layer).max()),
                    "largest gap between the per-layer frequency CDFs"))
    rows.append(Row("cdf_gap_model", float("nan"), float("nan"),
                    float(np.abs(wl.cdf_model - tr.cdf_model).max()),
                    "largest gap between the model-wide frequency CDFs"))
    rows.append(Row("cold_share_ks", float("nan"), float("nan"),
                    _ks(wl.cold_counts / wl.n_ff, tr.cold_counts / tr.n_ff),
                    "KS distance of the per-step cold shares (Figure 4)"))
    return rows


def _fmt(v: float) -> str:
    if not np.isfinite(v):
        return "-"
    return f"{v:.0f}" if abs(v) >= 100 else f"{v:.4f}"


def write_report(out: Path, wl: Stats, tr: Stats, rows: list[Row], wl_label: str,
                 tr_label: str) -> list[Path]:
    """compare.csv, compare.md and (with matplotlib) the three figures into `out`."""
    paths = []
    p = out / "compare.csv"
    with open(p, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["metric", "workload", "trace", "distance", "what"])
        for r in rows:
            w.writerow([r.metric, *(f"{v:.6g}" if np.isfinite(v) else "" for v in
                                    (r.workload, r.trace, r.distance)), r.what])
    paths.append(p)
    lines = ["# Workload vs trace", "",
             f"- workload: {wl_label} ({wl.n_seq} x {wl.n_steps} steps, {wl.n_layer} layers x {wl.n_ff})",
             f"- trace: {tr_label} ({tr.n_seq} x {tr.n_steps} steps, {tr.n_layer} layers x {tr.n_ff})",
             f"- cold: the coldest {wl.cold_share:.0%} of each layer's neurons by measured frequency", "",
             "| metric | workload | trace | distance | what |", "|---|---|---|---|---|"]
    lines += [f"| {r.metric} | {_fmt(r.workload)} | {_fmt(r.trace)} | {_fmt(r.distance)} | {r.what} |"
              for r in rows]
    p = out / "compare.md"
    p.write_text("\n".join(lines) + "\n")
    paths.append(p)
    plt = _plt()
    if plt is not None:
        paths += [_fig8(plt, out, wl, tr, wl_label, tr_label), _fig4(plt, out, wl, tr, wl_label, tr_label),
                  _cdf(plt, out, wl, tr, wl_label, tr_label)]
    return paths




def _fig8(plt, out: Path, wl: Stats, tr: Stats, wl_label: str, tr_label: str) -> Path:  # type: ignore[no-untyped-def]
    fig, axes = plt.subplots(1, 3, figsize=(14, 4.4), layout="constrained")
    d = wl.react.shape[1]
    for ax, mat, title in ((axes[0], wl.react, f"workload: {wl_label}"), (axes[1], tr.react, f"trace: {tr_label}")):
        im = ax.imshow(mat, aspect="auto", cmap="viridis", vmin=0, vmax=1, extent=(0.5, d + 0.5, 100, 0))
        ax.set_title(title, fontsize=9)
        ax.set_xlabel("decoding-step offset d")
    axes[0].set_ylabel("frequency rank (percentile, hot first)")
    fig.colorbar(im, ax=axes[1], label="P(active at t+d | active at t)")
    if wl.react.shape == tr.react.shape:
        im2 = axes[2].imshow(wl.react - tr.react, aspect="auto", cmap="coolwarm", vmin=-0.5, vmax=0.5,
                             extent=(0.5, d + 0.5, 100, 0))
        fig.colorbar(im2, ax=axes[2], label="workload - trace")
    axes[2].set_title("difference", fontsize=9)
    axes[2].set_xlabel("decoding-step offset d")
    fig.suptitle("Reactivation probability (KAIROX Figure 8)", fontsize=10)
    p = out / "fig8_compare.png"
    fig.savefig(p, dpi=110)
    plt.close(fig)
    return p


def _layers(n_layer: int) -> list[int]:
    return sorted({0, n_layer // 2, n_layer - 1})


def _fig4(plt, out: Path, wl: Stats, tr: Stats, wl_label: str, tr_label: str) -> Path:  # type: ignore[no-untyped-def]
    fig, axes = plt.subplots(1, 2, figsize=(12, 3.8), sharey=True)
    for ax, st, title in ((axes[0], wl, f"workload: {wl_label}"), (axes[1], tr, f"trace: {tr_label}")):
        for il in _layers(st.n_layer):
            ax.plot(st.cold_counts[0, :, il] / st.n_ff, lw=1, label=f"layer {il}")
        ax.set_title(title, fontsize=9)
        ax.set_xlabel("decode step (first sequence)")
        ax.legend(fontsize=7)
    axes[0].set_ylabel(f"cold activations / neurons (coldest {wl.cold_share:.0%})")
    fig.suptitle("Cold-neuron activations per step (KAIROX Figure 4)", fontsize=10)
    fig.tight_layout()
    p = out / "fig4_compare.png"
    fig.savefig(p, dpi=110)
    plt.close(fig)
    return p


def _cdf(plt, out: Path, wl: Stats, tr: Stats, wl_label: str, tr_label: str) -> Path:  # type: ignore[no-untyped-def]
    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    for ax, attr, title in ((axes[0], "cdf_layer", "(a) per layer (mean)"), (axes[1], "cdf_model", "(b) whole model")):
        ax.plot(wl.cdf_x, getattr(wl, attr), label=f"workload: {wl_label}")
        ax.plot(tr.cdf_x, getattr(tr, attr), label=f"trace: {tr_label}")
        ax.axhline(0.8, color="grey", lw=0.5, ls=":")
        ax.set_xlabel("share of neurons (hot first)")
        ax.set_ylabel("share of activations")
        ax.set_title(title, fontsize=9)
        ax.legend(fontsize=7)
    fig.suptitle("Frequency CDF (PowerInfer Figure 5)", fontsize=10)
    fig.tight_layout()
    p = out / "cdf_compare.png"
    fig.savefig(p, dpi=110)
    plt.close(fig)
    return p
