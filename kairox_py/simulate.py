"""`kairox simulate`: replay decode traces through balancer policies with a GPU+CPU cost model.

Why a simulator: this machine has no GPU, yet policies must be compared on real activation
traces under the paper's two PCs. Every decision comes from the C++ balancer
(:class:`~kairox_py.balancer.Balancer`), i.e. the code the hybrid runtime will run; only the
clock is modelled here.

Cost model (per decode step, layer by layer, times in microseconds; see :class:`CostModel`):

* GPU: a kernel costs ``launch_us``; reading weights runs at the GPU's memory bandwidth
  times ``gpu_eff``. Attention of a layer = its kernels + its weights; the sparse FFN on the
  GPU = its kernels + the predictor + the resident active rows (gate, up, down_t bytes).
* CPU: the sparse FFN rows not in VRAM cost ``cpu_row_us`` each plus a fixed ``cpu_fixed_us``
  per layer, calibrated from our own sparse-kernel microbenchmark (``test-kairox-ops perf``)
  and scaled to the preset's threads, never faster than the preset's memory bandwidth allows.
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

import csv
import math
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import numpy as np
from rich.console import Console

from . import _lib
from .balancer import POLICIES, Balancer, BalancerConfig
from .errors import KairoxError
from .progress import make_progress
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
    """Per-layer sparse FFN cost on the machine the microbenchmark ran on:
    t = fixed_us + row_us * active_rows (gate/up mul_mat_sparse + down axpy_sparse)."""

    fixed_us: float
    row_us: float
    threads: int
    source: str


#: `test-kairox-ops perf -t 2 --types q4_1,q8_0 --shapes 576x1536` on this project's
#: 2-core build machine (AMD EPYC, 2 threads); see BENCHMARKS.md "Balancer and simulator".
#: gate + up (q4_1 mul_mat_sparse) + down (q8_0 axpy_sparse), fitted over 1..100% density.
DEFAULT_CPU = CpuCalibration(fixed_us=12.0, row_us=0.16, threads=2,
                             source="built-in: test-kairox-ops perf, 576x1536, q4_1 gate/up + q8_0 down, 2 threads")


def calibration_from_csv(path: str | Path, k: int, n: int, updown_type: str, down_type: str) -> CpuCalibration:
    """Fit fixed + per-row cost from `test-kairox-ops perf -o F.csv` rows of shape k x n:
    two mul_mat_sparse (gate, up) of `updown_type` plus one axpy_sparse of `down_type`."""
    rows: dict[tuple[str, str], list[tuple[float, float]]] = {}
    threads = 0
    try:
        with open(path, newline="") as f:
            for r in csv.DictReader(f):
                if int(r["k"]) != k or int(r["n"]) != n:
                    continue
                rows.setdefault((r["op"], r["type"].lower()), []).append(
                    (float(r["density"]) * n, float(r["sparse_us"])))
                threads = int(r["threads"])
    except (OSError, KeyError, ValueError) as e:
        raise KairoxError(f"cannot read calibration CSV {path}: {e}") from None

    def fit(op: str, typ: str) -> tuple[float, float]:
        pts = rows.get((op, typ.lower()))
        if not pts or len(pts) < 2:
            raise KairoxError(f"calibration CSV {path} has no {op} {typ} rows for shape {k}x{n}")
        x, y = np.array(pts).T
        slope, icpt = np.polyfit(x, y, 1)
        return float(max(icpt, 0.0)), float(max(slope, 0.0))

    a1, b1 = fit("mul_mat_sparse", updown_type)
    a2, b2 = fit("axpy_sparse", down_type)
    return CpuCalibration(2 * a1 + a2, 2 * b1 + b2, threads, f"{path} ({k}x{n}, {threads} threads)")


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
    cpu_fixed_us: float  # per layer with CPU rows
    cpu_row_us: float  # per active row on the CPU
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
        # CPU: our measured per-row time, scaled by threads, bounded by the preset's memory
        scale = cpu.threads / preset.cpu_threads
        mem_floor = row_bytes / (preset.cpu_mem_bw * preset.cpu_bw_eff * 1e3)
        cpu_row = max(cpu.row_us * scale, mem_floor)
        crit = t0 + 4 * m.n_embd / pcie_bpus
        load = 3 * t0 + group_size * row_bytes / pcie_bpus
        tail = 3 * preset.launch_us + m.costs["output_bytes"] / gpu_bpus + preset.sample_us
        notes = {"pcie_t0_us": round(t0, 3), "pcie_gbs": round(pcie_bpus / 1e3, 2),
                 "cpu_row_measured_us": cpu.row_us, "cpu_thread_scale": round(scale, 3),
                 "cpu_mem_floor_us": round(mem_floor, 5), "cpu_source": cpu.source}
        return cls(preset.name, m.n_layer, group_size, row_bytes, group_size * row_bytes, attn,
                   gpu_fixed, row_bytes / gpu_bpus, cpu.fixed_us, cpu_row, crit, load, tail, notes)


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
                        "lambda": float(self.lam[:, il].mean())})
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
    L, gs = cost.n_layer, data.group_size
    n_groups = data.trace.n_ff // gs
    K = int(round(cfg.budget * n_groups))
    n_tok = sum(c.shape[0] for c in data.counts)
    rec = {k: np.zeros((n_tok, L)) for k in ("cpu", "io", "ios", "cpus", "rows", "gpu", "loads",
                                               "late", "lam")}
    fb_rec = np.zeros((n_tok, L), dtype=np.int32)
    token_us = np.zeros(n_tok)
    freq = data.group_freq().astype(np.float32).reshape(-1)
    with Balancer([n_groups] * L, [K] * L, cfg.balancer, freq) as bal:
        res = np.empty(L * n_groups, dtype=np.uint8)
        prev = np.empty_like(res)
        scores = np.empty(L * n_groups, dtype=np.float32)
        lam = np.empty(L, dtype=np.float32)
        fb = np.zeros(L, dtype=np.int32)
        row = 0
        for counts in data.counts:
            bal.reset()
            bal.resident_into(prev)
            fb[:] = 0
            inten = counts.astype(np.float32) / gs  # (S, L, G)
            link_free = 0.0  # absolute clock of the reload link
            clock = 0.0
            pending0 = 0.0  # layer-0 reload issued during the previous token: its end time
            for t in range(counts.shape[0]):
                # decision inputs: layers >= 1 from this step's adjacent prediction, layer 0
                # from the previous step's layer-0 pattern (prefetched during sampling)
                a = inten[t].copy()
                a[0] = inten[t - 1, 0] if t > 0 else inten[t, 0]
                bal.lambdas_into(lam)
                bal.step_all(a.reshape(-1), fb)
                bal.resident_into(res)
                r2 = res.reshape(L, n_groups).astype(bool)
                p2 = prev.reshape(L, n_groups).astype(bool)
                new = r2 & ~p2
                c = counts[t].astype(np.float64)  # this step's computed rows per group
                n_load = new.sum(axis=1)
                rows = c.sum(axis=1)
                gpu = (c * r2).sum(axis=1)
                load_rows = (c * new).sum(axis=1)
                if cfg.mode == "async" and n_load.any():
                    bal.scores_into(scores)
                out = _clock_step(cost, cfg, t, clock, link_free, pending0, n_load, rows, gpu,
                                  load_rows, new, c, scores.reshape(L, n_groups))
                clock, link_free, pending0, tok_us, per = out
                token_us[row] = tok_us
                for k in ("cpu", "io", "ios", "cpus", "gpu", "late"):
                    rec[k][row] = per[k]
                rec["rows"][row], rec["loads"][row], rec["lam"][row] = rows, n_load, lam
                fb = _classify(per["ios"], per["cpus"], per["late_us"], cfg.deadband_us)
                fb_rec[row] = fb
                prev, res = res, prev
                row += 1
    return SimResult(cfg, cost, token_us, rec["cpu"], rec["io"], rec["ios"], rec["cpus"],
                     rec["rows"], rec["gpu"], rec["loads"], rec["late"], rec["lam"], fb_rec)


def _classify(io_stall: np.ndarray, cpu_stall: np.ndarray, late_us: np.ndarray,
              deadband: float) -> np.ndarray:
    """kairox_bottleneck per layer: the larger of the I/O-side and CPU-side waits, if any
    exceeds the deadband."""
    io = np.maximum(io_stall, late_us)
    fb = np.zeros(len(io), dtype=np.int32)
    fb[(io > deadband) & (io >= cpu_stall)] = _lib.KAIROX_BOTTLENECK_IO
    fb[(cpu_stall > deadband) & (cpu_stall > io)] = _lib.KAIROX_BOTTLENECK_CPU
    return fb


def _clock_step(cost: CostModel, cfg: SimConfig, t: int, clock: float, link_free: float,
                pending0: float, n_load: np.ndarray, rows: np.ndarray, gpu: np.ndarray,
                load_rows: np.ndarray, new: np.ndarray, c: np.ndarray,
                scores: np.ndarray) -> tuple[float, float, float, float, dict[str, np.ndarray]]:
    """Advance the pipeline clock through one token; returns (clock, link_free, layer-0 reload
    end for the next token, token time, per-layer records)."""
    L = cost.n_layer
    start = clock
    io_us = n_load * cost.group_load_us
    cpu_rows = rows - gpu
    ios = np.zeros(L)
    cpus = np.zeros(L)
    cpu_t = np.zeros(L)
    late = np.zeros(L)
    late_us = np.zeros(L)
    gpu_rows_eff = gpu.copy()
    # layer 0's reload: issued during the previous token's last layer (pending0 = when the
    # link could start it), or now for the first token
    issue0 = pending0 if t > 0 else max(clock, link_free)
    reload_end = issue0 + io_us[0]
    link_free = reload_end
    attn = cost.attn_us
    for il in range(L):
        clock += attn[il]  # attention il; adjacent prediction for il + 1 is known now
        ready = clock
        if cfg.mode == "wait":
            ffn_start = max(ready, reload_end)
            ios[il] = ffn_start - ready
        else:
            ffn_start = ready
            if reload_end > ready and n_load[il] > 0:
                # loads land one after another from reload_end - io_us[il]
                begin = reload_end - io_us[il]
                done = int(max(0.0, (ready - begin)) // cost.group_load_us) if ready > begin else 0
                done = min(done, int(n_load[il]))
                n_late = int(n_load[il]) - done
                if n_late > 0:
                    groups = np.flatnonzero(new[il])
                    order = groups[np.argsort(-scores[il, groups], kind="stable")]
                    late_rows = c[il, order[done:]].sum()
                    gpu_rows_eff[il] -= late_rows
                    late[il] = n_late
                    late_us[il] = reload_end - ready
        g_time = cost.gpu_ffn_fixed_us + gpu_rows_eff[il] * cost.gpu_row_us
        n_cpu = rows[il] - gpu_rows_eff[il]
        if n_cpu > 0:
            c_time = cost.cpu_fixed_us + n_cpu * cost.cpu_row_us + 2 * cost.crit_us
            crit = 2 * cost.crit_us
        else:
            c_time = 0.0
            crit = 0.0
        cpu_t[il] = c_time
        cpus[il] = max(0.0, c_time - g_time)
        ffn_end = ffn_start + max(g_time, c_time)
        # the reload for the next layer (layer 0 of the next token after the last layer):
        # starts when the link is free and the prediction is known; critical transfers of
        # this FFN preempt it (they take link time inside its window)
        issue = max(ffn_start if cfg.mode == "wait" else ready, link_free)
        if il + 1 < L:
            reload_end = issue + io_us[il + 1] + crit
            link_free = reload_end
        else:
            # layer 0 of the next token: prefetched from now on (overlapping this FFN, the
            # output layer and sampling); its loads are decided, and timed, at the next step
            link_free = issue + crit
        clock = ffn_end
    clock += cost.tail_us
    next0 = link_free
    tok = clock - start
    per = {"cpu": cpu_t, "io": io_us, "ios": ios, "cpus": cpus, "gpu": gpu_rows_eff, "late": late,
           "late_us": late_us}
    return clock, link_free, next0, tok, per
