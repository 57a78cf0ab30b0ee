#!/usr/bin/env python3
"""Decode speed of one library build on a Kairox GGUF: dense and sparse in one process.

Run it alternately with KAIROX_LIB pointing at two builds (e.g. a copy of build/dev/libkairox.so
made before a change and the rebuilt one) to A/B a library change; each line's sparse/dense ratio
is measured side by side, so ratios compare across runs where raw tokens/s on this noisy VM do not.

    for r in 1 2 3; do for lib in /tmp/old.so build/dev/libkairox.so; do
        KAIROX_LIB=$PWD/$lib python scripts/ab_decode.py KX.gguf -t 2; done; done
"""
from __future__ import annotations

import argparse
import statistics
import sys
from contextlib import nullcontext
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from kairox_py import Model, SamplingParams  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model", help="a Kairox GGUF")
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("-n", type=int, default=96, help="tokens per generation")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--mode", default="threshold", help="sparse mode to time against dense")
    ap.add_argument("-p", "--prompt", default="The history of the printing press begins")
    ap.add_argument("--deterministic", action="store_true",
                    help="also time the sparse mode with deterministic=True (the down summed in double)")
    ap.add_argument("--original", metavar="GGUF",
                    help="the original GGUF the model was converted from: timed dense through upstream's "
                         "kernels in the same rounds, and the baseline of the ratios (else the converted "
                         "file's own dense mode, which is not a speedup baseline)")
    args = ap.parse_args()
    sp = SamplingParams(temperature=0, ignore_eos=True)
    runs: dict[str, dict[str, object]] = {"dense": {"mode": "dense"}, args.mode: {"mode": args.mode}}
    if args.deterministic:
        runs[args.mode + "-deterministic"] = {"mode": args.mode, "deterministic": True}
    tps: dict[str, list[float]] = {k: [] for k in runs}
    if args.original:
        tps = {"original": [], **tps}
    with Model(args.model) as m, (Model(args.original) if args.original else nullcontext()) as orig:
        for _ in range(args.reps):
            if orig is not None:
                with orig.session(n_ctx=512, n_threads=args.threads) as s:
                    list(s.generate(args.prompt, args.n, sp))
                    tps["original"].append(s.timings().decode_tps)
            for name, kw in runs.items():
                with m.session(n_ctx=512, n_threads=args.threads, **kw) as s:
                    list(s.generate(args.prompt, args.n, sp))
                    tps[name].append(s.timings().decode_tps)
    d = statistics.median(tps["original" if args.original else "dense"])
    print("  ".join(f"{k} {statistics.median(v):.1f} tok/s ({statistics.median(v) / d:.3f}x)"
                    for k, v in tps.items()))


if __name__ == "__main__":
    main()
