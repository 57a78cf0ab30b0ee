"""Hybrid runtime on the CPU stand-in device, on the real default model (converted).

The device cache, the balancer and the split FFN run exactly as they would with a GPU; the
stand-in only changes where the cache's bytes live. So everything here is a property of the
runtime itself: same tokens as the CPU-only sparse path, budgets respected, each neuron
computed once, deterministic mode reproducible.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from kairox_py import KairoxError, Model
from kairox_py.hybrid import POLICIES, VRAM_AUTO
from kairox_py.llama import ContextParams

PROMPT = "A short note on how tides work:"
N_GEN = 24
GIB = float(1 << 30)


def _greedy(path: Path, n: int = N_GEN, **kw: object) -> tuple[list[int], np.ndarray]:
    """Greedy tokens and the logits of each step (predictor mode, 2 threads, deterministic unless
    told otherwise)."""
    kw.setdefault("deterministic", True)
    with Model(path) as m, m.session(ContextParams(n_ctx=256, n_threads=2, mode="predictor", **kw)) as s:  # type: ignore[arg-type]
        s.decode(m.tokenize(PROMPT))
        toks, logits = [], []
        for _ in range(n):
            lg = s.logits()
            logits.append(lg.copy())
            toks.append(int(lg.argmax()))
            s.decode([toks[-1]])
        return toks, np.array(logits)


@pytest.fixture(scope="module")
def kx_model(converted) -> Path:  # type: ignore[no-untyped-def]
    return Path(converted.output)


@pytest.fixture(scope="module")
def sizes(kx_model: Path) -> tuple[float, float]:
    """(dense parts, whole cache) in bytes, from a context where everything is resident."""
    with Model(kx_model) as m, m.session(ContextParams(n_ctx=64, mode="predictor", vram_budget_gib=64.0)) as s:
        info = s.hybrid_info()
        assert info is not None and info.n_slots == info.n_groups  # all resident
        return float(info.dense_bytes), float(info.cache_bytes)


def _budget(sizes: tuple[float, float], share: float) -> float:
    dense, cache = sizes
    return (dense + share * cache) / GIB


@pytest.fixture(scope="module")
def cpu_reference(kx_model: Path) -> tuple[list[int], np.ndarray]:
    return _greedy(kx_model)


@pytest.mark.parametrize("share", [0.1, 0.4, 1.0])
@pytest.mark.parametrize("policy", ["static", "lru", "topk", "eager", "tam", "tam-t"])
def test_same_tokens_as_cpu_sparse(kx_model: Path, sizes, cpu_reference, policy: str,  # type: ignore[no-untyped-def]
                                   share: float) -> None:
    """The bar: identical greedy tokens to the CPU-only sparse path in deterministic mode, for
    every policy at three budgets. Deterministic mode sums each half's down projection in double
    and rounds once after the merge, so the logits are the same bits wherever neurons live."""
    ref_toks, ref_logits = cpu_reference
    toks, logits = _greedy(kx_model, vram_budget_gib=_budget(sizes, share), policy=policy)
    assert toks == ref_toks
    np.testing.assert_array_equal(logits, ref_logits)


def test_budget_is_respected_and_neurons_are_computed_once(kx_model: Path, sizes) -> None:  # type: ignore[no-untyped-def]
    budget = _budget(sizes, 0.3)
    with Model(kx_model) as m:
        tokens = m.tokenize(PROMPT + " The moon pulls the water towards it, and")
        kw = dict(n_ctx=256, n_batch=64, mode="predictor", stats=True, max_sparse_tokens=64, deterministic=True)
        with m.session(ContextParams(**kw)) as s:  # type: ignore[arg-type]
            s.decode(tokens)
            cpu_only = [st.active for st in s.layer_stats()]
        with m.session(ContextParams(vram_budget_gib=budget, policy="tam", **kw)) as s:  # type: ignore[arg-type]
            info = s.hybrid_info()
            assert info is not None
            assert info.dense_bytes + info.cache_bytes <= info.budget_bytes
            assert 0 < info.n_slots < info.n_groups
            s.decode(tokens)
            total = [st.active for st in s.layer_stats()]  # both halves
            hs = s.hybrid_stats()
            for il, st in enumerate(hs):
                resident = s.resident_groups(il)
                assert resident.sum() == st.n_resident <= st.n_slots
                # one step per layer and ubatch (layer 0's prefetch for the next one is counted
                # when that one runs)
                assert st.steps == 1 and st.active_dev <= st.active
                assert st.bytes_reloaded == st.loads * (st.bytes_reloaded // max(st.loads, 1))
            # the device computed some neurons, the CPU the rest, none twice (a batch of tokens,
            # each with its own mask; deterministic mode: every layer sees the same input bits)
            dev = [st.dev_computed for st in hs]
            cpu_half = [t - d for t, d in zip(total, dev)]
            assert sum(dev) > 0 and sum(cpu_half) > 0 and min(cpu_half) >= 0
            assert total == cpu_only
            # layer stats and hybrid stats reset apart: the layer counts start again from zero
            # after kairox_reset_stats even though the device's counters keep running
            s.reset_stats()
            s.decode(m.tokenize(" so"))
            assert all(st.calls == 1 and 0 <= st.active <= st.pairs for st in s.layer_stats())
            assert [st.dev_computed for st in s.hybrid_stats()] >= dev


def test_static_never_moves_and_tam_does(kx_model: Path, sizes) -> None:  # type: ignore[no-untyped-def]
    budget = _budget(sizes, 0.3)
    for policy, moves in (("static", False), ("tam", True)):
        with Model(kx_model) as m, m.session(ContextParams(n_ctx=256, mode="predictor", vram_budget_gib=budget,
                                                           policy=policy, deterministic=True)) as s:
            s.decode(m.tokenize(PROMPT))
            for t in m.tokenize(" the sea rises twice a day because the moon and the sun pull on it"):
                s.decode([t])
            loads = sum(st.loads for st in s.hybrid_stats())
            assert (loads > 0) == moves, policy


def test_deterministic_mode_repeats_and_feedback_moves_lambda(kx_model: Path, sizes) -> None:  # type: ignore[no-untyped-def]
    budget = _budget(sizes, 0.3)
    a, _ = _greedy(kx_model, vram_budget_gib=budget, policy="tam")
    b, _ = _greedy(kx_model, vram_budget_gib=budget, policy="tam")
    assert a == b
    with Model(kx_model) as m:
        for policy in ("tam", "tam-lambda"):  # deterministic: neither the margin nor lambda moves
            with m.session(ContextParams(n_ctx=256, mode="predictor", vram_budget_gib=budget, policy=policy,
                                         deterministic=True, lambda_init=0.7)) as s:
                s.decode(m.tokenize(PROMPT))
                for _ in range(8):
                    s.decode([int(s.logits().argmax())])
                assert np.all(s.lambda_trace(3) == pytest.approx(0.7))
                assert s.hybrid_stats()[3].margin_now == 0.0
        # adaptive TAM: the margin moves with the measured feedback: 0, or within [0.01, 1]
        with m.session(ContextParams(n_ctx=256, mode="predictor", vram_budget_gib=budget, policy="tam")) as s:
            s.decode(m.tokenize(PROMPT))
            for _ in range(16):
                s.decode([int(s.logits().argmax())])
            for st in s.hybrid_stats():
                if st.n_slots == 0:
                    continue
                assert st.margin_now == 0.0 or 0.01 - 1e-7 <= st.margin_now <= 1.0
                if st.io_bound_steps == 0:
                    assert st.margin_now == 0.0
                elif st.io_bound_steps == st.steps - 1:
                    assert st.margin_now > 0.01
        # tam-lambda: lambda starts mid-range (bounds then 0.5..0.95) so that either verdict can move it
        with m.session(ContextParams(n_ctx=256, mode="predictor", vram_budget_gib=budget, policy="tam-lambda",
                                     lambda_init=0.7)) as s:
            s.decode(m.tokenize(PROMPT))
            for _ in range(16):
                s.decode([int(s.logits().argmax())])
            for il in range(m.n_layer):
                tr = s.lambda_trace(il)
                st = s.hybrid_stats()[il]
                if st.n_slots == 0:
                    continue
                # measured feedback every step after the first: lambda moves, within its bounds,
                # up after I/O-bound steps and down after CPU-bound ones
                assert len(tr) == st.steps and np.all((tr >= 0.5 - 1e-6) & (tr <= 0.95 + 1e-6))
                assert len(set(np.round(tr, 6))) > 1
                if st.io_bound_steps == 0:
                    assert np.all(np.diff(tr) <= 1e-7) and tr[-1] < 0.7
                elif st.io_bound_steps == st.steps - 1:
                    assert np.all(np.diff(tr) >= -1e-7) and tr[-1] > 0.7


def test_zero_budget_is_the_cpu_path(kx_model: Path, cpu_reference) -> None:  # type: ignore[no-untyped-def]
    toks, logits = _greedy(kx_model, vram_budget_gib=0.0)
    assert toks == cpu_reference[0]
    np.testing.assert_array_equal(logits, cpu_reference[1])
    with Model(kx_model) as m, m.session(ContextParams(n_ctx=64, mode="predictor")) as s:
        assert s.hybrid_info() is None
        with pytest.raises(KairoxError, match="no hybrid runtime"):
            s.hybrid_stats()


def test_budget_too_small_and_wrong_mode_are_clear_errors(kx_model: Path, model_path: Path) -> None:
    with Model(kx_model) as m:
        with pytest.raises(KairoxError, match="below what the dense parts need"):
            m.session(ContextParams(n_ctx=64, mode="predictor", vram_budget_gib=0.001))
        with pytest.raises(KairoxError, match="needs predictor mode"):
            m.session(ContextParams(n_ctx=64, mode="threshold", vram_budget_gib=1.0))
        # mode "auto" (the default) picks predictor mode for the hybrid runtime, as the CLI does
        with m.session(ContextParams(n_ctx=64, vram_budget_gib=1.0)) as s:
            assert s.mode == "predictor" and s.hybrid_info() is not None
        with pytest.raises(KairoxError, match="policy must be one of"):
            m.session(ContextParams(n_ctx=64, mode="predictor", vram_budget_gib=1.0, policy="fifo"))
    with Model(model_path) as m, pytest.raises(KairoxError, match="no Kairox sparsity data"):
        m.session(ContextParams(n_ctx=64, mode="predictor", vram_budget_gib=1.0))


def test_closing_mid_generation(kx_model: Path, sizes) -> None:  # type: ignore[no-untyped-def]
    """Stopping a generation between steps (reloads issued) and freeing the context is clean;
    a new context on the same model starts from the initial placement again."""
    budget = _budget(sizes, 0.2)
    with Model(kx_model) as m:
        for _ in range(3):
            s = m.session(ContextParams(n_ctx=128, mode="predictor", vram_budget_gib=budget, policy="eager"))
            gen = s.generate(m.tokenize(PROMPT), 32)
            for i, _piece in enumerate(gen):
                if i == 5:
                    break
            gen.close()
            assert sum(st.loads for st in s.hybrid_stats()) > 0
            s.close()


def test_policy_names_match_the_cli() -> None:
    assert set(POLICIES) >= {"static", "lru", "topk", "eager", "tam", "tam-t"}


def test_cli_run_hybrid_stats(run_cli, kx_model: Path, sizes) -> None:  # type: ignore[no-untyped-def]
    r = run_cli("run", str(kx_model), "-p", "Tides are", "-n", "8", "-t", "2",
                "--vram-budget", f"{_budget(sizes, 0.3):.4f}", "--policy", "tam", "--stats")
    assert r.returncode == 0, r.stderr
    assert "hybrid runtime (CPU stand-in, policy tam)" in r.stderr
    assert "hit rate" in r.stderr
    assert "hybrid pipeline per layer" in r.stderr and "planned during the layer before" in r.stderr
    assert "device" in r.stderr and "overlap" in r.stderr  # --stats times the halves
    r = run_cli("run", str(kx_model), "-p", "Tides are", "-n", "4", "--vram-budget", "0.0001")
    assert r.returncode != 0 and "below what the dense parts need" in r.stderr
    assert "Traceback" not in r.stderr


@pytest.mark.parametrize("device", ["stand-in", "fake-gpu", "fake-gpu=eager"])
def test_generation_stopped_mid_decode_then_freed(kx_model: Path, device: str) -> None:
    """test-kairox-hybrid (C++): for 4 policies x 2 budgets, a decode stopped by the abort
    callback after N graph nodes (some stops land right after a layer's reloads), then the
    context freed mid-generation; on the CPU stand-in, and on the fake GPU, where the stop
    leaves device work and copies from the scheduler's staging queued (the eager one: still
    running on its worker threads). Under an ASan/LSan build
    the same program proves no leak (BENCHMARKS.md records that run); here it checks the
    sequence itself."""
    import subprocess

    from conftest import find_tool

    exe = find_tool("test-kairox-hybrid")
    if exe is None:
        pytest.skip("test-kairox-hybrid not built")
    args = [str(exe), str(kx_model)] + ([f"--{device}"] if device.startswith("fake-gpu") else [])
    proc = subprocess.run(args, capture_output=True, text=True, timeout=600, check=False)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    assert "32/32 aborts clean" in proc.stdout
    assert proc.stdout.count("decode rc 2") >= 8  # stopped mid-graph, not after it


def _compare_table(exe: Path, model: Path, *extra: str) -> tuple[str, list[list[str]]]:
    """test-kairox-hybrid compare: its output and its table's rows (cells)."""
    import subprocess

    proc = subprocess.run([str(exe), str(model), "compare", "8", *extra], capture_output=True, text=True,
                          timeout=900, check=False)
    # 0 or 1 (1: a run's top tokens agree at fewer than 90% of 8 steps, as the default mode's
    # float sums may); anything else is a crash
    assert proc.returncode in (0, 1), proc.stdout[-4000:] + proc.stderr[-2000:]
    rows = [[c.strip() for c in line.strip().strip("|").split("|")] for line in proc.stdout.splitlines()
            if line.startswith("| default") or line.startswith("| deterministic")]
    assert len(rows) == 15, proc.stdout
    return proc.stdout, rows


@pytest.fixture(scope="module")
def stand_in_table(kx_model: Path) -> list[list[str]]:
    """test-kairox-hybrid compare's rows on the CPU stand-in."""
    from conftest import find_tool

    exe = find_tool("test-kairox-hybrid")
    if exe is None:
        pytest.skip("test-kairox-hybrid not built")
    return _compare_table(exe, kx_model)[1]


@pytest.mark.parametrize("gpu", ["lazy", "eager"])
def test_fake_gpu_computes_what_the_stand_in_does_with_one_wait_per_layer(  # type: ignore[no-untyped-def]
        kx_model: Path, stand_in_table, gpu: str) -> None:
    """test-kairox-hybrid compare --fake-gpu: the model placed as on a GPU (every layer on the
    device but the FFN weights), the device a lazy fake GPU that runs what a CUDA build runs
    there, with the CPU's kernels, only when the host waits for it. So the scheduler's real
    splits and copies between two backends run as they would with a GPU, and any read of device
    results before a wait, or copy source overwritten too soon, would change the numbers. Every
    run whose numbers do not depend on timing (deterministic mode; the default mode where no
    group is reloaded, as loads that land in time move neurons between the halves' float sums)
    gives exactly the stand-in's row (logit differences to the CPU-only path, top-1 agreement,
    greedy tokens, loads); deterministic mode the CPU-only path's tokens; and a
    default-mode decode step waits for the device once per layer with a CPU half (the fetch of its
    FFN input with the next layer's logits) and once for the token's logits: the predictor runs
    on the device, the merge and the user's inputs go to the device without a wait, and so do
    the cache's index maps when a reload or an eviction changes them (a synchronous access to
    device memory counts as a wait: on a GPU it is one). The forced
    runs are timed (kairox_hybrid_set_timing): every step of a layer with both halves times its
    device half by the fake GPU's events. The lazy fake GPU runs them when the host waits for
    them, after the CPU half: device time but no overlap. The eager one (--fake-gpu=eager) runs
    its queues on worker threads as work arrives, concurrently with the host, as a GPU does:
    everything above holds, and the device half computes while the CPU half does. After the
    first two steps no device graph changes the properties a CUDA graph is captured from (its
    nodes' parameters, its sources' addresses and shapes), so a CUDA build replays every one."""
    from conftest import find_tool

    exe = find_tool("test-kairox-hybrid")
    if exe is None:
        pytest.skip("test-kairox-hybrid not built")
    out, fake = _compare_table(exe, kx_model, "--fake-gpu" if gpu == "lazy" else "--fake-gpu=eager")
    assert out.startswith(f"device: {gpu} fake GPU"), out[:200]
    stand_in = stand_in_table
    timeless = [i for i, (f, c) in enumerate(zip(fake, stand_in))
                if f[0] == "deterministic" or (f[7] == "0" and c[7] == "0")]
    assert len(timeless) >= 9
    assert [fake[i][:8] for i in timeless] == [stand_in[i][:8] for i in timeless]
    overlap = 0.0
    for r in fake:
        if r[0] == "deterministic":
            assert r[6] == "yes", r  # greedy tokens identical to the CPU-only path
        else:
            assert "wrong" not in r[10], r  # more waits than the design's (see the docstring)
            n_host, waits, sched = int(r[8]), float(r[9]), float(r[10])
            assert waits == n_host + 1, r
            assert sched == waits - 1, r  # kairox_graph_waits: all but the token's logits
        assert "wrong" not in r[11], r
        dev_ms, overlap_ms = (float(x) for x in r[11].split("/"))
        assert (dev_ms > 0) == (int(r[8]) > 0) and overlap_ms <= dev_ms, r
        assert overlap_ms == 0 or gpu == "eager", r
        recaptured, graphs = (int(x) for x in r[12].split("/"))
        assert recaptured == 0 and graphs > 0, r
        overlap += overlap_ms if r[0] == "default" else 0.0
    assert overlap > 0 or gpu == "lazy", out
    # a partial cache leaves every layer a CPU half; the whole cache none (the FFN on the device)
    assert all(int(r[8]) == 30 for r in fake if r[2] in ("0.1", "0.5"))
    assert all(int(r[8]) == 0 for r in fake if r[2] == "1.0")


def test_loads_land_in_the_same_token_or_at_the_next_step(kx_model: Path, sizes) -> None:  # type: ignore[no-untyped-def]
    """The reload worker copies a step's loads while the token goes on computing. A load whose
    copy is done at a land check (the layer is planned during the layer before it, and checked
    again before its device half) is bound in the same token: that token's halves already use it;
    the others stay on the CPU until the layer's next plan. So right after a step, a layer with a
    full cache has n_slots - (loads - early loads) groups bound. Layer 0's step for a token runs
    during the last layer of the token before (its prefetch) and is counted with the token it
    serves; right after a token the next one's loads are still copying, so fewer than n_slots
    groups may be bound. Deterministic mode waits for its loads, so every slot is bound after
    every step."""
    budget = _budget(sizes, 0.3)
    with Model(kx_model) as m:
        for det in (False, True):
            with m.session(ContextParams(n_ctx=256, mode="predictor", vram_budget_gib=budget, policy="topk",
                                         deterministic=det)) as s:
                s.decode(m.tokenize(PROMPT))
                prev = [(st.loads, st.loads_early) for st in s.hybrid_stats()]
                seen_loads = seen_early = 0
                for _ in range(6):
                    s.decode([int(s.logits().argmax())])
                    stats = s.hybrid_stats()
                    for il, st in enumerate(stats):
                        if st.n_slots == 0:
                            continue
                        step_loads = st.loads - prev[il][0]
                        step_early = st.loads_early - prev[il][1]
                        bound = int(s.resident_groups(il).sum())
                        assert 0 <= step_early <= step_loads
                        if det:
                            assert bound == st.n_slots and step_early == 0, (il, bound, st.n_slots)
                        elif il == 0 and st.steps_ahead:
                            assert bound <= st.n_slots
                        else:
                            assert bound == st.n_slots - (step_loads - step_early), (il, bound, st.n_slots, step_loads)
                        seen_loads += step_loads
                        seen_early += step_early
                    prev = [(st.loads, st.loads_early) for st in stats]
                assert seen_loads > 0  # Top-K moves groups every step
                if not det:
                    # the stand-in's copies are short next to a layer's CPU half: most land early
                    assert seen_early > 0


def test_head_start_plans_each_split_layer_one_layer_early(kx_model: Path, sizes) -> None:  # type: ignore[no-untyped-def]
    """With the adjacent predictor, a layer that splits between the device and the CPU is planned
    during the layer before it when that layer splits too, and layer 0 (no layer before it)
    during the previous token's last layer: every step of such a layer is planned ahead. A
    split layer after a non-split one plans at its own step. One balancer step per layer and
    token either way; the results stay the CPU-only path's (test_same_tokens_as_cpu_sparse)."""
    budget = _budget(sizes, 0.3)
    with Model(kx_model) as m, m.session(ContextParams(n_ctx=256, mode="predictor", vram_budget_gib=budget,
                                                       policy="tam", deterministic=True)) as s:
        s.decode(m.tokenize(PROMPT))
        s.reset_hybrid_stats()
        s.set_op_timing(True)
        s.reset_op_times()
        n = 5
        for _ in range(n):
            s.decode([int(s.logits().argmax())])
        hs = s.hybrid_stats()
        split = [0 < st.n_slots < st.n_groups for st in hs]
        assert sum(split) >= 2
        # per token and split layer one plan; and one fetch (the node whose inputs go to the host
        # before the layer's device half is issued: its FFN input, with the next layer's logits)
        # where the layer or the next one is planned ahead; a layer planned at its own step
        # whose next one is not has its plan node as that transfer
        def planned_ahead(k: int) -> bool:
            return 0 < k < len(split) and split[k] and split[k - 1]
        fetches = sum(1 for k in range(len(split)) if split[k] and (planned_ahead(k) or planned_ahead(k + 1)))
        count = {name: c for name, _, c, _ in s.op_times()}
        assert count.get("kx_plan", 0) == n * sum(split)
        assert count.get("kx_fetch", 0) == n * fetches
        assert count.get("kx_prefetch", 0) == (n if split[0] and split[-1] else 0)
        for il, st in enumerate(hs):
            ahead = split[il] and (split[il - 1] if il > 0 else split[-1])
            assert st.steps == (n if split[il] else 0), (il, st)
            assert st.steps_ahead == (n if ahead else 0), (il, st)
            assert st.t_plan_us > 0 or not split[il]
    # the ablation: every layer plans at its own step, same tokens
    on, _ = _greedy(kx_model, n=8, vram_budget_gib=budget, policy="tam")
    with Model(kx_model) as m, m.session(ContextParams(n_ctx=256, mode="predictor", vram_budget_gib=budget,
                                                       policy="tam", deterministic=True, head_start=False)) as s:
        s.decode(m.tokenize(PROMPT))
        off = []
        for _ in range(8):
            off.append(int(s.logits().argmax()))
            s.decode([off[-1]])
        hs = s.hybrid_stats()
        assert off == on
        assert all(st.steps_ahead == 0 and st.loads_early == 0 for st in hs)
        assert any(st.steps > 0 for st in hs)


@pytest.mark.parametrize("head_start", [True, False])
def test_halves_are_timed_per_step(kx_model: Path, sizes, head_start: bool) -> None:  # type: ignore[no-untyped-def]
    """Session.set_hybrid_timing times each step's halves of every layer that has both. The
    stand-in computes its device half on the host between the layer's plan (or fetch) and its CPU
    half, so every such step is timed, the device half takes time, and the halves never overlap:
    the stand-in computes them in turn. Timing changes no result, and without it nothing is
    timed."""
    budget = _budget(sizes, 0.3)
    params = dict(n_ctx=256, mode="predictor", vram_budget_gib=budget, policy="tam", deterministic=True,
                  head_start=head_start)
    runs = []
    for timing in (False, True):
        with Model(kx_model) as m, m.session(ContextParams(**params)) as s:  # type: ignore[arg-type]
            if timing:
                s.set_hybrid_timing(True)
            s.decode(m.tokenize(PROMPT))
            s.reset_hybrid_stats()
            toks = []
            for _ in range(6):
                toks.append(int(s.logits().argmax()))
                s.decode([toks[-1]])
            runs.append((toks, s.hybrid_stats(), s.device_busy()))
    (toks_off, off, busy_off), (toks_on, on, busy_on) = runs
    assert toks_on == toks_off
    # the device's busy share: 6 graphs timed, the stand-in's device halves a part of their time
    assert busy_off == (0, 0.0, 0.0)
    assert busy_on[0] == 6 and 0 < busy_on[2] < busy_on[1], busy_on
    assert all(st.timed_steps == 0 and st.t_dev_us == 0 and st.t_shorter_us == 0 for st in off)
    split = [st for st in on if 0 < st.n_slots < st.n_groups]
    assert len(split) >= 2
    for st in on:
        if 0 < st.n_slots < st.n_groups:
            assert st.timed_steps == st.steps == 6, st
            assert st.t_dev_us > 0 and st.t_shorter_us > 0, st
            assert st.t_overlap_us == 0 and st.overlap_share == 0, st
            assert st.t_shorter_us <= min(st.t_dev_us, st.t_cpu_us), st
        else:
            assert st.timed_steps == 0, st


def _kv_bytes(m: Model, n_ctx: int) -> int:
    """llama.cpp's KV cache for a llama-family model with F16 K and V: every layer keeps
    n_ctx rows of n_head_kv * head_dim for K and for V."""
    head_dim = m.n_embd // m.n_head
    return m.n_layer * n_ctx * 2 * (m.n_head_kv * head_dim) * 2


def test_auto_budget_is_free_memory_minus_the_margin(kx_model: Path, sizes, cpu_reference) -> None:  # type: ignore[no-untyped-def]
    """--vram-budget auto: the device's free memory minus the context's KV cache (the bytes
    llama.cpp allocates for it), an upper estimate of its compute buffers and the reserve. The
    stand-in's memory is the host's as ggml's CPU device reports it, so a reserve that leaves
    room for the dense parts and a quarter of the cache must give a partial cache, the same
    tokens as the CPU path, and the same placement as that budget given in GiB."""
    with Model(kx_model) as m:
        ctx = ContextParams(n_ctx=256, n_threads=2, mode="predictor", vram_budget_gib=VRAM_AUTO)
        with m.session(ctx) as s:
            b, info = s.hybrid_budget(), s.hybrid_info()
            assert b is not None and info is not None and b.is_auto
            assert b.kv_bytes == _kv_bytes(m, 256)
            assert b.compute_bytes >= 4 * m.n_vocab  # the logits of a token at least
            assert b.reserve_bytes == 1 << 29  # default 0.5 GiB
            assert b.budget_bytes == info.budget_bytes == b.device_free - b.margin_bytes
            assert info.n_slots == info.n_groups  # the host has room for the whole cache
            free, margin = b.device_free, b.kv_bytes + b.compute_bytes
        target = sizes[0] + 0.25 * sizes[1]
        reserve = (free - margin - target) / GIB
        with m.session(ContextParams(n_ctx=256, n_threads=2, mode="predictor", vram_budget_gib=VRAM_AUTO,
                                     vram_reserve_gib=reserve)) as s:
            b, info = s.hybrid_budget(), s.hybrid_info()
            assert b is not None and info is not None
            assert abs(b.budget_bytes - target) < 4096  # float GiB of the reserve
            assert info.dense_bytes + info.cache_bytes <= b.budget_bytes
            assert 0 < info.n_slots < info.n_groups
            auto_slots = info.n_slots
        with m.session(ContextParams(n_ctx=64, mode="predictor", vram_budget_gib=b.budget_bytes / GIB)) as s:
            fixed = s.hybrid_info()
            assert fixed is not None and abs(fixed.n_slots - auto_slots) <= 1
            fb = s.hybrid_budget()
            assert fb is not None and not fb.is_auto and fb.kv_bytes == 0
    toks, logits = _greedy(kx_model, vram_budget_gib=VRAM_AUTO, vram_reserve_gib=reserve)
    assert toks == cpu_reference[0]
    np.testing.assert_array_equal(logits, cpu_reference[1])


def test_auto_budget_errors(kx_model: Path, sizes) -> None:  # type: ignore[no-untyped-def]
    with Model(kx_model) as m:
        with m.session(ContextParams(n_ctx=64, mode="predictor", vram_budget_gib=VRAM_AUTO)) as s:
            b = s.hybrid_budget()
            assert b is not None
        # a reserve that leaves less than the dense parts, and one above the free memory
        reserve = (b.device_free - b.kv_bytes - b.compute_bytes - sizes[0] / 2) / GIB
        with pytest.raises(KairoxError, match=r"auto: .* free minus the margin\) is below what the dense parts need"):
            m.session(ContextParams(n_ctx=64, mode="predictor", vram_budget_gib=VRAM_AUTO, vram_reserve_gib=reserve))
        with pytest.raises(KairoxError, match="less than the margin .*KV cache"):
            m.session(ContextParams(n_ctx=64, mode="predictor", vram_budget_gib=VRAM_AUTO,
                                    vram_reserve_gib=b.device_free / GIB + 1))
        with pytest.raises(KairoxError, match="vram_reserve_gib must be >= 0"):
            m.session(ContextParams(n_ctx=64, mode="predictor", vram_budget_gib=VRAM_AUTO, vram_reserve_gib=-1))
        with pytest.raises(KairoxError, match="needs predictor mode"):
            m.session(ContextParams(n_ctx=64, mode="threshold", vram_budget_gib=VRAM_AUTO))


def test_cli_run_auto_budget(run_cli, kx_model: Path) -> None:  # type: ignore[no-untyped-def]
    r = run_cli("run", str(kx_model), "-p", "Tides are", "-n", "4", "-t", "2", "--vram-budget", "auto", "--stats")
    assert r.returncode == 0, r.stderr
    assert "(auto: " in r.stderr and "KV cache" in r.stderr
    r = run_cli("run", str(kx_model), "-p", "Tides are", "-n", "4", "--vram-budget", "lots")
    assert r.returncode == 2 and "neither a number of GiB nor 'auto'" in r.stderr
    r = run_cli("run", str(kx_model), "-p", "Tides are", "-n", "4", "--vram-budget", "auto", "--vram-reserve", "100000")
    assert r.returncode != 0 and "less than the margin" in r.stderr and "Traceback" not in r.stderr


def test_ffn_on_host_placement(kx_model: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """With a GPU, `kairox run` loads a Kairox GGUF with every layer on the GPU except the FFN
    weights (the sparse row kernels run on the CPU; the hybrid cache is the device's copy). On a
    machine without one the option only keeps ffn_gate/ffn_up in plain rows (FFN_ROWS); forced
    here, the GPU override list must load and decode exactly as the plain load does (the CPU
    buffer type is where weights go anyway)."""
    import kairox_py.llama as llama

    with Model(kx_model, ffn_on_host=True) as m:
        if not llama.has_gpu():
            assert m._overrides is not None
            assert m._overrides[0].pattern.decode() == llama.FFN_ROWS

    def greedy(m: Model) -> list[int]:
        with m.session(ContextParams(n_ctx=64, n_threads=2, mode="predictor")) as s:
            s.decode(m.tokenize(PROMPT))
            out = []
            for _ in range(4):
                out.append(int(s.logits().argmax()))
                s.decode([out[-1]])
            return out

    with Model(kx_model) as m:
        plain = greedy(m)
    monkeypatch.setattr(llama, "has_gpu", lambda: True)
    with Model(kx_model, ffn_on_host=True) as m:
        assert m._overrides[0].pattern.decode() == llama.FFN_WEIGHTS
        assert greedy(m) == plain


def test_gguf_truncate_keeps_a_working_kairox_model(kx_model: Path, tmp_path: Path) -> None:
    """scripts/gguf_truncate.py (small models for the GPU machine): the first layers of a Kairox
    GGUF, per-layer metadata cut to match, load and run the hybrid runtime like the original."""
    import subprocess
    import sys

    out = tmp_path / "cut.gguf"
    repo = Path(__file__).resolve().parents[1]
    subprocess.run([sys.executable, str(repo / "scripts" / "gguf_truncate.py"), str(kx_model), str(out),
                    "--layers", "2", "--embd-type", "q4_0"], check=True, capture_output=True)
    assert out.stat().st_size < kx_model.stat().st_size / 3
    with Model(out) as m:
        assert m.n_layer == 2
        with m.session(ContextParams(n_ctx=64, n_threads=2, mode="predictor", vram_budget_gib=64.0)) as s:
            info = s.hybrid_info()
            assert info is not None and info.n_slots == info.n_groups > 0
            s.decode(m.tokenize(PROMPT))
            assert np.isfinite(s.logits()).all()
    with pytest.raises(subprocess.CalledProcessError):
        subprocess.run([sys.executable, str(repo / "scripts" / "gguf_truncate.py"), str(kx_model),
                        str(tmp_path / "bad.gguf"), "--layers", "999"], check=True, capture_output=True)
    assert not (tmp_path / "bad.gguf").exists()


def test_ffn_placement_pattern_spares_the_norm() -> None:
    """The hybrid placement keeps the FFN matrices in host memory and nothing else: ffn_norm on
    the host would send every layer's activations to the CPU and back for one multiply."""
    import re

    from kairox_py.llama import FFN_WEIGHTS

    pat = re.compile(FFN_WEIGHTS)
    for name in ("blk.0.ffn_up.weight", "blk.3.ffn_gate.weight", "blk.12.ffn_down.weight", "blk.1.ffn_down_t.weight"):
        assert pat.search(name), name
    for name in ("blk.0.ffn_norm.weight", "blk.0.attn_q.weight", "blk.0.kx_pred_up.weight", "output.weight"):
        assert not pat.search(name), name


def test_fully_resident_layer_runs_without_plan(tmp_path: Path) -> None:
    """A layer whose every group is cached has nothing to balance and nothing for the CPU: its FFN
    runs from the cache alone (no plan node, no CPU half) and gives the CPU-only path's tokens;
    with a partial cache the plan node runs once per layer and token."""
    from kairox_py.benchmark.synthetic import SHAPES, SparseSpec, pred_threshold_for, write_synthetic_llama

    spec = SparseSpec(0)
    path = write_synthetic_llama(tmp_path / "tiny.gguf", SHAPES["tiny"], "q4_0", spec, group_size=32)
    thr = pred_threshold_for(0.3, spec)
    n_layer, n = SHAPES["tiny"].n_layer, 12

    def run(budget: float, det: bool = True) -> tuple[list[int], int, list[int]]:
        with Model(path) as m, m.session(ContextParams(n_ctx=128, mode="predictor", pred_threshold=thr,
                                                       deterministic=det, vram_budget_gib=budget)) as s:
            s.decode(m.tokenize("one two three four"))
            s.set_op_timing(True)
            s.reset_op_times()
            if budget:
                s.reset_hybrid_stats()
            toks = []
            for _ in range(n):
                toks.append(int(s.logits().argmax()))
                s.decode([toks[-1]])
            plans = sum(c for name, _, c, _ in s.op_times() if name == "kx_plan")
            fetches = sum(c for name, _, c, _ in s.op_times() if name == "kx_fetch")
            steps = [h.steps for h in s.hybrid_stats()] if budget else []
            # one backend (the CPU; the stand-in's cache is a CPU buffer): one split per token,
            # and no GPU to wait for
            assert s.graph_splits() == 1 and s.graph_waits() == 0
            # one host fetch per token for each split layer that is, or precedes one, planned ahead
            split = [x > 0 for x in steps]
            ahead = [0 < k and split[k] and split[k - 1] for k in range(len(split))] + [False]
            assert fetches == n * sum(1 for k in range(len(split)) if split[k] and (ahead[k] or ahead[k + 1]))
            return toks, plans, steps

    cpu, plans, _ = run(0.0)
    assert plans == 0
    full, plans, steps = run(1.0)
    assert full == cpu and plans == 0 and steps == [0] * n_layer
    assert run(1.0, det=False)[0] == run(0.0, det=False)[0]
    part, plans, steps = run(0.0013)  # about half the groups (test_static_scores_hybrid_equals_cpu)
    assert part == cpu
    assert plans == n * sum(1 for x in steps if x > 0) and any(x > 0 for x in steps)


def test_everything_resident_costs_the_host_what_upstream_does(kx_model: Path, model_path: Path) -> None:
    """test-kairox-hybrid speed --fake-gpu --skip-compute: a decode step's host time with the
    device's graphs queued but not computed, for upstream on the original GGUF (every layer on
    the device), the hybrid runtime with every group cached, and with half of them. A GPU
    computes a small layer faster than the host prepares it, so with the whole model resident the
    hybrid must cost the host what upstream does: one device graph per step (no host round trip
    per layer), none of them re-captured as a CUDA graph, and no per-layer host work; with half
    of the groups, every layer's CPU half is one more device graph on each side of it."""
    import subprocess

    from conftest import find_tool

    exe = find_tool("test-kairox-hybrid")
    if exe is None:
        pytest.skip("test-kairox-hybrid not built")
    proc = subprocess.run([str(exe), str(kx_model), "speed", str(model_path), "16", "--fake-gpu", "--skip-compute"],
                          capture_output=True, text=True, timeout=600, check=False)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    rows = [[c.strip() for c in line.strip().strip("|").split("|")] for line in proc.stdout.splitlines()
            if line.startswith("| llama.cpp") or line.startswith("| Kairox")]
    assert len(rows) == 3, proc.stdout
    (_, up_us, _, _, up_graphs, up_recap), (_, fit_us, _, _, fit_graphs, fit_recap), half = rows
    assert float(up_graphs) == float(fit_graphs) == 1.0, proc.stdout
    assert float(half[4]) == 2 * 30 + 1, proc.stdout
    assert float(up_recap) == float(fit_recap) == float(half[5]) == 0.0, proc.stdout
    # a host round trip or a scan per layer costs tens of microseconds each, 30 layers
    assert float(fit_us) <= 4 * float(up_us) + 150, proc.stdout


def test_speed_profiles_one_configuration(kx_model: Path, model_path: Path) -> None:
    """test-kairox-hybrid speed --profile CONFIG (what Nsight Compute runs, one configuration
    per run so its kernels are its own): only that configuration is timed, for one round; without
    a CUDA driver it says it has no profiler range; an unknown configuration is a usage error."""
    import subprocess

    from conftest import find_tool

    exe = find_tool("test-kairox-hybrid")
    if exe is None:
        pytest.skip("test-kairox-hybrid not built")
    base = [str(exe), str(kx_model), "speed", str(model_path), "4", "--fake-gpu", "--skip-compute"]
    for config, label in (("upstream", "| llama.cpp"), ("fit", "| Kairox, every group"), ("half", "| Kairox, half")):
        proc = subprocess.run(base + ["--profile", config], capture_output=True, text=True, timeout=300, check=False)
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
        rows = [line for line in proc.stdout.splitlines() if line.startswith(("| llama.cpp", "| Kairox"))]
        assert len(rows) == 1 and rows[0].startswith(label), proc.stdout
        assert "median of 1" in proc.stdout and "no CUDA driver's profiler" in proc.stderr
    proc = subprocess.run(base + ["--profile", "all"], capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 2 and "--profile upstream|fit|half" in proc.stderr
