"""The quality-budget search of kairox_py/offline/fit.py on made-up perplexity curves (the
fit on a real model is in tests/test_pipeline.py), and convert's automatic down_t type."""
from __future__ import annotations

from kairox_py.offline.fit import FIT_SCALES, search_scale


def _curve(slope: float) -> tuple[list[float], object]:
    calls: list[float] = []

    def increase(scale: float) -> float:
        calls.append(scale)
        return slope * scale

    return calls, increase


def test_walks_up_while_the_budget_holds() -> None:
    calls, f = _curve(0.01)  # 2% at scale 2
    assert search_scale(f, 0.02) == (2.0, True)
    assert calls == [1.0, 1.19, 1.41, 1.68, 2.0, 2.38]  # stops at the first scale over the budget


def test_walks_down_until_the_budget_holds() -> None:
    calls, f = _curve(0.1)  # 3.5% at 0.35
    assert search_scale(f, 0.04) == (0.35, True)
    assert calls == [1.0, 0.84, 0.71, 0.59, 0.5, 0.42, 0.35]


def test_the_top_of_the_ladder_and_no_scale_at_all() -> None:
    _, f = _curve(0.0)
    assert search_scale(f, 0.02) == (FIT_SCALES[-1], True)
    calls, g = _curve(1.0)
    assert search_scale(g, 0.02) == (FIT_SCALES[0], False)
    assert calls == sorted(FIT_SCALES[:FIT_SCALES.index(1.0) + 1], reverse=True)


def test_auto_down_type_follows_the_original_down() -> None:
    """auto: q6_k for 4-6 bit originals whose rows Q6_K can block, q8_0 otherwise; a named type
    is kept."""
    from types import SimpleNamespace

    from gguf import GGMLQuantizationType as T

    from kairox_py.offline.convert import resolve_down_type

    def inp(types: list[T], n_embd: int) -> SimpleNamespace:
        tensors = {f"blk.{i}.ffn_down.weight": SimpleNamespace(tensor_type=t) for i, t in enumerate(types)}
        return SimpleNamespace(n_layer=len(types), n_embd=n_embd, tensors=tensors)

    assert resolve_down_type("auto", inp([T.Q4_K, T.Q6_K], 1536)) == "q6_k"   # Q4_K_M
    assert resolve_down_type("auto", inp([T.Q4_K, T.Q6_K], 896)) == "q8_0"    # 896 % 256 != 0
    assert resolve_down_type("auto", inp([T.Q8_0, T.Q6_K], 1536)) == "q8_0"   # an 8-bit layer
    assert resolve_down_type("auto", inp([T.F16], 4096)) == "q8_0"
    assert resolve_down_type("q4_0", inp([T.F16], 4096)) == "q4_0"
