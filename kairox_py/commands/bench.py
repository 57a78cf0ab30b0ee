"""`kairox bench`: dense llama.cpp vs Kairox sparse, side by side, in one process."""
from __future__ import annotations

import math
from pathlib import Path

import click
from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn
from rich.table import Table

from .. import _lib
from ..benchmark.decode import (
    BenchConfig,
    amdahl_limit,
    ffn_work_fraction,
    load_prompts,
    markdown_table,
    profile_ops,
    run_bench,
    summary_block,
    write_outputs,
)
from ..benchmark.synthetic import SHAPES, SYNTHETIC_VERSION, SparseSpec, pred_threshold_for, write_synthetic_llama
from ..default_model import cache_dir
from ..llama import ContextParams, Model, default_threads
from ..outputs import check_output_into
from ._common import float_list, resolve_model, stderr_console


@click.command("bench")
@click.argument("sparse_model", required=False)
@click.option("--dense-model", default=None, help="The original GGUF (default: the default model).")
@click.option("--prompts", "prompts_file", default=None, help="Prompt file (default: the project's prompts.txt).")
@click.option("--max-prompts", type=click.IntRange(min=1), default=8, show_default=True)
@click.option("-n", "--n-predict", type=click.IntRange(min=1), default=64, show_default=True)
@click.option("--runs", type=click.IntRange(min=1), default=3, show_default=True)
@click.option("--warmup", type=click.IntRange(min=0), default=1, show_default=True)
@click.option("-t", "--threads", type=click.IntRange(min=1), default=default_threads(), show_default=True)
@click.option("--gen-modes", default="standard,speculative", show_default=True,
              help="Comma list of standard, speculative.")
@click.option("--n-draft", type=click.IntRange(min=1, max=15), default=5, show_default=True,
              help="Draft tokens verified per batch in speculative decoding.")
@click.option("--draft-model", default=None, help="Draft GGUF (default: n-gram lookup drafting).")
@click.option("--mode", type=click.Choice(list(_lib.KAIROX_MODES)), default="auto", show_default=True)
@click.option("--pred-threshold", type=float, default=0.0, help="Predictor probability threshold (0: the model's).")
@click.option("--threshold-scale", type=float, default=1.0, show_default=True)
@click.option("--down-dense-share", type=click.FloatRange(min=0.0), default=None,
              help="Kairox side: share of active neurons above which the sparse down reads ffn_down in "
                   "order (default: the model's, from kairox calibrate, else built-in per type).")
@click.option("--op-profile/--no-op-profile", default=True, show_default=True,
              help="Also time every graph node of dense and sparse decode (where the time goes).")
@click.option("--synthetic", type=click.Choice(sorted(SHAPES)), default=None,
              help="Bench a synthetic random-weight model of these shapes (speed only).")
@click.option("--density", default="0.1,0.5", show_default=True,
              help="Synthetic: shares of FFN neurons computed (comma list).")
@click.option("--pred-rank", type=click.IntRange(min=0), default=0, show_default=True,
              help="Synthetic: predictor rank in the graph (0 = masks given).")
@click.option("--pred-type", type=click.Choice(["q4_0", "q8_0", "f16"]), default="q4_0", show_default=True)
@click.option("--mmap/--no-mmap", "use_mmap", default=False, show_default=True,
              help="Map the GGUF files instead of reading them into huge-page-backed memory "
                   "(both systems alike).")
@click.option("--out", "out_dir", default="bench-out", show_default=True, help="Output directory.")
@click.option("--label", default="", help="Label written into the log summary.")
def bench(sparse_model: str | None, dense_model: str | None, prompts_file: str | None, max_prompts: int,
          n_predict: int, runs: int, warmup: int, threads: int, gen_modes: str, n_draft: int,
          draft_model: str | None, mode: str, pred_threshold: float, threshold_scale: float,
          down_dense_share: float | None, op_profile: bool, synthetic: str | None, density: str, pred_rank: int, pred_type: str,
          use_mmap: bool, out_dir: str, label: str) -> None:
    """Decode speed of the dense path (DENSE model) and the Kairox sparse path (SPARSE_MODEL, a
    Kairox GGUF), interleaved in one process. Writes bench.md, bench.csv, layers.csv, bench.png and
    ends with a summary block (scripts/parse_bench_logs.py turns logs into tables)."""
    console = stderr_console()
    # every check before the minutes of benchmarking
    if synthetic and (sparse_model or dense_model):
        raise click.UsageError("--synthetic benches its own random-weight models: drop "
                               f"{'SPARSE_MODEL' if sparse_model else '--dense-model'} or --synthetic")
    if not synthetic and sparse_model is None:
        raise click.UsageError("pass a Kairox GGUF (made by `kairox convert`), or --synthetic")
    modes = tuple(m.strip() for m in gen_modes.split(",") if m.strip())
    if not modes or any(m not in ("standard", "speculative") for m in modes):
        raise click.BadParameter(f"expected a comma list of standard, speculative, got {gen_modes!r}",
                                 param_hint="'--gen-modes'")
    dens = _densities(density) if synthetic else []
    out = check_output_into(out_dir)
    prompts = tuple(load_prompts(prompts_file)[:max_prompts])
    share = -1.0 if down_dense_share is None else down_dense_share
    if synthetic:
        _bench_synthetic(synthetic, dens, pred_rank, pred_type, prompts, n_predict, runs, warmup,
                         threads, out, label, op_profile, use_mmap, share)
        return
    assert sparse_model is not None
    dense = resolve_model(dense_model, console)
    cfg = BenchConfig(dense_model=dense, sparse_model=Path(sparse_model), prompts=prompts, n_predict=n_predict,
                      runs=runs, warmup=warmup, threads=threads, gen_modes=modes, n_draft=n_draft,
                      draft_model=Path(draft_model) if draft_model else None, sparse_mode=mode,
                      pred_threshold=pred_threshold, threshold_scale=threshold_scale, chat=True, label=label,
                      use_mmap=use_mmap, down_dense_share=share)
    _run_and_report(cfg, out, console, op_profile)


def _run_and_report(cfg: BenchConfig, out: Path, console, op_profile: bool) -> None:  # type: ignore[no-untyped-def]
    with Progress(SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn(),
                  console=console, transient=True) as prog:
        task = prog.add_task(f"bench {cfg.label}", total=None)
        records, layers = run_bench(cfg, lambda msg: prog.update(task, description=msg))
    paths = write_outputs(out, cfg, records, layers)
    console.print(markdown_table(records))
    block = summary_block(cfg, records, layers)
    if op_profile:
        block = block.replace("=== END SUMMARY ===", _op_profile_lines(cfg, layers, out, console) + "\n=== END SUMMARY ===")
    click.echo(block)
    console.print(f"wrote {', '.join(str(p) for p in paths)}")


def _op_profile_lines(cfg: BenchConfig, layers: list[float], out: Path, console) -> str:  # type: ignore[no-untyped-def]
    """Where the time goes, dense vs sparse; appended to the summary block and op_profile.md."""
    with Model(cfg.dense_model) as m:
        toks = [m.tokenize(p, add_special=True) for p in cfg.prompts[:3]]
    n_ctx = -(-(max(len(t) for t in toks) + cfg.n_predict + 8) // 256) * 256
    dense = profile_ops(cfg.dense_model, ContextParams(n_ctx=n_ctx, n_threads=cfg.threads, mode="dense"),
                        toks, cfg.n_predict, "dense", cfg.use_mmap)
    sparse = profile_ops(cfg.sparse_model, ContextParams(n_ctx=n_ctx, n_threads=cfg.threads, mode=cfg.sparse_mode,
                                                         pred_threshold=cfg.pred_threshold,
                                                         threshold_scale=cfg.threshold_scale,
                                                         down_dense_share=cfg.down_dense_share),
                         toks, cfg.n_predict, "kairox", cfg.use_mmap)
    active = sum(layers) / len(layers) if layers else math.nan
    with Model(cfg.sparse_model) as sm:
        mode = sm.session(ContextParams(n_ctx=256, mode=cfg.sparse_mode)).mode
    work = ffn_work_fraction(cfg.sparse_model, mode, active)
    f = dense.share("ffn")
    limit = amdahl_limit(f, work)
    measured = dense.wall_us_per_token / sparse.wall_us_per_token
    cats = ["ffn", "predictor", "attention", "output head", "norms", "other"]
    table = Table(title="where the time goes (us per decoded token, graph compute)", title_justify="left")
    table.add_column("category")
    table.add_column("dense", justify="right")
    table.add_column("kairox", justify="right")
    md = ["| category | dense us/token | kairox us/token |", "|---|---|---|"]
    for c in cats:
        d, s = dense.us_per_token.get(c, 0.0), sparse.us_per_token.get(c, 0.0)
        table.add_row(c, f"{d:.0f}", f"{s:.0f}")
        md.append(f"| {c} | {d:.0f} | {s:.0f} |")
    table.add_row("graph total", f"{dense.graph_us:.0f}", f"{sparse.graph_us:.0f}")
    table.add_row("wall per token", f"{dense.wall_us_per_token:.0f}", f"{sparse.wall_us_per_token:.0f}")
    md.append(f"| graph total | {dense.graph_us:.0f} | {sparse.graph_us:.0f} |")
    md.append(f"| wall per token | {dense.wall_us_per_token:.0f} | {sparse.wall_us_per_token:.0f} |")
    console.print(table)
    md += ["", f"FFN share of dense decode (graph time): {100 * f:.1f}%",
           f"FFN work done by the sparse path (bytes, predictor included): {100 * work:.1f}%",
           f"Amdahl limit: {limit:.3f}x; measured (timed run): {measured:.3f}x = "
           f"{100 * (measured - 1) / (limit - 1) if limit > 1 else math.nan:.0f}% of the possible gain, "
           f"{100 * measured / limit:.0f}% of the limit", "",
           "Top nodes, sparse (us/token):", ""]
    md += [f"- {n} ({o}): {us:.1f}" for n, o, us in sparse.by_op[:12]]
    md += ["", "Top nodes, dense (us/token):", ""] + [f"- {n} ({o}): {us:.1f}" for n, o, us in dense.by_op[:12]]
    out.mkdir(parents=True, exist_ok=True)
    (out / "op_profile.md").write_text("\n".join(md) + "\n")
    return "\n".join([f"ffn_share_dense={f:.4f}", f"ffn_work_fraction={work:.4f}", f"amdahl_limit={limit:.4f}",
                      f"op_profile_speedup={measured:.4f}",
                      f"dense_us_per_token={dense.wall_us_per_token:.1f}",
                      f"kairox_us_per_token={sparse.wall_us_per_token:.1f}"])


def _densities(text: str) -> list[float]:
    """--density as shares in (0, 1) (what pred_threshold_for accepts), checked up front."""
    dens = float_list(text, "--density")
    if any(not 0.0 < d < 1.0 for d in dens):
        raise click.BadParameter(f"expected a comma list of shares in (0, 1), got {text!r}",
                                 param_hint="'--density'")
    return dens


def _bench_synthetic(shape: str, dens: list[float], pred_rank: int, pred_type: str, prompts: tuple[str, ...],
                     n_predict: int, runs: int, warmup: int, threads: int, out: Path, label: str,
                     op_profile: bool, use_mmap: bool, down_dense_share: float = -1.0) -> None:
    """Synthetic random-weight models (speed only): dense vs sparse at each density."""
    console = stderr_console()
    spec = SparseSpec(pred_rank=pred_rank, pred_type=pred_type)
    root = cache_dir() / "synthetic"
    root.mkdir(parents=True, exist_ok=True)
    v = f"v{SYNTHETIC_VERSION}"
    dense_path = root / f"{shape}-q4_0-dense-{v}.gguf"
    sparse_path = root / (f"{shape}-q4_0-static-{v}.gguf" if pred_rank == 0
                          else f"{shape}-q4_0-pred{pred_rank}-{pred_type}-{v}.gguf")
    for path, sp in ((dense_path, None), (sparse_path, spec)):
        if not path.exists():
            with console.status(f"writing synthetic model {path.name} (random weights, speed only)"):
                write_synthetic_llama(path, SHAPES[shape], "q4_0", sp)
    for d in dens:
        cfg = BenchConfig(dense_model=dense_path, sparse_model=sparse_path, prompts=prompts, n_predict=n_predict,
                          runs=runs, warmup=warmup, threads=threads, gen_modes=("standard",), sparse_mode="predictor",
                          pred_threshold=pred_threshold_for(d, spec), chat=False,
                          label=f"{label or 'synthetic'} {shape} density={d} pred_rank={pred_rank}",
                          use_mmap=use_mmap, down_dense_share=down_dense_share)
        _run_and_report(cfg, out / f"{shape}-d{d:g}-r{pred_rank}", console, op_profile)
