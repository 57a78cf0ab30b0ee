#!/usr/bin/env bash
# The CUDA twins of the hybrid runtime's kernels on a machine with an NVIDIA GPU: their test
# against the CPU references, compute-sanitizer's memcheck and racecheck on the slot-cache
# kernels, and their timings at FFN sizes (test-kairox-cuda perf). Results go to OUT_DIR
# (default cuda-check/): test.log, perf.log, perf.csv, memcheck.log, racecheck.log, env.txt.
#
#   scripts/cuda_check.sh                 build here (build/cuda-check) and run; needs the GPU
#                                         machine to have vendor/llama.cpp (or the pinned sdist)
#   scripts/cuda_check.sh --stage DIR     on a machine without a GPU: build test-kairox-cuda
#                                         (sm_80 + sm_90 code, CPU code for any AVX2 machine)
#                                         and put it in DIR with libkairox, libcudart and this
#                                         script, to copy to a GPU machine
#   DIR/cuda_check.sh --run DIR [OUT_DIR] on the GPU machine: run the staged binary
set -euo pipefail

run_checks() { # $1: directory holding test-kairox-cuda (and its libraries), $2: output directory
    local bin=$1 out=$2
    mkdir -p "$out"
    export LD_LIBRARY_PATH="$bin${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    nvidia-smi -L || { echo "no NVIDIA GPU visible" >&2; exit 2; }
    {
        # a staged folder's COMMIT first: a copy of the tree on the GPU machine can carry an older .git
        echo "date: $(date -u +%FT%TZ)  commit: $(cat "$bin/COMMIT" 2>/dev/null || git -C "$bin" rev-parse --short HEAD 2>/dev/null || echo '?')"
        nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,memory.total --format=csv,noheader
        grep -m1 "model name" /proc/cpuinfo || true
    } | tee "$out/env.txt"
    local rc=0
    timeout 300 "$bin/test-kairox-cuda" > "$out/test.log" 2>&1 || rc=$?
    grep -v " OK$" "$out/test.log" | tail -20
    echo "test: exit $rc"
    timeout 300 "$bin/test-kairox-cuda" perf -o "$out/perf.csv" > "$out/perf.log" 2>&1 || echo "perf: exit $?"
    if command -v compute-sanitizer > /dev/null; then
        for tool in memcheck racecheck; do
            local extra=()
            [ "$tool" = memcheck ] && extra=(--leak-check full)
            timeout 300 compute-sanitizer --tool "$tool" "${extra[@]}" --error-exitcode 1 "$bin/test-kairox-cuda" sparse \
                > "$out/$tool.log" 2>&1 || { echo "$tool: exit $?"; rc=1; }
            tail -2 "$out/$tool.log"
        done
    fi
    return $rc
}

build_test() { # $1: build directory, then extra CMake options; builds test-kairox-cuda there
    local B=$1
    shift
    cmake -S . -B "$B" -G Ninja -DCMAKE_BUILD_TYPE=Release -DKAIROX_TOOLS=OFF -DKAIROX_TESTS=ON "$@" \
          > "$B.configure.log" 2>&1 || { tail -30 "$B.configure.log"; exit 1; }
    cmake --build "$B" --target test-kairox-cuda -j "$(nproc)"
}

case "${1:-}" in
    --run)
        run_checks "$(cd "$2" && pwd)" "${3:-cuda-check}"
        ;;
    --stage)
        cd "$(dirname "$0")/.."
        dir=$2 B=build/cuda-stage
        build_test "$B" -DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON \
                        -DKAIROX_CUDA_KERNELS=ON -DCMAKE_CUDA_ARCHITECTURES="80;90"
        mkdir -p "$dir"
        cp "$B/bin/test-kairox-cuda" "$B/libkairox.so" "$0" "$dir/"
        cudart=$(ldd "$B/bin/test-kairox-cuda" | awk '/libcudart/ { print $3 }')
        [ -n "$cudart" ] && cp -L "$cudart" "$dir/"
        git rev-parse --short HEAD > "$dir/COMMIT"
        echo "staged in $dir: copy it to a GPU machine and run $dir/cuda_check.sh --run $dir [OUT_DIR]"
        ;;
    *)
        cd "$(dirname "$0")/.."
        B=${1:-build/cuda-check}
        build_test "$B" -DCMAKE_CUDA_ARCHITECTURES=native
        run_checks "$(cd "$B/bin" && pwd)" cuda-check
        ;;
esac
