"""The runtime runs a workload (kairox_set_workload): a synthetic model's predictor logits come
from a `kairox workload` directory, step by step and layer by layer. The masks the graph computes
are checked against the workload's bits per layer and step (the FFN hidden activation of the
CPU path is nonzero exactly on the selected neurons), under seeks, batches, dense prefill and
the hybrid runtime; a real model and bad shapes are refused with a clear error. Tiny shapes."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from kairox_py.benchmark.synthetic import SHAPES, SparseSpec, write_synthetic_llama
from kairox_py.errors import KairoxError
from kairox_py.llama import ContextParams, Model, Profiler
from kairox_py.sim.traces import Trace
from kairox_py.workload.model import resolve
from kairox_py.workload.write import write_workload

SHAPE = SHAPES["tiny"]  # 4 layers, n_embd 256, n_ff 768
STEPS = 12


@pytest.fixture(scope="module")
def workload(tmp_path_factory: pytest.TempPathFactory) -> Trace:
    d = tmp_path_factory.mktemp("wlrt") / "wl"
    return write_workload(resolve("relu-7b", n_layer=SHAPE.n_layer, n_embd=SHAPE.n_embd, n_ff=SHAPE.n_ff,
                                  n_seq=2, n_steps=STEPS, density=0.2), d)


@pytest.fixture(scope="module")
def synth(tmp_path_factory: pytest.TempPathFactory, workload: Trace) -> Path:
    path = tmp_path_factory.mktemp("wlrt") / "synthetic.gguf"
    return write_synthetic_llama(path, SHAPE, "q4_0", SparseSpec(pred_rank=0), group_size=32,
                                 group_freq=workload.group_freq)


def _selected(prof: Profiler, layer: int) -> np.ndarray:
    h = prof.get("hidden", layer)
    assert h is not None
    return h != 0


def test_masks_equal_the_workload_per_layer_and_step(synth: Path, workload: Trace) -> None:
    want = workload.mask(1, "predicted")  # (steps, layers, n_ff)
    assert want.any() and not want.all()
    with Model(synth) as m, Profiler(m, 8, kinds=("hidden",)) as prof, \
            m.session(ContextParams(n_ctx=64, mode="predictor", profiler=prof)) as s:
        s.set_workload(workload.bits(1, "predicted"))
        assert s.workload_pos == 0
        for t in range(STEPS + 2):  # past the end: the workload wraps around
            prof.clear()
            s.decode([5 + t])
            for il in range(m.n_layer):
                assert np.array_equal(_selected(prof, il)[-1], want[t % STEPS, il]), (t, il)
        assert s.workload_pos == 2
        # a batch of sparse tokens: one step per token, in order
        s.seek_workload(5)
        prof.clear()
        s.decode([7, 8, 9])
        assert s.workload_pos == 8
        got0 = _selected(prof, 0)
        assert got0.shape == (3, m.n_ff)
        assert np.array_equal(got0, want[5:8, 0])
        assert np.array_equal(_selected(prof, m.n_layer - 1)[-1], want[7, m.n_layer - 1])


def test_setting_and_removing_a_workload_rebuilds_the_graph(synth: Path, workload: Trace) -> None:
    want = workload.mask(0, "predicted")
    with Model(synth) as m, Profiler(m, 8, kinds=("hidden",)) as prof, \
            m.session(ContextParams(n_ctx=64, mode="predictor", profiler=prof)) as s:
        s.decode([3])
        static = _selected(prof, 1)[-1]  # the model's fixed scores
        s.set_workload(workload.bits(0, "predicted"))
        prof.clear()
        s.decode([4])
        assert np.array_equal(_selected(prof, 1)[-1], want[0, 1])
        assert not np.array_equal(want[0, 1], static)
        s.set_workload(None)
        assert s.workload_pos is None
        prof.clear()
        s.decode([5])
        assert np.array_equal(_selected(prof, 1)[-1], static)


def test_dense_prefill_takes_no_step(synth: Path, workload: Trace) -> None:
    with Model(synth) as m, m.session(ContextParams(n_ctx=64, mode="predictor", max_sparse_tokens=2)) as s:
        s.set_workload(workload.bits(0, "predicted"))
        s.decode(list(range(10, 18)))  # 8 tokens > 2: dense
        assert s.workload_pos == 0
        s.decode([20])
        assert s.workload_pos == 1


def test_hybrid_runtime_counts_the_workload(synth: Path, workload: Trace) -> None:
    """With a device cache (the CPU stand-in) the halves together compute exactly the workload's
    neurons: the per-layer counters equal its bit counts."""
    want = workload.mask(0, "predicted")
    with Model(synth) as m:
        with m.session(ContextParams(n_ctx=64, mode="predictor", stats=True, vram_budget_gib=64.0,
                                     policy="static")) as s0:
            info = s0.hybrid_info()
            assert info is not None
            budget = (info.dense_bytes + 0.5 * info.cache_bytes) / float(1 << 30)
        for policy in ("tam", "topk"):
            with m.session(ContextParams(n_ctx=64, mode="predictor", stats=True, vram_budget_gib=budget,
                                         policy=policy, deterministic=True)) as s:
                s.set_workload(workload.bits(0, "predicted"))
                for t in range(STEPS):
                    s.decode([30 + t])
                st = s.layer_stats()
                hy = s.hybrid_stats()
                for il in range(m.n_layer):
                    assert st[il].predicted == int(want[:, il].sum()), (policy, il)
                    if hy[il].n_slots > 0:  # a layer without slots is not planned
                        assert hy[il].active == int(want[:, il].sum()), (policy, il)
                assert sum(h.active_dev for h in hy) > 0  # the cache computed some of them


def test_real_model_refuses_a_workload(model_path: Path, workload: Trace) -> None:
    with Model(model_path) as m, m.session(ContextParams(n_ctx=64)) as s:
        bits = np.zeros((4, m.n_layer, m.n_ff // 8), dtype=np.uint8)
        with pytest.raises(KairoxError, match="only a synthetic model"):
            s.set_workload(bits)


def test_bad_workloads_are_refused(synth: Path, workload: Trace) -> None:
    bits = workload.bits(0, "predicted")
    with Model(synth) as m:
        with m.session(ContextParams(n_ctx=64, mode="predictor")) as s:
            with pytest.raises(KairoxError, match="layers"):
                s.set_workload(bits[:, :2])
            with pytest.raises(KairoxError, match="neurons"):
                s.set_workload(bits[:, :, :-4])
            with pytest.raises(KairoxError, match="steps, layers"):
                s.set_workload(bits[0])
            assert s.workload_pos is None
        with m.session(ContextParams(n_ctx=64, mode="dense")) as s:
            with pytest.raises(KairoxError, match="predictor mode"):
                s.set_workload(bits)


def test_workload_vs_sim_script_agrees(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """scripts/workload_vs_sim.py end to end on a tiny workload: the runtime's masks equal the
    workload's and its reload volume and hit rates equal the simulator's replay (both run the
    same balancer on the same masks, deterministic)."""
    import importlib.util

    from conftest import REPO

    monkeypatch.setenv("KAIROX_CACHE", str(tmp_path / "cache"))
    d = tmp_path / "wl"
    write_workload(resolve("relu-7b", n_layer=2, n_embd=SHAPE.n_embd, n_ff=SHAPE.n_ff, n_seq=2, n_steps=10,
                           density=0.2, weight_type="q4_0"), d)
    spec = importlib.util.spec_from_file_location("workload_vs_sim", REPO / "scripts" / "workload_vs_sim.py")
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    out = tmp_path / "out"
    rc = mod.main([str(d), "--budgets", "0.25,0.75", "--policies", "tam,topk,static", "-t", "1", "--out", str(out)])
    assert rc == 0
    rows = (out / "summary.csv").read_text().splitlines()
    assert len(rows) == 1 + 6
    assert (out / "speed.csv").is_file()
