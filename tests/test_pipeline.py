"""The offline pipeline on the real default model: profile -> convert -> run.

One small conversion per session (few profile tokens, few epochs, two candidate ranks),
shared by every test here, keeps this file to about a minute or two on 2 cores.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from conftest import PIPELINE_OPTS as OPTS
from conftest import PIPELINE_RECALL as RECALL
from gguf import GGUFReader, GGUFWriter

from kairox_py import ContextParams, KairoxError, Model
from kairox_py import format as fmt
from kairox_py.offline.convert import ConvertResult, convert, summary_rows
from kairox_py.offline.corpus import default_corpus
from kairox_py.offline.evaluate import EvalSetting, evaluate
from kairox_py.offline.profile import Profile

# the session's conversion (fixtures `pipeline_dir`, `profile`, `converted`) lives in conftest.py,
# shared with the sparse-engine tests


@pytest.fixture(scope="session")
def work(pipeline_dir: Path) -> Path:
    return pipeline_dir


# ---- profile -------------------------------------------------------------------------
def test_profile_contents(profile: Profile, model: Model) -> None:
    m = profile.meta
    assert (m.n_layer, m.n_embd, m.n_ff) == (model.n_layer, model.n_embd, model.n_ff)
    assert m.n_tokens == 1024 and m.arch == "llama" and m.activation == "silu"
    assert profile.inputs.dtype == np.float16 and isinstance(profile.inputs, np.memmap)
    assert profile.hidden.shape == (m.n_layer, 1024, m.n_ff)
    thr = profile.thresholds(0.5)
    for layer in (0, m.n_layer - 1):
        assert abs(profile.mask(layer, thr[layer]).mean() - 0.5) < 0.01


def test_profile_matches_the_model(profile: Profile, model: Model) -> None:
    """The captured hidden activation is act(gate)*up of the captured input: recompute
    layer 0's from the GGUF weights (an independent check of the C capture)."""
    from kairox_py.offline.convert import open_input
    from kairox_py.offline.quant import dequantize

    inp = open_input(Path(profile.meta.model_path))
    wg = dequantize(inp.tensors["blk.0.ffn_gate.weight"].data, inp.tensors["blk.0.ffn_gate.weight"].tensor_type)
    wu = dequantize(inp.tensors["blk.0.ffn_up.weight"].data, inp.tensors["blk.0.ffn_up.weight"].tensor_type)
    x = np.asarray(profile.inputs[0, :64], np.float32)
    g = x @ wg.T
    h = g / (1 + np.exp(-g)) * (x @ wu.T)
    got = np.asarray(profile.hidden[0, :64], np.float32)
    assert np.corrcoef(h.ravel(), got.ravel())[0, 1] > 0.99


# ---- conversion ------------------------------------------------------------------------
def test_gguf_reader_round_trip(converted: ConvertResult, model_path: Path) -> None:
    r = GGUFReader(converted.output)
    orig = GGUFReader(model_path)
    n_layer = len(converted.thresholds)
    f = r.get_field
    assert f(fmt.KEY_FORMAT_VERSION).contents() == fmt.FORMAT_VERSION
    assert f(fmt.KEY_MODE).contents() == "threshold"  # PIPELINE_OPTS asks for it
    assert f(fmt.KEY_PRED_DOWN_SCALE).contents() == pytest.approx(0.5)
    assert f(fmt.KEY_GROUP_SIZE).contents() == 64
    assert f(fmt.KEY_PERMUTED).contents() is True
    assert f(fmt.KEY_DOWN_T_TYPE).contents() == "q8_0"
    assert np.allclose(f(fmt.KEY_THRESHOLD).contents(), converted.thresholds)
    assert np.allclose(f(fmt.KEY_CATS_THRESHOLD).contents(), converted.cats_thresholds)
    ranks = f(fmt.KEY_PRED_RANK).contents()
    assert ranks == [p.rank for p in converted.predictors if p is not None]
    # every original key and tensor is still there; ffn_down is untouched
    for k in orig.fields:
        if not k.startswith("GGUF."):
            assert k in r.fields, k
    t_new = {t.name: t for t in r.tensors}
    for t in orig.tensors:
        assert t.name in t_new and t_new[t.name].tensor_type == t.tensor_type
    assert np.array_equal(t_new["blk.3.ffn_down.weight"].data,
                          {t.name: t for t in orig.tensors}["blk.3.ffn_down.weight"].data)
    for il in range(n_layer):
        perm = np.asarray(t_new[fmt.tensor_name(fmt.TENSOR_PERM, il, "")].data)
        inv = np.asarray(t_new[fmt.tensor_name(fmt.TENSOR_PERM_INV, il, "")].data)
        assert sorted(perm.tolist()) == list(range(len(perm)))
        assert (inv[perm] == np.arange(len(perm))).all()
        assert len(t_new[fmt.tensor_name(fmt.TENSOR_GROUP_FREQ, il, "")].data) == len(perm) // 64
        assert fmt.tensor_name(fmt.TENSOR_DOWN_T, il) not in t_new  # derived at load
        assert t_new[fmt.tensor_name(fmt.TENSOR_PRED_UP, il)].tensor_type.name == "Q8_0"  # auto
        assert t_new[fmt.tensor_name(fmt.TENSOR_PRED_UP, il)].data.shape[0] == ranks[il]
        assert t_new[fmt.tensor_name(fmt.TENSOR_PRED_DOWN, il)].data.shape[0] == 1536


@pytest.fixture(scope="module")
def converted_down_t_in_file(pipeline_dir: Path, model_path: Path, profile) -> ConvertResult:  # type: ignore[no-untyped-def]
    """PIPELINE_OPTS with ffn_down_t written into the file (no predictors: not needed here)."""
    from dataclasses import replace

    from conftest import PIPELINE_OPTS

    return convert(model_path, pipeline_dir / "kx-down-t.gguf", default_corpus("profile"),
                   replace(PIPELINE_OPTS, down_t_in_file=True, predictor=False), profile_dir=profile.dir)


def test_down_t_is_the_permuted_transposed_down(converted_down_t_in_file: ConvertResult) -> None:
    from kairox_py.offline.quant import dequantize

    r = {t.name: t for t in GGUFReader(converted_down_t_in_file.output).tensors}
    assert fmt.KEY_DOWN_T_TYPE not in GGUFReader(converted_down_t_in_file.output).fields
    assert r["blk.5.ffn_down_t.weight"].tensor_type.name == "Q8_0"
    down = dequantize(r["blk.5.ffn_down.weight"].data, r["blk.5.ffn_down.weight"].tensor_type)
    dt = dequantize(r["blk.5.ffn_down_t.weight"].data, r["blk.5.ffn_down_t.weight"].tensor_type)
    perm = np.asarray(r["blk.5.kx_perm"].data)
    assert dt.shape == (down.shape[1], down.shape[0])
    assert np.abs(dt - down.T[perm]).max() < 0.02 * np.abs(down).max()


def test_derived_down_t_equals_the_written_one(converted: ConvertResult,
                                               converted_down_t_in_file: ConvertResult) -> None:
    """The loader's ffn_down_t (kairox.down_t_type) is the converter's, bit for bit: the same
    permuted transpose of ffn_down quantized the same way, so threshold mode gives the same
    logits from either file."""
    from conftest import all_logits

    with Model(converted.output, vocab_only=True) as m:
        toks = m.tokenize(default_corpus("eval").text[:600])[:24]
    derived = all_logits(converted.output, toks, mode="threshold")
    written = all_logits(converted_down_t_in_file.output, toks, mode="threshold")
    assert np.array_equal(derived, written)


def test_library_loads_it(converted: ConvertResult) -> None:
    with Model(converted.output) as m:
        assert m.has_sparsity and m.has_predictor
        for mode in ("threshold", "predictor", "cats"):
            with m.session(n_ctx=64, mode=mode) as s:
                assert s.mode == mode
                s.decode(m.tokenize("The quick brown fox"))
        with m.session(n_ctx=64) as s:
            assert s.mode == "threshold"  # kairox.mode, as PIPELINE_OPTS asks


def test_reordering_invariance_dense_logits_identical(converted: ConvertResult,
                                                      model_path: Path) -> None:
    text = default_corpus("eval").text[:1500]
    out = []
    for path in (model_path, converted.output):
        with Model(path) as m, m.session(ContextParams(n_ctx=256, n_batch=256, mode="dense",
                                                      n_threads=2)) as s:
            out.append(s.decode(m.tokenize(text)[:200], all_logits=True))
    assert np.array_equal(out[0], out[1])


def test_predictors_reach_recall_on_held_out_tokens(converted: ConvertResult) -> None:
    preds = [p for p in converted.predictors if p is not None]
    recalls = np.array([p.recall for p in preds])
    assert recalls.mean() >= RECALL - 0.01, recalls
    assert recalls.min() >= RECALL - 0.04, recalls
    assert all(p.precision > p.target_density for p in preds)  # better than chance


def test_predictor_in_the_library_selects_what_numpy_predicts(converted: ConvertResult,
                                                              profile: Profile) -> None:
    """Predicted density in the runtime (layer stats) agrees with the offline one."""
    chunk_text = default_corpus("eval").text[:3000]
    with Model(converted.output) as m, m.session(ContextParams(
            n_ctx=256, n_batch=256, n_ubatch=256, max_sparse_tokens=256, mode="predictor",
            stats=True, n_threads=2)) as s:
        s.decode(m.tokenize(chunk_text)[:256], all_logits=True)
        st = s.layer_stats()
    runtime = np.mean([x.predicted_fraction for x in st])
    offline = np.mean([p.density for p in converted.predictors if p is not None])
    assert abs(runtime - offline) < 0.08, (runtime, offline)


def test_grouping_beats_random(converted: ConvertResult) -> None:
    g = converted.groupings
    assert np.mean([x.intra_kept for x in g]) > np.mean([x.intra_random for x in g])
    for x in g:
        assert (np.diff(x.group_freq) <= 1e-6).all()


def test_profile_is_reused(work: Path, model_path: Path, converted: ConvertResult) -> None:
    """A second conversion reads the first one's profile; without predictors and with the
    default reorder (None) it keeps the original neuron order."""
    res = convert(model_path, work / "kx2.gguf", default_corpus("profile"),
                  replace(OPTS, predictor=False, reorder=None, mode="cats"),
                  profile_dir=converted.profile_dir)
    assert res.profile_reused
    r = GGUFReader(res.output)
    assert r.get_field(fmt.KEY_PRED_RANK).contents() == [0] * len(res.thresholds)
    assert r.get_field(fmt.KEY_PERMUTED).contents() is False
    assert ("neuron order", "original (no predictors: no groups to gather; --reorder forces "
                            "co-activation groups)") in summary_rows(res)
    with Model(res.output) as m:
        assert not m.has_predictor
        chunks = [m.tokenize(default_corpus("eval").text[:2000])[:128]]
    # CATS: gate dense, up and down over the same selected rows
    r, _ = evaluate(EvalSetting(str(res.output), "cats"), chunks, threads=2)
    assert 0.0 < r.active < 1.0
    assert r.ffn_work == pytest.approx((1.0 + 2.0 * r.active) / 3.0)


def test_fit_thresholds_to_a_ppl_budget(work: Path, model_path: Path, converted: ConvertResult) -> None:
    """The fit keeps the largest threshold scale within the budget, writes the thresholds times
    that scale and the skipped share it measured: the written model at scale 1 scores what the
    fit measured at its scale, on the same text. The default texts (documentation, prose,
    source) are each held to the budget: a step's increase is the largest of them."""
    from kairox_py.offline.corpus import fit_corpora

    budget = 0.03
    res = convert(model_path, work / "kx-fit.gguf", default_corpus("profile"),
                  replace(OPTS, predictor=False, mode="threshold", fit_ppl=budget, fit_tokens=256),
                  profile_dir=converted.profile_dir)
    fit = res.fit
    assert fit is not None and fit.mode == "threshold" and fit.tokens > 200
    assert "fit" in res.seconds and "sparsity fit" in dict(summary_rows(res))
    chosen = fit.chosen
    assert len(fit.texts) == 3 and all(len(s.by_text) == 3 for s in fit.steps)
    assert all(s.increase == max(s.by_text) for s in fit.steps)
    text = fit_corpora()[int(np.argmax(chosen.by_text))]  # the text that decided the step
    if fit.met:
        assert chosen.increase <= budget
        over = [s for s in fit.steps if s.scale > fit.scale]
        assert all(s.increase > budget for s in over)  # the next scale up failed, if tried
    r = GGUFReader(res.output)
    written = np.asarray(r.get_field(fmt.KEY_THRESHOLD).contents(), np.float32)
    plain = np.asarray(converted.thresholds, np.float32)  # same profile, same calibration
    assert np.allclose(written, plain * np.float32(fit.scale), rtol=1e-6)
    assert r.get_field(fmt.KEY_SPARSITY).contents() == pytest.approx(1.0 - chosen.active, abs=1e-6)
    with Model(res.output) as m:
        from kairox_py.offline.evaluate import eval_chunks
        from kairox_py.offline.fit import FIT_CTX
        chunks = eval_chunks(m, text, 256, FIT_CTX)
        again, _ = evaluate(EvalSetting(str(res.output), "threshold"), chunks, threads=2, model=m)
    assert again.ppl == pytest.approx(chosen.ppl, rel=1e-4)


def _predictor_stats(path: Path, threshold_scale: float = 1.0) -> tuple[float, float]:
    """(predicted, down-active) fractions of predictor-mode decode over 256 held-out tokens."""
    with Model(path) as m, m.session(ContextParams(
            n_ctx=256, n_batch=256, n_ubatch=256, max_sparse_tokens=256, mode="predictor",
            stats=True, n_threads=2, threshold_scale=threshold_scale)) as s:
        s.decode(m.tokenize(default_corpus("eval").text[:3000])[:256], all_logits=True)
        st = s.layer_stats()
    return (float(np.mean([x.predicted_fraction for x in st])),
            float(np.mean([x.active_fraction for x in st])))


def test_quantized_predictors(work: Path, model_path: Path, converted: ConvertResult) -> None:
    """--pred-type q8_0 stores the predictor matrices as Q8_0 blocks, and the library's
    predicted density still matches the offline one (quantizing them barely moves the logits).
    Written with kairox.predictor.down_scale 1 (the fixture's is 0.5), it also shows that the
    library applies that key: the fixture at threshold_scale 2 keeps the same down rows as
    this model at 1, and more rows at 1."""
    from gguf import GGMLQuantizationType

    res = convert(model_path, work / "kx-q8p.gguf", default_corpus("profile"),
                  replace(OPTS, pred_type="q8_0", reorder=False, pred_down_scale=1.0),
                  profile_dir=converted.profile_dir)
    types = {t.name: t.tensor_type for t in GGUFReader(res.output).tensors}
    for il, p in enumerate(res.predictors):
        if p is not None:
            assert types[fmt.tensor_name(fmt.TENSOR_PRED_UP, il)] == GGMLQuantizationType.Q8_0
            assert types[fmt.tensor_name(fmt.TENSOR_PRED_DOWN, il)] == GGMLQuantizationType.Q8_0
    predicted, down = _predictor_stats(res.output)
    offline = np.mean([p.density for p in res.predictors if p is not None])
    assert abs(predicted - offline) < 0.08, (predicted, offline)
    assert down < predicted
    _, down_half = _predictor_stats(converted.output)
    _, down_half_x2 = _predictor_stats(converted.output, threshold_scale=2.0)
    assert down_half > down + 0.03, (down_half, down)
    assert abs(down_half_x2 - down) < 0.01, (down_half_x2, down)


def test_auto_predictor_type() -> None:
    from kairox_py.offline.convert import pred_layer_type

    assert pred_layer_type("auto", 576, 64) == "q8_0"
    assert pred_layer_type("auto", 576, 40) == "f16"  # W2's rows are rank long
    assert pred_layer_type("auto", 100, 64) == "f16"
    assert pred_layer_type("f32", 576, 64) == "f32"


# ---- bad input ---------------------------------------------------------------------------
def _no_partial(d: Path) -> None:
    leftovers = [p.name for p in d.iterdir() if ".tmp-" in p.name]
    assert not leftovers, leftovers


def test_unsupported_architecture(tmp_path: Path) -> None:
    bad = tmp_path / "gpt2.gguf"
    w = GGUFWriter(bad, "gpt2")
    w.add_block_count(1)
    w.add_tensor("token_embd.weight", np.zeros((4, 8), np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(KairoxError, match="unsupported architecture 'gpt2'"):
        convert(bad, tmp_path / "out.gguf", default_corpus("profile"), OPTS)
    assert not (tmp_path / "out.gguf").exists()


def test_bad_group_size(tmp_path: Path, model_path: Path) -> None:
    with pytest.raises(KairoxError, match="does not divide the FFN width 1536"):
        convert(model_path, tmp_path / "out.gguf", default_corpus("profile"),
                replace(OPTS, group_size=100))
    assert not (tmp_path / "out.gguf").exists()


def test_without_pymetis_converts_with_frequency_grouping(tmp_path: Path, model_path: Path,
                                                          profile: Profile,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """A plain install (no `grouping` extra) converts: every layer keeps the frequency grouping."""
    monkeypatch.setitem(sys.modules, "pymetis", None)  # `import pymetis` raises ImportError
    res = convert(model_path, tmp_path / "out.gguf", default_corpus("profile"),
                  replace(OPTS, predictor=False, reorder=True), profile_dir=profile.dir)
    assert {g.method for g in res.groupings} == {"frequency"}
    assert "pymetis not installed" in dict(summary_rows(res))["grouping"]


def test_missing_output_directory(tmp_path: Path, model_path: Path) -> None:
    with pytest.raises(KairoxError, match="output directory does not exist"):
        convert(model_path, tmp_path / "nope" / "out.gguf", default_corpus("profile"), OPTS)


def test_empty_corpus_cli(run_cli, tmp_path: Path, model_path: Path) -> None:  # type: ignore[no-untyped-def]
    empty = tmp_path / "empty.txt"
    empty.write_text("\n")
    out = tmp_path / "out.gguf"
    proc = run_cli("convert", str(model_path), str(out), "--corpus", str(empty))
    assert proc.returncode == 1
    assert proc.stderr.strip().splitlines()[-1].startswith("error: ")
    assert "empty" in proc.stderr
    assert not out.exists()
    proc = run_cli("profile", str(model_path), "-o", str(tmp_path / "p"), "--corpus", str(empty))
    assert proc.returncode == 1 and "empty" in proc.stderr


def test_cli_errors_are_one_line(run_cli, tmp_path: Path, model_path: Path) -> None:  # type: ignore[no-untyped-def]
    for args, msg in [
        ((str(model_path), str(tmp_path / "x" / "o.gguf")), "output directory does not exist"),
        ((str(model_path), str(tmp_path / "o.gguf"), "--group-size", "100"), "does not divide"),
        ((str(tmp_path / "missing.gguf"), str(tmp_path / "o.gguf")), "not found"),
    ]:
        proc = run_cli("convert", *args)
        assert proc.returncode == 1, proc.stderr
        lines = proc.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: ") and msg in lines[0], lines


def test_interrupted_write_leaves_nothing(tmp_path: Path, model_path: Path, converted: ConvertResult,
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """Ctrl-C in the middle of writing: no OUT, no temporary file."""
    import kairox_py.offline.convert as conv

    calls = {"n": 0}
    real = conv.quantize

    def interrupting(*a, **k):  # type: ignore[no-untyped-def]
        calls["n"] += 1
        if calls["n"] == 3:
            raise KeyboardInterrupt
        return real(*a, **k)

    monkeypatch.setattr(conv, "quantize", interrupting)
    out = tmp_path / "out.gguf"
    with pytest.raises(KeyboardInterrupt):
        convert(model_path, out, default_corpus("profile"), replace(OPTS, predictor=False, down_t_in_file=True),
                profile_dir=converted.profile_dir)
    assert not out.exists()
    _no_partial(tmp_path)


def test_sigint_during_cli_conversion(tmp_path: Path, model_path: Path, converted: ConvertResult) -> None:
    """A real Ctrl-C to `kairox convert`: exit 130, one error line, no partial output."""
    from conftest import PACKAGE_PARENT

    out = tmp_path / "out.gguf"
    env = dict(os.environ, PYTHONPATH=str(PACKAGE_PARENT))
    proc = subprocess.Popen([sys.executable, "-m", "kairox_py.cli", "convert", str(model_path),
                             str(out), "--profile", str(converted.profile_dir),
                             # predictors kept and trained long: the signal lands mid-conversion
                             "--max-pred-density", "1", "--epochs", "100"],
                            cwd=tmp_path, env=env, stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            # a test run started in the background inherits SIGINT ignored,
                            # and Python keeps an ignored SIGINT ignored: restore the default
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    time.sleep(6)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err
    assert err.strip().splitlines()[-1] == "error: interrupted"
    assert not out.exists()
    _no_partial(tmp_path)
