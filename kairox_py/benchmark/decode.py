"""Side-by-side speed of the dense llama.cpp path and the Kairox sparse path.

Both systems run in one process from the same library build, with the same threads, prompts
and greedy decoding, interleaved run by run (dense first on even runs, sparse first on odd
ones) so that drift of the machine hits both alike; warm-up runs are excluded. Two
generation modes, as in the paper's Figure 9:

* standard: one token per llama_decode;
* speculative: up to `n_draft` tokens drafted (by n-gram lookup in the text so far, as
  llama.cpp's prompt-lookup decoding does, or by a draft model the user passes) and verified
  in one batch, which goes through the sparse FFN with a mask per token.

Times are wall clock around the decode calls (Python's share is the same for both systems:
an argmax and a copy of the logits per step).
"""
from __future__ import annotations

import csv
import math
import statistics
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from ..errors import KairoxError
from ..llama import ROW_MODES, ContextParams, Model, Session
from ..offline.corpus import prompt_lines

SUMMARY_BEGIN = "=== KAIROX BENCH SUMMARY ==="
SUMMARY_END = "=== END SUMMARY ==="


def load_prompts(path: str | Path | None = None) -> list[str]:
    """The project's fixed prompt set (kairox_py/data/prompts.txt) or a user's file."""
    return prompt_lines(path, "data/prompts.txt")


# ---------------------------------------------------------------------------------------
# drafting
# ---------------------------------------------------------------------------------------
def ngram_draft(history: Sequence[int], n_draft: int, ngram_max: int = 3, ngram_min: int = 1) -> list[int]:
    """Prompt-lookup drafting: continue the latest earlier occurrence of the last n tokens."""
    n_hist = len(history)
    for n in range(min(ngram_max, n_hist - 1), ngram_min - 1, -1):
        key = list(history[n_hist - n:])
        for i in range(n_hist - n - 1, -1, -1):
            if list(history[i:i + n]) == key:
                cont = list(history[i + n:i + n + n_draft])
                if cont:
                    return cont
    return []


class DraftModel:
    """A smaller model that drafts greedily, its context kept in step with the target's."""

    def __init__(self, model: Model, params: ContextParams) -> None:
        self.model = model
        self.session = model.session(params)
        self._pending: list[int] = []
        self._drafted: list[int] = []

    def start(self, tokens: Sequence[int]) -> None:
        """Context = tokens[:-1]; the last token is decoded with the first draft."""
        self.session.reset()
        if len(tokens) > 1:
            self.session.decode(list(tokens[:-1]))
        self._pending = [tokens[-1]]

    def draft(self, n_draft: int) -> list[int]:
        out: list[int] = []
        toks = self._pending
        for _ in range(n_draft):
            self.session.decode(toks)
            out.append(int(np.argmax(self.session.logits())))
            toks = [out[-1]]
        self._drafted = out
        self._pending = []
        return out

    def accept(self, n_past_before: int, accepted: int, next_token: int) -> None:
        """Keep the accepted drafts in the context (the last draft was never decoded)."""
        keep = n_past_before + 1 + accepted
        if keep <= self.session.n_past:
            self.session.rewind(keep)
            self._pending = [next_token]
        else:
            self._pending = [self._drafted[-1], next_token]

    def close(self) -> None:
        self.session.close()
        self.model.close()


# ---------------------------------------------------------------------------------------
# one generation
# ---------------------------------------------------------------------------------------
@dataclass
class GenResult:
    prompt_tokens: int
    prefill_s: float
    gen_tokens: int
    decode_s: float
    decode_calls: int
    accepted: int = 0
    drafted: int = 0
    tokens: list[int] = field(default_factory=list)

    @property
    def prefill_tps(self) -> float:
        return self.prompt_tokens / self.prefill_s if self.prefill_s > 0 else math.nan

    @property
    def decode_tps(self) -> float:
        return self.gen_tokens / self.decode_s if self.decode_s > 0 else math.nan


def generate_standard(s: Session, prompt: Sequence[int], n_predict: int) -> GenResult:
    s.reset()
    t0 = time.perf_counter()
    s.decode(prompt)
    t1 = time.perf_counter()
    out: list[int] = []
    tok = int(np.argmax(s.logits()))
    for _ in range(n_predict):
        out.append(tok)
        s.decode([tok])
        tok = int(np.argmax(s.logits()))
    t2 = time.perf_counter()
    return GenResult(len(prompt), t1 - t0, len(out), t2 - t1, len(out), tokens=out)


def generate_speculative(s: Session, prompt: Sequence[int], n_predict: int, n_draft: int,
                         draft: DraftModel | None = None) -> GenResult:
    """Greedy speculative decoding: the output equals standard greedy decoding's."""
    s.reset()
    t0 = time.perf_counter()
    s.decode(prompt)
    t1 = time.perf_counter()
    history = list(prompt)
    tok = int(np.argmax(s.logits()))
    out: list[int] = []
    calls = accepted_total = drafted_total = 0
    if draft is not None:
        draft.start(list(prompt) + [tok])
    while len(out) < n_predict:
        out.append(tok)
        history.append(tok)
        room = n_predict - len(out)
        if room == 0:
            break
        n_want = min(n_draft, room)
        drafts = draft.draft(n_want) if draft is not None else ngram_draft(history, n_want)
        n_past = s.n_past
        rows = s.decode([tok] + drafts, all_logits=True)
        calls += 1
        assert rows is not None
        accepted = 0
        for i, d in enumerate(drafts):
            if int(np.argmax(rows[i])) != d:
                break
            accepted += 1
        drafted_total += len(drafts)
        accepted_total += accepted
        out.extend(drafts[:accepted])
        history.extend(drafts[:accepted])
        tok = int(np.argmax(rows[accepted]))
        if accepted < len(drafts):
            s.rewind(n_past + 1 + accepted)
        if draft is not None:
            draft.accept(n_past, accepted, tok)
    out = out[:n_predict]
    t2 = time.perf_counter()
    return GenResult(len(prompt), t1 - t0, len(out), t2 - t1, calls, accepted_total, drafted_total, out)


# ---------------------------------------------------------------------------------------
# the side-by-side benchmark
# ---------------------------------------------------------------------------------------
@dataclass(frozen=True)
class BenchConfig:
    dense_model: Path
    sparse_model: Path
    prompts: tuple[str, ...]
    n_predict: int = 64
    runs: int = 3
    warmup: int = 1
    threads: int = 2
    gen_modes: tuple[str, ...] = ("standard", "speculative")
    n_draft: int = 5
    draft_model: Path | None = None
    sparse_mode: str = "auto"
    pred_threshold: float = 0.0
    threshold_scale: float = 1.0
    down_dense_share: float = -1.0  # < 0: the model's (kairox calibrate), else built-in
    chat: bool = True
    label: str = ""
    #: map the GGUF files instead of reading them into (huge-page-backed) memory; both systems
    #: are always loaded the same way
    use_mmap: bool = False

    @property
    def weights(self) -> str:
        """How the weights were loaded, for the reports: "mapped" or "read" (into memory)."""
        return "mapped" if self.use_mmap else "read"


@dataclass
class Record:
    system: str  # dense | kairox
    gen_mode: str  # standard | speculative
    run: int
    prompt: int
    prompt_tokens: int
    gen_tokens: int
    prefill_tps: float
    decode_tps: float
    decode_calls: int
    accept_rate: float


def _session_params(cfg: BenchConfig, n_ctx: int, sparse: bool) -> ContextParams:
    if not sparse:
        return ContextParams(n_ctx=n_ctx, n_batch=512, n_threads=cfg.threads, mode="dense")
    return ContextParams(n_ctx=n_ctx, n_batch=512, n_threads=cfg.threads, mode=cfg.sparse_mode,
                         pred_threshold=cfg.pred_threshold, threshold_scale=cfg.threshold_scale,
                         down_dense_share=cfg.down_dense_share, stats=True)


def run_bench(cfg: BenchConfig, progress: Callable[[str], None] | None = None) -> tuple[list[Record], list[float]]:
    """All records of the benchmark, and the sparse model's per-layer active fraction."""
    if cfg.runs < 1 or cfg.n_predict < 1:
        raise KairoxError("runs and n_predict must be >= 1")
    for gm in cfg.gen_modes:
        if gm not in ("standard", "speculative"):
            raise KairoxError(f"unknown generation mode {gm!r}")
    dense_m = Model(cfg.dense_model, use_mmap=cfg.use_mmap)
    sparse_m = Model(cfg.sparse_model, use_mmap=cfg.use_mmap, ffn_rows=cfg.sparse_mode in ROW_MODES)
    try:
        if not sparse_m.has_sparsity:
            raise KairoxError(f"{cfg.sparse_model} carries no Kairox sparsity data (kairox convert it)")
        if dense_m.n_vocab != sparse_m.n_vocab:
            raise KairoxError("the two models have different vocabularies")
        prompts = [dense_m.encode_prompt(p, cfg.chat) for p in cfg.prompts]
        n_ctx = max(len(p) for p in prompts) + cfg.n_predict + cfg.n_draft + 8
        n_ctx = -(-n_ctx // 256) * 256
        sessions = {"dense": dense_m.session(_session_params(cfg, n_ctx, False)),
                    "kairox": sparse_m.session(_session_params(cfg, n_ctx, True))}
        draft = None
        if cfg.draft_model is not None and "speculative" in cfg.gen_modes:
            draft = DraftModel(Model(cfg.draft_model), ContextParams(n_ctx=n_ctx, n_threads=cfg.threads))
        records: list[Record] = []
        for run in range(-cfg.warmup, cfg.runs):
            order = ["dense", "kairox"] if run % 2 == 0 else ["kairox", "dense"]
            if run == 0:
                sessions["kairox"].reset_stats()
            for gm in cfg.gen_modes:
                for pi, prompt in enumerate(prompts if run >= 0 else prompts[:2]):
                    for system in order:
                        s = sessions[system]
                        if gm == "standard":
                            g = generate_standard(s, prompt, cfg.n_predict)
                        else:
                            g = generate_speculative(s, prompt, cfg.n_predict, cfg.n_draft, draft)
                        if run >= 0:
                            records.append(Record(system, gm, run, pi, g.prompt_tokens, g.gen_tokens,
                                                  g.prefill_tps, g.decode_tps, g.decode_calls,
                                                  g.accepted / g.drafted if g.drafted else math.nan))
                    if progress:
                        progress(f"{'warm-up' if run < 0 else f'run {run + 1}/{cfg.runs}'} {gm} prompt {pi + 1}")
        layers = [st.active_fraction for st in sessions["kairox"].layer_stats()]
        for s in sessions.values():
            s.close()
        if draft is not None:
            draft.close()
        return records, layers
    finally:
        dense_m.close()
        sparse_m.close()


# ---------------------------------------------------------------------------------------
# summaries
# ---------------------------------------------------------------------------------------
@dataclass
class Summary:
    gen_mode: str
    system: str
    prefill_median: float
    prefill_lo: float
    prefill_hi: float
    decode_median: float
    decode_lo: float
    decode_hi: float
    n: int
    accept_rate: float


def _quartiles(xs: Sequence[float]) -> tuple[float, float, float]:
    xs = sorted(x for x in xs if not math.isnan(x))
    if not xs:
        return (math.nan,) * 3
    if len(xs) < 4:
        return statistics.median(xs), xs[0], xs[-1]
    q = statistics.quantiles(xs, n=4)
    return statistics.median(xs), q[0], q[2]


def summarize(records: Iterable[Record]) -> list[Summary]:
    recs = list(records)
    out = []
    for gm in sorted({r.gen_mode for r in recs}, key=lambda g: g != "standard"):
        for system in ("dense", "kairox"):
            sel = [r for r in recs if r.gen_mode == gm and r.system == system]
            if not sel:
                continue
            p = _quartiles([r.prefill_tps for r in sel])
            d = _quartiles([r.decode_tps for r in sel])
            acc = [r.accept_rate for r in sel if not math.isnan(r.accept_rate)]
            out.append(Summary(gm, system, *p, *d, len(sel), statistics.mean(acc) if acc else math.nan))
    return out


def speedups(records: Iterable[Record]) -> dict[str, float]:
    """Median over (run, prompt) pairs of kairox/dense decode speed, per generation mode."""
    recs = list(records)
    out = {}
    for gm in {r.gen_mode for r in recs}:
        dense = {(r.run, r.prompt): r.decode_tps for r in recs if r.gen_mode == gm and r.system == "dense"}
        ratios = [r.decode_tps / dense[(r.run, r.prompt)] for r in recs
                  if r.gen_mode == gm and r.system == "kairox" and (r.run, r.prompt) in dense]
        out[gm] = statistics.median(ratios) if ratios else math.nan
    return out


def summary_block(cfg: BenchConfig, records: Sequence[Record], layers: Sequence[float]) -> str:
    """The plain block that ends every log; scripts/parse_bench_logs.py reads it back."""
    lines = [SUMMARY_BEGIN,
             f"label={cfg.label or '-'}",
             f"dense_model={cfg.dense_model}",
             f"sparse_model={cfg.sparse_model}",
             (f"threads={cfg.threads} n_predict={cfg.n_predict} runs={cfg.runs} prompts={len(cfg.prompts)} "
              f"weights={cfg.weights}"),
             f"sparse_mode={cfg.sparse_mode} pred_threshold={cfg.pred_threshold} threshold_scale={cfg.threshold_scale} "
             f"down_dense_share={cfg.down_dense_share}",
             f"mean_active_fraction={statistics.mean(layers) if layers else math.nan:.4f}"]
    sp = speedups(records)
    for s in summarize(records):
        lines.append(f"{s.gen_mode}.{s.system}.prefill_tps={s.prefill_median:.2f} "
                     f"{s.gen_mode}.{s.system}.decode_tps={s.decode_median:.2f} "
                     f"{s.gen_mode}.{s.system}.decode_q1={s.decode_lo:.2f} "
                     f"{s.gen_mode}.{s.system}.decode_q3={s.decode_hi:.2f} "
                     f"{s.gen_mode}.{s.system}.accept_rate={s.accept_rate:.3f}")
    for gm, v in sorted(sp.items()):
        lines.append(f"{gm}.decode_speedup={v:.3f}")
    lines.append(SUMMARY_END)
    return "\n".join(lines)


def markdown_table(records: Sequence[Record]) -> str:
    sp = speedups(records)
    rows = ["| mode | system | prefill tok/s (median, IQR) | decode tok/s (median, IQR) | decode speedup | draft accept |",
            "|---|---|---|---|---|---|"]
    for s in summarize(records):
        rows.append(f"| {s.gen_mode} | {s.system} | {s.prefill_median:.1f} ({s.prefill_lo:.1f}-{s.prefill_hi:.1f}) "
                    f"| {s.decode_median:.1f} ({s.decode_lo:.1f}-{s.decode_hi:.1f}) "
                    f"| {'%.2fx' % sp[s.gen_mode] if s.system == 'kairox' else '1.00x'} "
                    f"| {'-' if math.isnan(s.accept_rate) else '%.0f%%' % (100 * s.accept_rate)} |")
    return "\n".join(rows)


def write_outputs(out_dir: Path, cfg: BenchConfig, records: Sequence[Record], layers: Sequence[float]) -> list[Path]:
    """bench.csv (every record), layers.csv, bench.md, bench.png."""
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = []
    with open(out_dir / "bench.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(asdict(records[0]).keys()) if records else ["system"])
        w.writeheader()
        for r in records:
            w.writerow(asdict(r))
    paths.append(out_dir / "bench.csv")
    with open(out_dir / "layers.csv", "w", newline="") as f:
        w2 = csv.writer(f)
        w2.writerow(["layer", "active_fraction"])
        for i, a in enumerate(layers):
            w2.writerow([i, f"{a:.5f}"])
    paths.append(out_dir / "layers.csv")
    md = [f"# kairox bench {cfg.label}".rstrip(), "",
          f"dense: `{cfg.dense_model}`  ", f"sparse: `{cfg.sparse_model}` (mode {cfg.sparse_mode})  ",
          (f"threads {cfg.threads}, {len(cfg.prompts)} prompts, {cfg.n_predict} tokens, {cfg.runs} runs "
           f"after {cfg.warmup} warm-up, greedy, weights {cfg.weights}"), "", markdown_table(records), "",
          f"mean active FFN fraction (sparse): {statistics.mean(layers) if layers else math.nan:.3f}", ""]
    (out_dir / "bench.md").write_text("\n".join(md))
    paths.append(out_dir / "bench.md")
    png = plot(out_dir / "bench.png", records, layers)
    if png:
        paths.append(png)
    return paths


def plot(path: Path, records: Sequence[Record], layers: Sequence[float]) -> Path | None:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4))
    summ = summarize(records)
    modes = sorted({s.gen_mode for s in summ}, key=lambda g: g != "standard")
    x = np.arange(len(modes))
    for k, system in enumerate(("dense", "kairox")):
        med = [next((s.decode_median for s in summ if s.gen_mode == m and s.system == system), math.nan) for m in modes]
        lo = [next((s.decode_lo for s in summ if s.gen_mode == m and s.system == system), math.nan) for m in modes]
        hi = [next((s.decode_hi for s in summ if s.gen_mode == m and s.system == system), math.nan) for m in modes]
        err = [np.subtract(med, lo), np.subtract(hi, med)]
        ax1.bar(x + (k - 0.5) * 0.38, med, 0.38, yerr=err, capsize=4, label=system)
    ax1.set_xticks(x, modes)
    ax1.set_ylabel("decode tokens/s (median, IQR)")
    ax1.set_title("decode speed")
    ax1.legend()
    if layers:
        ax2.bar(range(len(layers)), [100 * a for a in layers])
        ax2.set_xlabel("layer")
        ax2.set_ylabel("active FFN neurons (%)")
        ax2.set_title("sparse path: work per layer")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


# ---------------------------------------------------------------------------------------
# where the time goes
# ---------------------------------------------------------------------------------------
#: (category, predicate on (node name, op)) in match order
_CATEGORIES: list[tuple[str, Callable[[str, str], bool]]] = [
    ("predictor", lambda n, o: n.startswith("kx_")),
    ("ffn", lambda n, o: n.startswith("ffn_") and n not in ("ffn_inp", "ffn_norm") and o != "ADD"),
    ("output head", lambda n, o: n.startswith("result_output")),
    ("attention", lambda n, o: n.split("_")[0] in ("Qcur", "Kcur", "Vcur", "attn", "kq", "kqv", "q", "k", "v")
                               or n.startswith(("Qcur", "Kcur", "Vcur", "attn_", "kq", "kqv", "cache_"))
                               or o in ("FLASH_ATTN_EXT", "SOFT_MAX", "ROPE", "SET_ROWS", "CPY")),
    ("norms", lambda n, o: o in ("RMS_NORM", "NORM") or n.endswith("norm") or n == "norm"),
]


def categorize(name: str, op: str) -> str:
    for cat, pred in _CATEGORIES:
        if pred(name, op):
            return cat
    return "other"


@dataclass
class OpProfile:
    """Per-token time by category of one system's decode (graph compute only), plus wall time."""

    system: str
    us_per_token: dict[str, float]
    wall_us_per_token: float
    by_op: list[tuple[str, str, float]]  # (name, op, us per token)

    @property
    def graph_us(self) -> float:
        return sum(self.us_per_token.values())

    def share(self, cat: str) -> float:
        return self.us_per_token.get(cat, 0.0) / self.graph_us if self.graph_us else math.nan


def profile_ops(model_path: Path, params: ContextParams, prompts: Sequence[list[int]], n_predict: int,
                system: str, use_mmap: bool) -> OpProfile:
    """Time every graph node during standard greedy decoding (prefill excluded)."""
    with Model(model_path, use_mmap=use_mmap, ffn_rows=params.mode in ROW_MODES) as m, m.session(params) as s:
        total_tokens = 0
        wall = 0.0
        for p in prompts:
            s.reset()
            s.decode(p)
            s.set_op_timing(True)
            s.reset_op_times() if total_tokens == 0 else None
            tok = int(np.argmax(s.logits()))
            t0 = time.perf_counter()
            for _ in range(n_predict):
                s.decode([tok])
                tok = int(np.argmax(s.logits()))
            wall += time.perf_counter() - t0
            s.set_op_timing(False)
            total_tokens += n_predict
        cats: dict[str, float] = {}
        by_op = []
        for name, op, _count, us in s.op_times():
            cat = categorize(name, op)
            cats[cat] = cats.get(cat, 0.0) + us / total_tokens
            by_op.append((name, op, us / total_tokens))
        by_op.sort(key=lambda e: -e[2])
        return OpProfile(system, cats, 1e6 * wall / total_tokens, by_op)


def amdahl_limit(ffn_share: float, work_done: float) -> float:
    """Best decode speedup when the FFN (share of time) does `work_done` of its dense work."""
    return 1.0 / ((1.0 - ffn_share) + ffn_share * work_done)


def ffn_work_fraction(sparse_model: str | Path, mode: str, active: float) -> float:
    """Bytes of weights the sparse FFN reads per token over the dense FFN's (predictor included).

    Decode is bandwidth-bound, so bytes read are the fair measure of work: predictor mode reads
    the active rows of gate, up and down_t plus the whole predictor; threshold mode reads gate
    and up whole and the active rows of down_t; CATS reads gate whole and active up/down_t rows.
    """
    from gguf import GGUFReader

    from ..offline.quant import down_t_size

    r = GGUFReader(str(sparse_model))
    size = {t.name: int(t.n_bytes) for t in r.tensors}
    shape = {t.name: t.shape for t in r.tensors}
    dense = sparse = 0.0
    i = 0
    while f"blk.{i}.ffn_up.weight" in size:
        g, u, d = (size.get(f"blk.{i}.ffn_{k}.weight", 0) for k in ("gate", "up", "down"))
        n_embd, n_ff = (int(v) for v in shape[f"blk.{i}.ffn_up.weight"][:2])
        dt = down_t_size(r, i, n_embd, n_ff)[0] or d
        pred = sum(v for k, v in size.items() if k.startswith((f"blk.{i}.kx_pred_up.", f"blk.{i}.kx_pred_down.")))
        dense += g + u + d
        if mode == "predictor":
            sparse += active * (g + u + dt) + pred
        elif mode == "threshold":
            sparse += g + u + active * dt
        elif mode == "cats":
            sparse += g + active * (u + dt)
        else:
            sparse += g + u + d
        i += 1
    if dense == 0:
        raise KairoxError(f"{sparse_model}: no FFN tensors found")
    return sparse / dense
