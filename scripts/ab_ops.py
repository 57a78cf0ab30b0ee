#!/usr/bin/env python3
"""Side by side medians of two sets of `test-kairox-ops perf -o run.csv` runs (an A/B).

This VM's memory speed drifts between processes, so an A/B of a library change alternates the
two builds process by process and compares, per cell, the medians of each process's speedup
over the dense calls timed in that same process (never raw times across processes):

    for i in $(seq 12); do for v in A B; do
        /tmp/tko-$v perf -t 2 --types q4_0 --shapes 576x1536 --densities 0.9,1.0 -o ab-$v-$i.csv
    done; done
    python3 scripts/ab_ops.py 'ab-A-*.csv' 'ab-B-*.csv'

Output: one line per cell (op, type, shape, density) present on both sides: median speedup
[min-max over processes] of A and of B, and the median sparse microseconds of each.
"""
from __future__ import annotations

import argparse
import csv
import glob
import statistics
import sys
from collections import defaultdict

Cell = tuple[str, str, str, str]


def load(pattern: str) -> dict[Cell, list[tuple[float, float]]]:
    files = sorted(glob.glob(pattern))
    if not files:
        sys.exit(f"ab_ops.py: no file matches {pattern!r}")
    cells: dict[Cell, list[tuple[float, float]]] = defaultdict(list)
    for f in files:
        with open(f, newline="") as fh:
            for r in csv.DictReader(fh):
                key = (r["op"], r["type"], f"{r['k']}x{r['n']}", r["density"])
                cells[key].append((float(r["speedup"]), float(r["sparse_us"])))
    return cells


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("a", help="glob of side A's CSVs (quote it)")
    ap.add_argument("b", help="glob of side B's CSVs")
    args = ap.parse_args()
    a, b = load(args.a), load(args.b)

    def fmt(v: list[float]) -> str:
        return f"{statistics.median(v):.3f} [{min(v):.2f}-{max(v):.2f}]"

    print(f"{'op':15} {'type':5} {'shape':10} {'dens':5} | {'A speedup':>22} | {'B speedup':>22} | A us -> B us")
    for key, va in a.items():
        vb = b.get(key)
        if not vb:
            continue
        ua = statistics.median(x[1] for x in va)
        ub = statistics.median(x[1] for x in vb)
        print(f"{key[0]:15} {key[1]:5} {key[2]:10} {key[3]:5} | {fmt([x[0] for x in va]):>22} | "
              f"{fmt([x[0] for x in vb]):>22} | {ua:.1f} -> {ub:.1f}")


if __name__ == "__main__":
    main()
