"""The balancer's bar on synthetic workloads (issue 34): per workload preset, seed, PC preset
and budget, adaptive TAM against every other policy.

Why a module of its own: `scripts/workload_sweep.py` runs the grid, but the bar's rules (what
passes, with which tolerance) are a claim of BENCHMARKS.md and are tested on their own here,
without generating a 7B workload.

The rules:

* ``relu-7b`` (the regime TAM is built for): adaptive TAM's simulated throughput >= every
  other policy's, and Top-K moves >= 1.5x the bytes adaptive TAM moves;
* ``silu-7b`` (dense activity, little locality): adaptive TAM within 2% of the best policy.
"""
from __future__ import annotations

import csv
import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class BarRule:
    """What adaptive TAM must reach on one workload preset."""

    tolerance: float  # TAM's throughput may fall this share below the best other policy's
    bytes_factor: float | None  # Top-K must move at least this many times TAM's bytes (None: no check)


#: the issue's bar per workload preset
RULES: dict[str, BarRule] = {"relu-7b": BarRule(0.0, 1.5), "silu-7b": BarRule(0.02, None)}
#: budgets the bar is checked at
BAR_BUDGETS = (0.25, 0.5, 0.75)


@dataclass(frozen=True)
class BarCell:
    """One (workload, seed, PC preset, budget) cell of the bar."""

    workload: str
    seed: int
    held_out: bool  # a seed outside the ones the sweep's defaults name
    preset: str
    budget: float
    tam_tok_s: float
    best_other: str
    best_other_tok_s: float
    tam_vs_best: float  # TAM's throughput / the best other policy's
    tam_mb: float  # MB moved per token, adaptive TAM
    topk_mb: float
    topk_vs_tam_bytes: float  # Top-K's bytes / TAM's (inf when TAM moves none)
    throughput_ok: bool
    bytes_ok: bool | None  # None: this workload's rule has no bytes check
    ok: bool


def bar_cells(rows: Sequence[Mapping[str, Any]], rules: Mapping[str, BarRule] = RULES,
              budgets: Sequence[float] = BAR_BUDGETS) -> list[BarCell]:
    """The bar's cells from summary rows (one per simulation: `workload`, `seed`, `held_out`
    and the keys of :meth:`kairox_py.sim.replay.SimResult.summary`). Workloads without a rule
    and cells without an adaptive TAM run are skipped."""
    by: dict[tuple[str, int, bool, str, float], dict[str, Mapping[str, Any]]] = {}
    for r in rows:
        key = (str(r["workload"]), int(r["seed"]), bool(r["held_out"]), str(r["preset"]),
               float(r["budget"]))
        by.setdefault(key, {})[str(r["policy"])] = r
    cells = []
    for (wl, seed, held, preset, budget), pol in by.items():
        rule = rules.get(wl)
        if rule is None or "tam" not in pol or not any(abs(budget - b) < 1e-9 for b in budgets):
            continue
        others = {p: float(s["tok_s"]) for p, s in pol.items() if p != "tam"}
        if not others:
            continue
        best = max(others, key=lambda p: others[p])
        tam = float(pol["tam"]["tok_s"])
        ok_t = tam >= others[best] * (1.0 - rule.tolerance) * (1.0 - 1e-9)
        tam_mb = float(pol["tam"]["mb_moved"])
        topk_mb = float(pol["topk"]["mb_moved"]) if "topk" in pol else math.nan
        ratio = topk_mb / tam_mb if tam_mb > 0 else (math.inf if topk_mb > 0 else math.nan)
        ok_b = None if rule.bytes_factor is None else bool(ratio >= rule.bytes_factor)
        cells.append(BarCell(wl, seed, held, preset, budget, tam, best, others[best],
                             tam / others[best] if others[best] > 0 else math.inf, tam_mb, topk_mb,
                             ratio, ok_t, ok_b, ok_t and ok_b is not False))
    return cells


def cells_markdown(cells: Sequence[BarCell]) -> str:
    """The bar as a Markdown table, one row per cell."""
    lines = ["| workload | seed | PC | budget | adaptive TAM tok/s | best other | its tok/s | TAM / best | "
             "Top-K / TAM bytes | pass |", "|---|---|---|---|---|---|---|---|---|---|"]
    for c in cells:
        seed = f"{c.seed}{' (held out)' if c.held_out else ''}"
        ratio = "-" if c.bytes_ok is None else f"{c.topk_vs_tam_bytes:.1f}x"
        lines.append(f"| {c.workload} | {seed} | {c.preset} | {c.budget:g} | {c.tam_tok_s:.2f} | "
                     f"{c.best_other} | {c.best_other_tok_s:.2f} | {c.tam_vs_best:.4f} | {ratio} | "
                     f"{'yes' if c.ok else 'NO'} |")
    return "\n".join(lines)


def write_cells_csv(path: Path, cells: Sequence[BarCell]) -> Path:
    """The bar's cells as CSV (one row each)."""
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow([fl.name for fl in fields(BarCell)])
        for c in cells:
            w.writerow([f"{v:.6g}" if isinstance(v, float) else v for v in asdict(c).values()])
    return path
