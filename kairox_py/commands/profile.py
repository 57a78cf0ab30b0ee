"""`kairox profile MODEL`: record FFN activations into a profile directory."""
from __future__ import annotations

from pathlib import Path

import click
from rich.table import Table

from ..offline.corpus import load_corpus
from ..offline.profile import DEFAULT_CTX, DEFAULT_TOKENS, run_profile
from ..offline.selftext import with_self_text
from ..outputs import check_output_dir
from ..sim.traces import DEFAULT_STEPS, TRACE_FILES, TraceOptions
from ._common import activation_option, resolve_model, stderr_console
from .trace import run_trace


@click.command("profile")
@click.argument("model", required=False)
@click.option("-o", "--out", "out_dir", type=click.Path(file_okay=False), required=True,
              help="Profile directory to write (a new or empty one, or an earlier profile, which is replaced).")
@click.option("--corpus", multiple=True, type=click.Path(dir_okay=False),
              help="Text file(s) (default: pydoc topics, profiling split).")
@click.option("--tokens", type=click.IntRange(min=1), default=DEFAULT_TOKENS, show_default=True,
              help="Most tokens to record (a bounded sample spread over the corpus).")
@click.option("--ctx", type=click.IntRange(min=32), default=DEFAULT_CTX, show_default=True,
              help="Tokens per decode chunk (a fresh context each).")
@click.option("-t", "--threads", type=click.IntRange(min=1), default=None, help="CPU threads.")
@click.option("--sparsity", type=click.FloatRange(0.0, 1.0, max_open=True), default=0.5,
              show_default=True, help="Sparsity for the summary's thresholds.")
@activation_option("to profile with")
@click.option("--self-text", "self_text", type=click.IntRange(min=0), default=0, show_default=True,
              help="Also profile this many tokens of the model's own sampled answers to a varied "
                   "prompt set, half and half with the corpus (cached).")
@click.option("--generate", "generate_dir", type=click.Path(file_okay=False), default=None,
              help="Also record decode traces of generated continuations of the prompt set "
                   "into this directory (what `kairox trace` records; input for `kairox simulate`).")
@click.option("--kairox", "kairox_path", type=click.Path(dir_okay=False), default=None,
              help="With --generate: the Kairox GGUF whose thresholds and predictors define the masks.")
@click.option("--prompts", "prompts_path", type=click.Path(dir_okay=False), default=None,
              help="With --generate: prompt file, one per line (default: the project's prompt set).")
@click.option("--steps", type=click.IntRange(min=2), default=DEFAULT_STEPS, show_default=True,
              help="With --generate: decode steps per prompt.")
def profile(model: str | None, out_dir: str, corpus: tuple[str, ...], tokens: int, ctx: int,
            threads: int | None, sparsity: float, activation: str, self_text: int, generate_dir: str | None, kairox_path: str | None,
            prompts_path: str | None, steps: int) -> None:
    """Run MODEL (default: the default model) on text and record per-layer FFN inputs and
    activations (float16, memory-mapped .npy) plus meta.json in --out; with --generate, also
    the decode traces of generated continuations (the paper's 256-step sequences)."""
    if (kairox_path or prompts_path) and not generate_dir:
        raise click.UsageError("--kairox and --prompts go with --generate")
    if generate_dir:  # before the profile's minutes, not after them
        check_output_dir(generate_dir, TRACE_FILES, "trace")
    console = stderr_console()
    path = resolve_model(model, console)
    text = with_self_text(load_corpus(list(corpus), "profile"), path, self_text, threads=threads, console=console,
                          activation=activation)
    prof = run_profile(path, text, Path(out_dir), n_tokens=tokens, ctx=ctx, threads=threads,
                       console=console, activation=activation)
    thr = prof.thresholds(sparsity)
    table = Table(title=f"kairox profile: {prof.dir}", title_justify="left")
    for c in ("tokens", "layers", "n_embd", "n_ff", "activation", f"threshold@{sparsity} (min/max)",
              "seconds"):
        table.add_column(c, justify="right")
    m = prof.meta
    table.add_row(str(m.n_tokens), str(m.n_layer), str(m.n_embd), str(m.n_ff), m.activation,
                  f"{thr.min():.4g}/{thr.max():.4g}", f"{m.seconds:.1f}")
    console.print(table)
    if generate_dir:
        run_trace(path, Path(generate_dir), kairox_path, prompts_path, None,
                  TraceOptions(n_steps=steps, threads=threads), console)
