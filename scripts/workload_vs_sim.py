#!/usr/bin/env python3
"""A workload on the real runtime, next to the simulator's replay of the same workload.

    python3 scripts/workload_vs_sim.py relu-7b --layers 8 --steps 64 --seqs 2 [--seed 0]
    python3 scripts/workload_vs_sim.py WORKLOAD_DIR [--budgets 0.25,0.5,0.75] [--policies all]
        [-t THREADS] [--out bench-out/workload-vs-sim]

Why: `kairox simulate` compares balancer policies on workloads without a GPU; this runs the
same workload through the runtime itself (kernels, device cache, balancer, reloads) and checks
that the simulator predicts what the runtime does. Steps:

1. the workload: a `kairox workload` directory, or a preset generated into OUT/workload
   (`--weight-type`, default q4_0: the type of the model below, so that both sides count the
   same bytes per group);
2. a synthetic model of the workload's shape (random weights, kairox.synthetic), with the
   workload's group frequencies as its profiled ones, cached under ~/.cache/kairox/synthetic;
3. CPU-only sparse decode of each sequence with the workload's masks (Session.set_workload):
   the per-layer counters must equal the workload's bits; tok/s next to the same model with
   fixed random masks of the same mean density (what a fixed-mask benchmark measures);
4. the hybrid runtime on the CPU stand-in device for every policy and budget (deterministic:
   no timing feedback, nothing adapts), and the simulator's replay of the workload with the
   runtime's per-layer slots (kairox_py.sim.agreement): reload volume and hit rates.

Results under --out: summary.csv / summary.md / per_layer.csv (agreement) and speed.csv.
Exit status 1 when a row is off by more than 10%.
"""
from __future__ import annotations

import argparse
import csv
import hashlib
import sys
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
from rich.console import Console

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from kairox_py.benchmark.synthetic import SYNTHETIC_VERSION, LlamaShape, SparseSpec, pred_threshold_for  # noqa: E402
from kairox_py.benchmark.synthetic import write_synthetic_llama  # noqa: E402
from kairox_py.default_model import cache_dir  # noqa: E402
from kairox_py.errors import KairoxError  # noqa: E402
from kairox_py.hybrid import POLICIES  # noqa: E402
from kairox_py.llama import ContextParams, Model, Session  # noqa: E402
from kairox_py.progress import make_progress  # noqa: E402
from kairox_py.sim import agreement  # noqa: E402
from kairox_py.sim.agreement import RuntimeCounts  # noqa: E402
from kairox_py.sim.replay import SequenceData, trace_cpu  # noqa: E402
from kairox_py.sim.traces import Trace  # noqa: E402
from kairox_py.workload.model import PRESETS, resolve  # noqa: E402
from kairox_py.workload.write import open_workload, write_workload  # noqa: E402

GIB = float(1 << 30)
#: weight types a synthetic model can be written in
MODEL_TYPES = ("q4_0", "q8_0", "f16")
#: tokens the decode feeds (the synthetic model's output is meaningless, so no sampling)
FILLER = 300


def _workload(source: str, out: Path, a: argparse.Namespace, console: Console) -> Trace:
    if source in PRESETS:
        p = resolve(source, seed=a.seed, n_steps=a.steps, n_seq=a.seqs, n_layer=a.layers,
                    weight_type=a.weight_type)
        console.print(f"generating {source} (seed {a.seed}): {p.n_seq} x {p.n_steps} steps, "
                      f"{p.shape.n_layer} layers x {p.shape.n_ff} neurons")
        return write_workload(p, out / "workload")
    if a.layers or a.steps or a.seqs:
        raise KairoxError("--layers, --steps and --seqs shape a generated workload, not a directory")
    return open_workload(source)[0]


def _model(trace: Trace, weight_type: str, console: Console) -> Path:
    """The synthetic model of the workload's shape (written once, then reused)."""
    m = trace.meta
    n_head = next(h for h in (m.n_embd // 128, m.n_embd // 64, 1) if h >= 1 and m.n_embd % h == 0)
    shape = LlamaShape(n_embd=m.n_embd, n_ff=m.n_ff, n_layer=m.n_layer, n_head=n_head, n_head_kv=n_head,
                       n_vocab=32000, n_ctx=max(512, m.n_steps + 16))
    freq = np.asarray(trace.group_freq, dtype=np.float32)
    key = hashlib.sha256(repr((shape, weight_type, m.group_size)).encode() + freq.tobytes()).hexdigest()[:16]
    root = cache_dir() / "synthetic"
    root.mkdir(parents=True, exist_ok=True)
    path = root / f"workload-{m.n_layer}x{m.n_embd}x{m.n_ff}-{weight_type}-{key}-v{SYNTHETIC_VERSION}.gguf"
    if not path.exists():
        with console.status(f"writing synthetic model {path.name} (random weights, speed only)"):
            write_synthetic_llama(path, shape, weight_type, SparseSpec(pred_rank=0), group_size=m.group_size,
                                  group_freq=freq)
    return path


def _decode(s: Session, n_steps: int) -> float:
    """Decode n_steps single tokens; seconds per token after the first (graph build)."""
    s.decode([FILLER])
    t0 = time.perf_counter()
    for t in range(1, n_steps):
        s.decode([FILLER + t % 97])
    return (time.perf_counter() - t0) / max(n_steps - 1, 1)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("source", metavar="PRESET|DIR", help=f"a preset ({', '.join(PRESETS)}) or a workload directory")
    ap.add_argument("--seed", type=int, default=0, help="preset: the draw")
    ap.add_argument("--layers", type=int, default=None, help="preset: layers (default: the shape's)")
    ap.add_argument("--steps", type=int, default=None, help="preset: steps per sequence (default 256)")
    ap.add_argument("--seqs", type=int, default=None, help="preset: sequences (default 4)")
    ap.add_argument("--weight-type", choices=MODEL_TYPES, default="q4_0",
                    help="preset: the weight type of the workload's costs and of the model")
    ap.add_argument("--budgets", default="0.25,0.5,0.75", help="shares of the whole group cache")
    ap.add_argument("--policies", default="all")
    ap.add_argument("-t", "--threads", type=int, default=None)
    ap.add_argument("--out", default="bench-out/workload-vs-sim")
    a = ap.parse_args(argv)
    console = Console(stderr=True, highlight=False, width=150)
    policies = list(POLICIES) if a.policies == "all" else a.policies.split(",")
    for p in policies:
        if p not in POLICIES:
            raise KairoxError(f"unknown policy {p!r} (one of {', '.join(POLICIES)})")
    shares = [float(b) for b in a.budgets.split(",")]
    if any(not 0.0 < s <= 1.0 for s in shares):
        raise KairoxError("budgets are shares of the group cache in (0, 1]")
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()

    trace = _workload(a.source, out, a, console)
    wtype = str((trace.meta.costs or {}).get("types", {}).get("up", a.weight_type))
    if wtype not in MODEL_TYPES:
        raise KairoxError(f"the workload's costs assume {wtype} weights; a synthetic model is one of "
                          f"{', '.join(MODEL_TYPES)} (generate the workload with --weight-type)")
    path = _model(trace, wtype, console)
    seqs, n_steps, L = range(trace.n_seq), trace.n_steps, trace.n_layer
    want = np.stack([trace.mask(s, "predicted").sum(axis=(0, 2)) for s in seqs]).sum(axis=0)
    density = float(want.sum()) / (trace.n_seq * n_steps * L * trace.n_ff)
    speed: list[dict[str, object]] = []
    counts = RuntimeCounts()
    base = ContextParams(n_ctx=n_steps + 16, n_batch=8, mode="predictor", n_threads=a.threads)
    with Model(path) as model, make_progress(console) as bar:
        task = bar.add_task("runtime runs", total=2 + len(shares) * len(policies))
        # warm-up: the weights into the page cache, so that the first timed run does not read the disk
        with model.session(base) as sess:
            _decode(sess, 4)
        # CPU only: the workload's masks, checked against its bits; then fixed masks
        per_tok, got = [], np.zeros(L, dtype=np.int64)
        for s in seqs:
            with model.session(replace(base, stats=True)) as sess:
                sess.set_workload(trace.bits(s, "predicted"))
                per_tok.append(_decode(sess, n_steps))
                got += [st.predicted for st in sess.layer_stats()]
        if not np.array_equal(got, want):
            raise KairoxError(f"the runtime's selected neurons per layer {got.tolist()} differ from the "
                              f"workload's {want.tolist()}")
        speed.append({"run": "CPU only, workload masks", "density": density, "ms_per_token": 1e3 * np.mean(per_tok)})
        bar.advance(task)
        thr = pred_threshold_for(density, SparseSpec(pred_rank=0))
        with model.session(replace(base, pred_threshold=thr)) as sess:
            ms = 1e3 * np.mean([_decode(sess, n_steps // 2) for _ in seqs])
        speed.append({"run": "CPU only, fixed random masks", "density": 1.0 - thr, "ms_per_token": ms})
        bar.advance(task)

        with model.session(replace(base, vram_budget_gib=1024.0, policy="static")) as sess:
            info = sess.hybrid_info()
            assert info is not None
            dense, cache = float(info.dense_bytes), float(info.cache_bytes)
        for share in shares:
            budget = (dense + share * cache) / GIB
            for pol in policies:
                per_tok = []
                for s in seqs:
                    with model.session(replace(base, vram_budget_gib=budget, policy=pol, deterministic=True)) as sess:
                        sess.set_workload(trace.bits(s, "predicted"))
                        per_tok.append(_decode(sess, n_steps))
                        counts.add(share, pol, sess.hybrid_stats())
                speed.append({"run": f"stand-in {pol} {share:g}", "density": density,
                              "ms_per_token": 1e3 * np.mean(per_tok)})
                bar.advance(task)

    data = SequenceData(trace, "predicted", trace.meta.group_size)
    rows, per_layer = agreement.compare(data, trace_cpu(trace), counts, shares, policies, drop_first_step=False)
    title = (f"CPU stand-in vs simulator replay of {trace.dir.name} ({trace.n_seq} x {n_steps} steps, "
             f"{L} layers x {trace.n_ff}, group {trace.meta.group_size}, {wtype})")
    console.print(agreement.table(rows, title))
    agreement.write(out, rows, per_layer, f"{title}: `python3 scripts/workload_vs_sim.py {a.source}`")
    with open(out / "speed.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(speed[0]))
        w.writeheader()
        w.writerows(speed)
    for r in speed:
        console.print(f"{r['run']:<32} density {float(r['density']):.3f}  {float(r['ms_per_token']):8.2f} ms/token")
    n_ok = sum(agreement.within(r) for r in rows)
    console.print(f"masks equal the workload's in every layer; {n_ok}/{len(rows)} within 10%; "
                  f"{time.monotonic() - t0:.0f} s; wrote {out}/summary.csv, summary.md, per_layer.csv, speed.csv")
    return 0 if n_ok == len(rows) else 1


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KairoxError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
