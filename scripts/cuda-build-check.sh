#!/usr/bin/env bash
# The slow check CI leaves out (`make cuda-build-check`): the llama_cpp role
# itself compiles llama.cpp's CUDA backend for the Tesla V100 (sm_70) with a real
# CUDA 11.8 toolchain, and its own smoke check (cuobjdump --list-elf, ldd,
# llama-server --version) passes on the result. Same code path as on a fleet.
#
# The build host is a container of the harness image (scripts/setup.sh builds
# it) on Docker's bridge network, with Debian 12's non-free CUDA 11.8 toolkit
# (nvidia-cuda-toolkit 11.8.89, nvcc at /usr/bin, GCC 11 as cuda-g++) installed
# the way an operator installs a toolkit the role does not manage. It has no
# GPU, so the architectures are given (llama_cpp_cuda_architectures: ["70"]), as
# on any build host without the fleet's cards. The controller keeps the ccache
# and the artifact (.cache/cuda-build-check), so a rerun after a commit bump
# compiles only what changed. ~26 min on 2 cores with an empty ccache.
#
# Env: CUDA_CHECK_DIR   work directory on the controller (default .cache/cuda-build-check)
#      CUDA_CHECK_KEEP=1  leave the container running afterwards
# The result (build summary, cubins, versions) goes to $CUDA_CHECK_DIR/result.txt.
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
export PATH="$root/.venv/bin:$PATH" ANSIBLE_CONFIG="$root/ansible.cfg"
dir=${CUDA_CHECK_DIR:-$root/.cache/cuda-build-check}
host=llm-fleet-cuda-build-check
mkdir -p "$dir"
result="$dir/result.txt"
: > "$result"
note() { echo "== cuda-build-check: $*" | tee -a "$result"; }
start=$SECONDS

# --- 1. The build host: a harness container with the real CUDA 11.8 toolkit ------
docker rm -f "$host" >/dev/null 2>&1 || true
docker run -d --name "$host" --hostname "$host" --cgroupns=host -v /sys/fs/cgroup:/sys/fs/cgroup:rw \
  --tmpfs /run --tmpfs /run/lock --tmpfs /tmp --stop-signal SIGRTMIN+3 llm-fleet/host:bookworm >/dev/null
cleanup() { [ "${CUDA_CHECK_KEEP:-0}" = 1 ] || docker rm -f "$host" >/dev/null 2>&1 || true; }
trap cleanup EXIT
for _ in $(seq 60); do
  state=$(docker exec "$host" systemctl is-system-running 2>/dev/null || true)
  case $state in running|degraded) break ;; esac
  sleep 1
done
docker exec "$host" bash -euc '
  # The image sees only its local mirror; the toolkit comes from Debian non-free.
  echo "deb http://deb.debian.org/debian bookworm main contrib non-free" > /etc/apt/sources.list.d/debian-non-free.list
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
    nvidia-cuda-toolkit nvidia-cuda-toolkit-gcc >/dev/null'
note "toolkit: $(docker exec "$host" nvcc --version | grep release); host compiler $(docker exec "$host" cuda-g++ --version | head -n1) ($((SECONDS - start)) s)"

# --- 2. The source archive the tests use (the pinned commit) ---------------------
scripts/fetch-llama-source.sh "$root/.cache/harness" >/dev/null
archive="$root/.cache/harness/$(sed -n 's/.*"archive": "\([^"]*\)".*/\1/p' "$root/.cache/harness/llama.cpp-source.json")"

# --- 3. The llama_cpp stage, as on a fleet ---------------------------------------
cat > "$dir/inventory.yml" <<EOF
gpu_servers:
  hosts:
    $host:
      ansible_connection: community.docker.docker
      ansible_python_interpreter: /usr/bin/python3
EOF
cat > "$dir/vars.yml" <<EOF
# Debian's packaging of CUDA 11.8: nvcc and cuobjdump in /usr/bin, GCC 11 as its host compiler.
llama_cpp_cuda_home: /usr
llama_cpp_cuda_version: "11.8"
llama_cpp_cuda_host_compiler: /usr/bin/cuda-g++
llama_cpp_cuda_architectures: ["70"]
llama_cpp_source_archive: $archive
llama_cpp_controller_cache_dir: $dir
llama_cpp_ccache_controller_dir: $dir/ccache
EOF
set +e
ansible-playbook -i "$dir/inventory.yml" -e "@$dir/vars.yml" playbooks/llama_cpp.yml | tee "$dir/playbook.log"
rc=${PIPESTATUS[0]}
set -e
# the role's build summary ("source  1 s", ...) as the YAML callback prints a list: "- source  1 s";
# none found (a failed build) must not end the script before it says why
{ grep -E '^\s+(- )?"?(source|configure|compile|ccache|package|total|built)\s' "$dir/playbook.log" || true; } \
  | sed 's/^ *\(- \)\{0,1\}"*//; s/",*$//' | while read -r line; do note "$line"; done
[ "$rc" = 0 ] || { note "FAILED: playbooks/llama_cpp.yml exited $rc (log: $dir/playbook.log)"; exit "$rc"; }

# --- 4. What the role installed -------------------------------------------------
lib=/opt/llm-fleet/llama.cpp/current/lib/libggml-cuda.so
cubins=$(docker exec "$host" cuobjdump --list-elf "$lib")
note "$(grep -c '\.sm_70\.cubin' <<<"$cubins") sm_70 cubins, $(grep -vc '\.sm_70\.cubin' <<<"$cubins") others in $lib"
note "$(docker exec "$host" ls -l --dereference "$lib" | awk '{printf "%.0f MB", $5 / 1e6}'); links $(docker exec "$host" ldd "$lib" \
  | grep -oE 'lib(cudart|cublas|cublasLt|cuda)\.so[.0-9]*' | sort -u | paste -sd' ')"
note "fact: $(docker exec "$host" python3 -c 'import json; f = json.load(open("/etc/ansible/facts.d/llm_fleet_llama_cpp.fact")); print(f["summary"])')"
note "done in $((SECONDS - start)) s"
