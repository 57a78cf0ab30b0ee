"""Writing a generated workload as a trace directory, and opening one again.

The directory is what `kairox trace` writes (:mod:`kairox_py.sim.traces`), so `kairox
simulate` and everything else that reads traces reads workloads too:

* ``active.npy`` / ``predicted.npy``: uint8 (n_seq, n_steps, n_layer, n_ff/8), bit-packed,
  written step by step into memory-mapped files (a 7B workload never sits in memory whole);
* ``tokens.npy``: int32 (n_seq, n_steps), all -1 (no tokens behind a synthetic mask);
* ``group_freq.npy``: the groups' base rates (the offline profile static placement uses);
* ``meta.json``: the trace metadata; ``costs`` derived from the shape
  (:mod:`.shapes`, with ``costs["cpu"]``: the CPU table for the shape), plus a ``workload``
  entry with every generator parameter;
* ``workload.json``: the parameters, their sources and the expected statistics;
* ``cpu_perf.csv``: the CPU table in `test-kairox-ops perf` form, for `kairox simulate
  --cpu-csv` (the simulator's built-in table is only for the default model's FFN width).
"""
from __future__ import annotations

import csv
import hashlib
import json
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import KairoxError
from ..outputs import atomic_dir, check_output_dir
from ..sim.traces import TRACE_FILES, TRACE_VERSION, Trace, TraceMeta, pack
from .model import SOURCES, Generator, WorkloadParams, expected_stats
from .shapes import cpu_perf_rows, model_costs

WORKLOAD_FILE = "workload.json"
CPU_CSV = "cpu_perf.csv"
#: everything write_workload and `kairox workload` write (and so may replace in a directory)
WORKLOAD_FILES = (*TRACE_FILES, WORKLOAD_FILE, CPU_CSV, "stats.json")
WORKLOAD_VERSION = 1


def params_digest(p: WorkloadParams) -> str:
    """Content id of a workload's parameters (stands in for the model's sha256)."""
    return hashlib.sha256(json.dumps(p.to_dict(), sort_keys=True).encode()).hexdigest()


def write_workload(p: WorkloadParams, out_dir: str | os.PathLike[str],
                   tick: Callable[[], None] | None = None) -> Trace:
    """Generate workload `p` into out_dir (through a temporary sibling renamed at the end);
    `tick` is called once per generated step of a sequence."""
    p.check()
    out = check_output_dir(out_dir, WORKLOAD_FILES, "workload")
    t0 = time.monotonic()
    gen = Generator(p)
    L, n = p.shape.n_layer, p.shape.n_ff
    with atomic_dir(out) as tmp:
        shape = (p.n_seq, p.n_steps, L, n // 8)
        act_bits = np.lib.format.open_memmap(tmp / "active.npy", "w+", np.uint8, shape)
        pred_bits = np.lib.format.open_memmap(tmp / "predicted.npy", "w+", np.uint8, shape)
        np.save(tmp / "tokens.npy", np.full(shape[:2], -1, dtype=np.int32))
        np.save(tmp / "group_freq.npy", gen.neurons.group_freq(p.group_size))
        counts = np.zeros((3, L))  # active, predicted, predicted & active
        for s in range(p.n_seq):
            for t, step in enumerate(gen.sequence(s)):
                act_bits[s, t] = pack(step.active)
                pred_bits[s, t] = pack(step.predicted)
                counts[0] += step.active.sum(axis=1)
                counts[1] += step.predicted.sum(axis=1)
                counts[2] += (step.active & step.predicted).sum(axis=1)
                if tick:
                    tick()
        act_bits.flush()
        pred_bits.flush()
        del act_bits, pred_bits
        pairs = p.n_seq * p.n_steps * n
        costs = model_costs(p.shape)
        meta = TraceMeta(
            version=TRACE_VERSION, model_path=f"workload:{p.preset}:{p.shape.name}",
            model_sha256=params_digest(p), kairox_path=None, n_layer=L, n_embd=p.shape.n_embd,
            n_ff=n, group_size=p.group_size, n_seq=p.n_seq, n_steps=p.n_steps,
            thresholds=[0.0] * L,
            threshold_source=f"synthetic workload '{p.preset}' (kairox workload, seed {p.seed})",
            has_predicted=True, pred_threshold=0.5, chat=False, temperature=0.0, top_p=1.0,
            seed=p.seed, prompts=[f"workload {p.preset} sequence {s}" for s in range(p.n_seq)],
            costs=costs,
            active_density=[round(float(v), 5) for v in counts[0] / pairs],
            predicted_density=[round(float(v), 5) for v in counts[1] / pairs],
            recall=[round(float(v), 5) for v in counts[2] / np.maximum(counts[0], 1)],
            seconds=round(time.monotonic() - t0, 2))
        meta_d = json.loads(meta.to_json())
        meta_d["workload"] = p.to_dict()
        (tmp / "meta.json").write_text(json.dumps(meta_d, indent=1))
        info = {"version": WORKLOAD_VERSION, "params": p.to_dict(),
                "sources": SOURCES.get(p.preset, {}),
                "expected": {k: round(v, 6) for k, v in expected_stats(gen).items()},
                "layer_density": [round(float(v), 6) for v in gen.neurons.density]}
        (tmp / WORKLOAD_FILE).write_text(json.dumps(info, indent=1))
        with open(tmp / CPU_CSV, "w", newline="") as f:
            rows = cpu_perf_rows(p.shape)
            w = csv.DictWriter(f, fieldnames=list(rows[0]))
            w.writeheader()
            w.writerows(rows)
    return Trace(out)


def open_workload(directory: str | os.PathLike[str]) -> tuple[Trace, WorkloadParams]:
    """A workload directory, checked: a readable trace whose arrays agree with its metadata,
    and the parameters it was generated with (KairoxError saying what is wrong otherwise)."""
    d = Path(directory)
    if not d.is_dir():
        raise KairoxError(f"not a directory: {d}")
    trace = Trace(d)  # meta.json and the arrays' shapes
    info_path = d / WORKLOAD_FILE
    if not info_path.is_file():
        raise KairoxError(f"not a workload directory (no {WORKLOAD_FILE}; a trace from `kairox "
                          f"trace` has none): {d}")
    try:
        info = json.loads(info_path.read_text())
        params = WorkloadParams.from_dict(info["params"])
    except (ValueError, KeyError, TypeError) as e:
        raise KairoxError(f"bad workload parameters in {info_path}: {e}") from None
    m = trace.meta
    if (m.n_layer, m.n_ff, m.n_seq, m.n_steps) != (params.shape.n_layer, params.shape.n_ff,
                                                   params.n_seq, params.n_steps):
        raise KairoxError(f"{info_path} does not match meta.json ({params.shape.n_layer} layers x "
                          f"{params.shape.n_ff}, {params.n_seq} x {params.n_steps} steps against "
                          f"{m.n_layer} x {m.n_ff}, {m.n_seq} x {m.n_steps})")
    if trace.group_freq.shape != (m.n_layer, m.n_ff // max(m.group_size, 1)):
        raise KairoxError(f"group_freq.npy in {d} has shape {trace.group_freq.shape}, expected "
                          f"({m.n_layer}, {m.n_ff // max(m.group_size, 1)})")
    return trace, params


def workload_info(directory: str | os.PathLike[str]) -> dict[str, Any]:
    """workload.json of a workload directory, parsed."""
    return json.loads((Path(directory) / WORKLOAD_FILE).read_text())
