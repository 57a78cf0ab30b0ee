"""Properties of the C++ online neuron balancer (kairox_balancer_*), on synthetic activations.

Every policy the simulator compares runs through these checks: the resident set never
exceeds the budget, load/evict lists are disjoint and explain the change of the resident
set, static placement never moves anything, TAM never loads a group for one isolated
activation, and the swap margin (tam) or lambda (tam_lambda) follows the bottleneck feedback
within its bounds.
"""
from __future__ import annotations

import numpy as np
import pytest

from kairox_py.balancer import POLICIES, Balancer, BalancerConfig
from kairox_py.errors import KairoxError

N_GROUPS = [48, 17, 64]


def _bursty(rng: np.random.Generator, steps: int, n: int) -> np.ndarray:
    """Intensities with hot groups, bursts and one-off spikes (like real traces)."""
    base = rng.random(n) ** 3
    a = np.zeros((steps, n), dtype=np.float32)
    state = rng.random(n) < base
    for t in range(steps):
        flip = rng.random(n) < 0.15
        state = np.where(flip, rng.random(n) < base, state)
        spikes = rng.random(n) < 0.05
        a[t] = np.where(state | spikes, rng.random(n), 0.0)
    return a


@pytest.mark.parametrize("policy", sorted(POLICIES))
@pytest.mark.parametrize("cap,adapt", [(0, False), (3, False), (0, True)])
def test_budget_and_load_evict_consistency(policy: str, cap: int, adapt: bool) -> None:
    rng = np.random.default_rng(1)
    budget = [0, 7, 64]  # empty, partial, the whole layer
    freq = np.concatenate([rng.random(n) for n in N_GROUPS]).astype(np.float32)
    cfg = BalancerConfig(policy=policy, max_loads=cap, adapt_cap=adapt)
    with Balancer(N_GROUPS, budget, cfg, freq) as bal:
        acts = [_bursty(rng, 120, n) for n in N_GROUPS]
        prev = [bal.resident(il) for il in range(3)]
        for t in range(120):
            for il in range(3):
                bal.feedback(il, int(rng.integers(0, 3)))
                n_load = bal.step(il, acts[il][t])
                res = bal.resident(il)
                loads, evicts = bal.loads(il), bal.evicts(il)
                assert res.sum() <= min(budget[il], N_GROUPS[il])
                assert n_load == len(loads)
                assert not set(loads) & set(evicts)
                assert not prev[il][loads].any() and prev[il][evicts].all()
                expect = prev[il].copy()
                expect[evicts] = False
                expect[loads] = True
                assert (expect == res).all()
                if cap and not adapt:
                    assert len(loads) <= cap
                if policy == "static":
                    assert len(loads) == 0 and len(evicts) == 0
                prev[il] = res


def test_static_placement_is_profiled_top_k_and_never_moves() -> None:
    freq = np.array([0.1, 0.9, 0.5, 0.7, 0.0, 0.3], dtype=np.float32)
    with Balancer([6], [3], BalancerConfig("static"), freq) as bal:
        assert list(np.flatnonzero(bal.resident(0))) == [1, 2, 3]
        rng = np.random.default_rng(0)
        for _ in range(50):
            bal.feedback(0, "cpu")
            assert bal.step(0, rng.random(6).astype(np.float32)) == 0
            assert list(np.flatnonzero(bal.resident(0))) == [1, 2, 3]


@pytest.mark.parametrize("policy", ["tam", "tam_fixed", "tam_lambda"])
@pytest.mark.parametrize("lam", [0.1, 0.5, 0.9])
def test_isolated_activation_never_loads(policy: str, lam: float) -> None:
    n = 32
    freq = np.zeros(n, dtype=np.float32)
    freq[:4] = 1.0  # hot groups 0-3 resident, 28 cold ones
    cfg = BalancerConfig(policy, lambda_init=lam, lambda_min=min(lam, 0.1), lambda_max=max(lam, 0.95),
                         eps=0.01)
    with Balancer([n], [8], cfg, freq) as bal:  # 4 free slots: room is not what stops a load
        spiking = iter(np.random.default_rng(3).permutation(np.arange(4, n)))
        for t in range(200):
            a = np.zeros(n, dtype=np.float32)
            a[:4] = 1.0
            if t % 10 == 5:  # one isolated full-intensity spike, each cold group at most once
                a[int(next(spiking))] = 1.0
            if policy != "tam_fixed":
                bal.feedback(0, ["io", "cpu", "none"][t % 3])
            assert bal.step(0, a) == 0, f"step {t}"
        # a few consecutive full activations do load (the filter is not a wall)
        a = np.zeros(n, dtype=np.float32)
        a[:4], a[20] = 1.0, 1.0
        for _ in range(4):
            bal.step(0, a)
        assert bal.resident(0)[20]


def test_lambda_follows_feedback_within_bounds() -> None:
    cfg = BalancerConfig("tam_lambda", lambda_init=0.5, lambda_min=0.2, lambda_max=0.9, alpha=0.1)
    with Balancer([8, 8], [4, 4], cfg) as bal:
        last = bal.lambdas()
        for _ in range(30):  # I/O-bound: lambda rises to lambda_max and stays there
            bal.feedback(0, "io")
            lam = bal.lambdas()
            assert lam[0] >= last[0] and lam[0] <= 0.9 + 1e-7
            assert lam[1] == pytest.approx(0.5)  # other layers untouched
            last = lam
        assert last[0] == pytest.approx(0.9)
        for _ in range(60):  # CPU-bound: falls to lambda_min
            bal.feedback(0, "cpu")
            lam = bal.lambdas()
            assert lam[0] <= last[0] and lam[0] >= 0.2 - 1e-7
            last = lam
        assert last[0] == pytest.approx(0.2)
        bal.feedback(-1, "io")
        assert bal.lambdas()[1] == pytest.approx(0.55)
        bal.feedback(0, "none")
        assert bal.lambdas()[0] == pytest.approx(0.22)


def test_margin_follows_feedback_within_bounds_and_lambda_stays() -> None:
    cfg = BalancerConfig("tam", lambda_init=0.8, margin_min=0.02, margin_max=0.5, margin_up=1.1, margin_down=0.9)
    with Balancer([8, 8], [4, 4], cfg) as bal:
        assert list(bal.margins()) == [0.0, 0.0]  # no margin until reloads are the bottleneck
        bal.feedback(0, "cpu")
        assert bal.margins()[0] == 0.0
        bal.feedback(0, "io")
        assert bal.margins()[0] == pytest.approx(0.02)  # the first I/O-bound step: margin_min
        last = bal.margins()
        for _ in range(60):  # I/O-bound: the margin grows to margin_max (fewer swaps)
            bal.feedback(0, "io")
            m = bal.margins()
            assert last[0] <= m[0] <= 0.5 + 1e-7
            assert m[1] == 0.0  # other layers untouched
            last = m
        assert last[0] == pytest.approx(0.5)
        bal.feedback(0, "cpu")
        assert bal.margins()[0] == pytest.approx(0.45)
        for _ in range(29):  # CPU-bound: decays towards margin_min (more balancing) ...
            bal.feedback(0, "cpu")
            assert bal.margins()[0] >= 0.02
        for _ in range(3):  # ... and is dropped below it
            bal.feedback(0, "cpu")
        assert bal.margins()[0] == 0.0
        bal.feedback(-1, "io")
        assert list(bal.margins()) == pytest.approx([0.02, 0.02])
        assert list(bal.lambdas()) == pytest.approx([0.8, 0.8])
        bal.reset()
        assert list(bal.margins()) == [0.0, 0.0]


@pytest.mark.parametrize("policy", ["tam_fixed", "tam_lambda", "topk", "lru"])
def test_only_adaptive_tam_has_a_margin(policy: str) -> None:
    with Balancer([8], [4], BalancerConfig(policy)) as bal:
        bal.feedback(0, "io")
        assert bal.margins()[0] == 0.0


def test_fixed_lambda_ignores_feedback() -> None:
    with Balancer([8], [4], BalancerConfig("tam_fixed", lambda_init=0.6)) as bal:
        for fb in ("io", "cpu", "io"):
            bal.feedback(0, fb)
        assert bal.lambdas()[0] == pytest.approx(0.6)


@pytest.mark.parametrize("policy,io,swap_at", [("tam_fixed", True, 0), ("tam", False, 0), ("tam", True, 3)])
def test_margin_keeps_a_resident_against_a_near_equal_candidate(policy: str, io: bool, swap_at: int) -> None:
    """Group 1 overtakes resident group 0 at once; under I/O pressure adaptive TAM's margin
    (0.2 here) makes it lead by more than that first: scores 0.37, 0.433, 0.490 then 0.541
    against group 0's 0.3. Without that pressure there is no margin."""
    freq = np.array([0.3, 0.3], dtype=np.float32)  # a tie: group 0 (lower index) is resident
    cfg = BalancerConfig(policy, lambda_init=0.9, margin_min=0.2, margin_up=1.0)
    with Balancer([2], [1], cfg, freq) as bal:
        if io:
            bal.feedback(0, "io")
        a = np.array([0.3, 1.0], dtype=np.float32)
        for t in range(6):
            bal.step(0, a)
            assert bal.resident(0)[1] == (t >= swap_at), f"step {t}"


def test_cap_admits_best_loads_and_evicts_worst_residents() -> None:
    n = 10
    freq = np.array([0.9, 0.8, 0.7, 0.6, 0, 0, 0, 0, 0, 0], dtype=np.float32)
    cfg = BalancerConfig("topk", max_loads=2)
    with Balancer([n], [4], cfg, freq) as bal:
        a = np.array([0.1, 0.2, 0, 0.3, 0.9, 0.5, 0.8, 0.7, 0, 0], dtype=np.float32)
        assert bal.step(0, a) == 2
        assert list(bal.loads(0)) == [4, 6]  # the two most intense of the four wanted
        assert list(bal.evicts(0)) == [2, 0]  # lowest current score first: 2 (0.0), 0 (0.1)
        assert list(np.flatnonzero(bal.resident(0))) == [1, 3, 4, 6]


def test_adaptive_cap_grows_back_after_falling_low() -> None:
    """The artifact kept an integer cap: int(k * 1.05) == k for k < 20, stuck forever."""
    cfg = BalancerConfig("tam", max_loads=40, adapt_cap=True, alpha=0.05)
    with Balancer([64], [64], cfg) as bal:
        for _ in range(200):
            bal.feedback(0, "io")
        assert bal.load_cap(0) == pytest.approx(1.0)
        for _ in range(100):
            bal.feedback(0, "cpu")
        assert bal.load_cap(0) > 20


def test_loads_are_issued_highest_score_first() -> None:
    rng = np.random.default_rng(5)
    with Balancer([40], [20], BalancerConfig("tam", lambda_init=0.5)) as bal:
        for _ in range(30):
            bal.step(0, rng.random(40).astype(np.float32))
            s = bal.scores(0)
            loads = bal.loads(0)
            assert (np.diff(s[loads]) <= 0).all()
            ev = bal.evicts(0)
            assert (np.diff(s[ev]) >= 0).all()


def test_many_groups_and_determinism() -> None:
    n = 4096  # the artifact's fused kernel asserted n_groups <= 1024
    rng = np.random.default_rng(7)
    acts = _bursty(rng, 40, n)
    runs = []
    for _ in range(2):
        with Balancer([n], [1000], BalancerConfig("tam")) as bal:
            out = []
            for t in range(40):
                bal.feedback(0, t % 3)
                bal.step(0, acts[t])
                out.append(bal.resident(0).copy())
            runs.append(np.array(out))
    assert (runs[0] == runs[1]).all()
    assert runs[0][-1].sum() == 1000


def test_step_all_matches_per_layer_steps() -> None:
    rng = np.random.default_rng(11)
    acts = [_bursty(rng, 30, n) for n in N_GROUPS]
    fbs = rng.integers(0, 3, size=(30, 3)).astype(np.int32)
    budget = [10, 5, 20]
    with Balancer(N_GROUPS, budget, BalancerConfig("tam")) as a, \
            Balancer(N_GROUPS, budget, BalancerConfig("tam")) as b:
        for t in range(30):
            a.step_all(np.concatenate([x[t] for x in acts]), fbs[t])
            for il in range(3):
                b.feedback(il, int(fbs[t, il]))
                b.step(il, acts[il][t])
            assert (a.resident() == b.resident()).all()
            assert np.array_equal(a.lambdas(), b.lambdas())
            assert np.array_equal(a.margins(), b.margins())
        a.reset()
        assert a.lambdas()[0] == pytest.approx(0.9)
        assert a.margins()[0] == 0.0


def test_group_intensity_helper() -> None:
    mask = np.array([1, 0, 1, 1, 0, 0, 0, 0, 1, 1, 1, 1], dtype=np.uint8)
    assert list(Balancer.group_intensity(mask, 4)) == [0.75, 0.0, 1.0]
    with pytest.raises(KairoxError):
        Balancer.group_intensity(mask, 5)


@pytest.mark.parametrize("kwargs,msg", [
    ({"lambda_min": 0.0}, "lambda_min"),
    ({"lambda_init": 0.99, "lambda_max": 0.95}, "lambda"),
    ({"alpha": 1.5}, "alpha"),
    ({"max_loads": -1}, "max_loads"),
    ({"margin_min": 0.0}, "margin"),
    ({"margin_min": 0.5, "margin_max": 0.4}, "margin"),
    ({"margin_up": 0.9}, "margin_up"),
    ({"margin_down": 0.0}, "margin_down"),
])
def test_bad_params_are_reported(kwargs: dict, msg: str) -> None:
    with pytest.raises(KairoxError, match=msg):
        Balancer([8], [4], BalancerConfig("tam", **kwargs))


def test_bad_shapes_are_reported() -> None:
    with pytest.raises(KairoxError, match="policy"):
        Balancer([8], [4], BalancerConfig("fifo"))
    with pytest.raises(KairoxError, match="n_groups"):
        Balancer([0], [0], BalancerConfig("lru"))
    with Balancer([8], [4], BalancerConfig("lru")) as bal:
        with pytest.raises(KairoxError):
            bal.step(0, np.zeros(7, dtype=np.float32))
        with pytest.raises(KairoxError):
            bal.step(1, np.zeros(8, dtype=np.float32))
