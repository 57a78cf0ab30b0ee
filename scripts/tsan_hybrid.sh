#!/usr/bin/env bash
# The hybrid runtime and the scheduler under ThreadSanitizer, on the eager fake GPU (worker
# threads run its queued graphs and copies concurrently with the host, as a GPU's queue does):
# builds test-kairox-sched and test-kairox-hybrid with -fsanitize=thread (ggml's own thread
# pool: GGML_OPENMP=OFF, as TSan cannot see OpenMP's synchronisation) into BUILD_DIR (default
# build/tsan, kept between runs) and runs the scheduler's copy and timing test, the compare on
# a Kairox GGUF with predictors, and decodes stopped mid-graph. Any report fails the run. About
# 15 minutes to build and 30 to run on 2 cores, so CI does not run it.
#
#   scripts/tsan_hybrid.sh KX.gguf [BUILD_DIR]
set -euo pipefail
if [ $# -lt 1 ] || [ "$1" = "-h" ] || [ "$1" = "--help" ]; then
    sed -n '2,10p' "$0" | sed 's/^# \{0,1\}//'
    [ $# -ge 1 ]; exit $?
fi
model=$(realpath "$1")
[ -f "$model" ] || { echo "no such model: $1" >&2; exit 2; }
cd "$(dirname "$0")/.."
build=${2:-build/tsan}
# shellcheck source=scripts/sanitizer_build.sh
source scripts/sanitizer_build.sh
sanitizer_build "$build" "test-kairox-sched test-kairox-hybrid" -DGGML_OPENMP=OFF \
    -DCMAKE_C_FLAGS=-fsanitize=thread -DCMAKE_CXX_FLAGS=-fsanitize=thread \
    -DCMAKE_EXE_LINKER_FLAGS=-fsanitize=thread -DCMAKE_SHARED_LINKER_FLAGS=-fsanitize=thread
export TSAN_OPTIONS=halt_on_error=1:exitcode=66
"$build/bin/test-kairox-sched"
# the compare's exit 1 means a run's top tokens agreed at fewer than 90% of its steps (the
# default mode's float sums), not a race: TSan's reports exit 66
rc=0
"$build/bin/test-kairox-hybrid" "$model" compare 8 --fake-gpu=eager || rc=$?
[ "$rc" -le 1 ] || exit "$rc"
"$build/bin/test-kairox-hybrid" "$model" --fake-gpu=eager
echo "no ThreadSanitizer report"
