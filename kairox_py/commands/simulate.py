"""`kairox simulate TRACE`: replay decode traces through balancer policies (kairox_py.simulate)."""
from __future__ import annotations

import click


@click.command("simulate")
@click.argument("trace_dir", metavar="TRACE")
def simulate(trace_dir: str) -> None:
    """Replay a decode trace through the balancer policies with a GPU+CPU cost model."""
    raise click.ClickException("not implemented yet")
