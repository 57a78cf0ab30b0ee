"""`kairox calibrate`: measure where the sparse down projection should read ffn_down in order."""
from __future__ import annotations

from pathlib import Path

import click
from rich.table import Table

from .. import _lib
from ..llama import default_threads
from ..offline.calibrate import DEFAULT_PROMPT, measure, write_calibration
from ..outputs import check_output_file
from ._common import stderr_console


@click.command("calibrate")
@click.argument("model", type=click.Path(dir_okay=False))
@click.option("-t", "--threads", type=click.IntRange(min=1, max=4096), default=default_threads(),
              show_default=True, help="CPU threads (calibrate with the count you will run with).")
@click.option("-n", "--tokens", type=click.IntRange(min=1, max=400), default=32, show_default=True,
              help="Decode steps timed per round and path.")
@click.option("--rounds", type=click.IntRange(min=1), default=3, show_default=True,
              help="Rounds; the paths alternate within each, and each path's fastest round counts. "
                   "Up to 3x as many run while the two fastest rounds of a path differ by over 5% "
                   "(a busy machine); if they still do, calibrate stops without writing.")
@click.option("--mode", type=click.Choice([m for m in _lib.KAIROX_MODES if m != "dense"]), default="auto",
              show_default=True, help="Sparse mode to calibrate (auto: the model's own).")
@click.option("-p", "--prompt", default=DEFAULT_PROMPT, help="Prompt whose greedy continuation is timed.")
@click.option("--write/--no-write", default=True, show_default=True,
              help="Store the crossover (kairox.down_dense_share) and, in threshold mode, the faster "
                   "gate/up path (kairox.gate_up_rows) in MODEL.")
def calibrate(model: str, threads: int, tokens: int, rounds: int, mode: str, prompt: str,
              write: bool) -> None:
    """Time MODEL's sparse down projection both ways on this machine (ffn_down read in order, and
    the axpy over down_t's active rows) and store the share of active neurons where they cross
    in MODEL, so that kairox run, llama-cli and llama-server pick the faster path here. In
    threshold mode it also times gate and up (computed whole for the mask) through the sparse
    op's row kernels and through ggml's mat-vec, and stores the faster."""
    console = stderr_console()
    path = Path(model).expanduser()
    if write and path.is_file():  # before the timing, not after it (a missing file: Model says so)
        # the share is written in place, or the file rewritten through a sibling temporary
        check_output_file(path)
    cal = measure(path, threads, tokens, rounds, mode, prompt, console)
    table = Table(title=f"Sparse down crossover: {path.name}", title_justify="left")
    table.add_column("")
    table.add_column("", justify="right")
    for k, v in cal.rows():
        table.add_row(k, v)
    console.print(table)
    if write:
        write_calibration(path, cal, console)
        console.print(f"wrote kairox.down_dense_share = {cal.share:.3f} to {path}"
                      + (f", kairox.gate_up_rows = {cal.gate_up_rows}" if cal.gate_up_rows >= 0 else ""))
    click.echo(f"{cal.share:.4f}")
