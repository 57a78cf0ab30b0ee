"""Synthetic activation workloads (`kairox workload`): determinism per seed, measured
statistics against the model's parameters, the published statistics the relu-7b preset
reproduces, the trace format (`kairox simulate` replays a workload), the --compare report and
clear errors for bad input and malformed directories. Small shapes: seconds, no model."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from kairox_py.commands.workload import workload as workload_cmd
from kairox_py.errors import KairoxError
from kairox_py.sim.traces import Trace
from kairox_py.workload.compare import compare
from kairox_py.workload.model import PRESETS, Generator, expected_stats, resolve, zipf_rates
from kairox_py.workload.shapes import SHAPES, cpu_table, model_costs
from kairox_py.workload.stats import measure
from kairox_py.workload.write import open_workload, write_workload

#: a small relu-7b: 4 layers x 2048 neurons, 4 x 256 steps (the default draw)
RELU = {"n_layer": 4, "n_ff": 2048}
SILU = {"n_layer": 4, "n_ff": 1024}


@pytest.fixture(scope="module")
def relu_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("wl") / "relu"
    write_workload(resolve("relu-7b", **RELU), d)
    return d


@pytest.fixture(scope="module")
def silu_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("wl") / "silu"
    write_workload(resolve("silu-7b", **SILU), d)
    return d


def _bits(d: Path) -> tuple[bytes, bytes]:
    return (d / "active.npy").read_bytes(), (d / "predicted.npy").read_bytes()


def run(*args: str) -> tuple[int, str, BaseException | None]:
    """The click command as `kairox workload ARGS` runs it (exit code, output, exception)."""
    r = CliRunner().invoke(workload_cmd, list(args))
    return r.exit_code, r.output, r.exception


# ---------------------------------------------------------------------------------------
# determinism
# ---------------------------------------------------------------------------------------
def test_same_seed_same_bits(relu_dir: Path, tmp_path: Path) -> None:
    again = tmp_path / "again"
    write_workload(resolve("relu-7b", **RELU), again)
    assert _bits(again) == _bits(relu_dir)
    assert np.array_equal(np.load(again / "group_freq.npy"), np.load(relu_dir / "group_freq.npy"))


def test_other_seed_other_bits(relu_dir: Path, tmp_path: Path) -> None:
    other = tmp_path / "other"
    write_workload(resolve("relu-7b", seed=1, **RELU), other)
    a, b = _bits(other), _bits(relu_dir)
    assert a[0] != b[0] and a[1] != b[1]


def test_sequences_are_independent_of_their_count() -> None:
    """Sequence s is the same draw whether the workload has 2 or 3 sequences."""
    g2 = Generator(resolve("relu-7b", n_seq=2, n_steps=8, **RELU))
    g3 = Generator(resolve("relu-7b", n_seq=3, n_steps=8, **RELU))
    for a, b in zip(g2.sequence(1), g3.sequence(1)):
        assert np.array_equal(a.active, b.active) and np.array_equal(a.predicted, b.predicted)


# ---------------------------------------------------------------------------------------
# measured statistics against the parameters
# ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("which", ["relu", "silu"])
def test_measured_statistics_match_the_model(which: str, relu_dir: Path, silu_dir: Path) -> None:
    d = relu_dir if which == "relu" else silu_dir
    trace, params = open_workload(d)
    st = measure(trace)
    exp = json.loads((d / "workload.json").read_text())["expected"]
    assert exp == pytest.approx(expected_stats(Generator(params)), rel=1e-5)
    assert st.active_share == pytest.approx(params.density, rel=0.05)
    assert st.active_share == pytest.approx(exp["active_share"], rel=0.05)
    # frequency skew: the share of neurons carrying 80% of the activations (finite sampling
    # spreads the measured counts a little)
    assert st.hot80_layer == pytest.approx(params.hot80, abs=0.05)
    assert st.hot80_layer == pytest.approx(exp["hot80_layer"], abs=0.04)
    # activation windows (mean run length) of the hot and the cold neurons
    assert st.window_hot == pytest.approx(exp["window_hot"], rel=0.06)
    assert st.window_cold == pytest.approx(exp["window_cold"], rel=0.06)
    assert st.window_hot > st.window_cold  # windows fall with frequency
    # one-hit share: cold activations with no other activation within +-2 steps
    assert st.one_hit_cold == pytest.approx(exp["one_hit_cold"], rel=0.1)
    # the predictor's selection
    assert st.recall == pytest.approx(params.recall, abs=0.01)
    assert st.precision == pytest.approx(params.precision, abs=0.01)


def test_one_hit_and_window_parameters_move_the_statistics(tmp_path: Path) -> None:
    """More one-hit draws: a larger one-hit share and shorter cold windows; longer chain
    windows: longer measured windows."""
    def cold(**kw: float) -> tuple[float, float]:
        d = tmp_path / "w"
        st = measure(write_workload(resolve("relu-7b", n_seq=2, **RELU, **kw), d))
        shutil.rmtree(d)
        return st.one_hit_cold, st.window_cold

    base = cold()
    more_hits = cold(one_hit_cold=0.6)
    longer = cold(window_cold=3.0, window_hot=3.5)
    assert more_hits[0] > base[0] + 0.1 and more_hits[1] < base[1]
    assert longer[1] > base[1] + 0.3


def test_zipf_rates_hit_their_skew() -> None:
    r = zipf_rates(11008, 0.1, 0.4, 0.95)
    assert r.mean() == pytest.approx(0.1, rel=1e-6)
    cum = np.cumsum(r)
    assert (np.searchsorted(cum, 0.8 * cum[-1]) + 1) / len(r) == pytest.approx(0.4, abs=1e-3)
    assert np.all(np.diff(r) <= 1e-12) and r.max() <= 0.95


# ---------------------------------------------------------------------------------------
# what relu-7b reproduces (docs/workloads.md)
# ---------------------------------------------------------------------------------------
def test_relu_preset_reproduces_the_papers(relu_dir: Path) -> None:
    st = measure(Trace(relu_dir))
    # KAIROX Figure 8 / section 6: cold neurons (bottom 70%) reactivate with P < 0.2 for d > 2
    assert np.nanmax(st.react_cold[2:]) < 0.2
    assert st.react_cold[0] > 0.2
    # reactivation falls with the offset and is highest for the hottest neurons
    assert st.react[0, 0] > st.react_cold[0] and st.react[0, 0] > st.react[0, -1]
    # KAIROX Figure 4: cold activity in bursts lasting several steps, near zero between
    b = st.burst
    assert b["cold_lag1"] > 0.5 and b["cold_burst_len"] >= 2.0
    assert b["cold_peak_share"] > 5 * b["cold_floor_share"]
    # PowerInfer Figure 5: the model-wide distribution is more skewed than one layer's
    assert st.hot80_model < st.hot80_layer


def test_full_relu_preset_parameters() -> None:
    """The preset at LLaMA-2-7B shape: its base rates give PowerInfer's per-layer and
    model-wide skew (rates only; the full draw takes half a minute, docs/workloads.md)."""
    p = PRESETS["relu-7b"]
    assert (p.shape.n_layer, p.shape.n_ff) == (32, 11008)
    g = Generator(p)
    assert g.neurons.rate.mean() == pytest.approx(0.10, rel=1e-3)
    tot = g.neurons.rate.reshape(-1)
    cum = np.cumsum(np.sort(tot)[::-1])
    assert (np.searchsorted(cum, 0.8 * cum[-1]) + 1) / len(tot) == pytest.approx(0.26, abs=0.02)


# ---------------------------------------------------------------------------------------
# the trace format: `kairox simulate` reads a workload
# ---------------------------------------------------------------------------------------
def test_workload_is_a_trace(relu_dir: Path) -> None:
    tr = Trace(relu_dir)
    m = tr.meta
    assert tr.kinds() == ["active", "predicted"]
    assert (m.n_layer, m.n_ff, m.n_seq, m.n_steps, m.group_size) == (4, 2048, 4, 256, 32)
    assert tr.group_freq.shape == (4, 2048 // 32)
    # stored as a Kairox GGUF stores neurons: groups sorted by profiled frequency, hot first
    assert np.all(np.diff(tr.group_freq, axis=1) <= 1e-7)
    assert m.costs["row_bytes"] == {"gate": 4096 * 2, "up": 4096 * 2, "down": 4096 * 2}
    assert m.costs["cpu"]["n_ff"] == 2048
    assert np.mean(m.active_density) == pytest.approx(0.1, rel=0.05)


def test_simulate_replays_a_workload(tmp_path: Path) -> None:
    """A workload at the default model's FFN shape runs through `kairox simulate` as it is
    (the built-in CPU table is for that width); 7B shapes with --cpu-csv DIR/cpu_perf.csv."""
    from kairox_py.commands.simulate import simulate

    small = tmp_path / "smol"
    write_workload(resolve("silu-7b", shape="smollm2-135m", n_layer=3, n_seq=1, n_steps=24), small)
    args = ["--preset", "pc-low", "--budget", "0.5", "--policy", "tam,static"]
    r = CliRunner().invoke(simulate, [str(small), *args])
    assert r.exit_code == 0, r.output
    big = tmp_path / "big"
    write_workload(resolve("relu-7b", n_layer=2, n_seq=1, n_steps=16), big)
    r = CliRunner().invoke(simulate, [str(big), *args, "--cpu-csv", str(big / "cpu_perf.csv")])
    assert r.exit_code == 0, r.output


def test_cpu_table_is_the_measured_one_at_7b() -> None:
    tab = cpu_table(SHAPES["llama2-7b"])
    assert tab["n_ff"] == 11008
    assert tab["us"][tab["density"].index(0.5)] == pytest.approx(2 * 1466 + 1552)
    opt = model_costs(SHAPES["opt-6.7b"])
    assert opt["row_bytes"]["gate"] == 0 and opt["cpu"]["n_ff"] == 16384


# ---------------------------------------------------------------------------------------
# the CLI: generation, --compare, bad input
# ---------------------------------------------------------------------------------------
def test_cli_generates_and_measures(tmp_path: Path) -> None:
    out = tmp_path / "w"
    code, output, exc = run("silu-7b", "-o", str(out), "--layers", "2", "--n-ff", "512",
                            "--steps", "32", "--seqs", "2", "--seed", "3",
                            "--set", "window_cold=1.5")
    assert code == 0, (output, exc)
    _, p = open_workload(out)
    assert (p.seed, p.n_steps, p.n_seq, p.shape.n_layer, p.shape.n_ff, p.window_cold) == (3, 32, 2, 2, 512, 1.5)
    assert "active_share" in output and (out / "stats.json").is_file()
    # DIR instead of PRESET measures the workload again
    code, output, exc = run(str(out))
    assert code == 0 and "hot80_layer" in output


def test_cli_compare_writes_the_report(silu_dir: Path, tmp_path: Path) -> None:
    """A preset against a trace directory (here another workload stands in for the trace):
    generated at the trace's shape, report and distances written."""
    rep = tmp_path / "rep"
    code, output, exc = run("relu-7b", "--compare", str(silu_dir), "-o", str(rep), "--steps", "64")
    assert code == 0, (output, exc)
    _, p = open_workload(rep / "workload")
    assert (p.shape.n_layer, p.shape.n_ff, p.n_steps) == (4, 1024, 64)
    for name in ("compare.csv", "compare.md"):
        assert (rep / name).is_file()
    pytest.importorskip("matplotlib")
    for name in ("fig8_compare.png", "fig4_compare.png", "cdf_compare.png"):
        assert (rep / name).stat().st_size > 0


def test_compare_of_a_workload_with_itself_is_zero(silu_dir: Path) -> None:
    st = measure(Trace(silu_dir))
    assert all(r.distance == pytest.approx(0.0, abs=1e-12) for r in compare(st, st)
               if np.isfinite(r.distance))


@pytest.mark.parametrize("args, message", [
    (["gelu-9b", "-o", "X"], "neither a workload preset"),
    (["relu-7b", "-o", "X", "--set", "window_cold=0.5"], "window_cold"),
    (["relu-7b", "-o", "X", "--set", "one_hit_cold=1.5"], "one_hit_cold"),
    (["relu-7b", "-o", "X", "--n-ff", "1001"], "multiple of 8"),
    (["relu-7b", "-o", "X", "--group-size", "3"], "group_size"),
    (["relu-7b", "-o", "X", "--density", "0.99", "--set", "rate_cap=0.5"], "rate_cap"),
    (["relu-7b", "-o", "X", "--density", "0.5"], "does not fit"),
])
def test_bad_parameters_are_clear_errors(args: list[str], message: str, tmp_path: Path) -> None:
    args = [str(tmp_path / a) if a == "X" else a for a in args]
    code, _, exc = run(*args)
    assert code == 1 and isinstance(exc, KairoxError) and message in str(exc)
    assert not (tmp_path / "X").exists()


@pytest.mark.parametrize("args", [["relu-7b", "--density", "2", "-o", "X"],
                                  ["relu-7b", "--set", "nope=1", "-o", "X"],
                                  ["relu-7b", "--set", "window_cold=abc", "-o", "X"],
                                  ["relu-7b"]])
def test_usage_errors(args: list[str]) -> None:
    code, _, _ = run(*args)
    assert code == 2


def _break(d: Path, how: str) -> None:
    if how == "no meta":
        (d / "meta.json").unlink()
    elif how == "bad meta":
        (d / "meta.json").write_text("{not json")
    elif how == "truncated bits":
        b = (d / "active.npy").read_bytes()
        (d / "active.npy").write_bytes(b[: len(b) // 2])
    elif how == "no workload.json":
        (d / "workload.json").unlink()
    elif how == "bad workload.json":
        (d / "workload.json").write_text(json.dumps({"params": {"preset": "relu-7b"}}))
    elif how == "shape mismatch":
        meta = json.loads((d / "meta.json").read_text())
        meta["n_steps"] = 7
        (d / "meta.json").write_text(json.dumps(meta))
    elif how == "group_freq":
        np.save(d / "group_freq.npy", np.zeros((1, 3), dtype=np.float32))


@pytest.mark.parametrize("how", ["no meta", "bad meta", "truncated bits", "no workload.json",
                                 "bad workload.json", "shape mismatch", "group_freq"])
def test_malformed_workload_directory(how: str, tmp_path: Path) -> None:
    d = tmp_path / "w"
    write_workload(resolve("relu-7b", n_layer=2, n_ff=256, n_seq=1, n_steps=8), d)
    _break(d, how)
    with pytest.raises(KairoxError) as e:
        open_workload(d)
    assert str(d) in str(e.value) or "workload" in str(e.value)
    code, output, exc = run(str(d))
    assert code == 1 and isinstance(exc, KairoxError)


def test_refuses_to_replace_a_foreign_directory(tmp_path: Path) -> None:
    d = tmp_path / "docs"
    d.mkdir()
    (d / "notes.txt").write_text("mine")
    with pytest.raises(KairoxError, match="refusing to replace"):
        write_workload(resolve("relu-7b", n_layer=1, n_ff=64, n_seq=1, n_steps=4), d)
    assert (d / "notes.txt").read_text() == "mine"
