"""Weight layouts of a Kairox GGUF on the CPU.

The loader keeps ffn_gate/ffn_up in plain rows only where the model's own mode reads them by
rows (predictor: both; CATS: up), or where the sparse row kernels read the type faster than its
repacked layout on this CPU; otherwise they take the layout the CPU backend reads fastest
(ggml's repacked interleaved rows, for Q4_0 and other types), as in the original model, so that
threshold mode, prefill and the dense fallback run upstream's kernels on them. A mode that
selects rows of a repacked matrix computes it whole and masks the result: the same answer, at
dense speed. These tests run a synthetic Q4_0 model (Q4_0 repacks on x86 with AVX2) under each
of those placements and compare the logits.
"""
from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
from gguf import GGUFReader, GGUFValueType

from kairox_py import _lib
from kairox_py import format as fmt
from kairox_py.benchmark.synthetic import SHAPES, SparseSpec, pred_threshold_for, write_synthetic_llama
from kairox_py.llama import ContextParams, Model
from kairox_py.offline.convert import rewrite_metadata

TOKENS = [5, 17, 42, 99, 3, 250, 7, 64, 12, 300, 8, 1]
GGML_TYPE_Q4_0 = 2


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The same weights declaring predictor mode (plain gate/up) and threshold mode (repacked)."""
    d = tmp_path_factory.mktemp("layouts")
    pred = write_synthetic_llama(d / "pred.gguf", SHAPES["tiny"], "q4_0", SparseSpec(64, "q4_0"))
    thr = d / "thr.gguf"
    shutil.copyfile(pred, thr)
    rewrite_metadata(GGUFReader(thr), thr, [(fmt.KEY_MODE, "threshold", GGUFValueType.STRING, None)],
                     frozenset({fmt.KEY_MODE}))
    return {"predictor": pred, "threshold": thr}


def run(path: Path, ffn_rows: bool = False, **kw: object) -> tuple[np.ndarray, set[tuple[str, str]]]:
    """Logits of every token of one predictor-mode decode call, and the (node, op) pairs it ran."""
    thr = pred_threshold_for(0.3, SparseSpec(64, "q4_0"))
    with Model(path, ffn_rows=ffn_rows) as m, m.session(ContextParams(
            n_ctx=64, n_batch=len(TOKENS), max_sparse_tokens=len(TOKENS), n_threads=2, mode="predictor",
            pred_threshold=thr, **kw)) as s:  # type: ignore[arg-type]
        s.set_op_timing(True)
        out = s.decode(TOKENS, all_logits=True)
        assert out is not None
        return out, {(name, op) for name, op, _, _ in s.op_times()}


def test_own_mode_reads_rows(models: dict[str, Path]) -> None:
    """Predictor mode on a model whose own mode is predictor: the sparse op over plain rows."""
    _, ops = run(models["predictor"])
    assert ("ffn_swiglu", "MUL_MAT_SPARSE") in ops
    assert not any(name in ("ffn_gate", "ffn_up") and op == "MUL_MAT" for name, op in ops)


def test_repacked_rows_give_the_same_answer(models: dict[str, Path]) -> None:
    """The threshold-mode file repacks gate/up: predictor mode then multiplies them whole and
    masks the result, and agrees with the sparse op over plain rows (different kernels, so not
    bit for bit); with ffn_rows the same file keeps plain rows and gives identical logits."""
    ref, _ = run(models["predictor"])
    packed, ops = run(models["threshold"])
    if _lib.ggml_backend_cpu_kairox_rows_faster(GGML_TYPE_Q4_0):
        # on this CPU the row kernels read Q4_0 faster than its repacked layout: the loader keeps
        # plain rows in every mode, and the threshold-mode file runs predictor mode sparse
        assert ("ffn_swiglu", "MUL_MAT_SPARSE") in ops
        assert np.array_equal(packed, ref)
    else:
        assert ("ffn_gate", "MUL_MAT") in ops and ("ffn_up", "MUL_MAT") in ops
        assert not any(op == "MUL_MAT_SPARSE" and name == "ffn_swiglu" for name, op in ops)
        assert np.array_equal(packed.argmax(axis=1), ref.argmax(axis=1))
        assert np.max(np.abs(packed - ref)) <= 0.02 * np.max(np.abs(ref))

    plain, ops = run(models["threshold"], ffn_rows=True)
    assert ("ffn_swiglu", "MUL_MAT_SPARSE") in ops
    assert np.array_equal(plain, ref)


def test_dense_mode_is_unchanged_by_layout(models: dict[str, Path]) -> None:
    """Dense mode reads gate/up through ggml's MUL_MAT in either layout."""
    with Model(models["threshold"]) as m, m.session(ContextParams(n_ctx=64, n_threads=2, mode="dense")) as s:
        a = s.decode(TOKENS, all_logits=True)
    with Model(models["predictor"]) as m, m.session(ContextParams(n_ctx=64, n_threads=2, mode="dense")) as s:
        b = s.decode(TOKENS, all_logits=True)
    assert a is not None and b is not None
    assert np.array_equal(a.argmax(axis=1), b.argmax(axis=1))
