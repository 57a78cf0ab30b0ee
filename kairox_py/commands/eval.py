"""`kairox eval MODEL`: held-out perplexity with every token through the sparse FFN,
optionally a sweep of settings against the dense original."""
from __future__ import annotations

import math
from pathlib import Path

import click

from ..errors import KairoxError
from ..offline.corpus import load_corpus
from ..offline.evaluate import (
    DEFAULT_CTX,
    DEFAULT_EVAL_TOKENS,
    EvalSetting,
    markdown_table,
    run_sweep,
    sweep_title,
    write_sweep,
)
from ..outputs import check_output_into
from ._common import float_list, resolve_model, stderr_console


@click.command("eval")
@click.argument("models", nargs=-1)
@click.option("--reference", type=click.Path(dir_okay=False), default=None,
              help="The original (dense) GGUF: dense perplexity and top-1 agreement.")
@click.option("--mode", type=click.Choice(["auto", "dense", "predictor", "threshold", "cats"]),
              default="auto", show_default=True, help="Sparse mode (auto: the model's own).")
@click.option("--scales", default=None,
              help="Sweep threshold_scale over these values, e.g. 0.5,1,1.5 (threshold/CATS).")
@click.option("--pred-thresholds", default=None,
              help="Also evaluate predictor mode at these probability thresholds, e.g. 0.3,0.5,0.7.")
@click.option("--corpus", multiple=True, type=click.Path(dir_okay=False),
              help="Evaluation text file(s) (default: pydoc topics, held-out split).")
@click.option("--tokens", type=click.IntRange(min=16), default=DEFAULT_EVAL_TOKENS,
              show_default=True, help="Most tokens of text to score, in chunks of --ctx (the last "
                                      "may be shorter; a tail under a quarter chunk is dropped).")
@click.option("--ctx", type=click.IntRange(min=32), default=DEFAULT_CTX, show_default=True,
              help="Tokens per chunk (one decode call each).")
@click.option("-o", "--out", "out_dir", type=click.Path(file_okay=False), default=None,
              help="Write results.md, results.csv and ppl.png here.")
@click.option("-t", "--threads", type=click.IntRange(min=1), default=None, help="CPU threads.")
def eval_cmd(models: tuple[str, ...], reference: str | None, mode: str, scales: str | None,
             pred_thresholds: str | None, corpus: tuple[str, ...], tokens: int, ctx: int,
             out_dir: str | None, threads: int | None) -> None:
    """Perplexity of MODELS (Kairox GGUFs; default: the default model) on held-out text,
    every token through the sparse FFN with its own mask."""
    console = stderr_console()
    # every check before the first model loads: a sweep runs for minutes
    scale_vals = float_list(scales, "--scales") if scales else []
    if any(not (v > 0 and math.isfinite(v)) for v in scale_vals):
        raise click.BadParameter("threshold scales must be positive", param_hint="'--scales'")
    pred_vals = float_list(pred_thresholds, "--pred-thresholds") if pred_thresholds else []
    if any(not 0 < v < 1 for v in pred_vals):
        raise click.BadParameter("must be in (0, 1)", param_hint="'--pred-thresholds'")
    if out_dir:
        check_output_into(out_dir)
    paths = [str(resolve_model(m, console)) for m in models] or [str(resolve_model(None, console))]
    for p in [*paths, *([reference] if reference else [])]:
        if not Path(p).is_file():
            raise KairoxError(f"model file not found: {p}")
    settings: list[EvalSetting] = []
    for p in paths:
        name = Path(p).stem
        settings += [EvalSetting(p, mode, threshold_scale=v, label=f"{name} x{v:g}") for v in scale_vals]
        settings += [EvalSetting(p, "predictor", pred_threshold=v, label=f"{name} p={v:g}")
                     for v in pred_vals]
        if not scale_vals and not pred_vals:
            settings.append(EvalSetting(p, mode, label=f"{name} ({mode})"))
    text = load_corpus(list(corpus), "eval")
    results = run_sweep(reference, settings, text, n_tokens=tokens, ctx=ctx, threads=threads,
                        console=console)
    title = sweep_title(results[1:] if reference else results, text.description)
    click.echo(markdown_table(results, title))
    if out_dir:
        files = write_sweep(results, out_dir, title)
        console.print("wrote " + ", ".join(str(f) for f in files))
