# Sourced by scripts/sanitize_ops.sh and scripts/tsan_hybrid.sh: configures a sanitizer build
# of Kairox's tests (no tools, no CUDA kernels) in DIR and builds TARGETS (space-separated),
# from the repository root.
#
#   sanitizer_build DIR "TARGETS" [CMAKE_ARG...]
sanitizer_build() {
    local build=$1 targets=$2
    shift 2
    # pip's isolated build brings its own CMake; a fresh virtualenv may have none on PATH
    command -v cmake >/dev/null || python3 -m pip install -q cmake ninja
    local gen=()
    command -v ninja >/dev/null && gen=(-G Ninja)
    cmake -S . -B "$build" "${gen[@]}" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DKAIROX_TOOLS=OFF \
        -DKAIROX_CUDA_KERNELS=OFF "$@" >/dev/null
    # shellcheck disable=SC2086 # one target per word
    cmake --build "$build" --target $targets -j "$(nproc)"
}
