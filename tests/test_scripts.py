"""The maintained tools in scripts/ start and explain themselves (`--help`, exit 0).

They run rarely (benchmarks, A/B comparisons, patch upkeep), so an import that a refactoring
broke would otherwise go unnoticed until someone needs the tool. One-off measurements live in
experiments/ and are not checked.
"""
from __future__ import annotations

import csv
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


NCU_DETAILS = '''==PROF== Connected to process 4242 (/tmp/work/bin/test-kairox-hybrid)
==PROF== Profiling "mul_mat_vec_q": 0%....50%....100% - 1 pass
"ID","Process ID","Process Name","Host Name","Kernel Name","Context","Stream","Block Size","Grid Size","Device","CC","Section Name","Metric Name","Metric Unit","Metric Value"
"0","4242","test-kairox-hybrid","127.0.0.1","void mul_mat_vec_q<(ggml_type)2, (int)1, false>(const void *, const void *, float *, int)","1","13","(32, 4, 1)","(4096, 1, 1)","0","9.0","Command line profiler metrics","gpu__time_duration.sum","nsecond","12,500"
"1","4242","test-kairox-hybrid","127.0.0.1","void rms_norm_f32<(int)1024>(const float *, float *, int)","1","13","(1024, 1, 1)","(1, 1, 1)","0","9.0","Command line profiler metrics","gpu__time_duration.sum","usecond","2.5"
"2","4242","test-kairox-hybrid","127.0.0.1","void mul_mat_vec_q<(ggml_type)2, (int)1, false>(const void *, const void *, float *, int)","1","13","(32, 4, 1)","(4096, 1, 1)","0","9.0","Command line profiler metrics","gpu__time_duration.sum","nsecond","11,500"
"3","4242","test-kairox-hybrid","127.0.0.1","kx_mm_cached_kernel","1","13","(256, 1, 1)","(64, 1, 1)","0","9.0","Command line profiler metrics","gpu__time_duration.sum","nsecond","30,000"
==PROF== Disconnected from process 4242
'''

NCU_RAW = '''"ID","Process ID","Process Name","Host Name","Kernel Name","Context","Stream","Block Size","Grid Size","Device","CC","gpu__time_duration.sum"
"","","","","","","","","","","","msecond"
"0","7","t","h","void mul_mat_vec_q<(ggml_type)2, (int)1, false>(const void *)","1","13","(32, 4, 1)","(4096, 1, 1)","0","9.0","0.010"
"1","7","t","h","void mul_mat_vec_q<(ggml_type)2, (int)1, false>(const void *)","1","13","(32, 4, 1)","(4096, 1, 1)","0","9.0","0.014"
'''


def test_kernel_profile_tables_both_ncu_layouts(tmp_path: Path) -> None:
    """scripts/kernel_profile.py: calls and microseconds per step by kernel for each
    configuration, from ncu's default CSV (units per row, thousands separators, ==PROF== lines
    around it) and from `--page raw` (units in the second row); the slowest kernel first; a file
    without ncu's header is an error naming it."""
    det, raw = tmp_path / "fit.csv", tmp_path / "upstream.csv"
    det.write_text(NCU_DETAILS)
    raw.write_text(NCU_RAW)
    script = REPO / "scripts" / "kernel_profile.py"
    out = tmp_path / "k" / "kernels"
    proc = subprocess.run([sys.executable, str(script), "--steps", "2", f"upstream={raw}", f"fit={det}", "-o", str(out)],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    rows = list(csv.reader(out.with_suffix(".csv").open()))
    assert rows[0] == ["kernel", "upstream calls/step", "upstream us/step", "fit calls/step", "fit us/step"]
    by = {r[0]: r[1:] for r in rows[1:]}
    mmvq = "mul_mat_vec_q<(ggml_type)2, (int)1, false>"
    # upstream: 10 + 14 us over 2 steps; fit: 12.5 + 11.5 us
    assert by[mmvq] == ["1.00", "12.0", "1.00", "12.0"]
    assert by["kx_mm_cached_kernel"] == ["0.00", "0.0", "0.50", "15.0"]
    assert by["rms_norm_f32<(int)1024>"] == ["0.00", "0.0", "0.50", "1.2"]
    assert rows[1][0] == "kx_mm_cached_kernel"  # the slowest first
    assert rows[-1] == ["all kernels", "1.00", "12.0", "2.00", "28.2"]
    assert "| kx_mm_cached_kernel |" in out.with_suffix(".md").read_text()

    bad = tmp_path / "bad.csv"
    bad.write_text("==PROF== Connected\nno kernels were profiled\n")
    proc = subprocess.run([sys.executable, str(script), "--steps", "2", f"x={bad}", "-o", str(out)],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1 and "bad.csv" in proc.stderr and "Traceback" not in proc.stderr
    proc = subprocess.run([sys.executable, str(script), "--steps", "2", str(bad), "-o", str(out)],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "LABEL=CSV" in proc.stderr


def test_llama_bench_shared_is_llama_bench_over_the_library(model_path: Path) -> None:
    """llama-bench-shared (what scripts/h2h_gpu.sh stages as llama-bench, so that a GPU
    machine's call holds one copy of ggml-cuda): upstream's llama-bench linked to libkairox
    instead of a static llama and ggml. It must load the library beside it, not carry its own,
    and measure like llama-bench: the same CSV row for the original GGUF."""
    from conftest import find_tool

    exe = find_tool("llama-bench-shared")
    if exe is None:
        pytest.skip("llama-bench-shared not built (KAIROX_TOOLS=OFF)")
    if sys.platform.startswith("linux"):
        ldd = subprocess.run(["ldd", str(exe)], capture_output=True, text=True, timeout=60).stdout
        assert "libkairox" in ldd, ldd
    proc = subprocess.run([str(exe), "-m", str(model_path), "-p", "0", "-n", "4", "-r", "1", "-t", "2", "-o", "csv"],
                          capture_output=True, text=True, timeout=300, stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, proc.stderr[-2000:]
    rows = list(csv.DictReader(proc.stdout.splitlines()))
    assert len(rows) == 1 and int(rows[0]["n_gen"]) == 4 and float(rows[0]["avg_ts"]) > 0, proc.stdout
