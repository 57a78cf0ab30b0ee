"""`kairox eval`: perplexity with every token through the sparse FFN, as in decode.

Each held-out chunk (up to ctx tokens, BOS first) is decoded in ONE call with
``ContextParams(n_batch=ctx, max_sparse_tokens=ctx)``: the library then runs every token
of the call through the sparse FFN with its own mask (never the dense prefill path, never
a union of masks), so the perplexity is what token-by-token decoding would see, at the
cost of one call per chunk. The dense reference is the original model in dense mode on
the same chunks; top-1 agreement compares the argmax token at every position.

FFN work is counted from the library's per-layer statistics as the share of weight rows
computed: (gate rows + up rows + down rows) / (3 n_ff) per token, with gate/up dense in
threshold mode, up selected by |act(gate)| in CATS mode, and gate/up selected by the
predictor in predictor mode, whose own cost (rank (n_embd + n_ff) MACs) is added as
the equivalent share of the dense FFN's 3 n_embd n_ff MACs. Ungated FFNs (Falcon) count
(up rows + down rows) / (2 n_ff).
"""
from __future__ import annotations

import csv
import math
import os
import time
from collections.abc import Sequence
from contextlib import nullcontext
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
from rich.console import Console

from ..errors import KairoxError
from ..format import UNGATED_ARCHES
from ..llama import ContextParams, Model
from ..progress import make_progress
from .corpus import Corpus

DEFAULT_EVAL_TOKENS = 4096
DEFAULT_CTX = 512
#: tokens per decode call within a chunk: the chunk's context is the same as one call's (the
#: KV cache carries it), while the call's logits (tokens x vocabulary floats, in the library,
#: its compute buffer and Python) stay small on a large vocabulary
EVAL_CALL_TOKENS = 128


@dataclass(frozen=True)
class EvalSetting:
    """One row of a sweep: which model, mode and runtime knobs."""

    model: str
    mode: str = "auto"
    threshold_scale: float = 1.0
    pred_threshold: float = 0.0
    label: str = ""


@dataclass(frozen=True)
class EvalResult:
    label: str
    model: str
    mode: str
    threshold_scale: float
    pred_threshold: float
    tokens: int
    nll: float
    ppl: float
    top1_agreement: float  # vs the dense reference (nan without one)
    active: float  # mean share of (token, neuron) pairs computed in down
    predicted: float  # mean share selected for gate/up (nan if dense gate/up)
    ffn_work: float  # share of the dense FFN's weight rows computed (predictor included)
    seconds: float


def eval_chunks(model: Model, corpus: Corpus, n_tokens: int, ctx: int) -> list[list[int]]:
    """Consecutive chunks of at most `ctx` tokens (BOS first) holding at most n_tokens tokens of
    text, so at most n_tokens positions are scored; the last chunk may be shorter. A tail
    shorter than a quarter of a chunk is dropped (too little context to be representative)
    unless it is all that was asked for."""
    toks = model.tokenize(corpus.text, add_special=False)
    if not toks:
        raise KairoxError("the evaluation text is empty")
    bos = [model.bos] if model.add_bos and model.bos >= 0 else []
    body = ctx - len(bos)
    need = max(2, min(body // 4, n_tokens))
    end = min(len(toks), n_tokens)
    chunks = []
    for i in range(0, end, body):
        c = toks[i:min(i + body, end)]
        if len(c) < need:
            break
        chunks.append(bos + c)
    if not chunks:
        raise KairoxError("the evaluation text is too short")
    return chunks


#: positions whose log-softmax is computed at once: a block's float64 copy of a large
#: vocabulary's logits (150k entries: 1.2 MB a row) stays small next to the model
NLL_BLOCK = 32


def _nll_and_argmax_rows(rows: np.ndarray, targets: Sequence[int]) -> tuple[float, np.ndarray]:
    """Sum of -log p(target) over logits rows, one target per row, and the rows' argmaxes."""
    target = np.asarray(targets)
    nll = 0.0
    for i in range(0, len(target), NLL_BLOCK):
        z = rows[i:i + NLL_BLOCK].astype(np.float64)
        m = z.max(axis=1)
        lse = m + np.log(np.exp(z - m[:, None]).sum(axis=1))
        nll += float((lse - z[np.arange(len(z)), target[i:i + len(z)]]).sum())
    return nll, rows.argmax(axis=1)


def _pred_overhead(model_path: Path, n_embd: int, n_ff: int, n_proj: int) -> float:
    """Predictor MACs as a share of the dense FFN's n_proj projections (mean over layers with a
    predictor)."""
    from gguf import GGUFReader

    from ..format import KEY_PRED_RANK

    try:
        f = GGUFReader(model_path, "r").get_field(KEY_PRED_RANK)
    except Exception:  # noqa: BLE001 - only an estimate for the report; never fail on it
        return 0.0
    if f is None:
        return 0.0
    ranks = np.asarray(f.contents(), dtype=np.float64)
    return float(np.mean(ranks * (n_embd + n_ff) / (n_proj * n_embd * n_ff)))


def evaluate(setting: EvalSetting, chunks: list[list[int]], *, threads: int | None = None,
             reference: list[np.ndarray] | None = None, console: Console | None = None,
             keep_argmax: bool = False, model: Model | None = None) -> tuple[EvalResult, list[np.ndarray]]:
    """Perplexity of one setting; returns (result, per-chunk argmaxes if keep_argmax). `model`:
    setting.model already open (several settings of one model load it once; left open)."""
    ctx = max(len(c) for c in chunks)
    call = min(ctx, EVAL_CALL_TOKENS)
    t0 = time.monotonic()
    path = Path(setting.model)
    nll_sum, n_sum, agree, argmaxes = 0.0, 0, 0, []
    with (nullcontext(model) if model is not None else Model(path)) as model:
        sparse = setting.mode != "dense"
        params = ContextParams(n_ctx=ctx, n_batch=call, n_ubatch=call, mode=setting.mode,
                               threshold_scale=setting.threshold_scale,
                               pred_threshold=setting.pred_threshold,
                               max_sparse_tokens=call if sparse else 0, stats=sparse,
                               n_threads=threads)
        with model.session(params) as s, make_progress(console, transient=True) as bar:
            task = bar.add_task(f"eval {setting.label or path.name}", total=len(chunks))
            mode = s.mode
            for i, chunk in enumerate(chunks):
                s.reset()
                nll, n, ams = 0.0, 0, []
                for a in range(0, len(chunk), call):
                    # the chunk's context grows call by call in the KV cache; the last row of a
                    # call predicts the next call's first token
                    logits = s.decode(chunk[a:a + call], all_logits=True)
                    assert logits is not None
                    targets = chunk[a + 1:a + call + 1]
                    dn, dam = _nll_and_argmax_rows(logits[:len(targets)], targets)
                    nll, n = nll + dn, n + len(targets)
                    ams.append(dam)
                am = np.concatenate(ams)
                nll_sum += nll
                n_sum += n
                if reference is not None:
                    agree += int(np.count_nonzero(am == reference[i]))
                if keep_argmax:
                    argmaxes.append(am)
                bar.advance(task)
            active = predicted = float("nan")
            work = 1.0
            if mode != "dense":
                st = s.layer_stats()
                active = float(np.mean([x.active_fraction for x in st]))
                pf = [x.predicted_fraction for x in st]
                predicted = float(np.mean(pf)) if not any(math.isnan(v) for v in pf) else float("nan")
                # projections before the activation: gate and up, or up alone (ungated; no CATS)
                n_in = 1 if model.arch in UNGATED_ARCHES else 2
                if mode == "threshold":
                    work = (n_in + active) / (n_in + 1)
                elif mode == "cats":
                    # up's selection is not counted by the library in CATS mode; down computes
                    # every row whose act(gate)*up is nonzero, which is exactly up's selection
                    up = active if math.isnan(predicted) else predicted
                    work = (1.0 + up + active) / 3.0
                else:
                    work = (n_in * predicted + active) / (n_in + 1) + _pred_overhead(
                        path, model.n_embd, model.n_ff, n_proj=n_in + 1)
    res = EvalResult(label=setting.label or path.name, model=str(path), mode=mode,
                     threshold_scale=setting.threshold_scale,
                     pred_threshold=setting.pred_threshold, tokens=n_sum,
                     nll=nll_sum / n_sum, ppl=math.exp(nll_sum / n_sum),
                     top1_agreement=agree / n_sum if reference is not None else float("nan"),
                     active=active, predicted=predicted, ffn_work=work,
                     seconds=time.monotonic() - t0)
    return res, argmaxes


def run_sweep(reference_model: str | None, settings: Sequence[EvalSetting], corpus: Corpus,
              *, n_tokens: int = DEFAULT_EVAL_TOKENS, ctx: int = DEFAULT_CTX,
              threads: int | None = None, console: Console | None = None) -> list[EvalResult]:
    """Dense reference first (if given), then every setting on the same chunks."""
    first = reference_model or settings[0].model
    with Model(first, vocab_only=True) as m:
        chunks = eval_chunks(m, corpus, n_tokens, ctx)
    results: list[EvalResult] = []
    ref_argmax: list[np.ndarray] | None = None
    if reference_model:
        r, ref_argmax = evaluate(EvalSetting(reference_model, "dense", label="dense (original)"),
                                 chunks, threads=threads, console=console, keep_argmax=True)
        results.append(r)
    with make_progress(console) as bar:
        task = bar.add_task("sweep", total=len(settings))
        for st in settings:
            r, _ = evaluate(st, chunks, threads=threads, reference=ref_argmax, console=console)
            results.append(r)
            bar.advance(task)
    return results


def sweep_title(settings: Sequence[EvalResult], description: str) -> str:
    """The table's title, saying what the settings (the results without the dense reference)
    ran: a plain GGUF, or --mode dense, runs the dense FFN."""
    modes = {r.mode for r in settings}
    if modes == {"dense"}:
        how = "dense FFN (no sparse mode ran)"
    elif "dense" in modes:
        how = "every token sparse except in the rows of mode dense"
    else:
        how = "every token sparse"
    return f"Perplexity on {description}, {how}"


def write_sweep(results: Sequence[EvalResult], out_dir: str | os.PathLike[str],
                title: str = "Perplexity, every token through the sparse FFN") -> list[Path]:
    """results.csv, results.md and (with matplotlib) ppl.png in out_dir."""
    d = Path(out_dir)
    d.mkdir(parents=True, exist_ok=True)
    base = results[0].ppl if results and results[0].mode == "dense" else None
    with open(d / "results.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=[*asdict(results[0]).keys(), "ppl_vs_dense"])
        w.writeheader()
        for r in results:
            w.writerow({**asdict(r), "ppl_vs_dense": (r.ppl / base - 1) if base else ""})
    (d / "results.md").write_text(markdown_table(results, title))
    files = [d / "results.csv", d / "results.md"]
    png = plot_sweep(d / "ppl.png", results, title)
    if png:
        files.append(png)
    return files


def markdown_table(results: Sequence[EvalResult], title: str) -> str:
    base = results[0].ppl if results and results[0].mode == "dense" else None

    def pct(v: float) -> str:
        return "-" if math.isnan(v) else f"{100 * v:.1f}%"

    header = ("| setting | mode | scale | p | tokens | PPL | vs dense | top-1 agree | "
              "down active | gate/up selected | FFN work |")
    lines = [f"### {title}", "", header,
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in results:
        delta = f"{100 * (r.ppl / base - 1):+.2f}%" if base else "-"
        lines.append(f"| {r.label} | {r.mode} | {r.threshold_scale:g} | "
                     f"{r.pred_threshold:g} | {r.tokens} | {r.ppl:.3f} | {delta} | "
                     f"{pct(r.top1_agreement)} | {pct(r.active)} | {pct(r.predicted)} | "
                     f"{pct(r.ffn_work)} |")
    return "\n".join(lines) + "\n"


def plot_sweep(path: Path, results: Sequence[EvalResult], title: str) -> Path | None:
    """Perplexity against FFN work share, one series per mode; None without matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    fig, ax = plt.subplots(figsize=(7, 4.2))
    base = results[0].ppl if results and results[0].mode == "dense" else None
    modes = sorted({r.mode for r in results if r.mode != "dense"})
    for mode in modes:
        pts = sorted((r.ffn_work, r.ppl, r.label) for r in results if r.mode == mode)
        ax.plot([p[0] for p in pts], [p[1] for p in pts], "o-", label=mode)
        for x, y, lab in pts:
            ax.annotate(lab, (x, y), fontsize=6, xytext=(3, 3), textcoords="offset points")
    if base:
        ax.axhline(base, color="k", lw=1, label="dense")
        ax.axhline(base * 1.03, color="r", lw=0.8, ls="--", label="dense +3%")
    ax.set_xlabel("FFN work (share of dense weight rows computed)")
    ax.set_ylabel("perplexity")
    ax.set_title(title, fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
