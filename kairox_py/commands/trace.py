"""`kairox trace [MODEL] --kairox KX.gguf -o DIR`: record decode traces (kairox_py.sim.traces)."""
from __future__ import annotations

from pathlib import Path

import click
import numpy as np
from rich.table import Table

from ..benchmark.decode import load_prompts
from ..sim.traces import DEFAULT_SPARSITY, DEFAULT_STEPS, TraceOptions, record_traces
from ._common import resolve_model, stderr_console


@click.command("trace")
@click.argument("model", required=False)
@click.option("-o", "--out", "out_dir", type=click.Path(file_okay=False), required=True,
              help="Trace directory to write (a new or empty one, or an earlier trace, which is replaced).")
@click.option("--kairox", "kairox_path", type=click.Path(dir_okay=False), default=None,
              help="Kairox GGUF converted from MODEL: thresholds, predictors, neuron order, "
                   "group frequencies (without it: thresholds calibrated on the trace, no "
                   "predictor output).")
@click.option("--prompts", "prompts_path", type=click.Path(dir_okay=False), default=None,
              help="Prompt file, one per line (default: the project's prompt set).")
@click.option("--n-prompts", type=click.IntRange(min=1), default=None,
              help="Use only the first N prompts.")
@click.option("--steps", type=click.IntRange(min=2), default=DEFAULT_STEPS, show_default=True,
              help="Decode steps (generated tokens) per prompt.")
@click.option("--no-chat", is_flag=True, help="Do not wrap prompts in the chat template.")
@click.option("--temp", type=float, default=TraceOptions.temperature, show_default=True,
              help="Sampling temperature (0: greedy).")
@click.option("--top-p", type=click.FloatRange(0.0, 1.0, min_open=True), default=TraceOptions.top_p,
              show_default=True, help="Nucleus sampling.")
@click.option("--seed", type=int, default=0, show_default=True, help="Seed (prompt i uses seed + i).")
@click.option("--sparsity", type=click.FloatRange(0.0, 1.0, max_open=True), default=DEFAULT_SPARSITY,
              show_default=True, help="Threshold calibration target without --kairox.")
@click.option("-t", "--threads", type=click.IntRange(min=1), default=None, help="CPU threads.")
def trace(model: str | None, out_dir: str, kairox_path: str | None, prompts_path: str | None,
          n_prompts: int | None, steps: int, no_chat: bool, temp: float, top_p: float, seed: int,
          sparsity: float, threads: int | None) -> None:
    """Generate continuations of a prompt set with MODEL (default: the default model) and
    record, per decode step and layer, the active FFN neurons and the predictor's selection
    (bit-packed, memory-mapped) plus meta.json in --out. Input for `kairox simulate`."""
    console = stderr_console()
    path = resolve_model(model, console)
    opts = TraceOptions(n_steps=steps, chat=not no_chat, temperature=temp, top_p=top_p, seed=seed,
                        sparsity=sparsity, threads=threads)
    run_trace(path, Path(out_dir), kairox_path, prompts_path, n_prompts, opts, console)


def run_trace(path: Path, out_dir: Path, kairox_path: str | None, prompts_path: str | None,
              n_prompts: int | None, opts: TraceOptions, console) -> None:  # type: ignore[no-untyped-def]
    """Record traces and print their summary (shared by `kairox trace` and
    `kairox profile --generate`)."""
    prompts = load_prompts(prompts_path)
    if n_prompts is not None:
        prompts = prompts[:n_prompts]
    tr = record_traces(path, prompts, out_dir, kairox_path=kairox_path, opts=opts, console=console)
    m = tr.meta
    table = Table(title=f"kairox trace: {tr.dir}", title_justify="left")
    for c in ("sequences", "steps", "layers", "n_ff", "group size", "active", "predicted",
              "recall", "seconds"):
        table.add_column(c, justify="right")

    def pct(v: list[float]) -> str:
        return f"{100 * float(np.mean(v)):.1f}%" if v else "-"

    table.add_row(str(m.n_seq), str(m.n_steps), str(m.n_layer), str(m.n_ff), str(m.group_size),
                  pct(m.active_density), pct(m.predicted_density), pct(m.recall), f"{m.seconds:.0f}")
    console.print(table)
