#!/usr/bin/env python3
"""The balancer on synthetic 7B workloads: every policy, both PCs, budgets 0.1-0.9, several seeds.

    python3 scripts/workload_sweep.py [--presets relu-7b,silu-7b] [--seeds 0,1,2]
        [--held-out 7,11,23] [--steps 256] [--seqs 4] [--out bench-out/workload-sweep]

Why: issue 34's bar ("adaptive TAM >= every other policy on relu-7b, for every seed, at budgets
0.25/0.5/0.75 on pc-low and pc-high, Top-K moving >= 1.5x TAM's bytes; within 2% of the best
on silu-7b") must be checked on seeds nobody tuned on, so this script generates each workload
(`kairox workload` machinery), replays it through `kairox simulate`'s machinery (the C++
balancer, the cost model, the workload's own CPU table) and checks every cell. The held-out
seeds run last and are marked in every table.

Writes under --out:

* ``sweep.csv``: one row per simulation (workload, seed, PC, budget, policy, throughput, CPU
  and I/O time, stalls, hit rate, bytes moved, mean lambda, ...);
* ``bar.csv``, ``bar.md``: the bar, one row per cell, pass or fail;
* ``summary.md``: the bar's verdict per workload, and each policy's throughput relative to
  adaptive TAM (mean, min and max over seeds) per workload, PC and budget;
* ``sweep.png``: TAM / best other policy per cell, and Top-K's bytes / TAM's;
* ``figures/WORKLOAD/``: the paper's Figures 5, 10, 11 and 13 (PNG + CSV) and the
  simulator's summary/per-layer/per-token CSVs, for the first seed of each workload.

Workloads go to --workloads (default: --out/workloads) and are deleted after their
simulations unless --keep-workloads (a 4 x 256-step 7B workload takes ~90 MB). The script
runs on one core (generation and replay are single-threaded).
"""
from __future__ import annotations

import os

# one core: numpy's BLAS is not needed here, so keep its thread pools from starting
for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import argparse  # noqa: E402
import csv  # noqa: E402
import math  # noqa: E402
import shutil  # noqa: E402
import sys  # noqa: E402
from collections.abc import Callable, Sequence  # noqa: E402
from dataclasses import dataclass  # noqa: E402
from pathlib import Path  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402

from kairox_py.balancer import POLICIES, Balancer, BalancerConfig  # noqa: E402
from kairox_py.errors import KairoxError  # noqa: E402
from kairox_py.progress import make_progress  # noqa: E402
from kairox_py.sim.figures import fig5, fig10, fig11, fig13  # noqa: E402
from kairox_py.sim.replay import PRESETS, CostModel, SequenceData, SimConfig, trace_cpu  # noqa: E402
from kairox_py.sim.report import RunRecord, SUMMARY_COLUMNS, cost_notes, run_grid, write_reports  # noqa: E402
from kairox_py.sim.sweep import BAR_BUDGETS, RULES, BarCell, bar_cells, cells_markdown, write_cells_csv  # noqa: E402
from kairox_py.sim.traces import Trace  # noqa: E402
from kairox_py.workload import PRESETS as WORKLOAD_PRESETS  # noqa: E402
from kairox_py.workload import WorkloadParams, open_workload, resolve, write_workload  # noqa: E402

BUDGETS = (0.1, 0.2, 0.25, 0.3, 0.4, 0.5, 0.6, 0.7, 0.75, 0.8, 0.9)
FIG5_BUDGETS = (0.25, 0.5)  # static placement vs LRU, as `kairox simulate --figures` draws it
FIG_BUDGET = 0.5  # Figures 10 and 11


@dataclass(frozen=True)
class Job:
    """One workload to generate and replay."""

    preset: str
    seed: int
    held_out: bool
    figures: bool  # draw the paper's figures from this one


def _list(text: str, kind: type, what: str) -> list:
    try:
        out = [kind(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{what}: not a comma-separated list: {text!r}") from None
    return out


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog="See docs/workloads.md (Simulating) and BENCHMARKS.md.")
    ap.add_argument("--presets", default="relu-7b,silu-7b",
                    help=f"workload presets ({', '.join(WORKLOAD_PRESETS)}); default: %(default)s")
    ap.add_argument("--seeds", default="0,1,2", help="seeds of every workload; default: %(default)s")
    ap.add_argument("--held-out", default="7,11,23",
                    help="seeds run last as a held-out check ('' for none); default: %(default)s")
    ap.add_argument("--steps", type=int, default=None, help="decode steps per sequence (preset default 256)")
    ap.add_argument("--seqs", type=int, default=None, help="sequences per workload (preset default 4)")
    ap.add_argument("--layers", type=int, default=None, help="layers (default: the shape's)")
    ap.add_argument("--shape", default=None, help="model shape (default: the preset's, llama2-7b)")
    ap.add_argument("--n-ff", type=int, default=None, help="FFN width (default: the shape's)")
    ap.add_argument("--budgets", default=",".join(f"{b:g}" for b in BUDGETS),
                    help="VRAM budgets (share of each layer's groups); default: %(default)s")
    ap.add_argument("--pc", default="pc-low,pc-high", help="hardware presets; default: %(default)s")
    ap.add_argument("--policies", default="all", help=f"policies ({', '.join(POLICIES)}) or all")
    ap.add_argument("--out", default="bench-out/workload-sweep", help="output directory; default: %(default)s")
    ap.add_argument("--workloads", default=None, help="where workloads are written (default: OUT/workloads)")
    ap.add_argument("--keep-workloads", action="store_true",
                    help="keep the generated workloads (and reuse ones with the same parameters)")
    ap.add_argument("--no-figures", action="store_true", help="skip the paper's figures")
    ap.add_argument("--strict", action="store_true", help="exit 1 when a bar cell fails")
    ap.add_argument("--margin-min", type=float, default=BalancerConfig.margin_min,
                    help="adaptive TAM's smallest non-zero swap margin (default %(default)s)")
    ap.add_argument("--margin-up", type=float, default=BalancerConfig.margin_up,
                    help="adaptive TAM's margin factor per I/O-bound step (default %(default)s)")
    args = ap.parse_args(argv)
    try:
        args.preset_list = _list(args.presets, str, "--presets")
        args.seed_list = _list(args.seeds, int, "--seeds")
        args.held_list = [s for s in _list(args.held_out, int, "--held-out") if s not in args.seed_list]
        args.budget_list = sorted(set(_list(args.budgets, float, "--budgets")))
        args.pc_list = _list(args.pc, str, "--pc")
    except argparse.ArgumentTypeError as e:
        ap.error(str(e))
    args.policy_list = list(POLICIES) if args.policies == "all" else _list(args.policies, str, "--policies")
    for name, allowed, what in ((args.preset_list, WORKLOAD_PRESETS, "workload preset"),
                                (args.pc_list, PRESETS, "PC preset"), (args.policy_list, POLICIES, "policy")):
        bad = [n for n in name if n not in allowed]
        if bad or not name:
            ap.error(f"unknown {what} {','.join(bad) or '(none)'} (one of {', '.join(allowed)})")
    if not args.seed_list and not args.held_list:
        ap.error("no seeds")
    if any(not 0.0 <= b <= 1.0 for b in args.budget_list):
        ap.error("budgets must be in [0, 1]")
    args.balancer = BalancerConfig(margin_min=args.margin_min, margin_up=args.margin_up)
    try:
        with Balancer([1], [1], args.balancer):  # the library checks the margin's bounds
            pass
    except KairoxError as e:
        ap.error(f"bad balancer settings: {e}")
    return args


def _params(args: argparse.Namespace, preset: str, seed: int) -> WorkloadParams:
    return resolve(preset, seed=seed, n_steps=args.steps, n_seq=args.seqs, n_layer=args.layers,
                   shape=args.shape, n_ff=args.n_ff)


def _workload(params: WorkloadParams, d: Path, reuse: bool, tick: Callable[[], None]) -> Trace:
    """The workload in d: reused when it was generated with the same parameters, else generated."""
    if reuse and d.is_dir():
        try:
            trace, have = open_workload(d)
            if have.to_dict() == params.to_dict():
                for _ in range(params.n_seq * params.n_steps):
                    tick()
                return trace
        except KairoxError:
            pass
    return write_workload(params, d, tick=tick)


def _figures(runs: list[RunRecord], trace: Trace, data: SequenceData, out: Path, pcs: Sequence[str],
             budgets: Sequence[float]) -> list[Path]:
    """Figures 5, 10, 11, 13 and the simulator's reports for one workload."""
    out.mkdir(parents=True, exist_ok=True)
    cpu = trace_cpu(trace)
    notes = {p: cost_notes(CostModel.build(trace, PRESETS[p], cpu, data.group_size)) for p in pcs}
    paths = write_reports(out, runs, notes)
    f5 = [b for b in FIG5_BUDGETS if b in budgets] or list(budgets[:2])
    mid = FIG_BUDGET if FIG_BUDGET in budgets else budgets[len(budgets) // 2]
    paths += fig5(runs, out, pcs[0], f5)
    paths += fig10(runs, out, pcs, mid)
    paths += fig11(runs, out, pcs[0], mid)
    paths += fig13(runs, out, pcs)
    return paths


def _write_rows(path: Path, rows: list[dict]) -> Path:
    cols = ["workload", "seed", "held_out", *SUMMARY_COLUMNS]
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(cols)
        for r in rows:
            w.writerow([f"{r[c]:.6g}" if isinstance(r[c], float) else r[c] for c in cols])
    return path


def relative_table(rows: list[dict]) -> str:
    """Each policy's throughput / adaptive TAM's, mean [min, max] over seeds, per workload, PC and
    budget: how far each policy is from TAM, and whether a seed flips the order."""
    by: dict[tuple, dict[str, list[float]]] = {}
    tam = {(r["workload"], r["seed"], r["preset"], r["budget"]): float(r["tok_s"])
           for r in rows if r["policy"] == "tam"}
    pols: list[str] = []
    for r in rows:
        t = tam.get((r["workload"], r["seed"], r["preset"], r["budget"]))
        if t is None or r["policy"] == "tam":
            continue
        if r["policy"] not in pols:
            pols.append(r["policy"])
        by.setdefault((r["workload"], r["preset"], r["budget"]), {}).setdefault(r["policy"], []).append(
            float(r["tok_s"]) / t)
    lines = ["| workload | PC | budget | TAM tok/s (mean) | " + " | ".join(pols) + " |",
             "|---|---|---|---|" + "---|" * len(pols)]
    for (wl, pc, b), d in by.items():
        ts = [v for (w, _, p, bb), v in tam.items() if (w, p, bb) == (wl, pc, b)]
        cells = []
        for p in pols:
            v = d.get(p, [])
            cells.append(f"{sum(v) / len(v):.3f} [{min(v):.3f}, {max(v):.3f}]" if v else "-")
        lines.append(f"| {wl} | {pc} | {b:g} | {sum(ts) / len(ts):.2f} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def summary_markdown(cells: list[BarCell], rows: list[dict], args: argparse.Namespace) -> str:
    out = ["# Workload sweep", "",
           f"Workloads {', '.join(args.preset_list)}; seeds {', '.join(map(str, args.seed_list))}"
           + (f", held out {', '.join(map(str, args.held_list))}" if args.held_list else "")
           + f"; PCs {', '.join(args.pc_list)}; budgets {', '.join(f'{b:g}' for b in args.budget_list)}; "
           f"policies {', '.join(args.policy_list)}; adaptive TAM's swap margin from "
           f"{args.balancer.margin_min:g}, x{args.balancer.margin_up:g} per I/O-bound step.", "", "## The bar", ""]
    for wl in args.preset_list:
        sub = [c for c in cells if c.workload == wl]
        if sub:
            bad = [c for c in sub if not c.ok]
            rule = RULES[wl]
            what = (f"TAM >= every other policy, Top-K bytes >= {rule.bytes_factor:g}x TAM's"
                    if rule.bytes_factor else f"TAM within {100 * rule.tolerance:g}% of the best policy")
            out.append(f"- **{wl}** ({what}): {len(sub) - len(bad)} of {len(sub)} cells pass; "
                       f"TAM / best other: min {min(c.tam_vs_best for c in sub):.4f}, "
                       f"max {max(c.tam_vs_best for c in sub):.4f}"
                       + (f"; failing: {', '.join(f'seed {c.seed} {c.preset} {c.budget:g}' for c in bad)}"
                          if bad else ""))
    out += ["", cells_markdown(cells), "", "## Every policy relative to adaptive TAM", "",
            "Throughput / adaptive TAM's, mean [min, max] over seeds (above 1: the policy is faster).",
            "", relative_table(rows), ""]
    return "\n".join(out)


def sweep_png(cells: list[BarCell], path: Path) -> Path | None:
    """TAM / best other policy and Top-K / TAM bytes per cell (matplotlib optional)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    wls = list(dict.fromkeys(c.workload for c in cells))
    if not wls:
        return None
    fig, axes = plt.subplots(2, len(wls), figsize=(5.5 * len(wls), 6.5), squeeze=False)
    for col, wl in enumerate(wls):
        sub = [c for c in cells if c.workload == wl]
        keys = list(dict.fromkeys((c.preset, c.budget) for c in sub))
        seeds = list(dict.fromkeys((c.seed, c.held_out) for c in sub))
        x = {k: i for i, k in enumerate(keys)}
        for j, (seed, held) in enumerate(seeds):
            pts = [c for c in sub if c.seed == seed]
            off = (j - (len(seeds) - 1) / 2) * 0.08
            style = dict(marker="s" if held else "o", ls="", ms=5, color=f"C{j}",
                         label=f"seed {seed}{' (held out)' if held else ''}")
            axes[0][col].plot([x[(c.preset, c.budget)] + off for c in pts], [c.tam_vs_best for c in pts], **style)
            if RULES[wl].bytes_factor:
                axes[1][col].plot([x[(c.preset, c.budget)] + off for c in pts],
                                  [min(c.topk_vs_tam_bytes, 1e4) for c in pts], **style)
        tol = RULES[wl].tolerance
        axes[0][col].axhline(1 - tol, color="red", lw=0.8, ls="--", label="bar")
        axes[0][col].set_title(f"{wl}: adaptive TAM / best other policy", fontsize=10)
        axes[0][col].set_ylabel("throughput ratio")
        if RULES[wl].bytes_factor:
            axes[1][col].axhline(RULES[wl].bytes_factor, color="red", lw=0.8, ls="--", label="bar")
            axes[1][col].set_yscale("log")
            axes[1][col].set_title(f"{wl}: Top-K bytes / adaptive TAM bytes", fontsize=10)
        else:
            axes[1][col].set_axis_off()
        for ax in axes[:, col]:
            ax.set_xticks(range(len(keys)), [f"{p}\n{b:g}" for p, b in keys], fontsize=7)
            if ax.get_legend_handles_labels()[0]:
                ax.legend(fontsize=6)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def print_bar(console: Console, cells: list[BarCell]) -> None:
    table = Table(title="workload sweep: the bar", title_justify="left")
    for col in ("workload", "seed", "PC", "budget", "TAM tok/s", "best other", "tok/s", "TAM/best",
                "Top-K/TAM bytes", "pass"):
        table.add_column(col, justify="left" if col in ("workload", "PC", "best other") else "right")
    for c in cells:
        table.add_row(c.workload, f"{c.seed}{'*' if c.held_out else ''}", c.preset, f"{c.budget:g}",
                      f"{c.tam_tok_s:.2f}", c.best_other, f"{c.best_other_tok_s:.2f}", f"{c.tam_vs_best:.4f}",
                      "-" if c.bytes_ok is None else f"{c.topk_vs_tam_bytes:.1f}x",
                      "yes" if c.ok else "[red]NO[/red]")
    console.print(table)
    console.print("* held-out seed")


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    console = Console(stderr=True)
    console.width = max(console.width, 132)  # the bar table has 10 columns
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    wl_root = Path(args.workloads) if args.workloads else out / "workloads"
    wl_root.mkdir(parents=True, exist_ok=True)
    jobs = [Job(p, s, False, not args.no_figures and i == 0) for p in args.preset_list
            for i, s in enumerate(args.seed_list)]
    jobs += [Job(p, s, True, not args.no_figures and not args.seed_list and i == 0)
             for p in args.preset_list for i, s in enumerate(args.held_list)]
    params = {(j.preset, j.seed): _params(args, j.preset, j.seed) for j in jobs}
    n_runs = len(args.pc_list) * len(args.budget_list) * len(args.policy_list)
    base = SimConfig(balancer=args.balancer)
    rows: list[dict] = []
    with make_progress(console) as bar:
        gen = bar.add_task("generating", total=sum(p.n_seq * p.n_steps for p in params.values()))
        sim = bar.add_task("simulating", total=n_runs * len(jobs))
        for job in jobs:
            p = params[(job.preset, job.seed)]
            d = wl_root / f"{job.preset}-seed{job.seed}"
            bar.update(gen, description=f"generating {d.name}")
            trace = _workload(p, d, args.keep_workloads, lambda: bar.advance(gen))
            bar.update(sim, description=f"simulating {d.name}")
            data = SequenceData(trace, "predicted", trace.meta.group_size)
            runs = run_grid(data, trace_cpu(trace), args.pc_list, args.budget_list, args.policy_list, base,
                            tick=lambda _label: bar.advance(sim))
            rows += [{"workload": job.preset, "seed": job.seed, "held_out": job.held_out, **r.summary}
                     for r in runs]
            if job.figures:
                _figures(runs, trace, data, out / "figures" / job.preset, args.pc_list, args.budget_list)
            del data, trace
            if not args.keep_workloads:
                shutil.rmtree(d)
    if not args.keep_workloads and wl_root.is_dir() and not any(wl_root.iterdir()):
        wl_root.rmdir()
    cells = bar_cells(rows, RULES, BAR_BUDGETS)
    paths = [_write_rows(out / "sweep.csv", rows), write_cells_csv(out / "bar.csv", cells)]
    (out / "bar.md").write_text(cells_markdown(cells) + "\n")
    (out / "summary.md").write_text(summary_markdown(cells, rows, args))
    paths += [out / "bar.md", out / "summary.md"]
    png = sweep_png(cells, out / "sweep.png")
    paths += [png] if png else []
    print_bar(console, cells)
    n_bad = sum(not c.ok for c in cells)
    worst = min((c.tam_vs_best for c in cells), default=math.nan)
    console.print(f"bar: {len(cells) - n_bad} of {len(cells)} cells pass (lowest TAM / best other: {worst:.4f})")
    console.print("wrote " + ", ".join(str(p) for p in paths))
    return 1 if args.strict and n_bad else 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KairoxError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(1)
