#!/usr/bin/env bash
# The CUDA twins of the hybrid runtime's kernels on a machine with an NVIDIA GPU: their test
# against the CPU references, compute-sanitizer's memcheck and racecheck on the slot-cache
# kernels, and their timings at FFN sizes (test-kairox-cuda perf). Results go to OUT_DIR
# (default cuda-check/): test.log, perf.log, perf.csv, memcheck.log, racecheck.log, env.txt.
#
#   scripts/cuda_check.sh                 build here (build/cuda-check) and run; needs the GPU
#                                         machine to have vendor/llama.cpp (or the pinned sdist)
#   scripts/cuda_check.sh --stage DIR [CUDA_ROOT]
#                                         on a machine without a GPU: build test-kairox-cuda
#                                         (sm_80 + sm_90 code, CPU code for any AVX2 machine)
#                                         and put it in DIR with libkairox, libcudart and this
#                                         script, to copy to a GPU machine
#   scripts/cuda_check.sh --stage-backend DIR [CUDA_ROOT]
#                                         also stage upstream's test-backend-ops from a build
#                                         with the whole CUDA backend (build/cuda-full, sm_90;
#                                         ~30 min on 2 cores the first time): it runs our ops
#                                         through ggml-cuda's dispatch against the CPU backend.
#                                         CUDA_ROOT: a toolkit root that has cuBLAS (README)
#   scripts/cuda_check.sh --stage-hybrid DIR MODEL.gguf [CUDA_ROOT]
#                                         stage libkairox (with the CUDA backend, xz-compressed),
#                                         test-kairox-hybrid and a Kairox GGUF (compressed): on the
#                                         GPU machine the hybrid runtime keeps its cache on the GPU,
#                                         and `test-kairox-hybrid MODEL compare` checks it against
#                                         the CPU-only sparse path (scripts/gguf_truncate.py makes
#                                         a model small enough to copy)
#   scripts/cuda_check.sh --stage-models DIR MODEL.gguf...
#                                         more Kairox GGUFs (with predictors) for the hybrid
#                                         compare, compressed as model-STEM.gguf.xz (e.g. the
#                                         synthetic Falcon and ReLU llama of the tests, whose
#                                         activations run on the GPU through ggml-cuda); for a
#                                         second call when one call cannot carry them with the
#                                         rest: DIR gets the runtime from --stage-hybrid's DIR
#                                         on the GPU machine (HYBRID_DIR=that DIR at --run)
#   DIR/cuda_check.sh --run DIR [OUT_DIR] on the GPU machine: run the staged binaries
#                                         (KX_SKIP_SANITIZERS=1: without compute-sanitizer's
#                                         runs, the slowest part, when the machine's time is short)
set -euo pipefail

# cuBLAS and the CUDA runtime for the binaries with the whole CUDA backend: from the machine's
# CUDA install, else from its Python packages (nvidia-cublas, nvidia-cuda-runtime)
cuda_libs() {
    local libs
    libs=$(python3 -c 'import glob, site; print(":".join(d for p in site.getsitepackages() for d in glob.glob(p + "/nvidia/cu*/lib")))' 2>/dev/null || true)
    export LD_LIBRARY_PATH="${LD_LIBRARY_PATH:-}${libs:+:$libs}"
}

run_checks() { # $1: directory holding the staged binaries (and their libraries), $2: output directory
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
    if [ -n "${HYBRID_DIR:-}" ] && [ ! -f "$bin/libkairox.so.xz" ]; then
        cp "$HYBRID_DIR/libkairox.so.xz" "$HYBRID_DIR/test-kairox-hybrid" "$HYBRID_DIR"/libgomp* "$bin/" 2>/dev/null || true
    fi
    local extra
    for extra in "$bin"/model-*.gguf.xz; do
        [ -f "$extra" ] && [ -f "$bin/libkairox.so.xz" ] || continue
        # another model (architecture, activation) through the hybrid runtime on the GPU
        local tmp name
        tmp=$(mktemp -d)
        name=$(basename "$extra" .gguf.xz)
        python3 -c 'import lzma, shutil, sys; shutil.copyfileobj(lzma.open(sys.argv[1]), open(sys.argv[2], "wb"))' \
            "$bin/libkairox.so.xz" "$tmp/libkairox.so"
        python3 -c 'import lzma, shutil, sys; shutil.copyfileobj(lzma.open(sys.argv[1]), open(sys.argv[2], "wb"))' \
            "$extra" "$tmp/model.gguf"
        cp "$bin/test-kairox-hybrid" "$bin"/libgomp* "$tmp/" 2>/dev/null || true
        cuda_libs
        for place in "" --dense-on-device; do
            LD_LIBRARY_PATH="$tmp:$LD_LIBRARY_PATH" timeout 300 "$tmp/test-kairox-hybrid" "$tmp/model.gguf" compare 32 $place \
                > "$out/hybrid-compare-$name${place}.log" 2>&1 || { echo "hybrid compare $name $place: exit $?"; rc=1; }
            echo "$name $place:"
            grep -m1 "^device" "$out/hybrid-compare-$name${place}.log" || true
            tail -1 "$out/hybrid-compare-$name${place}.log"
        done
        rm -rf "$tmp"
    done
    if [ -f "$bin/libkairox.so.xz" ] && [ -f "$bin/model.gguf.xz" ]; then
        # the hybrid runtime end to end: its cache on the GPU vs the CPU-only sparse path
        local tmp
        tmp=$(mktemp -d)
        for f in libkairox.so model.gguf; do
            python3 -c 'import lzma, shutil, sys; shutil.copyfileobj(lzma.open(sys.argv[1]), open(sys.argv[2], "wb"))' \
                "$bin/$f.xz" "$tmp/$f"
        done
        cp "$bin/test-kairox-hybrid" "$bin"/libgomp* "$tmp/" 2>/dev/null || true
        cuda_libs
        LD_LIBRARY_PATH="$tmp:$LD_LIBRARY_PATH" timeout 300 "$tmp/test-kairox-hybrid" "$tmp/model.gguf" compare 32 \
            > "$out/hybrid-compare.log" 2> "$out/hybrid-compare.stderr" || { echo "hybrid compare: exit $?"; rc=1; }
        grep -v "^|---" "$out/hybrid-compare.log" | tail -16 || true
        grep -m3 -i "Kairox hybrid\|error\|fail" "$out/hybrid-compare.stderr" || true
        # the paper's placement: attention, norms, output and predictors on the GPU, FFN weights on the host
        LD_LIBRARY_PATH="$tmp:$LD_LIBRARY_PATH" timeout 300 "$tmp/test-kairox-hybrid" "$tmp/model.gguf" compare 32 --dense-on-device \
            > "$out/hybrid-compare-dense-on-device.log" 2>&1 || { echo "hybrid compare --dense-on-device: exit $?"; rc=1; }
        tail -18 "$out/hybrid-compare-dense-on-device.log"
        LD_LIBRARY_PATH="$tmp:$LD_LIBRARY_PATH" timeout 300 "$tmp/test-kairox-hybrid" "$tmp/model.gguf" \
            > "$out/hybrid-stops.log" 2>&1 || { echo "hybrid stops: exit $?"; rc=1; }
        tail -1 "$out/hybrid-stops.log" || true
        rm -rf "$tmp"
    fi
    if [ -x "$bin/test-backend-ops" ]; then
        # our ops through ggml-cuda (MUL_MAT_SPARSE, AXPY_SPARSE over slot caches) vs the CPU
        # backend
        cuda_libs
        timeout 300 "$bin/test-backend-ops" test -b CUDA0 -o MUL_MAT_SPARSE,AXPY_SPARSE > "$out/backend-ops.log" 2>&1 || rc=$?
        grep -v "OK$" "$out/backend-ops.log" | tail -12
        echo "backend-ops: exit $rc"
        timeout 300 "$bin/test-backend-ops" perf -b CUDA0 -o MUL_MAT_SPARSE,AXPY_SPARSE > "$out/backend-ops-perf.log" 2>&1 \
            || echo "backend-ops perf: exit $?"
        if [ -z "${KX_SKIP_SANITIZERS:-}" ] && command -v compute-sanitizer > /dev/null; then
            timeout 300 compute-sanitizer --tool memcheck --error-exitcode 1 "$bin/test-backend-ops" test -b CUDA0 \
                -o MUL_MAT_SPARSE,AXPY_SPARSE > "$out/backend-ops-memcheck.log" 2>&1 || { echo "backend-ops memcheck: exit $?"; rc=1; }
            tail -2 "$out/backend-ops-memcheck.log"
        fi
    fi
    if [ ! -x "$bin/test-kairox-cuda" ]; then
        return $rc
    fi
    timeout 300 "$bin/test-kairox-cuda" > "$out/test.log" 2>&1 || rc=$?
    grep -v " OK$" "$out/test.log" | tail -20
    echo "test: exit $rc"
    timeout 300 "$bin/test-kairox-cuda" perf -o "$out/perf.csv" > "$out/perf.log" 2>&1 || echo "perf: exit $?"
    if [ -z "${KX_SKIP_SANITIZERS:-}" ] && command -v compute-sanitizer > /dev/null; then
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

# CPU code for any AVX2 machine (the GPU machine's CPU is not this one)
PORTABLE_CPU=(-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON)

configure() { # $1: build directory, then extra CMake options
    local B=$1
    shift
    cmake -S . -B "$B" -G Ninja -DCMAKE_BUILD_TYPE=Release -DKAIROX_TOOLS=OFF -DKAIROX_TESTS=ON "$@" \
          > "$B.configure.log" 2>&1 || { tail -30 "$B.configure.log"; exit 1; }
}

build_test() { # $1: build directory, then extra CMake options; builds test-kairox-cuda there
    configure "$@"
    cmake --build "$1" --target test-kairox-cuda -j "$(nproc)"
}

# build/cuda-full: the whole CUDA backend (sm_90, no flash attention); $1: a toolkit root with
# cuBLAS (optional), then the targets to build
build_cuda_full() {
    local root=()
    [ -n "$1" ] && root=(-DCUDAToolkit_ROOT="$1")
    shift
    configure build/cuda-full -DKAIROX_CUDA=ON -DKAIROX_CUDA_KERNELS=OFF "${PORTABLE_CPU[@]}" \
              -DCMAKE_CUDA_ARCHITECTURES=90 -DGGML_CUDA_FA=OFF "${root[@]}"
    cmake --build build/cuda-full --target "$@" -j "$(nproc)"
}

case "${1:-}" in
    --run)
        run_checks "$(cd "$2" && pwd)" "${3:-cuda-check}"
        ;;
    --stage)
        cd "$(dirname "$0")/.."
        dir=$2 B=build/cuda-stage
        root=()
        [ -n "${3:-}" ] && root=(-DCUDAToolkit_ROOT="$3" -DKAIROX_CUBLAS_INCLUDE="$3/include")
        build_test "$B" "${PORTABLE_CPU[@]}" -DKAIROX_CUDA_KERNELS=ON -DCMAKE_CUDA_ARCHITECTURES="80;90" "${root[@]}"
        mkdir -p "$dir"
        cp "$B/bin/test-kairox-cuda" "$B/libkairox.so" "$0" "$dir/"
        cudart=$(ldd "$B/bin/test-kairox-cuda" | awk '/libcudart/ { print $3 }')
        [ -n "$cudart" ] && cp -L "$cudart" "$dir/"
        git rev-parse --short HEAD > "$dir/COMMIT"
        echo "staged in $dir: copy it to a GPU machine and run $dir/cuda_check.sh --run $dir [OUT_DIR]"
        ;;
    --stage-backend)
        cd "$(dirname "$0")/.."
        dir=$2 B=build/cuda-full
        build_cuda_full "${3:-}" test-backend-ops
        mkdir -p "$dir"
        strip -o "$dir/test-backend-ops" "$B/bin/test-backend-ops"
        cp "$0" "$dir/"
        git rev-parse --short HEAD > "$dir/COMMIT"
        echo "staged test-backend-ops in $dir ($(du -h "$dir/test-backend-ops" | cut -f1))"
        ;;
    --stage-hybrid)
        cd "$(dirname "$0")/.."
        dir=$2 model=$3 B=build/cuda-full
        build_cuda_full "${4:-}" kairox test-kairox-hybrid
        mkdir -p "$dir"
        strip -o "$dir/libkairox.so" "$B/libkairox.so"
        xz -f -T0 "$dir/libkairox.so"
        xz -T0 -c "$model" > "$dir/model.gguf.xz"
        cp "$B/bin/test-kairox-hybrid" "$0" "$dir/"
        gomp=$(ldd "$B/libkairox.so" | awk '/libgomp/ { print $3 }')
        [ -n "$gomp" ] && cp -L "$gomp" "$dir/"
        git rev-parse --short HEAD > "$dir/COMMIT"
        echo "staged the hybrid runtime in $dir ($(du -sh "$dir" | cut -f1))"
        ;;
    --stage-models)
        dir=$2
        shift 2
        mkdir -p "$dir"
        for m in "$@"; do
            xz -T0 -c "$m" > "$dir/model-$(basename "$m" .gguf).gguf.xz"
        done
        cp "$0" "$dir/"
        git -C "$(dirname "$0")/.." rev-parse --short HEAD > "$dir/COMMIT"
        echo "staged $# model(s) in $dir ($(du -sh "$dir" | cut -f1))"
        ;;
    *)
        cd "$(dirname "$0")/.."
        B=${1:-build/cuda-check}
        build_test "$B" -DCMAKE_CUDA_ARCHITECTURES=native
        run_checks "$(cd "$B/bin" && pwd)" cuda-check
        ;;
esac
