"""The sparse FFN on OPT, the ReLU model of DejaVu and PowerInfer: an architecture Kairox adds to
llama.cpp (patches: models/opt.cpp), with biases on every projection.

OPT's FFN is relu(fc1 x + b1) -> fc2 (+ b2): ungated like Falcon's, but with an up bias, which
the sparse paths must add to the selected neurons only (a neuron left out stays exactly 0 through
the ReLU, where relu(b1) would not be), and which the converter permutes with the neurons. No OPT
GGUF can be downloaded here: a small random-weight one is written with the gguf package
(kairox_py.benchmark.synthetic: LayerNorms, learned positions, fc1 biases with a negative mean as trained
OPT models have), profiled, converted and run, on the CPU and in the hybrid runtime.
"""
from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from gguf import GGUFReader
from conftest import SMALL_OPTS as OPTS
from conftest import SMALL_SHAPE as SHAPE
from conftest import all_logits, small_convert, small_profile, small_tokens, stepwise_logits

from kairox_py import ContextParams, KairoxError, Model
from kairox_py.benchmark.synthetic import write_synthetic_llama
from kairox_py.offline.convert import ConvertResult, convert, open_input
from kairox_py.offline.corpus import default_corpus
from kairox_py.offline.profile import Profile
from kairox_py.offline.quant import dequantize


@pytest.fixture(scope="module")
def opt(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_synthetic_llama(tmp_path_factory.mktemp("opt") / "opt.gguf", SHAPE, wtype="f16", arch="opt", seed=5)


@pytest.fixture(scope="module")
def opt_profile(opt: Path) -> Profile:
    return small_profile(opt)


@pytest.fixture(scope="module")
def opt_kx(opt: Path, opt_profile: Profile) -> ConvertResult:
    """down_t in f32 (exact): at full activity the sparse path then differs from dense only in
    rounding."""
    return small_convert(opt, opt_profile, replace(OPTS, down_type="f32"))


@pytest.fixture(scope="module")
def tokens(opt: Path) -> list[int]:
    return small_tokens(opt, "The lighthouse keeper wrote down every ship that passed the cape in winter.")


def _vec(path: Path, name: str) -> np.ndarray:
    t = next(t for t in GGUFReader(path, "r").tensors if t.name == name)
    return np.asarray(t.data).reshape(-1)


def test_profile_records_relu_of_the_biased_up(opt: Path, opt_profile: Profile) -> None:
    """The hidden recorded is relu(up x + b) of the recorded FFN input (the FFN LayerNorm's
    output), recomputed from the GGUF's weights: an independent check of the C capture, the
    bias included, and ReLU's exact zeros."""
    m = opt_profile.meta
    assert (m.arch, m.activation, m.n_ff) == ("opt", "relu", SHAPE.n_ff)
    t = open_input(opt).tensors["blk.2.ffn_up.weight"]
    wu = dequantize(t.data, t.tensor_type)
    b = _vec(opt, "blk.2.ffn_up.bias")
    x = np.asarray(opt_profile.inputs[2, :64], np.float32)
    h = np.maximum(x @ wu.T + b, 0.0)
    got = np.asarray(opt_profile.hidden[2, :64], np.float32)
    assert np.allclose(got, h, rtol=1e-2, atol=1e-2 * float(np.abs(h).max()))
    zeros = float(np.mean(got == 0.0))
    assert 0.3 < zeros < 0.9, zeros  # ReLU: a neuron is off exactly, about half of them here


def test_conversion_permutes_the_up_bias(opt: Path, opt_kx: ConvertResult, tokens: list[int]) -> None:
    """fc1's rows and bias move together: the converted model run dense gives the original's
    logits bit for bit."""
    perm = _vec(opt_kx.output, "blk.1.kx_perm")
    assert not np.array_equal(perm, np.arange(SHAPE.n_ff))  # reordered for real
    assert np.array_equal(_vec(opt_kx.output, "blk.1.ffn_up.bias"), _vec(opt, "blk.1.ffn_up.bias")[perm])
    assert np.array_equal(all_logits(opt_kx.output, tokens, mode="dense"), all_logits(opt, tokens, mode="dense"))


def test_every_neuron_active_reproduces_dense(opt: Path, opt_kx: ConvertResult, tokens: list[int]) -> None:
    """Threshold mode (ReLU: a neuron computed iff > 0, so nothing is lost) and predictor mode
    with every neuron predicted (the bias then added to all of them) reproduce dense."""
    dense = all_logits(opt, tokens, mode="dense")
    for kw in ({"mode": "threshold"}, {"mode": "predictor", "pred_threshold": 1e-6}):
        sparse = all_logits(opt_kx.output, tokens, **kw)
        err = float(np.sum((sparse - dense) ** 2) / np.sum(dense ** 2))
        assert err < 1e-5, (kw, err)
        assert (dense.argmax(-1) == sparse.argmax(-1)).mean() >= 0.95


@pytest.mark.parametrize("mode", ["threshold", "predictor"])
def test_sparse_modes_skip_neurons(opt: Path, opt_kx: ConvertResult, tokens: list[int], mode: str) -> None:
    """Each mode computes a part of the neurons; in predictor mode the down projection computes
    no neuron the predictor left out (were the bias added to those, relu(b) > 0 would turn a
    share of them on: checked with few neurons predicted); batched and token-by-token decoding
    give the same logits."""
    def params(**kw: object) -> ContextParams:
        return ContextParams(n_ctx=256, n_batch=len(tokens), max_sparse_tokens=len(tokens), n_threads=2,
                             mode=mode, stats=True, **kw)  # type: ignore[arg-type]

    with Model(opt_kx.output) as m:
        with m.session(params()) as s:
            batch = s.decode(tokens, all_logits=True)
            assert batch is not None
            stats = s.layer_stats()
        with m.session(ContextParams(n_ctx=256, n_threads=2, mode=mode)) as s:
            one = np.stack([s.decode([t], all_logits=True)[-1] for t in tokens])  # type: ignore[index]
        if mode == "predictor":
            with m.session(params(pred_threshold=0.98)) as s:
                s.decode(tokens)
                few = s.layer_stats()
    active = float(np.mean([st.active_fraction for st in stats]))
    assert 0.1 < active < 0.8, active
    if mode == "predictor":
        for st in stats:
            assert 0 < st.active <= st.predicted < st.pairs, st
        for st in few:
            assert st.active <= st.predicted < 0.3 * st.pairs, st
    bt = float(np.sum((one - batch) ** 2) / np.sum(batch ** 2))
    assert bt < 1e-3 and (one.argmax(-1) == batch.argmax(-1)).mean() >= 0.9, bt


def test_cats_refused(opt: Path, opt_profile: Profile, opt_kx: ConvertResult) -> None:
    with pytest.raises(KairoxError, match="needs a gated FFN"):
        convert(opt, opt.parent / "cats.gguf", default_corpus("profile"), replace(OPTS, mode="cats"),
                profile_dir=opt_profile.dir)
    assert not (opt.parent / "cats.gguf").exists()
    with Model(opt_kx.output) as m, pytest.raises(KairoxError):
        m.session(ContextParams(n_ctx=64, mode="cats"))


@pytest.mark.parametrize("share", [0.5, 1.0])
def test_hybrid_runtime_matches_cpu_only(opt_kx: ConvertResult, tokens: list[int], share: float) -> None:
    """The hybrid runtime (CPU stand-in device) with the up bias split between its halves, each
    adding it to the neurons it computes: with half (or all) of the neuron groups cached, the
    logits of the CPU-only sparse path and the same greedy tokens (each neuron, bias included,
    computed once, on one side or the other)."""
    toks = tokens[:24]

    ref, _ = stepwise_logits(opt_kx.output, toks)
    got, info = stepwise_logits(opt_kx.output, toks, vram_budget_gib=1.0)
    assert info.n_slots == info.n_groups
    if share < 1.0:
        budget = (info.dense_bytes + share * info.cache_bytes) / 2**30
        got, info = stepwise_logits(opt_kx.output, toks, vram_budget_gib=budget)
        assert 0 < info.n_slots < info.n_groups
    assert (ref.argmax(-1) == got.argmax(-1)).all()
    assert float(np.sum((ref - got) ** 2) / np.sum(ref ** 2)) < 1e-4


def _opt_reference(path: Path, toks: list[int]) -> np.ndarray:
    """OPT's forward pass in NumPy from the GGUF's weights (pre-norm layers, learned positions,
    biases, causal multi-head attention, ReLU FFN): what llama.cpp's graph must compute."""
    w = {t.name: t for t in GGUFReader(path, "r").tensors}

    def m(name: str) -> np.ndarray:
        t = w[name]
        return dequantize(t.data, t.tensor_type).astype(np.float64)

    def v(name: str) -> np.ndarray:
        return np.asarray(w[name].data, np.float64).reshape(-1)

    def ln(x: np.ndarray, p: str) -> np.ndarray:
        mu = x.mean(-1, keepdims=True)
        var = ((x - mu) ** 2).mean(-1, keepdims=True)
        return (x - mu) / np.sqrt(var + 1e-5) * v(p + ".weight") + v(p + ".bias")

    n, n_head = len(toks), SHAPE.n_head
    x = m("token_embd.weight")[toks] + m("position_embd.weight")[:n]
    causal = np.triu(np.full((n, n), -np.inf), 1)
    for il in range(SHAPE.n_layer):
        p = f"blk.{il}."
        h = ln(x, p + "attn_norm")
        q, k, vv = (h @ m(p + f"attn_{c}.weight").T + v(p + f"attn_{c}.bias") for c in "qkv")
        d = SHAPE.n_embd // n_head
        heads = []
        for hd in range(n_head):
            sl = slice(hd * d, (hd + 1) * d)
            s = q[:, sl] @ k[:, sl].T / np.sqrt(d) + causal
            a = np.exp(s - s.max(-1, keepdims=True))
            heads.append((a / a.sum(-1, keepdims=True)) @ vv[:, sl])
        x = x + np.concatenate(heads, -1) @ m(p + "attn_output.weight").T + v(p + "attn_output.bias")
        h = ln(x, p + "ffn_norm")
        u = np.maximum(h @ m(p + "ffn_up.weight").T + v(p + "ffn_up.bias"), 0.0)
        x = x + u @ m(p + "ffn_down.weight").T + v(p + "ffn_down.bias")
    return ln(x, "output_norm") @ m("output.weight").T


def test_graph_computes_opt(opt: Path, tokens: list[int]) -> None:
    """llama.cpp's OPT graph (models/opt.cpp) against the NumPy forward pass: the same logits up
    to the F16 rounding of the matmuls' activations."""
    toks = tokens[:16]
    ref = _opt_reference(opt, toks)
    got = all_logits(opt, toks, mode="dense")
    err = float(np.sum((got - ref) ** 2) / np.sum(ref ** 2))
    assert err < 1e-4, err
    assert (got.argmax(-1) == ref.argmax(-1)).mean() >= 0.9
