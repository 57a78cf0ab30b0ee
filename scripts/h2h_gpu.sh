#!/usr/bin/env bash
# The head-to-head on a GPU machine that cannot build or fetch anything (the device tool's
# machines): stage here what it needs, then run it there in one call that writes every result
# to its output folder.
#
#   scripts/h2h_gpu.sh --stage DIR [CUDA_ROOT]
#       on this machine: build libkairox with the whole CUDA backend (build/cuda-full, sm_90;
#       ~30 min on 2 cores the first time), llama-bench (linked to libkairox: llama-bench-shared)
#       and test-kairox-hybrid of the same build, and put them in DIR (xz-compressed: ~30 MiB)
#       with the gguf wheel kairox_py needs.
#       CUDA_ROOT: a toolkit root that has cuBLAS (README)
#   scripts/h2h_gpu.sh --run DIR OUT [hybrid_h2h.py options]
#       on the GPU machine, from the repository root: the hybrid runtime against the CPU-only
#       path on the GPU (test-kairox-hybrid compare, a small synthetic model with a predictor),
#       its time per decode step with every group cached against upstream on the model's
#       original, with and without CUDA graphs (test-kairox-hybrid speed), the same three
#       configurations' device time per step by kernel (Nsight Compute, scripts/kernel_profile.py),
#       then scripts/hybrid_h2h.py (7B shapes, 8 threads) into OUT: env.txt, compare.log,
#       speed.log, speed-no-cuda-graphs.log, ncu-*.csv, kernels.md, kernels.csv, h2h.csv, h2h.md,
#       h2h.png, h2h_latency.csv, h2h_latency.png, h2h.log
set -euo pipefail

case "${1:-}" in
    --stage)
        cd "$(dirname "$0")/.."
        dir=$2
        root=()
        [ -n "${3:-}" ] && root=(-DCUDAToolkit_ROOT="$3")
        B=build/cuda-full
        cmake -S . -B "$B" -G Ninja -DCMAKE_BUILD_TYPE=Release -DKAIROX_TOOLS=ON -DKAIROX_TESTS=ON \
              -DKAIROX_CUDA=ON -DKAIROX_CUDA_KERNELS=OFF -DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON \
              -DGGML_FMA=ON -DGGML_F16C=ON -DCMAKE_CUDA_ARCHITECTURES=90 -DGGML_CUDA_FA=OFF "${root[@]}" \
              > "$B.configure.log" 2>&1 || { tail -30 "$B.configure.log"; exit 1; }
        cmake --build "$B" --target kairox llama-bench-shared test-kairox-hybrid -j "$(nproc)"
        mkdir -p "$dir/bin"
        # compressed: a call carries 64 MiB with the working tree. llama-bench is the build's
        # llama-bench-shared: upstream's llama-bench with llama and ggml from libkairox, so the
        # stage holds one copy of ggml-cuda, not two
        strip -o "$dir/libkairox.so" "$B/libkairox.so"
        xz -f -9e -T0 "$dir/libkairox.so"
        strip -o "$dir/bin/llama-bench" "$B/bin/llama-bench-shared"
        strip -o "$dir/bin/test-kairox-hybrid" "$B/bin/test-kairox-hybrid"
        xz -f -9e -T0 "$dir/bin/llama-bench"
        gomp=$(ldd "$B/libkairox.so" | awk '/libgomp/ { print $3 }')
        [ -n "$gomp" ] && cp -L "$gomp" "$dir/"
        mkdir -p "$dir/whl"
        python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
            --platform any -d "$dir/whl" "gguf==$(python3 -c 'import importlib.metadata as m; print(m.version("gguf"))')"
        git rev-parse --short HEAD > "$dir/COMMIT"
        echo "staged in $dir ($(du -sh "$dir" | cut -f1))"
        ;;
    --run)
        dir=$(cd "$2" && pwd)
        out=$3
        shift 3
        mkdir -p "$out"
        python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/kx-site "$dir"/whl/*.whl
        export PYTHONPATH=/tmp/kx-site${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
        work=$(mktemp -d)
        xz -dc "$dir/libkairox.so.xz" > "$work/libkairox.so"
        mkdir -p "$work/bin"
        cp "$dir"/bin/* "$work/bin/"
        for f in "$work"/bin/*.xz; do
            xz -d "$f"
        done
        chmod +x "$work"/bin/*
        cp "$dir"/*.so* "$work/" 2>/dev/null || true
        rm -f "$work/libkairox.so.xz"
        # cuBLAS and the CUDA runtime from the machine's Python packages
        libs=$(python3 -c 'import glob, site; print(":".join(d for p in site.getsitepackages() for d in glob.glob(p + "/nvidia/cu*/lib")))')
        export LD_LIBRARY_PATH="$work:$libs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
        export KAIROX_LIB=$work/libkairox.so
        {
            echo "date: $(date -u +%FT%TZ)  commit: $(cat "$dir/COMMIT")"
            nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || echo "no nvidia-smi"
            grep -m1 "model name" /proc/cpuinfo || true
            echo "cores: $(nproc)"
        } | tee "$out/env.txt"
        # correctness first: the hybrid runtime on the GPU against the CPU-only sparse path
        python3 - "$work/compare.gguf" "$work/compare-original.gguf" <<'EOF'
import sys
from dataclasses import replace
from kairox_py.benchmark.synthetic import SHAPES, SparseSpec, write_original, write_synthetic_llama
write_synthetic_llama(sys.argv[1], replace(SHAPES["7b"], n_layer=4), "q4_0", SparseSpec(pred_rank=64), group_size=32)
write_original(sys.argv[1], sys.argv[2])
EOF
        timeout 90 "$work/bin/test-kairox-hybrid" "$work/compare.gguf" compare 16 --dense-on-device \
            > "$out/compare.log" 2>&1 || echo "compare: exit $?"
        tail -3 "$out/compare.log"
        # everything resident against upstream, per decode step, with and without CUDA graphs
        # (ggml-cuda reads GGML_CUDA_DISABLE_GRAPHS once per process)
        timeout 60 "$work/bin/test-kairox-hybrid" "$work/compare.gguf" speed "$work/compare-original.gguf" 64 \
            > "$out/speed.log" 2>&1 || echo "speed: exit $?"
        GGML_CUDA_DISABLE_GRAPHS=1 timeout 60 "$work/bin/test-kairox-hybrid" "$work/compare.gguf" speed \
            "$work/compare-original.gguf" 64 > "$out/speed-no-cuda-graphs.log" 2>&1 || echo "speed, no CUDA graphs: exit $?"
        cat "$out/speed.log" "$out/speed-no-cuda-graphs.log"
        # which kernels make the difference: each configuration's device time per step by kernel,
        # recorded by Nsight Compute over the same 8 steps (kernels.md; skipped without ncu)
        ncu=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu /usr/local/cuda/bin/ncu 2>/dev/null | head -1 || true)
        if [ -n "$ncu" ]; then
            for c in upstream fit half; do
                GGML_CUDA_DISABLE_GRAPHS=1 timeout 150 "$ncu" --profile-from-start off --clock-control none \
                    --metrics gpu__time_duration.sum --print-kernel-base demangled --print-units base --csv \
                    --log-file "$out/ncu-$c.csv" "$work/bin/test-kairox-hybrid" "$work/compare.gguf" speed \
                    "$work/compare-original.gguf" 8 --profile "$c" > "$out/ncu-$c.log" 2>&1 || echo "ncu $c: exit $?"
            done
            python3 scripts/kernel_profile.py --steps 8 upstream="$out/ncu-upstream.csv" fit="$out/ncu-fit.csv" \
                half="$out/ncu-half.csv" -o "$out/kernels" || echo "kernel profile: exit $?"
        else
            echo "no ncu: no per-kernel profile"
        fi
        rm -f "$work/compare.gguf" "$work/compare-original.gguf"

        python3 scripts/hybrid_h2h.py --llama-bench "$work/bin/llama-bench" --models "$work" --out "$out" "$@" \
            2>&1 | tee "$out/h2h.log"
        ;;
    *)
        sed -n '2,20p' "$0"
        exit 2
        ;;
esac
