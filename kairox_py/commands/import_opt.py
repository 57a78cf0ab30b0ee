"""`kairox import-opt HF_DIR OUT.gguf`: a Hugging Face OPT checkpoint as a GGUF (kairox_py.offline.hf_opt),
the input `kairox convert` then takes."""
from __future__ import annotations

import click

from ..offline.hf_opt import import_opt as run_import
from ._common import stderr_console


@click.command("import-opt")
@click.argument("src", type=click.Path(file_okay=False, path_type=str))
@click.argument("out", type=click.Path(dir_okay=False, path_type=str))
@click.option("--type", "dtype", type=click.Choice(["f16", "f32"]), default="f16", show_default=True,
              help="Type of the weight matrices (norms and biases stay f32).")
def import_opt(src: str, out: str, dtype: str) -> None:
    """Write the OPT checkpoint in SRC (config.json, vocab.json, merges.txt, safetensors
    weights, as Hugging Face saves them) as a GGUF at OUT (written atomically). llama.cpp has
    no converter for OPT; our patches add the architecture."""
    console = stderr_console()
    path = run_import(src, out, dtype, console)
    console.print(f"wrote {path}")
