#!/usr/bin/env bash
# On a machine with an NVIDIA GPU: build the CUDA twins of the hybrid kernels and their test,
# run it against the CPU references, and record the result (cuda-check.log, device name,
# date, commit). Usage: scripts/cuda_check.sh [BUILD_DIR]   (default build/cuda-check)
# The machine needs vendor/llama.cpp (or the pinned sdist to make it, see patches/UPSTREAM).
set -euo pipefail
cd "$(dirname "$0")/.."
B=${1:-build/cuda-check}
nvidia-smi -L || { echo "no NVIDIA GPU visible" >&2; exit 2; }
cmake -S . -B "$B" -G Ninja -DCMAKE_BUILD_TYPE=Release -DKAIROX_TOOLS=OFF -DKAIROX_TESTS=ON \
      -DCMAKE_CUDA_ARCHITECTURES=native > "$B.configure.log" 2>&1 || { tail -30 "$B.configure.log"; exit 1; }
cmake --build "$B" --target test-kairox-cuda test-kairox-ops -j "$(nproc)"
{
    echo "date: $(date -u +%FT%TZ)  commit: $(git rev-parse --short HEAD 2>/dev/null || echo '?')"
    nvidia-smi -L
    "$B/bin/test-kairox-cuda"
} 2>&1 | tee cuda-check.log
