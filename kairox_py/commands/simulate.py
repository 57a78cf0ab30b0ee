"""`kairox simulate TRACE`: replay decode traces through balancer policies (kairox_py.sim.replay)."""
from __future__ import annotations

from pathlib import Path

import click
from rich.table import Table

from ..balancer import POLICIES, Balancer, BalancerConfig
from ..errors import KairoxError
from ..hybrid import CLI_NAMES
from ..outputs import check_output_into
from ..progress import make_progress
from ..sim.figures import fig5, fig8, fig10, fig11, fig13
from ..sim.replay import (
    MODES,
    PRESETS,
    CostModel,
    CpuCalibration,
    SequenceData,
    SimConfig,
    calibration_from_csv,
    trace_cpu,
)
from ..sim.report import bar_markdown, bar_rows, cost_notes, run_grid, write_reports
from ..sim.traces import Trace
from ._common import float_list, stderr_console

#: budgets of the throughput-vs-VRAM figure (fig13), added to --budget with --figures
FIG13_BUDGETS = (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0)
#: `kairox run --policy` spellings accepted too (kairox_py.hybrid.POLICIES), so that both commands
#: take the same names; reports keep the balancer's own
POLICY_ALIASES = {cli: name for name, cli in CLI_NAMES.items()}


def _names(text: str, allowed: dict | tuple, what: str, aliases: dict[str, str] | None = None) -> list[str]:
    if text == "all":
        return list(allowed)
    aliases = aliases or {}
    names = [v.strip() for v in text.split(",") if v.strip()]
    bad = [n for n in names if n not in allowed and n not in aliases]
    if bad or not names:
        raise click.BadParameter(f"unknown {what} '{','.join(bad) or text}' (one of "
                                 f"{', '.join([*allowed, *aliases])}, or all)")
    return list(dict.fromkeys(aliases.get(n, n) for n in names))


@click.command("simulate")
@click.argument("trace_dir", metavar="TRACE", type=click.Path(file_okay=False))
@click.option("-o", "--out", "out_dir", type=click.Path(file_okay=False), default=None,
              help="Directory for summary/per-layer/per-token CSVs (and figures).")
@click.option("--preset", "presets", default="pc-low,pc-high", show_default=True,
              help=f"Hardware presets: {', '.join(PRESETS)} (comma-separated, or all).")
@click.option("--budget", "budgets", default="0.25,0.5,0.75", show_default=True,
              help="VRAM budgets: share of each layer's FFN groups the GPU holds (comma-separated).")
@click.option("--vram-mib", type=click.FloatRange(min=0.0), default=None,
              help="VRAM budget for the FFN cache in MiB (all layers) instead of --budget.")
@click.option("--policy", "policies", default="all", show_default=True,
              help=f"Policies: {', '.join(POLICIES)} (comma-separated, or all); tam adapts its swap "
                   "margin, tam_fixed (tam-t) nothing, tam_lambda (tam-lambda) its decay.")
@click.option("--mode", type=click.Choice(MODES), default="wait", show_default=True,
              help="wait: a layer's GPU FFN waits for its reloads (the paper's pipeline); "
                   "async: late groups run on the CPU instead.")
@click.option("--kind", type=click.Choice(["predicted", "active"]), default="predicted",
              show_default=True, help="Neurons computed per step: the predictor's selection, or "
                                      "the true active set (an exact predictor).")
@click.option("--group-size", type=click.IntRange(min=1), default=None,
              help="Neurons per group (default: the trace's Kairox GGUF's).")
@click.option("--lambda", "lam", type=float, default=BalancerConfig.lambda_init, show_default=True,
              help="TAM decay (tam_lambda's initial value, whose range it widens when outside "
                   "the default --lambda-min/--lambda-max).")
@click.option("--lambda-min", type=float, default=None,
              help=f"tam_lambda's lowest lambda (default: {BalancerConfig.lambda_min}, or --lambda "
                   "when that is lower).")
@click.option("--lambda-max", type=float, default=None,
              help=f"tam_lambda's highest lambda (default: {BalancerConfig.lambda_max}, or --lambda "
                   "when that is higher).")
@click.option("--alpha", type=float, default=BalancerConfig.alpha, show_default=True,
              help="Adaptation rate of tam_lambda's lambda (and of the load cap).")
@click.option("--eps", type=float, default=BalancerConfig.eps, show_default=True,
              help="One-hit-wonder margin: tau = (1 - lambda) + eps.")
@click.option("--max-loads", type=click.IntRange(min=0), default=0, show_default=True,
              help="Most group loads per layer and step (0: no cap).")
@click.option("--adapt-cap/--no-adapt-cap", default=BalancerConfig.adapt_cap, show_default=True,
              help="Adapt the load cap from the bottleneck feedback too.")
@click.option("--cpu-csv", type=click.Path(dir_okay=False), default=None,
              help="CPU calibration: `test-kairox-ops perf -o F.csv` output for the model's FFN "
                   "shape (default: the trace's own table, which a workload carries in meta.json, "
                   "else the built-in measurement of the default model).")
@click.option("--n-seq", type=click.IntRange(min=1), default=None,
              help="Replay only the first N sequences of the trace.")
@click.option("--figures", is_flag=True,
              help="Also write the paper's figures 5, 8, 10, 11, 13 (PNG + CSV) and bar.md "
                   "into --out (adds the budgets of figure 13).")
def simulate(trace_dir: str, out_dir: str | None, presets: str, budgets: str, vram_mib: float | None,
             policies: str, mode: str, kind: str, group_size: int | None, lam: float,
             lambda_min: float | None, lambda_max: float | None, alpha: float, eps: float, max_loads: int,
             adapt_cap: bool, cpu_csv: str | None, n_seq: int | None, figures: bool) -> None:
    """Replay the decode trace TRACE (from `kairox trace`) through balancer policies with a
    GPU+CPU cost model of the paper's PCs; prints throughput, CPU/I/O time, stalls, hit rate
    and bytes moved per token, and writes per-token and per-layer reports with --out."""
    console = stderr_console()
    console.width = max(console.width, 132)  # the table has 11 columns
    if figures and not out_dir:
        raise click.UsageError("--figures needs --out")
    trace = Trace(trace_dir)
    preset_names = _names(presets, PRESETS, "preset")
    policy_names = _names(policies, POLICIES, "policy", POLICY_ALIASES)
    if n_seq is not None and n_seq > trace.n_seq:
        raise click.BadParameter(f"the trace has {trace.n_seq} sequence{'s' * (trace.n_seq != 1)}, "
                                 f"not {n_seq}", param_hint="'--n-seq'")
    if out_dir:  # before the simulations, not after them
        check_output_into(out_dir)
    # the CPU table: --cpu-csv, else the trace's own (a workload carries one for its shape),
    # else the built-in measurement of the default model
    cpu = trace_cpu(trace) if cpu_csv is None else _calibration(cpu_csv, trace)
    gs = group_size or trace.meta.group_size
    if trace.n_ff % gs:
        raise KairoxError(f"--group-size {gs} does not divide the FFN width {trace.n_ff}")
    n_groups = trace.n_ff // gs
    if vram_mib is not None:
        probe = CostModel.build(trace, PRESETS[preset_names[0]], cpu, gs)
        k = int(vram_mib * 2**20 // (probe.group_bytes * trace.n_layer))
        budget_list = [min(1.0, k / n_groups)]
    else:
        budget_list = float_list(budgets, "--budget")
    if any(not 0.0 <= b <= 1.0 for b in budget_list):
        raise click.BadParameter("values must be in [0, 1]", param_hint="'--budget'")
    grid = sorted(set(budget_list) | (set(FIG13_BUDGETS) if figures else set()))
    # adaptive TAM starts inside [lambda_min, lambda_max]: a --lambda outside the default range
    # moves that bound, while bounds the user gave are kept and must hold it
    if not 0.0 < lam < 1.0:
        raise click.BadParameter("must be in (0, 1)", param_hint="'--lambda'")
    if lambda_min is None:
        lambda_min = min(BalancerConfig.lambda_min, lam)
    elif lambda_min > lam:
        raise click.UsageError(f"--lambda {lam:g} is below --lambda-min {lambda_min:g}")
    if lambda_max is None:
        lambda_max = max(BalancerConfig.lambda_max, lam)
    elif lambda_max < lam:
        raise click.UsageError(f"--lambda {lam:g} is above --lambda-max {lambda_max:g}")
    bal = BalancerConfig(lambda_init=lam, lambda_min=lambda_min, lambda_max=lambda_max, alpha=alpha,
                         eps=eps, max_loads=max_loads, adapt_cap=adapt_cap)
    Balancer([1], [1], bal).close()  # bad hyperparameters: one error line before any progress
    base = SimConfig(balancer=bal, mode=mode, kind=kind, group_size=gs)
    seqs = list(range(n_seq)) if n_seq else None
    data = SequenceData(trace, kind, gs, seqs)
    total = len(preset_names) * len(grid) * len(policy_names)
    with make_progress(console) as bar:
        task = bar.add_task("simulating", total=total)
        runs = run_grid(data, cpu, preset_names, grid, policy_names, base,
                        tick=lambda _label: bar.advance(task))
    shown = [r for r in runs if r.config.budget in budget_list]
    _print_table(console, shown, trace, gs, mode, kind)
    if out_dir:
        out = Path(out_dir)
        notes = {p: cost_notes(CostModel.build(trace, PRESETS[p], cpu, gs)) for p in preset_names}
        paths = write_reports(out, runs, notes)
        if figures:
            mid = budget_list[len(budget_list) // 2]
            with make_progress(console) as bar:
                task = bar.add_task("figures", total=5)
                paths += fig8(trace, out, gs)
                bar.advance(task)
                paths += fig5(runs, out, preset_names[0], budget_list[:2])
                bar.advance(task)
                paths += fig10(runs, out, preset_names, mid)
                bar.advance(task)
                paths += fig11(runs, out, preset_names[0], mid)
                bar.advance(task)
                paths += fig13(runs, out, preset_names)
                bar.advance(task)
            rows = bar_rows(shown)
            if rows:
                p = out / "bar.md"
                p.write_text(bar_markdown(rows) + "\n")
                paths.append(p)
        console.print("wrote " + ", ".join(str(p) for p in paths))


def _calibration(path: str, trace: Trace) -> CpuCalibration:
    types = trace.meta.costs.get("types", {})
    return calibration_from_csv(path, trace.meta.n_embd, trace.meta.n_ff,
                                types.get("up", "q4_1"), types.get("down", "q8_0"))


def _print_table(console, runs, trace: Trace, gs: int, mode: str, kind: str) -> None:  # type: ignore[no-untyped-def]
    table = Table(title=f"kairox simulate: {trace.dir} ({trace.meta.n_seq} x {trace.n_steps} steps, "
                        f"group size {gs}, {kind} neurons, {mode} pipeline)", title_justify="left")
    cols = ("preset", "budget", "policy", "tok/s", "CPU ms", "I/O ms", "I/O stall", "CPU stall",
            "hit", "MB/tok", "lambda")
    for c in cols:
        table.add_column(c, justify="right" if c not in ("preset", "policy") else "left")
    for r in runs:
        s = r.summary
        table.add_row(str(s["preset"]), f"{s['budget']:g}", str(s["policy"]), f"{s['tok_s']:.1f}",
                      f"{s['cpu_ms']:.3f}", f"{s['io_ms']:.3f}", f"{s['io_stall_ms']:.3f}",
                      f"{s['cpu_stall_ms']:.3f}", f"{100 * s['hit_rate']:.1f}%", f"{s['mb_moved']:.2f}",
                      f"{s['lambda']:.2f}")
    console.print(table)

