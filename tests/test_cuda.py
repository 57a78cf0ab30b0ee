"""The CUDA twins of the hybrid runtime's kernels (ggml-cuda/kairox-sparse.cu): wherever nvcc
and cuBLAS's headers are installed (the kernels use ggml-cuda's helpers, whose common.cuh
includes them) they must have been compiled, with their test program; where a GPU exists that
program checks them against the CPU references (ggml's dequantization, the library's balancer)."""
from __future__ import annotations

import glob
import shutil
import site
import subprocess
from pathlib import Path

import pytest
from conftest import find_tool


def _cublas_headers(nvcc: str) -> bool:
    """Whether CMake's search (the toolkit's include directories, a pip-installed
    nvidia-cublas) finds cublas_v2.h, as the build does before it compiles the kernels."""
    root = Path(nvcc).resolve().parent.parent
    dirs = [root / "include", *root.glob("targets/*/include")]
    dirs += [Path(d) for p in site.getsitepackages() for d in glob.glob(p + "/nvidia/cu*/include")]
    return any((d / "cublas_v2.h").is_file() for d in dirs)


def test_cuda_kernels_compile_and_match_the_cpu() -> None:
    exe = find_tool("test-kairox-cuda")
    if exe is None:
        nvcc = shutil.which("nvcc")
        if nvcc is None:
            pytest.skip("no CUDA compiler: the CUDA kernels are not built")
        if not _cublas_headers(nvcc):
            pytest.skip("nvcc without cuBLAS's headers (pip install nvidia-cublas): the kernels are not built")
        pytest.fail("nvcc and cuBLAS's headers are installed but test-kairox-cuda was not built")
    proc = subprocess.run([str(exe)], capture_output=True, text=True, timeout=600, check=False)
    if proc.returncode == 77:
        pytest.skip("no CUDA device: the kernels compiled, nothing to run them on")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    assert "cases passed" in proc.stdout
