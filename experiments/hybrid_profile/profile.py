#!/usr/bin/env python3
"""Where a hybrid decode's time goes: wall time per token and the CPU backend's per-op time, for
the CPU-only sparse path and the hybrid runtime with every group resident, on a synthetic model
at 7B shapes (8 layers, fixed random 10% masks through a workload). The difference between the
wall time and the CPU ops is the GPU's work plus the pipeline's transfers and synchronisations.

    KAIROX_LIB=.../libkairox.so python3 experiments/hybrid_profile/profile.py /tmp/p.gguf

Writes the model to the given path; prints one block per configuration (the figures of
docs/benchmarks/h2h/README.md, "Where the time goes").
"""
from __future__ import annotations

import sys
import time
from dataclasses import replace
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from kairox_py.benchmark.synthetic import SHAPES, SparseSpec, write_synthetic_llama  # noqa: E402
from kairox_py.llama import ContextParams, Model  # noqa: E402

L = 8


def run(m: Model, params: ContextParams, bits: np.ndarray, label: str, n: int = 32) -> None:
    with m.session(params) as s:
        if params.mode != "dense":
            s.set_workload(bits)
        s.decode(m.tokenize("The tide comes in twice a day because"))
        tok = int(s.logits().argmax())
        for _ in range(4):
            s.decode([tok])
            tok = int(s.logits().argmax())
        s.set_op_timing(True)
        s.reset_op_times()
        t0 = time.perf_counter()
        for _ in range(n):
            s.decode([tok])
            tok = int(s.logits().argmax())
        dt = (time.perf_counter() - t0) / n * 1e6
        ops = sorted(s.op_times(), key=lambda e: -e[3])
        cpu = sum(e[3] for e in ops) / n
        print(f"{label}: {dt:.0f} us/token, {dt / L:.0f} us/layer; CPU ops {cpu:.0f} us/token")
        for name, op, cnt, us in ops[:10]:
            print(f"    {name:24s} {op:18s} {cnt / n:6.1f}/tok {us / n:8.1f} us/tok")


def main() -> None:
    p = Path(sys.argv[1])
    write_synthetic_llama(p, replace(SHAPES["7b"], n_layer=L), "q4_0", SparseSpec(0), group_size=32,
                          group_freq=np.full((L, 344), 0.1, np.float32))
    rng = np.random.default_rng(0)
    bits = np.packbits(rng.random((64, L, 11008)) < 0.1, axis=-1, bitorder="little")
    with Model(p, ffn_on_host=True, use_mmap=False) as m:
        base = ContextParams(n_ctx=256, n_batch=64, n_threads=8, mode="predictor")
        with m.session(replace(base, vram_budget_gib=1024.0)) as s:
            i = s.hybrid_info()
            assert i is not None
            fit = (i.dense_bytes + i.cache_bytes) / 2**30 * 1.0001
        run(m, base, bits, "CPU-only sparse t8")
        run(m, replace(base, policy="tam", vram_budget_gib=fit), bits, "hybrid fit t8")
        run(m, replace(base, policy="static", vram_budget_gib=fit), bits, "hybrid fit static t8")


if __name__ == "__main__":
    main()
