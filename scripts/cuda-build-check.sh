#!/usr/bin/env bash
# The slow check CI leaves out (`make cuda-build-check`): compile llama.cpp's CUDA
# backend for the Tesla V100 (sm_70) with a real CUDA 11.8 toolchain, the way the
# llama_cpp role builds it, and show sm_70 code in the result (cuobjdump --list-elf).
#
# Runs on this machine, not in a container, as root (apt). The toolchain is
# Debian 12's non-free nvidia-cuda-toolkit 11.8.89 with its GCC 11 (cuda-g++);
# the test hosts' nvcc is a stub. CMake would find the machine's CUDA 13 under
# /usr/local first (which cannot target sm_70), so it runs with PATH=/usr/bin:/bin
# and the toolkit named explicitly. ccache keeps the objects, so a rerun after a
# commit bump compiles only what changed.
#
# Env: CUDA_CHECK_DIR   work directory (default .cache/cuda-build-check)
#      CUDA_CHECK_TARGETS  ninja targets (default: the role's targets)
#      CUDA_CHECK_JOBS  ninja -j (default: ninja's)
# Prints the time of each step; the summary also goes to $CUDA_CHECK_DIR/result.txt.
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
dir=${CUDA_CHECK_DIR:-$root/.cache/cuda-build-check}
targets=${CUDA_CHECK_TARGETS:-llama-server llama-bench llama-quantize llama-fit-params}
arch=70
mkdir -p "$dir"
result="$dir/result.txt"
: > "$result"
step_start=$SECONDS
total_start=$SECONDS
step() {
  local line
  line=$(printf '== cuda-build-check: %-28s %5d s' "$1" $((SECONDS - step_start)))
  echo "$line" | tee -a "$result"
  step_start=$SECONDS
}
note() { echo "== cuda-build-check: $*" | tee -a "$result"; }

# --- 1. CUDA 11.8 toolchain from Debian non-free -------------------------------
if ! /usr/bin/nvcc --version 2>/dev/null | grep -q 'release 11\.8' || [ ! -x /usr/bin/cuda-g++ ] \
  || ! command -v cmake ninja ccache >/dev/null; then
  [ "$(id -u)" = 0 ] || { echo "cuda-build-check: run as root to install the CUDA 11.8 toolchain" >&2; exit 1; }
  # shellcheck source=/dev/null
  . /etc/os-release
  [ "${VERSION_CODENAME:-}" = bookworm ] || { echo "cuda-build-check: needs Debian 12 (bookworm); this is ${PRETTY_NAME:-unknown}" >&2; exit 1; }
  cat > /etc/apt/sources.list.d/llm-fleet-cuda-build-check.sources <<'EOF'
# Added by scripts/cuda-build-check.sh: Debian's non-free CUDA 11.8 toolkit (libcuda1 needs contrib's nvidia-support).
Types: deb
URIs: http://deb.debian.org/debian
Suites: bookworm bookworm-updates
Components: contrib non-free
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
EOF
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
    nvidia-cuda-toolkit nvidia-cuda-toolkit-gcc cmake ninja-build ccache build-essential >/dev/null
  step "install the toolchain"
fi
note "$(/usr/bin/nvcc --version | grep release); host compiler $(/usr/bin/cuda-g++ --version | head -n1)"

# --- 2. Source: the archive the tests use (the pinned commit) -------------------
scripts/fetch-llama-source.sh "$root/.cache/harness" >/dev/null
record="$root/.cache/harness/llama.cpp-source.json"
archive="$root/.cache/harness/$(sed -n 's/.*"archive": "\([^"]*\)".*/\1/p' "$record")"
commit=$(sed -n 's/.*"commit": "\([0-9a-f]*\)".*/\1/p' "$record")
rm -rf "$dir/src" "$dir/build"
mkdir -p "$dir/src" "$dir/ccache"
tar -xzf "$archive" -C "$dir/src" --strip-components=1
note "llama.cpp ${commit:0:12} from $(basename "$archive")"

# --- 3. Configure and build as the role does (CUDA backend, arch 70) -------------
export PATH=/usr/bin:/bin
export CCACHE_DIR="$dir/ccache" CCACHE_BASEDIR="$dir" CCACHE_COMPILERCHECK=content CCACHE_SLOPPINESS=time_macros
ccache --zero-stats >/dev/null
step_start=$SECONDS
# shellcheck disable=SC2016 # $ORIGIN is for the dynamic linker, not the shell
cmake -S "$dir/src" -B "$dir/build" -G Ninja \
  -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=ON -DGGML_NATIVE=OFF \
  -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TOOLS=ON -DLLAMA_BUILD_SERVER=ON \
  -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_OPENSSL=OFF \
  -DLLAMA_BUILD_NUMBER=0 "-DLLAMA_BUILD_COMMIT=${commit:0:9}" \
  -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=$arch \
  -DCUDAToolkit_ROOT=/usr -DCMAKE_CUDA_COMPILER=/usr/bin/nvcc -DCMAKE_CUDA_HOST_COMPILER=/usr/bin/cuda-g++ \
  -DGGML_CCACHE=OFF -DCMAKE_C_COMPILER_LAUNCHER=ccache -DCMAKE_CXX_COMPILER_LAUNCHER=ccache \
  -DCMAKE_CUDA_COMPILER_LAUNCHER=ccache \
  '-DCMAKE_INSTALL_RPATH=$ORIGIN/../lib;$ORIGIN' -DCMAKE_BUILD_WITH_INSTALL_RPATH=ON \
  > "$dir/configure.log" 2>&1 || { tail -n 40 "$dir/configure.log"; exit 1; }
grep -E 'CUDA Toolkit found|Using CUDA architectures|CUDA host compiler' "$dir/configure.log" | sed 's/^/   /' || true
step configure
cuda_sources=$(find "$dir/src/ggml/src/ggml-cuda" -name '*.cu' | wc -l)
note "building $targets ($cuda_sources CUDA sources), log $dir/build.log"
# shellcheck disable=SC2086 # the target list is meant to split
if ! ninja -C "$dir/build" ${CUDA_CHECK_JOBS:+-j "$CUDA_CHECK_JOBS"} $targets > "$dir/build.log" 2>&1; then
  tail -n 40 "$dir/build.log"
  step "build FAILED"
  exit 1
fi
step build
note "ccache: $(ccache --print-stats | awk '$1 ~ /^(direct|preprocessed)_cache_hit$/ {h += $2} $1 == "cache_miss" {m = $2} END {printf "%d hits, %d compiled", h, m}')"

# --- 4. The result holds sm_70 code ----------------------------------------------
lib="$dir/build/bin/libggml-cuda.so"
for candidate in "$lib".*; do [ -f "$candidate" ] && [ ! -L "$candidate" ] && lib=$candidate; done
/usr/bin/cuobjdump --list-elf "$lib" > "$dir/cuobjdump-elf.txt"
/usr/bin/cuobjdump --list-ptx "$lib" > "$dir/cuobjdump-ptx.txt" 2>/dev/null || true
cubins=$(grep -c "\.sm_${arch}\." "$dir/cuobjdump-elf.txt" || true)
others=$(grep -v "\.sm_${arch}\." "$dir/cuobjdump-elf.txt" | grep -c 'sm_' || true)
# cuobjdump names the PTX of virtual architecture compute_70 after the real one (...sm_70.ptx).
ptx=$(grep -c "\.sm_${arch}\.ptx" "$dir/cuobjdump-ptx.txt" || true)
note "$(basename "$lib"): $(du -h "$lib" | cut -f1), $cubins sm_${arch} cubins, $ptx PTX (compute_${arch}), $others cubins of other architectures"
note "links: $(ldd "$lib" | grep -oE 'lib(cudart|cublas|cuda)\.so[^ ]*' | sort -u | paste -sd' ')"
"$dir/build/bin/llama-server" --version 2>&1 | grep -E '^(version|built with)' | sed 's/^/   /' | tee -a "$result" || true
step_start=$total_start
step total
if [ "$cubins" -gt 0 ] && [ "$others" -eq 0 ]; then
  note "PASSED: the CUDA backend holds sm_${arch} code"
else
  note "FAILED: expected sm_${arch} cubins only (see $dir/cuobjdump-elf.txt)"
  exit 1
fi
