"""Hybrid runtime statistics: what the device neuron-group cache did, per layer.

The runtime itself lives in the library (llama-kairox-hybrid.cpp); a Session created with
ContextParams(vram_budget_gib != 0) runs it. These objects are the Python side of
kairox_hybrid_get_info / _get_budget / _get_stats, kept apart from llama.py so that the
table `kairox run --stats` prints and the tests read the same numbers.
"""
from __future__ import annotations

from dataclasses import dataclass

from . import _lib
from .balancer import POLICIES as BALANCER_POLICIES

#: the CLI spellings of the balancer's TAM variants (`--kx-policy` of the llama.cpp tools too)
CLI_NAMES: dict[str, str] = {"tam_fixed": "tam-t", "tam_lambda": "tam-lambda"}

#: CLI/ContextParams policy names -> enum kairox_balancer_policy: the balancer's own table,
#: spelled as `kairox run --policy` names them
POLICIES: dict[str, int] = {CLI_NAMES.get(k, k): v for k, v in BALANCER_POLICIES.items()}

#: ContextParams.vram_budget_gib: size the budget from the device's free memory
VRAM_AUTO: float = _lib.KAIROX_VRAM_BUDGET_AUTO


@dataclass(frozen=True)
class HybridInfo:
    """Placement under the VRAM budget, fixed when the context was created."""

    device: str
    group_size: int
    policy: str
    deterministic: bool
    n_slots: int  # group slots of all layers (the cache's capacity)
    n_groups: int  # groups of all layers
    budget_bytes: int
    dense_bytes: int  # attention, norms, embeddings/output, predictors: placed first
    cache_bytes: int  # the neuron-group cache (slots, index maps, skip masks)

    @classmethod
    def from_c(cls, c: _lib.kairox_hybrid_info) -> HybridInfo:
        policy = next((k for k, v in POLICIES.items() if v == c.policy), str(c.policy))
        return cls(c.device.decode(), c.group_size, policy, bool(c.deterministic), c.n_slots,
                   c.n_groups, c.budget_bytes, c.dense_bytes, c.cache_bytes)


@dataclass(frozen=True)
class HybridBudget:
    """How the budget was sized. An auto budget is the device's free memory minus what the
    context needs there besides the weights (its KV cache, compute buffers) and a reserve;
    the cache's own metadata is charged inside the budget, next to its slots."""

    is_auto: bool
    device_free: int  # 0 unless auto
    device_total: int
    kv_bytes: int
    compute_bytes: int  # an upper estimate: graphs are reserved after the placement
    reserve_bytes: int
    budget_bytes: int

    @property
    def margin_bytes(self) -> int:
        return self.kv_bytes + self.compute_bytes + self.reserve_bytes

    @classmethod
    def from_c(cls, c: _lib.kairox_hybrid_budget) -> HybridBudget:
        return cls(bool(c.is_auto), c.device_free, c.device_total, c.kv_bytes, c.compute_bytes,
                   c.reserve_bytes, c.budget_bytes)


@dataclass(frozen=True)
class HybridLayerStats:
    """One layer's cache since the last reset. Active pairs are (neuron, token) pairs the
    predictor selected; the device half computes those whose group is resident, the CPU the rest."""

    n_groups: int
    n_slots: int
    n_resident: int
    steps: int
    loads: int
    evicts: int
    bytes_reloaded: int
    active: int
    active_dev: int
    dev_computed: int  # pairs the device half's down projection computed
    io_bound_steps: int
    t_io_us: float
    t_cpu_us: float
    lambda_now: float
    margin_now: float  # adaptive TAM's swap margin (0 for other policies)
    steps_ahead: int  # steps planned during the layer before (the live pipeline's head start)
    loads_early: int  # loads that landed in the token whose step queued them
    t_plan_us: float
    t_stall_us: float  # time the plan waited for reloads still copying
    timed_steps: int = 0  # steps whose halves were timed (Session.set_hybrid_timing)
    t_dev_us: float = 0.0  # the device half over those steps
    t_overlap_us: float = 0.0  # time both halves computed at once over those steps, as the clocks prove it
    t_shorter_us: float = 0.0  # the shorter half's time, summed per timed step

    @property
    def hit_rate(self) -> float:
        """Share of predicted-active pairs served from the device cache."""
        return self.active_dev / self.active if self.active else float("nan")

    @property
    def bytes_per_step(self) -> float:
        return self.bytes_reloaded / self.steps if self.steps else 0.0

    @property
    def overlap_share(self) -> float:
        """Share of the shorter half's time that the other half computed alongside (the live
        pipeline's overlap), over the timed steps; the CPU half is the host time of those steps."""
        return self.t_overlap_us / self.t_shorter_us if self.t_shorter_us > 0 else float("nan")

    @classmethod
    def from_c(cls, s: _lib.kairox_hybrid_layer_stats) -> HybridLayerStats:
        return cls(s.n_groups, s.n_slots, s.n_resident, s.n_steps, s.n_loads, s.n_evicts,
                   s.bytes_reloaded, s.n_active, s.n_active_dev, s.n_dev_computed, s.n_io_bound,
                   s.t_io_us, s.t_cpu_us, s.lambda_now, s.margin_now, s.n_ahead, s.n_loads_early,
                   s.t_plan_us, s.t_stall_us, s.n_timed, s.t_dev_us, s.t_overlap_us, s.t_shorter_us)
