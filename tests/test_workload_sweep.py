"""scripts/workload_sweep.py: the bar's rules (kairox_py.sim.sweep) on hand-made summary rows,
and the sweep end to end on tiny workloads (every output written, one bar cell per workload,
seed, PC and budget, held-out seeds marked)."""
from __future__ import annotations

import csv
import math
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import REPO
from kairox_py.sim.sweep import RULES, bar_cells, cells_markdown

SCRIPT = REPO / "scripts" / "workload_sweep.py"


def _row(wl: str, policy: str, tok_s: float, mb: float, budget: float = 0.5, seed: int = 0) -> dict:
    return {"workload": wl, "seed": seed, "held_out": False, "preset": "pc-low", "budget": budget,
            "policy": policy, "tok_s": tok_s, "mb_moved": mb}


def test_bar_rules() -> None:
    """relu-7b: TAM must be at least the best other policy and Top-K must move 1.5x its bytes;
    silu-7b: TAM within 2% of the best; budgets outside the bar's are not cells."""
    rows = [_row("relu-7b", "tam", 10.0, 2.0), _row("relu-7b", "static", 9.9, 0.0),
            _row("relu-7b", "topk", 8.0, 3.0),
            _row("relu-7b", "tam", 10.0, 2.0, budget=0.75), _row("relu-7b", "static", 10.01, 0.0, budget=0.75),
            _row("relu-7b", "topk", 8.0, 2.9, budget=0.75),
            _row("relu-7b", "tam", 1.0, 1.0, budget=0.9), _row("relu-7b", "static", 2.0, 0.0, budget=0.9),
            _row("silu-7b", "tam", 9.85, 5.0), _row("silu-7b", "static", 10.0, 0.0),
            _row("silu-7b", "tam", 9.7, 5.0, seed=1), _row("silu-7b", "static", 10.0, 0.0, seed=1)]
    cells = {(c.workload, c.seed, c.budget): c for c in bar_cells(rows)}
    assert set(cells) == {("relu-7b", 0, 0.5), ("relu-7b", 0, 0.75), ("silu-7b", 0, 0.5), ("silu-7b", 1, 0.5)}
    ok = cells[("relu-7b", 0, 0.5)]
    assert ok.ok and ok.best_other == "static" and ok.topk_vs_tam_bytes == pytest.approx(1.5)
    bad = cells[("relu-7b", 0, 0.75)]
    assert not bad.throughput_ok and bad.bytes_ok is False and not bad.ok
    assert cells[("silu-7b", 0, 0.5)].ok and cells[("silu-7b", 0, 0.5)].bytes_ok is None
    assert not cells[("silu-7b", 1, 0.5)].ok
    md = cells_markdown(list(cells.values()))
    assert md.count("\n") == 1 + len(cells) and "| NO |" in md
    # TAM moving nothing: Top-K's ratio is infinite, and passes
    inf = bar_cells([_row("relu-7b", "tam", 1.0, 0.0), _row("relu-7b", "topk", 0.5, 1.0)])[0]
    assert math.isinf(inf.topk_vs_tam_bytes) and inf.ok
    assert set(RULES) == {"relu-7b", "silu-7b"}


def test_help(tmp_path: Path) -> None:
    """--help names the options that make the bar's claim: seeds, held-out seeds, output."""
    proc = subprocess.run([sys.executable, str(SCRIPT), "--help"], cwd=tmp_path, capture_output=True,
                          text=True, timeout=120, stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, proc.stderr
    for opt in ("--seeds", "--held-out", "--budgets", "--out", "--strict"):
        assert opt in proc.stdout, opt


def test_bad_arguments(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, str(SCRIPT), "--presets", "gelu-7b"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)
    assert proc.returncode == 2 and "unknown workload preset gelu-7b" in proc.stderr, proc.stderr
    proc = subprocess.run([sys.executable, str(SCRIPT), "--margin-up", "0.5"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)
    assert proc.returncode == 2 and "bad balancer settings" in proc.stderr and "margin_up" in proc.stderr, proc.stderr


def test_sweep_end_to_end(tmp_path: Path) -> None:
    out = tmp_path / "sweep"
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "--seeds", "0", "--held-out", "5", "--layers", "2", "--n-ff", "512",
         "--steps", "12", "--seqs", "1", "--budgets", "0.25,0.5,0.75", "--policies", "static,topk,tam",
         "--margin-min", "0.002", "--margin-up", "2", "--out", str(out)],
        cwd=tmp_path, capture_output=True, text=True, timeout=300, stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    for name in ("sweep.csv", "bar.csv", "bar.md", "summary.md"):
        assert (out / name).is_file(), name
    rows = list(csv.DictReader(open(out / "sweep.csv")))
    assert len(rows) == 2 * 2 * 2 * 3 * 3  # workloads x seeds x PCs x budgets x policies
    assert {r["held_out"] for r in rows} == {"True", "False"}
    cells = list(csv.DictReader(open(out / "bar.csv")))
    assert len(cells) == 2 * 2 * 2 * 3
    assert {c["workload"] for c in cells} == {"relu-7b", "silu-7b"}
    for wl in ("relu-7b", "silu-7b"):
        fig = out / "figures" / wl
        for name in ("fig5_static_vs_lru.csv", "fig10_topk_tam.csv", "fig11_adaptation.csv", "fig13_budget.csv",
                     "summary.csv", "per_layer.csv"):
            assert (fig / name).is_file(), f"{wl}/{name}"
    assert not (out / "workloads").exists()  # deleted after their simulations
    assert "cells pass" in proc.stderr
    assert "held out" in (out / "summary.md").read_text()
    assert "swap margin from 0.002, x2 per I/O-bound step" in (out / "summary.md").read_text()
