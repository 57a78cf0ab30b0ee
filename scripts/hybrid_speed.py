#!/usr/bin/env python3
"""Decode speed of the hybrid runtime against the CPU-only sparse path and the dense FFN, same
build, same model, same threads, one process: the numbers for issue 7 on a machine with a GPU.

The model is loaded once with the hybrid placement (with a GPU: every layer on it except the FFN
weights, which stay in host memory; without one: everything on the CPU, the device being the CPU
stand-in). Then, alternating configurations run after run: the dense FFN (on the host, as
upstream with `-ot "ffn_(up|gate|down)=CPU"`), the CPU-only sparse FFN, and the hybrid runtime with its cache
sized to each share of the FFN groups. Each configuration's decode tok/s is the median of its
runs (a short prompt, then --n-predict greedy tokens).

    python3 scripts/hybrid_speed.py --synthetic 7b --layers 8 --density 0.3 --out hybrid-speed
    python3 scripts/hybrid_speed.py --model smollm2-kx.gguf --out hybrid-speed

--synthetic writes a random-weight model of that shape (speed only, kairox_py.benchmark.synthetic):
with --pred-rank 0 the masks are given (the same neurons every token, so the cache fills with
them and then holds still), with a rank > 0 a random low-rank predictor picks each token's
neurons (no locality: the balancer reloads every step). --policies runs the hybrid
configurations once per balancer policy.

--workload PRESET|DIR (with --synthetic) runs an activation workload of `kairox workload`
instead: every decode step takes its masks from the workload's next step (the first sequence),
so the cache and the balancer see a workload's dynamics; the model carries the workload's
group frequencies as its profiled ones. A preset is generated at the model's shape.

    python3 scripts/hybrid_speed.py --synthetic 7b --layers 8 --workload relu-7b --policies static,tam
"""
from __future__ import annotations

import argparse
import csv
import hashlib
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from kairox_py.benchmark.synthetic import SHAPES, LlamaShape, SparseSpec, pred_threshold_for  # noqa: E402
from kairox_py.benchmark.synthetic import write_synthetic_llama  # noqa: E402
from kairox_py.errors import KairoxError  # noqa: E402
from kairox_py.llama import ContextParams, Model, has_gpu  # noqa: E402
from kairox_py.sim.traces import Trace  # noqa: E402
from kairox_py.workload.model import PRESETS as WORKLOAD_PRESETS  # noqa: E402
from kairox_py.workload.model import resolve  # noqa: E402
from kairox_py.workload.write import open_workload, write_workload  # noqa: E402

GIB = float(1 << 30)


def decode_tps(m: Model, params: ContextParams, prompt: list[int], n: int,
               workload: np.ndarray | None = None) -> tuple[float, str]:
    """Greedy decode tok/s after the prompt, and the hybrid device's name ('' without one);
    with a workload (packed bits of one sequence) every sparse step takes its masks from it."""
    with m.session(params) as s:
        if workload is not None and params.mode != "dense":
            s.set_workload(workload)
        s.decode(prompt)
        tok = int(s.logits().argmax())
        t0 = time.perf_counter()
        for _ in range(n):
            s.decode([tok])
            tok = int(s.logits().argmax())
        dt = time.perf_counter() - t0
        info = s.hybrid_info()
        return n / dt, info.device if info else ""


def _workload(source: str, shape: LlamaShape, seed: int, out: Path, console: Console) -> Trace:
    """A workload at the model's shape: a directory as it is (checked), or a preset generated."""
    if source not in WORKLOAD_PRESETS:
        trace = open_workload(source)[0]
        if (trace.n_layer, trace.n_ff) != (shape.n_layer, shape.n_ff):
            raise KairoxError(f"the workload is {trace.n_layer} layers x {trace.n_ff} neurons, the model "
                              f"{shape.n_layer} x {shape.n_ff}")
        return trace
    p = resolve(source, seed=seed, n_layer=shape.n_layer, n_embd=shape.n_embd, n_ff=shape.n_ff,
                weight_type="q4_0", n_seq=1)
    console.print(f"generating workload {source} (seed {seed}) into {out} ...")
    return write_workload(p, out)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("--model", help="a Kairox GGUF with predictors and neuron groups")
    src.add_argument("--synthetic", choices=sorted(SHAPES), help="write a random-weight model of this shape")
    ap.add_argument("--layers", type=int, default=0, help="--synthetic: this many layers (0: the shape's)")
    ap.add_argument("--density", type=float, default=0.3, help="--synthetic: share of FFN neurons selected")
    ap.add_argument("--pred-rank", type=int, default=0, help="--synthetic: 0 masks given, > 0 a random predictor")
    ap.add_argument("--workload", metavar="PRESET|DIR",
                    help="--synthetic: masks from an activation workload (a preset or a directory)")
    ap.add_argument("--seed", type=int, default=0, help="--workload PRESET: the draw")
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
    bits = None
    if a.workload and not a.synthetic:
        ap.error("--workload needs --synthetic (only a synthetic model runs a workload)")
    if a.synthetic:
        shape = SHAPES[a.synthetic]
        if a.layers:
            shape = replace(shape, n_layer=a.layers)
        spec = SparseSpec(pred_rank=a.pred_rank)
        freq, tag = None, ""
        if a.workload:
            trace = _workload(a.workload, shape, a.seed, out / "workload", console)
            freq, bits = trace.group_freq, trace.bits(0, "predicted")
            tag = "-wl" + hashlib.sha256(freq.tobytes()).hexdigest()[:12]
        path = out / f"synthetic-{a.synthetic}-{shape.n_layer}l-r{a.pred_rank}{tag}.gguf"
        if not path.exists():
            console.print(f"writing {path} ...")
            write_synthetic_llama(path, shape, "q4_0", spec, group_size=32, group_freq=freq)
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
                tps, dev = decode_tps(m, p, prompt, a.n_predict, bits)
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
    try:
        sys.exit(main())
    except KairoxError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
