#!/usr/bin/env python3
"""How the FFN neurons a token leaves out cluster, on the default model's own masks against
random ones: whether the op table's random masks are representative of decode.

The op table draws each neuron's activity at random, the worst case for the sparse ops at high
density: the inactive rows are scattered one by one, so reading 90% of the rows costs nearly
what reading all does. A Kairox GGUF stores each layer's neurons in its own order (groups of
co-active neurons contiguous, hot groups first), so the neurons a token leaves out might
cluster, and skip whole row tiles. This records decode on the real model (dense, the C
profiler's hidden activations act(gate)*up per layer and step), puts each layer's neurons in the
Kairox GGUF's order, thresholds |hidden| per layer at the quantile that leaves the requested
share active over the whole recording (one threshold per layer, as `kairox convert`
calibrates), and prints per share the mean length of the runs of inactive neurons and the share
of them in runs of 8 or more (a whole tile), next to random masks of the same density.

    KAIROX_LIB=build/dev/libkairox.so python experiments/model_masks.py --kairox KX.gguf \\
        --shares 0.5,0.75,0.9 -o masks.json
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from kairox_py.benchmark.decode import load_prompts  # noqa: E402
from kairox_py.default_model import ensure_model  # noqa: E402
from kairox_py.llama import Model  # noqa: E402
from kairox_py.offline.profile import magnitude_quantile  # noqa: E402
from kairox_py.sim.traces import TraceOptions, decode_with_profile, read_kairox  # noqa: E402


def inactive_runs(mask: np.ndarray) -> tuple[float, float]:
    """Mean length of the runs of inactive neurons, and the share of inactive neurons that sit
    in runs of 8 or more (a whole row tile the sparse ops skip)."""
    lengths = []
    for row in mask:
        off = np.concatenate(([0], (~row).astype(np.int8), [0]))
        d = np.diff(off)
        starts, ends = np.flatnonzero(d == 1), np.flatnonzero(d == -1)
        lengths.extend((ends - starts).tolist())
    if not lengths:
        return 0.0, 0.0
    arr = np.asarray(lengths)
    return float(arr.mean()), float(arr[arr >= 8].sum() / arr.sum())


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model", nargs="?", help="the original GGUF (default: the default model)")
    ap.add_argument("--kairox", required=True, help="its Kairox GGUF (the neuron order)")
    ap.add_argument("--shares", default="0.5,0.75,0.9", help="active shares, comma-separated")
    ap.add_argument("--n-prompts", type=int, default=8)
    ap.add_argument("--steps", type=int, default=32, help="decode steps per prompt")
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("-o", "--out", help="JSON file for the summary")
    a = ap.parse_args()

    path = Path(a.model) if a.model else ensure_model()
    model = Model(path)
    kx = read_kairox(Path(a.kairox), model.n_layer, model.n_ff)
    opts = TraceOptions(threads=a.threads)
    hidden = []
    for i, text in enumerate(load_prompts()[: a.n_prompts]):
        toks = model.encode_prompt(text, True)
        _, h, _ = decode_with_profile(model, toks, a.steps, opts, seed=i, tick=lambda: None)
        hidden.append(h)
    h = np.abs(np.concatenate(hidden))  # (steps, n_layer, n_ff)
    h = np.stack([h[:, il, kx.perm[il]] for il in range(model.n_layer)], axis=1)

    rng = np.random.default_rng(0)
    summary = []
    for share in (float(v) for v in a.shares.split(",")):
        masks = np.empty_like(h, dtype=bool)
        for il in range(model.n_layer):
            masks[:, il] = h[:, il] > magnitude_quantile(h[:, il], 1.0 - share)
        flat = masks.reshape(-1, model.n_ff)
        run, in_tiles = inactive_runs(flat)
        rrun, rtiles = inactive_runs(rng.random(flat.shape) < flat.mean())
        summary.append({"share": share, "masks": int(flat.shape[0]), "n_ff": int(model.n_ff),
                        "active": round(float(flat.mean()), 4),
                        "mean_inactive_run": round(run, 2), "inactive_in_runs_of_8": round(in_tiles, 3),
                        "random_mean_inactive_run": round(rrun, 2), "random_inactive_in_runs_of_8": round(rtiles, 3)})
        print(json.dumps(summary[-1]))
    if a.out:
        Path(a.out).write_text(json.dumps({"model": str(path), "kairox": str(a.kairox), "prompts": a.n_prompts,
                                           "steps": a.steps, "shares": summary}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
