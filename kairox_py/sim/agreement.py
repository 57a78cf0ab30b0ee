"""The hybrid runtime's cache counts next to the simulator's replay of the same masks.

Why: the simulator is how policies are compared without a GPU, so it must predict what the
real runtime does. Both sides run the same C++ balancer on the same per-step masks; this module
replays a trace with the runtime's per-layer slot counts (deterministic: nothing adapts, no
timing feedback; layer 0 decided as the runtime decides it, see `layer0_source`) and sets the
runtime's reload volume and hit rates beside the simulator's. `scripts/hybrid_vs_sim.py` feeds
it a real model's recorded masks, `scripts/workload_vs_sim.py` a workload a synthetic model ran.
"""
from __future__ import annotations

import csv
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from rich.table import Table

from ..balancer import POLICIES as BALANCER_POLICIES
from ..balancer import BalancerConfig
from ..hybrid import POLICIES
from ..hybrid import HybridLayerStats
from .replay import PRESETS, CpuCalibration, CostModel, SequenceData, SimConfig, simulate

#: the balancer enum -> the simulator's policy name
BALANCER_NAME = {v: k for k, v in BALANCER_POLICIES.items()}
#: relative difference allowed between runtime and simulator
TOLERANCE = 0.10


@dataclass
class RuntimeCounts:
    """Per (budget share, policy): the runtime's per-layer totals [loads, bytes reloaded,
    active pairs, active pairs computed from the cache, steps] summed over sequences, and the
    per-layer slot counts it chose."""

    totals: dict[tuple[float, str], np.ndarray] = field(default_factory=dict)
    slots: dict[float, tuple[int, ...]] = field(default_factory=dict)

    def add(self, share: float, policy: str, stats: Sequence[HybridLayerStats]) -> None:
        rec = np.array([[x.loads, x.bytes_reloaded, x.active, x.active_dev, x.steps] for x in stats],
                       dtype=np.float64)
        self.totals[(share, policy)] = self.totals.get((share, policy), 0) + rec
        self.slots[share] = tuple(x.n_slots for x in stats)


def layer0_source(slots: Sequence[int], n_groups: int) -> str:
    """Where the runtime's layer-0 decisions come from: while layer 0 and the last layer both
    split between device and CPU, layer 0's step for a token runs during the last layer of the
    token before, from that token's pattern (the simulator's "prefetch"); otherwise layer 0
    plans at its own step ("current")."""
    def split(n: int) -> bool:
        return 0 < n < n_groups
    return "prefetch" if split(slots[0]) and split(slots[-1]) else "current"


def rel_diff(a: float, b: float) -> float:
    return abs(a - b) / abs(b) if b else (0.0 if a == b else math.inf)


def compare(data: SequenceData, cpu: CpuCalibration, counts: RuntimeCounts, shares: Sequence[float],
            policies: Sequence[str], drop_first_step: bool) -> tuple[list[dict], list[dict]]:  # type: ignore[type-arg]
    """Replay `data` for every (share, policy) the runtime ran; returns the summary rows and the
    per-layer rows. drop_first_step: each sequence's step 0 was a prefill the runtime's counts
    leave out (its statistics were reset after it)."""
    trace = data.trace
    cost = CostModel.build(trace, PRESETS["pc-low"], cpu, data.group_size)
    rows: list[dict] = []  # type: ignore[type-arg]
    per_layer: list[dict] = []  # type: ignore[type-arg]
    for share in shares:
        slots = counts.slots[share]
        cached = np.asarray(slots) > 0
        for pol in policies:
            fixed = BalancerConfig(policy=BALANCER_NAME[POLICIES[pol]])
            res = simulate(data, cost, SimConfig(budget=share, balancer=fixed, deadband_us=math.inf, slots=slots,
                                                 layer0=layer0_source(slots, trace.n_ff // data.group_size)))
            keep = np.ones(res.n_tokens, dtype=bool)
            if drop_first_step:
                keep[:: trace.n_steps] = False
            s_loads, s_rows, s_gpu = res.loads[keep], res.rows[keep], res.gpu_rows[keep]
            h = counts.totals[(share, pol)].copy()
            # a layer holding every group runs its FFN on the device alone: no plan, no
            # counters, every active neuron served by the cache; its active pairs are the
            # workload's, so they are taken from the replay
            full = (np.asarray(slots) == trace.n_ff // data.group_size) & (h[:, 4] == 0)
            h[full, 2] = h[full, 3] = s_rows[:, full].sum(axis=0)
            n_dec = float(h[:, 4].max())
            h_bytes = h[:, 1].sum() / n_dec if n_dec else 0.0
            s_bytes = float(s_loads.sum()) * cost.group_bytes / keep.sum()
            h_hit = h[:, 3] / np.maximum(h[:, 2], 1)
            s_hit = s_gpu.sum(axis=0) / np.maximum(s_rows.sum(axis=0), 1)
            hit_rel = [rel_diff(x, y) for x, y, n in zip(h_hit, s_hit, slots) if n > 0]
            rows.append({"budget_share": share, "policy": pol, "slots": int(sum(slots)),
                         "standin_mb_per_step": h_bytes / 1e6, "sim_mb_per_step": s_bytes / 1e6,
                         "reload_rel_diff": rel_diff(h_bytes, s_bytes),
                         # over the layers that have slots (a layer without any is not planned,
                         # and its stats stay empty)
                         "standin_hit": float(h[cached, 3].sum() / max(h[cached, 2].sum(), 1)),
                         "sim_hit": float(s_gpu[:, cached].sum() / max(s_rows[:, cached].sum(), 1)),
                         "max_layer_hit_rel_diff": max(hit_rel) if hit_rel else 0.0})
            for il in range(trace.n_layer):
                per_layer.append({"budget_share": share, "policy": pol, "layer": il, "slots": slots[il],
                                  "standin_loads_per_step": h[il, 0] / n_dec if n_dec else 0.0,
                                  "sim_loads_per_step": float(s_loads[:, il].sum()) / keep.sum(),
                                  "standin_hit": h_hit[il], "sim_hit": s_hit[il]})
    return rows, per_layer


def within(row: dict) -> bool:  # type: ignore[type-arg]
    """Reload volume and every cached layer's hit rate within TOLERANCE of the simulator's."""
    return row["reload_rel_diff"] <= TOLERANCE and row["max_layer_hit_rel_diff"] <= TOLERANCE


def table(rows: Sequence[dict], title: str) -> Table:  # type: ignore[type-arg]
    tab = Table(title=title)
    for c in ("budget", "policy", "slots", "MB/step stand-in", "MB/step sim", "diff", "hit stand-in",
              "hit sim", "worst layer hit diff", f"within {TOLERANCE:.0%}"):
        tab.add_column(c, justify="right")
    for r in rows:
        tab.add_row(f"{r['budget_share']:g}", r["policy"], str(r["slots"]), f"{r['standin_mb_per_step']:.3f}",
                    f"{r['sim_mb_per_step']:.3f}", f"{100 * r['reload_rel_diff']:.1f}%", f"{r['standin_hit']:.3f}",
                    f"{r['sim_hit']:.3f}", f"{100 * r['max_layer_hit_rel_diff']:.1f}%", "yes" if within(r) else "NO")
    return tab


def write(out: Path, rows: Sequence[dict], per_layer: Sequence[dict], header: str) -> list[Path]:  # type: ignore[type-arg]
    """summary.csv, per_layer.csv and summary.md (header first) under out."""
    paths = [out / "summary.csv", out / "per_layer.csv", out / "summary.md"]
    for path, recs in zip(paths, (rows, per_layer)):
        with open(path, "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=list(recs[0]))
            w.writeheader()
            w.writerows(recs)
    lines = [header, "", "| budget | policy | slots | MB/step stand-in | MB/step sim | diff | hit stand-in | "
             "hit sim | worst layer hit diff | within |", "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['budget_share']:g} | {r['policy']} | {r['slots']} | {r['standin_mb_per_step']:.3f} | "
                     f"{r['sim_mb_per_step']:.3f} | {100 * r['reload_rel_diff']:.1f}% | {r['standin_hit']:.3f} | "
                     f"{r['sim_hit']:.3f} | {100 * r['max_layer_hit_rel_diff']:.1f}% | "
                     f"{'yes' if within(r) else 'NO'} |")
    paths[2].write_text("\n".join(lines) + "\n")
    return paths
