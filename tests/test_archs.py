"""The gated architectures the converter accepts besides llama: qwen2, qwen3, gemma, gemma2, gemma3.

Each is llama's FFN (act(gate x) * (up x) -> down) inside a different transformer (qwen2: q/k/v
biases; qwen3: q/k norms; gemma: scaled embeddings, a tied output, GELU; gemma2: also
post-attention and post-FFN norms and soft-capping; gemma3: gemma2's norms with q/k norms and
sliding-window attention on most layers). None can be downloaded here: a small
random-weight GGUF of each is written with the gguf package (kairox_py.benchmark.synthetic), profiled,
converted (threshold mode) and run, so that every architecture listed as supported is run
through the whole chain rather than assumed to work.
"""
from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from conftest import SMALL_OPTS as OPTS
from conftest import SMALL_SHAPE as SHAPE
from conftest import all_logits, small_convert, small_profile, small_tokens

from kairox_py import ContextParams, Model
from kairox_py.benchmark.synthetic import SYNTHETIC_ARCHES, write_synthetic_llama
from kairox_py.format import SUPPORTED_ARCHES

ARCHES = ["qwen2", "qwen3", "gemma", "gemma2", "gemma3"]


def test_every_supported_arch_has_a_synthetic_model() -> None:
    """So that each one the converter accepts is run by a test (llama, falcon, opt have theirs)."""
    assert set(SUPPORTED_ARCHES) <= set(SYNTHETIC_ARCHES)
    assert set(SUPPORTED_ARCHES) - {"llama", "falcon", "opt"} == set(ARCHES)


@pytest.mark.parametrize("arch", ARCHES)
def test_arch_through_the_chain(tmp_path: Path, arch: str) -> None:
    src = write_synthetic_llama(tmp_path / f"{arch}.gguf", SHAPE, wtype="f16", arch=arch, seed=9)
    prof = small_profile(src)
    assert (prof.meta.arch, prof.meta.activation) == (arch, SUPPORTED_ARCHES[arch])
    kx = small_convert(src, prof, replace(OPTS, down_type="f32")).output
    toks = small_tokens(src, "Rain fell on the tin roofs of the market all afternoon, and nobody left.")
    dense = all_logits(src, toks, mode="dense")
    # the converted model run dense: the original's logits bit for bit (rows permuted, ffn_down not)
    assert np.array_equal(all_logits(kx, toks, mode="dense"), dense)
    # every neuron computed: dense's logits up to rounding
    full = all_logits(kx, toks, mode="threshold", threshold_scale=1e-30)
    assert float(np.sum((full - dense) ** 2) / np.sum(dense ** 2)) < 1e-5
    # the calibrated thresholds (50% sparsity): about half the neurons; each token its own mask
    with Model(kx) as m:
        with m.session(ContextParams(n_ctx=256, n_batch=len(toks), max_sparse_tokens=len(toks), n_threads=2,
                                     mode="threshold", stats=True)) as s:
            batch = s.decode(toks, all_logits=True)
            assert batch is not None
            active = float(np.mean([st.active_fraction for st in s.layer_stats()]))
        with m.session(ContextParams(n_ctx=256, n_threads=2, mode="threshold")) as s:
            one = np.stack([s.decode([t], all_logits=True)[-1] for t in toks])  # type: ignore[index]
    assert 0.3 < active < 0.7, active
    bt = float(np.sum((one - batch) ** 2) / np.sum(batch ** 2))
    err = float(np.sum((batch - dense) ** 2) / np.sum(dense ** 2))
    assert bt < 1e-3 and (one.argmax(-1) == batch.argmax(-1)).mean() >= 0.9, bt
    assert bt < err < 0.1, (bt, err)
