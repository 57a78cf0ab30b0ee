#!/usr/bin/env python3
"""Head-to-head at the same VRAM: llama.cpp's layer offload against Kairox's hybrid runtime,
same weights, same build, same threads, one run.

One synthetic model (LLaMA-2-7B shapes by default, Q4_0, random weights: speed only) is
written as a Kairox GGUF, and its original (the same tensors without the Kairox data) is
derived from it. A VRAM budget is a share of the original's bytes. Rows, per budget:

- llama.cpp (llama-bench of this build, the original GGUF): the largest `-ngl N` whose layers
  fit the budget; `-ngl 99 -ot "ffn_(up|gate|down)=CPU"` (attention and norms on the GPU, FFN
  weights on the CPU) where its dense part fits; and every layer on the GPU (the
  everything-fits reference).
- Kairox, its attention on the GPU and its FFN sparse: CPU-only (no cache), then the hybrid
  runtime with the cache the budget leaves after the dense part, for each balancer policy
  (static = PowerInfer's offline placement, eager, TAM with fixed lambda, TAM adaptive; each
  with the live pipeline's head start, and TAM adaptive also without it: `tam/no-head-start`,
  and with the scheduler's synchronous host copies: `tam/sync-copies`), and with every group
  cached (everything fits).

Kairox's masks come from activation workloads run through the real runtime
(`Session.set_workload`): `fixed` (the same random neurons every token), `random` (fresh
random neurons every token: no locality), and the presets of `kairox workload` (relu-7b,
silu-7b). Each workload places its cache from its own group frequencies, written into the model
before it is loaded. Decode tok/s are medians over --runs rounds after one warm-up round (each
round in a rotated order), with
the hybrid statistics of the last round (hit rate, reload volume, CPU-half time, lambda) and
the backend splits of a decode step (each a hand-over between the CPU and the device).

    python3 scripts/hybrid_h2h.py --out h2h                          # on the GPU machine
    python3 scripts/hybrid_h2h.py --layers 2 --runs 1 --out /tmp/h2h   # a quick check anywhere

Writes h2h.csv, h2h.md and h2h.png into --out (rows are added to the CSV as they finish, so a
run stopped by --deadline keeps what it measured), and each Kairox row's per-token decode latency
over the sequence (the paper's Figure 14; its last round) into h2h_latency.csv and
h2h_latency.png.
"""
from __future__ import annotations

import argparse
import contextlib
import csv
import os
import platform
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
from gguf import GGUFReader
from rich.console import Console

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from kairox_py.benchmark.synthetic import SHAPES, SparseSpec, set_group_freq  # noqa: E402
from kairox_py.benchmark.synthetic import write_original, write_synthetic_llama  # noqa: E402
from kairox_py._lib import find_tool  # noqa: E402
from kairox_py.errors import KairoxError  # noqa: E402
from kairox_py.hybrid import POLICIES  # noqa: E402
from kairox_py.llama import FFN_WEIGHTS, ContextParams, Model, has_gpu  # noqa: E402
from kairox_py.sim.traces import pack  # noqa: E402
from kairox_py.workload.model import PRESETS as WORKLOAD_PRESETS  # noqa: E402
from kairox_py.workload.model import resolve  # noqa: E402
from kairox_py.workload.write import write_workload  # noqa: E402

GIB = float(1 << 30)
GROUP = 32
# a policy's ablations (POLICY/ABLATION): none, every layer planned at its own step, the
# scheduler's synchronous host <-> device copies (the variable is read when a context starts)
ABLATIONS = ("", "no-head-start", "sync-copies")
SYNC_COPIES_ENV = "GGML_SCHED_SYNC_HOST_COPIES"
PROMPT = "The tide comes in twice a day because"
FIELDS = ["workload", "budget", "engine", "config", "tok_s", "runs", "vram_gib", "cache_share", "hit_rate",
          "reload_mb_per_tok", "cpu_us_per_layer", "io_bound_share", "lambda_mean", "margin_mean", "splits_per_tok",
          "waits_per_tok", "ahead_share", "early_load_share", "plan_us_per_layer", "stall_us_per_layer",
          "dev_us_per_layer", "overlap_share", "gpu_busy_share", "vs_best_ngl", "vs_cpu_only"]
# tokens decoded after the measured ones with the halves timed (timing costs a little speed, so
# it stays out of tok/s)
TIMED_TOKENS = 8


@dataclass
class Row:
    workload: str
    budget: str
    engine: str
    config: str
    runs: list[float] = field(default_factory=list)
    vram_gib: float = float("nan")
    cache_share: float = float("nan")
    stats: dict[str, float] = field(default_factory=dict)
    latency_ms: list[float] = field(default_factory=list)  # per decoded token, the last round's

    @property
    def tok_s(self) -> float:
        return statistics.median(self.runs) if self.runs else float("nan")


def layer_bytes(path: Path) -> tuple[int, int, int]:
    """(bytes of one repeating layer, output.weight's bytes, all tensor bytes) of a GGUF."""
    r = GGUFReader(path)
    per: dict[int, int] = {}
    out = total = 0
    for t in r.tensors:
        total += int(t.n_bytes)
        if t.name.startswith("blk."):
            i = int(t.name.split(".")[1])
            per[i] = per.get(i, 0) + int(t.n_bytes)
        elif t.name == "output.weight":
            out = int(t.n_bytes)
    return max(per.values()), out, total


def best_ngl(budget: float, n_layer: int, per_layer: int, out_bytes: int) -> int:
    """llama.cpp's largest -ngl whose offloaded weights fit the budget (layer n_layer is the output)."""
    n = min(n_layer, int(budget // per_layer))
    if n == n_layer and n_layer * per_layer + out_bytes <= budget:
        n += 1
    return n


def llama_bench(bench: str, model: Path, args: list[str], threads: int, n: int, reps: int) -> list[float]:
    """Decode tok/s of each repetition of llama-bench's tg test (its own warm-up run first)."""
    cmd = [bench, "-m", str(model), "-p", "0", "-n", str(n), "-r", str(reps), "-t", str(threads),
           "-o", "jsonl", *args]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    if p.returncode != 0:
        raise KairoxError(f"{' '.join(cmd)} failed: {p.stderr.strip()[-400:]}")
    import json
    for line in p.stdout.splitlines():
        if line.startswith("{"):
            rec = json.loads(line)
            return [float(x) for x in rec.get("samples_ts", [rec["avg_ts"]])]
    raise KairoxError(f"llama-bench printed no result: {p.stdout[-400:]}")


def workload_bits(name: str, n_layer: int, n_ff: int, steps: int, density: float, seed: int,
                  scratch: Path) -> tuple[np.ndarray, np.ndarray]:
    """(packed masks (steps, n_layer, n_ff / 8), group frequencies (n_layer, n_ff / GROUP)) of a workload."""
    rng = np.random.default_rng(seed)
    if name == "fixed":
        m = rng.random((1, n_layer, n_ff)) < density
        m = np.repeat(m, steps, axis=0)
    elif name == "random":
        m = rng.random((steps, n_layer, n_ff)) < density
    elif name in WORKLOAD_PRESETS:
        p = resolve(name, seed=seed, n_layer=n_layer, n_ff=n_ff, weight_type="q4_0", n_seq=1, n_steps=steps)
        trace = write_workload(p, scratch / f"workload-{name}")
        bits = trace.bits(0, "predicted")
        return bits, np.asarray(trace.group_freq, dtype=np.float32)
    else:
        raise KairoxError(f"unknown workload {name!r} (fixed, random, {', '.join(WORKLOAD_PRESETS)})")
    freq = m.reshape(steps, n_layer, n_ff // GROUP, GROUP).mean(axis=(0, 3)).astype(np.float32)
    return pack(m), freq


@contextlib.contextmanager
def sync_copies(on: bool) -> Iterator[None]:
    """The scheduler's synchronous host <-> device copies for contexts started inside (on)."""
    before = os.environ.get(SYNC_COPIES_ENV)
    if on:
        os.environ[SYNC_COPIES_ENV] = "1"
    try:
        yield
    finally:
        if on and before is None:
            del os.environ[SYNC_COPIES_ENV]
        elif on:
            os.environ[SYNC_COPIES_ENV] = before


def kairox_run(m: Model, params: ContextParams, prompt: list[int], n: int, bits: np.ndarray,
               sync: bool = False) -> tuple[float, dict[str, float], list[float]]:
    """Greedy decode tok/s after the prompt under the workload, and the hybrid statistics of the
    decode, then the halves' times and the device's busy share over TIMED_TOKENS more tokens, and
    each measured token's latency (ms); sync: the context's scheduler copies between host and
    device synchronously."""
    with sync_copies(sync):
        session = m.session(params)
    with session as s:
        s.set_workload(bits)
        s.decode(prompt)
        tok = int(s.logits().argmax())
        if s.hybrid_info() is not None:
            s.reset_hybrid_stats()
        t0 = time.perf_counter()
        stamps = [t0]
        for _ in range(n):
            s.decode([tok])
            tok = int(s.logits().argmax())
            stamps.append(time.perf_counter())
        dt = stamps[-1] - t0
        latency = [1000.0 * (b - a) for a, b in zip(stamps, stamps[1:])]
        # the last token's graph: its backend splits, and the scheduler's waits for the GPU in it
        st: dict[str, float] = {"splits_per_tok": float(s.graph_splits()), "waits_per_tok": float(s.graph_waits())}
        hs = s.hybrid_stats() if s.hybrid_info() is not None else []
        if hs:
            # a layer whose every group is resident runs on the device with no plan step (no counts):
            # its hit rate is 1 by construction
            planned = [x for x in hs if x.steps > 0]
            active = sum(x.active for x in planned)
            full = all(x.n_slots == x.n_groups for x in hs if x.steps == 0)
            steps = max(1, max(x.steps for x in hs))
            st |= {
                "hit_rate": sum(x.active_dev for x in planned) / active if active else 1.0 if full else float("nan"),
                "reload_mb_per_tok": sum(x.bytes_reloaded for x in hs) / 1e6 / steps,
                "cpu_us_per_layer": sum(x.t_cpu_us for x in hs) / max(1, sum(x.steps for x in hs)),
                "io_bound_share": sum(x.io_bound_steps for x in hs) / max(1, sum(x.steps for x in hs)),
                "lambda_mean": float(np.mean([x.lambda_now for x in hs])),
                "margin_mean": float(np.mean([x.margin_now for x in hs])),
                # the live pipeline: steps planned during the layer before, loads landed in their
                # own token, the plan's and the reload waits' time per planned layer step
                "ahead_share": sum(x.steps_ahead for x in hs) / max(1, sum(x.steps for x in hs)),
                "early_load_share": sum(x.loads_early for x in hs) / max(1, sum(x.loads for x in hs)),
                "plan_us_per_layer": sum(x.t_plan_us for x in hs) / max(1, sum(x.steps for x in hs)),
                "stall_us_per_layer": sum(x.t_stall_us for x in hs) / max(1, sum(x.steps for x in hs)),
            }
            # the halves, timed apart from the measured tokens: the device half's time per timed
            # layer step, and the share of the shorter half's time the other computed alongside
            s.set_hybrid_timing(True)
            s.reset_hybrid_stats()
            for _ in range(TIMED_TOKENS):
                s.decode([tok])
                tok = int(s.logits().argmax())
            ts = s.hybrid_stats()
            timed = sum(x.timed_steps for x in ts)
            if timed:
                st["dev_us_per_layer"] = sum(x.t_dev_us for x in ts) / timed
                shorter = sum(x.t_shorter_us for x in ts)
                st["overlap_share"] = sum(x.t_overlap_us for x in ts) / shorter if shorter > 0 else float("nan")
            # the device's busy share of the timed tokens' graphs (the paper's Figure 12)
            graphs, wall, busy = s.device_busy()
            if graphs and wall > 0:
                st["gpu_busy_share"] = busy / wall
        return n / dt, st, latency


def write_tables(rows: list[Row], out: Path, title: str) -> None:
    best: dict[str, float] = {}
    cpu: dict[str, float] = {}
    for r in rows:
        if r.engine == "llama.cpp" and r.config.startswith("-ngl") and "-ot" not in r.config:
            best[r.budget] = max(best.get(r.budget, 0.0), r.tok_s)
        if r.config == "CPU-only sparse":
            cpu[r.workload] = r.tok_s

    def ratio(a: float, b: float | None) -> str:
        return f"{a / b:.2f}" if b and b == b and a == a else ""

    with open(out / "h2h.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(FIELDS)
        for r in rows:
            st = r.stats
            w.writerow([r.workload, r.budget, r.engine, r.config, f"{r.tok_s:.3f}", " ".join(f"{x:.2f}" for x in r.runs),
                        f"{r.vram_gib:.3f}", f"{r.cache_share:.3f}",
                        *(f"{st[k]:.4f}" if k in st else "" for k in
                          ("hit_rate", "reload_mb_per_tok", "cpu_us_per_layer", "io_bound_share", "lambda_mean",
                           "margin_mean", "splits_per_tok", "waits_per_tok", "ahead_share", "early_load_share",
                           "plan_us_per_layer", "stall_us_per_layer", "dev_us_per_layer", "overlap_share",
                           "gpu_busy_share")),
                        ratio(r.tok_s, best.get(r.budget)), ratio(r.tok_s, cpu.get(r.workload))])
    head = ["workload", "budget", "engine", "configuration", "tok/s", "VRAM GiB", "cache share", "hit rate",
            "reload MB/tok", "CPU half us/layer", "device half us/layer", "halves overlap", "GPU busy", "planned ahead",
            "loads landed early", "splits/token", "GPU waits/token",
            "x best -ngl", "x CPU-only"]
    with open(out / "h2h.md", "w") as f:
        f.write(f"{title}\n\n| " + " | ".join(head) + " |\n" + "|---" * len(head) + "|\n")
        for r in rows:
            st = r.stats
            f.write("| " + " | ".join([
                r.workload, r.budget, r.engine, r.config, f"{r.tok_s:.1f}", f"{r.vram_gib:.2f}",
                "" if r.cache_share != r.cache_share else f"{r.cache_share:.2f}",
                f"{st['hit_rate']:.2f}" if "hit_rate" in st else "",
                f"{st['reload_mb_per_tok']:.1f}" if "reload_mb_per_tok" in st else "",
                f"{st['cpu_us_per_layer']:.0f}" if "cpu_us_per_layer" in st else "",
                f"{st['dev_us_per_layer']:.0f}" if "dev_us_per_layer" in st else "",
                f"{st['overlap_share']:.2f}" if "overlap_share" in st else "",
                f"{st['gpu_busy_share']:.2f}" if "gpu_busy_share" in st else "",
                f"{st['ahead_share']:.2f}" if "ahead_share" in st else "",
                f"{st['early_load_share']:.2f}" if "early_load_share" in st else "",
                f"{st['splits_per_tok']:.0f}" if "splits_per_tok" in st else "",
                f"{st['waits_per_tok']:.0f}" if "waits_per_tok" in st else "",
                ratio(r.tok_s, best.get(r.budget)) + ("x" if best.get(r.budget) else ""),
                ratio(r.tok_s, cpu.get(r.workload)) + ("x" if cpu.get(r.workload) else ""),
            ]) + " |\n")


def pyplot() -> Any:
    """matplotlib's pyplot on the Agg backend, or None where matplotlib is not installed (the
    GPU machine may lack it: the tables are still written)."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    return plt


def write_latency(rows: list[Row], out: Path, title: str, png: bool = True) -> None:
    """Per-token decode latency over the sequence of each Kairox row (llama-bench reports only
    averages): h2h_latency.csv, and (png) h2h_latency.png with one panel per workload."""
    lat = [r for r in rows if r.latency_ms]
    with open(out / "h2h_latency.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["workload", "budget", "config", "token", "latency_ms"])
        for r in lat:
            w.writerows([r.workload, r.budget, r.config, i, f"{ms:.3f}"] for i, ms in enumerate(r.latency_ms))
    if not png:
        return
    plt = pyplot()
    if plt is None:
        return
    workloads = list(dict.fromkeys(r.workload for r in lat))
    if not workloads:
        return
    fig, axes = plt.subplots(1, len(workloads), figsize=(5 * len(workloads), 4), squeeze=False)
    for ax, wname in zip(axes[0], workloads):
        for r in (r for r in lat if r.workload == wname):
            ax.plot(r.latency_ms, label=f"{r.config} ({r.budget})", linewidth=1)
        ax.set_xlabel("decoded token")
        ax.set_ylabel("latency (ms)")
        ax.set_title(wname)
        ax.legend(fontsize=6)
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(out / "h2h_latency.png", dpi=120)
    plt.close(fig)


def plot(rows: list[Row], out: Path, title: str) -> None:
    plt = pyplot()
    if plt is None:
        return
    budgets = [b for b in dict.fromkeys(r.budget for r in rows) if b != "-"]
    workloads = list(dict.fromkeys(r.workload for r in rows if r.engine == "Kairox"))
    if not budgets or not workloads:
        return
    fig, axes = plt.subplots(1, len(budgets), figsize=(6 * len(budgets), 4.5), squeeze=False)
    for ax, b in zip(axes[0], budgets):
        base = [r for r in rows if r.engine == "llama.cpp" and r.budget == b]
        labels = [r.config for r in base]
        vals = [[r.tok_s] * len(workloads) for r in base]
        configs = list(dict.fromkeys(r.config for r in rows if r.engine == "Kairox" and r.budget in (b, "-")))
        for c in configs:
            labels.append("Kairox " + c)
            vals.append([next((r.tok_s for r in rows if r.engine == "Kairox" and r.config == c and r.workload == w
                               and r.budget in (b, "-")), np.nan) for w in workloads])
        x = np.arange(len(labels))
        width = 0.8 / len(workloads)
        for j, w in enumerate(workloads):
            ax.bar(x + j * width, [v[j] for v in vals], width, label=w)
        ax.set_xticks(x + 0.4 - width / 2, labels, rotation=60, ha="right", fontsize=7)
        ax.set_yscale("log")
        ax.set_ylabel("decode tok/s")
        ax.set_title(f"VRAM budget {b}")
        ax.legend(fontsize=7)
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(out / "h2h.png", dpi=120)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shape", default="7b", choices=sorted(SHAPES))
    ap.add_argument("--layers", type=int, default=0, help="this many layers (0: the shape's)")
    ap.add_argument("--workloads", default="relu-7b,silu-7b,fixed,random")
    ap.add_argument("--density", type=float, default=0.1, help="fixed and random workloads: share of neurons selected")
    ap.add_argument("--budgets", default="0.5,0.75", help="VRAM budgets as shares of the original's bytes")
    ap.add_argument("--policies", default="static,eager,tam-t,tam,tam/no-head-start,tam/sync-copies",
                    help="balancer policies; POLICY/no-head-start: that policy with every layer planned at "
                         "its own step, POLICY/sync-copies: with the scheduler's synchronous host <-> device "
                         "copies (the pipeline's ablations)")
    ap.add_argument("--fit-policy", default="tam", help="the policy of the everything-fits row")
    ap.add_argument("-n", "--n-predict", type=int, default=32)
    ap.add_argument("--runs", type=int, default=2)
    ap.add_argument("-t", "--threads", type=int, default=8)
    ap.add_argument("--steps", type=int, default=128, help="workload steps (a decode wraps around)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--llama-bench", default="", help="llama-bench of this build (default: next to the library)")
    ap.add_argument("--models", default="", help="where the models are written (default: --out)")
    ap.add_argument("--deadline", type=float, default=0.0, help="seconds after which no new row starts (0: none)")
    ap.add_argument("--out", default="h2h")
    a = ap.parse_args()

    t_start = time.monotonic()
    console = Console(stderr=True)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    mdir = Path(a.models) if a.models else out
    mdir.mkdir(parents=True, exist_ok=True)
    shape = SHAPES[a.shape]
    if a.layers:
        shape = replace(shape, n_layer=a.layers)
    L, n_ff = shape.n_layer, shape.n_ff
    budgets = [float(x) for x in a.budgets.split(",") if x.strip()]
    policies = [p.strip() for p in a.policies.split(",") if p.strip()]
    for p in policies:
        name, _, opt = p.partition("/")
        if name not in POLICIES or opt not in ABLATIONS:
            raise KairoxError(f"unknown policy {p!r}: one of {', '.join(POLICIES)}, optionally with "
                              f"{' or '.join('/' + x for x in ABLATIONS if x)}")
    workloads = [w.strip() for w in a.workloads.split(",") if w.strip()]

    def late() -> bool:
        return a.deadline > 0 and time.monotonic() - t_start > a.deadline

    kx_path = mdir / f"h2h-{a.shape}-{L}l.kairox.gguf"
    orig_path = mdir / f"h2h-{a.shape}-{L}l.gguf"
    if not kx_path.exists():
        console.print(f"writing {kx_path} ...")
        write_synthetic_llama(kx_path, shape, "q4_0", SparseSpec(pred_rank=0), seed=a.seed, group_size=GROUP,
                              group_freq=np.full((L, n_ff // GROUP), a.density, np.float32))
    if not orig_path.exists():
        console.print(f"deriving the original {orig_path} ...")
        write_original(kx_path, orig_path)
    per_layer, out_bytes, total = layer_bytes(orig_path)
    gpu = has_gpu()
    where = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True,
                           text=True).stdout.strip() if gpu and shutil.which("nvidia-smi") else "CPU stand-in"
    cpu_name = next((ln.split(":", 1)[1].strip() for ln in open("/proc/cpuinfo") if ln.startswith("model name")),
                    platform.processor())
    title = (f"decode tok/s, synthetic {a.shape} x {L} layers Q4_0 ({total / 1e9:.2f} GB original), {a.n_predict} "
             f"tokens, {a.threads} threads, median of {a.runs}; GPU: {where}; CPU: {cpu_name}; "
             f"{time.strftime('%Y-%m-%d')}")
    console.print(title)

    rows: list[Row] = []

    def add(r: Row) -> None:
        rows.append(r)
        write_tables(rows, out, title)
        write_latency(rows, out, title, png=False)
        console.print(f"  {r.workload:8s} {r.budget:6s} {r.engine:9s} {r.config:34s} {r.tok_s:8.2f} tok/s "
                      + " ".join(f"{k}={v:.3g}" for k, v in r.stats.items()))

    # llama.cpp: the original GGUF through upstream's kernels and offload
    bench = a.llama_bench or str(find_tool("llama-bench") or "")
    if bench and gpu:
        ffn_layer = sum(int(t.n_bytes) for t in GGUFReader(orig_path).tensors if t.name.startswith("blk.0.ffn_")
                        and not t.name.endswith("norm.weight"))
        attn_bytes = L * (per_layer - ffn_layer) + out_bytes
        seen: dict[str, Row] = {}
        for b in budgets + [float("inf")]:
            label = "fit" if b == float("inf") else f"{b:.0%}"
            vram = total if b == float("inf") else b * total
            configs = []
            n = L + 1 if b == float("inf") else best_ngl(vram, L, per_layer, out_bytes)
            configs.append((f"-ngl {n}", ["-ngl", str(n)], n * per_layer + (out_bytes if n > L else 0)))
            if b != float("inf") and attn_bytes <= vram:
                configs.append((f"-ngl 99 -ot {FFN_WEIGHTS}=CPU", ["-ngl", "99", "-ot", f"{FFN_WEIGHTS}=CPU"],
                                attn_bytes))
            for name, args, used in configs:
                if late():
                    break
                key = name
                if key not in seen:
                    r = Row("-", label, "llama.cpp", name, vram_gib=used / GIB)
                    try:
                        r.runs = llama_bench(bench, orig_path, args, a.threads, a.n_predict, a.runs)
                    except (KairoxError, subprocess.TimeoutExpired) as e:
                        console.print(f"[red]{name}: {e}[/]")
                    seen[key] = r
                else:
                    r = replace(seen[key], budget=label, stats={})
                add(r)
    elif not bench:
        console.print("[yellow]no llama-bench found: llama.cpp rows skipped (--llama-bench PATH)[/]")

    scratch = mdir / "h2h-workloads"
    scratch.mkdir(parents=True, exist_ok=True)
    for wname in workloads:
        if late():
            break
        try:
            kairox_rows(a, wname, kx_path, total, scratch, policies, budgets, late, add, console)
        except KairoxError as e:
            console.print(f"[red]workload {wname}: {e}[/]")
    write_tables(rows, out, title)
    plot(rows, out, title)
    write_latency(rows, out, title)
    console.print(f"wrote {out / 'h2h.csv'}, {out / 'h2h.md'}, {out / 'h2h.png'} in {time.monotonic() - t_start:.0f} s")
    return 0


def kairox_rows(a: argparse.Namespace, wname: str, kx_path: Path, total: int, scratch: Path, policies: list[str],
                budgets: list[float], late: Callable[[], bool], add: Callable[[Row], None],
                console: Console) -> None:
    """Kairox's rows of one workload: CPU-only, each budget and policy, everything cached."""
    L = a.layers or SHAPES[a.shape].n_layer
    n_ff = SHAPES[a.shape].n_ff
    bits, freq = workload_bits(wname, L, n_ff, a.steps, a.density, a.seed, scratch)
    set_group_freq(kx_path, freq)
    with Model(kx_path, ffn_on_host=True, use_mmap=False) as m:
        prompt = m.tokenize(PROMPT)
        base = ContextParams(n_ctx=256, n_batch=64, n_threads=a.threads, mode="predictor")
        with m.session(replace(base, vram_budget_gib=1024.0)) as s:
            info = s.hybrid_info()
            if info is None:
                raise KairoxError("the hybrid runtime did not start on this model")
            dense_b, cache_b = float(info.dense_bytes), float(info.cache_bytes)
        # (budget label, configuration, params, VRAM GiB, cache share, synchronous host copies)
        configs: list[tuple[str, str, ContextParams, float, float, bool]] = [
            ("-", "CPU-only sparse", base, dense_b / GIB, 0.0, False)]
        for b in budgets:
            vram = b * total
            share = (vram - dense_b) / cache_b
            if share <= 0:
                console.print(f"[yellow]budget {b:.0%}: the dense part ({dense_b / GIB:.2f} GiB) does not fit[/]")
                continue
            share = min(share, 1.0)
            for pol in policies:
                name, _, opt = pol.partition("/")
                configs.append((f"{b:.0%}", f"hybrid {pol}",
                                replace(base, policy=name, head_start=opt != "no-head-start", vram_budget_gib=vram / GIB),
                                vram / GIB, share, opt == "sync-copies"))
        fit = (dense_b + cache_b) / GIB * 1.0001
        configs.append(("fit", f"hybrid {a.fit_policy}", replace(base, policy=a.fit_policy, vram_budget_gib=fit),
                        fit, 1.0, False))
        results = {c[1] + c[0]: Row(wname, c[0], "Kairox", c[1], vram_gib=c[3], cache_share=c[4]) for c in configs}
        for rnd in range(a.runs + 1):
            # each round starts one configuration later: a session pays for what the one before
            # it left behind (freed buffers, a cold allocator), so no configuration always
            # follows the same one
            k = rnd % len(configs)
            for label, name, p, _, _, sync in configs[k:] + configs[:k]:
                if late():
                    break
                tps, st, latency = kairox_run(m, p, prompt, a.n_predict, bits, sync)
                if rnd > 0:
                    results[name + label].runs.append(tps)
                    results[name + label].stats = st
                    results[name + label].latency_ms = latency
        for r in results.values():
            if r.runs:
                add(r)


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KairoxError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
