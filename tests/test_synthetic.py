"""Synthetic random-weight models (`kairox bench --synthetic`): the share of neurons the
sparse path computes must be the density asked for, or the speed figures measure something
else (a predictor whose logits were biased once selected almost nothing)."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from kairox_py.llama import ContextParams, Model
from kairox_py.synthetic import SHAPES, SparseSpec, pred_threshold_for, write_synthetic_llama


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
