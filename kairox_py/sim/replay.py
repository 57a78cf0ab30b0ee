"""`kairox simulate`: replay decode traces through balancer policies with a GPU+CPU cost model.

Why a simulator: this machine has no GPU, yet policies must be compared on real activation
traces under the paper's two PCs. Every decision comes from the C++ balancer
(:class:`~kairox_py.balancer.Balancer`), i.e. the code the hybrid runtime will run; only the
clock is modelled here.

Cost model (per decode step, layer by layer, times in microseconds; see :class:`CostModel`):

* GPU: a kernel costs ``launch_us``; reading weights runs at the GPU's memory bandwidth
  times ``gpu_eff``. Attention of a layer = its kernels + its weights; the sparse FFN on the
  GPU = its kernels + the predictor + the resident active rows (gate, up, down_t bytes).
* CPU: a layer's sparse FFN rows not in VRAM cost what our own sparse kernels measure
  (``test-kairox-ops perf``: time by share of active rows, interpolated), the part above the
  near-empty cost scaled to the preset's threads, never faster than its memory bandwidth.
* PCIe: a copy of b bytes takes ``t0 + b / B``, fitted to the paper's Table 2 (bandwidth by
  group size, PCIe 3.0/4.0); loading a group copies its gate, up and down_t rows (3 copies).
  The CPU's input and partial result cross the link too (critical transfers): they preempt
  reloads, i.e. delay the reload queue but never wait for it.
* Live pipeline: layer l+1's reloads are issued when its adjacent prediction is known (after
  attention l) and overlap FFN l and attention l+1; layer 0's are issued during the last
  layer of the previous token (from that token's layer-0 pattern, activation locality) and
  overlap the output layer and sampling. The link is serial.
* ``wait`` pipeline (the paper's): a layer's GPU FFN waits for its reloads (I/O stall).
  ``async``: it does not; groups not yet landed run on the CPU this step.
* Each layer's stall is classified I/O-bound (waited for reloads / reloads late) or
  CPU-bound (the GPU waited for the CPU's rows) and fed back to the balancer before the
  layer's next step (adaptive TAM).

Throughput = decode tokens per second of the simulated steps.
"""
from __future__ import annotations

import bisect
import csv
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from .. import _lib
from ..balancer import Balancer, BalancerConfig
from ..errors import KairoxError
from .traces import Trace

MODES = ("wait", "async")


# ---------------------------------------------------------------------------------------
# hardware presets (paper section 9.1 and Table 2)
# ---------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Preset:
    """One of the paper's PCs. Bandwidths in GB/s (1e9 bytes/s)."""

    name: str
    gpu: str
    gpu_bw: float  # GPU memory bandwidth (spec sheet)
    vram_gib: float
    cpu: str
    cpu_threads: int
    cpu_mem_bw: float  # host memory bandwidth (channels x transfer rate x 8 bytes)
    pcie: str
    pcie_table: tuple[tuple[int, float], ...]  # Table 2: (group size, measured GB/s)
    pcie_table_row_bytes: int  # bytes of one neuron row in Table 2's measurement (fp16 x hidden)
    gpu_eff: float = 0.6  # share of GPU bandwidth a sparse gather kernel reaches
    cpu_bw_eff: float = 0.5  # share of host bandwidth sparse CPU kernels can reach (lower bound)
    launch_us: float = 4.0  # per GPU kernel (launch + small-kernel floor, no CUDA graphs)
    sample_us: float = 60.0  # CPU-side sampling of one token

    def pcie_fit(self) -> tuple[float, float]:
        """(t0 us, bytes per us) of t(b) = t0 + b / B, least squares on Table 2."""
        b = np.array([gs * self.pcie_table_row_bytes for gs, _ in self.pcie_table], dtype=np.float64)
        t = np.array([bb / (bw * 1e3) for bb, (_, bw) in zip(b, self.pcie_table)])  # us
        slope, t0 = np.polyfit(b, t, 1)
        return float(max(t0, 0.0)), float(1.0 / slope)


PRESETS: dict[str, Preset] = {
    "pc-low": Preset(
        name="pc-low", gpu="RTX 3080 Ti (12 GB)", gpu_bw=912.0, vram_gib=12.0,
        cpu="Xeon E5-2680 v4, 12 threads, 4ch DDR4-2400", cpu_threads=12, cpu_mem_bw=76.8,
        pcie="PCIe 3.0 x16", pcie_table=((1, 3.3), (4, 6.8), (8, 8.7), (16, 10.2), (24, 10.8), (32, 11.1)),
        pcie_table_row_bytes=4096 * 2),
    "pc-high": Preset(
        name="pc-high", gpu="RTX 4090 (24 GB)", gpu_bw=1008.0, vram_gib=24.0,
        cpu="EPYC 7542, 16 threads, 8ch DDR4-3200", cpu_threads=16, cpu_mem_bw=204.8,
        pcie="PCIe 4.0 x16", pcie_table=((1, 5.8), (4, 13.7), (8, 17.8), (16, 20.9), (24, 22.3), (32, 22.8)),
        pcie_table_row_bytes=5120 * 2),
}


# ---------------------------------------------------------------------------------------
# CPU calibration (our sparse kernels on this machine)
# ---------------------------------------------------------------------------------------
@dataclass(frozen=True)
class CpuCalibration:
    """Measured CPU time of one layer's sparse FFN (gate and up mul_mat_sparse + down
    axpy_sparse) by share of active rows, on the machine the microbenchmark ran on. Sparse
    kernels are not linear in the rows (fixed thread-sync cost, then gathers that saturate),
    so the table is interpolated rather than fitted."""

    density: tuple[float, ...]  # share of the layer's n_ff rows computed
    us: tuple[float, ...]  # microseconds for those rows (all three ops)
    n_ff: int
    threads: int
    source: str

    def time_us(self, rows: float) -> float:
        return float(np.interp(rows / self.n_ff, self.density, self.us))


#: `test-kairox-ops perf -t 2 --types q4_1,q8_0 --shapes 576x1536 --reps 400` (3 runs,
#: mean) on this project's 2-core build machine (AMD EPYC, 2 threads): 2 x q4_1
#: mul_mat_sparse (gate, up) + q8_0 axpy_sparse (down_t) for the default model's FFN.
#: See BENCHMARKS.md "Balancer and simulator".
DEFAULT_CPU = CpuCalibration(
    density=(0.0, 0.01, 0.05, 0.10, 0.25, 0.50, 0.75, 1.00),
    us=(37.0, 37.0, 49.0, 70.3, 130.3, 208.3, 267.0, 292.0), n_ff=1536, threads=2,
    source="built-in: test-kairox-ops perf 576x1536, 2x q4_1 mul_mat_sparse + q8_0 axpy_sparse, "
           "2 threads, mean of 3 runs")


def calibration_from_csv(path: str | Path, k: int, n: int, updown_type: str, down_type: str) -> CpuCalibration:
    """The table from `test-kairox-ops perf -o F.csv` rows of shape k x n: two mul_mat_sparse
    (gate, up) of `updown_type` plus one axpy_sparse of `down_type`, per density (mean over
    repeated rows)."""
    acc: dict[tuple[str, str, float], list[float]] = {}
    threads = 0
    try:
        with open(path, newline="") as f:
            for r in csv.DictReader(f):
                if int(r["k"]) != k or int(r["n"]) != n:
                    continue
                acc.setdefault((r["op"], r["type"].lower(), float(r["density"])), []).append(
                    float(r["sparse_us"]))
                threads = int(r["threads"])
    except (OSError, KeyError, ValueError) as e:
        raise KairoxError(f"cannot read calibration CSV {path}: {e}") from None
    dens = sorted({d for (op, t, d) in acc if op == "mul_mat_sparse" and t == updown_type.lower()}
                  & {d for (op, t, d) in acc if op == "axpy_sparse" and t == down_type.lower()})
    if len(dens) < 2:
        raise KairoxError(f"calibration CSV {path} lacks mul_mat_sparse {updown_type} and "
                          f"axpy_sparse {down_type} rows for shape {k}x{n}")
    us = [2 * float(np.mean(acc[("mul_mat_sparse", updown_type.lower(), d)]))
          + float(np.mean(acc[("axpy_sparse", down_type.lower(), d)])) for d in dens]
    return CpuCalibration((0.0, *dens), (us[0], *us), n, threads,
                          f"{path} ({k}x{n}, {threads} threads)")


def trace_cpu(trace: Trace) -> CpuCalibration:
    """The CPU table a trace carries in its metadata (``costs["cpu"]``, which `kairox workload`
    writes for its shape), else the built-in :data:`DEFAULT_CPU`.

    Why: the built-in table is for the default model's FFN width only; a workload at a 7B
    shape knows its own table, so replaying it needs no --cpu-csv. A malformed entry is an
    error rather than a silent fallback to a table for another width."""
    tab = trace.meta.costs.get("cpu")
    if tab is None:
        return DEFAULT_CPU
    try:
        density = tuple(float(d) for d in tab["density"])
        us = tuple(float(u) for u in tab["us"])
        cal = CpuCalibration(density, us, int(tab["n_ff"]), int(tab["threads"]),
                             str(tab.get("source", f"{trace.dir}/meta.json")))
    except (KeyError, TypeError, ValueError) as e:
        raise KairoxError(f"bad CPU table (costs.cpu) in {trace.dir}/meta.json: {e!r}") from None
    if (len(density) < 2 or len(density) != len(us) or list(density) != sorted(density)
            or cal.n_ff < 1 or cal.threads < 1):
        raise KairoxError(f"bad CPU table (costs.cpu) in {trace.dir}/meta.json: need two or more "
                          f"increasing densities with one time each, n_ff and threads >= 1")
    return cal


# ---------------------------------------------------------------------------------------
# the cost model
# ---------------------------------------------------------------------------------------
@dataclass(frozen=True)
class CostModel:
    """Every constant the pipeline clock needs, per layer where it varies (microseconds)."""

    preset: str
    n_layer: int
    group_size: int
    row_bytes: int  # gate + up + down_t bytes of one neuron
    group_bytes: int  # bytes moved to load one group
    attn_us: np.ndarray  # (n_layer,) attention block on the GPU
    gpu_ffn_fixed_us: float  # sparse FFN kernels + predictor on the GPU
    gpu_row_us: float  # per active resident row
    cpu_rows_tab: tuple[float, ...]  # CPU FFN time of a layer by active CPU rows (interpolated)
    cpu_us_tab: tuple[float, ...]
    crit_us: float  # one critical transfer (an n_embd float vector over PCIe)
    group_load_us: float  # PCIe time to load one group (3 copies)
    tail_us: float  # output layer + sampling after the last layer
    notes: dict[str, float | str] = field(default_factory=dict)

    @classmethod
    def build(cls, trace: Trace, preset: Preset, cpu: CpuCalibration, group_size: int) -> CostModel:
        m = trace.meta
        rb = m.costs["row_bytes"]
        row_bytes = int(rb["gate"] + rb["up"] + rb["down"])
        gpu_bpus = preset.gpu_bw * preset.gpu_eff * 1e3  # bytes per microsecond
        t0, pcie_bpus = preset.pcie_fit()
        # attention: norm, q, k, v, 2x rope, scores+softmax+values, output, residual add
        attn = np.array([9 * preset.launch_us + b / gpu_bpus for b in m.costs["attn_bytes"]])
        rank = 256  # predictor upper bound: f16 [n_embd, rank] + [rank, n_ff]
        pred_bytes = 2 * rank * (m.n_embd + m.n_ff)
        # FFN on the GPU: predictor (2), norm, fused gate/up, down, merge add (+ residual)
        gpu_fixed = 6 * preset.launch_us + pred_bytes / gpu_bpus
        # CPU: our measured table scaled to the preset: the part above the near-empty cost
        # (thread sync) shrinks with the thread count, but never below what the preset's
        # memory bandwidth allows for the rows' bytes
        scale = cpu.threads / preset.cpu_threads
        mem_floor = row_bytes / (preset.cpu_mem_bw * preset.cpu_bw_eff * 1e3)  # us per row
        rows_tab = [d * m.n_ff for d in cpu.density]
        base = cpu.us[0]
        us_tab = [base + max((u - base) * scale, r * mem_floor) for r, u in zip(rows_tab, cpu.us)]
        crit = t0 + 4 * m.n_embd / pcie_bpus
        load = 3 * t0 + group_size * row_bytes / pcie_bpus
        tail = 3 * preset.launch_us + m.costs["output_bytes"] / gpu_bpus + preset.sample_us
        if m.n_ff != cpu.n_ff:
            raise KairoxError(f"the CPU calibration is for FFN width {cpu.n_ff}, the trace's model "
                              f"has {m.n_ff}: measure it with test-kairox-ops perf --shapes "
                              f"{m.n_embd}x{m.n_ff} and pass --cpu-csv")
        notes = {"pcie_t0_us": round(t0, 3), "pcie_gbs": round(pcie_bpus / 1e3, 2),
                 "cpu_thread_scale": round(scale, 3), "cpu_mem_floor_us_per_row": round(mem_floor, 5),
                 "cpu_us_at_50pct": round(float(np.interp(0.5 * m.n_ff, rows_tab, us_tab)), 2),
                 "cpu_source": cpu.source}
        return cls(preset.name, m.n_layer, group_size, row_bytes, group_size * row_bytes, attn,
                   gpu_fixed, row_bytes / gpu_bpus, tuple(rows_tab), tuple(us_tab), crit, load,
                   tail, notes)

    def cpu_us(self, rows: float) -> float:
        """CPU FFN time of a layer for `rows` active rows on the CPU (0 for none)."""
        if rows <= 0:
            return 0.0
        xs, ys = self.cpu_rows_tab, self.cpu_us_tab
        i = bisect.bisect_right(xs, rows)
        if i >= len(xs):
            return ys[-1]
        x0, x1 = xs[i - 1], xs[i]
        return ys[i - 1] + (ys[i] - ys[i - 1]) * (rows - x0) / (x1 - x0)


# ---------------------------------------------------------------------------------------
# one simulation
# ---------------------------------------------------------------------------------------
@dataclass(frozen=True)
class SimConfig:
    preset: str = "pc-low"
    budget: float = 0.5  # share of each layer's groups VRAM holds
    balancer: BalancerConfig = field(default_factory=BalancerConfig)
    mode: str = "wait"
    kind: str = "predicted"  # which trace masks the runtime computes: predicted | active
    group_size: int = 0  # 0: the trace's (Kairox GGUF's)
    deadband_us: float = 0.5  # stalls shorter than this give no feedback
    # per-layer resident groups, overriding `budget` (the hybrid runtime apportions its VRAM
    # across layers by activation mass, not uniformly)
    slots: tuple[int, ...] = ()
    # where layer 0's decision comes from: "prefetch" = the previous step's layer-0 pattern
    # (loaded during sampling, the live pipeline); "current" = the step's own prediction
    # (the hybrid runtime plans layer 0 at its own step unless layer 0 and the last layer both
    # split between device and CPU; sim/agreement.py layer0_source)
    layer0: str = "prefetch"

    @property
    def policy(self) -> str:
        return self.balancer.policy

    def label(self) -> str:
        return f"{self.preset}/{self.budget:g}/{self.policy}/{self.mode}"


@dataclass
class SimResult:
    """Per token (all sequences concatenated) and per (token, layer) records."""

    config: SimConfig
    cost: CostModel
    token_us: np.ndarray  # (T,)
    cpu_us: np.ndarray  # (T, L) CPU FFN time
    io_us: np.ndarray  # (T, L) reload transfer time
    io_stall_us: np.ndarray  # (T, L) GPU waited for reloads (wait) / 0 (async)
    cpu_stall_us: np.ndarray  # (T, L) GPU waited for the CPU
    rows: np.ndarray  # (T, L) active rows computed
    gpu_rows: np.ndarray  # (T, L) of them in VRAM
    loads: np.ndarray  # (T, L) groups loaded
    late: np.ndarray  # (T, L) loads not landed in time (async)
    lam: np.ndarray  # (T, L) lambda used for the step
    feedback: np.ndarray  # (T, L) bottleneck fed back after the step
    margin: np.ndarray  # (T, L) swap margin used for the step (adaptive TAM; 0 otherwise)

    @property
    def n_tokens(self) -> int:
        return len(self.token_us)

    @property
    def bytes_moved(self) -> np.ndarray:
        return self.loads * self.cost.group_bytes

    def summary(self) -> dict[str, float | str]:
        c = self.config
        tot = float(self.token_us.sum())
        rows = float(self.rows.sum())
        return {
            "preset": c.preset, "budget": c.budget, "policy": c.policy, "mode": c.mode,
            "tokens": self.n_tokens,
            "tok_s": self.n_tokens / tot * 1e6 if tot > 0 else math.inf,
            "token_ms": tot / self.n_tokens / 1e3,
            "cpu_ms": float(self.cpu_us.sum()) / self.n_tokens / 1e3,
            "io_ms": float(self.io_us.sum()) / self.n_tokens / 1e3,
            "io_stall_ms": float(self.io_stall_us.sum()) / self.n_tokens / 1e3,
            "cpu_stall_ms": float(self.cpu_stall_us.sum()) / self.n_tokens / 1e3,
            "hit_rate": float(self.gpu_rows.sum()) / rows if rows else 1.0,
            "cpu_rows": (rows - float(self.gpu_rows.sum())) / self.n_tokens,
            "mb_moved": float(self.bytes_moved.sum()) / self.n_tokens / 1e6,
            "loads": float(self.loads.sum()) / self.n_tokens,
            "late_loads": float(self.late.sum()) / self.n_tokens,
            "lambda": float(self.lam.mean()),
            "margin": float(self.margin.mean()),
            "io_bound": float((self.feedback == _lib.KAIROX_BOTTLENECK_IO).mean()),
            "cpu_bound": float((self.feedback == _lib.KAIROX_BOTTLENECK_CPU).mean()),
        }

    def per_layer(self) -> list[dict[str, float]]:
        out = []
        n = self.n_tokens
        for il in range(self.cost.n_layer):
            r = float(self.rows[:, il].sum())
            out.append({"layer": il, "cpu_us": float(self.cpu_us[:, il].sum()) / n,
                        "io_us": float(self.io_us[:, il].sum()) / n,
                        "io_stall_us": float(self.io_stall_us[:, il].sum()) / n,
                        "cpu_stall_us": float(self.cpu_stall_us[:, il].sum()) / n,
                        "hit_rate": float(self.gpu_rows[:, il].sum()) / r if r else 1.0,
                        "bytes": float(self.loads[:, il].sum()) * self.cost.group_bytes / n,
                        "loads": float(self.loads[:, il].sum()) / n,
                        "lambda": float(self.lam[:, il].mean()),
                        "margin": float(self.margin[:, il].mean())})
        return out


class SequenceData:
    """Per-sequence group counts of a trace at a group size, computed once and shared by all
    simulations of a run (unpacking bits is the expensive part)."""

    def __init__(self, trace: Trace, kind: str, group_size: int,
                 seqs: Sequence[int] | None = None) -> None:
        if kind not in trace.kinds():
            raise KairoxError(f"the trace has no '{kind}' masks (it has {', '.join(trace.kinds())}); "
                              f"record it with --kairox for predictor output, or use --kind active")
        self.trace = trace
        self.kind = kind
        self.group_size = group_size
        self.seqs = list(range(trace.n_seq)) if seqs is None else list(seqs)
        # (n_steps, L, G) uint16 per sequence
        self.counts = [trace.group_counts(s, kind, group_size) for s in self.seqs]

    def group_freq(self) -> np.ndarray:
        """(L, G) profiled group frequency at this group size (from the trace's)."""
        f = self.trace.group_freq
        g0 = self.trace.meta.group_size
        L = f.shape[0]
        if self.group_size == g0:
            return f
        per_neuron = np.repeat(f, g0, axis=1)  # (L, n_ff)
        return per_neuron.reshape(L, -1, self.group_size).mean(axis=2)


def simulate(data: SequenceData, cost: CostModel, cfg: SimConfig) -> SimResult:
    """Replay every sequence of `data` through a fresh balancer of cfg's policy."""
    if cfg.mode not in MODES:
        raise KairoxError(f"unknown pipeline mode '{cfg.mode}' (one of {', '.join(MODES)})")
    if cfg.layer0 not in ("prefetch", "current"):
        raise KairoxError(f"unknown layer-0 decision source '{cfg.layer0}' (prefetch or current)")
    L, gs = cost.n_layer, data.group_size
    n_groups = data.trace.n_ff // gs
    if cfg.slots:
        if len(cfg.slots) != L or any(not 0 <= k <= n_groups for k in cfg.slots):
            raise KairoxError(f"slots: need {L} per-layer counts in [0, {n_groups}]")
        budgets = [int(k) for k in cfg.slots]
    else:
        budgets = [int(round(cfg.budget * n_groups))] * L
    n_tok = sum(c.shape[0] for c in data.counts)
    rec = {k: np.zeros((n_tok, L), dtype=np.float32)
           for k in ("cpu", "io", "ios", "cpus", "rows", "gpu", "loads", "late", "lam", "margin")}
    fb_rec = np.zeros((n_tok, L), dtype=np.int8)
    token_us = np.zeros(n_tok)
    freq = data.group_freq().astype(np.float32).reshape(-1)
    clock = _Clock(cost, cfg.mode)
    with Balancer([n_groups] * L, budgets, cfg.balancer, freq) as bal:
        res = np.empty(L * n_groups, dtype=np.uint8)
        prev = np.empty_like(res)
        scores = np.zeros(L * n_groups, dtype=np.float32)
        lam = np.empty(L, dtype=np.float32)
        margin = np.empty(L, dtype=np.float32)
        fb = np.zeros(L, dtype=np.int32)
        row = 0
        for counts in data.counts:
            bal.reset()
            bal.resident_into(prev)
            fb[:] = 0
            clock.start_sequence()
            inten = counts.astype(np.float32) / gs  # (S, L, G)
            # decision inputs: layers >= 1 from the step's own adjacent prediction; layer 0
            # from the previous step's layer-0 pattern (prefetched during sampling)
            decide = inten.copy()
            if cfg.layer0 == "prefetch":
                decide[1:, 0] = inten[:-1, 0]
            decide = decide.reshape(len(inten), -1)
            cf = counts.astype(np.float32)
            for t in range(counts.shape[0]):
                bal.step_all(decide[t], fb)
                bal.lambdas_into(lam)  # the values this step used (after its feedback)
                bal.margins_into(margin)
                bal.resident_into(res)
                r2 = res.reshape(L, n_groups).view(bool)
                new = r2 & ~prev.reshape(L, n_groups).view(bool)
                c = cf[t]
                n_load = new.sum(axis=1)
                rows = c.sum(axis=1)
                gpu = (c * r2).sum(axis=1)
                if cfg.mode == "async" and n_load.any():
                    bal.scores_into(scores)
                per = clock.step(n_load, rows, gpu, new, c, scores.reshape(L, n_groups))
                token_us[row] = per["token"]
                for k in ("cpu", "io", "ios", "cpus", "gpu", "late"):
                    rec[k][row] = per[k]
                rec["rows"][row], rec["loads"][row], rec["lam"][row] = rows, n_load, lam
                rec["margin"][row] = margin
                fb = _classify(per["ios"], per["cpus"], per["late_us"], cfg.deadband_us)
                fb_rec[row] = fb
                prev, res = res, prev
                row += 1
    return SimResult(cfg, cost, token_us, rec["cpu"], rec["io"], rec["ios"], rec["cpus"],
                     rec["rows"], rec["gpu"], rec["loads"], rec["late"], rec["lam"], fb_rec,
                     rec["margin"])


def _classify(io_stall: np.ndarray, cpu_stall: np.ndarray, late_us: np.ndarray,
              deadband: float) -> np.ndarray:
    """kairox_bottleneck per layer. I/O first: a layer whose reloads did not fit their window
    (the GPU waited for them, or, async, some landed late) is I/O-bound even if the CPU also
    stalled, because that wait is caused by balancing and more balancing can only lengthen
    it; otherwise CPU-bound when the GPU waited for the CPU's rows."""
    io = np.maximum(np.asarray(io_stall), late_us)
    cpu = np.asarray(cpu_stall)
    fb = np.zeros(len(io), dtype=np.int32)
    fb[cpu > deadband] = _lib.KAIROX_BOTTLENECK_CPU
    fb[io > deadband] = _lib.KAIROX_BOTTLENECK_IO
    return fb


class _Clock:
    """The live pipeline's clock across the steps of one sequence (absolute microseconds)."""

    def __init__(self, cost: CostModel, mode: str) -> None:
        self.cost = cost
        self.wait = mode == "wait"
        self.attn = [float(a) for a in cost.attn_us]
        self.start_sequence()

    def start_sequence(self) -> None:
        self.now = 0.0
        self.link_free = 0.0  # when the PCIe link finishes its queued transfers
        self.next0 = None  # when layer 0's prefetch (for this step) could start on the link

    def step(self, n_load: np.ndarray, rows: np.ndarray, gpu: np.ndarray, new: np.ndarray,
             c: np.ndarray, scores: np.ndarray) -> dict[str, np.ndarray | float]:
        """Advance through one token; per-layer times (and "token", the token's time)."""
        cost, L = self.cost, self.cost.n_layer
        t_load = cost.group_load_us
        loads = n_load.tolist()
        rows_l = rows.tolist()
        gpu_l = gpu.tolist()
        io = [n * t_load for n in loads]
        ios, cpus, cpu_t, late, late_us = ([0.0] * L for _ in range(5))
        start = self.now
        now = self.now
        # layer 0's reload was issued during the previous token's last layer (from that
        # token's layer-0 pattern); for the first token it starts now
        issue0 = self.next0 if self.next0 is not None else max(now, self.link_free)
        reload_end = issue0 + io[0]
        link_free = reload_end
        for il in range(L):
            now += self.attn[il]  # attention il; the adjacent prediction for il + 1 is known
            ready = now
            g_rows = gpu_l[il]
            if self.wait:
                ffn_start = reload_end if reload_end > ready else ready
                ios[il] = ffn_start - ready
            else:
                ffn_start = ready
                if reload_end > ready and loads[il]:
                    # loads land one by one, best score first, from reload_end - io[il]
                    begin = reload_end - io[il]
                    done = min(int(max(0.0, ready - begin) // t_load), loads[il])
                    if done < loads[il]:
                        groups = np.flatnonzero(new[il])
                        order = groups[np.argsort(-scores[il, groups], kind="stable")]
                        g_rows -= float(c[il, order[done:]].sum())
                        late[il] = loads[il] - done
                        late_us[il] = reload_end - ready
            g_time = cost.gpu_ffn_fixed_us + g_rows * cost.gpu_row_us
            n_cpu = rows_l[il] - g_rows
            if n_cpu > 0:
                crit = 2 * cost.crit_us  # the FFN input to the host, the partial result back
                c_time = cost.cpu_us(n_cpu) + crit
            else:
                crit = c_time = 0.0
            gpu_l[il] = g_rows
            cpu_t[il] = c_time
            cpus[il] = c_time - g_time if c_time > g_time else 0.0
            ffn_end = ffn_start + (c_time if c_time > g_time else g_time)
            # the next layer's reload starts once the link is free and its prediction known;
            # this FFN's critical transfers preempt it (they take link time in its window)
            issue = max(ffn_start if self.wait else ready, link_free)
            if il + 1 < L:
                reload_end = issue + io[il + 1] + crit
                link_free = reload_end
            else:
                # layer 0 of the next token: prefetched from here on, overlapping this FFN,
                # the output layer and sampling; its loads are decided (and timed) next step
                link_free = issue + crit
            now = ffn_end
        now += cost.tail_us
        self.now, self.link_free, self.next0 = now, link_free, link_free
        return {"token": now - start, "cpu": cpu_t, "io": io, "ios": ios, "cpus": cpus,
                "gpu": gpu_l, "late": late, "late_us": np.array(late_us)}
