#!/usr/bin/env python3
"""Teacher-forced agreement of a Kairox GGUF's sparse modes with dense on one short text: top-1
tokens and relative squared error of the logits of its first N tokens (one decode call, every
token through the sparse FFN with its own mask), and the share of neurons each mode computes.

    KAIROX_LIB=$PWD/build/dev/libkairox.so python scripts/sparse_agreement.py KX.gguf [-n 32]

(docs/benchmarks/opt-1.3b-synthetic/exact.txt)
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from kairox_py import ContextParams, Model  # noqa: E402

TEXT = ("The lighthouse keeper wrote down every ship that passed the cape in winter, and the "
        "harbour master read the list each spring.")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model", help="a Kairox GGUF")
    ap.add_argument("-n", type=int, default=32, help="tokens of the text")
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("--modes", default="threshold,predictor")
    args = ap.parse_args()
    modes = args.modes.split(",")
    with Model(args.model) as m:
        toks = m.tokenize(TEXT * 8)[: args.n]
        out = {}
        for mode in ["dense", *modes]:
            with m.session(ContextParams(n_ctx=max(256, len(toks)), n_batch=len(toks), max_sparse_tokens=len(toks),
                                         n_threads=args.threads, mode=mode, stats=mode != "dense")) as s:
                out[mode] = s.decode(toks, all_logits=True)
                if mode != "dense":
                    st = s.layer_stats()
                    pred = [x.predicted_fraction for x in st]
                    print(f"{mode}: active {np.mean([x.active_fraction for x in st]):.3f}"
                          + ("" if any(np.isnan(pred)) else f", predicted {np.mean(pred):.3f}"))
    d = out["dense"]
    for mode in modes:
        g = out[mode]
        print(f"{mode}: top-1 {(g.argmax(-1) == d.argmax(-1)).sum()}/{len(toks)}, "
              f"rel sq err {np.sum((g - d) ** 2) / np.sum(d ** 2):.2e}")


if __name__ == "__main__":
    main()
