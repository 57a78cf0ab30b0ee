#!/usr/bin/env python3
"""Per-kernel device time per decode step, side by side, from Nsight Compute CSVs.

Issue 35's everything-fits row asks a decode step of the hybrid runtime with every group
resident to cost no more than upstream's with every layer on the GPU. The wall time per step
(`test-kairox-hybrid ... speed`) says whether it does; this table says which kernels make the
difference: each configuration's kernels are recorded by `ncu` over the same number of steps
(`speed ... --profile CONFIG` opens a profiler range around its timed steps only), and each
kernel's calls and microseconds are divided by that number of steps.

    ncu --profile-from-start off --clock-control none --metrics gpu__time_duration.sum \\
        --print-kernel-base demangled --print-units base --csv --log-file fit.csv \\
        test-kairox-hybrid KX.gguf speed ORIGINAL.gguf 8 --profile fit
    python3 scripts/kernel_profile.py --steps 8 upstream=upstream.csv fit=fit.csv -o kernels
    # writes kernels.csv and kernels.md

Both of ncu's CSV layouts are read: the default one (a row per kernel and metric) and
`--page raw` (a column per metric, its units in the second row).
"""
from __future__ import annotations

import argparse
import csv
import io
import sys
from dataclasses import dataclass, field
from pathlib import Path

METRIC = "gpu__time_duration.sum"
TO_US = {"nsecond": 1e-3, "ns": 1e-3, "usecond": 1.0, "us": 1.0, "msecond": 1e3, "ms": 1e3, "second": 1e6, "s": 1e6}
NAME_COLUMNS = ("Kernel Name", "Function Name", "Name")


class ProfileError(Exception):
    """A CSV that is not ncu's, or not one with the kernels' durations."""


@dataclass
class KernelTimes:
    """One configuration's kernels: name -> (calls, total microseconds)."""
    calls: dict[str, int] = field(default_factory=dict)
    us: dict[str, float] = field(default_factory=dict)

    def add(self, name: str, us: float) -> None:
        self.calls[name] = self.calls.get(name, 0) + 1
        self.us[name] = self.us.get(name, 0.0) + us


def short_name(name: str, width: int = 100) -> str:
    """The kernel's name and template arguments without `void` and the parameter list, which
    ncu's demangled names carry and which say nothing the template arguments do not."""
    s = name.strip()
    if s.startswith("void "):
        s = s[5:]
    if s.endswith(")"):
        depth = 0
        for i in range(len(s) - 1, -1, -1):
            depth += {")": 1, "(": -1}.get(s[i], 0)
            if depth == 0:
                # a parameter list follows the name or its template arguments, never a cast
                if i > 0 and (s[i - 1].isalnum() or s[i - 1] in "_>"):
                    s = s[:i]
                break
    return s if len(s) <= width else s[: width - 3] + "..."


def _number(text: str) -> float:
    return float(text.replace(",", "").strip())


def _us(value: str, unit: str, where: str) -> float:
    unit = unit.strip()
    if unit not in TO_US:
        raise ProfileError(f"{where}: unknown time unit {unit!r}")
    return _number(value) * TO_US[unit]


def read_ncu_csv(path: Path) -> KernelTimes:
    """The kernels' durations in one of ncu's CSV logs. Lines before the header (ncu's own
    ==PROF== messages, the program's output when it shares the file) are skipped."""
    text = path.read_text(errors="replace")
    lines = text.splitlines()
    start = next((i for i, line in enumerate(lines) if line.startswith('"ID"')), None)
    if start is None:
        raise ProfileError(f"{path}: no ncu CSV header (a line starting with \"ID\"); "
                           "was the program profiled with --csv, and did it launch kernels inside the range?")
    rows = list(csv.reader(io.StringIO("\n".join(lines[start:]))))
    header = rows[0]
    name_col = next((header.index(c) for c in NAME_COLUMNS if c in header), None)
    if name_col is None:
        raise ProfileError(f"{path}: no kernel name column ({', '.join(NAME_COLUMNS)})")
    times = KernelTimes()
    if "Metric Name" in header:  # one row per kernel and metric
        m, u, v = header.index("Metric Name"), header.index("Metric Unit"), header.index("Metric Value")
        for n, row in enumerate(rows[1:], start=start + 2):
            if len(row) == len(header) and row[m] == METRIC:
                times.add(short_name(row[name_col]), _us(row[v], row[u], f"{path}:{n}"))
    elif METRIC in header:  # --page raw: a column per metric, units in the next row
        col = header.index(METRIC)
        if len(rows) < 2:
            raise ProfileError(f"{path}: no units row")
        unit = rows[1][col]
        for n, row in enumerate(rows[2:], start=start + 3):
            if len(row) == len(header) and row[0].strip():
                times.add(short_name(row[name_col]), _us(row[col], unit, f"{path}:{n}"))
    else:
        raise ProfileError(f"{path}: no {METRIC} values (profile with --metrics {METRIC})")
    if not times.calls:
        raise ProfileError(f"{path}: no kernel has a {METRIC} value")
    return times


def table(configs: dict[str, KernelTimes], steps: int) -> tuple[list[str], list[list[str]]]:
    """Rows by kernel, the slowest first (by its largest time per step in any configuration),
    then the totals."""
    names = sorted({k for t in configs.values() for k in t.us},
                   key=lambda k: -max(t.us.get(k, 0.0) for t in configs.values()))
    header = ["kernel"]
    for label in configs:
        header += [f"{label} calls/step", f"{label} us/step"]
    rows = []
    for k in names:
        row = [k]
        for t in configs.values():
            row += [f"{t.calls.get(k, 0) / steps:.2f}", f"{t.us.get(k, 0.0) / steps:.1f}"]
        rows.append(row)
    total = ["all kernels"]
    for t in configs.values():
        total += [f"{sum(t.calls.values()) / steps:.2f}", f"{sum(t.us.values()) / steps:.1f}"]
    rows.append(total)
    return header, rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("configs", nargs="+", metavar="LABEL=CSV", help="a configuration's name and its ncu CSV log")
    ap.add_argument("--steps", type=int, required=True, help="decode steps each profile recorded")
    ap.add_argument("-o", "--out", type=Path, required=True, help="output stem: writes STEM.csv and STEM.md")
    args = ap.parse_args(argv)
    if args.steps < 1:
        print("error: --steps must be at least 1", file=sys.stderr)
        return 2
    configs: dict[str, KernelTimes] = {}
    for spec in args.configs:
        label, sep, path = spec.partition("=")
        if not sep or not label or not path:
            print(f"error: {spec!r} is not LABEL=CSV", file=sys.stderr)
            return 2
        if label in configs:
            print(f"error: label {label!r} given twice", file=sys.stderr)
            return 2
        try:
            configs[label] = read_ncu_csv(Path(path))
        except (OSError, ProfileError, ValueError) as e:
            print(f"error: {e}", file=sys.stderr)
            return 1
    header, rows = table(configs, args.steps)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    with open(args.out.with_suffix(".csv"), "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(header)
        w.writerows(rows)
    md = [f"Device time per decode step by kernel ({args.steps} steps per configuration)", "",
          "| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    md += ["| " + " | ".join(c.replace("|", "\\|") for c in row) + " |" for row in rows]
    args.out.with_suffix(".md").write_text("\n".join(md) + "\n")
    body = md[4:]  # the slowest kernels and the totals on the console; every kernel in the files
    print("\n".join(md[2:4] + (body if len(body) <= 16 else body[:15] + body[-1:])))
    return 0


if __name__ == "__main__":
    sys.exit(main())
