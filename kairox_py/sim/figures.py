"""Figures of `kairox simulate --figures` (PNG + CSV each), after the KAIROX paper:

* fig8  reactivation probability P(active at t+d | active at t) by offset d and neuron
        (or group) frequency rank, from the trace itself;
* fig5  CPU work and PCIe load per step, static placement vs LRU, two budgets;
* fig10 CPU time, I/O time (normalised to Top-K) and throughput: Top-K, TAM, adaptive TAM;
* fig11 adaptive TAM's swap margin (and lambda) over the decode steps of one sequence
        (layers 0, L/2, L-1) and reloads;
* fig13 throughput against the VRAM budget for every policy.

matplotlib is optional (the `plot` extra): without it only the CSVs are written.
"""
from __future__ import annotations

import csv
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from .report import RunRecord
from .traces import Trace

POLICY_LABELS = {"static": "static (PowerInfer)", "lru": "LRU", "lfu": "LFU",
                 "topk": "Top-K (Q-Infer-like)", "eager": "eager (Neuralink-like)",
                 "tam_fixed": "TAM (fixed lambda)", "tam_lambda": "TAM (adaptive lambda)",
                 "tam": "adaptive TAM"}


def _plt():  # type: ignore[no-untyped-def]
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    return plt


def _write_csv(path: Path, header: Sequence[str], rows: Sequence[Sequence[object]]) -> Path:
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(header)
        for r in rows:
            w.writerow([f"{v:.6g}" if isinstance(v, float) else v for v in r])
    return path


# ---------------------------------------------------------------------------------------
# fig 8: activation locality
# ---------------------------------------------------------------------------------------
def reactivation(trace: Trace, kind: str = "active", group_size: int | None = None,
                 max_delta: int = 8, n_bins: int = 32) -> tuple[np.ndarray, np.ndarray]:
    """P(A_{t+d} | A_t) for d = 1..max_delta, by frequency rank (n_bins bins, hot first),
    pooled over layers and sequences; returns (matrix [n_bins, max_delta], P(A) per bin).

    Neuron granularity with group_size None. With a group size, a group counts as active at a
    step when more of its neurons fire than on its average step (at this density nearly every
    group has some active neuron at every step, so "any neuron" carries no information)."""
    L = trace.n_layer
    n_units = trace.n_ff if group_size is None else trace.n_ff // group_size
    hits = np.zeros((L, n_units, max_delta))  # active at t and at t + d
    first = np.zeros((L, n_units, max_delta))  # active at t, for t with a t + d in the sequence
    on = np.zeros((L, n_units))
    steps = 0
    for s in range(trace.n_seq):
        m = trace.mask(s, kind)  # (S, L, n_ff)
        if group_size is not None:
            c = m.reshape(m.shape[0], L, n_units, group_size).mean(axis=3)
            m = c > c.mean(axis=0, keepdims=True)
        m = m.astype(np.float32)
        on += m.sum(axis=0)
        steps += m.shape[0]
        cs = np.cumsum(m, axis=0)
        for d in range(1, max_delta + 1):
            hits[:, :, d - 1] += (m[:-d] * m[d:]).sum(axis=0)
            first[:, :, d - 1] += cs[-d - 1]
    freq = on / max(steps, 1)
    with np.errstate(invalid="ignore", divide="ignore"):
        cond = np.where(first > 0, hits / first, np.nan)
    # rank within each layer, hot first, then pool layers by rank bin
    order = np.argsort(-freq, axis=1, kind="stable")
    bins = np.minimum((np.arange(n_units) * n_bins) // n_units, n_bins - 1)
    mat = np.zeros((n_bins, max_delta))
    pa = np.zeros(n_bins)
    for b in range(n_bins):
        sel = order[:, bins == b]  # (L, k) unit indices of this rank bin in each layer
        rows = np.take_along_axis(cond, sel[:, :, None].repeat(max_delta, axis=2), axis=1)
        mat[b] = np.nanmean(rows.reshape(-1, max_delta), axis=0)
        pa[b] = np.take_along_axis(freq, sel, axis=1).mean()
    return mat, pa


def fig8(trace: Trace, out: Path, group_size: int) -> list[Path]:
    n_mat, n_pa = reactivation(trace, "active", None)
    g_mat, g_pa = reactivation(trace, "active", group_size)
    paths = [_write_csv(out / "fig8_reactivation.csv",
                        ["granularity", "rank_bin", "p_active", *[f"d{d}" for d in range(1, 9)]],
                        [["neuron", b, float(n_pa[b]), *map(float, n_mat[b])] for b in range(len(n_pa))]
                        + [["group", b, float(g_pa[b]), *map(float, g_mat[b])] for b in range(len(g_pa))])]
    plt = _plt()
    if plt:
        fig, axes = plt.subplots(1, 2, figsize=(9, 4.2))
        for ax, mat, title in ((axes[0], n_mat, "(a) neuron granularity"),
                               (axes[1], g_mat, f"(b) group granularity (GS={group_size})")):
            im = ax.imshow(mat, aspect="auto", cmap="viridis", vmin=0, vmax=1,
                           extent=(0.5, 8.5, 100, 0))
            ax.set_xlabel("decoding-step offset d")
            ax.set_ylabel("frequency rank (percentile, hot first)")
            ax.set_title(title, fontsize=10)
        fig.colorbar(im, ax=axes, label="P(active at t+d | active at t)")
        fig.suptitle(f"Reactivation probability, {trace.meta.n_seq} x {trace.n_steps}-step "
                     f"decode traces ({Path(trace.meta.model_path).name})", fontsize=10)
        p = out / "fig8_reactivation.png"
        fig.savefig(p, dpi=120)
        plt.close(fig)
        paths.append(p)
    return paths


# ---------------------------------------------------------------------------------------
# figures from simulation runs
# ---------------------------------------------------------------------------------------
def _find(runs: Sequence[RunRecord], preset: str, budget: float, policy: str) -> RunRecord | None:
    for r in runs:
        c = r.config
        if c.preset == preset and abs(c.budget - budget) < 1e-9 and c.policy == policy:
            return r
    return None


def fig5(runs: Sequence[RunRecord], out: Path, preset: str, budgets: Sequence[float]) -> list[Path]:
    rows, series = [], []
    for b in budgets:
        for pol in ("static", "lru"):
            r = _find(runs, preset, b, pol)
            if r is None:
                continue
            series.append((b, pol, r))
            for t, (cr, by) in enumerate(zip(r.first_cpu_rows, r.first_bytes)):
                rows.append([b, pol, t, float(cr), float(by)])
    paths = [_write_csv(out / "fig5_static_vs_lru.csv",
                        ["budget", "policy", "step", "cpu_rows", "pcie_bytes"], rows)]
    plt = _plt()
    if plt and series:
        fig, axes = plt.subplots(1, 2, figsize=(10, 3.8))
        colors = {b: f"C{i}" for i, b in enumerate(budgets)}
        for b, pol, r in series:
            ls = "-" if pol == "static" else "--"
            lab = f"{pol}, budget {b:g}"
            axes[0].plot(r.first_cpu_rows, ls, color=colors[b], label=lab, lw=1)
            axes[1].plot(r.first_bytes / 1e6, ls, color=colors[b], label=lab, lw=1)
        axes[0].set_ylabel("CPU work (active rows on the CPU)")
        axes[1].set_ylabel("PCIe load (MB per step)")
        for ax in axes:
            ax.set_xlabel("decode step")
            ax.legend(fontsize=7)
        fig.suptitle(f"Static placement (solid) vs LRU (dashed), {preset}, first sequence", fontsize=10)
        fig.tight_layout()
        p = out / "fig5_static_vs_lru.png"
        fig.savefig(p, dpi=120)
        plt.close(fig)
        paths.append(p)
    return paths


def fig10(runs: Sequence[RunRecord], out: Path, presets: Sequence[str], budget: float) -> list[Path]:
    pols = ("topk", "tam_fixed", "tam")
    rows = []
    for preset in presets:
        ref = _find(runs, preset, budget, "topk")
        for pol in pols:
            r = _find(runs, preset, budget, pol)
            if r is None or ref is None:
                continue
            s, s0 = r.summary, ref.summary
            rows.append([preset, budget, pol, float(s["cpu_ms"]), float(s["io_ms"]), float(s["tok_s"]),
                         float(s["cpu_ms"]) / max(float(s0["cpu_ms"]), 1e-12),
                         float(s["io_ms"]) / max(float(s0["io_ms"]), 1e-12)])
    paths = [_write_csv(out / "fig10_topk_tam.csv",
                        ["preset", "budget", "policy", "cpu_ms", "io_ms", "tok_s", "cpu_norm", "io_norm"],
                        rows)]
    plt = _plt()
    if plt and rows:
        fig, axes = plt.subplots(1, len(presets), figsize=(5 * len(presets), 3.8), squeeze=False)
        for ax, preset in zip(axes[0], presets):
            sub = [r for r in rows if r[0] == preset]
            x = np.arange(len(sub))
            ax.bar(x - 0.2, [r[6] for r in sub], 0.4, label="CPU time (norm.)")
            ax.bar(x + 0.2, [r[7] for r in sub], 0.4, label="I/O time (norm.)")
            ax.set_xticks(x, [POLICY_LABELS[r[2]].split(" (")[0] if r[2] != "tam_fixed" else "TAM"
                              for r in sub])
            ax.set_ylabel("normalised to Top-K")
            ax2 = ax.twinx()
            ax2.plot(x, [r[5] for r in sub], "ko-", label="throughput")
            ax2.set_ylabel("tokens/s")
            lo = min(r[5] for r in sub)
            ax2.set_ylim(lo * 0.95, max(r[5] for r in sub) * 1.02)
            ax.set_title(f"{preset}, budget {budget:g}", fontsize=10)
            ax.legend(fontsize=7, loc="upper left")
        fig.tight_layout()
        p = out / "fig10_topk_tam.png"
        fig.savefig(p, dpi=120)
        plt.close(fig)
        paths.append(p)
    return paths


def fig11(runs: Sequence[RunRecord], out: Path, preset: str, budget: float) -> list[Path]:
    """The paper's Figure 11 (lambda over time) for what adaptive TAM adapts: its swap margin;
    lambda is in the CSV too (constant but for tam_lambda)."""
    r = _find(runs, preset, budget, "tam")
    if r is None:
        return []
    L = r.first_lam.shape[1]
    layers = sorted({0, L // 2, L - 1})
    rows = [[t, il, float(r.first_lam[t, il]), float(r.first_margin[t, il]), float(r.first_loads[t, il])]
            for t in range(r.first_lam.shape[0]) for il in layers]
    paths = [_write_csv(out / "fig11_adaptation.csv", ["step", "layer", "lambda", "margin", "reloads"], rows)]
    plt = _plt()
    if plt:
        fig, axes = plt.subplots(1, 2, figsize=(10, 3.6))
        for il in layers:
            axes[0].plot(r.first_margin[:, il], label=f"layer {il}", lw=1)
            axes[1].plot(r.first_loads[:, il], label=f"layer {il}", lw=1)
        axes[0].set_ylabel("swap margin (0: none)")
        axes[1].set_ylabel("reload I/O tasks (groups) per step")
        for ax in axes:
            ax.set_xlabel("decode step")
            ax.legend(fontsize=7)
        fig.suptitle(f"Adaptive TAM, {preset}, budget {budget:g}, first sequence "
                     f"(lambda {float(r.first_lam.mean()):.2f})", fontsize=10)
        fig.tight_layout()
        p = out / "fig11_adaptation.png"
        fig.savefig(p, dpi=120)
        plt.close(fig)
        paths.append(p)
    return paths


def fig13(runs: Sequence[RunRecord], out: Path, presets: Sequence[str]) -> list[Path]:
    rows = [[r.config.preset, r.config.budget, r.config.policy, float(r.summary["tok_s"])]
            for r in runs if r.config.preset in presets]
    paths = [_write_csv(out / "fig13_budget.csv", ["preset", "budget", "policy", "tok_s"], rows)]
    plt = _plt()
    if plt and rows:
        fig, axes = plt.subplots(2, len(presets), figsize=(5.5 * len(presets), 7), squeeze=False,
                                 sharex=True, gridspec_kw={"height_ratios": [3, 2]})
        for col, preset in enumerate(presets):
            ax, rel = axes[0][col], axes[1][col]
            static = dict((r[1], r[3]) for r in rows if r[0] == preset and r[2] == "static")
            for i, pol in enumerate(POLICY_LABELS):
                pts = sorted((r[1], r[3]) for r in rows if r[0] == preset and r[2] == pol)
                if not pts:
                    continue
                x, y = zip(*pts)
                style = dict(lw=2 if pol == "tam" else 1, color=f"C{i}", label=POLICY_LABELS[pol])
                mark = "o-" if pol == "tam" else ".-"
                ax.plot(x, y, mark, **style)
                if static:
                    rel.plot(x, [100 * (v / static[b] - 1) if b in static else np.nan
                                 for b, v in pts], mark, **style)
            ax.set_ylabel("simulated decode tokens/s")
            ax.set_title(preset, fontsize=10)
            ax.legend(fontsize=7)
            rel.axhline(0, color="grey", lw=0.5)
            rel.set_ylabel("vs static placement (%)")
            rel.set_xlabel("VRAM budget (share of FFN groups held)")
        fig.tight_layout()
        p = out / "fig13_budget.png"
        fig.savefig(p, dpi=120)
        plt.close(fig)
        paths.append(p)
    return paths
