"""Runs of `kairox simulate`: a grid of (preset, budget, policy) simulations on one trace,
compact per-run records, the CSV reports and the bar check of BENCHMARKS.md.

Why compact records: a full :class:`~kairox_py.sim.replay.SimResult` holds (tokens x layers)
arrays; a grid of ~100 runs keeps only what reports and figures read (per-token series,
per-layer means, and the per-(step, layer) lambda/loads of the first sequence).
"""
from __future__ import annotations

import csv
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from ..balancer import BalancerConfig
from .replay import CostModel, CpuCalibration, PRESETS, SequenceData, SimConfig, simulate


@dataclass
class RunRecord:
    """What is kept of one simulation."""

    config: SimConfig
    summary: dict[str, float | str]
    per_layer: list[dict[str, float]]
    per_token: dict[str, np.ndarray]  # (T,) series, all sequences concatenated
    first_lam: np.ndarray  # (steps of the first sequence, L)
    first_margin: np.ndarray  # (steps of the first sequence, L)
    first_loads: np.ndarray
    first_cpu_rows: np.ndarray  # (steps,) summed over layers
    first_bytes: np.ndarray  # (steps,)


def run_one(data: SequenceData, cost: CostModel, cfg: SimConfig) -> RunRecord:
    r = simulate(data, cost, cfg)
    s0 = data.counts[0].shape[0]
    cpu_rows = (r.rows - r.gpu_rows).sum(axis=1)
    per_token = {
        "token_us": r.token_us,
        "cpu_us": r.cpu_us.sum(axis=1, dtype=np.float64),
        "io_us": r.io_us.sum(axis=1, dtype=np.float64),
        "io_stall_us": r.io_stall_us.sum(axis=1, dtype=np.float64),
        "cpu_stall_us": r.cpu_stall_us.sum(axis=1, dtype=np.float64),
        "hit_rate": r.gpu_rows.sum(axis=1) / np.maximum(r.rows.sum(axis=1), 1),
        "cpu_rows": cpu_rows,
        "bytes": r.loads.sum(axis=1, dtype=np.float64) * cost.group_bytes,
        "loads": r.loads.sum(axis=1, dtype=np.float64),
        "lambda": r.lam.mean(axis=1),
        "margin": r.margin.mean(axis=1),
    }
    return RunRecord(cfg, r.summary(), r.per_layer(), per_token, r.lam[:s0].copy(),
                     r.margin[:s0].copy(), r.loads[:s0].copy(), cpu_rows[:s0], per_token["bytes"][:s0])


def run_grid(data: SequenceData, cpu: CpuCalibration, presets: Sequence[str],
             budgets: Sequence[float], policies: Sequence[str], base: SimConfig,
             tick: Callable[[str], None] | None = None) -> list[RunRecord]:
    """Every (preset, budget, policy) combination; the balancer hyperparameters and the
    pipeline mode come from `base`."""
    out = []
    for preset in presets:
        cost = CostModel.build(data.trace, PRESETS[preset], cpu, data.group_size)
        for budget in budgets:
            for policy in policies:
                cfg = replace(base, preset=preset, budget=budget,
                              balancer=replace(base.balancer, policy=policy))
                out.append(run_one(data, cost, cfg))
                if tick:
                    tick(cfg.label())
    return out


# ---------------------------------------------------------------------------------------
# reports
# ---------------------------------------------------------------------------------------
SUMMARY_COLUMNS = ("preset", "budget", "policy", "mode", "tokens", "tok_s", "token_ms", "cpu_ms",
                   "io_ms", "io_stall_ms", "cpu_stall_ms", "hit_rate", "cpu_rows", "mb_moved",
                   "loads", "late_loads", "lambda", "margin", "io_bound", "cpu_bound")


def _fmt(v: object) -> str:
    if isinstance(v, float):
        return f"{v:.6g}"
    return str(v)


def write_reports(out_dir: Path, runs: Sequence[RunRecord], cost_notes: dict[str, dict]) -> list[Path]:
    """summary.csv (one row per run), per_layer.csv, per_token.csv, costs.csv."""
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = []
    p = out_dir / "summary.csv"
    with open(p, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(SUMMARY_COLUMNS)
        for r in runs:
            w.writerow([_fmt(r.summary[c]) for c in SUMMARY_COLUMNS])
    paths.append(p)
    p = out_dir / "per_layer.csv"
    with open(p, "w", newline="") as f:
        w = csv.writer(f)
        keys = list(runs[0].per_layer[0]) if runs else []
        w.writerow(["preset", "budget", "policy", "mode", *keys])
        for r in runs:
            c = r.config
            for row in r.per_layer:
                w.writerow([c.preset, c.budget, c.policy, c.mode, *[_fmt(row[k]) for k in keys]])
    paths.append(p)
    p = out_dir / "per_token.csv"
    with open(p, "w", newline="") as f:
        w = csv.writer(f)
        keys = list(runs[0].per_token) if runs else []
        w.writerow(["preset", "budget", "policy", "mode", "token", *keys])
        for r in runs:
            c = r.config
            cols = [r.per_token[k] for k in keys]
            for t in range(len(cols[0]) if cols else 0):
                w.writerow([c.preset, c.budget, c.policy, c.mode, t, *[f"{col[t]:.6g}" for col in cols]])
    paths.append(p)
    p = out_dir / "costs.csv"
    with open(p, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["preset", "constant", "value"])
        for preset, notes in cost_notes.items():
            for k, v in notes.items():
                w.writerow([preset, k, _fmt(v)])
    paths.append(p)
    return paths


def cost_notes(cost: CostModel) -> dict[str, float | str]:
    """The cost model's constants, for costs.csv and BENCHMARKS.md."""
    return {"attn_us_layer0": float(cost.attn_us[0]), "gpu_ffn_fixed_us": cost.gpu_ffn_fixed_us,
            "gpu_row_us": cost.gpu_row_us, "cpu_us_empty": cost.cpu_us_tab[0],
            "cpu_us_full_layer": cost.cpu_us_tab[-1], "crit_us": cost.crit_us,
            "group_load_us": cost.group_load_us, "group_bytes": cost.group_bytes,
            "row_bytes": cost.row_bytes, "tail_us": cost.tail_us, **cost.notes}


# ---------------------------------------------------------------------------------------
# the bar (issue 6): adaptive TAM >= every baseline; TAM moves >= 1.5x fewer bytes than
# current-step Top-K for no more CPU work
# ---------------------------------------------------------------------------------------
@dataclass(frozen=True)
class BarRow:
    preset: str
    budget: float
    tam_tok_s: float
    best_baseline: str
    best_baseline_tok_s: float
    throughput_ok: bool
    bytes_ratio: float  # topk bytes / tam_fixed bytes
    cpu_rows_tam_fixed: float
    cpu_rows_topk: float
    bytes_ok: bool


def bar_rows(runs: Sequence[RunRecord], bytes_factor: float = 1.5) -> list[BarRow]:
    by = {(r.config.preset, r.config.budget, r.config.policy): r.summary for r in runs}
    rows = []
    for preset, budget in dict.fromkeys((r.config.preset, r.config.budget) for r in runs):
        tam = by.get((preset, budget, "tam"))
        if tam is None:
            continue
        base = {p: s for (pr, b, p), s in by.items() if pr == preset and b == budget and p != "tam"}
        best = max(base, key=lambda p: float(base[p]["tok_s"])) if base else "-"
        best_tps = float(base[best]["tok_s"]) if base else 0.0
        fixed, topk = base.get("tam_fixed"), base.get("topk")
        ratio = (float(topk["mb_moved"]) / max(float(fixed["mb_moved"]), 1e-12)) if fixed and topk else float("nan")
        cpu_f = float(fixed["cpu_rows"]) if fixed else float("nan")
        cpu_t = float(topk["cpu_rows"]) if topk else float("nan")
        rows.append(BarRow(preset, budget, float(tam["tok_s"]), best, best_tps,
                           float(tam["tok_s"]) >= best_tps * (1 - 1e-9), ratio, cpu_f, cpu_t,
                           ratio >= bytes_factor and cpu_f <= cpu_t * (1 + 1e-9)))
    return rows


def bar_markdown(rows: Sequence[BarRow]) -> str:
    lines = ["| preset | budget | adaptive TAM tok/s | best baseline | its tok/s | TAM >= all | "
             "Top-K / TAM bytes | CPU rows/token TAM vs Top-K | bytes bar |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r.preset} | {r.budget:g} | {r.tam_tok_s:.1f} | {r.best_baseline} | "
                     f"{r.best_baseline_tok_s:.1f} | {'yes' if r.throughput_ok else 'NO'} | "
                     f"{r.bytes_ratio:.2f}x | {r.cpu_rows_tam_fixed:.0f} vs {r.cpu_rows_topk:.0f} | "
                     f"{'yes' if r.bytes_ok else 'NO'} |")
    return "\n".join(lines)


def default_base(balancer: BalancerConfig | None = None, **kw: object) -> SimConfig:
    return SimConfig(balancer=balancer or BalancerConfig(), **kw)  # type: ignore[arg-type]
