#!/usr/bin/env python3
"""Median table of several `test-kairox-ops perf -o run.csv` runs.

This VM is noisy (the same dense call can take 2x longer a minute later), so one run says
little; each cell of the table is the median over runs, and the speedup is the median of the
per-run speedups (each measured side by side with its own dense call, never across runs).

    python3 scripts/ops_median.py ops-run1.csv ops-run2.csv ops-run3.csv -o docs/benchmarks/ops/ops
    # writes ops.csv and ops.md (the Markdown table in BENCHMARKS.md)
"""
from __future__ import annotations

import argparse
import csv
import statistics
import sys
from collections import defaultdict
from pathlib import Path

OP_NAMES = {"mul_mat_sparse": "mul_mat_sparse (gate/up)", "axpy_sparse": "axpy_sparse (down)"}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("runs", nargs="+", type=Path, help="CSV files written by test-kairox-ops perf -o")
    ap.add_argument("-o", "--out", type=Path, required=True, help="output stem: writes STEM.csv and STEM.md")
    args = ap.parse_args(argv)

    cells: dict[tuple[str, str, int, int, float], list[dict[str, str]]] = defaultdict(list)
    order: list[tuple[str, str, int, int]] = []
    for path in args.runs:
        try:
            rows = list(csv.DictReader(path.open()))
        except OSError as e:
            print(f"error: {e}", file=sys.stderr)
            return 1
        if not rows:
            print(f"error: {path} has no rows", file=sys.stderr)
            return 1
        for r in rows:
            key = (r["op"], r["type"], int(r["k"]), int(r["n"]))
            if key not in order:
                order.append(key)
            cells[key + (float(r["density"]),)].append(r)

    densities = sorted({k[4] for k in cells})
    args.out.parent.mkdir(parents=True, exist_ok=True)
    md = ["| op | type | shape | dense (us) | dense layout | " + " | ".join(f"{round(d * 100)}%" for d in densities) + " |",
          "|---|---|---|---|---|" + "---|" * len(densities)]
    with args.out.with_suffix(".csv").open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["op", "type", "k", "n", "density", "runs", "dense_us", "sparse_us", "speedup", "dense_layout"])
        for op, typ, k, n in order:
            line = []
            dense_all = []
            layout = ""
            for d in densities:
                rs = cells.get((op, typ, k, n, d), [])
                if not rs:
                    line.append("-")
                    continue
                dense = statistics.median(float(r["dense_us"]) for r in rs)
                sparse = statistics.median(float(r["sparse_us"]) for r in rs)
                speed = statistics.median(float(r["speedup"]) for r in rs)
                layout = rs[0]["dense_layout"]
                dense_all.extend(float(r["dense_us"]) for r in rs)
                w.writerow([op, typ, k, n, d, len(rs), f"{dense:.1f}", f"{sparse:.1f}", f"{speed:.3f}", layout])
                line.append(f"{sparse:.0f} ({speed:.2f}x)")
            dense_med = statistics.median(dense_all) if dense_all else float("nan")
            md.append(f"| {OP_NAMES.get(op, op)} | {typ} | {k}x{n} | {dense_med:.0f} | {layout} | " + " | ".join(line) + " |")
    args.out.with_suffix(".md").write_text("\n".join(md) + "\n")
    print("\n".join(md))
    return 0


if __name__ == "__main__":
    sys.exit(main())
