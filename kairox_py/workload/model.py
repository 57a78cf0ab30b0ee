"""The generative model of per-token FFN activation masks, and its presets.

Why a model rather than only recorded traces: the papers' regime (7B ReLU models at ~10%
active) cannot be traced here (no such model runs on this machine), yet the balancer and the
simulator must be exercised there. The model reproduces the statistics the papers publish
(docs/workloads.md lists each number and its source); every parameter is one of those
statistics or a mechanism's knob, and :mod:`.stats` measures them back.

Per layer, each neuron i has

* a **base rate** r_i (share of steps it is active): ranks follow a power law
  r ~ c (rank)^-a, capped at ``rate_cap``, with c set by the layer's density and the
  exponent a solved so that the hottest ``hot80`` share of the neurons carries 80% of the
  layer's activations; layer densities spread log-normally around ``density``
  (``layer_spread``), which makes the model-wide distribution more skewed than one layer's;
  every sequence jitters the rates log-normally (``seq_jitter``: hot sets differ by input);
* an **activation window**: its active steps come in runs (a two-state Markov chain) whose
  mean length falls from ``window_hot`` at the hottest neuron to ``window_cold`` at the edge
  of the cold region (the coldest ``cold_share`` of the neurons) and stays there;
* a **topic**: neurons of similar frequency are cut into topics of ``topic_size``; a topic
  is on or off per context segment, and a neuron starts windows mostly while its topic is on
  (``topic_share_cold`` of a cold neuron's starts, ``topic_share_hot`` of the hottest's);
* **one-hit draws**: ``one_hit_cold`` of a cold neuron's activations are independent single
  steps (none for the hottest neuron, rising across the hot region).

**Semantic drift.** Context segments (geometric, mean ``segment_len`` steps) are shared by
all layers; at each segment a topic is on with probability psi ~ Beta(topic_on * k,
(1 - topic_on) * k), k = ``drift_concentration``: most segments switch few topics on, some
switch on most of them, so the cold neurons' activity jumps between near zero and thousands
per layer, in intervals (KAIROX Figure 4).

**The predictor's selection** has a given ``recall`` and ``precision`` per layer and step.
Its errors follow the model's own firing probability q (the probability of being active at
the step given the topic state and the previous step), mixed with uniform errors by
``error_bias``: misses fall more on surprising activations (low q, one-hits, window starts),
false positives more on likely neurons (high q), as a calibrated predictor's would.

Neurons are stored as a Kairox GGUF stores them: neurons of a topic contiguous, groups of
``group_size`` sorted by their base rate, hot first (``group_freq.npy`` holds those base
rates: the offline profile that static placement uses).
"""
from __future__ import annotations

from collections.abc import Iterator
from dataclasses import asdict, dataclass, field, replace
from typing import Any

import numpy as np

from ..errors import KairoxError
from .shapes import SHAPES, Shape

#: bisection steps of the numeric solvers (to 2^-40 of the bracket)
_BISECT = 40


@dataclass(frozen=True)
class WorkloadParams:
    """Every number the generator uses. Field comments say what it is; docs/workloads.md and
    :data:`SOURCES` say where each preset's value comes from."""

    preset: str
    shape: Shape
    n_seq: int = 4
    n_steps: int = 256
    seed: int = 0
    group_size: int = 32
    density: float = 0.1  # mean share of a layer's neurons active per step
    layer_spread: float = 0.0  # sigma of the per-layer log-density
    hot80: float = 0.4  # share of a layer's neurons carrying 80% of its activations
    rate_cap: float = 0.95  # highest base rate of a neuron
    seq_jitter: float = 0.0  # sigma of a neuron's per-sequence log-rate
    cold_share: float = 0.7  # the coldest share of the neurons: "cold" (KAIROX section 6)
    window_hot: float = 8.0  # mean activation window (steps) of the hottest neuron
    window_cold: float = 1.5  # of the cold neurons
    topic_size: int = 64  # neurons per topic
    topic_mix: float = 1.0  # rank noise when cutting topics, in topic sizes
    topic_on: float = 0.1  # mean share of topics on
    drift_concentration: float = 1.0  # Beta concentration of a segment's topic on-probability
    segment_len: float = 6.0  # mean context segment length (steps)
    topic_share_hot: float = 0.2  # share of the hottest neuron's window starts while its topic
    # is on (at or below topic_on: independent of the topic)
    topic_share_cold: float = 0.9  # of a cold neuron's
    one_hit_cold: float = 0.3  # share of a cold neuron's activations drawn as isolated single steps
    recall: float = 0.95  # predicted among active
    precision: float = 0.6  # active among predicted
    error_bias: float = 0.5  # 0: predictor errors uniform; 1: by the model's firing probability

    def check(self) -> None:
        """KairoxError with the offending value for anything out of range."""
        self.shape.check()

        def need(ok: bool, what: str) -> None:
            if not ok:
                raise KairoxError(f"workload parameter {what}")

        need(self.n_seq >= 1, f"n_seq must be >= 1, not {self.n_seq}")
        need(self.n_steps >= 2, f"n_steps must be >= 2, not {self.n_steps}")
        need(self.group_size >= 1 and self.shape.n_ff % self.group_size == 0,
             f"group_size {self.group_size} must divide the FFN width {self.shape.n_ff}")
        need(0.0 < self.density < 1.0, f"density must be in (0, 1), not {self.density}")
        need(0.0 <= self.layer_spread <= 3.0, f"layer_spread must be in [0, 3], not {self.layer_spread}")
        need(0.0 < self.rate_cap <= 0.999, f"rate_cap must be in (0, 0.999], not {self.rate_cap}")
        need(self.density < self.rate_cap, f"density {self.density} must be below rate_cap {self.rate_cap}")
        need(0.0 < self.hot80 <= 0.8, f"hot80 must be in (0, 0.8], not {self.hot80}")
        need(0.0 <= self.seq_jitter <= 3.0, f"seq_jitter must be in [0, 3], not {self.seq_jitter}")
        need(0.0 < self.cold_share < 1.0, f"cold_share must be in (0, 1), not {self.cold_share}")
        need(1.0 <= self.window_cold <= self.window_hot,
             f"windows must satisfy 1 <= window_cold ({self.window_cold}) <= window_hot ({self.window_hot})")
        need(1 <= self.topic_size <= self.shape.n_ff,
             f"topic_size must be in [1, n_ff], not {self.topic_size}")
        need(self.topic_mix >= 0.0, f"topic_mix must be >= 0, not {self.topic_mix}")
        need(0.0 < self.topic_on < 1.0, f"topic_on must be in (0, 1), not {self.topic_on}")
        need(self.drift_concentration > 0.0,
             f"drift_concentration must be > 0, not {self.drift_concentration}")
        need(self.segment_len >= 1.0, f"segment_len must be >= 1, not {self.segment_len}")
        for name in ("topic_share_hot", "topic_share_cold"):
            v = getattr(self, name)
            need(0.0 <= v < 1.0, f"{name} must be in [0, 1), not {v}")
        need(0.0 <= self.one_hit_cold < 1.0, f"one_hit_cold must be in [0, 1), not {self.one_hit_cold}")
        need(0.0 < self.recall <= 1.0, f"recall must be in (0, 1], not {self.recall}")
        need(0.0 < self.precision <= 1.0, f"precision must be in (0, 1], not {self.precision}")
        need(0.0 <= self.error_bias <= 1.0, f"error_bias must be in [0, 1], not {self.error_bias}")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> WorkloadParams:
        """Inverse of :meth:`to_dict` (KairoxError on a malformed dict)."""
        try:
            shape = Shape(**d["shape"])
            kw = {k: d[k] for k in cls.__dataclass_fields__ if k in d and k != "shape"}
            p = cls(shape=shape, **kw)
        except (KeyError, TypeError) as e:
            raise KairoxError(f"malformed workload parameters: {e}") from None
        p.check()
        return p


# ---------------------------------------------------------------------------------------
# presets
# ---------------------------------------------------------------------------------------
PRESETS: dict[str, WorkloadParams] = {
    "relu-7b": WorkloadParams(
        preset="relu-7b", shape=SHAPES["llama2-7b"], density=0.10, layer_spread=1.2, hot80=0.40,
        rate_cap=0.95, seq_jitter=0.5, cold_share=0.7, window_hot=2.2, window_cold=2.0,
        topic_size=64, topic_mix=1.0, topic_on=0.15, drift_concentration=0.6, segment_len=5.0,
        topic_share_hot=0.15, topic_share_cold=0.75, one_hit_cold=0.25, recall=0.95,
        precision=0.68, error_bias=0.5),
    "silu-7b": WorkloadParams(
        preset="silu-7b", shape=SHAPES["llama2-7b"], density=0.50, layer_spread=0.0, hot80=0.75,
        rate_cap=0.85, seq_jitter=0.15, cold_share=0.7, window_hot=3.45, window_cold=2.05,
        topic_size=64, topic_mix=1.0, topic_on=0.38, drift_concentration=3.8, segment_len=1.5,
        topic_share_hot=0.3, topic_share_cold=0.65, one_hit_cold=0.05, recall=0.97,
        precision=0.54, error_bias=0.5),
}

#: where each preset's numbers come from (docs/workloads.md has the long form)
SOURCES: dict[str, dict[str, str]] = {
    "relu-7b": {
        "shape": "LLaMA-2-7B / ProSparse-LLaMA2-7B: 32 layers, 4096 x 11008 (KAIROX section 3.2); "
                 "--shape opt-6.7b for OPT-6.7B's 16384 neurons",
        "density": "about 10% of a layer's neurons active per token (PowerInfer section 4, footnote 3)",
        "hot80": "26-43% of a layer's neurons carry 80% of its activations (PowerInfer Figure 5a: "
                 "OPT-30B 26%, LLaMA(ReGLU)-70B 43%; DynamicInfer Figure 2a: ReluLLaMA ~40%)",
        "layer_spread": "fitted so that 26% of all the model's neurons carry 80% of its activations "
                        "(PowerInfer Figure 5b, LLaMA(ReGLU)-70B; OPT-30B: 17%)",
        "rate_cap": "the densest layers (~40% active at this spread) need their hottest neurons "
                    "nearly always on to keep hot80 at 0.4",
        "seq_jitter": "fitted to the Jaccard distance 0.53-0.57 between different inputs' hot sets "
                      "(DynamicInfer Figure 2b, ReluLLaMA)",
        "window_cold": "fitted so that cold neurons (bottom 70%) reactivate with P >= 0.2 within two "
                       "steps and P < 0.2 beyond (KAIROX Figure 8, section 6)",
        "window_hot": "reactivation decays more slowly the hotter the neuron (KAIROX section 6); the "
                      "hottest neurons' windows widen further with their rates",
        "topic_on": "cold activations per layer jump from near zero to thousands between adjacent "
                    "tokens, in intervals (KAIROX Figure 4: >3000 of OPT-6.7B's 16384 in layer 0)",
        "topic_share_cold": "as topic_on (KAIROX Figure 4: near-zero cold activity between bursts)",
        "topic_share_hot": "hot neurons fire whatever the context (PowerInfer section 3.1): equal "
                           "to topic_on, no dependence on the topic",
        "drift_concentration": "as topic_on (KAIROX Figure 4)",
        "segment_len": "bursts last intervals of several tokens, not single steps (KAIROX Figure 4)",
        "one_hit_cold": "cold neurons often fire as one-hit wonders (KAIROX section 6); no published "
                        "share: a modelling choice, fitted with window_cold to Figure 8",
        "recall": "predictor recall 90-99% (KAIROX section 9.6, Figure 16)",
        "precision": "PowerInfer sizes predictors to 95% accuracy (section 5.1); at 10% active and "
                     "recall 0.95 that is precision 0.095 / (0.095 + 0.045) = 0.68",
        "error_bias": "a modelling choice (no published figure)",
    },
    "silu-7b": {
        "shape": "LLaMA-2-7B shapes (KAIROX Table 3 runs SiLU LLaMA2-13B and Qwen2-7B)",
        "density": "our threshold mode keeps 50% of each layer's neurons (kairox convert "
                   "--sparsity 0.5), so every layer has the same density (layer_spread 0)",
        "recall": "our default model's trace: recall 97.0% (BENCHMARKS.md, Balancer and simulator)",
        "precision": "the same trace: 51.4% active, 91.8% predicted, recall 97.0% -> precision 0.54",
        "fitted": "hot80, rate_cap, seq_jitter, windows, topics, drift and one-hit share fitted to "
                  "4 x 256-step traces of our three real SiLU models (SmolLM2-135M, "
                  "Qwen2.5-Coder-0.5B and -1.5B, thresholds at 50%), minimising the sum over the "
                  "models of the distances of `kairox workload --compare` with the worst model no "
                  "worse: docs/workloads.md and docs/benchmarks/workload-fit list them side by side",
    },
}


def resolve(preset: str, **overrides: Any) -> WorkloadParams:
    """A preset with some fields replaced; checked. `shape` may be a shape name, and
    n_layer, n_embd, n_ff and weight_type change single dimensions of the shape."""
    if preset not in PRESETS:
        raise KairoxError(f"unknown workload preset '{preset}' (one of {', '.join(PRESETS)})")
    shape = overrides.pop("shape", None)
    p = PRESETS[preset]
    if isinstance(shape, str):
        if shape not in SHAPES:
            raise KairoxError(f"unknown shape '{shape}' (one of {', '.join(SHAPES)})")
        shape = SHAPES[shape]
    dims = {k: overrides.pop(k) for k in ("n_layer", "n_embd", "n_ff", "weight_type")
            if overrides.get(k) is not None}
    overrides = {k: v for k, v in overrides.items() if k not in ("n_layer", "n_embd", "n_ff", "weight_type")}
    shape = shape if shape is not None else p.shape
    if dims:
        shape = replace(shape, name=f"{shape.name}-custom", **dims)
    p = replace(p, shape=shape)
    bad = [k for k in overrides if k not in WorkloadParams.__dataclass_fields__]
    if bad:
        raise KairoxError(f"unknown workload parameter(s): {', '.join(bad)}")
    p = replace(p, **{k: v for k, v in overrides.items() if v is not None})
    p.check()
    return p


# ---------------------------------------------------------------------------------------
# per-neuron structure
# ---------------------------------------------------------------------------------------
def zipf_rates(n: int, density: float, hot80: float, cap: float) -> np.ndarray:
    """Base rates of n neurons, hot first: c * rank^-a capped at `cap`, mean `density`, with
    the exponent a such that the hottest hot80 share carries 80% of the activations."""
    x_log = np.log(np.arange(1, n + 1, dtype=np.float64))

    def rates(a: float) -> np.ndarray:
        x = np.exp(-a * x_log)
        lo, hi = 0.0, cap / x[-1]
        for _ in range(_BISECT):  # mean(min(c x, cap)) is increasing in c
            c = 0.5 * (lo + hi)
            if np.minimum(c * x, cap).mean() < density:
                lo = c
            else:
                hi = c
        return np.minimum(0.5 * (lo + hi) * x, cap)

    def share80(r: np.ndarray) -> float:
        cs = np.cumsum(r)
        return (int(np.searchsorted(cs, 0.8 * cs[-1])) + 1) / n

    lo, hi = 0.0, 8.0  # share80 falls as the exponent grows
    if share80(rates(hi)) > hot80:
        raise KairoxError(f"hot80 {hot80} is too skewed for density {density} and rate_cap {cap}")
    for _ in range(30):
        a = 0.5 * (lo + hi)
        if share80(rates(a)) > hot80:
            lo = a
        else:
            hi = a
    return rates(hi)


def max_density(p: WorkloadParams) -> float:
    """The densest a layer can be: its hottest hot80 share, each neuron at most at the rate
    cap, must hold 80% of its activations (with a margin for the power law's tail)."""
    return 0.9 * p.rate_cap * min(1.0, p.hot80 / 0.8)


def layer_densities(p: WorkloadParams, rng: np.random.Generator) -> np.ndarray:
    """Per-layer densities: log-normal spread, renormalised to mean `density`, none above
    :func:`max_density` (KairoxError when the spread leaves no room for the mean)."""
    L = p.shape.n_layer
    d = np.exp(p.layer_spread * rng.standard_normal(L))
    hi = max_density(p)
    for _ in range(50):
        d = np.minimum(d * p.density / d.mean(), hi)
        if abs(d.mean() - p.density) < 1e-9:
            break
    if abs(d.mean() - p.density) > 1e-3 * p.density:
        raise KairoxError(f"density {p.density} does not fit: with hot80 {p.hot80} and rate_cap "
                          f"{p.rate_cap} a layer holds at most {hi:.3f} (lower layer_spread or "
                          f"density, or raise hot80 or rate_cap)")
    return d


@dataclass
class Neurons:
    """Per-neuron structure of every layer, in stored (Kairox GGUF) order, shape (L, n)."""

    rate: np.ndarray  # base rate
    pct: np.ndarray  # frequency percentile of the base rate, 0 = hottest
    window: np.ndarray  # mean activation window of the chain
    topic_share: np.ndarray  # share of window starts while the topic is on
    one_hit: np.ndarray  # share of activations drawn as isolated single steps
    topic: np.ndarray  # topic index within the layer
    n_topics: int
    density: np.ndarray = field(default_factory=lambda: np.zeros(0))  # per layer

    def group_freq(self, group_size: int) -> np.ndarray:
        L, n = self.rate.shape
        return self.rate.reshape(L, n // group_size, group_size).mean(axis=2).astype(np.float32)


def hot_weight(pct: np.ndarray, cold_share: float) -> np.ndarray:
    """1 at the hottest neuron, falling linearly to 0 at the edge of the cold region."""
    return np.clip(1.0 - pct / (1.0 - cold_share), 0.0, 1.0)


def build_neurons(p: WorkloadParams) -> Neurons:
    """The per-neuron structure of a workload (depends on the seed, not on the sequence)."""
    rng = np.random.default_rng([p.seed, 0])
    L, n = p.shape.n_layer, p.shape.n_ff
    dens = layer_densities(p, rng)
    n_topics = -(-n // p.topic_size)
    rate = np.empty((L, n))
    pct = np.empty((L, n))
    topic = np.empty((L, n), dtype=np.int32)
    base_pct = np.arange(n) / n
    cache: dict[float, np.ndarray] = {}
    for il in range(L):
        key = round(float(dens[il]), 6)
        if key not in cache:
            cache[key] = zipf_rates(n, float(dens[il]), p.hot80, p.rate_cap)
        r_sorted = cache[key]
        # topics: consecutive neurons in a noisy rank order (co-activated neurons have
        # similar frequencies, not equal ones)
        noisy = np.arange(n) + p.topic_mix * p.topic_size * rng.standard_normal(n)
        order = np.argsort(noisy, kind="stable")  # rank of the neuron at each position
        t = np.arange(n) // p.topic_size
        # stored order: groups (contiguous within topics) sorted by base rate, hot first
        r_pos = r_sorted[order]
        g = r_pos.reshape(n // p.group_size, p.group_size).mean(axis=1)
        gorder = np.argsort(-g, kind="stable")
        pos = (gorder[:, None] * p.group_size + np.arange(p.group_size)[None, :]).reshape(-1)
        rate[il] = r_pos[pos]
        pct[il] = base_pct[order][pos]
        topic[il] = t[pos]
    w = hot_weight(pct, p.cold_share)
    window = p.window_cold * (p.window_hot / p.window_cold) ** w
    # a share at or below topic_on means no dependence on the topic (never an aversion to it)
    topic_share = np.maximum(p.topic_share_cold + (p.topic_share_hot - p.topic_share_cold) * w,
                             p.topic_on)
    one_hit = p.one_hit_cold * (1.0 - w)
    return Neurons(rate, pct, window, topic_share, one_hit, topic, n_topics, dens)


def jittered_rates(base: np.ndarray, jitter: np.ndarray, cap: float) -> np.ndarray:
    """A sequence's rates: base (L, n) times jitter, capped, rescaled per layer so that each
    layer keeps its density (the cap would otherwise cut the hot neurons' share)."""
    target = base.mean(axis=1, keepdims=True)
    r = np.minimum(base * jitter, cap)
    for _ in range(8):
        free = r < cap
        have = r.mean(axis=1, keepdims=True)
        room = (r * free).mean(axis=1, keepdims=True)
        scale = 1.0 + (target - have) / np.maximum(room, 1e-12)
        r = np.where(free, np.minimum(r * scale, cap), r)
    return r


# ---------------------------------------------------------------------------------------
# per-sequence chain parameters
# ---------------------------------------------------------------------------------------
@dataclass
class ChainParams:
    """The Markov chain and one-hit draw of every neuron for one sequence (flat, L * n)."""

    beta: np.ndarray  # P(on at t+1 | on at t)
    a_on: np.ndarray  # P(on at t+1 | off at t), topic on
    a_off: np.ndarray  # the same, topic off
    nu: np.ndarray  # one-hit draw probability per step
    rate: np.ndarray  # the sequence's target rate


def chain_params(rate: np.ndarray, window: np.ndarray, topic_share: np.ndarray,
                 one_hit: np.ndarray, topic_on: float, segment_len: float) -> ChainParams:
    """Solve each neuron's chain for its rate: the chain gives (1 - one_hit) of the rate,
    windows of mean length `window` (widened where the rate needs it), starts modulated by
    the topic so that `topic_share` of them fall while the topic is on; the one-hit draws
    give the rest.

    For one neuron the topic is a two-state Markov chain (at each step, with probability
    1 / segment_len, it is redrawn: on with probability topic_on, whatever the segment's
    psi, since psi is independent of the past), so the pair (topic, chain) is a four-state
    Markov chain whose stationary on-probability :func:`_on_share` gives exactly."""
    pc = rate * (1.0 - one_hit)
    nu = rate * one_hit / np.maximum(1.0 - pc, 1e-9)
    w = np.maximum(window, 1.25 * pc / np.maximum(1.0 - pc, 1e-9))
    w = np.maximum(w, 1.0)
    beta = 1.0 - 1.0 / w
    m_on = topic_share / topic_on
    m_off = (1.0 - topic_share) / (1.0 - topic_on)
    lo = np.zeros_like(pc)
    hi = 1.0 / np.maximum(np.minimum(m_on, np.maximum(m_off, 1e-6)), 1e-6)
    for _ in range(_BISECT):  # the on-share grows with alpha
        mid = 0.5 * (lo + hi)
        below = _on_share(np.minimum(mid * m_on, 1.0), np.minimum(mid * m_off, 1.0), beta,
                          topic_on, segment_len) < pc
        lo = np.where(below, mid, lo)
        hi = np.where(below, hi, mid)
    alpha = 0.5 * (lo + hi)
    return ChainParams(beta.astype(np.float32), np.minimum(alpha * m_on, 1.0).astype(np.float32),
                       np.minimum(alpha * m_off, 1.0).astype(np.float32), nu.astype(np.float32),
                       rate)


def _on_share(a1: np.ndarray, a0: np.ndarray, beta: np.ndarray, phi: float, seg: float) -> np.ndarray:
    """Stationary P(chain on) of the joint chain (:func:`_on_joint`)."""
    m0, m1 = _on_joint(a1, a0, beta, phi, seg)
    return m0 + m1


def _topic_matrix(phi: float, seg: float) -> tuple[float, float, float, float]:
    """(t00, t01, t10, t11): one step of a neuron's topic state (0 off, 1 on)."""
    return 1.0 - phi / seg, phi / seg, (1.0 - phi) / seg, 1.0 - (1.0 - phi) / seg


def _on_joint(a1: np.ndarray, a0: np.ndarray, beta: np.ndarray, phi: float,
              seg: float) -> tuple[np.ndarray, np.ndarray]:
    """Stationary (P(topic off, on), P(topic on, on)) of the joint chain: topic z (on -> off
    with probability (1 - phi) / seg per step, off -> on with phi / seg), then the neuron: on
    after on with probability beta, on after off with a1 (topic on at the new step) or a0.

    With m_z = P(topic z, neuron on): m_z' = a_z' q_z' + (beta - a_z') sum_z T(z, z') m_z,
    two linear equations solved in closed form."""
    t00, t01, t10, t11 = _topic_matrix(phi, seg)
    b1, b0 = beta - a1, beta - a0
    det = (1.0 - b1 * t11) * (1.0 - b0 * t00) - b1 * t01 * b0 * t10
    m1 = (a1 * phi * (1.0 - b0 * t00) + b1 * t01 * a0 * (1.0 - phi)) / det
    m0 = ((1.0 - b1 * t11) * a0 * (1.0 - phi) + b0 * t10 * a1 * phi) / det
    return m0, m1


# ---------------------------------------------------------------------------------------
# generation
# ---------------------------------------------------------------------------------------
@dataclass
class Step:
    """One decode step of one sequence: masks of every layer, stored order, (L, n) bool."""

    active: np.ndarray
    predicted: np.ndarray


class Generator:
    """Draws a workload's sequences step by step; the same params (seed included) give the
    same masks bit for bit."""

    def __init__(self, params: WorkloadParams) -> None:
        params.check()
        self.p = params
        self.neurons = build_neurons(params)
        self._seq_seeds = np.random.SeedSequence([params.seed, 1]).spawn(params.n_seq)

    def setup(self, s: int) -> tuple[np.random.Generator, ChainParams]:
        """Sequence s's random generator (after its first draws) and chain parameters: its
        rates are a log-normal jitter of mean 1 around the base rates."""
        if not 0 <= s < self.p.n_seq:
            raise KairoxError(f"sequence {s} out of range (the workload has {self.p.n_seq})")
        p, nr = self.p, self.neurons
        rng = np.random.default_rng(self._seq_seeds[s])
        jit = np.exp(p.seq_jitter * rng.standard_normal(nr.rate.shape) - 0.5 * p.seq_jitter ** 2)
        rate = jittered_rates(nr.rate, jit, p.rate_cap)
        cp = chain_params(rate.reshape(-1), nr.window.reshape(-1), nr.topic_share.reshape(-1),
                          nr.one_hit.reshape(-1), p.topic_on, p.segment_len)
        return rng, cp

    def sequence(self, s: int) -> Iterator[Step]:
        """The steps of sequence s (0 <= s < n_seq), independent of the other sequences."""
        p, nr = self.p, self.neurons
        L, n = nr.rate.shape
        rng, cp = self.setup(s)
        T, K = p.n_steps, nr.n_topics
        # context segments shared by all layers; topics redrawn per segment and layer
        new = rng.random(T) < 1.0 / p.segment_len
        new[0] = True
        seg = np.cumsum(new) - 1
        n_seg = int(seg[-1]) + 1
        k = p.drift_concentration
        psi = rng.beta(p.topic_on * k, (1.0 - p.topic_on) * k, n_seg)
        seg_on = rng.random((n_seg, L * K)) < psi[:, None]
        tix = (np.arange(L)[:, None] * K + nr.topic).reshape(-1)
        # the chain starts from its quasi-stationary state in the first segment's topics
        on0 = seg_on[seg[0]][tix]
        a0 = np.where(on0, cp.a_on, cp.a_off)
        chain = rng.random(L * n, dtype=np.float32) < a0 / (a0 + 1.0 - cp.beta)
        prev = chain.copy()
        debt = np.zeros(L)  # false positives a full step could not take, owed to the next
        for t in range(T):
            on = seg_on[seg[t]][tix]
            a = np.where(on, cp.a_on, cp.a_off)
            u = rng.random(L * n, dtype=np.float32)
            q = np.where(prev, cp.beta, a)  # P(chain on at t | state)
            chain = u < q
            hit = rng.random(L * n, dtype=np.float32) < cp.nu
            act = chain | hit
            q = q + (1.0 - q) * cp.nu
            pred, debt = self._predict(act.reshape(L, n), q.reshape(L, n), rng, debt)
            prev = chain
            yield Step(act.reshape(L, n), pred)

    def _predict(self, act: np.ndarray, q: np.ndarray, rng: np.random.Generator,
                 debt: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The predictor's selection at one step: misses and false positives per layer at the
        parameters' recall and precision (in expectation), weighted by q and error_bias.
        A step with too few inactive neurons for its false positives passes the rest on
        (`debt`, per layer), so that dense workloads keep their precision over a sequence."""
        p = self.p
        mu = p.error_bias
        n_act = act.sum(axis=1, dtype=np.float64)
        keep = act
        if p.recall < 1.0:
            w = (1.0 - mu) + mu * (1.0 - q) / np.maximum(_masked_mean(1.0 - q, act), 1e-9)[:, None]
            pm = _fill(w, act, (1.0 - p.recall) * n_act)
            keep = act & (rng.random(act.shape, dtype=np.float32) >= pm)
        else:
            rng.random(act.shape, dtype=np.float32)  # the same draws whatever the recall
        off = ~act
        target = keep.sum(axis=1, dtype=np.float64) * (1.0 / p.precision - 1.0) + debt
        w = (1.0 - mu) + mu * q / np.maximum(_masked_mean(q, off), 1e-9)[:, None]
        pf = _fill(w, off, target)
        debt = np.maximum(target - pf.sum(axis=1, dtype=np.float64), 0.0)
        return keep | (off & (rng.random(act.shape, dtype=np.float32) < pf)), debt


def _masked_mean(x: np.ndarray, mask: np.ndarray) -> np.ndarray:
    return (x * mask).sum(axis=1) / np.maximum(mask.sum(axis=1), 1)


def _fill(w: np.ndarray, mask: np.ndarray, target: np.ndarray) -> np.ndarray:
    """Per-row probabilities min(1, k w) on `mask` (0 elsewhere) whose row sums are `target`
    (or every masked entry, when the target exceeds them)."""
    wm = np.where(mask, w, 0.0).astype(np.float32)
    k = target / np.maximum(wm.sum(axis=1), 1e-12)
    for _ in range(4):  # entries clipped at 1 give less than k w: raise k on the rest
        pr = np.minimum(wm * k[:, None].astype(np.float32), 1.0)
        got = pr.sum(axis=1)
        short = (target - got) > 1e-3 * np.maximum(target, 1.0)
        if not short.any():
            break
        free = np.where(pr < 1.0, wm, 0.0).sum(axis=1)
        k = np.where(short & (free > 0), k + (target - got) / np.maximum(free, 1e-12), k)
    return np.minimum(wm * k[:, None].astype(np.float32), 1.0)


def _isolated(cp: ChainParams, phi: float, seg: float, horizon: int) -> np.ndarray:
    """P(active at t and at none of t-h..t-1, t+1..t+h) per neuron, stationary: the forward
    algorithm over the joint (topic, chain) states along the pattern, times the one-hit
    draws' part (none of them, or one at t while the chain is off)."""
    t00, t01, t10, t11 = _topic_matrix(phi, seg)
    beta, a1, a0 = (x.astype(np.float64) for x in (cp.beta, cp.a_on, cp.a_off))
    m0, m1 = _on_joint(a1, a0, beta, phi, seg)
    nu = cp.nu.astype(np.float64)

    def move(f0: np.ndarray, f1: np.ndarray, from_on: bool, to_on: bool) -> tuple[np.ndarray, np.ndarray]:
        g0, g1 = f0 * t00 + f1 * t10, f0 * t01 + f1 * t11  # topic step
        if from_on:
            k = beta if to_on else 1.0 - beta
            return g0 * k, g1 * k
        return (g0 * (a0 if to_on else 1.0 - a0), g1 * (a1 if to_on else 1.0 - a1))

    out = np.zeros_like(beta)
    for mid_on in (True, False):
        f0, f1 = (1.0 - phi) - m0, phi - m1  # off at t - h
        for _ in range(horizon - 1):
            f0, f1 = move(f0, f1, False, False)
        f0, f1 = move(f0, f1, False, mid_on)
        f0, f1 = move(f0, f1, mid_on, False)
        for _ in range(horizon - 1):
            f0, f1 = move(f0, f1, False, False)
        path = f0 + f1
        out += path * (1.0 - nu) ** (2 * horizon) * (1.0 if mid_on else nu)
    return out


def expected_stats(gen: Generator, horizon: int = 2) -> dict[str, float]:
    """What :func:`kairox_py.workload.stats.measure` should find in the generator's output,
    from the model's own probabilities (no sampling): active share, hot80 per layer and
    model-wide (of the sequences' summed rates), mean run length of the hot and the cold
    neurons and the cold neurons' one-hit share (stationary chains), recall and precision.
    Cold are the coldest cold_share of each layer by expected frequency, as measured."""
    p = gen.p
    L, n = gen.neurons.rate.shape
    tot = np.zeros((L, n))
    runs = np.zeros((L, n))
    iso = np.zeros((L, n))
    for s in range(p.n_seq):
        _, cp = gen.setup(s)
        r = cp.rate
        pc = r * (1.0 - gen.neurons.one_hit.reshape(-1))
        beta, nu = cp.beta.astype(np.float64), cp.nu.astype(np.float64)
        both = pc * beta + 2.0 * pc * (1.0 - beta) * nu + (1.0 - pc * (2.0 - beta)) * nu ** 2
        tot += r.reshape(L, n)
        runs += (r - both).reshape(L, n)
        iso += _isolated(cp, p.topic_on, p.segment_len, horizon).reshape(L, n)
    order = np.argsort(-tot, axis=1, kind="stable")
    rank = np.empty_like(order)
    np.put_along_axis(rank, order, np.arange(n)[None, :].repeat(L, axis=0), axis=1)
    cold = rank >= int(round((1.0 - p.cold_share) * n))

    def share80(v: np.ndarray) -> float:
        c = np.cumsum(np.sort(v)[::-1])
        return (int(np.searchsorted(c, 0.8 * c[-1])) + 1) / len(v)

    return {"active_share": float(tot.mean() / p.n_seq),
            "hot80_layer": float(np.mean([share80(tot[il]) for il in range(L)])),
            "hot80_model": share80(tot.reshape(-1)),
            "window_hot": float(tot[~cold].sum() / runs[~cold].sum()),
            "window_cold": float(tot[cold].sum() / runs[cold].sum()),
            "one_hit_cold": float(iso[cold].sum() / tot[cold].sum()),
            "recall": p.recall, "precision": p.precision}


__all__ = ["PRESETS", "SOURCES", "ChainParams", "Generator", "Neurons", "Step", "WorkloadParams",
           "build_neurons", "chain_params", "expected_stats", "resolve",
           "zipf_rates"]

