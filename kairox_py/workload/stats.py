"""Statistics of activation masks, the same for a generated workload and a recorded trace.

What the papers publish, measured on a trace directory (one layer of one sequence in memory
at a time, so 7B workloads stay small):

* active share, per layer and overall;
* the frequency CDF (PowerInfer Figure 5): cumulative share of the activations against the
  share of neurons, hot first, per layer (averaged) and model-wide (all layers pooled), and
  ``hot80``, the share of neurons that carries 80% of the activations;
* reactivation P(active at t+d | active at t) by frequency rank (KAIROX Figure 8): per
  neuron, averaged over the neurons of each rank bin (hot first), pooled over layers, as
  :func:`kairox_py.sim.figures.reactivation` draws it for `kairox simulate --figures`;
* activation windows: runs of consecutive active steps, mean length (activations per run)
  by rank bin and for the hot and the cold neurons;
* one-hit share: activations with no other activation of the same neuron within
  ``horizon`` steps either side (counted away from the sequence ends);
* cold-activation counts per layer and step (KAIROX Figure 4), cold being the coldest
  ``cold_share`` of each layer's neurons by measured frequency, and what describes their
  bursts: mean, coefficient of variation, peak, floor, lag-1 autocorrelation, burst length;
* adjacent tokens' Jaccard distance (DynamicInfer Figure 2c) and, between sequences, the
  Jaccard distance of their hot sets (DynamicInfer Figure 2b);
* the predictor's recall and precision, when the trace has its selection.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..errors import KairoxError
from ..sim.traces import Trace

#: x grid of the frequency CDF (share of neurons, hot first)
CDF_POINTS = 101


@dataclass
class Stats:
    """Measured statistics of one trace or workload directory (arrays pooled over layers)."""

    n_seq: int
    n_steps: int
    n_layer: int
    n_ff: int
    cold_share: float
    horizon: int
    active_share: float
    layer_density: np.ndarray  # (L,)
    hot80_layer: float
    hot80_model: float
    cdf_x: np.ndarray  # (CDF_POINTS,)
    cdf_layer: np.ndarray  # mean over layers of the cumulative activation share
    cdf_model: np.ndarray  # all layers pooled
    react: np.ndarray  # (n_bins, max_delta) P(A_{t+d} | A_t), hot first
    react_pa: np.ndarray  # (n_bins,) mean frequency of each bin
    react_cold: np.ndarray  # (max_delta,) mean over the cold neurons
    window_bins: np.ndarray  # (n_bins,) mean run length
    window_hot: float
    window_cold: float
    one_hit_share: float
    one_hit_cold: float
    cold_counts: np.ndarray  # (n_seq, n_steps, L) cold activations per layer and step
    jaccard_adjacent: float  # mean Jaccard distance of adjacent steps' active sets
    hotset_jaccard: float | None  # mean Jaccard distance of sequences' hot sets
    recall: float | None = None
    precision: float | None = None
    predicted_share: float | None = None
    burst: dict[str, float] = field(default_factory=dict)

    def summary(self) -> dict[str, float]:
        """The scalar statistics by name (what the CLI prints and the report compares)."""
        out = {
            "active_share": self.active_share,
            "hot80_layer": self.hot80_layer,
            "hot80_model": self.hot80_model,
            "window_hot": self.window_hot,
            "window_cold": self.window_cold,
            "one_hit_share": self.one_hit_share,
            "one_hit_cold": self.one_hit_cold,
            "react_cold_d1": float(self.react_cold[0]),
            "react_cold_d2": float(self.react_cold[min(1, len(self.react_cold) - 1)]),
            "react_cold_d3": float(self.react_cold[min(2, len(self.react_cold) - 1)]),
            "react_cold_max_d3+": float(np.nanmax(self.react_cold[2:])) if len(self.react_cold) > 2 else float("nan"),
            "react_hot_d1": float(self.react[0, 0]),
            "jaccard_adjacent": self.jaccard_adjacent,
        }
        if self.hotset_jaccard is not None:
            out["hotset_jaccard"] = self.hotset_jaccard
        out.update(self.burst)
        for k in ("recall", "precision", "predicted_share"):
            v = getattr(self, k)
            if v is not None:
                out[k] = v
        return out


def _share_at(cum: np.ndarray, level: float) -> float:
    """Share of entries (hot first) whose cumulative activation share first reaches `level`."""
    return (int(np.searchsorted(cum, level * cum[-1])) + 1) / len(cum) if cum[-1] > 0 else float("nan")


def _cdf(counts: np.ndarray, x: np.ndarray) -> np.ndarray:
    """Cumulative activation share at neuron shares x (hot first) of a 1-D count vector."""
    c = np.sort(counts.astype(np.float64))[::-1]
    cum = np.concatenate([[0.0], np.cumsum(c)])
    tot = cum[-1] if cum[-1] > 0 else 1.0
    return np.interp(x * len(c), np.arange(len(cum)), cum) / tot


def _runs_mean(mask: np.ndarray) -> float:
    """Mean length of runs of True in a 1-D bool array (0 without runs)."""
    if not mask.any():
        return 0.0
    d = np.diff(np.concatenate([[0], mask.astype(np.int8), [0]]))
    starts, ends = np.flatnonzero(d == 1), np.flatnonzero(d == -1)
    return float((ends - starts).mean())


def burst_stats(cold: np.ndarray, n_ff: int) -> dict[str, float]:
    """What describes Figure 4's cold-activation curves: cold (n_seq, n_steps, L) counts."""
    c = cold.astype(np.float64)
    mean = c.mean(axis=1)  # (S, L)
    sd = c.std(axis=1)
    with np.errstate(invalid="ignore", divide="ignore"):
        cv = np.where(mean > 0, sd / mean, np.nan)
        a, b = c[:, 1:] - mean[:, None], c[:, :-1] - mean[:, None]
        lag1 = np.where(sd > 0, (a * b).mean(axis=1) / np.maximum(sd ** 2, 1e-12), np.nan)
    med = np.median(c, axis=1)
    lens = []
    for s in range(c.shape[0]):
        for il in range(c.shape[2]):
            thr = max(2.0 * med[s, il], 0.01 * n_ff)
            r = _runs_mean(c[s, :, il] > thr)
            if r > 0:
                lens.append(r)
    return {
        "cold_mean_share": float(c.mean() / n_ff),
        "cold_cv": float(np.nanmean(cv)),
        "cold_peak": float(c.max()),
        "cold_peak_share": float(c.max() / n_ff),
        "cold_peak_typical": float(np.median(c.max(axis=(0, 1))) / n_ff),  # median layer's peak
        "cold_floor_share": float(np.percentile(c, 5, axis=1).mean() / n_ff),
        "cold_jump_share": float(np.abs(np.diff(c, axis=1)).max() / n_ff) if c.shape[1] > 1 else 0.0,
        "cold_lag1": float(np.nanmean(lag1)),
        "cold_burst_len": float(np.mean(lens)) if lens else 0.0,
    }


def _bits(trace: Trace, kind: str) -> np.ndarray:
    """The bit-packed masks of `kind`, memory-mapped (Trace checked their shape)."""
    if kind not in trace.kinds():
        raise KairoxError(f"the trace has no '{kind}' masks (it has {', '.join(trace.kinds())})")
    return np.load(trace.dir / f"{kind}.npy", mmap_mode="r")


def _layer(bits: np.ndarray, s: int, il: int) -> np.ndarray:
    """bool (n_steps, n_ff) of one layer of one sequence (one layer in memory at a time)."""
    return np.unpackbits(np.asarray(bits[s, :, il]), axis=-1, bitorder="little").view(bool)


def measure(trace: Trace, *, kind: str = "active", cold_share: float = 0.7, horizon: int = 2,
            max_delta: int = 8, n_bins: int = 32, seqs: int | None = None,
            tick: Callable[[], None] | None = None) -> Stats:
    """Measure `trace` (two passes over its masks: frequencies, then everything else).
    `tick` is called once per sequence and pass (2 * n_seq calls)."""
    n_seq = trace.n_seq if seqs is None else min(seqs, trace.n_seq)
    T, L, n = trace.n_steps, trace.n_layer, trace.n_ff
    max_delta = max(1, min(max_delta, T - 1))
    n_bins = max(1, min(n_bins, n))
    bits = _bits(trace, kind)
    pbits = _bits(trace, "predicted") if kind == "active" and "predicted" in trace.kinds() else None
    # pass 1: frequencies per sequence
    seq_counts = np.zeros((n_seq, L, n), dtype=np.int32)
    for s in range(n_seq):
        for il in range(L):
            seq_counts[s, il] = _layer(bits, s, il).sum(axis=0, dtype=np.int32)
        if tick:
            tick()
    counts = seq_counts.sum(axis=0)  # (L, n)
    order = np.argsort(-counts, axis=1, kind="stable")
    rank = np.empty_like(order)
    np.put_along_axis(rank, order, np.arange(n)[None, :].repeat(L, axis=0), axis=1)
    bins = np.minimum((rank * n_bins) // n, n_bins - 1)  # (L, n) rank bin of each neuron
    cold = rank >= int(round((1.0 - cold_share) * n))  # (L, n)
    # pass 2
    hits = np.zeros((L, n, max_delta), dtype=np.int64)
    first = np.zeros((L, n, max_delta), dtype=np.int64)
    runs = np.zeros((L, n), dtype=np.int64)
    iso = np.zeros((L, n), dtype=np.int64)
    interior = np.zeros((L, n), dtype=np.int64)
    cold_counts = np.zeros((n_seq, T, L), dtype=np.int32)
    jac_sum, jac_n = 0.0, 0
    has_pred = pbits is not None
    tp = pred_n = act_n = 0
    h = max(1, horizon)
    for s in range(n_seq):
        for il in range(L):
            x = _layer(bits, s, il)
            tot = seq_counts[s, il]
            for d in range(1, max_delta + 1):
                hits[il, :, d - 1] += (x[:-d] & x[d:]).sum(axis=0)
                first[il, :, d - 1] += tot - x[T - d:].sum(axis=0)
            runs[il] += x[0] + (x[1:] & ~x[:-1]).sum(axis=0)
            if T > 2 * h:
                nb = np.zeros_like(x)
                for d in range(1, h + 1):
                    nb[d:] |= x[:-d]
                    nb[:-d] |= x[d:]
                iso[il] += (x & ~nb)[h:T - h].sum(axis=0)
                interior[il] += x[h:T - h].sum(axis=0)
            cold_counts[s, :, il] = (x & cold[il]).sum(axis=1)
            inter = (x[1:] & x[:-1]).sum(axis=1)
            union = x[1:].sum(axis=1) + x[:-1].sum(axis=1) - inter
            ok = union > 0
            jac_sum += float((1.0 - inter[ok] / union[ok]).sum())
            jac_n += int(ok.sum())
            if pbits is not None:
                px = _layer(pbits, s, il)
                tp += int((px & x).sum())
                pred_n += int(px.sum())
                act_n += int(x.sum())
        if tick:
            tick()
    # frequency CDF and skew
    steps = n_seq * T
    x_grid = np.linspace(0.0, 1.0, CDF_POINTS)
    cdf_layer = np.mean([_cdf(counts[il], x_grid) for il in range(L)], axis=0)
    cdf_model = _cdf(counts.reshape(-1), x_grid)
    hot80_layer = float(np.nanmean([_share_at(np.cumsum(np.sort(counts[il])[::-1]), 0.8)
                                    for il in range(L)]))
    hot80_model = _share_at(np.cumsum(np.sort(counts.reshape(-1))[::-1]), 0.8)
    # reactivation by rank bin: mean of the per-neuron conditional probabilities
    with np.errstate(invalid="ignore", divide="ignore"):
        cond = np.where(first > 0, hits / np.maximum(first, 1), np.nan)  # (L, n, D)
    react = np.full((n_bins, max_delta), np.nan)
    pa = np.zeros(n_bins)
    wbins = np.zeros(n_bins)
    freq = counts / max(steps, 1)
    for b in range(n_bins):
        sel = bins == b
        rows = cond[sel]
        if np.isfinite(rows).any():
            react[b] = np.nanmean(np.where(np.isfinite(rows), rows, np.nan), axis=0)
        pa[b] = freq[sel].mean()
        r = runs[sel].sum()
        wbins[b] = counts[sel].sum() / r if r else np.nan
    cold_rows = cond[cold]
    react_cold = (np.nanmean(cold_rows, axis=0) if np.isfinite(cold_rows).any()
                  else np.full(max_delta, np.nan))

    def ratio(a: np.ndarray, b: np.ndarray) -> float:
        sb = float(b.sum())
        return float(a.sum()) / sb if sb else float("nan")

    # hot sets of the sequences (neurons carrying 80% of a sequence's activations of a layer)
    hotset = None
    if n_seq >= 2:
        sets = []
        for s in range(n_seq):
            o = np.argsort(-seq_counts[s], axis=1, kind="stable")
            cs = np.cumsum(np.take_along_axis(seq_counts[s], o, axis=1), axis=1)
            k = [int(np.searchsorted(cs[il], 0.8 * cs[il, -1])) + 1 for il in range(L)]
            hs = np.zeros((L, n), dtype=bool)
            for il in range(L):
                hs[il, o[il, :k[il]]] = True
            sets.append(hs)
        dist = []
        for i in range(n_seq):
            for j in range(i + 1, n_seq):
                inter = (sets[i] & sets[j]).sum(axis=1)
                union = (sets[i] | sets[j]).sum(axis=1)
                dist.append(float(np.mean(1.0 - inter / np.maximum(union, 1))))
        hotset = float(np.mean(dist))
    return Stats(
        n_seq=n_seq, n_steps=T, n_layer=L, n_ff=n, cold_share=cold_share, horizon=h,
        active_share=float(counts.sum() / (steps * L * n)),
        layer_density=counts.sum(axis=1) / (steps * n),
        hot80_layer=hot80_layer, hot80_model=hot80_model, cdf_x=x_grid, cdf_layer=cdf_layer,
        cdf_model=cdf_model, react=react, react_pa=pa, react_cold=react_cold, window_bins=wbins,
        window_hot=ratio(counts[~cold], runs[~cold]), window_cold=ratio(counts[cold], runs[cold]),
        one_hit_share=ratio(iso, interior), one_hit_cold=ratio(iso[cold], interior[cold]),
        cold_counts=cold_counts, jaccard_adjacent=jac_sum / jac_n if jac_n else float("nan"),
        hotset_jaccard=hotset,
        recall=tp / act_n if has_pred and act_n else None,
        precision=tp / pred_n if has_pred and pred_n else None,
        predicted_share=pred_n / (steps * L * n) if has_pred else None,
        burst=burst_stats(cold_counts, n))


def stats_to_json(st: Stats) -> dict[str, Any]:
    """The scalars and the small curves of `st`, JSON-ready (no per-step counts)."""
    def fl(a: np.ndarray) -> list[float | None]:
        return [None if not np.isfinite(v) else round(float(v), 6) for v in np.asarray(a).reshape(-1)]

    return {"summary": {k: (round(v, 6) if np.isfinite(v) else None) for k, v in st.summary().items()},
            "layer_density": fl(st.layer_density), "react": [fl(r) for r in st.react],
            "react_pa": fl(st.react_pa), "react_cold": fl(st.react_cold),
            "window_bins": fl(st.window_bins), "cdf_x": fl(st.cdf_x), "cdf_layer": fl(st.cdf_layer),
            "cdf_model": fl(st.cdf_model), "cold_share": st.cold_share, "horizon": st.horizon}
