"""Helpers shared by subcommands: where the model comes from, where chatter goes."""
from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import click
from rich.console import Console

from .._lib import KAIROX_ACTIVATIONS
from ..default_model import ensure_model


def activation_option(what: str) -> Callable[[Any], Any]:
    """--activation, as every command that runs the FFN takes it; `what` says what the command
    does with it."""
    return click.option("--activation", type=click.Choice(list(KAIROX_ACTIVATIONS)), default="model",
                        show_default=True,
                        help=f"The FFN activation {what}: model (its kairox.activation, else its "
                             "architecture's) or an override (relu: a ReLU-fied llama, ProSparse/Bamboo/"
                             "ReluLLaMA, whose GGUF says llama).")


def stderr_console() -> Console:
    """Progress, tables and notes go to stderr so stdout carries only the result."""
    return Console(stderr=True, highlight=False, soft_wrap=True)


def resolve_model(model: str | None, console: Console) -> Path:
    """The MODEL argument as a path; None means the default model (fetched on first use)."""
    if model is None:
        return ensure_model(console=console)
    return Path(model).expanduser()


def float_list(text: str, option: str) -> list[float]:
    """A comma list of numbers given to `option` (e.g. "--scales"), a usage error otherwise."""
    hint = f"'{option}'"
    try:
        vals = [float(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise click.BadParameter(f"expected comma-separated numbers, got {text!r}", param_hint=hint) from None
    if not vals:
        raise click.BadParameter("no values", param_hint=hint)
    return vals
