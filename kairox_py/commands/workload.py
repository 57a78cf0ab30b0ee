"""`kairox workload PRESET -o DIR`: synthetic activation workloads (kairox_py.workload), and
`--compare TRACE`: a workload's statistics next to a recorded trace's."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click
from rich.console import Console
from rich.table import Table

from ..errors import KairoxError
from ..outputs import check_output_dir, check_output_into
from ..progress import make_progress
from ..sim.traces import Trace
from ..workload.compare import DESCRIPTIONS, compare, write_report
from ..workload.model import PRESETS, WorkloadParams, resolve
from ..workload.shapes import SHAPES, TYPE_BYTES
from ..workload.stats import Stats, measure, stats_to_json
from ..workload.write import WORKLOAD_FILES, open_workload, workload_info, write_workload
from ._common import stderr_console

#: generator fields --set may change (the shape and the draw have their own options)
SETTABLE = tuple(k for k in WorkloadParams.__dataclass_fields__
                 if k not in ("preset", "shape", "n_seq", "n_steps", "seed", "group_size"))


def _sets(values: tuple[str, ...]) -> dict[str, Any]:
    """--set NAME=VALUE pairs as typed overrides (a usage error for anything else)."""
    out: dict[str, Any] = {}
    for v in values:
        name, eq, text = v.partition("=")
        name = name.strip().replace("-", "_")
        if not eq or name not in SETTABLE:
            raise click.BadParameter(f"expected NAME=VALUE with NAME one of {', '.join(SETTABLE)}; "
                                     f"got {v!r}", param_hint="'--set'")
        kind = WorkloadParams.__dataclass_fields__[name].type
        try:
            out[name] = int(text) if kind in (int, "int") else float(text)
        except ValueError:
            raise click.BadParameter(f"{name}: not a number: {text!r}", param_hint="'--set'") from None
    return out


@click.command("workload")
@click.argument("source", metavar="PRESET|DIR")
@click.option("-o", "--out", "out_dir", type=click.Path(file_okay=False), default=None,
              help="Workload directory to write (a new or empty one, or an earlier workload); "
                   "with --compare: the report directory (the workload goes to its workload/).")
@click.option("--compare", "trace_dir", type=click.Path(file_okay=False), default=None,
              help="A trace from `kairox trace`: draw the workload's Figure 8 reactivation heatmap, "
                   "Figure 4 cold counts and frequency CDF next to the trace's and print the "
                   "distances. A preset is generated at the trace's shape, sequences and steps "
                   "unless options say otherwise.")
@click.option("--seed", type=int, default=0, show_default=True, help="The random draw.")
@click.option("--steps", type=click.IntRange(min=2), default=None,
              help="Decode steps per sequence (default 256).")
@click.option("--seqs", type=click.IntRange(min=1), default=None, help="Sequences (default 4).")
@click.option("--layers", type=click.IntRange(min=1), default=None,
              help="Layers (default: the shape's).")
@click.option("--shape", type=click.Choice(list(SHAPES)), default=None,
              help="Model shape (default: the preset's, llama2-7b).")
@click.option("--n-ff", type=click.IntRange(min=8), default=None, help="FFN width (a multiple of 8).")
@click.option("--n-embd", type=click.IntRange(min=1), default=None, help="Hidden size (costs only).")
@click.option("--weight-type", type=click.Choice(list(TYPE_BYTES)), default=None,
              help="Weight type the simulator's costs assume (default: the shape's).")
@click.option("--group-size", type=click.IntRange(min=1), default=None,
              help="Neurons per group (default 32).")
@click.option("--density", type=click.FloatRange(0.0, 1.0, min_open=True, max_open=True), default=None,
              help="Mean share of a layer's neurons active per step.")
@click.option("--recall", type=click.FloatRange(0.0, 1.0, min_open=True), default=None,
              help="The predictor's recall.")
@click.option("--precision", type=click.FloatRange(0.0, 1.0, min_open=True), default=None,
              help="The predictor's precision.")
@click.option("--set", "sets", multiple=True, metavar="NAME=VALUE",
              help="Any other model parameter, e.g. --set window_cold=1.5 (docs/workloads.md).")
@click.option("--no-stats", is_flag=True, help="Do not measure the written workload.")
def workload(source: str, out_dir: str | None, trace_dir: str | None, seed: int, steps: int | None,
             seqs: int | None, layers: int | None, shape: str | None, n_ff: int | None,
             n_embd: int | None, weight_type: str | None, group_size: int | None,
             density: float | None, recall: float | None, precision: float | None,
             sets: tuple[str, ...], no_stats: bool) -> None:
    """Generate the synthetic activation workload PRESET (relu-7b: a 7B ReLU model at ~10%
    active, fitted to the papers' figures; silu-7b: ~50% active, fitted to our SiLU traces)
    into --out, in the trace format `kairox simulate` reads: per layer and decode step the
    active neurons and the predictor's selection. DIR instead of PRESET measures an existing
    workload (or compares it with --compare)."""
    console = stderr_console()
    console.width = max(console.width, 120)  # the tables have long descriptions
    overrides = {"seed": seed, "n_steps": steps, "n_seq": seqs, "n_layer": layers, "shape": shape,
                 "n_ff": n_ff, "n_embd": n_embd, "weight_type": weight_type, "group_size": group_size,
                 "density": density, "recall": recall, "precision": precision, **_sets(sets)}
    given = {k: v for k, v in overrides.items() if v is not None and not (k == "seed" and v == 0)}
    is_preset = source in PRESETS
    if not is_preset and not Path(source).is_dir():
        raise KairoxError(f"'{source}' is neither a workload preset ({', '.join(PRESETS)}) nor a "
                          f"directory")
    if not is_preset and given:
        raise click.UsageError(f"options that shape a workload ({', '.join(sorted(given))}) need a "
                               f"PRESET, not the directory {source}")
    trace = Trace(trace_dir) if trace_dir else None  # a bad trace fails before generating
    if trace is not None:
        if not out_dir:
            raise click.UsageError("--compare needs --out for the report")
        report_dir = check_output_into(out_dir)
        report_dir.mkdir(exist_ok=True)
    if is_preset:
        if trace is not None:  # the trace's dimensions unless the options say otherwise
            m = trace.meta
            for k, v in (("n_layer", m.n_layer), ("n_ff", m.n_ff), ("n_embd", m.n_embd),
                         ("n_seq", m.n_seq), ("n_steps", m.n_steps), ("group_size", m.group_size)):
                if overrides.get(k) is None and not (k in ("n_ff", "n_embd", "n_layer") and shape):
                    overrides[k] = v
        params = resolve(source, **overrides)
        if trace is None and not out_dir:
            raise click.UsageError("give --out DIR for the workload")
        if trace is not None:
            wl_dir = report_dir / "workload"
        else:
            wl_dir = Path(out_dir)  # type: ignore[arg-type]
        check_output_dir(wl_dir, WORKLOAD_FILES, "workload")  # before minutes of generating
        with make_progress(console) as bar:
            task = bar.add_task(f"generating {source}", total=params.n_seq * params.n_steps)
            wl = write_workload(params, wl_dir, tick=lambda: bar.advance(task))
        console.print(f"wrote {wl.dir} ({params.n_seq} x {params.n_steps} steps, "
                      f"{params.shape.n_layer} layers x {params.shape.n_ff}, seed {params.seed}, "
                      f"{wl.meta.seconds:.0f} s)")
        label = f"{source} (seed {params.seed})"
    else:
        wl, params = open_workload(source)
        wl_dir = Path(source)
        label = f"{params.preset} ({wl_dir.name}, seed {params.seed})"
    if no_stats and trace is None:
        return
    wl_stats = _measure(wl, console, "measuring workload")
    (wl_dir / "stats.json").write_text(json.dumps(stats_to_json(wl_stats), indent=1))
    if trace is None:
        _print_stats(console, wl_stats, workload_info(wl_dir).get("expected", {}), wl_dir)
        return
    tr_stats = _measure(trace, console, "measuring trace")
    rows = compare(wl_stats, tr_stats)
    tr_label = Path(trace.meta.model_path).name
    paths = write_report(report_dir, wl_stats, tr_stats, rows, label, tr_label)
    table = Table(title=f"kairox workload --compare: {label} vs {trace.dir}", title_justify="left")
    for c in ("metric", "workload", "trace", "distance", "what"):
        table.add_column(c, justify="left" if c in ("metric", "what") else "right")
    for r in rows:
        table.add_row(r.metric, _fmt(r.workload), _fmt(r.trace), _fmt(r.distance), r.what)
    console.print(table)
    console.print("wrote " + ", ".join(str(p) for p in paths))


def _measure(trace: Trace, console: Console, what: str) -> Stats:
    with make_progress(console) as bar:
        task = bar.add_task(what, total=2 * trace.n_seq)
        return measure(trace, tick=lambda: bar.advance(task))


def _fmt(v: float) -> str:
    if v != v:  # NaN
        return "-"
    return f"{v:.0f}" if abs(v) >= 100 else f"{v:.3f}"


def _print_stats(console: Console, st: Stats, expected: dict[str, float], where: Path) -> None:
    table = Table(title=f"kairox workload: {where} (measured; expected from the model's "
                        f"probabilities where it has them)", title_justify="left")
    for c in ("statistic", "measured", "expected", "what"):
        table.add_column(c, justify="left" if c in ("statistic", "what") else "right")
    for k, v in st.summary().items():
        e = expected.get(k)
        table.add_row(k, _fmt(v), _fmt(e) if e is not None else "", DESCRIPTIONS.get(k, ""))
    console.print(table)
