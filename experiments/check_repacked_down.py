"""End-to-end check of the sparse down projection's repacked dense layout on a real model.

Requantize the default model to Q4_0 (whose ffn_down the CPU backend repacks) and convert it:
    build/dev/bin/llama-quantize --allow-requantize SmolLM2-135M-Instruct.Q4_1.gguf q4_0.gguf Q4_0 2
    kairox convert q4_0.gguf /tmp/q40/kx.gguf -t 2
then run this script: with every neuron active (threshold ~0) the down projection reads the
repacked ffn_down through the repack buffer's kernels, so sparse decode must give dense's
logits; the default threshold is shown for comparison.
"""
import sys

import numpy as np

from kairox_py.llama import ContextParams, Model

K = sys.argv[1] if len(sys.argv) > 1 else "/tmp/q40/kx.gguf"
m = Model(K, use_mmap=False)
toks = m.encode_prompt("Describe how a lighthouse keeper spends a stormy night.", True)
def run(p, n=24):
    with m.session(p) as s:
        s.decode(toks); tok = int(np.argmax(s.logits())); seq = [tok]; lg = []
        for _ in range(n):
            s.decode([tok]); l = np.array(s.logits()); lg.append(l); tok = int(np.argmax(l)); seq.append(tok)
        st = s.layer_stats() if p.stats else None
        return seq, lg, st
dense = run(ContextParams(n_ctx=512, n_threads=2, mode="dense"))
allon = run(ContextParams(n_ctx=512, n_threads=2, mode="threshold", threshold_scale=1e-30, stats=True))
dflt = run(ContextParams(n_ctx=512, n_threads=2, stats=True))
rel = max(float(np.max(np.abs(a - b)) / np.max(np.abs(b))) for a, b in zip(allon[1], dense[1]))
print("all active: share", round(float(np.mean([x.active_fraction for x in allon[2]])), 3), "same tokens", allon[0] == dense[0], "max rel logit diff", f"{rel:.2e}")
print("default: share", round(float(np.mean([x.active_fraction for x in dflt[2]])), 3), "tokens agree with dense", sum(a == b for a, b in zip(dflt[0], dense[0])), "/", len(dense[0]))
sys.exit(0 if allon[0] == dense[0] and rel < 1e-3 else 1)
