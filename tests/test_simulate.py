"""The trace-driven simulator: conservation laws on synthetic traces (fast), the cost model's
PCIe fit against the paper's Table 2, and an end-to-end `kairox trace` + `kairox simulate`
smoke test on a short real trace of the default model."""
from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np
import pytest

from kairox_py.balancer import POLICIES, BalancerConfig
from kairox_py.errors import KairoxError
from kairox_py.sim.replay import (
    DEFAULT_CPU,
    MODES,
    PRESETS,
    CostModel,
    SequenceData,
    SimConfig,
    calibration_from_csv,
    simulate,
    trace_cpu,
)
from kairox_py.sim.traces import TRACE_VERSION, Trace, TraceMeta, pack

N_LAYER, N_EMBD, N_FF, GS = 4, 576, 1536, 32


def make_trace(d: Path, n_seq: int = 2, n_steps: int = 40, seed: int = 0) -> Trace:
    """A synthetic trace with the default model's shapes: hot neurons, bursts, spikes."""
    rng = np.random.default_rng(seed)
    base = rng.random(N_FF) ** 2
    shape = (n_seq, n_steps, N_LAYER, N_FF)
    act = np.zeros(shape, dtype=bool)
    state = rng.random((N_LAYER, N_FF)) < base
    for s in range(n_seq):
        for t in range(n_steps):
            flip = rng.random((N_LAYER, N_FF)) < 0.2
            state = np.where(flip, rng.random((N_LAYER, N_FF)) < base, state)
            act[s, t] = state | (rng.random((N_LAYER, N_FF)) < 0.03)
    pred = act | (rng.random(shape) < 0.2)
    d.mkdir(parents=True, exist_ok=True)
    np.save(d / "active.npy", pack(act))
    np.save(d / "predicted.npy", pack(pred))
    np.save(d / "tokens.npy", np.zeros(shape[:2], dtype=np.int32))
    freq = act.reshape(-1, N_LAYER, N_FF // GS, GS).mean(axis=(0, 3)).astype(np.float32)
    np.save(d / "group_freq.npy", freq)
    costs = {"row_bytes": {"gate": 360, "up": 360, "down": 612}, "attn_bytes": [400000] * N_LAYER,
             "output_bytes": 20_000_000, "types": {"gate": "q4_1", "up": "q4_1", "down": "q8_0"}}
    meta = TraceMeta(TRACE_VERSION, "synthetic", "0", None, N_LAYER, N_EMBD, N_FF, GS, n_seq, n_steps,
                     [0.0] * N_LAYER, "synthetic", True, 0.5, False, 0.0, 1.0, 0, ["p"] * n_seq, costs)
    (d / "meta.json").write_text(meta.to_json())
    return Trace(d)


@pytest.fixture(scope="module")
def synth(tmp_path_factory: pytest.TempPathFactory) -> Trace:
    return make_trace(tmp_path_factory.mktemp("trace") / "t")


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("policy", sorted(POLICIES))
def test_conservation(synth: Trace, policy: str, mode: str) -> None:
    for preset, gs in (("pc-low", 32), ("pc-high", 8)):
        data = SequenceData(synth, "predicted", gs)
        cost = CostModel.build(synth, PRESETS[preset], DEFAULT_CPU, gs)
        r = simulate(data, cost, SimConfig(preset, 0.4, BalancerConfig(policy), mode))
        # bytes moved are loads times the bytes of a group (gate + up + down_t rows)
        assert cost.group_bytes == gs * (360 + 360 + 612)
        assert np.array_equal(r.bytes_moved, r.loads * cost.group_bytes)
        assert r.summary()["mb_moved"] == pytest.approx(r.loads.sum() * cost.group_bytes / r.n_tokens / 1e6)
        # time is never negative, and a token costs at least its attention blocks
        for a in (r.cpu_us, r.io_us, r.io_stall_us, r.cpu_stall_us, r.late):
            assert (a >= 0).all()
        assert (r.token_us >= cost.attn_us.sum()).all()
        # rows: what the GPU computes is part of what is computed
        assert ((r.gpu_rows >= 0) & (r.gpu_rows <= r.rows)).all()
        assert 0.0 <= r.summary()["hit_rate"] <= 1.0
        # the I/O time is exactly the loads' PCIe time
        assert np.allclose(r.io_us, r.loads * cost.group_load_us, rtol=1e-5)
        if mode == "wait":
            assert (r.late == 0).all()
        else:
            assert (r.io_stall_us == 0).all()
        if policy == "static":
            assert r.loads.sum() == 0 and (r.io_us == 0).all()
        if policy != "tam_lambda":  # only the paper's variant adapts lambda
            assert np.allclose(r.lam, BalancerConfig.lambda_init)
        if policy != "tam":  # only adaptive TAM has a margin
            assert (r.margin == 0).all()
        else:
            assert (((r.margin >= 0.01 - 1e-7) | (r.margin == 0)) & (r.margin <= 1.0)).all()


def test_budget_extremes(synth: Trace) -> None:
    data = SequenceData(synth, "active", GS)
    cost = CostModel.build(synth, PRESETS["pc-low"], DEFAULT_CPU, GS)
    full = simulate(data, cost, SimConfig("pc-low", 1.0, BalancerConfig("tam")))
    assert full.summary()["hit_rate"] == 1.0 and full.loads.sum() == 0
    assert (full.cpu_us == 0).all()
    empty = simulate(data, cost, SimConfig("pc-low", 0.0, BalancerConfig("topk")))
    assert empty.summary()["hit_rate"] == 0.0 and empty.loads.sum() == 0


def test_per_layer_slots_and_layer0_source(synth: Trace) -> None:
    """slots= overrides the uniform share per layer (the hybrid runtime's apportioning), and
    layer0='current' decides layer 0 from its own step (the runtime without prefetch) instead of the
    previous step's pattern; other layers do not care."""
    data = SequenceData(synth, "predicted", GS)
    cost = CostModel.build(synth, PRESETS["pc-low"], DEFAULT_CPU, GS)
    n_groups = N_FF // GS
    k = int(round(0.4 * n_groups))
    bal = BalancerConfig("tam_fixed")
    uni = simulate(data, cost, SimConfig("pc-low", 0.4, bal))
    same = simulate(data, cost, SimConfig("pc-low", 0.0, bal, slots=(k,) * N_LAYER))
    assert np.array_equal(uni.loads, same.loads) and np.array_equal(uni.gpu_rows, same.gpu_rows)
    skew = simulate(data, cost, SimConfig("pc-low", 0.4, bal, slots=(0, n_groups, k, 1)))
    assert (skew.gpu_rows[:, 0] == 0).all() and np.array_equal(skew.gpu_rows[:, 1], skew.rows[:, 1])
    assert skew.loads[:, :2].sum() == 0
    cur = simulate(data, cost, SimConfig("pc-low", 0.4, bal, layer0="current"))
    assert np.array_equal(cur.loads[:, 1:], uni.loads[:, 1:])
    assert not np.array_equal(cur.loads[:, 0], uni.loads[:, 0])
    with pytest.raises(KairoxError, match="slots"):
        simulate(data, cost, SimConfig("pc-low", 0.4, bal, slots=(1, 2)))
    with pytest.raises(KairoxError, match="layer-0"):
        simulate(data, cost, SimConfig("pc-low", 0.4, bal, layer0="next"))


def test_pcie_fit_matches_table_2() -> None:
    for p in PRESETS.values():
        t0, bpus = p.pcie_fit()
        assert t0 > 0
        for gs, gbs in p.pcie_table:
            b = gs * p.pcie_table_row_bytes
            model_gbs = b / (t0 + b / bpus) / 1e3
            assert model_gbs == pytest.approx(gbs, rel=0.12), (p.name, gs)


def test_trace_round_trip(synth: Trace) -> None:
    m = synth.mask(0, "predicted")
    assert m.shape == (synth.n_steps, N_LAYER, N_FF) and m.dtype == bool
    c = synth.group_counts(0, "predicted", GS)
    assert (c == m.reshape(synth.n_steps, N_LAYER, -1, GS).sum(axis=3)).all()


def test_profile_generate_records_traces(run_cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """`kairox profile --generate DIR`: the profile, and decode traces of the prompts' continuations."""
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("Name three rivers of Europe.\nWhy do cats purr?\n")
    r = run_cli("profile", "-o", str(tmp_path / "prof"), "--tokens", "64", "--ctx", "64", "-t", "2",
                "--generate", str(tmp_path / "tr"), "--prompts", str(prompts), "--steps", "6")
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "prof" / "meta.json").is_file()
    tr = Trace(tmp_path / "tr")
    assert tr.meta.n_seq == 2 and tr.meta.n_steps == 6 and tr.mask(0).shape[0] == 6
    r = run_cli("profile", "-o", str(tmp_path / "p2"), "--kairox", "x.gguf")
    assert r.returncode == 2 and "--generate" in r.stderr


# ---------------------------------------------------------------------------------------
# the real thing, short: kairox trace (default model) -> kairox simulate
# ---------------------------------------------------------------------------------------
def test_trace_and_simulate_cli(run_cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    tdir = tmp_path / "trace"
    r = run_cli("trace", "-o", str(tdir), "--n-prompts", "2", "--steps", "12", "-t", "2")
    assert r.returncode == 0, r.stderr
    tr = Trace(tdir)
    assert tr.meta.n_seq == 2 and tr.meta.n_steps == 12 and not tr.meta.has_predicted
    assert 0.4 < np.mean(tr.meta.active_density) < 0.6  # calibrated at sparsity 0.5
    assert len(set(np.asarray(tr.tokens[0]).tolist())) > 1

    # without a Kairox GGUF there is no predictor output: one clear line
    r = run_cli("simulate", str(tdir))
    assert r.returncode == 1 and r.stderr.startswith("error: ") and r.stderr.count("\n") == 1
    assert "predicted" in r.stderr

    out = tmp_path / "sim"
    r = run_cli("simulate", str(tdir), "--kind", "active", "--budget", "0.5", "--policy",
                "static,topk,tam", "-o", str(out))
    assert r.returncode == 0, r.stderr
    rows = list(csv.DictReader(open(out / "summary.csv")))
    assert len(rows) == 2 * 3
    for row in rows:
        assert float(row["tok_s"]) > 0 and float(row["token_ms"]) > 0
        assert float(row["io_stall_ms"]) >= 0 and float(row["cpu_ms"]) >= 0
    static = [row for row in rows if row["policy"] == "static"]
    assert all(float(row["mb_moved"]) == 0 for row in static)
    per_token = list(csv.DictReader(open(out / "per_token.csv")))
    assert len(per_token) == 6 * 2 * 12
    for row in per_token:  # bytes = loads x group bytes, per token
        gb = json.loads((tdir / "meta.json").read_text())["costs"]["row_bytes"]
        assert float(row["bytes"]) == pytest.approx(float(row["loads"]) * 32 * sum(gb.values()), rel=1e-5)
    assert len(list(csv.DictReader(open(out / "per_layer.csv")))) == 6 * tr.n_layer


@pytest.mark.parametrize("args,msg", [
    (["simulate", "/no/such/trace"], "not a trace directory"),
    (["simulate", "{trace}", "--budget", "1.5"], "budget"),
    (["simulate", "{trace}", "--policy", "fifo"], "policy"),
    (["simulate", "{trace}", "--group-size", "7"], "group-size"),
    (["simulate", "{trace}", "--lambda-min", "0", "--kind", "active"], "lambda"),
    (["simulate", "{trace}", "--lambda", "0.3", "--lambda-min", "0.4"], "--lambda-min"),
    (["simulate", "{trace}", "--n-seq", "5"], "the trace has 2 sequences"),
])
def test_simulate_bad_input(run_cli, synth: Trace, args: list[str], msg: str) -> None:  # type: ignore[no-untyped-def]
    r = run_cli(*[a.replace("{trace}", str(synth.dir)) for a in args])
    assert r.returncode in (1, 2)
    assert r.stderr.startswith("error: ") and r.stderr.count("\n") == 1, r.stderr
    assert msg in r.stderr.lower()


def test_simulate_checks_before_work(run_cli, synth: Trace, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """-o is checked before the simulations, and its missing parents are not created."""
    out = tmp_path / "missing" / "sim"
    r = run_cli("simulate", str(synth.dir), "-o", str(out))
    assert r.returncode == 1 and r.stderr == f"error: directory does not exist: {out.parent}\n", r.stderr
    assert not out.parent.exists()
    (tmp_path / "file").write_text("x")
    r = run_cli("simulate", str(synth.dir), "-o", str(tmp_path / "file"))
    assert r.returncode in (1, 2) and "is a file" in r.stderr and r.stderr.count("\n") == 1, r.stderr


def test_simulate_run_spellings_and_low_lambda(run_cli, synth: Trace, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """`kairox run --policy` names work here too (tam-t: TAM at a fixed lambda), and a --lambda
    below the default floor lowers the floor instead of failing."""
    out = tmp_path / "sim"
    r = run_cli("simulate", str(synth.dir), "--policy", "tam-t,tam", "--lambda", "0.3", "--preset",
                "pc-low", "--budget", "0.5", "--kind", "active", "-o", str(out))
    assert r.returncode == 0, r.stderr
    rows = {row["policy"]: row for row in csv.DictReader(open(out / "summary.csv"))}
    assert set(rows) == {"tam_fixed", "tam"}
    assert float(rows["tam_fixed"]["lambda"]) == pytest.approx(0.3)
    assert 0.3 - 1e-6 <= float(rows["tam"]["lambda"]) <= 0.95


# ---------------------------------------------------------------------------------------
# the CPU table a trace carries (a workload's, for its shape)
# ---------------------------------------------------------------------------------------
def test_trace_cpu_from_meta(synth: Trace, tmp_path: Path) -> None:
    """A trace without costs["cpu"] gets the built-in table; a workload at a 7B shape gets its
    own, the same table its cpu_perf.csv holds; a malformed one is an error."""
    from click.testing import CliRunner

    from kairox_py.commands.simulate import simulate as simulate_cmd
    from kairox_py.workload import resolve, write_workload

    assert trace_cpu(synth) is DEFAULT_CPU
    wl = write_workload(resolve("relu-7b", n_layer=2, n_seq=1, n_steps=6), tmp_path / "wl")
    cpu = trace_cpu(wl)
    assert cpu.n_ff == 11008 and cpu.threads == 2 and len(cpu.density) == len(cpu.us) >= 2
    csv_cal = calibration_from_csv(wl.dir / "cpu_perf.csv", 4096, 11008, "f16", "f16")
    for rows in (0.05 * 11008, 0.5 * 11008, 11008):
        assert cpu.time_us(rows) == pytest.approx(csv_cal.time_us(rows), rel=1e-3)
    # `kairox simulate` replays it without --cpu-csv
    r = CliRunner().invoke(simulate_cmd, [str(wl.dir), "--preset", "pc-low", "--budget", "0.5",
                                          "--policy", "tam,static"])
    assert r.exit_code == 0, r.output

    meta = json.loads((wl.dir / "meta.json").read_text())
    meta["costs"]["cpu"]["us"] = meta["costs"]["cpu"]["us"][:2]
    (wl.dir / "meta.json").write_text(json.dumps(meta))
    with pytest.raises(KairoxError, match="bad CPU table"):
        trace_cpu(Trace(wl.dir))
    del meta["costs"]["cpu"]["n_ff"]
    (wl.dir / "meta.json").write_text(json.dumps(meta))
    with pytest.raises(KairoxError, match="bad CPU table"):
        trace_cpu(Trace(wl.dir))
