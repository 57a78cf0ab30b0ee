#!/usr/bin/env python3
"""Turn `kairox bench` logs (each ends with a summary block) into Markdown and CSV tables.

    python3 scripts/parse_bench_logs.py LOG... [--md summary.md] [--csv summary.csv]

Only the standard library: the logs may be parsed anywhere.
"""
from __future__ import annotations

import argparse
import csv
import sys
from pathlib import Path

BEGIN, END = "=== KAIROX BENCH SUMMARY ===", "=== END SUMMARY ==="


def parse_blocks(text: str) -> list[dict[str, str]]:
    """Every summary block of a log as a flat key -> value dict."""
    blocks, cur = [], None
    for line in text.splitlines():
        line = line.strip()
        if line == BEGIN:
            cur = {}
        elif line == END and cur is not None:
            blocks.append(cur)
            cur = None
        elif cur is not None:
            for tok in line.split(" "):
                if "=" in tok:
                    k, v = tok.split("=", 1)
                    cur[k] = v
    return blocks


def rows_of(block: dict[str, str], source: str) -> list[dict[str, str]]:
    out = []
    for gm in ("standard", "speculative"):
        if f"{gm}.dense.decode_tps" not in block:
            continue
        out.append({
            "source": source, "label": block.get("label", ""), "mode": gm,
            "threads": block.get("threads", ""), "sparse_mode": block.get("sparse_mode", ""),
            "active": block.get("mean_active_fraction", ""),
            "dense_prefill": block.get(f"{gm}.dense.prefill_tps", ""),
            "kairox_prefill": block.get(f"{gm}.kairox.prefill_tps", ""),
            "dense_decode": block.get(f"{gm}.dense.decode_tps", ""),
            "kairox_decode": block.get(f"{gm}.kairox.decode_tps", ""),
            "speedup": block.get(f"{gm}.decode_speedup", ""),
            "accept": block.get(f"{gm}.kairox.accept_rate", ""),
            "ffn_share": block.get("ffn_share_dense", ""), "amdahl_limit": block.get("amdahl_limit", ""),
        })
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("logs", nargs="+")
    ap.add_argument("--md", default=None)
    ap.add_argument("--csv", default=None)
    a = ap.parse_args(argv)
    rows = []
    for log in a.logs:
        p = Path(log)
        if not p.is_file():
            print(f"error: no such log: {p}", file=sys.stderr)
            return 1
        blocks = parse_blocks(p.read_text(errors="replace"))
        if not blocks:
            print(f"warning: {p} has no summary block (did the run finish?)", file=sys.stderr)
        for b in blocks:
            rows += rows_of(b, p.name)
    if not rows:
        print("error: no summary blocks found", file=sys.stderr)
        return 1
    cols = list(rows[0].keys())
    md = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    md += ["| " + " | ".join(r[c] for c in cols) + " |" for r in rows]
    text = "\n".join(md) + "\n"
    print(text, end="")
    if a.md:
        Path(a.md).write_text(text)
    if a.csv:
        with open(a.csv, "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=cols)
            w.writeheader()
            w.writerows(rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
