#!/usr/bin/env python3
"""Decode speed of the hybrid runtime against the CPU-only sparse path and the dense FFN, same
build, same model, same threads, one process: the numbers for issue 7 on a machine with a GPU.

The model is loaded once with the hybrid placement (with a GPU: every layer on it except the FFN
weights, which stay in host memory; without one: everything on the CPU, the device being the CPU
stand-in). Then, alternating configurations run after run: the dense FFN (on the host, as
upstream with `-ot ffn_=CPU`), the CPU-only sparse FFN, and the hybrid runtime with its cache
sized to each share of the FFN groups. Each configuration's decode tok/s is the median of its
runs (a short prompt, then --n-predict greedy tokens).

    python3 scripts/hybrid_speed.py --synthetic 7b --layers 8 --density 0.3 --out hybrid-speed
    python3 scripts/hybrid_speed.py --model smollm2-kx.gguf --out hybrid-speed

--synthetic writes a random-weight model of that shape (speed only, kairox_py.benchmark.synthetic):
with --pred-rank 0 the masks are given (the same neurons every token, so the cache fills with
them and then holds still), with a rank > 0 a random low-rank predictor picks each token's
neurons (no locality: the balancer reloads every step). --policies runs the hybrid
configurations once per balancer policy.
"""
from __future__ import annotations

import argparse
import csv
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path

from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from kairox_py.benchmark.synthetic import SHAPES, SparseSpec, pred_threshold_for, write_synthetic_llama  # noqa: E402
from kairox_py.llama import ContextParams, Model, has_gpu  # noqa: E402

GIB = float(1 << 30)


def decode_tps(m: Model, params: ContextParams, prompt: list[int], n: int) -> tuple[float, str]:
    """Greedy decode tok/s after the prompt, and the hybrid device's name ('' without one)."""
    with m.session(params) as s:
        s.decode(prompt)
        tok = int(s.logits().argmax())
        t0 = time.perf_counter()
        for _ in range(n):
            s.decode([tok])
            tok = int(s.logits().argmax())
        dt = time.perf_counter() - t0
        info = s.hybrid_info()
        return n / dt, info.device if info else ""


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("--model", help="a Kairox GGUF with predictors and neuron groups")
    src.add_argument("--synthetic", choices=sorted(SHAPES), help="write a random-weight model of this shape")
    ap.add_argument("--layers", type=int, default=0, help="--synthetic: this many layers (0: the shape's)")
    ap.add_argument("--density", type=float, default=0.3, help="--synthetic: share of FFN neurons selected")
    ap.add_argument("--pred-rank", type=int, default=0, help="--synthetic: 0 masks given, > 0 a random predictor")
    ap.add_argument("--shares", default="0.25,0.5,1.0", help="cache sizes as shares of all FFN groups")
    ap.add_argument("--policies", default="tam", help="balancer policies of the hybrid runs (comma-separated)")
    ap.add_argument("-n", "--n-predict", type=int, default=32)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("-t", "--threads", type=int, default=4)
    ap.add_argument("--out", default="hybrid-speed", help="output directory (CSV and Markdown)")
    a = ap.parse_args()

    console = Console(stderr=True)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    pred_thr = 0.0
    if a.synthetic:
        shape = SHAPES[a.synthetic]
        if a.layers:
            shape = replace(shape, n_layer=a.layers)
        spec = SparseSpec(pred_rank=a.pred_rank)
        path = out / f"synthetic-{a.synthetic}-{shape.n_layer}l-r{a.pred_rank}.gguf"
        if not path.exists():
            console.print(f"writing {path} ...")
            write_synthetic_llama(path, shape, "q4_0", spec, group_size=32)
        pred_thr = pred_threshold_for(a.density, spec)
    else:
        path = Path(a.model)

    shares = [float(x) for x in a.shares.split(",") if x.strip()]
    base = ContextParams(n_ctx=256, n_batch=64, n_threads=a.threads, pred_threshold=pred_thr)
    with Model(path, ffn_on_host=True) as m:
        prompt = m.tokenize("The tide comes in twice a day because")
        with m.session(replace(base, mode="predictor", vram_budget_gib=1024.0)) as s:
            info = s.hybrid_info()
            assert info is not None
            dense_b, cache_b = float(info.dense_bytes), float(info.cache_bytes)
        configs: list[tuple[str, ContextParams]] = [
            ("dense FFN", replace(base, mode="dense")),
            ("CPU-only sparse", replace(base, mode="predictor")),
        ]
        policies = [p.strip() for p in a.policies.split(",") if p.strip()]
        for pol in policies:
            for sh in shares:
                name = f"hybrid, cache {sh:.0%}" + (f", {pol}" if len(policies) > 1 else "")
                configs.append((name, replace(base, mode="predictor", policy=pol,
                                              vram_budget_gib=(dense_b + sh * cache_b) / GIB * 1.0001)))
        speeds: dict[str, list[float]] = {name: [] for name, _ in configs}
        device = ""
        for r in range(a.runs + 1):  # the first round warms up (page cache, device allocations)
            for name, p in configs:
                tps, dev = decode_tps(m, p, prompt, a.n_predict)
                device = dev or device
                if r > 0:
                    speeds[name].append(tps)
            console.print(f"round {r} of {a.runs} done" + (" (warm-up)" if r == 0 else ""))

    ref = statistics.median(speeds["CPU-only sparse"])
    dense = statistics.median(speeds["dense FFN"])
    where = f"GPU ({device})" if has_gpu() else (device or "CPU stand-in")
    title = f"decode tok/s, {path.name}, {a.threads} threads, hybrid device: {where}"
    header = ("configuration", "tok/s (median)", "runs", "vs CPU-only sparse", "vs dense FFN")
    rows = []  # (name, median, runs) and the same as shown
    for name, _ in configs:
        med = statistics.median(speeds[name])
        shown = (name, f"{med:.2f}", " ".join(f"{x:.1f}" for x in speeds[name]), f"{med / ref:.2f}x", f"{med / dense:.2f}x")
        rows.append((name, med, speeds[name], shown))
    t = Table(title=title)
    for c in header:
        t.add_column(c, justify="left" if c == "configuration" else "right")
    for *_, shown in rows:
        t.add_row(*shown)
    Console().print(t)
    with open(out / "hybrid-speed.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["configuration", "tok_s_median", "runs", "vs_cpu_sparse", "vs_dense", "device", "model", "threads"])
        for name, med, runs, _ in rows:
            w.writerow([name, f"{med:.3f}", " ".join(f"{x:.2f}" for x in runs), f"{med / ref:.3f}", f"{med / dense:.3f}",
                        where, path.name, a.threads])
    with open(out / "hybrid-speed.md", "w") as f:
        f.write(f"{title}\n\n| " + " | ".join(header) + " |\n" + "|---" * len(header) + "|\n")
        for *_, shown in rows:
            f.write("| " + " | ".join(shown) + " |\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
