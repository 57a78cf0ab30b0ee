"""The sparse FFN on an ungated, parallel-FFN architecture: Falcon (ReluFalcon in the papers).

Falcon's FFN is act(up x) -> down with no gate, and it reads the attention's input norm
(attention and FFN in parallel), so it exercises the other FFN shape of the graph and the
profiler's "attn_norm" capture. No Falcon GGUF can be downloaded here: a small random-weight
one is written with the gguf package (kairox_py.benchmark.synthetic), profiled, converted and run.
Random weights make its text meaningless but its activations ordinary, which is all the
profile -> convert -> sparse decode chain needs.
"""
from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
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
def falcon(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_synthetic_llama(tmp_path_factory.mktemp("falcon") / "falcon.gguf", SHAPE, wtype="f16",
                                 arch="falcon", seed=3)


@pytest.fixture(scope="module")
def falcon_profile(falcon: Path) -> Profile:
    return small_profile(falcon)


@pytest.fixture(scope="module")
def falcon_kx(falcon: Path, falcon_profile: Profile) -> ConvertResult:
    """down_t in f32 (exact): at full activity the sparse path then differs from dense only in
    rounding."""
    return small_convert(falcon, falcon_profile, replace(OPTS, down_type="f32"))


@pytest.fixture(scope="module")
def tokens(falcon: Path) -> list[int]:
    return small_tokens(falcon, "The mills by the river employed half of the town, and the bridges were stone.")


def test_profile_records_falcon_ffn_input_and_hidden(falcon: Path, falcon_profile: Profile) -> None:
    """The recorded input is the FFN's (the attention norm) and the hidden is gelu(up x) of it:
    recomputed from the GGUF weights (an independent check of the C capture)."""
    m = falcon_profile.meta
    assert (m.arch, m.activation, m.n_ff) == ("falcon", "gelu", SHAPE.n_ff)
    inp = open_input(falcon)
    t = inp.tensors["blk.1.ffn_up.weight"]
    wu = dequantize(t.data, t.tensor_type)
    x = np.asarray(falcon_profile.inputs[1, :64], np.float32)
    u = x @ wu.T
    h = 0.5 * u * (1.0 + np.tanh(0.7978845608 * (u + 0.044715 * u ** 3)))
    got = np.asarray(falcon_profile.hidden[1, :64], np.float32)
    assert np.corrcoef(h.ravel(), got.ravel())[0, 1] > 0.999


def test_every_neuron_active_reproduces_dense(falcon: Path, falcon_kx: ConvertResult, tokens: list[int]) -> None:
    dense = all_logits(falcon, tokens, mode="dense")
    sparse = all_logits(falcon_kx.output, tokens, mode="threshold", threshold_scale=1e-30)
    err = float(np.sum((sparse - dense) ** 2) / np.sum(dense ** 2))
    assert err < 1e-5, err
    assert (dense.argmax(-1) == sparse.argmax(-1)).mean() >= 0.95


@pytest.mark.parametrize("mode", ["threshold", "predictor"])
def test_sparse_modes_skip_neurons(falcon: Path, falcon_kx: ConvertResult, tokens: list[int], mode: str) -> None:
    """Calibrated thresholds (50% sparsity): about half the neurons computed, the logits close
    to dense; batched and token-by-token decoding give the same logits."""
    dense = all_logits(falcon, tokens, mode="dense")
    with Model(falcon_kx.output) as m:
        with m.session(ContextParams(n_ctx=256, n_batch=len(tokens), max_sparse_tokens=len(tokens),
                                     n_threads=2, mode=mode, stats=True)) as s:
            batch = s.decode(tokens, all_logits=True)
            assert batch is not None
            active = float(np.mean([st.active_fraction for st in s.layer_stats()]))
        assert 0.2 < active < 0.8, active
        with m.session(ContextParams(n_ctx=256, n_threads=2, mode=mode)) as s:
            one = np.stack([s.decode([t], all_logits=True)[-1] for t in tokens])  # type: ignore[index]
    # each token its own mask: a batch and single tokens differ only in rounding (a batch's
    # attention and matmuls sum in another order, which may flip a neuron at its threshold)
    bt = float(np.sum((one - batch) ** 2) / np.sum(batch ** 2))
    assert bt < 1e-3 and (one.argmax(-1) == batch.argmax(-1)).mean() >= 0.9, bt
    err = float(np.sum((batch - dense) ** 2) / np.sum(dense ** 2))
    assert bt < err < 0.1, (bt, err)  # sparse for real (further from dense than rounding), same model


def test_cats_refused_without_a_gate(falcon: Path, falcon_profile: Profile, falcon_kx: ConvertResult) -> None:
    with pytest.raises(KairoxError, match="needs a gated FFN"):
        convert(falcon, falcon.parent / "cats.gguf", default_corpus("profile"), replace(OPTS, mode="cats"),
                profile_dir=falcon_profile.dir)
    assert not (falcon.parent / "cats.gguf").exists()
    with Model(falcon_kx.output) as m, pytest.raises(KairoxError):
        m.session(ContextParams(n_ctx=64, mode="cats"))


def test_hybrid_runtime_matches_cpu_only(falcon_kx: ConvertResult, tokens: list[int]) -> None:
    """The hybrid runtime (CPU stand-in device) on an ungated FFN: with half of the neuron groups
    cached, greedy decoding sees the CPU-only sparse path's logits (each neuron computed once,
    on one side or the other)."""
    toks = tokens[:24]

    ref, _ = stepwise_logits(falcon_kx.output, toks)
    _, full = stepwise_logits(falcon_kx.output, toks, vram_budget_gib=1.0)
    assert full.n_slots == full.n_groups
    half = (full.dense_bytes + full.cache_bytes / 2) / 2**30
    got, info = stepwise_logits(falcon_kx.output, toks, vram_budget_gib=half)
    assert 0 < info.n_slots < info.n_groups
    assert (ref.argmax(-1) == got.argmax(-1)).all()
    assert float(np.sum((ref - got) ** 2) / np.sum(ref ** 2)) < 1e-4
