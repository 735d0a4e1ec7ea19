#!/usr/bin/env bash
# The project's stage playbooks, unmodified, on one real GPU machine managed from
# itself (local connection): the lent NVIDIA H200 (Ubuntu 24.04, CUDA 13 nvcc,
# cmake/ninja in a Python env, no systemd, no apt mirror, no network).
#
#   nvidia_stack, gpu_tuning   --check --diff only: this machine's driver, clocks,
#                              power limit and persistence are never changed
#   fleet_common               for real: the project venv from a wheelhouse
#   llama_cpp                  for real: CUDA build for the arch NVML reports
#   model                      for real: plan from NVML, a random-weight 32B-shaped
#                              Q4_K GGUF written here and catalogued by path
#   llama_server               --check --diff: the drop-in it renders; its ExecStart
#                              and Environment are then started here (no systemd)
#   verify                     for real, against that server (the rendered instance handed
#                              over: no systemd recorded one): llama-bench, the load test,
#                              VRAM, and the fleet's decode calibration it records
#   settled                    for real, twice while the server serves: playbooks/settled.yml and
#                              record_settled.yml (the rerun's comparison), real NVML
#   model, again               for real: the next plan reads that calibration
#
# Run from the repository root, as root, with:
#   .whl/                      wheels of ansible-core 2.19 (+ resolvelib, cryptography,
#                              cffi, pycparser) for this Python; jinja2, MarkupSafe,
#                              PyYAML, packaging come from the machine's Python
#   .gpuhost/wheelhouse/       wheels of roles/fleet_common/files/requirements-host.txt
#                              for the machine's Python (3.12 on the lent H200):
#                              pip download -r roles/fleet_common/files/requirements-host.txt
#                                --only-binary=:all: --python-version 3.12 --platform manylinux2014_x86_64
#                                --platform manylinux_2_28_x86_64 -d .gpuhost/wheelhouse
#   .gpuhost/collections.tar.gz  ansible_collections/ansible/posix (ansible.cfg's callbacks)
#   .cache/harness/llama.cpp-0c1e57098bba.tar.gz  the pinned source
# Results in $OUT (default /root/gpu-host-out); BUNDLE=<file.tgz>: also packed into one file.
# POLICY='{"objective": "throughput"}': the planner's policy (llm_model_policy) for the run;
# default the role's own ({}: the latency objective).
# AFFINITY=1: also benchmarks/affinity_ttft.py against a second instance on the card (issue 32),
# with AFFINITY_ARGS (e.g. "--turns 9 --turn-tokens 1300": a history past 8k tokens needs
# a policy whose slots hold it, POLICY='{"target_ctx": 65536}');
# SKIP_SETTLED=1: leave out the two settled comparisons.
# MODELS=1: two models on the card (issue 35, llm_model_models): the 32B-shaped one ("chat",
# POLICY) and a small one ("small": the same shape with SMALL_LAYERS=6 layers, 8k context, one
# slot); both rendered ExecStarts are started, and verify measures both, each process's memory.
# ONDEMAND=1 (with MODELS=1): "small" is loaded on demand (load: on_demand): the check run renders
# its card's router (llama-server@0-router, the drop-in and the models' preset, written where the
# router reads it), the router is started beside "chat", and verify loads "small" through it and
# reads the child's own memory by its PID (router-models.json, router-children.txt).
# MODEL=<file.gguf> (with <file.gguf>.sha256 beside it): a real model staged there instead of the
# random-weight one, catalogued as QUANT (default Q4_K) and named MODEL_NAME (llm_model_name).
# SPEC=1 (one model): speculative decoding measured (issue 35). Give POLICY with
# "speculative": "ngram-mod": the first plan has it off (no baseline yet) and verify measures the
# baseline; then the model stage again (a trial: on), llama_server --check --diff, the server
# restarted with that ExecStart (--spec-type ngram-mod), verify again (its verdict goes to the
# calibration's `speculation` list), and the last model stage follows the verdict. Each state's
# plan, verify fact, calibration, server log and /metrics are kept (*-baseline, *-trial), and
# benchmarks/gpu-host/copy-prompt.txt is load-tested on both servers outside verify (a prompt
# whose answer repeats its own text: where n-gram drafts should pay; COPY_N_PREDICT tokens);
# spec_summary.py puts the two side by side (speculation-summary.txt / .json).
# PROMPT_WALK=1 (with SPEC=1): then verify_loadtest_prompt set to that copy prompt (and
# verify_speculation_min_gain WALK_MIN_GAIN, default 0.5): verify marks the trial's verdict outdated
# and records the copy prompt's baseline (*-copy-off), the next plan is a trial again (*-copy-trial),
# and the last model stage follows its verdict.
# DRAFT=1 (with SPEC=1, one model): the same flow with POLICY's "speculative": "draft-simple" and a
# draft model (llm_model_draft): make_random_gguf.py --draft writes a random-weight 0.5B-class model
# of the 32B shape's vocabulary (24 layers, 1024 wide, Q4_K, ~0.41 GB) at DRAFT_MODEL, catalogued by
# path like MODEL. The baseline plan reserves the draft's memory without loading it; the trial serves
# it (--model-draft, -ngld, --cache-type-k/v-draft). nvidia-smi's per-process memory is kept for
# both servers (nvidia-smi-compute-apps-{baseline,trial}.csv) and spec_summary.py sets it beside the
# plans' predicted_process_bytes, with the draft's share (predicted, and measured trial - baseline).
# BUILD_ONLY=1: stop after the llama_cpp stage (the compile, ~270-370 s on the lent H100); the
# next run on the same warm machine skips it (SPEC=1 with a real model needs both: ~650 s in all).
# verify is handed each instance's fingerprint (a hash of its ExecStart and Environment, as the
# llama_server stage's fact would), so the speed gate accepts and records the baselines.
set -uo pipefail
REPO=$(cd "$(dirname "$0")/../.." && pwd)
HERE=$REPO/benchmarks/gpu-host
OUT=${OUT:-/root/gpu-host-out}
WORK=${WORK:-/root/gpu-host}
ARCHIVE=${ARCHIVE:-$REPO/.cache/harness/llama.cpp-0c1e57098bba.tar.gz}
MODEL_GIVEN=${MODEL:+1}
MODEL=${MODEL:-/var/lib/llm-fleet/staged/qwen2.5-32b-shape-q4_k-random.gguf}
rm -f "$OUT/rc.txt"; mkdir -p "$OUT" "$WORK" "$(dirname "$MODEL")"
cd "$REPO" || exit 2
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
T0=$SECONDS
stamp() { echo "[$(date -u +%H:%M:%S) +$((SECONDS - T0))s] $*"; }
# The bundle is packed however the script ends, a failed stage included. A run that may
# outlast the 600 s device call: `timeout 560 bash run.sh ...; [ -f "$BUNDLE" ] || tar -czf
# "$BUNDLE" -C "$OUT" .`, so that what it measured until then still comes back.
pack() { [ -n "${BUNDLE:-}" ] && tar -czf "$BUNDLE" -C "$OUT" . 2>/dev/null; }
trap pack EXIT

# --- Ansible on this machine (the controller is the host) -------------------------
stamp "install ansible-core from .whl"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$WORK/site" .whl/*.whl || exit 2
tar -xzf .gpuhost/collections.tar.gz -C "$WORK/site" || exit 2
export PYTHONPATH=$WORK/site ANSIBLE_COLLECTIONS_PATH=$WORK/site ANSIBLE_FORCE_COLOR=0
export ANSIBLE_CACHE_PLUGIN_CONNECTION=$WORK/facts
# No systemd here: a stand-in systemctl that only answers check-mode questions.
export PATH=$HERE/bin:$PATH
playbook() { python3 "$WORK/site/bin/ansible-playbook" -i "$HERE/inventory.yml" -e @"$HERE/vars.yml" -e @"$WORK/host-vars.yml" "$@"; }

# --- The model file (in the background; gguf-py from the llama.cpp tree) ----------
mkdir -p "$WORK/src"
tar -xzf "$ARCHIVE" -C "$WORK/src" --strip-components=1 --wildcards '*/gguf-py/*' || exit 2
if [ ! -f "$MODEL" ] && [ -n "$MODEL_GIVEN" ]; then
  # a staged real model that is gone (a machine released between calls) is never replaced
  # by the random-weight one under its name
  stamp "MODEL=$MODEL is not there (staged on a machine since released?): stage it again"; exit 7
elif [ ! -f "$MODEL" ]; then
  stamp "write the random-weight GGUF in the background"
  ( PYTHONPATH="$WORK/src/gguf-py" python3 "$REPO/benchmarks/make_random_gguf.py" "$MODEL" && sha256sum "$MODEL" | cut -d' ' -f1 > "$MODEL.sha256" ) > "$OUT/model-write.log" 2>&1 &
  MODEL_PID=$!
else
  MODEL_PID=
fi
SMALL=${SMALL:-/var/lib/llm-fleet/staged/qwen2.5-32b-shape-${SMALL_LAYERS:-6}-layers-q4_k-random.gguf}
SMALL_PID=
if [ -n "${MODELS:-}" ] && [ ! -f "$SMALL" ]; then
  ( PYTHONPATH="$WORK/src/gguf-py" python3 "$REPO/benchmarks/make_random_gguf.py" "$SMALL" --layers "${SMALL_LAYERS:-6}" \
    && sha256sum "$SMALL" | cut -d' ' -f1 > "$SMALL.sha256" ) > "$OUT/model-write-small.log" 2>&1 &
  SMALL_PID=$!
fi
DRAFT_MODEL=${DRAFT_MODEL:-/var/lib/llm-fleet/staged/qwen2.5-0.5b-class-draft-q4_k-random.gguf}
DRAFT_PID=
if [ -n "${DRAFT:-}" ] && [ ! -f "$DRAFT_MODEL" ]; then
  ( PYTHONPATH="$WORK/src/gguf-py" python3 "$REPO/benchmarks/make_random_gguf.py" "$DRAFT_MODEL" --draft \
    && sha256sum "$DRAFT_MODEL" | cut -d' ' -f1 > "$DRAFT_MODEL.sha256" ) > "$OUT/model-write-draft.log" 2>&1 &
  DRAFT_PID=$!
fi
# The stand-in systemctl answers `show` for the instances started below (their MainPID).
export GPUHOST_PIDS=$WORK/pids
rm -rf "$GPUHOST_PIDS"; mkdir -p "$GPUHOST_PIDS"

# --- What an operator reads off this machine ---------------------------------------
nvcc=$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)
cuda_home=$(dirname "$(dirname "$(readlink -f "$nvcc")")")
cuda_version=$("$nvcc" --version | sed -n 's/.*release \([0-9.]*\),.*/\1/p')
tool_dir=$(dirname "$(command -v cmake)")
# The host's Python for Ansible's own modules (config level: the roles' task-level
# interpreter for the project venv must still win, which an extra var would not let it).
ANSIBLE_PYTHON_INTERPRETER=$(command -v python3); export ANSIBLE_PYTHON_INTERPRETER
cat > "$WORK/host-vars.yml" <<YML
---
llama_cpp_source_archive: $ARCHIVE
llama_cpp_cuda_version: "$cuda_version"
llama_cpp_cuda_home: $cuda_home
llama_cpp_build_tool_dirs: [$tool_dir]
llm_fleet_pip_find_links: $REPO/.gpuhost/wheelhouse
llm_model_policy: ${POLICY:-{\}}
YML
[ -n "${MODEL_NAME:-}" ] && echo "llm_model_name: $MODEL_NAME" >> "$WORK/host-vars.yml"
cp "$WORK/host-vars.yml" "$OUT/host-vars.yml"
nvidia-smi > "$OUT/nvidia-smi.txt" 2>&1
nvidia-smi --query-gpu=name,uuid,driver_version,memory.total,memory.used,clocks.max.sm,clocks.max.mem,power.limit,persistence_mode,compute_cap --format=csv > "$OUT/nvidia-smi.csv" 2>&1

# --- Stages -----------------------------------------------------------------------
stamp "fleet_common (real: the project venv from the wheelhouse)"
playbook "$HERE/fleet_common.yml" > "$OUT/stage-fleet_common.log" 2>&1; echo "fleet_common rc=$?" | tee -a "$OUT/rc.txt"

stamp "llama_cpp (real: CUDA build) in the background; nvidia_stack and gpu_tuning --check --diff meanwhile"
( s=$SECONDS; playbook playbooks/llama_cpp.yml > "$OUT/stage-llama_cpp.log" 2>&1; rc=$?
  echo "llama_cpp rc=$rc seconds=$((SECONDS - s))" >> "$OUT/rc.txt" ) &
BUILD_PID=$!
ANSIBLE_CACHE_PLUGIN_CONNECTION=$WORK/facts-check playbook playbooks/nvidia_stack.yml --check --diff > "$OUT/stage-nvidia_stack-check.log" 2>&1
echo "nvidia_stack(check) rc=$?" >> "$OUT/rc.txt"
ANSIBLE_CACHE_PLUGIN_CONNECTION=$WORK/facts-check playbook playbooks/gpu_tuning.yml --check --diff > "$OUT/stage-gpu_tuning-check.log" 2>&1
echo "gpu_tuning(check) rc=$?" >> "$OUT/rc.txt"
[ -n "$MODEL_PID" ] && { wait "$MODEL_PID"; stamp "model written: $(tail -1 "$OUT/model-write.log")"; }
[ -n "$SMALL_PID" ] && { wait "$SMALL_PID"; stamp "small model written: $(tail -1 "$OUT/model-write-small.log")"; }
[ -n "$DRAFT_PID" ] && { wait "$DRAFT_PID"; stamp "draft model written: $(tail -1 "$OUT/model-write-draft.log")"; }
wait "$BUILD_PID"
stamp "$(tail -1 "$OUT/rc.txt")"
grep -A12 'TASK \[llama_cpp : Report the build\]' "$OUT/stage-llama_cpp.log" | head -20

fact=/etc/ansible/facts.d/llm_fleet_llama_cpp.fact
if [ -f "$fact" ]; then
  cp "$fact" "$OUT/llama_cpp.fact.json"
  bin=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["install_dir"])' "$fact")
  "$cuda_home/bin/cuobjdump" --list-elf "$bin/lib/libggml-cuda.so" > "$OUT/cuobjdump-list-elf.txt" 2>&1
  ldd "$bin/bin/llama-server" > "$OUT/ldd-llama-server.txt" 2>&1
  ldd "$bin/lib/libggml-cuda.so" > "$OUT/ldd-libggml-cuda.txt" 2>&1
  "$bin/bin/llama-server" --version > "$OUT/llama-server-version.txt" 2>&1
  "$bin/bin/llama-server" --help > "$OUT/llama-server-help.txt" 2>&1
  cp "$bin/BUILD.json" "$OUT/BUILD.json"
else
  stamp "no llama.cpp fact: the llama_cpp stage failed"; tail -60 "$OUT/stage-llama_cpp.log"; exit 3
fi

# BUILD_ONLY=1: stop here. A later run on the same (still warm) machine finds the build installed
# and skips the compile, so a run too long for one 600 s device call fits in two.
if [ -n "${BUILD_ONLY:-}" ]; then
  stamp "BUILD_ONLY: the build is installed; stop"
  exit 0
fi

# --- Model stage: the catalogue entry an operator writes for a staged file ----------
sha=$(cat "$MODEL.sha256")
if [ -z "${MODELS:-}" ]; then
cat >> "$WORK/host-vars.yml" <<YML
llm_model_catalogue:
  - quant: ${QUANT:-Q4_K}
    path: $MODEL
    sha256: $sha
    size_bytes: $(stat -c %s "$MODEL")
YML
[ -n "${DRAFT:-}" ] && cat >> "$WORK/host-vars.yml" <<YML
llm_model_draft: {quant: Q4_K, path: $DRAFT_MODEL, sha256: $(cat "$DRAFT_MODEL.sha256"), size_bytes: $(stat -c %s "$DRAFT_MODEL")}
YML
else
cat >> "$WORK/host-vars.yml" <<YML
llm_model_catalogue: []
llm_model_models:
  - name: chat
    catalogue: [{quant: Q4_K, path: $MODEL, sha256: $sha, size_bytes: $(stat -c %s "$MODEL")}]
    policy: ${POLICY:-{\}}
  - name: small
    catalogue: [{quant: Q4_K, path: $SMALL, sha256: $(cat "$SMALL.sha256"), size_bytes: $(stat -c %s "$SMALL")}]
    policy: {target_ctx: 8192, target_parallel: 1}
    load: $([ -n "${ONDEMAND:-}" ] && echo on_demand || echo resident)
YML
fi
stamp "model stage (real)"
playbook playbooks/model.yml > "$OUT/stage-model.log" 2>&1; echo "model rc=$?" | tee -a "$OUT/rc.txt"
cp /etc/llm-fleet/plan.json "$OUT/plan.json" 2>/dev/null || { tail -60 "$OUT/stage-model.log"; exit 4; }

stamp "llama_server --check --diff (the drop-in it renders)"
playbook playbooks/llama_server.yml --check --diff > "$OUT/stage-llama_server-check.log" 2>&1; echo "llama_server(check) rc=$?" | tee -a "$OUT/rc.txt"
python3 "$HERE/unit_from_diff.py" "$OUT/stage-llama_server-check.log" > "$OUT/units.json" || { tail -60 "$OUT/stage-llama_server-check.log"; exit 5; }

# --- Start the rendered ExecStarts with their Environment, then the load test ---------
# One script per instance (llama-server@<key>): "0" is the first model's, as with one model.
start_scripts() {
python3 - "$1" "$WORK" <<'PY'
import json, shlex, sys
units = json.load(open(sys.argv[1]))
for key, unit in units.items():
    env = " ".join("%s=%s" % (k, shlex.quote(v)) for k, v in sorted(unit["environment"].items()))
    with open("%s/start%s.sh" % (sys.argv[2], "" if key == "0" else "-" + key), "w") as handle:
        handle.write("exec env %s %s\n" % (env, unit["exec_start"]))
PY
}
start_scripts "$OUT/units.json"
cat "$WORK"/start*.sh | tee "$OUT/exec-start.sh"
# A card's router (ONDEMAND=1): the models' preset its --models-preset names, as the stage writes it
python3 - "$OUT/units.json" <<'PY'
import json, os, sys
for key, unit in sorted(json.load(open(sys.argv[1])).items()):
    if unit.get("preset_text") is not None:
        path = unit["argv"][unit["argv"].index("--models-preset") + 1]
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w") as handle:
            handle.write(unit["preset_text"] + "\n")
        print("llama-server@%s: its preset %s\n%s" % (key, path, unit["preset_text"]))
PY
unit_port() { python3 -c 'import json,sys; a=json.load(open(sys.argv[1]))[sys.argv[2]]["argv"]; print(a[a.index("--port")+1])' "${2:-$OUT/units.json}" "$1"; }
port=$(unit_port 0)
health() { python3 -c 'import sys,urllib.request as u; print(u.urlopen(sys.argv[1], timeout=2).read().decode())' "http://127.0.0.1:$1/health" 2>/dev/null; }
OTHER_PIDS=
for key in $(python3 -c 'import json,sys; print(" ".join(sorted(json.load(open(sys.argv[1])))))' "$OUT/units.json"); do
  p=$(unit_port "$key")
  stamp "start llama-server@$key on :$p"
  if [ "$key" = 0 ]; then
    setsid bash "$WORK/start.sh" > "$OUT/llama-server.log" 2>&1 < /dev/null &
    SERVER_PID=$!; echo "$SERVER_PID" > "$GPUHOST_PIDS/llama-server@$key.service.pid"
  else
    setsid bash "$WORK/start-$key.sh" > "$OUT/llama-server-$key.log" 2>&1 < /dev/null &
    echo "$!" > "$GPUHOST_PIDS/llama-server@$key.service.pid"; OTHER_PIDS="$OTHER_PIDS $!"
  fi
  # one at a time: each loads with the card as the plan left it for the next
  for _ in $(seq 1 180); do health "$p" >/dev/null && break; sleep 1; done
  stamp "health of :$p: $(health "$p")"
done
nvidia-smi --query-compute-apps=pid,process_name,used_memory --format=csv > "$OUT/nvidia-smi-compute-apps.csv" 2>&1
nvidia-smi --query-gpu=memory.used,memory.total --format=csv >> "$OUT/nvidia-smi-compute-apps.csv" 2>&1
cat "$OUT/nvidia-smi-compute-apps.csv"
# The GPU health gate's reading of a real card with llama-server on it (ECC, retired
# pages or remapped rows, compute processes: module_utils/gpu_health.py).
stamp "GPU health as nvidia_gpu_facts reads it"
python3 "$WORK/site/bin/ansible" -i "$HERE/inventory.yml" all -m nvidia_gpu_facts \
  -e ansible_python_interpreter=/opt/llm-fleet/venv/bin/python -o > "$OUT/gpu-health.txt" 2>&1
python3 -c 'import json,re,sys; t=open(sys.argv[1]).read(); d=json.loads(t[t.index("{"):]); print(json.dumps([g["health"] for g in d["ansible_facts"]["nvidia_gpus"]], indent=1))' "$OUT/gpu-health.txt" | tee "$OUT/gpu-health.json"
# The GPU exporter (roles/gpu_exporter): the stage in check mode (no systemd here), then
# its program as the unit runs it, scraped with llama-server on the card.
stamp "gpu_exporter --check --diff, then the exporter itself"
playbook playbooks/gpu_exporter.yml --check --diff > "$OUT/stage-gpu_exporter-check.log" 2>&1; echo "gpu_exporter(check) rc=$?" | tee -a "$OUT/rc.txt"
mkdir -p "$WORK/gpu-exporter" && cp roles/gpu_exporter/files/gpu_exporter.py module_utils/gpu_health.py "$WORK/gpu-exporter/"
# Its Xid listener registers for the real card's events (NVML's event API): the metric
# llm_fleet_gpu_exporter_xid_listening says whether the driver took the registration.
/opt/llm-fleet/venv/bin/python "$WORK/gpu-exporter/gpu_exporter.py" --listen 127.0.0.1:9400 --hostname gpu-host \
  --xid-journal "$WORK/gpu-exporter/xid-events.jsonl" > "$OUT/gpu-exporter.log" 2>&1 &
EXPORTER_PID=$!
for _ in $(seq 1 50); do python3 -c 'import urllib.request as u; u.urlopen("http://127.0.0.1:9400/metrics", timeout=2)' 2>/dev/null && break; sleep 0.2; done
for _ in $(seq 1 50); do python3 -c 'import urllib.request as u, sys; sys.exit(b"xid_listening{Hostname=\"gpu-host\"} 1.0" not in u.urlopen("http://127.0.0.1:9400/metrics", timeout=2).read())' 2>/dev/null && break; sleep 0.2; done
python3 -c 'import urllib.request as u; print(u.urlopen("http://127.0.0.1:9400/metrics").read().decode(), end="")' > "$OUT/gpu-exporter-metrics.txt" 2>&1
kill "$EXPORTER_PID" 2>/dev/null
grep -E '^(DCGM_FI_DEV_FB_USED|DCGM_FI_DEV_POWER_USAGE|DCGM_FI_DEV_SM_CLOCK|DCGM_FI_DEV_XID_ERRORS|llm_fleet_gpu_healthy|llm_fleet_gpu_exporter_nvml_up|llm_fleet_gpu_exporter_xid_listening|llm_fleet_gpu_process_memory_bytes)' "$OUT/gpu-exporter-metrics.txt"
nvidia-smi --query-gpu=memory.used,power.draw,clocks.sm --format=csv >> "$OUT/gpu-exporter-metrics-nvidia-smi.csv" 2>&1
# --- verify, the role itself, against the running server ----------------------------
# No systemd here, so the llama_server stage recorded no instance: the instance the
# check run rendered is handed to verify (its documented override), and verify's
# calibration goes where the next model run reads it.
# verify_vars <units.json>: the instances of the plan on disk, each with its fingerprint.
verify_vars() {
python3 - "$1" /etc/llm-fleet/plan.json "$OUT/reports" > "$WORK/verify-vars.yml" <<'PY'
import hashlib, json, sys
units, plans = json.load(open(sys.argv[1])), json.load(open(sys.argv[2]))["plans"]
instances = []
for p in plans:
    # a model loaded on demand is reached through its card's router (llama-server@<gpu>-router)
    lazy = p.get("load") == "on_demand"
    key = "%d-router" % p["gpu_index"] if lazy else str(p.get("instance", p["gpu_index"]))
    argv = units[key]["argv"]
    # what the llama_server stage's fact records (a hash of what the instance serves): the
    # speed gate accepts a changed fingerprint's measurement and records it as a baseline
    fingerprint = hashlib.sha256(json.dumps([units[key]["exec_start"], units[key]["environment"]],
                                            sort_keys=True).encode()).hexdigest()[:16]
    instances.append({"gpu_index": p["gpu_index"], "gpu_uuid": p["gpu_uuid"], "port": int(argv[argv.index("--port") + 1]),
                      "unit": "llama-server@%s.service" % key, "quant": p["quant"], "instance": key,
                      "model_name": p.get("model_name", ""), "model_rank": p.get("model_rank", 0),
                      "ctx_size": p["ctx_size"], "parallel": p["parallel"], "cache_type_k": p["cache_type_k"],
                      "cache_type_v": p["cache_type_v"], "model_path": p["model_path"],
                      "spec_type": p.get("spec_type") or "none", "fingerprint": fingerprint})
    if lazy:
        instances[-1].update(instance=str(p["instance"]), load="on_demand", router=key)
print(json.dumps({
    "verify_instances": instances,
    "verify_server_environment": units["0"]["environment"],
    "verify_report_dir": sys.argv[3],
}))
PY
}
verify_vars "$OUT/units.json"
echo "fleet_common_calibration_file: $OUT/decode-calibration.json" >> "$WORK/host-vars.yml"
stamp "verify stage (real, against the running server)"
playbook playbooks/verify.yml -e @"$WORK/verify-vars.yml" > "$OUT/stage-verify.log" 2>&1; echo "verify rc=$?" | tee -a "$OUT/rc.txt"
grep -A3 'Print the instance' "$OUT/stage-verify.log" | head -8; grep -A8 'Say what the calibration gained' "$OUT/stage-verify.log" | head -12
nvidia-smi --query-compute-apps=pid,process_name,used_memory --format=csv > "$OUT/nvidia-smi-compute-apps-after.csv" 2>&1
if [ -n "${ONDEMAND:-}" ]; then
  # the router's view after verify loaded its model: its models and the child's command line
  rport=$(unit_port 0-router)
  python3 -c 'import sys,urllib.request as u; print(u.urlopen(sys.argv[1], timeout=5).read().decode())' \
    "http://127.0.0.1:$rport/models" > "$OUT/router-models.json" 2>&1
  pgrep -a -P "$(cat "$GPUHOST_PIDS/llama-server@0-router.service.pid")" > "$OUT/router-children.txt" 2>&1
  cat "$OUT/router-children.txt" "$OUT/nvidia-smi-compute-apps-after.csv"
fi

# --- AFFINITY=1: what keeping a conversation on its instance buys (issue 32) -----------
# A second instance of the same rendered ExecStart on the next port, on the same card,
# then a long conversation's time to first token per turn: same instance, alternating, cold.
if [ -n "${AFFINITY:-}" ]; then
  port2=$((port + 1))
  sed "s/--port $port /--port $port2 /" "$WORK/start.sh" > "$WORK/start-2.sh"
  stamp "affinity: a second instance on :$port2, then benchmarks/affinity_ttft.py"
  setsid bash "$WORK/start-2.sh" > "$OUT/llama-server-2.log" 2>&1 < /dev/null &
  SERVER2_PID=$!
  # shellcheck disable=SC2086  # AFFINITY_ARGS: several arguments
  timeout 300 python3 benchmarks/affinity_ttft.py --servers "http://127.0.0.1:$port,http://127.0.0.1:$port2" \
    --out "$OUT/affinity-ttft.json" ${AFFINITY_ARGS:-} > "$OUT/affinity-ttft.txt" 2>&1
  echo "affinity rc=$?" | tee -a "$OUT/rc.txt"; tail -6 "$OUT/affinity-ttft.txt"
  kill -- -"$SERVER2_PID" 2>/dev/null || kill "$SERVER2_PID" 2>/dev/null
fi

# --- SPEC=1: speculative decoding, tried against the baseline verify just recorded -------
# spec_state <name>: what the running server served and measured (verify's fact, the plan, the
# calibration, llama-server's /metrics), then the copy prompt's load test outside verify.
metrics() { python3 -c 'import sys,urllib.request as u; print(u.urlopen(sys.argv[1], timeout=5).read().decode(), end="")' \
  "http://127.0.0.1:$port/metrics" > "$1" 2>&1; }
spec_state() {
  cp /etc/llm-fleet/plan.json "$OUT/plan-$1.json"
  cp /etc/ansible/facts.d/llm_fleet_verify.fact "$OUT/verify-$1.fact.json"
  cp "$OUT/decode-calibration.json" "$OUT/decode-calibration-$1.json"
  # the process's own memory (the server, after verify's load test), for spec_summary.py
  { echo "server_pid=$(cat "$GPUHOST_PIDS/llama-server@0.service.pid")"
    nvidia-smi --query-compute-apps=pid,process_name,used_memory --format=csv
    nvidia-smi --query-gpu=memory.used,memory.total --format=csv; } > "$OUT/nvidia-smi-compute-apps-$1.csv" 2>&1
  metrics "$OUT/metrics-$1-after-verify.txt"
  [ "${2:-}" = nocopy ] && return 0
  stamp "SPEC: copy prompt against the $1 server"
  timeout 200 python3 roles/verify/files/llm_fleet_loadtest.py --url "http://127.0.0.1:$port" --streams 1,slots \
    --n-predict "${COPY_N_PREDICT:-256}" --prompt "$(cat "$HERE/copy-prompt.txt")" --budget-s 180 \
    > "$OUT/copy-prompt-$1.json" 2> "$OUT/copy-prompt-$1.err"
  echo "copy-prompt($1) rc=$?" | tee -a "$OUT/rc.txt"
  metrics "$OUT/metrics-$1-after-copy.txt"
}
# spec_cycle <name> [playbook args]: the model stage, llama_server --check --diff, llama-server@0
# restarted with the ExecStart it rendered, then verify against it (files *-<name>).
spec_cycle() {
  local name=$1; shift
  stamp "SPEC: model stage ($name)"
  playbook playbooks/model.yml "$@" > "$OUT/stage-model-$name.log" 2>&1; echo "model($name) rc=$?" | tee -a "$OUT/rc.txt"
  python3 -c 'import json,sys; p=json.load(open(sys.argv[1]))["plans"][0]; print("plan: spec_type", p.get("spec_type"), "|", p["reason"][p["reason"].find("Speculative"):].split(". First")[0])' \
    /etc/llm-fleet/plan.json
  playbook playbooks/llama_server.yml --check --diff "$@" > "$OUT/stage-llama_server-check-$name.log" 2>&1
  echo "llama_server(check, $name) rc=$?" | tee -a "$OUT/rc.txt"
  python3 "$HERE/unit_from_diff.py" "$OUT/stage-llama_server-check-$name.log" > "$OUT/units-$name.json" \
    || { tail -60 "$OUT/stage-llama_server-check-$name.log"; exit 6; }
  stamp "SPEC: restart llama-server@0 with the ExecStart of $name"
  kill -- -"$SERVER_PID" 2>/dev/null || kill "$SERVER_PID" 2>/dev/null
  for _ in $(seq 1 60); do kill -0 "$SERVER_PID" 2>/dev/null || break; sleep 0.5; done
  wait "$SERVER_PID" 2>/dev/null
  start_scripts "$OUT/units-$name.json"
  tee "$OUT/exec-start-$name.sh" < "$WORK/start.sh"
  port=$(unit_port 0 "$OUT/units-$name.json")
  setsid bash "$WORK/start.sh" > "$OUT/llama-server-$name.log" 2>&1 < /dev/null &
  SERVER_PID=$!; echo "$SERVER_PID" > "$GPUHOST_PIDS/llama-server@0.service.pid"
  for _ in $(seq 1 180); do health "$port" >/dev/null && break; sleep 1; done
  stamp "health of :$port: $(health "$port")"
  # the process as it loaded (before verify: kept even if the run is cut off later)
  { echo "server_pid=$SERVER_PID"; nvidia-smi --query-compute-apps=pid,process_name,used_memory --format=csv
    nvidia-smi --query-gpu=memory.used,memory.total --format=csv; } > "$OUT/nvidia-smi-compute-apps-$name-start.csv" 2>&1
  cat "$OUT/nvidia-smi-compute-apps-$name-start.csv"
  verify_vars "$OUT/units-$name.json"
  stamp "SPEC: verify stage ($name)"
  playbook playbooks/verify.yml -e @"$WORK/verify-vars.yml" "$@" > "$OUT/stage-verify-$name.log" 2>&1
  echo "verify($name) rc=$?" | tee -a "$OUT/rc.txt"
  grep -A6 'Say what the speed gate found' "$OUT/stage-verify-$name.log" | head -10
}
if [ -n "${SPEC:-}" ]; then
  spec_state baseline
  spec_cycle trial
  spec_state trial
  # PROMPT_WALK=1: verify's load-test prompt set to the copy prompt (verify_loadtest_prompt), with
  # verify_speculation_min_gain WALK_MIN_GAIN: the trial's no_gain was measured with verify's own
  # prompt, so verify marks it outdated and measures the copy prompt's baseline; the next plan
  # tries it again against that baseline, and the last model stage follows that verdict.
  if [ -n "${PROMPT_WALK:-}" ]; then
    python3 -c 'import json,sys; print(json.dumps({"verify_loadtest_prompt": open(sys.argv[1]).read().strip(), "verify_speculation_min_gain": float(sys.argv[2])}))' \
      "$HERE/copy-prompt.txt" "${WALK_MIN_GAIN:-0.5}" | tee "$OUT/walk-vars.json" > "$WORK/walk-vars.json"
    spec_cycle copy-off -e @"$WORK/walk-vars.json"
    spec_state copy-off nocopy
    spec_cycle copy-trial -e @"$WORK/walk-vars.json"
    spec_state copy-trial nocopy
  fi
fi

# --- the rerun's comparison, twice, while the server serves: record, then settled ------
stamp "settled: record the stamp, then compare (real NVML)"
# SKIP_SETTLED=1: not this time (a run that must fit the device's 600 s with AFFINITY)
for n in $([ -z "${SKIP_SETTLED:-}" ] && echo 1 2); do
  playbook benchmarks/gpu-host/settled.yml -e '{"fleet_common_settled_units": []}' > "$OUT/settled-$n.log" 2>&1
  echo "settled($n) rc=$?" | tee -a "$OUT/rc.txt"
done
grep -h -A3 'Say which hosts the stages skip' "$OUT/settled-1.log" "$OUT/settled-2.log" | grep -v '^--' | tee "$OUT/settled.txt"
python3 -c 'import json,sys; s=json.load(open("/var/lib/llm-fleet/settled.json")); print(json.dumps(s["gpus"], indent=1, sort_keys=True))' > "$OUT/settled-gpus.json" 2>&1
kill -- -"$SERVER_PID" 2>/dev/null || kill "$SERVER_PID" 2>/dev/null
for pid in $OTHER_PIDS; do kill -- -"$pid" 2>/dev/null || kill "$pid" 2>/dev/null; done

# --- the model stage again: the next plan expects what verify measured ----------------
cp /etc/llm-fleet/plan.json "$OUT/plan-before-calibration.json"
stamp "model stage again (reads the calibration)"
playbook playbooks/model.yml > "$OUT/stage-model-2.log" 2>&1; echo "model(2) rc=$?" | tee -a "$OUT/rc.txt"
cp /etc/llm-fleet/plan.json "$OUT/plan.json"
python3 - "$OUT" <<'PY'
import json, os, sys
out = sys.argv[1]
before = json.load(open(os.path.join(out, "plan-before-calibration.json")))["plans"][0]
after = json.load(open(os.path.join(out, "plan.json")))["plans"][0]
verify = json.load(open("/etc/ansible/facts.d/llm_fleet_verify.fact"))["instances"][0]
for name, p in (("plan before", before), ("plan after", after)):
    print("%s: %s %s expected %s / %s tok/s (ceiling %s), efficiency %s from %s: %s" % (
        name, p["quant"], p["ctx_size"], p["expected_decode_tps"], p["expected_aggregate_tps"], p["decode_ceiling_tps"],
        p["decode_efficiency"]["value"], p["decode_efficiency"]["from"], p["decode_efficiency"]["source"]))
print("measured: 1 stream %s tok/s, all %s slots %s tok/s; VRAM %s" % (
    verify["single_stream_tps"], verify["parallel"], verify["aggregate_slots_tps"], verify["vram"]))
for inst in json.load(open("/etc/ansible/facts.d/llm_fleet_verify.fact"))["instances"][1:]:
    print("measured %s (%s): 1 stream %s tok/s; VRAM %s" % (inst.get("instance"), inst.get("model_name"),
                                                           inst["single_stream_tps"], inst["vram"]))
# the memory the plans predict before and after verify's calibration (the measured CUDA context),
# against what the same processes held: the configuration is the same when only the context moved
instances = json.load(open("/etc/ansible/facts.d/llm_fleet_verify.fact"))["instances"]
rows = []
for name, path in (("before", "plan-before-calibration.json"), ("after", "plan.json")):
    for p in json.load(open(os.path.join(out, path)))["plans"]:
        inst = [i for i in instances if str(i.get("instance", i.get("gpu_index"))) == str(p.get("instance", p["gpu_index"]))]
        vram = inst[0]["vram"] if inst else {}
        key = "predicted_process_bytes" if vram.get("scope") == "process" else "predicted_used_bytes"
        measured = vram.get("measured_used_bytes")
        rows.append({"plan": name, "instance": p.get("instance", p["gpu_index"]), "quant": p["quant"],
                     "ctx_size": p["ctx_size"], "parallel": p["parallel"],
                     "overhead_cuda_mib": p["memory"]["overhead_cuda_bytes"] >> 20, "predicted_bytes": p["memory"][key],
                     "measured_bytes": measured,
                     "measured_over_predicted": round(measured / p["memory"][key], 4) if measured else None})
        print("memory %(plan)s calibration, %(instance)s %(quant)s -c %(ctx_size)s -np %(parallel)s: CUDA context "
              "%(overhead_cuda_mib)s MiB, predicted %(predicted_bytes)s, measured %(measured_bytes)s, "
              "ratio %(measured_over_predicted)s" % rows[-1])
json.dump(rows, open(os.path.join(out, "memory-before-after-calibration.json"), "w"), indent=1)
PY
[ -n "${SPEC:-}" ] && python3 "$HERE/spec_summary.py" "$OUT" | tee "$OUT/speculation-summary.txt"
# Every stage's fact (the stage contract, module_utils/stage_contract.py), and one
# bundle of everything (the device tool brings back only a few files per call).
cp /etc/ansible/facts.d/llm_fleet_*.fact "$OUT/" 2>/dev/null
stamp "done"
