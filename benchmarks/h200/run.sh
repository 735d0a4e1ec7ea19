#!/usr/bin/env bash
# The whole real-GPU run, reproducibly, on a machine with one NVIDIA GPU, CUDA's
# nvcc, Python 3 with torch and nvidia-ml-py, and no network:
#
#   benchmarks/h200/run.sh prepare   build llama.cpp (CUDA, arch $ARCH), write the
#                                    random-weight 32B-shaped Q4_K GGUF, measure the
#                                    read bandwidth with torch
#   benchmarks/h200/run.sh bench     planner with real NVML facts, the planned server
#                                    and the seeds' and llama.cpp's default servers,
#                                    the load test, llama-bench, llama-fit-params
#   benchmarks/h200/run.sh all       both
#   benchmarks/h200/run.sh validate  prepare (with the hybrid), then issue 14's out-of-
#                                    sample configurations and the throughput plan
#   HYBRID=1 benchmarks/h200/run.sh prepare   also write the random Qwen3.5-27B-shaped
#                                    hybrid (~15 GB); then `bench-hybrid`: defaults, plan
#                                    and two more plans on it (bench-h200-hybrid.json,
#                                    summary-hybrid.md); HYBRID=1 ... all runs it too
#
# Inputs: the llama.cpp source archive (.cache/harness/llama.cpp-<commit>.tar.gz,
# made by scripts/fetch-llama-source.sh; its gguf-py is used to write and read
# the GGUF). Work files go to $WORK (default /root/llm-fleet-bench: ~19 GB for the
# model); results to $OUT (default $WORK/out): bandwidth.json, bench-h200.json,
# summary.md, run logs. Nothing here changes the GPU's clocks, power limit or
# persistence mode.
set -euo pipefail

REPO=$(cd "$(dirname "$0")/../.." && pwd)
WORK=${WORK:-/root/llm-fleet-bench}
OUT=${OUT:-$WORK/out}
ARCH=${ARCH:-90}
JOBS=${JOBS:-$(nproc)}
COMMIT=${COMMIT:-0c1e57098bba43ac29e6e3b677cdceebdd22334f}
TARBALL=${TARBALL:-$REPO/.cache/harness/llama.cpp-${COMMIT:0:12}.tar.gz}
MODEL=$WORK/qwen2.5-32b-shape-q4_k-random.gguf
HYBRID=${HYBRID:-0}
HYBRID_MODEL=$WORK/qwen3.5-27b-shape-q4_k-random.gguf
NPREDICT=${NPREDICT:-128}
mkdir -p "$WORK" "$OUT" "$WORK/logs"

stamp() { echo "[$(date -u +%H:%M:%S)] $*"; }

# EXTRA_TARGETS: more of llama.cpp's programs to build (llama-batched-bench for server_throughput.sh)
TARGETS="llama-server llama-bench llama-fit-params ${EXTRA_TARGETS:-}"

build() {
    local t missing=0
    for t in $TARGETS; do [ -x "$WORK/build/bin/$t" ] || missing=1; done
    if [ "$missing" = 0 ]; then
        stamp "build: already there"; return 0
    fi
    local nvcc; nvcc=$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)
    local t0=$SECONDS
    cmake -S "$WORK/src" -B "$WORK/build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
        -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES="$ARCH" -DCMAKE_CUDA_COMPILER="$nvcc" \
        -DGGML_CUDA_NCCL=OFF -DGGML_NATIVE=ON \
        -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF
    # shellcheck disable=SC2086 # a list of targets
    ninja -C "$WORK/build" -j "$JOBS" $TARGETS
    echo "{\"build_seconds\": $((SECONDS - t0)), \"arch\": \"$ARCH\", \"jobs\": $JOBS, \"nvcc\": \"$($nvcc --version | tail -2 | head -1)\"}" > "$WORK/build.json"
}

prepare() {
    if [ ! -f "$WORK/src/CMakeLists.txt" ]; then
        [ -f "$TARBALL" ] || { echo "no llama.cpp source archive at $TARBALL" >&2; exit 2; }
        mkdir -p "$WORK/src" && tar xzf "$TARBALL" -C "$WORK/src" --strip-components=1
    fi
    stamp "build llama.cpp (arch $ARCH, -j$JOBS) in the background"
    build > "$WORK/logs/build.log" 2>&1 &
    local bpid=$!
    if [ ! -f "$MODEL" ]; then
        stamp "write the model"
        PYTHONPATH="$WORK/src/gguf-py" python3 "$REPO/benchmarks/make_random_gguf.py" "$MODEL"
    fi
    if [ "$HYBRID" = 1 ] && [ ! -f "$HYBRID_MODEL" ]; then
        stamp "write the hybrid model"
        PYTHONPATH="$WORK/src/gguf-py" python3 "$REPO/benchmarks/make_random_gguf.py" --shape qwen35-27b "$HYBRID_MODEL"
    fi
    stamp "measure read bandwidth (torch)"
    python3 "$REPO/benchmarks/h200/bandwidth.py" 8 > "$WORK/bandwidth.json"
    cat "$WORK/bandwidth.json"
    nvidia-smi --query-gpu=name,driver_version,memory.total,memory.used,clocks.max.mem,clocks.max.sm,power.limit --format=csv > "$WORK/nvidia-smi.csv" || true
    stamp "wait for the build"
    if ! wait $bpid; then tail -40 "$WORK/logs/build.log"; exit 3; fi
    tail -3 "$WORK/logs/build.log"; cat "$WORK/build.json"
    cp "$WORK/bandwidth.json" "$WORK/build.json" "$WORK/nvidia-smi.csv" "$OUT/" 2>/dev/null || true
}

bench() {
    local bw
    bw=$(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['read_gbs'])" "$WORK/bandwidth.json")
    stamp "benchmark (measured read bandwidth $bw GB/s)"
    PYTHONPATH="$WORK/src/gguf-py" PYTHONUNBUFFERED=1 python3 "$REPO/benchmarks/bench_configs.py" \
        --bin-dir "$WORK/build/bin" --model "$MODEL" --out "$OUT/bench-h200.json" --log-dir "$WORK/logs" \
        --bandwidth-gbs "$bw" --commit "$COMMIT" --n-predict "$NPREDICT" --llama-bench \
        --configs defaults,seed003,seed000,plan \
        --extra-plan 'long_q8={"target_ctx": 131072, "target_parallel": 8, "cache_types": ["q8_0"]}' \
        --extra-plan 'many_q4={"target_ctx": 65536, "target_parallel": 16, "cache_types": ["q4_0"]}' \
        --extra-plan 'big_f16={"target_ctx": 262144, "target_parallel": 8, "cache_types": ["f16"]}'
    python3 "$REPO/benchmarks/summarize.py" "$OUT/bench-h200.json" "$WORK/bandwidth.json" > "$OUT/summary.md"
    cp "$WORK/bandwidth.json" "$WORK/build.json" "$WORK/nvidia-smi.csv" "$OUT/" 2>/dev/null || true
    tar czf "$OUT/logs.tar.gz" -C "$WORK" logs
}

# the hybrid: only llama.cpp's defaults and plans (the seeds' settings were tuned for the dense
# model); its own log folder, as the servers' logs are named by configuration
bench_hybrid() {
    [ -f "$HYBRID_MODEL" ] || { echo "no hybrid model at $HYBRID_MODEL (HYBRID=1 $0 prepare)" >&2; exit 2; }
    local bw
    bw=$(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['read_gbs'])" "$WORK/bandwidth.json")
    stamp "benchmark the hybrid (measured read bandwidth $bw GB/s)"
    mkdir -p "$WORK/logs/hybrid"
    PYTHONPATH="$WORK/src/gguf-py" PYTHONUNBUFFERED=1 python3 "$REPO/benchmarks/bench_configs.py" \
        --bin-dir "$WORK/build/bin" --model "$HYBRID_MODEL" --out "$OUT/bench-h200-hybrid.json" \
        --log-dir "$WORK/logs/hybrid" --bandwidth-gbs "$bw" --commit "$COMMIT" --n-predict "$NPREDICT" --llama-bench \
        --configs defaults,plan \
        --extra-plan 'long_q8={"target_ctx": 131072, "target_parallel": 8, "cache_types": ["q8_0"]}' \
        --extra-plan 'many={"target_ctx": 65536, "target_parallel": 16}'
    python3 "$REPO/benchmarks/summarize.py" "$OUT/bench-h200-hybrid.json" "$WORK/bandwidth.json" > "$OUT/summary-hybrid.md"
    cp "$WORK/bandwidth.json" "$WORK/build.json" "$WORK/nvidia-smi.csv" "$OUT/" 2>/dev/null || true
    tar czf "$OUT/logs.tar.gz" -C "$WORK" logs
}

# Issue 14's out-of-sample check: configurations no constant was fitted to (other
# contexts, slot counts and KV types, on the dense and the hybrid model), and the
# throughput objective's plan beside llama.cpp's defaults and the seeds' settings.
# Needs HYBRID=1 at prepare. Results: bench-h200.json / summary.md (dense),
# bench-h200-hybrid.json / summary-hybrid.md.
validate() {
    [ -f "$HYBRID_MODEL" ] || { echo "no hybrid model at $HYBRID_MODEL (HYBRID=1 $0 prepare)" >&2; exit 2; }
    local bw
    bw=$(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['read_gbs'])" "$WORK/bandwidth.json")
    stamp "validate on the dense model (measured read bandwidth $bw GB/s)"
    PYTHONPATH="$WORK/src/gguf-py" PYTHONUNBUFFERED=1 python3 "$REPO/benchmarks/bench_configs.py" \
        --bin-dir "$WORK/build/bin" --model "$MODEL" --out "$OUT/bench-h200.json" --log-dir "$WORK/logs" \
        --bandwidth-gbs "$bw" --commit "$COMMIT" --n-predict "$NPREDICT" \
        --configs defaults,seed003,seed000,plan \
        --extra-plan 'throughput={"objective": "throughput"}' \
        --extra-plan 'c49k_np6_q8={"target_ctx": 49152, "target_parallel": 6, "cache_types": ["q8_0"]}' \
        --extra-plan 'c48k_np12_f16={"target_ctx": 49152, "target_parallel": 12, "cache_types": ["f16"]}' \
        --extra-plan 'c16k_np2_q4={"target_ctx": 16384, "target_parallel": 2, "cache_types": ["q4_0"]}'
    python3 "$REPO/benchmarks/summarize.py" "$OUT/bench-h200.json" "$WORK/bandwidth.json" > "$OUT/summary.md"
    stamp "validate on the hybrid model"
    mkdir -p "$WORK/logs/hybrid"
    PYTHONPATH="$WORK/src/gguf-py" PYTHONUNBUFFERED=1 python3 "$REPO/benchmarks/bench_configs.py" \
        --bin-dir "$WORK/build/bin" --model "$HYBRID_MODEL" --out "$OUT/bench-h200-hybrid.json" \
        --log-dir "$WORK/logs/hybrid" --bandwidth-gbs "$bw" --commit "$COMMIT" --n-predict "$NPREDICT" \
        --configs plan \
        --extra-plan 'throughput={"objective": "throughput"}' \
        --extra-plan 'c65k_np6_q8={"target_ctx": 65536, "target_parallel": 6, "cache_types": ["q8_0"]}' \
        --extra-plan 'c48k_np12_f16={"target_ctx": 49152, "target_parallel": 12, "cache_types": ["f16"]}'
    python3 "$REPO/benchmarks/summarize.py" "$OUT/bench-h200-hybrid.json" "$WORK/bandwidth.json" > "$OUT/summary-hybrid.md"
    cp "$WORK/bandwidth.json" "$WORK/build.json" "$WORK/nvidia-smi.csv" "$OUT/" 2>/dev/null || true
    tar czf "$OUT/logs.tar.gz" -C "$WORK" logs
}

case "${1:-all}" in
    prepare) prepare ;;
    bench) bench ;;
    bench-hybrid) bench_hybrid ;;
    validate) HYBRID=1 prepare; validate ;;
    all) prepare; bench; if [ "$HYBRID" = 1 ]; then bench_hybrid; fi ;;
    *) echo "usage: $0 prepare|bench|bench-hybrid|validate|all" >&2; exit 2 ;;
esac
stamp done
