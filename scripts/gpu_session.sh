#!/usr/bin/env bash
# One GPU session's checks, staged here and run there in one call (the device tool lends a GPU
# machine for minutes, carries at most 64 MiB and reaches no network): the CUDA kernels' test
# and timings (scripts/cuda_check.sh), then issue 35's head-to-head with its correctness and
# per-step speed checks (scripts/h2h_gpu.sh).
#
#   scripts/gpu_session.sh --stage DIR [CUDA_ROOT]
#       on this machine (~30 min on 2 cores the first time): DIR/cc and DIR/h2h; says when
#       they need a call each, and fails when one alone is more than a call carries
#   scripts/gpu_session.sh --run DIR OUT [--only cc|h2h] [hybrid_h2h.py options]
#       on the GPU machine, from the repository root: OUT/cc.tar.gz (test.log, perf.log, ...)
#       and OUT/h2h.tar.gz (compare.log, speed.log, kernels.md, h2h.csv, ...), one archive per
#       part because the device tool brings back at most 8 files. One call must end within its
#       600 s: the kernel checks take minutes with their sanitizers, so give the head-to-head
#       `--deadline 200`, or run each part in a call of its own (--only).
set -euo pipefail
case "${1:-}" in
    --stage)
        [ $# -ge 2 ] || { sed -n '7,9p' "$0" | sed 's/^# \{0,1\}//'; exit 2; }
        cd "$(dirname "$0")/.."
        dir=$2
        scripts/cuda_check.sh --stage "$dir/cc" "${3:-}"
        scripts/h2h_gpu.sh --stage "$dir/h2h" "${3:-}"
        # a call carries the working tree (tracked files and untracked ones git does not ignore)
        # with what it names, 64 MiB in all
        tree=$( { git ls-files -z; git ls-files -z --others --exclude-standard; } | xargs -0 du -cb 2>/dev/null \
                | awk '$2 == "total" { s += $1 } END { print int(s / 1048576) + 1 }')
        size=$(du -sm "$dir" | cut -f1)
        echo "staged in $dir: ${size} MiB, with the working tree's ${tree} MiB"
        if [ $((size + tree)) -gt 63 ]; then
            echo "more than one call carries (64 MiB with the tree): carry $dir/cc and $dir/h2h in two calls" >&2
            for part in cc h2h; do
                [ $(( $(du -sm "$dir/$part" | cut -f1) + tree )) -le 63 ] \
                    || { echo "$dir/$part alone with the tree is over 63 MiB" >&2; exit 1; }
            done
        fi
        ;;
    --run)
        [ $# -ge 3 ] || { sed -n '10,15p' "$0" | sed 's/^# \{0,1\}//'; exit 2; }
        dir=$2 out=$3
        shift 3
        only=""
        if [ "${1:-}" = "--only" ]; then
            only=${2:-}
            [ "$only" = cc ] || [ "$only" = h2h ] || { echo "--only: cc or h2h" >&2; exit 2; }
            shift 2
        fi
        mkdir -p "$out"
        pack() { tar -czf "$out/$1.tar.gz" -C "$out" "$1" && rm -rf "${out:?}/$1"; }
        rc=0
        if [ "$only" != h2h ]; then
            "$dir/cc/cuda_check.sh" --run "$dir/cc" "$out/cc" || rc=$?
            pack cc || rc=$?
        fi
        if [ "$only" != cc ]; then
            bash scripts/h2h_gpu.sh --run "$dir/h2h" "$out/h2h" "$@" || rc=$?
            pack h2h || rc=$?
        fi
        exit $rc
        ;;
    *)
        sed -n '2,15p' "$0" | sed 's/^# \{0,1\}//'
        exit 2
        ;;
esac
