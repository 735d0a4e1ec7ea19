#!/usr/bin/env bash
# Decode efficiency per quantization on the lent GPU (benchmarks/quant_sweep.py), in one
# call of the device tool: build llama-bench and llama-quantize for $ARCH (in the
# background) while writing a random-weight GGUF of the Qwen2.5-32B shape cut to
# $LAYERS layers (the per-layer shapes are the real ones; fewer layers keep the
# requantizations inside the call's time), then requantize and measure each type.
#   OUT=$OUT bash benchmarks/h200/quant_sweep.sh
#   SHAPE=qwen35-27b OUT=$OUT bash benchmarks/h200/quant_sweep.sh   the hybrid (gated delta net
#                                    + every 4th layer full attention) instead of the dense 32B
# Needs the llama.cpp source archive (.cache/harness/llama.cpp-<commit>.tar.gz), nvcc,
# cmake and ninja, Python 3 with numpy and nvidia-ml-py. Never changes clocks or power.
set -uo pipefail
REPO=$(cd "$(dirname "$0")/../.." && pwd)
WORK=${WORK:-/root/quant-sweep}
OUT=${OUT:-$WORK/out}
ARCH=${ARCH:-90}
LAYERS=${LAYERS:-16}
SHAPE=${SHAPE:-qwen25-32b}
QUANTS=${QUANTS:-Q3_K_M,Q4_K_M,Q5_K_M,Q6_K,Q8_0}
TARBALL=${TARBALL:-$REPO/.cache/harness/llama.cpp-0c1e57098bba.tar.gz}
mkdir -p "$WORK/src" "$OUT"
stamp() { echo "[$(date -u +%H:%M:%S) +${SECONDS}s] $*"; }
tar -xzf "$TARBALL" -C "$WORK/src" --strip-components=1 || exit 2
python3 -c "import pynvml" 2>/dev/null || python3 -m pip install -q --no-index --find-links "$REPO/.gpuhost/wheelhouse" \
  --target "$WORK/py" nvidia-ml-py || exit 2
export PYTHONPATH="$WORK/py:$WORK/src/gguf-py:${PYTHONPATH:-}"
stamp "build llama-bench, llama-quantize (sm_$ARCH) in the background"
( cmake -S "$WORK/src" -B "$WORK/build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DGGML_CUDA=ON \
    -DCMAKE_CUDA_ARCHITECTURES="$ARCH" -DGGML_NATIVE=ON -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF \
    -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_USE_PREBUILT_UI=OFF \
  && ninja -C "$WORK/build" llama-bench llama-quantize ) > "$OUT/build.log" 2>&1 &
BUILD=$!
stamp "write the random-weight base model ($SHAPE, $LAYERS layers, every weight Q4_K)"
python3 "$REPO/benchmarks/make_random_gguf.py" "$WORK/base-q4_k.gguf" --shape "$SHAPE" --layers "$LAYERS" \
  > "$OUT/model-write.log" 2>&1 \
  || { tail -5 "$OUT/model-write.log"; exit 3; }
stamp "wait for the build"
wait $BUILD || { tail -30 "$OUT/build.log"; exit 4; }
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.mem,clocks.max.sm,power.limit --format=csv \
  > "$OUT/nvidia-smi.csv" 2>&1
stamp "requantize and measure: $QUANTS"
python3 "$REPO/benchmarks/quant_sweep.py" --bin-dir "$WORK/build/bin" --base "$WORK/base-q4_k.gguf" \
  --work "$WORK" --out "$OUT/quant-sweep.json" --quants "$QUANTS" 2>&1 | tee "$OUT/quant-sweep.txt"
stamp "done"
