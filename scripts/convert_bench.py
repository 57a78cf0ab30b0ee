#!/usr/bin/env python3
"""Time and peak memory of one `kairox convert`, per stage (docs/benchmarks/convert).

Runs `python -m kairox_py convert MODEL OUT ARGS...` as a child process with its own profile
cache (--cache, so the profile is measured rather than reused), samples the resident set of
its process tree every --interval seconds, and when it ends adds a row to --csv: the stage
seconds the converter prints in its summary, the wall time, the peak RSS over the run (the
sampled peak and the kernel's own maximum for the child, getrusage), and the sampled peak
within each stage (stages placed on the clock by their printed durations, in order, from
the end of the child's imports, which its printed total places; the hashing of the input
before the profile falls into the first stage).

MODEL `synthetic-7b` writes (once, into --cache) a random-weight GGUF of LLaMA-2-7B's
shapes (32 layers, 4096/11008, Q4_0; kairox_py.benchmark.synthetic) and converts that.

    python3 scripts/convert_bench.py ~/.cache/kairox/models/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf \\
        --label qwen2.5-coder-1.5b --cache /tmp/kxc --csv docs/benchmarks/convert/convert.csv -- -t 2
"""
from __future__ import annotations

import argparse
import csv
import os
import re
import resource
import subprocess
import sys
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from kairox_py.benchmark.synthetic import SHAPES, write_synthetic_llama  # noqa: E402

STAGES = ("self-text", "profile", "calibrate", "predictors", "grouping", "write", "fit")
FIELDS = ("label", "date", "model", "args", "wall_s", *(f"{s}_s" for s in STAGES), "finish_s",
          "peak_rss_mb", "maxrss_mb", *(f"{s}_rss_mb" for s in STAGES), "finish_rss_mb",
          "model_mb", "out_mb", "size_ratio", "predictors", "grouping")


def _tree_rss_kb(pid: int) -> int:
    """Resident set of `pid` and its descendants, in kB (0 where they are gone)."""
    total, todo = 0, [pid]
    while todo:
        p = todo.pop()
        try:
            with open(f"/proc/{p}/status") as f:
                total += next((int(ln.split()[1]) for ln in f if ln.startswith("VmRSS:")), 0)
            with open(f"/proc/{p}/task/{p}/children") as f:
                todo += [int(c) for c in f.read().split()]
        except (OSError, ValueError):
            continue
    return total


def _sample(pid: int, interval: float, out: list[tuple[float, int]], stop: threading.Event) -> None:
    t0 = time.monotonic()
    while not stop.is_set():
        out.append((time.monotonic() - t0, _tree_rss_kb(pid)))
        stop.wait(interval)


def _summary_value(text: str, label: str) -> str:
    """A row of the summary table (its value, wrapped lines joined)."""
    lines = text.splitlines()
    for i, ln in enumerate(lines):
        if f"│ {label} " in ln:
            parts = [ln.split("│")[2].strip()]
            for nxt in lines[i + 1:]:
                cells = nxt.split("│")
                if len(cells) < 3 or cells[1].strip():
                    break
                parts.append(cells[2].strip())
            return " ".join(parts)
    return ""


def synthetic_7b(cache: Path) -> Path:
    path = cache / "synthetic" / "llama2-7b-shapes-q4_0-seed0.gguf"
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        print(f"writing {path} ...", file=sys.stderr)
        write_synthetic_llama(path, SHAPES["7b"], "q4_0", None, seed=0)
    return path


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model", help="GGUF to convert, or synthetic-7b")
    ap.add_argument("--label", required=True)
    ap.add_argument("--cache", type=Path, required=True, help="KAIROX_CACHE for the run (profiles, self-text)")
    ap.add_argument("--out", type=Path, default=None, help="OUT.gguf (default: CACHE/LABEL.kx.gguf)")
    ap.add_argument("--csv", type=Path, required=True)
    ap.add_argument("--log", type=Path, default=None, help="the converter's stderr (default: OUT.log)")
    ap.add_argument("--interval", type=float, default=0.5)
    ap.add_argument("--tree", type=Path, default=REPO,
                    help="source tree whose kairox_py runs (another checkout: a 'before' row); its "
                         "library is this tree's build/dev unless KAIROX_LIB says otherwise")
    argv = sys.argv[1:]
    cut = argv.index("--") if "--" in argv else len(argv)
    a = ap.parse_args(argv[:cut])
    a.convert_args = argv[cut + 1:]  # after --: options of kairox convert
    a.cache.mkdir(parents=True, exist_ok=True)
    model = synthetic_7b(a.cache) if a.model == "synthetic-7b" else Path(a.model).expanduser()
    out = a.out or a.cache / f"{a.label}.kx.gguf"
    log = a.log or out.with_name(out.name + ".log")
    tree = a.tree.resolve()
    env = dict(os.environ, KAIROX_CACHE=str(a.cache), COLUMNS="160", PYTHONPATH=str(tree))
    if tree != REPO and "KAIROX_LIB" not in env:
        env["KAIROX_LIB"] = str(REPO / "build" / "dev" / "libkairox.so")
    cmd = [sys.executable, "-m", "kairox_py", "convert", str(model), str(out), *a.convert_args]
    samples: list[tuple[float, int]] = []
    stop = threading.Event()
    t0 = time.monotonic()
    with open(log, "w") as err:
        proc = subprocess.Popen(cmd, cwd=tree, env=env, stdin=subprocess.DEVNULL, stdout=err, stderr=err)
        sampler = threading.Thread(target=_sample, args=(proc.pid, a.interval, samples, stop), daemon=True)
        sampler.start()
        rc = proc.wait()
        stop.set()
        sampler.join()
    wall = time.monotonic() - t0
    maxrss_mb = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    text = log.read_text(errors="replace")
    if rc != 0:
        print(text[-3000:], file=sys.stderr)
        return rc
    secs = {k: float(v) for k, v in re.findall(r"([a-z-]+) ([0-9.]+)s", _summary_value(text, "time"))}
    row: dict[str, object] = {"label": a.label, "date": time.strftime("%Y-%m-%d"), "model": model.name,
                              "args": " ".join(a.convert_args), "wall_s": round(wall, 1),
                              "peak_rss_mb": round(max(r for _, r in samples) / 1024),
                              "maxrss_mb": round(maxrss_mb), "model_mb": round(model.stat().st_size / 1e6),
                              "out_mb": round(out.stat().st_size / 1e6),
                              "size_ratio": round(out.stat().st_size / model.stat().st_size, 3)}
    # the converter's clock starts after the imports: its stages end `total` before the exit
    start = max(0.0, wall - secs["total"]) if "total" in secs else 0.0
    for s in STAGES:
        d = secs.get(s, 0.0)
        row[f"{s}_s"] = round(d, 1) if s in secs else ""
        inside = [r for t, r in samples if start <= t < start + d]
        row[f"{s}_rss_mb"] = round(max(inside) / 1024) if inside else ""
        start += d
    row["finish_s"] = round(wall - start, 1)  # report and crossover calibration (and the exit)
    tail = [r for t, r in samples if t >= start]
    row["finish_rss_mb"] = round(max(tail) / 1024) if tail else ""
    row["predictors"] = _summary_value(text, "predictors") or _summary_value(text, "predicted density (mean)")
    row["grouping"] = _summary_value(text, "grouping")
    a.csv.parent.mkdir(parents=True, exist_ok=True)
    new = not a.csv.exists()
    with open(a.csv, "a", newline="") as f:
        w = csv.DictWriter(f, fieldnames=FIELDS)
        if new:
            w.writeheader()
        w.writerow(row)
    print(row)
    return 0


if __name__ == "__main__":
    sys.exit(main())
