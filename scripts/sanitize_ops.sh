#!/usr/bin/env bash
# The sparse ops under AddressSanitizer and UndefinedBehaviorSanitizer: builds ggml, the CPU
# kernels and test-kairox-ops with KAIROX_SANITIZE=ON into BUILD_DIR (default
# build/sanitize, kept between runs) and runs the op test's cases: small shapes, every weight
# type, every path (sparse and dense-layout gate/up and down, batches, thread splits, the
# deterministic blocks, the counters), at 1 and 2 threads. Any sanitizer report fails the run.
# CI runs it after the Python suite (.ci/run).
#
#   scripts/sanitize_ops.sh [BUILD_DIR]
set -euo pipefail
if [ "${1:-}" = "-h" ] || [ "${1:-}" = "--help" ]; then
    sed -n '2,9p' "$0" | sed 's/^# \{0,1\}//'
    exit 0
fi
cd "$(dirname "$0")/.."
build=${1:-build/sanitize}
# shellcheck source=scripts/sanitizer_build.sh
source scripts/sanitizer_build.sh
sanitizer_build "$build" test-kairox-ops -DKAIROX_SANITIZE=ON
export ASAN_OPTIONS=halt_on_error=1:abort_on_error=1:detect_leaks=1:strict_string_checks=1
export UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1
"$build/bin/test-kairox-ops" test -t 2
