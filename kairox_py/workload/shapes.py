"""Model shapes a workload can take, and the byte and CPU costs `kairox simulate` reads.

A recorded trace gets its costs from the GGUF it was made with (:func:`kairox_py.sim.traces.
model_costs`); a synthetic workload has no GGUF, so the same numbers are derived here from the
shape and a weight type: rows of gate/up/down_t, attention weights per layer, the output
matrix. The simulator's cost model also needs the CPU time of a layer's sparse FFN by share of
active rows for the model's FFN shape; for 7B shapes that comes from our own op
microbenchmark at 4096x11008 (``docs/benchmarks/ops/amd-0122/table``), for the default
model's shape from the simulator's built-in table.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from ..errors import KairoxError

#: bytes per weight of the types a workload's costs can assume (llama.cpp block sizes)
TYPE_BYTES: dict[str, float] = {
    "f32": 4.0, "f16": 2.0, "bf16": 2.0, "q8_0": 34 / 32, "q6_K": 210 / 256, "q5_K": 176 / 256,
    "q4_K": 144 / 256, "q4_1": 20 / 32, "q4_0": 18 / 32,
}


@dataclass(frozen=True)
class Shape:
    """What of a model's dimensions the workload and its costs depend on."""

    name: str
    n_layer: int
    n_embd: int
    n_ff: int
    gated: bool  # gate and up projections (llama) or one up projection (OPT's fc1)
    n_vocab: int
    weight_type: str = "f16"

    def check(self) -> None:
        if self.n_layer < 1:
            raise KairoxError(f"a workload needs at least one layer, not {self.n_layer}")
        if self.n_embd < 1:
            raise KairoxError(f"n_embd must be positive, not {self.n_embd}")
        if self.n_ff < 8 or self.n_ff % 8:
            raise KairoxError(f"the FFN width must be a positive multiple of 8 (bit-packed masks), "
                              f"not {self.n_ff}")
        if self.weight_type not in TYPE_BYTES:
            raise KairoxError(f"unknown weight type '{self.weight_type}' (one of "
                              f"{', '.join(TYPE_BYTES)})")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


#: The shapes of the papers' 7B models and of our default model.
SHAPES: dict[str, Shape] = {
    # LLaMA-2-7B and its ReLU variants (ProSparse-LLaMA2-7B, ReluLLaMA-7B): 11008 neurons per
    # layer (KAIROX section 3.2), FP16 as in the paper's PC-Low runs and Table 2's row size
    "llama2-7b": Shape("llama2-7b", 32, 4096, 11008, True, 32000),
    # OPT-6.7B: 16384 neurons per layer (KAIROX section 3.2), ReLU fc1 -> fc2, no gate
    "opt-6.7b": Shape("opt-6.7b", 32, 4096, 16384, False, 50272),
    # SmolLM2-135M-Instruct, the default model whose traces the SiLU preset is fitted to
    "smollm2-135m": Shape("smollm2-135m", 30, 576, 1536, True, 49152, "q4_1"),
}


# ---------------------------------------------------------------------------------------
# CPU time of one layer's sparse FFN by share of active rows
# ---------------------------------------------------------------------------------------
#: densities of the op table below
_CPU_DENSITY = (0.0, 0.01, 0.05, 0.10, 0.25, 0.50, 0.75, 1.00)
#: `test-kairox-ops perf` at 4096x11008, 2 threads, AMD VM, mean of 7 runs
#: (docs/benchmarks/ops/amd-0122/table/ops.md): (mul_mat_sparse us, axpy_sparse us) by density;
#: density 0 repeats the 1% figure (the near-empty cost is thread sync, not rows)
_CPU_7B: dict[str, tuple[tuple[float, ...], tuple[float, ...]]] = {
    "f16": ((56, 56, 185, 330, 764, 1466, 2183, 2878), (59, 59, 190, 338, 790, 1552, 2262, 2818)),
    "q8_0": ((41, 41, 106, 186, 438, 843, 1187, 1534), (49, 49, 156, 214, 474, 847, 1521, 1557)),
    "q4_0": ((37, 37, 93, 131, 278, 509, 702, 835), (34, 34, 99, 133, 250, 451, 621, 825)),
}
_CPU_7B_SOURCE = ("test-kairox-ops perf 4096x11008, 2 threads, AMD VM, mean of 7 runs "
                  "(docs/benchmarks/ops/amd-0122/table)")
_CPU_REF_K, _CPU_REF_N, _CPU_THREADS = 4096, 11008, 2
#: the simulator's built-in table (kairox_py.sim.replay.DEFAULT_CPU) for the default model:
#: 2 x q4_1 mul_mat_sparse + q8_0 axpy_sparse at 576x1536, 2 threads
_CPU_SMOL_US = (37.0, 37.0, 49.0, 70.3, 130.3, 208.3, 267.0, 292.0)


def _ref_type(weight_type: str) -> str:
    """The measured type nearest to `weight_type` by bytes per weight."""
    if weight_type in _CPU_7B:
        return weight_type
    return min(_CPU_7B, key=lambda t: abs(TYPE_BYTES[t] - TYPE_BYTES[weight_type]))


def cpu_table(shape: Shape) -> dict[str, Any]:
    """Per-layer CPU time (us) of the sparse FFN by share of active rows, for `shape`, as
    :class:`kairox_py.sim.replay.CpuCalibration` takes it (density, us, n_ff, threads, source).

    At 4096x11008 in f16/q8_0/q4_0 these are our measured op times; other shapes scale them:
    the time of r rows is the reference time of the same number of rows (a row's cost does
    not depend on how many others the layer has) times n_embd / 4096 above the near-empty
    cost; types not measured at 7B use the nearest measured one by bytes per weight."""
    if (shape.n_embd, shape.n_ff) == (576, 1536):
        return {"density": list(_CPU_DENSITY), "us": list(_CPU_SMOL_US), "n_ff": 1536,
                "threads": _CPU_THREADS,
                "source": "kairox_py.sim.replay.DEFAULT_CPU (test-kairox-ops perf 576x1536, 2 threads)"}
    tname = _ref_type(shape.weight_type)
    mm, axpy = (np.asarray(v, dtype=np.float64) for v in _CPU_7B[tname])
    ref = (2.0 if shape.gated else 1.0) * mm + axpy
    dens = np.asarray(_CPU_DENSITY)
    ref_rows = dens * _CPU_REF_N
    rows = dens * shape.n_ff
    slope = (ref[-1] - ref[-2]) / (ref_rows[-1] - ref_rows[-2])
    at = np.where(rows <= ref_rows[-1], np.interp(rows, ref_rows, ref),
                  ref[-1] + slope * (rows - ref_rows[-1]))
    us = ref[0] + (at - ref[0]) * shape.n_embd / _CPU_REF_K
    exact = (shape.n_embd, shape.n_ff) == (_CPU_REF_K, _CPU_REF_N) and tname == shape.weight_type
    source = _CPU_7B_SOURCE if exact else (
        f"scaled from {_CPU_7B_SOURCE} ({tname}) to {shape.n_embd}x{shape.n_ff}"
        f"{'' if shape.gated else ', one up projection'}")
    return {"density": [float(d) for d in dens], "us": [round(float(u), 2) for u in us],
            "n_ff": shape.n_ff, "threads": _CPU_THREADS, "source": source}


def cpu_perf_rows(shape: Shape) -> list[dict[str, Any]]:
    """The same table as rows of a `test-kairox-ops perf -o F.csv` file, so that `kairox
    simulate --cpu-csv` reads it: per density one mul_mat_sparse and one axpy_sparse row whose
    sum 2 x mul_mat + axpy (what calibration_from_csv counts per layer) is the table's time.
    The split between the two ops follows the reference measurement at 50% active (for an
    ungated shape the two mul_mat rows together are its one up projection)."""
    tab = cpu_table(shape)
    mm, axpy = _CPU_7B[_ref_type(shape.weight_type)]
    up = (2.0 if shape.gated else 1.0) * mm[5]
    share_mm = 0.5 * up / (up + axpy[5])  # of the total, per mul_mat row
    rows = []
    for d, us in zip(tab["density"][1:], tab["us"][1:]):
        for op, part in (("mul_mat_sparse", share_mm), ("axpy_sparse", 1.0 - 2.0 * share_mm)):
            rows.append({"op": op, "type": shape.weight_type, "k": shape.n_embd, "n": shape.n_ff,
                         "threads": tab["threads"], "density": f"{d:.2f}", "dense_us": "",
                         "dense_layout": "", "sparse_us": f"{us * part:.3f}", "speedup": ""})
    return rows


def model_costs(shape: Shape) -> dict[str, Any]:
    """The byte sizes of a trace's ``costs`` (as :func:`kairox_py.sim.traces.model_costs`
    reads them from a GGUF), from the shape: rows of gate/up/down_t, per-layer attention
    weights (q, k, v, output: 4 x n_embd^2, multi-head attention as in LLaMA-2-7B and
    OPT-6.7B), the output matrix; plus ``cpu``, the CPU table of :func:`cpu_table`."""
    bpe = TYPE_BYTES[shape.weight_type]
    row = int(round(shape.n_embd * bpe))
    attn = int(round(4 * shape.n_embd * shape.n_embd * bpe))
    t = shape.weight_type
    return {"row_bytes": {"gate": row if shape.gated else 0, "up": row, "down": row},
            "attn_bytes": [attn] * shape.n_layer,
            "output_bytes": int(round(shape.n_vocab * shape.n_embd * bpe)),
            "types": {"gate": t if shape.gated else "", "up": t, "down": t},
            "cpu": cpu_table(shape)}
