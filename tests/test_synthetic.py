"""Synthetic random-weight models (`kairox bench --synthetic`): the share of neurons the
sparse path computes must be the density asked for, or the speed figures measure something
else (a predictor whose logits were biased once selected almost nothing)."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from kairox_py.benchmark.synthetic import SHAPES, SparseSpec, pred_threshold_for, write_synthetic_llama
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
