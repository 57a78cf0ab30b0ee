"""The online neuron balancer (C++, ``kairox_balancer_*`` in kairox.h) as a Python object.

Why a binding and not a Python re-implementation: the simulator must replay traces through
exactly the code the hybrid runtime will run, so every policy (TAM with adaptive decay and
the baselines) lives in libkairox and this module only marshals arrays. The hot calls
(:meth:`Balancer.step_all`, :meth:`Balancer.resident_into`) reuse caller-owned NumPy buffers
so that a simulation of millions of layer-steps does not allocate per step.
"""
from __future__ import annotations

import ctypes
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from . import _lib
from .errors import KairoxError

#: policy names (CLI and reports) -> enum kairox_balancer_policy
POLICIES: dict[str, int] = {
    "static": _lib.KAIROX_BALANCER_STATIC,
    "lru": _lib.KAIROX_BALANCER_LRU,
    "lfu": _lib.KAIROX_BALANCER_LFU,
    "topk": _lib.KAIROX_BALANCER_TOPK,
    "eager": _lib.KAIROX_BALANCER_EAGER,
    "tam": _lib.KAIROX_BALANCER_TAM,
    "tam_fixed": _lib.KAIROX_BALANCER_TAM_FIXED,
    "tam_lambda": _lib.KAIROX_BALANCER_TAM_LAMBDA,
}

#: bottleneck names -> enum kairox_bottleneck
BOTTLENECKS: dict[str, int] = {
    "none": _lib.KAIROX_BOTTLENECK_NONE,
    "io": _lib.KAIROX_BOTTLENECK_IO,
    "cpu": _lib.KAIROX_BOTTLENECK_CPU,
}

_F32P = ctypes.POINTER(ctypes.c_float)
_I32P = ctypes.POINTER(ctypes.c_int32)


@dataclass(frozen=True)
class BalancerConfig:
    """Policy and hyperparameters (kairox_balancer_params without the per-layer arrays)."""

    policy: str = "tam"
    lambda_init: float = 0.9  # TAM's decay; tam_lambda starts there and adapts it
    lambda_min: float = 0.5  # below ~0.5, tau = (1 - lambda) + eps exceeds the intensity of most
    # groups (normalised intensity < 1) and freezes the cache: see BENCHMARKS.md
    lambda_max: float = 0.95
    alpha: float = 0.05
    eps: float = 0.01
    max_loads: int = 0  # most loads per layer and step (0: no cap)
    adapt_cap: bool = False  # adapt that cap from feedback too
    # adaptive TAM's swap margin (a resident ranks as score + margin): 0 until an I/O-bound
    # step, then x margin_up per I/O-bound step within [margin_min, margin_max], x margin_down
    # per CPU-bound step and back to 0 below margin_min
    margin_min: float = 0.01
    margin_max: float = 1.0
    margin_up: float = 1.5
    margin_down: float = 0.98

    def validate(self) -> None:
        if self.policy not in POLICIES:
            raise KairoxError(f"unknown balancer policy '{self.policy}' (one of "
                              f"{', '.join(POLICIES)})")


def _c_array(values: Sequence[int] | np.ndarray, ctype: type, what: str) -> ctypes.Array:
    arr = np.ascontiguousarray(values)
    if arr.ndim != 1:
        raise KairoxError(f"{what} must be one-dimensional")
    return (ctype * len(arr))(*arr.tolist())


class Balancer:
    """A kairox_balancer: per layer, which groups of FFN neurons are held in VRAM.

    n_groups[l] groups per layer, budget[l] of them held at most (K); group_freq (all layers
    concatenated, the Kairox GGUF's kx_group_freq) gives the initial placement (each layer's
    top-K) and TAM's initial scores.
    """

    def __init__(self, n_groups: Sequence[int], budget: Sequence[int],
                 config: BalancerConfig | None = None,
                 group_freq: np.ndarray | None = None) -> None:
        config = config or BalancerConfig()
        config.validate()
        _lib.lib()  # a missing library is reported before any argument
        self.config = config
        self.n_groups = np.asarray(n_groups, dtype=np.int32).copy()
        self.budget = np.asarray(budget, dtype=np.int32).copy()
        if self.n_groups.ndim != 1 or self.budget.shape != self.n_groups.shape:
            raise KairoxError("n_groups and budget need one entry per layer")
        self.n_layer = len(self.n_groups)
        self.total_groups = int(self.n_groups.sum())
        self.offsets = np.concatenate([[0], np.cumsum(self.n_groups)]).astype(np.int64)
        p = _lib.kairox_balancer_default_params()
        p.policy = POLICIES[config.policy]
        p.n_layer = self.n_layer
        keep = [_c_array(self.n_groups, ctypes.c_int32, "n_groups"),
                _c_array(self.budget, ctypes.c_int32, "budget")]
        p.n_groups, p.budget = (ctypes.cast(a, _I32P) for a in keep)
        if group_freq is not None:
            freq = np.ascontiguousarray(group_freq, dtype=np.float32).reshape(-1)
            if freq.size != self.total_groups:
                raise KairoxError(f"group_freq has {freq.size} entries, the layers have "
                                  f"{self.total_groups} groups")
            keep.append(freq)
            p.group_freq = freq.ctypes.data_as(_F32P)
        p.lambda_init, p.lambda_min, p.lambda_max = config.lambda_init, config.lambda_min, config.lambda_max
        p.alpha, p.eps = config.alpha, config.eps
        p.max_loads, p.adapt_cap = config.max_loads, config.adapt_cap
        p.margin_min, p.margin_max = config.margin_min, config.margin_max
        p.margin_up, p.margin_down = config.margin_up, config.margin_down
        err = _lib.kairox_balancer_check_params(ctypes.byref(p))
        if err:
            raise KairoxError(err.decode())
        ptr = _lib.kairox_balancer_init(ctypes.byref(p))
        if not ptr:
            raise KairoxError("kairox_balancer_init failed")
        self._ptr: int | None = int(ptr)
        self._finalizer = weakref.finalize(self, _lib.kairox_balancer_free, ptr)
        self._lambda_buf = np.empty(self.n_layer, dtype=np.float32)

    # -- lifetime ------------------------------------------------------------------------
    @property
    def ptr(self) -> int:
        if self._ptr is None:
            raise KairoxError("balancer is closed")
        return self._ptr

    def close(self) -> None:
        self._finalizer()
        self._ptr = None

    def __enter__(self) -> Balancer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def reset(self) -> None:
        """Back to the initial placement, scores and lambda."""
        _lib.kairox_balancer_reset(self.ptr)

    # -- stepping ------------------------------------------------------------------------
    def _layer(self, layer: int, allow_all: bool = False) -> int:
        if not (0 <= layer < self.n_layer or (allow_all and layer == -1)):
            raise KairoxError(f"layer {layer} out of range [0, {self.n_layer})")
        return layer

    def feedback(self, layer: int, bottleneck: str | int) -> None:
        """Adapt the margin (tam), lambda (tam_lambda) and the load cap of a layer (-1: all)
        to the last step's bottleneck."""
        b = BOTTLENECKS[bottleneck] if isinstance(bottleneck, str) else int(bottleneck)
        _lib.kairox_balancer_feedback(self.ptr, self._layer(layer, True), b)

    def step(self, layer: int, intensity: np.ndarray) -> int:
        """One decode step of one layer; returns the number of loads."""
        a = np.ascontiguousarray(intensity, dtype=np.float32)
        n = int(_lib.kairox_balancer_step(self.ptr, self._layer(layer), a.ctypes.data_as(_F32P),
                                          a.size))
        if n < 0:
            raise KairoxError(f"layer {layer} has {self.n_groups[layer]} groups, got {a.size} intensities")
        return n

    def step_all(self, intensity: np.ndarray, feedback: np.ndarray | None = None) -> int:
        """Feedback (int32 [n_layer] of kairox_bottleneck, or None) then a step of every layer.

        intensity: float32 [total_groups] (layers concatenated), C-contiguous; passed without
        copying when it already is. Returns the total number of loads."""
        a = intensity if (intensity.dtype == np.float32 and intensity.flags.c_contiguous) \
            else np.ascontiguousarray(intensity, dtype=np.float32)
        if a.size != self.total_groups:
            raise KairoxError(f"expected {self.total_groups} intensities, got {a.size}")
        fb = None
        if feedback is not None:
            fb = feedback if (feedback.dtype == np.int32 and feedback.flags.c_contiguous) \
                else np.ascontiguousarray(feedback, dtype=np.int32)
            if fb.size != self.n_layer:
                raise KairoxError(f"expected {self.n_layer} feedback values, got {fb.size}")
        return int(_lib.kairox_balancer_step_all(
            self.ptr, a.ctypes.data_as(_F32P), fb.ctypes.data_as(_I32P) if fb is not None else None))

    @staticmethod
    def group_intensity(mask: np.ndarray, group_size: int) -> np.ndarray:
        """Share of active neurons per group of a per-neuron mask (the library's helper)."""
        m = np.ascontiguousarray(mask, dtype=np.uint8).reshape(-1)
        if group_size < 1 or m.size % group_size:
            raise KairoxError(f"group size {group_size} does not divide {m.size} neurons")
        out = np.empty(m.size // group_size, dtype=np.float32)
        n = _lib.kairox_balancer_group_intensity(m.ctypes.data, m.size, group_size,
                                                 out.ctypes.data_as(_F32P), out.size)
        if n != out.size:
            raise KairoxError("kairox_balancer_group_intensity failed")
        return out

    # -- results of the last step --------------------------------------------------------
    def resident_into(self, out: np.ndarray, layer: int = -1) -> np.ndarray:
        """Fill a uint8 buffer with the resident mask (layer -1: all layers concatenated)."""
        n = int(_lib.kairox_balancer_get_resident(self.ptr, self._layer(layer, True),
                                                  out.ctypes.data, out.size))
        if n != out.size or out.dtype != np.uint8:
            raise KairoxError(f"resident buffer needs {n} uint8 entries")
        return out

    def resident(self, layer: int = -1) -> np.ndarray:
        """bool mask of the groups in VRAM (layer -1: all layers concatenated)."""
        size = self.total_groups if layer == -1 else int(self.n_groups[self._layer(layer)])
        return self.resident_into(np.empty(size, dtype=np.uint8), layer).astype(bool)

    def _list(self, fn: Callable[[int, int, Any, int], int], layer: int) -> np.ndarray:
        cap = int(self.n_groups[self._layer(layer)])
        out = np.empty(cap, dtype=np.int32)
        n = int(fn(self.ptr, layer, out.ctypes.data_as(_I32P), cap))
        return out[:n].copy()

    def loads(self, layer: int) -> np.ndarray:
        """Groups loaded by the last step of `layer`, highest score first."""
        return self._list(_lib.kairox_balancer_get_loads, layer)

    def evicts(self, layer: int) -> np.ndarray:
        """Groups evicted by the last step of `layer`, lowest score first."""
        return self._list(_lib.kairox_balancer_get_evicts, layer)

    def scores_into(self, out: np.ndarray, layer: int = -1) -> np.ndarray:
        n = int(_lib.kairox_balancer_get_scores(self.ptr, self._layer(layer, True),
                                                out.ctypes.data_as(_F32P), out.size))
        if n != out.size or out.dtype != np.float32:
            raise KairoxError(f"score buffer needs {n} float32 entries")
        return out

    def scores(self, layer: int = -1) -> np.ndarray:
        """The policy's ranking key per group (TAM: momentum)."""
        size = self.total_groups if layer == -1 else int(self.n_groups[self._layer(layer)])
        return self.scores_into(np.empty(size, dtype=np.float32), layer)

    def lambdas(self) -> np.ndarray:
        """Current decay lambda of every layer (a copy)."""
        _lib.kairox_balancer_get_lambda(self.ptr, -1, self._lambda_buf.ctypes.data_as(_F32P),
                                        self.n_layer)
        return self._lambda_buf.copy()

    def lambdas_into(self, out: np.ndarray) -> np.ndarray:
        _lib.kairox_balancer_get_lambda(self.ptr, -1, out.ctypes.data_as(_F32P), out.size)
        return out

    def margins_into(self, out: np.ndarray) -> np.ndarray:
        """Fill float32 [n_layer] with every layer's swap margin (0 for policies without one)."""
        _lib.kairox_balancer_get_margin(self.ptr, -1, out.ctypes.data_as(_F32P), out.size)
        return out

    def margins(self) -> np.ndarray:
        """Current swap margin of every layer (a copy)."""
        return self.margins_into(np.empty(self.n_layer, dtype=np.float32))

    def load_cap(self, layer: int) -> float:
        """The layer's load cap per step (-1: none)."""
        return float(_lib.kairox_balancer_get_load_cap(self.ptr, self._layer(layer)))
