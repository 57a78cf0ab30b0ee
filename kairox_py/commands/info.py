"""`kairox info`: what a GGUF file holds (shape, types, Kairox data), without loading it."""
from __future__ import annotations

import click
from rich.console import Console

from ..gguf_info import inspect_gguf, render
from ._common import resolve_model, stderr_console


@click.command("info")
@click.argument("model", required=False)
def info(model: str | None) -> None:
    """Summarise MODEL (a GGUF file; default: the default model): architecture, sizes,
    parameters, bytes per tensor type, and whether it carries Kairox sparsity data."""
    path = resolve_model(model, stderr_console())
    render(inspect_gguf(path), Console(highlight=False))
