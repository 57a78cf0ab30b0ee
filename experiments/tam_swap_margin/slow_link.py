#!/usr/bin/env python3
"""What adaptive TAM's swap margin buys when reloads are the bottleneck.

    python3 experiments/tam_swap_margin/slow_link.py OUT.csv [--presets relu-7b,silu-7b]
        [--seeds 0] [--slowdowns 1,2,4,8] [--budgets 0.25,0.5,0.75] [--pc pc-low]
        [--margin-min 0.01] [--margin-up 1.5]

Why: on the paper's PCs the workloads of `kairox workload` leave almost every layer-step
CPU-bound, so adaptive TAM's margin stays at 0 and the policy equals TAM at a fixed lambda
(docs/benchmarks/sim-workloads/README.md). The margin exists for the other regime: a link
too slow for the loads the scores call for. This replays the same workloads through the
simulator with the PC's PCIe bandwidth divided by each --slowdowns factor, for adaptive TAM,
TAM at the same fixed lambda, the paper's adaptive-lambda TAM, static placement and LFU; one
CSV row per (workload, seed, slowdown, budget, policy).
"""
from __future__ import annotations

import argparse
import csv
import dataclasses
import shutil
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from kairox_py.balancer import BalancerConfig  # noqa: E402
from kairox_py.sim.replay import PRESETS, CostModel, SequenceData, SimConfig, simulate, trace_cpu  # noqa: E402
from kairox_py.workload import resolve, write_workload  # noqa: E402

POLICIES = ("tam", "tam_fixed", "tam_lambda", "static", "lfu")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out", help="CSV to write")
    ap.add_argument("--presets", default="relu-7b,silu-7b")
    ap.add_argument("--seeds", default="0")
    ap.add_argument("--slowdowns", default="1,2,4,8", help="PCIe bandwidth divisors")
    ap.add_argument("--budgets", default="0.25,0.5,0.75")
    ap.add_argument("--pc", default="pc-low", help="hardware preset whose link is slowed")
    ap.add_argument("--margin-min", type=float, default=BalancerConfig.margin_min,
                    help="adaptive TAM's smallest non-zero swap margin")
    ap.add_argument("--margin-up", type=float, default=BalancerConfig.margin_up,
                    help="adaptive TAM's margin factor per I/O-bound step")
    args = ap.parse_args()
    pc = PRESETS[args.pc]
    with open(args.out, "w", newline="") as f, tempfile.TemporaryDirectory() as tmp:
        w = csv.writer(f)
        w.writerow(["workload", "seed", "slowdown", "budget", "policy", "tok_s", "mb_moved", "hit_rate",
                    "io_bound", "margin", "lambda"])
        for preset in args.presets.split(","):
            for seed in (int(s) for s in args.seeds.split(",")):
                d = Path(tmp) / f"{preset}-{seed}"
                trace = write_workload(resolve(preset, seed=seed), d)
                data = SequenceData(trace, "predicted", trace.meta.group_size)
                for slow in (float(v) for v in args.slowdowns.split(",")):
                    link = dataclasses.replace(pc, pcie_table=tuple((g, bw / slow) for g, bw in pc.pcie_table))
                    cost = CostModel.build(trace, link, trace_cpu(trace), data.group_size)
                    for b in (float(v) for v in args.budgets.split(",")):
                        for pol in POLICIES:
                            bal = BalancerConfig(policy=pol, margin_min=args.margin_min, margin_up=args.margin_up)
                            s = simulate(data, cost, SimConfig(preset=args.pc, budget=b, balancer=bal)).summary()
                            w.writerow([preset, seed, f"{slow:g}", f"{b:g}", pol, f"{s['tok_s']:.4f}",
                                        f"{s['mb_moved']:.2f}", f"{s['hit_rate']:.4f}", f"{s['io_bound']:.4f}",
                                        f"{s['margin']:.4f}", f"{s['lambda']:.3f}"])
                            f.flush()
                        print(f"{preset} seed {seed} link /{slow:g} budget {b:g}", flush=True)
                shutil.rmtree(d)


if __name__ == "__main__":
    main()
