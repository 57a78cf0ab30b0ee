"""The maintained tools in scripts/ start and explain themselves (`--help`, exit 0).

They run rarely (benchmarks, A/B comparisons, patch upkeep), so an import that a refactoring
broke would otherwise go unnoticed until someone needs the tool. One-off measurements live in
experiments/ and are not checked.
"""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from conftest import REPO

SCRIPTS = sorted((REPO / "scripts").glob("*.py"))


def test_scripts_are_found() -> None:
    assert SCRIPTS, "no Python scripts in scripts/"


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_help(script: Path, tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, str(script), "--help"], cwd=tmp_path, capture_output=True,
                          text=True, timeout=120, stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "usage:" in proc.stdout, proc.stdout


def test_ab_llama_bench_ratios_per_round(tmp_path: Path) -> None:
    """scripts/ab_llama_bench.py: one call per file and round in ABBA order, a ratio per round
    from the same round's two calls, and the median ratio in the summary; a failing
    llama-bench is a clear error, not a traceback."""
    log = tmp_path / "calls.txt"
    fake = tmp_path / "llama-bench"
    # tokens/s by file: the original 100 (pp) / 10 (tg); the Kairox file 1.1x / 1.2x of that;
    # the third call of each file 2x faster on both sides (a drifting machine)
    fake.write_text(f"""#!{sys.executable}
import sys
m = sys.argv[sys.argv.index("-m") + 1]
with open({str(log)!r}, "a") as f:
    f.write(m + "\\n")
n = sum(1 for line in open({str(log)!r}) if line.strip() == m)
if "broken" in m:
    sys.stderr.write("failed to load model\\n"); sys.exit(1)
k = (1.1, 1.2) if "kx" in m else (1.0, 1.0)
d = 2.0 if n == 3 else 1.0
print("model_filename,n_prompt,n_gen,avg_ts,stddev_ts")
print(f"{{m}},64,0,{{100 * k[0] * d}},1.0")
print(f"{{m}},0,64,{{10 * k[1] * d}},0.1")
""")
    fake.chmod(0o755)
    orig, kx = tmp_path / "orig.gguf", tmp_path / "kx.gguf"
    orig.write_bytes(b"x")
    kx.write_bytes(b"x")
    out = tmp_path / "out"
    script = REPO / "scripts" / "ab_llama_bench.py"
    proc = subprocess.run([sys.executable, str(script), str(orig), str(kx), "--bench", str(fake), "--rounds", "4",
                           "-o", str(out)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    order = [Path(p).name for p in log.read_text().split()]
    assert order == ["orig.gguf", "kx.gguf", "kx.gguf", "orig.gguf"] * 2
    summary = (out / "summary.md").read_text()
    assert "| pp64 |" in summary and "**1.100x**" in summary and "**1.200x**" in summary
    rows = (out / "rounds.csv").read_text().splitlines()
    assert len(rows) == 1 + 4 * 2 * 2
    broken = tmp_path / "broken.gguf"
    broken.write_bytes(b"x")
    proc = subprocess.run([sys.executable, str(script), str(orig), str(broken), "--bench", str(fake),
                           "--rounds", "1", "-o", str(out)], capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0 and "llama-bench failed on" in proc.stderr and "Traceback" not in proc.stderr
