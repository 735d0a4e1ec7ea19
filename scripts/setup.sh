#!/usr/bin/env bash
# Everything the demo and the tests need on a fresh Debian 12 machine, idempotent
# and quick when already done:
#   1. system packages (Docker engine, debootstrap, compilers for the mock NVML, promtool),
#   2. a running Docker engine,
#   3. the control node's venv (.venv) from requirements.txt,
#   4. the simulated host image, the local NVIDIA apt mirror and the host wheelhouse.
# Each part is skipped when its result is current. Run as root (apt, dockerd).
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
cache="$root/.cache"
harness_cache="$cache/harness"
venv="$root/.venv"
mkdir -p "$cache" "$harness_cache"

step() { printf '\n== setup: %s\n' "$*"; }

# --- 1. System packages -------------------------------------------------------
need_pkgs=()
command -v dockerd >/dev/null || need_pkgs+=(docker.io)
command -v debootstrap >/dev/null || need_pkgs+=(debootstrap)
command -v dpkg-scanpackages >/dev/null || need_pkgs+=(dpkg-dev)
command -v gcc >/dev/null || need_pkgs+=(gcc libc6-dev)
command -v make >/dev/null || need_pkgs+=(make)
python3 -c 'import venv, ensurepip' 2>/dev/null || need_pkgs+=(python3-venv)
# promtool, which checks and unit-tests the alert rules (tests/unit/test_alert_rules.py); the
# package also brings Prometheus itself, which starts only where systemd runs.
command -v promtool >/dev/null || need_pkgs+=(prometheus)
if [ ${#need_pkgs[@]} -gt 0 ]; then
  step "installing system packages: ${need_pkgs[*]}"
  [ "$(id -u)" = 0 ] || { echo "setup: run as root to install ${need_pkgs[*]}" >&2; exit 1; }
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need_pkgs[@]}" >/dev/null
fi

# --- 2. Docker engine ----------------------------------------------------------
if ! docker info >/dev/null 2>&1; then
  step "starting the Docker engine"
  if [ -d /run/systemd/system ]; then
    systemctl start docker
  else
    # No systemd on this machine (a CI sandbox): run the daemon in the background.
    nohup dockerd >"$cache/dockerd.log" 2>&1 &
  fi
  for _ in $(seq 60); do docker info >/dev/null 2>&1 && break; sleep 1; done
  docker info >/dev/null 2>&1 || { echo "setup: the Docker engine did not start; see $cache/dockerd.log" >&2; tail -n 20 "$cache/dockerd.log" >&2 || true; exit 1; }
fi

# --- 3. Control node venv ------------------------------------------------------
req_hash=$(sha256sum requirements.txt | cut -c1-16)
if [ "$(cat "$venv/.requirements-hash" 2>/dev/null)" != "$req_hash" ]; then
  step "creating $venv from requirements.txt"
  python3 -m venv "$venv"
  "$venv/bin/pip" install -q --upgrade pip
  "$venv/bin/pip" install -q -r requirements.txt
  echo "$req_hash" > "$venv/.requirements-hash"
fi

# The collections requirements.yml pins come with the `ansible` package; Galaxy only
# when they do not (it may be unreachable).
if ! "$venv/bin/python" scripts/check-collections.py "$venv/bin/ansible-galaxy" 2>/dev/null; then
  step "installing the collections of requirements.yml"
  "$venv/bin/ansible-galaxy" collection install -r requirements.yml
  "$venv/bin/python" scripts/check-collections.py "$venv/bin/ansible-galaxy"
fi

# --- 4. Simulated fleet: image, NVIDIA apt mirror, wheelhouse ------------------
step "simulated host image (Debian 12)"
tests/harness/image/build-image.sh llm-fleet/host:bookworm bookworm
# Debian 11, the oldest host system the harness can build: the nvidia_stack scenario's
# bullseye host (make test) and the fleet_debian11 scenario run it.
step "simulated host image (Debian 11)"
tests/harness/image/build-image.sh llm-fleet/host:bullseye bullseye
step "local NVIDIA apt mirror"
tests/harness/apt_repo/build-repo.sh "$harness_cache/nvidia-apt"

# The test hosts run Debian 12 (Python 3.11) and Debian 11 (3.9): one wheelhouse holds
# the wheels of both; a host's `pip install --no-index --find-links` takes the pins
# its own Python's markers select and the wheels tagged for it. pip download
# evaluates markers for the Python running it, so host-requirements.py selects the
# lines per version. manylinux2014 wheels only: they also install with Ubuntu
# 20.04's pip 20.0.2, which predates the manylinux_2_X tags.
wheel_pythons="3.9 3.11"
wheel_hash=$( (cat roles/fleet_common/files/requirements-host.txt scripts/host-requirements.py; echo "$wheel_pythons") \
  | sha256sum | cut -c1-16)
if [ "$(cat "$harness_cache/wheelhouse/.hash" 2>/dev/null)" != "$wheel_hash" ]; then
  step "host wheelhouse (roles/fleet_common/files/requirements-host.txt, Python $wheel_pythons)"
  rm -rf "$harness_cache/wheelhouse"
  mkdir -p "$harness_cache/wheelhouse"
  for py in $wheel_pythons; do
    "$venv/bin/python" scripts/host-requirements.py --python-version "$py" \
      > "$harness_cache/wheelhouse/.requirements-$py.txt"
    "$venv/bin/pip" download -q --only-binary :all: --python-version "$py" --implementation cp \
      --platform manylinux2014_x86_64 -d "$harness_cache/wheelhouse" \
      -r "$harness_cache/wheelhouse/.requirements-$py.txt"
  done
  echo "$wheel_hash" > "$harness_cache/wheelhouse/.hash"
fi
# The cmake wheel the llama_cpp role installs into a build venv where the OS's
# cmake is older than the pinned llama.cpp needs (Ubuntu 20.04); the llama_cpp
# scenario walks that path with llama_cpp_cmake_from_pip: always.
cmake_wheel=$(sed -n 's/^llama_cpp_cmake_pip_version: "\(.*\)"$/\1/p' roles/llama_cpp/defaults/main.yml)
if ! ls "$harness_cache/wheelhouse"/cmake-"$cmake_wheel"-*.whl >/dev/null 2>&1; then
  step "cmake $cmake_wheel wheel for the build venv"
  "$venv/bin/pip" download -q --no-deps --only-binary :all: --platform manylinux2014_x86_64 \
    --python-version 3.9 --implementation cp -d "$harness_cache/wheelhouse" "cmake==$cmake_wheel"
fi
# --- 5. llama.cpp source archive (roles/llama_cpp tests) ----------------------
# [llama_cpp] The llama.cpp tree of the llama-cpp-python 0.3.36 sdist, as the
# air-gapped source archive the llama_cpp scenario builds from (once; reused).
step "llama.cpp source archive"
scripts/fetch-llama-source.sh "$harness_cache"
# [/llama_cpp]
# --- 6. Model mirror: a tiny servable GGUF the simulated fleet serves ----------
if [ ! -s "$harness_cache/models/tiny-f32.gguf.sha256" ]; then
  step "tiny test model (tests/harness/tiny_model.py)"
  mkdir -p "$harness_cache/models"
  "$venv/bin/python" tests/harness/tiny_model.py "$harness_cache/models/tiny-f32.gguf"
  (cd "$harness_cache/models" && sha256sum tiny-f32.gguf | cut -d' ' -f1 > tiny-f32.gguf.sha256)
fi
# A second, smaller model, for a host serving two models (molecule/fleet/tests/test_models.py).
if [ ! -s "$harness_cache/models/tiny-second-f32.gguf.sha256" ]; then
  step "second tiny test model"
  "$venv/bin/python" tests/harness/tiny_model.py --embd 32 --ctx 2048 "$harness_cache/models/tiny-second-f32.gguf"
  (cd "$harness_cache/models" && sha256sum tiny-second-f32.gguf | cut -d' ' -f1 > tiny-second-f32.gguf.sha256)
fi
step "done"
