"""kairox calibrate: the per-machine crossover of the sparse down projection, stored in the GGUF
and read by the library; both of the op's paths give the same model output."""
from __future__ import annotations

import shutil
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from gguf import GGUFReader

from kairox_py import ContextParams, KairoxError, Model
from kairox_py import format as fmt
from kairox_py.offline.calibrate import crossover, rewrite_metadata, write_share

TEXT = ("Before the storm reached the harbour, the fishermen pulled their boats onto the sand "
        "and tied the nets to the posts of the old pier, counting every rope twice.")


def _share(path: Path) -> float | None:
    f = GGUFReader(path, "r").get_field(fmt.KEY_DOWN_DENSE_SHARE)
    return None if f is None else float(f.contents())


def test_crossover_line() -> None:
    # the axpy costs 100 at 50% and 300 at 100%: a line of slope 400; dense 200 meets it at 75%
    assert crossover(0.5, 100.0, 1.0, 300.0, 200.0) == pytest.approx(0.75)
    # the axpy beats dense even with every row active: never read the dense layout
    assert crossover(0.5, 50.0, 1.0, 90.0, 100.0) == 1.0
    # dense beats the axpy at the measured share already: the crossover lies below it
    assert crossover(0.5, 150.0, 1.0, 300.0, 100.0) == pytest.approx(1 / 3)
    # clamped to [0, 1]; no slope (noise): a line through the origin
    assert crossover(0.5, 1000.0, 1.0, 1200.0, 10.0) == 0.0
    assert crossover(0.5, 100.0, 0.52, 101.0, 150.0) == 1.0
    assert crossover(0.5, 100.0, 0.52, 130.0, 120.0) == pytest.approx(0.6)


def test_calibrate_writes_the_share(converted, tmp_path: Path, run_cli) -> None:  # type: ignore[no-untyped-def]
    path = tmp_path / "kx.gguf"
    shutil.copyfile(converted.output, path)
    assert _share(path) == -1.0  # kairox convert (the library function) leaves it unmeasured
    size = path.stat().st_size
    r = run_cli("calibrate", str(path), "-t", "2", "-n", "4", "--rounds", "1")
    assert r.returncode == 0, r.stderr
    first = float(r.stdout.strip().splitlines()[-1])
    assert 0.0 <= first <= 1.0
    assert _share(path) == pytest.approx(first, abs=1e-4)  # written in place
    assert path.stat().st_size == size
    assert "ffn_down read in order" in r.stderr
    info = run_cli("info", str(path))
    # the stored value, rounded once as `kairox info` rounds it (stdout's 4 decimals rounded again
    # to 3 can differ: 0.506527 prints 0.5065, which rounds to 0.506, while info shows 0.507)
    assert info.returncode == 0 and f"{_share(path):.3f} (kairox.down_dense_share" in info.stdout, info.stdout
    # a GGUF converted before the key existed: rewritten atomically with it
    rewrite_metadata(GGUFReader(path, "r"), path, [], frozenset({fmt.KEY_DOWN_DENSE_SHARE}))
    assert _share(path) is None
    write_share(path, 0.25)
    assert _share(path) == pytest.approx(0.25)
    assert not list(tmp_path.glob(".*tmp*"))  # no temporary file left behind
    with Model(path) as m:
        assert float(m.metadata[fmt.KEY_DOWN_DENSE_SHARE]) == pytest.approx(0.25)
    r = run_cli("calibrate", str(path), "-t", "2", "-n", "2", "--rounds", "1", "--no-write")
    assert r.returncode == 0, r.stderr
    assert _share(path) == pytest.approx(0.25)


def test_unwritable_model_refused_before_timing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    """A model calibrate cannot write back to fails at once, not after the timing (os.access is
    faked: as root a read-only file stays writable)."""
    import os

    from kairox_py.cli import _run

    path = tmp_path / "kx.gguf"
    path.write_bytes(b"GGUF")
    path.chmod(0o444)
    real = os.access
    monkeypatch.setattr(os, "access", lambda p, mode, *a, **kw: False if Path(p) == path and mode & os.W_OK
                        else real(p, mode, *a, **kw))

    def never(*_a: object, **_kw: object) -> None:
        raise AssertionError("measured before checking that the result can be written")

    monkeypatch.setattr("kairox_py.commands.calibrate.measure", never)
    assert _run(["calibrate", str(path)]) == 1
    err = capsys.readouterr().err
    assert err == f"error: cannot write {path} (permission denied or read-only file system)\n", err
    assert _run(["calibrate", str(path), "--no-write"]) == 1  # nothing to write: straight to timing
    assert "measured before" in capsys.readouterr().err


def test_both_paths_same_output(converted) -> None:  # type: ignore[no-untyped-def]
    """The share only picks how ffn_down is read: reading it in order (share 0) and the axpy
    over down_t's rows (share 2) agree, for single tokens and a batch."""
    out = {}
    with Model(converted.output) as m:
        toks = m.tokenize(TEXT)
        for share in (0.0, 2.0, -1.0):
            with m.session(ContextParams(n_ctx=128, n_threads=2, mode="threshold", max_sparse_tokens=64,
                                         down_dense_share=share)) as s:
                s.decode(toks[:8])
                batch = s.decode(toks[8:14], all_logits=True)
                single = np.stack([(s.decode([t]), s.logits())[1] for t in toks[14:20]])
                assert batch is not None
                out[share] = np.concatenate([batch, single])
    # down_t is quantized on its own (rows = neurons), so the two paths read different
    # roundings of the same matrix, and dense quantizes its activations to 8 bits: they agree
    # in distribution, and on top-1 wherever the reference has a clear winner. The KL moves with
    # the float summation order alone (thresholds flip neurons near them in later layers): 0.018-
    # 0.021 over thread counts and row splits of the axpy, so the bound leaves a 1.5x margin.
    # The same order effects flip top-1 at logit margins up to 0.37 (frequency grouping's neuron
    # order, KL 0.018), so a clear winner leads by 0.5
    for share in (2.0, -1.0):
        a, b = out[0.0], out[share]
        top2 = np.sort(a, axis=-1)[:, -2:]
        clear = (top2[:, 1] - top2[:, 0]) >= 0.5
        assert clear.sum() >= 4
        assert (a.argmax(-1) == b.argmax(-1))[clear].all(), share
        assert _kl(a, b) < 0.03, (share, _kl(a, b))


def _kl(ref: np.ndarray, got: np.ndarray) -> float:
    def log_softmax(x: np.ndarray) -> np.ndarray:
        x = x.astype(np.float64) - x.max(axis=-1, keepdims=True)
        return x - np.log(np.exp(x).sum(axis=-1, keepdims=True))
    lp, lq = log_softmax(ref), log_softmax(got)
    return float((np.exp(lp) * (lp - lq)).sum(axis=-1).mean())


def test_bad_share_rejected(converted, tmp_path: Path, model_path: Path, run_cli) -> None:  # type: ignore[no-untyped-def]
    path = tmp_path / "kx.gguf"
    shutil.copyfile(converted.output, path)
    with pytest.raises(KairoxError, match="finite"):
        write_share(path, -0.5)
    write_share(path, 0.5)
    rw = GGUFReader(path, "r+")  # a corrupt value, as another tool might write it
    f = rw.get_field(fmt.KEY_DOWN_DENSE_SHARE)
    assert f is not None
    f.parts[f.data[0]][0] = float("nan")
    rw.data.flush()
    del rw
    with pytest.raises(KairoxError, match="down_dense_share"):
        Model(path)
    # a GGUF without Kairox data: a clear error, not a rewrite
    r = run_cli("calibrate", str(model_path), "-t", "2", "-n", "2", "--rounds", "1")
    assert r.returncode != 0 and "convert" in r.stderr
    plain = tmp_path / "plain.gguf"
    shutil.copyfile(model_path, plain)
    with pytest.raises(KairoxError, match="not a Kairox GGUF"):
        write_share(plain, 0.5)


def test_model_key_and_context_override(converted, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """The library honours kairox.down_dense_share, and a context's own share overrides it:
    each configuration gives bit-identical logits to the explicit share it resolves to."""
    path = tmp_path / "kx.gguf"
    shutil.copyfile(converted.output, path)
    write_share(path, 0.0)  # the model says: always read ffn_down in order

    def logits(p: Path, share: float) -> np.ndarray:
        with Model(p) as m, m.session(ContextParams(n_ctx=128, n_threads=2, mode="threshold",
                                                    down_dense_share=share)) as s:
            s.decode(m.tokenize(TEXT)[:12])
            return s.logits().copy()

    always, never = logits(converted.output, 0.0), logits(converted.output, 2.0)
    assert not np.array_equal(always, never)  # the two paths are distinguishable
    assert np.array_equal(logits(path, -1.0), always)  # the model's key applies
    assert np.array_equal(logits(path, 2.0), never)  # the context overrides it


def _gate_up_rows(path: Path) -> int | None:
    f = GGUFReader(path, "r").get_field(fmt.KEY_GATE_UP_ROWS)
    return None if f is None else int(f.contents())


def _gate_up_ops(m: Model, rows: int) -> tuple[np.ndarray, set[str]]:
    """Logits of a short text in threshold mode and the ops its decode steps ran."""
    with m.session(ContextParams(n_ctx=128, n_threads=2, mode="threshold", gate_up_rows=rows)) as s:
        toks = m.tokenize(TEXT)
        s.decode(toks[:8])
        s.set_op_timing(True)
        out = [(s.decode([t]), s.logits().copy())[1] for t in toks[8:12]]
        s.set_op_timing(False)
        return np.stack(out), {op for _name, op, _count, _total in s.op_times()}


def test_gate_up_paths_same_output(converted) -> None:  # type: ignore[no-untyped-def]
    """kairox.gate_up_rows only picks which kernels compute threshold mode's whole gate/up: the
    sparse op's rows (1) or ggml's mat-vec (0) run different ops and give the same model output
    (the same dot products over the same 8-bit activations; the GLU is applied alike)."""
    with Model(converted.output) as m:
        rows, rows_ops = _gate_up_ops(m, 1)
        ggml, ggml_ops = _gate_up_ops(m, 0)
        default, _ = _gate_up_ops(m, -1)
    assert "MUL_MAT_SPARSE" in rows_ops  # the default model's Q4_1 gate/up are plain rows
    assert "MUL_MAT_SPARSE" not in ggml_ops and "MUL_MAT" in ggml_ops
    # the kernels sum in different orders, which flips neurons right at a threshold in later
    # layers: the outputs agree in distribution (the same bound as the down's two paths)
    assert _kl(rows, ggml) < 0.03, _kl(rows, ggml)
    assert np.array_equal(default, rows)  # unmeasured (convert's -1): the row kernels
    with pytest.raises(KairoxError, match="gate_up_rows"):
        ContextParams(gate_up_rows=2).validate()


def test_calibrate_measures_gate_up(converted, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """In threshold mode the calibration times the decode graph both ways and stores the
    faster in place; a file without the key gets it by a rewrite; the model then runs it."""
    from kairox_py.offline.calibrate import measure, write_calibration

    path = tmp_path / "kx.gguf"
    shutil.copyfile(converted.output, path)
    assert _gate_up_rows(path) == -1  # kairox convert's placeholder
    cal = measure(path, 2, n_tokens=4, rounds=1, mode="threshold")
    assert cal.rows_us is not None and cal.ggml_us is not None and cal.rows_us > 0 and cal.ggml_us > 0
    assert cal.gate_up_rows == (0 if cal.ggml_us < cal.rows_us else 1)
    size = path.stat().st_size
    write_calibration(path, cal)
    assert path.stat().st_size == size and _gate_up_rows(path) == cal.gate_up_rows
    assert _share(path) == pytest.approx(cal.share)
    # the key as the model states it decides the default path
    with Model(path) as m:
        mine, _ = _gate_up_ops(m, -1)
        explicit, _ = _gate_up_ops(m, cal.gate_up_rows)
    assert np.array_equal(mine, explicit)
    # a GGUF converted before the key existed gets it by an atomic rewrite
    rewrite_metadata(GGUFReader(path, "r"), path, [], frozenset({fmt.KEY_GATE_UP_ROWS}))
    assert _gate_up_rows(path) is None
    flipped = replace(cal, gate_up_rows=1 - cal.gate_up_rows)
    write_calibration(path, flipped)
    assert _gate_up_rows(path) == flipped.gate_up_rows
    assert not list(tmp_path.glob(".*tmp*"))
    # predictor and CATS modes compute gate/up by rows they select: nothing to measure there
    assert replace(cal, rows_us=None, ggml_us=None, gate_up_rows=-1).gate_up_table() == []


def test_busy_machine_times_again_then_refuses(converted, tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:  # type: ignore[no-untyped-def]
    """Each path's fastest round counts; rounds that disagree (another process on the cores)
    are followed by more, and a calibration whose rounds never agree raises rather than store
    a choice made by noise."""
    from kairox_py.offline import calibrate as cal_mod

    calls: list[str] = []

    def scripted(times):  # type: ignore[no-untyped-def]
        def fake(model, params, prompt, tokens):  # type: ignore[no-untyped-def]
            key = ("rows" if params.gate_up_rows == 1 else "ggml" if params.gate_up_rows == 0
                   else "dense" if params.down_dense_share == cal_mod.ALWAYS_DENSE
                   else "full" if params.threshold_scale < 1e-3 else "sparse")
            n = sum(1 for c in calls if c == key)
            calls.append(key)
            t = times(key, n)
            return t, 10 * t, 0.5 if key != "full" else 1.0, {"MUL_MAT_SPARSE", "AXPY_SPARSE"}
        return fake

    base = {"dense": 100.0, "sparse": 80.0, "full": 150.0, "rows": 90.0, "ggml": 100.0}
    # round 2 of every path is twice as slow, rounds 3+ agree with round 1: settled after 3
    monkeypatch.setattr(cal_mod, "_decode_us", scripted(lambda k, n: base[k] * (2.0 if n == 1 else 1.0)))
    cal = cal_mod.measure(converted.output, 2, n_tokens=2, rounds=2, mode="threshold")
    assert cal.rounds == 3
    assert cal.dense_us == 100.0 and cal.sparse_us == 80.0 and cal.rows_us == 900.0 and cal.gate_up_rows == 1
    # rows slower than ggml in every round but the first: the fastest rounds decide, and
    # only agreeing ones count
    calls.clear()
    monkeypatch.setattr(cal_mod, "_decode_us", scripted(
        lambda k, n: base[k] * (1.0 + 0.5 * (n % 2)) if k == "rows" else base[k]))
    cal = cal_mod.measure(converted.output, 2, n_tokens=2, rounds=3, mode="threshold")
    assert cal.rounds == 3 and cal.gate_up_rows == 1
    # never two rounds within 5% of each other: more rounds, up to 3x, then an error
    calls.clear()
    monkeypatch.setattr(cal_mod, "_decode_us", scripted(lambda k, n: base[k] * (1.0 + 0.1 * n)))
    with pytest.raises(KairoxError, match="did not settle in 6 rounds"):
        cal_mod.measure(converted.output, 2, n_tokens=2, rounds=2, mode="threshold")
    assert calls.count("dense") == 6
    # one round asked: taken as measured (nothing to compare it with)
    calls.clear()
    cal = cal_mod.measure(converted.output, 2, n_tokens=2, rounds=1, mode="threshold")
    assert cal.rounds == 1 and calls.count("dense") == 1
