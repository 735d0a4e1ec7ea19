#!/usr/bin/env bash
# Issue 34 on a machine with one NVIDIA GPU (as h200/run.sh): where llama-server's
# throughput goes, benchmarks/server_throughput.py.
#
#   benchmarks/h200/server_throughput.sh prepare   h200/run.sh's build (with
#       llama-batched-bench) and model, then llama-server once more with the server's
#       DEBUG_TIMINGS on (bin/llama-server-timings: only server-context.cpp recompiles)
#   benchmarks/h200/server_throughput.sh bench [server_throughput.py options]
#   benchmarks/h200/server_throughput.sh all   both (the engine and every variant)
#
# WORK (default .bench-work in the repository, ignored by git) keeps the build and the
# model between calls; results go to OUT (default $WORK/out).
set -euo pipefail

REPO=$(cd "$(dirname "$0")/../.." && pwd)
export WORK=${WORK:-$REPO/.bench-work}
export OUT=${OUT:-$WORK/out}
export EXTRA_TARGETS=llama-batched-bench
MODEL=$WORK/qwen2.5-32b-shape-q4_k-random.gguf
BIN=$WORK/build/bin
mkdir -p "$WORK" "$OUT"

stamp() { echo "[$(date -u +%H:%M:%S)] $*"; }

prepare() {
    bash "$REPO/benchmarks/h200/run.sh" prepare
    if [ ! -x "$BIN/llama-server-timings" ]; then
        stamp "llama-server with DEBUG_TIMINGS"
        local src=$WORK/src/tools/server/server-context.cpp
        cp "$BIN/llama-server" "$BIN/llama-server.base"
        sed -i 's|^// #define DEBUG_TIMINGS$|#define DEBUG_TIMINGS|' "$src"
        grep -q '^#define DEBUG_TIMINGS$' "$src" || { echo "no DEBUG_TIMINGS switch in $src" >&2; exit 3; }
        ninja -C "$WORK/build" llama-server > "$WORK/logs/build-timings.log" 2>&1
        mv "$BIN/llama-server" "$BIN/llama-server-timings"
        mv "$BIN/llama-server.base" "$BIN/llama-server"
        sed -i 's|^#define DEBUG_TIMINGS$|// #define DEBUG_TIMINGS|' "$src"
    fi
}

bench() {
    stamp "server throughput"
    PYTHONPATH="$WORK/src/gguf-py" PYTHONUNBUFFERED=1 python3 "$REPO/benchmarks/server_throughput.py" --bin-dir "$BIN" \
        --timings-bin "$BIN/llama-server-timings" --model "$MODEL" --log-dir "$WORK/logs" \
        --out "$OUT/server-throughput.json" "$@"
    cp "$WORK/bandwidth.json" "$WORK/build.json" "$WORK/nvidia-smi.csv" "$OUT/" 2>/dev/null || true
    tar czf "$OUT/server-logs.tar.gz" -C "$WORK/logs" . 2>/dev/null || true
}

case "${1:-all}" in
    prepare) prepare ;;
    bench) shift; bench "$@" ;;
    all) prepare; bench ;;
    *) echo "usage: $0 prepare|bench [options]|all" >&2; exit 2 ;;
esac
stamp done
