#!/usr/bin/env python3
"""Artifact-style driver: run `kairox bench` over a matrix and summarize the logs.

    python3 scripts/bench_matrix.py --sparse-model KAIROX.gguf [--dense-model ORIG.gguf]
        [--threads 1,2] [--out bench-matrix] [--quick]
    python3 scripts/bench_matrix.py --synthetic 7b [--densities 0.1,0.5] [--pred-ranks 0,1024]

Each cell writes its own log (ending with the summary block) and output directory under
--out; at the end scripts/parse_bench_logs.py turns all logs into summary.md and summary.csv.
"""
from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path


def run(cmd: list[str], log: Path) -> int:
    print("+", " ".join(cmd), flush=True)
    with open(log, "w") as f:
        proc = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT)
    print(f"  -> {log} (exit {proc.returncode})", flush=True)
    return proc.returncode


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sparse-model")
    ap.add_argument("--dense-model")
    ap.add_argument("--threads", default="2")
    ap.add_argument("--synthetic", choices=["7b", "1b", "tiny"])
    ap.add_argument("--densities", default="0.1,0.5")
    ap.add_argument("--pred-ranks", default="0,1024")
    ap.add_argument("--out", default="bench-matrix")
    ap.add_argument("--quick", action="store_true", help="fewer prompts, tokens and runs")
    a = ap.parse_args(argv)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    kairox = [sys.executable, "-m", "kairox_py.cli", "bench"]
    size = ["--max-prompts", "3", "-n", "32", "--runs", "2"] if a.quick else []
    logs, failed = [], 0
    for t in a.threads.split(","):
        if a.synthetic:
            for r in a.pred_ranks.split(","):
                name = f"{a.synthetic}-t{t}-rank{r}"
                log = out / f"{name}.log"
                failed += run(kairox + ["--synthetic", a.synthetic, "--density", a.densities, "--pred-rank", r,
                                        "-t", t, "--out", str(out / name), "--label", name] + size, log) != 0
                logs.append(log)
        else:
            if not a.sparse_model:
                ap.error("--sparse-model is required without --synthetic")
            name = f"{Path(a.sparse_model).stem}-t{t}"
            log = out / f"{name}.log"
            cmd = kairox + [a.sparse_model, "-t", t, "--out", str(out / name), "--label", name] + size
            if a.dense_model:
                cmd += ["--dense-model", a.dense_model]
            failed += run(cmd, log) != 0
            logs.append(log)
    parser = Path(__file__).with_name("parse_bench_logs.py")
    subprocess.run([sys.executable, str(parser), *map(str, logs), "--md", str(out / "summary.md"),
                    "--csv", str(out / "summary.csv")])
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
