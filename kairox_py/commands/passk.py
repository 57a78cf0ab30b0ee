"""`kairox passk [MODEL]`: pass@1 on Python function-completion tasks, the original GGUF
dense vs the Kairox GGUF dense and sparse (kairox_py/offline/code_tasks.py says how)."""
from __future__ import annotations

import click

from ..errors import KairoxError
from ..gguf_info import inspect_gguf
from ..offline.code_tasks import (
    DEFAULT_MAX_TOKENS,
    DEFAULT_TIMEOUT,
    load_tasks,
    markdown_report,
    run_settings,
    select_tasks,
    settings_for,
    write_results,
)
from ..outputs import check_output_into
from ._common import resolve_model, stderr_console


@click.command("passk")
@click.argument("model", required=False)
@click.option("--reference", type=click.Path(dir_okay=False), default=None,
              help="The original GGUF, scored dense too: the baseline of a conversion.")
@click.option("--tasks", "tasks_file", type=click.Path(dir_okay=False), default=None,
              help="A JSONL task file (id, prompt, entry_point, test per line; default: the "
                   "package's set).")
@click.option("--ids", default=None, help="Only these task ids, comma-separated.")
@click.option("--limit", type=click.IntRange(min=1), default=None, help="Only the first N tasks.")
@click.option("--max-tokens", type=click.IntRange(min=16), default=DEFAULT_MAX_TOKENS, show_default=True,
              help="Most tokens of one answer.")
@click.option("--timeout", type=click.FloatRange(min=0.5), default=DEFAULT_TIMEOUT, show_default=True,
              help="Seconds one answer's tests may run.")
@click.option("-o", "--out", "out_dir", type=click.Path(file_okay=False), default=None,
              help="Write results.md, results.csv and replies.jsonl here.")
@click.option("--only", "only", multiple=True, type=click.Choice(("original", "dense", "sparse")),
              help="Score only these settings (repeatable; default: every one the run has).")
@click.option("-t", "--threads", type=click.IntRange(min=1), default=None, help="CPU threads.")
def passk(model: str | None, reference: str | None, tasks_file: str | None, ids: str | None,
          limit: int | None, max_tokens: int, timeout: float, out_dir: str | None,
          only: tuple[str, ...], threads: int | None) -> None:
    """pass@1 (greedy) of MODEL (a GGUF; default: the default model) on Python
    function-completion tasks: each answer runs against the task's tests. A Kairox GGUF is
    scored dense and in its own sparse mode, a plain GGUF dense; --reference adds the
    original GGUF, dense."""
    console = stderr_console()
    # every check before the first model loads: a run takes minutes per setting
    if out_dir:
        check_output_into(out_dir)
    tasks = select_tasks(load_tasks(tasks_file), [i.strip() for i in ids.split(",") if i.strip()] if ids else (),
                         limit)
    if not tasks:
        raise KairoxError("no tasks selected")
    path = str(resolve_model(model, console))
    summaries = {p: inspect_gguf(p) for p in [path, *([reference] if reference else [])]}
    settings = settings_for(path, summaries[path].has_kairox_data, reference, only)
    results, replies = run_settings(settings, tasks, threads=threads, max_tokens=max_tokens, timeout=timeout,
                                    console=console)
    title = (f"pass@1 on {len(tasks)} Python function-completion tasks "
             f"(greedy, at most {max_tokens} tokens per answer)")
    report = markdown_report(results, title)
    click.echo(report, nl=False)
    if out_dir:
        files = write_results(results, replies, out_dir, report)
        console.print("wrote " + ", ".join(str(f) for f in files))

