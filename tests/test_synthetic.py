"""Synthetic random-weight models (`kairox bench --synthetic`): the share of neurons the
sparse path computes must be the density asked for, or the speed figures measure something
else (a predictor whose logits were biased once selected almost nothing)."""
from __future__ import annotations

import csv
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from gguf import GGUFReader

from kairox_py.benchmark.synthetic import SHAPES, SparseSpec, pred_threshold_for, set_group_freq
from kairox_py.benchmark.synthetic import write_original, write_synthetic_llama
from kairox_py.errors import KairoxError
from kairox_py.llama import ContextParams, Model


@pytest.mark.parametrize("spec", [SparseSpec(0), SparseSpec(64, "q4_0"), SparseSpec(64, "q8_0")],
                         ids=["masks", "pred64-q4_0", "pred64-q8_0"])
def test_density_is_what_was_asked(tmp_path: Path, spec: SparseSpec) -> None:
    path = tmp_path / "tiny.gguf"
    write_synthetic_llama(path, SHAPES["tiny"], "q4_0", spec)
    with Model(path) as m:
        for density in (0.1, 0.5):
            with m.session(ContextParams(n_ctx=128, mode="predictor", stats=True,
                                         pred_threshold=pred_threshold_for(density, spec))) as s:
                s.decode(m.tokenize("one two three four"))
                s.reset_stats()
                for t in range(24):
                    s.decode([int(s.logits().argmax()) if t else 5])
                got = float(np.mean([st.active_fraction for st in s.layer_stats()]))
            assert abs(got - density) < 0.25 * density, (spec, density, got)


def test_static_scores_hybrid_equals_cpu(tmp_path: Path) -> None:
    """Fixed selection scores (rank 0, bias only) in hybrid mode: the planner works on a copy of
    the scores, and the split FFN gives the CPU-only path's tokens at any budget."""
    spec = SparseSpec(0)
    path = tmp_path / "tiny-groups.gguf"
    write_synthetic_llama(path, SHAPES["tiny"], "q4_0", spec, group_size=32)
    thr = pred_threshold_for(0.3, spec)

    def greedy(**kw: object) -> tuple[list[int], list[tuple[int, int]]]:
        with Model(path) as m, m.session(ContextParams(n_ctx=128, mode="predictor", pred_threshold=thr,
                                                       deterministic=True, **kw)) as s:  # type: ignore[arg-type]
            s.decode(m.tokenize("one two three four"))
            out = []
            for _ in range(16):
                out.append(int(s.logits().argmax()))
                s.decode([out[-1]])
            split = [(h.active, h.active_dev) for h in s.hybrid_stats()] if kw else []
            return out, split

    cpu, _ = greedy()
    # the dense parts take ~0.7 MiB and the 96 groups ~1.3 MiB: a few slots, half, everything
    for budget in (0.0008, 0.0013, 1.0):
        toks, split = greedy(vram_budget_gib=budget)
        assert toks == cpu, budget
        if budget < 1.0:  # some active neurons on each side of the split
            assert any(0 < dev < act for act, dev in split), split


def test_original_is_the_kairox_file_without_its_data(tmp_path: Path) -> None:
    """The head-to-head's llama.cpp rows run the same weights as Kairox's: every tensor and key
    of the original, byte for byte, and nothing of the Kairox format."""
    kx = write_synthetic_llama(tmp_path / "kx.gguf", SHAPES["tiny"], "q4_0", SparseSpec(0), group_size=32,
                               group_freq=np.full((4, 768 // 32), 0.5, np.float32))
    orig = write_original(kx, tmp_path / "orig.gguf")
    plain = write_synthetic_llama(tmp_path / "plain.gguf", SHAPES["tiny"], "q4_0", None)
    r_kx, r_orig = GGUFReader(kx), GGUFReader(orig)
    names = [t.name for t in r_orig.tensors]
    assert names == [t.name for t in GGUFReader(plain).tensors]
    by_name = {t.name: t for t in r_kx.tensors}
    for t in r_orig.tensors:
        assert t.tensor_type == by_name[t.name].tensor_type
        assert np.array_equal(np.asarray(t.data), np.asarray(by_name[t.name].data)), t.name
    assert not [k for k in r_orig.fields if k.startswith("kairox.")]
    with Model(orig) as m, m.session(ContextParams(n_ctx=64)) as s:  # a plain llama model: loads and decodes
        s.decode(m.tokenize("one two"))
        assert np.isfinite(s.logits()).all()
    with pytest.raises(KairoxError, match="not a synthetic Kairox model"):
        write_original(orig, tmp_path / "again.gguf")
    assert not (tmp_path / "again.gguf").exists()


def test_group_freq_rewritten_in_place(tmp_path: Path) -> None:
    kx = write_synthetic_llama(tmp_path / "kx.gguf", SHAPES["tiny"], "q4_0", SparseSpec(0), group_size=32,
                               group_freq=np.zeros((4, 24), np.float32))
    size = kx.stat().st_size
    freq = np.random.default_rng(1).random((4, 24)).astype(np.float32)
    set_group_freq(kx, freq)
    assert kx.stat().st_size == size
    got = {t.name: np.asarray(t.data).reshape(-1) for t in GGUFReader(kx).tensors if t.name.endswith("kx_group_freq")}
    for i in range(4):
        assert np.array_equal(got[f"blk.{i}.kx_group_freq"], freq[i])
    with pytest.raises(KairoxError):
        set_group_freq(kx, freq[:3])
    with pytest.raises(KairoxError):
        set_group_freq(kx, freq[:, :10])


def test_h2h_script_tiny(tmp_path: Path) -> None:
    """scripts/hybrid_h2h.py end to end at a tiny shape (no GPU here: Kairox rows on the stand-in)."""
    root = Path(__file__).resolve().parent.parent
    p = subprocess.run([sys.executable, str(root / "scripts" / "hybrid_h2h.py"), "--shape", "tiny", "--runs", "1",
                        "--workloads", "fixed,relu-7b", "--steps", "8", "-n", "4", "-t", "2", "--budgets", "0.75",
                        "--policies", "static,tam,tam/sync-copies", "--out", str(tmp_path)], capture_output=True, text=True,
                       timeout=600)
    assert p.returncode == 0, p.stderr[-2000:]
    rows = (tmp_path / "h2h.csv").read_text().splitlines()
    assert rows[0].startswith("workload,budget,engine,config,tok_s")
    got = {(r.split(",")[0], r.split(",")[1], r.split(",")[3]) for r in rows[1:]}
    for w in ("fixed", "relu-7b"):
        assert {(w, "-", "CPU-only sparse"), (w, "75%", "hybrid static"), (w, "75%", "hybrid tam"),
                (w, "75%", "hybrid tam/sync-copies"), (w, "fit", "hybrid tam")} <= got, got
    for r in rows[1:]:
        assert float(r.split(",")[4]) > 0, r
    # a hybrid row at a partial budget keeps the pipeline's columns: the last token's splits and
    # waits (none without a GPU), and the halves' timing, in turn on the stand-in (no overlap)
    for r in csv.DictReader(rows):
        if r["engine"] == "Kairox" and r["budget"] == "75%":
            assert float(r["splits_per_tok"]) >= 1 and float(r["waits_per_tok"]) == 0, r
            assert float(r["dev_us_per_layer"]) > 0 and float(r["overlap_share"]) == 0, r
            assert 0 < float(r["gpu_busy_share"]) < 1, r
    assert (tmp_path / "h2h.md").is_file() and (tmp_path / "h2h.png").is_file()
    # per-token latency of every Kairox row over its 4 decoded tokens
    lat = list(csv.DictReader((tmp_path / "h2h_latency.csv").read_text().splitlines()))
    kairox = [r for r in rows[1:] if r.split(",")[2] == "Kairox"]
    assert len(lat) == 4 * len(kairox) and all(float(r["latency_ms"]) > 0 for r in lat)
    assert (tmp_path / "h2h_latency.png").is_file()
