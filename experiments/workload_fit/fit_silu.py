"""Distances between a silu-7b parameter set and every real SiLU trace, and a coordinate search
over the fitted parameters (docs/workloads.md, "silu-7b against the real traces").

Each candidate is generated at each trace's FFN width, sequences and steps (layers capped by
--layers: the preset has one set of parameters for all layers, so a few layers measure the
same statistics), measured with kairox_py.workload.stats and compared with
kairox_py.workload.compare. A model's score is the sum of the distances in SCORED, windows
relative to the trace's value (they are in steps, the rest are shares or probabilities);
a parameter set's score is the sum over the models, with the worst model reported beside it
so that a fit to one model at another's expense shows.

    python experiments/workload_fit/fit_silu.py bench-out/traces/{smollm2-135m,qwen2.5-coder-0.5b,qwen2.5-coder-1.5b}
    python experiments/workload_fit/fit_silu.py TRACES... --set window_hot=2.5 --search window_hot,hot80
"""
from __future__ import annotations

import argparse
import csv
import math
import tempfile
from dataclasses import asdict
from pathlib import Path

import numpy as np

from kairox_py.sim.traces import Trace
from kairox_py.workload.compare import Row, compare
from kairox_py.workload.model import PRESETS, resolve
from kairox_py.workload.stats import Stats, measure
from kairox_py.workload.write import write_workload

#: the distances a model's score adds up (absolute; RELATIVE ones divided by the trace's value)
SCORED = ("hot80_layer", "hot80_model", "window_hot", "window_cold", "one_hit_cold", "react_cold_d1",
          "react_cold_d2", "react_cold_d3", "react_hot_d1", "jaccard_adjacent", "hotset_jaccard",
          "cold_mean_share", "cold_cv", "cold_lag1", "react_mae", "cdf_gap_layer", "cdf_gap_model",
          "cold_share_ks")
RELATIVE = ("window_hot", "window_cold")

#: values the search tries around the current one, per parameter (multiplicative steps for
#: the positive ones, additive for shares)
STEPS: dict[str, tuple[str, float]] = {
    "hot80": ("add", 0.01), "rate_cap": ("add", 0.04), "seq_jitter": ("mul", 1.5),
    "window_hot": ("mul", 1.15), "window_cold": ("mul", 1.08), "one_hit_cold": ("add", 0.03),
    "topic_on": ("add", 0.08), "drift_concentration": ("mul", 1.6), "segment_len": ("mul", 1.5),
    "topic_share_hot": ("add", 0.08), "topic_share_cold": ("add", 0.08),
}


def score(rows: list[Row]) -> tuple[float, dict[str, float]]:
    """A model's score and the distances it adds up."""
    parts = {}
    for r in rows:
        if r.metric in SCORED and np.isfinite(r.distance):
            parts[r.metric] = r.distance / abs(r.trace) if r.metric in RELATIVE else r.distance
    return float(sum(parts.values())), parts


def evaluate(sets: dict[str, float], traces: dict[str, tuple[Trace, Stats]], layers: int,
             seeds: list[int]) -> dict[str, tuple[float, list[Row], Stats]]:
    """Per trace: (score, comparison rows, workload statistics) of silu-7b with `sets`; the
    score is the mean over `seeds` (all layers share a draw's context segments, so the
    burst statistics vary by seed more than by layer count), the rows are the first seed's."""
    out = {}
    for name, (tr, ts) in traces.items():
        m = tr.meta
        scores, first = [], None
        for seed in seeds:
            p = resolve("silu-7b", n_layer=min(layers, m.n_layer), n_ff=m.n_ff, n_embd=m.n_embd,
                        n_seq=m.n_seq, n_steps=m.n_steps, group_size=m.group_size, seed=seed, **sets)
            with tempfile.TemporaryDirectory() as tmp:
                ws = measure(write_workload(p, Path(tmp) / "w"))
            rows = compare(ws, ts)
            scores.append(score(rows)[0])
            first = first or (rows, ws)
        out[name] = (float(np.mean(scores)), *first)
    return out


def total(res: dict[str, tuple[float, list[Row], Stats]]) -> tuple[float, float]:
    """(sum, max) of the models' scores."""
    s = [v[0] for v in res.values()]
    return float(sum(s)), float(max(s))


def neighbours(name: str, value: float) -> list[float]:
    """The two values the search tries next to `value`."""
    kind, step = STEPS[name]
    vals = [value / step, value * step] if kind == "mul" else [value - step, value + step]
    return [round(v, 4) for v in vals]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("traces", nargs="+", type=Path)
    ap.add_argument("--set", dest="sets", action="append", default=[], metavar="NAME=VALUE")
    ap.add_argument("--search", default="", help="comma list of parameters to search, in order")
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--seeds", default="0", help="comma list of draws the score averages over")
    ap.add_argument("--csv", type=Path, default=None, help="write the per-model distances here")
    a = ap.parse_args()
    sets: dict[str, float] = {}
    for s in a.sets:
        k, _, v = s.partition("=")
        sets[k] = float(v)
    seeds = [int(x) for x in a.seeds.split(",")]
    traces = {}
    for d in a.traces:
        tr = Trace(d)
        traces[d.name] = (tr, measure(tr))
    res = evaluate(sets, traces, a.layers, seeds)
    best = total(res)
    print(f"start {sets}: sum {best[0]:.4f} max {best[1]:.4f} "
          + " ".join(f"{k} {v[0]:.4f}" for k, v in res.items()), flush=True)
    base = asdict(PRESETS["silu-7b"])
    for _ in range(a.rounds):
        for name in [s for s in a.search.split(",") if s]:
            cur = sets.get(name, base[name])
            for v in neighbours(name, cur):
                trial = {**sets, name: v}
                try:
                    r = evaluate(trial, traces, a.layers, seeds)
                except Exception as e:  # a value out of range: the preset's check says which
                    print(f"  {name}={v}: {e}", flush=True)
                    continue
                t = total(r)
                print(f"  {name}={v}: sum {t[0]:.4f} max {t[1]:.4f} "
                      + " ".join(f"{k} {x[0]:.4f}" for k, x in r.items()), flush=True)
                if t[0] < best[0] and t[1] <= best[1] * 1.02:
                    best, sets, res = t, trial, r
            print(f"after {name}: {sets} sum {best[0]:.4f} max {best[1]:.4f}", flush=True)
    print(f"best {sets}: sum {best[0]:.4f} max {best[1]:.4f}")
    for k, (s, rows, _) in res.items():
        _, parts = score(rows)
        print(f"{k}: {s:.4f} " + " ".join(f"{m}={parts[m]:.3f}" for m in SCORED if m in parts))
    if a.csv:
        with open(a.csv, "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(["model", "metric", "workload", "trace", "distance", "scored"])
            for k, (_, rows, _) in res.items():
                for r in rows:
                    w.writerow([k, r.metric, *(f"{v:.6g}" if math.isfinite(v) else "" for v in
                                               (r.workload, r.trace, r.distance)), int(r.metric in SCORED)])


if __name__ == "__main__":
    main()
