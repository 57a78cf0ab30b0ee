"""ReLU-fied llamas (ProSparse, Bamboo, ReluLLaMA in the papers): a llama GGUF cannot say
"relu", so the model carries kairox.activation = "relu", which every path honours: the dense
graph (prefill, --dense, the profile) as well as the sparse one. A small random-weight llama
is written with that key (kairox_py.benchmark.synthetic), profiled, converted and run.

ReLU is where activation sparsity is exact: a neuron whose gate is <= 0 contributes nothing,
so the sparse path at threshold 0 skips about half the neurons and still reproduces dense.
"""
from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from conftest import SMALL_OPTS, all_logits, small_convert, small_profile, small_tokens
from conftest import SMALL_SHAPE as SHAPE

from kairox_py import ContextParams, KairoxError, Model
from kairox_py.benchmark.synthetic import write_synthetic_llama
from kairox_py.offline.convert import ConvertResult, convert, open_input
from kairox_py.offline.corpus import default_corpus
from kairox_py.offline.profile import Profile
from kairox_py.offline.quant import dequantize

OPTS = replace(SMALL_OPTS, predictor=False, down_type="f32")


@pytest.fixture(scope="module")
def relu_llama(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_synthetic_llama(tmp_path_factory.mktemp("relu") / "relu.gguf", SHAPE, wtype="f16",
                                 activation="relu", seed=5)


@pytest.fixture(scope="module")
def relu_profile(relu_llama: Path) -> Profile:
    return small_profile(relu_llama)


@pytest.fixture(scope="module")
def relu_kx(relu_llama: Path, relu_profile: Profile) -> ConvertResult:
    return small_convert(relu_llama, relu_profile, OPTS)


@pytest.fixture(scope="module")
def tokens(relu_llama: Path) -> list[int]:
    return small_tokens(relu_llama, "Stones from the river were carried up the hill to build the old bridge.")


def test_dense_path_runs_relu(relu_llama: Path, relu_profile: Profile) -> None:
    """The profile (dense graph) records relu(gate x) * (up x), exact zeros included: SiLU
    would leave none."""
    assert relu_profile.meta.activation == "relu"
    inp = open_input(relu_llama)
    w = {k: dequantize(inp.tensors[f"blk.2.ffn_{k}.weight"].data, inp.tensors[f"blk.2.ffn_{k}.weight"].tensor_type)
         for k in ("gate", "up")}
    x = np.asarray(relu_profile.inputs[2, :64], np.float32)
    ref = np.maximum(x @ w["gate"].T, 0.0) * (x @ w["up"].T)
    got = np.asarray(relu_profile.hidden[2, :64], np.float32)
    assert 0.3 < float(np.mean(got == 0)) < 0.7
    assert np.corrcoef(ref.ravel(), got.ravel())[0, 1] > 0.999
    assert np.all(got[ref == 0] == 0)


@pytest.mark.parametrize("mode", ["threshold", "cats"])
def test_sparse_at_threshold_zero_is_dense(relu_llama: Path, relu_kx: ConvertResult, tokens: list[int],
                                           mode: str) -> None:
    """Thresholds 0 (ReLU): only the neurons with a nonzero activation are computed, about
    half (CATS: gate dense, up and down at the positive gates), and the logits are dense's to
    rounding; the Kairox GGUF's own dense mode (the prefill path) is the original model's."""
    assert np.all(relu_kx.thresholds == 0) and np.all(relu_kx.cats_thresholds == 0)
    dense = all_logits(relu_llama, tokens, mode="dense")
    kx_dense = all_logits(relu_kx.output, tokens, mode="dense")
    with Model(relu_kx.output) as m, m.session(ContextParams(n_ctx=256, n_batch=len(tokens), n_threads=2,
                                                             max_sparse_tokens=len(tokens), mode=mode,
                                                             stats=True)) as s:
        sparse = s.decode(tokens, all_logits=True)
        assert sparse is not None
        st = s.layer_stats()
    active = [x.active_fraction for x in st]
    assert all(0.3 < a < 0.7 for a in active), active
    if mode == "cats":  # up computed only where the gate is positive: the same neurons
        assert all(x.predicted == x.active for x in st)
    for got in (kx_dense, sparse):
        err = float(np.sum((got - dense) ** 2) / np.sum(dense ** 2))
        assert err < 1e-5, err
        assert (got.argmax(-1) == dense.argmax(-1)).mean() >= 0.95


def test_convert_with_activation_override(tmp_path: Path, tokens: list[int]) -> None:
    """A llama GGUF without the key, converted with --activation relu: the profile runs ReLU,
    the output carries kairox.activation = relu, and its sparse decode is the original's dense
    decode run with the override (and not the original's SiLU)."""
    from gguf import GGUFReader

    from kairox_py import format as fmt

    plain = write_synthetic_llama(tmp_path / "plain.gguf", SHAPE, wtype="f16", seed=5)
    res = convert(plain, tmp_path / "plain-kx.gguf", default_corpus("profile"), replace(OPTS, activation="relu"),
                  profile_dir=tmp_path / "profile")
    assert np.all(res.thresholds == 0)
    field = GGUFReader(res.output).get_field(fmt.KEY_ACTIVATION)
    assert field is not None and field.contents() == "relu"
    relu = all_logits(plain, tokens, mode="dense", activation="relu")
    silu = all_logits(plain, tokens, mode="dense")
    sparse = all_logits(res.output, tokens, mode="threshold")
    assert float(np.sum((sparse - relu) ** 2) / np.sum(relu ** 2)) < 1e-5
    assert float(np.sum((silu - relu) ** 2) / np.sum(relu ** 2)) > 1e-3
    with pytest.raises(KairoxError, match="activation"):
        ContextParams(activation="tanh").validate()


@pytest.mark.parametrize("down_type", ["q6_k", "q4_k"])
def test_k_quant_down_t_derived_at_load(relu_llama: Path, relu_profile: Profile, tokens: list[int],
                                        down_type: str) -> None:
    """A K-quant down_t type (written as the converter spells it, lower case) is derived at
    load like the others, bit for bit the converter's own: same sparse logits as the file that
    holds down_t."""
    from kairox_py.offline.convert import convert
    from kairox_py.offline.corpus import default_corpus

    out = {}
    for in_file in (False, True):
        path = relu_llama.parent / f"relu-{down_type}-{int(in_file)}.gguf"
        convert(relu_llama, path, default_corpus("profile"),
                replace(OPTS, down_type=down_type, down_t_in_file=in_file), profile_dir=relu_profile.dir)
        out[in_file] = all_logits(path, tokens, mode="threshold")
    assert np.array_equal(out[False], out[True])
