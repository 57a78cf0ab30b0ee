#!/usr/bin/env python3
"""Prefill and decode of a Kairox GGUF against its original GGUF, interleaved over rounds.

One llama-bench call per model and round, alternating the order (ABBA) so that drift of a
shared, noisy machine falls on both sides equally. Each round gives one ratio per test (the
Kairox file's tokens/s over the original's in that round); the summary is the median ratio
and its range over rounds, which is what a claim such as ">= 0.97x of the original" should be
checked against: a single llama-bench run of each file, minutes apart, can differ by 10% on a
small shared machine with nothing changed.

    python3 scripts/ab_llama_bench.py ORIGINAL.gguf KX.gguf -t 2 --rounds 4 -o DIR

Writes DIR/rounds.csv (one row per model, round and test) and DIR/summary.md.
"""
from __future__ import annotations

import argparse
import csv
import io
import statistics
import subprocess
import sys
from datetime import date
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from kairox_py._lib import find_tool  # noqa: E402


def run_bench(bench: Path, model: Path, args: argparse.Namespace) -> list[dict[str, str]]:
    """One llama-bench call; its CSV rows (one per test: pp then tg)."""
    cmd = [str(bench), "-m", str(model), "-t", str(args.threads), "-r", str(args.reps),
           "-p", str(args.prompt), "-n", str(args.gen), "-o", "csv"]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        sys.exit(f"llama-bench failed on {model} (exit {proc.returncode}):\n{proc.stderr[-2000:]}")
    rows = list(csv.DictReader(io.StringIO(proc.stdout)))
    if not rows:
        sys.exit(f"llama-bench printed no results for {model}")
    return rows


def _test_label(row: dict[str, str]) -> str:
    """llama-bench's name of the test a row reports: ppN (prefill) or tgN (decode)."""
    n_prompt, n_gen = int(row["n_prompt"]), int(row["n_gen"])
    return f"pp{n_prompt}" if n_gen == 0 else f"tg{n_gen}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("original", type=Path, help="the original GGUF (the baseline)")
    ap.add_argument("kairox", type=Path, help="its Kairox conversion")
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("-p", "--prompt", type=int, default=64, help="prefill tokens (pp test)")
    ap.add_argument("-n", "--gen", type=int, default=64, help="decode tokens (tg test)")
    ap.add_argument("-r", "--reps", type=int, default=3, help="llama-bench repetitions per call")
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--bench", type=Path, default=None,
                    help="llama-bench binary (default: the one built next to libkairox, else on PATH)")
    ap.add_argument("-o", "--out", type=Path, required=True)
    args = ap.parse_args()
    bench = args.bench or find_tool("llama-bench")
    if bench is None:
        sys.exit("no llama-bench next to libkairox or on PATH: build the tools (README's developer build) "
                 "or give --bench")
    for p in (bench, args.original, args.kairox):
        if not p.is_file():
            sys.exit(f"not found: {p}")
    if args.rounds < 1:
        sys.exit("--rounds must be at least 1")
    args.out.mkdir(parents=True, exist_ok=True)

    models = {"original": args.original, "kairox": args.kairox}
    rows_out: list[dict[str, object]] = []
    for rnd in range(args.rounds):
        order = ["original", "kairox"] if rnd % 2 == 0 else ["kairox", "original"]
        for name in order:
            rows_out += [{"round": rnd + 1, "model": name, "file": models[name].name, "test": _test_label(row),
                          "avg_ts": float(row["avg_ts"]), "stddev_ts": float(row["stddev_ts"])}
                         for row in run_bench(bench, models[name], args)]
        now = {(r["model"], r["test"]): r["avg_ts"] for r in rows_out if r["round"] == rnd + 1}
        line = "  ".join(f"{t} {now[('kairox', t)] / now[('original', t)]:.3f}x" for (n, t) in now if n == "original")
        print(f"round {rnd + 1}/{args.rounds}: {line}", flush=True)
    tps = {(int(r["round"]) - 1, str(r["model"]), str(r["test"])): float(r["avg_ts"]) for r in rows_out}

    with open(args.out / "rounds.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows_out[0]))
        w.writeheader()
        w.writerows(rows_out)

    tests = sorted({t for (_, _, t) in tps}, key=lambda t: (t[:2] != "pp", t))
    lines = [f"# {args.kairox.name} vs {args.original.name}", "",
             f"{date.today().isoformat()}, {args.threads} threads, {args.rounds} rounds (ABBA), "
             f"llama-bench -r {args.reps} per call.", "",
             "```bash", f"python3 scripts/ab_llama_bench.py {args.original.name} {args.kairox.name} "
             f"-t {args.threads} -p {args.prompt} -n {args.gen} -r {args.reps} --rounds {args.rounds} -o DIR",
             "```", "",
             "| test | original tok/s (median) | Kairox tok/s (median) | ratio per round | median ratio |",
             "|---|---|---|---|---|"]
    for t in tests:
        o = [tps[(r, "original", t)] for r in range(args.rounds)]
        k = [tps[(r, "kairox", t)] for r in range(args.rounds)]
        ratios = [b / a for a, b in zip(o, k)]
        lines.append(f"| {t} | {statistics.median(o):.2f} | {statistics.median(k):.2f} | "
                     f"{' '.join(f'{x:.3f}' for x in ratios)} | **{statistics.median(ratios):.3f}x** |")
    (args.out / "summary.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines[-len(tests) - 2:]))


if __name__ == "__main__":
    main()
