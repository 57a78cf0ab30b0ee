"""The CUDA twins of the hybrid runtime's kernels (ggml-cuda/kairox-sparse.cu): wherever nvcc
is installed they must have been compiled, with their test program; where a GPU exists that
program checks them against the CPU references (ggml's dequantization, the library's balancer)."""
from __future__ import annotations

import shutil
import subprocess

import pytest
from conftest import find_tool


def test_cuda_kernels_compile_and_match_the_cpu() -> None:
    exe = find_tool("test-kairox-cuda")
    if exe is None:
        if shutil.which("nvcc") is None:
            pytest.skip("no CUDA compiler: the CUDA kernels are not built")
        pytest.fail("nvcc is installed but test-kairox-cuda was not built")
    proc = subprocess.run([str(exe)], capture_output=True, text=True, timeout=600, check=False)
    if proc.returncode == 77:
        pytest.skip("no CUDA device: the kernels compiled, nothing to run them on")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    assert "cases passed" in proc.stdout
