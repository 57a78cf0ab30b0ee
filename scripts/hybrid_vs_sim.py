#!/usr/bin/env python3
"""Hybrid runtime on the CPU stand-in vs the simulator's replay of the same trace.

    python3 scripts/hybrid_vs_sim.py KAIROX.gguf [--budgets 0.1,0.25,0.5] [--steps 64]
        [--prompts FILE] [--policies all] [--out bench-out/hybrid-vs-sim]

Why: the simulator (`kairox simulate`) is how policies are compared without a GPU; this
checks that it predicts what the real runtime does. For every prompt the script

1. runs the CPU-only sparse path (deterministic) greedily and records, with the C profiler,
   each step's FFN inputs; the in-graph predictors' choices are recomputed from them in NumPy
   (the prefill is one balancer step, intensity = per-token maximum, as in the runtime);
2. runs the hybrid runtime on the stand-in device for every policy and budget (deterministic:
   no timing feedback, nothing adapts), checks that tokens and recorded inputs are identical to
   step 1 (placement never changes results), and reads the per-layer cache stats of the
   decode steps (the prefill step is excluded on both sides);
3. writes those masks as a trace directory (the `kairox trace` format, so `kairox simulate`
   can replay it too) and replays it through `simulate()` with the runtime's per-layer slot
   counts, layer 0 decided from its own step (as the stand-in does) and no feedback.

Budgets are shares of the whole neuron-group cache on top of the dense parts. Results:
summary.csv / summary.md (reload bytes per decode step and hit rate, both sides, with the
relative difference) and per_layer.csv under --out.
"""
from __future__ import annotations

import argparse
import shutil
import sys
import time
from pathlib import Path

import numpy as np
from rich.console import Console

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from kairox_py.errors import KairoxError  # noqa: E402
from kairox_py.format import ffn_input_kind  # noqa: E402
from kairox_py.hybrid import POLICIES  # noqa: E402
from kairox_py.llama import ContextParams, Model, Profiler  # noqa: E402
from kairox_py.progress import make_progress  # noqa: E402
from kairox_py.sim import agreement  # noqa: E402
from kairox_py.sim.agreement import RuntimeCounts  # noqa: E402
from kairox_py.sim.replay import DEFAULT_CPU, SequenceData  # noqa: E402
from kairox_py.sim.traces import TRACE_VERSION, Trace, TraceMeta, model_costs, pack, read_kairox  # noqa: E402

GIB = float(1 << 30)

# our own prompts (no third-party text); a user's own go in with --prompts
PROMPTS = [
    "Explain why bread dough rises and what happens if the kitchen is cold.",
    "Write a short letter to a neighbour asking to borrow a ladder for the weekend.",
    "List the steps to repair a bicycle tyre puncture, with a tip for each step.",
    "Describe a walk along a river at dawn in five sentences.",
]


def _session(model: Model, n_ctx: int, n_batch: int, budget_gib: float, policy: str,
             prof: Profiler | None = None, threads: int | None = None):  # type: ignore[no-untyped-def]
    return model.session(ContextParams(n_ctx=n_ctx, n_batch=n_batch, mode="predictor",
                                       vram_budget_gib=budget_gib, policy=policy, deterministic=True,
                                       profiler=prof, n_threads=threads))


def _run(model: Model, prompt: list[int], steps: int, budget_gib: float, policy: str,
         threads: int | None, forced: list[int] | None = None):  # type: ignore[no-untyped-def]
    """Greedy decode (or the forced tokens); returns tokens, per-step FFN inputs (per step, per
    layer (n_tokens, n_embd): the prefill first; its last layer only has the rows that produce
    logits, as upstream's graph drops the others) and the decode steps' stats."""
    L = model.n_layer
    n_ctx = len(prompt) + steps + 8
    inputs: list[np.ndarray] = []
    toks: list[int] = []
    kind = ffn_input_kind(model.arch)
    with Profiler(model, max(len(prompt), 1), kinds=(kind,)) as prof, \
            _session(model, n_ctx, max(len(prompt), 8), budget_gib, policy, prof, threads) as s:
        s.decode(prompt)
        inputs.append([prof.get(kind, il) for il in range(L)])
        if budget_gib > 0:
            s.reset_hybrid_stats()  # the prefill step is excluded from the comparison
        for t in range(steps):
            tok = int(s.logits().argmax())
            if forced is not None and tok != forced[t]:
                raise KairoxError(f"{policy} at budget {budget_gib:.4f} GiB: token {t} differs from "
                                  f"the CPU-only path ({tok} vs {forced[t]})")
            toks.append(tok)
            prof.clear()
            s.decode([tok])
            inputs.append([prof.get(kind, il) for il in range(L)])
        stats = s.hybrid_stats() if budget_gib > 0 else None
        info = s.hybrid_info() if budget_gib > 0 else None
    return toks, inputs, stats, info


def _masks(kx, inputs: list[list[np.ndarray]], L: int, n_ff: int, gs: int, own_input: bool) -> np.ndarray:  # type: ignore[no-untyped-def]
    """bool (n_steps + 1, L, n_ff): step 0 = the prefill (per group, as many neurons as the
    most active token had: the runtime's per-token maximum), then one mask per decode step."""
    out = np.zeros((len(inputs), L, n_ff), dtype=bool)
    for i, x in enumerate(inputs):
        for il in range(L):
            src = il if own_input else max(il - 1, 0)
            n = len(x[il])  # the rows this layer's FFN computes
            m = kx.predict(il, x[src][-n:])  # (n, n_ff)
            if i > 0:
                out[i, il] = m[-1]
                continue
            best = m.reshape(len(m), n_ff // gs, gs).sum(axis=2).max(axis=0)
            out[i, il] = (np.arange(gs)[None, :] < best[:, None]).reshape(-1)
    return out


def _write_trace(path: Path, kx_path: Path, kx, masks: list[np.ndarray], tokens: list[list[int]],  # type: ignore[no-untyped-def]
                 prompts: list[str], model: Model) -> Trace:
    L, n_ff = model.n_layer, model.n_ff
    if path.exists():
        shutil.rmtree(path)
    path.mkdir(parents=True)
    bits = np.stack([pack(m) for m in masks])
    np.save(path / "predicted.npy", bits)
    np.save(path / "active.npy", bits)  # the runtime only sees predictions
    np.save(path / "tokens.npy", np.asarray([[-1] + t for t in tokens], dtype=np.int32))
    np.save(path / "group_freq.npy", np.asarray(kx.group_freq, dtype=np.float32))
    dens = [float(np.mean([m[:, il].mean() for m in masks])) for il in range(L)]
    meta = TraceMeta(version=TRACE_VERSION, model_path=str(kx_path.resolve()), model_sha256="",
                     kairox_path=str(kx_path.resolve()), n_layer=L, n_embd=model.n_embd, n_ff=n_ff,
                     group_size=kx.group_size, n_seq=len(masks), n_steps=masks[0].shape[0],
                     thresholds=[float(v) for v in kx.thresholds],
                     threshold_source="hybrid_vs_sim.py: CPU stand-in run, step 0 = prefill; active = predicted",
                     has_predicted=True, pred_threshold=kx.pred_threshold, chat=True, temperature=0.0,
                     top_p=1.0, seed=0, prompts=prompts,
                     costs=model_costs(kx_path, L, n_ff, kx.down_t_row_bytes, kx.down_t_type),
                     active_density=dens, predicted_density=dens, recall=[1.0] * L)
    (path / "meta.json").write_text(meta.to_json())
    return Trace(path)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("kairox_gguf")
    ap.add_argument("--budgets", default="0.1,0.25,0.5", help="shares of the whole group cache")
    ap.add_argument("--policies", default="all")
    ap.add_argument("--steps", type=int, default=64)
    ap.add_argument("--prompts", help="text file, one prompt per line")
    ap.add_argument("--n-prompts", type=int, default=None)
    ap.add_argument("-t", "--threads", type=int, default=None)
    ap.add_argument("--out", default="bench-out/hybrid-vs-sim")
    a = ap.parse_args(argv)
    console = Console(stderr=True, highlight=False, width=150)
    kx_path = Path(a.kairox_gguf)
    prompts = PROMPTS if not a.prompts else [p.strip() for p in Path(a.prompts).read_text().splitlines() if p.strip()]
    if a.n_prompts:
        prompts = prompts[: a.n_prompts]
    if not prompts:
        raise KairoxError("no prompts")
    policies = list(POLICIES) if a.policies == "all" else a.policies.split(",")
    for p in policies:
        if p not in POLICIES:
            raise KairoxError(f"unknown policy {p!r} (one of {', '.join(POLICIES)})")
    shares = [float(b) for b in a.budgets.split(",")]
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()

    with Model(kx_path, ffn_rows=True) as model:
        L, n_ff = model.n_layer, model.n_ff
        kx = read_kairox(kx_path, L, n_ff)
        gs = kx.group_size
        own = model.metadata.get("kairox.predictor.input", "previous") == "current"
        with _session(model, 64, 8, 64.0, "static") as s:
            info = s.hybrid_info()
            assert info is not None
            dense, cache = float(info.dense_bytes), float(info.cache_bytes)
        encoded = [model.encode_prompt(p, chat=True) for p in prompts]
        n_runs = len(prompts) * (1 + len(shares) * len(policies))
        ref_tokens, masks = [], []
        counts = RuntimeCounts()
        with make_progress(console) as bar:
            task = bar.add_task("stand-in runs", total=n_runs)
            for prompt in encoded:
                toks, inputs, _, _ = _run(model, prompt, a.steps, 0.0, "static", a.threads)
                bar.advance(task)
                ref_tokens.append(toks)
                masks.append(_masks(kx, inputs, L, n_ff, gs, own))
                for share in shares:
                    budget = (dense + share * cache) / GIB
                    for pol in policies:
                        t2, in2, st, inf = _run(model, prompt, a.steps, budget, pol, a.threads, forced=toks)
                        if any(not np.array_equal(x, y) for a_, b_ in zip(inputs, in2) for x, y in zip(a_, b_)):
                            raise KairoxError(f"{pol} at share {share}: FFN inputs differ from the CPU-only run")
                        counts.add(share, pol, st)
                        bar.advance(task)

        trace = _write_trace(out / "trace", kx_path, kx, masks, ref_tokens, prompts, model)
    data = SequenceData(trace, "predicted", gs)
    rows, per_layer = agreement.compare(data, DEFAULT_CPU, counts, shares, policies, drop_first_step=True)
    title = (f"CPU stand-in vs simulator replay ({len(prompts)} prompts x {a.steps} decode steps, "
             f"{kx_path.name}, group {gs})")
    console.print(agreement.table(rows, title))
    agreement.write(out, rows, per_layer, f"{title}: `python3 scripts/hybrid_vs_sim.py {kx_path.name}`")
    n_ok = sum(agreement.within(r) for r in rows)
    console.print(f"{n_ok}/{len(rows)} within 10%; tokens identical to the CPU-only path in every run; "
                  f"{time.monotonic() - t0:.0f} s; wrote {out}/summary.csv, summary.md, per_layer.csv, trace/")
    return 0 if n_ok == len(rows) else 1


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KairoxError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
