#!/usr/bin/env python3
"""Side-by-side benchmark of llama-server configurations on one GPU and one model.

Runs, one after the other, on the same GPU with the same GGUF:

  (a) defaults  llama.cpp's defaults: llama-server -m MODEL (plus --host/--port)
  (b) seed003   seed 003's settings: -ngl 999 -c 4096 -np 1, q8_0 KV, -fa on, -b/-ub 512
  (c) seed000   seed 000's settings: -ngl 999 -c 32768 -np 8, q8_0 KV, -b 2048 -ub 512
  (d) plan      the plan this project computes (module_utils/llama_plan.py from the GPU's
                real NVML facts, module_utils/nvidia_gpu.py, and the GGUF read by
                module_utils/gguf_model.py), rendered as roles/llama_server renders it
  (e...) more plans from other policies (--extra-plan NAME='{"target_ctx": ...}')

For each: VRAM used (NVML: the process's own figure and the card's used memory
against the baseline before the server started) next to what the planner's memory
model predicts for that very -c/-np/KV type (and llama-fit-params' estimate);
single-stream decode and aggregate tok/s at 4 streams and at the planned slot count
(the load test of roles/verify/files/llm_fleet_loadtest.py, imported); each as a
ratio to the decode ceiling (NVML bandwidth / bytes read per token; and the same
with a measured bandwidth when --bandwidth-gbs is given). Saves JSON (GPU, driver,
llama.cpp commit, model shape, every figure) and prints a table.

    python benchmarks/bench_configs.py --bin-dir BUILD/bin --model M.gguf --out results.json

Needs: nvidia-ml-py (pynvml) and gguf (gguf-py) importable; no Ansible.
"""
from __future__ import absolute_import, division, print_function

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import time
import types

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MIB = 1 << 20
GIB = 1 << 30


def import_project():
    """module_utils as ansible.module_utils (as Ansible maps it on a host), with or without Ansible."""
    mu = os.path.join(ROOT, "module_utils")
    try:
        import ansible.module_utils as amu
        if mu not in list(amu.__path__):
            amu.__path__.append(mu)
    except ImportError:
        pkg = types.ModuleType("ansible")
        pkg.__path__ = []
        amu = types.ModuleType("ansible.module_utils")
        amu.__path__ = [mu]
        pkg.module_utils = amu
        sys.modules["ansible"] = pkg
        sys.modules["ansible.module_utils"] = amu
    from ansible.module_utils import gguf_model, llama_plan, nvidia_gpu, plan_memory, plan_model, plan_speed, plan_split
    sys.path.insert(0, os.path.join(ROOT, "roles", "verify", "files"))
    import llm_fleet_loadtest
    return gguf_model, llama_plan, nvidia_gpu, plan_memory, plan_model, plan_speed, plan_split, llm_fleet_loadtest


gguf_model, llama_plan, nvidia_gpu, plan_memory, plan_model, plan_speed, plan_split, loadtest = import_project()


def role_filters():
    """roles/llama_server's filter module, if importable."""
    path = os.path.join(ROOT, "roles", "llama_server", "filter_plugins")
    if not os.path.isfile(os.path.join(path, "llama_server.py")):
        return None
    sys.path.insert(0, path)
    try:
        import llama_server
        return llama_server
    except Exception:  # being edited by others: fall back to the planner's own args
        return None
    finally:
        sys.path.remove(path)


def role_renderer():
    """roles/llama_server's own argument renderer, if importable."""
    filters = role_filters()
    return filters.llama_server_args if filters is not None else None


def build_cuda_version(bin_dir, given=None):
    """(backend, CUDA version) of the build in bin_dir: --cuda-version if given, else the
    llama_cpp role's build record (BUILD.json beside bin/), else nvcc --version (CUDA_HOME,
    then PATH) when the build links the CUDA backend; (backend, None) when unknown."""
    if given:
        return "cuda", given
    record = os.path.join(os.path.dirname(os.path.abspath(bin_dir)), "BUILD.json")
    if os.path.isfile(record):
        with open(record) as handle:
            data = json.load(handle)
        return data.get("backend"), data.get("cuda_version")
    libdirs = [bin_dir, os.path.join(os.path.dirname(os.path.abspath(bin_dir)), "lib")]
    if not any(os.path.exists(os.path.join(d, "libggml-cuda.so")) for d in libdirs):
        return "unknown", None
    for nvcc in (os.path.join(os.environ.get("CUDA_HOME", "/usr/local/cuda"), "bin", "nvcc"), "nvcc"):
        try:
            out = subprocess.run([nvcc, "--version"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=30)
        except (OSError, subprocess.TimeoutExpired):
            continue
        match = re.search(r"release (\d+\.\d+)", out.stdout.decode("utf-8", "replace"))
        if match:
            return "cuda", match.group(1)
    return "cuda", None


def cuda_environment(bin_dir, given_version, choice):
    """What roles/llama_server adds to the unit's environment for this build
    (CUDA_MODULE_LOADING=LAZY on CUDA >= 11.7), decided by the role's own filter."""
    backend, version = build_cuda_version(bin_dir, given_version)
    filters = role_filters()
    if filters is None:
        print("note: roles/llama_server's filters are not importable; CUDA_MODULE_LOADING left as it is",
              file=sys.stderr)
        return {}, backend, version
    return filters.llama_server_environment({"backend": backend, "cuda_version": version}, choice), backend, version


# --- NVML ---------------------------------------------------------------------

class Gpu(object):
    def __init__(self, index):
        import pynvml
        self.nvml = pynvml
        pynvml.nvmlInit()
        self.index = index
        self.handle = pynvml.nvmlDeviceGetHandleByIndex(index)

    def used_bytes(self):
        return int(self.nvml.nvmlDeviceGetMemoryInfo(self.handle).used)

    def process_bytes(self, pid):
        """What NVML says the process uses on this GPU, or None."""
        try:
            procs = self.nvml.nvmlDeviceGetComputeRunningProcesses(self.handle)
        except self.nvml.NVMLError:
            return None
        for p in procs:
            if int(p.pid) == int(pid) and p.usedGpuMemory is not None:
                return int(p.usedGpuMemory)
        return None


# --- configurations -------------------------------------------------------------

def seed_configs(model_path, cpus):
    """(name, description, args, cache type, ctx, slots) of (a)-(c); ctx/slots None = llama.cpp decides."""
    t8 = str(min(8, cpus))
    t20 = str(min(20, cpus))
    return [
        ("defaults", "llama.cpp defaults: llama-server -m MODEL", ["-m", model_path], "f16", None, None),
        ("seed003", "seed 003: ctx 4096, 1 slot, q8_0 KV, FA on, batch/ubatch 512",
         ["-m", model_path, "-ngl", "999", "-c", "4096", "-fa", "on", "-ctk", "q8_0", "-ctv", "q8_0",
          "-b", "512", "-ub", "512", "-t", t8, "-tb", t8, "-np", "1"], "q8_0", 4096, 1),
        ("seed000", "seed 000: ctx 32768, 8 slots, q8_0 KV, batch 2048 / ubatch 512",
         ["-m", model_path, "-ngl", "999", "-c", "32768", "-b", "2048", "-ub", "512", "-np", "8",
          "-ctk", "q8_0", "-ctv", "q8_0", "-t", t20], "q8_0", 32768, 8),
    ]


def help_flags(server):
    out = subprocess.run([server, "--help"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=60)
    return sorted(set(re.findall(r"(?<![\w-])(--?[a-zA-Z][\w-]*)", out.stdout.decode("utf-8", "replace"))))


def plan_args(plan, flags, render):
    if render is not None:
        try:
            return render(plan, {"host": "127.0.0.1", "port": 0, "threads": plan["threads"], "metrics": True,
                                 "lock_memory": False, "llama_fit": False, "alias": plan["quant"]},
                          flags)["args"], "roles/llama_server filter llama_server_args"
        except Exception as err:  # noqa: BLE001 - report and fall back
            print("note: the role's renderer failed (%s); using the plan's server_args" % err, file=sys.stderr)
    return list(plan["server_args"]), "plan server_args"


def strip_host_port(args):
    out, skip = [], False
    for i, a in enumerate(args):
        if skip:
            skip = False
            continue
        if a in ("--host", "--port"):
            skip = True
            continue
        out.append(a)
    return out


# --- running one configuration ------------------------------------------------------

def start_server(server, args, port, log_path, env):
    cmd = [server] + args + ["--host", "127.0.0.1", "--port", str(port)]
    log = open(log_path, "wb")
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    return proc, cmd, log


def stop_server(proc, log):
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)
    log.close()


def wait_gpu_released(gpu, baseline, timeout=30):
    deadline = time.time() + timeout
    while time.time() < deadline and gpu.used_bytes() > baseline + 256 * MIB:
        time.sleep(0.5)


def fit_params_estimate(fit_bin, model_path, ctx, slots, cache_type, batch, ubatch, env):
    """llama-fit-params --fit-print on: MiB per device of model, context, compute."""
    if not fit_bin or not os.path.exists(fit_bin):
        return None
    cmd = [fit_bin, "-m", model_path, "-ngl", "999", "-fa", "on", "-c", str(ctx), "-np", str(slots),
           "-ctk", cache_type, "-ctv", cache_type, "-b", str(batch), "-ub", str(ubatch), "-fitp", "on"]
    try:
        out = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=180, env=env)
    except subprocess.TimeoutExpired:
        return {"command": cmd, "error": "timed out"}
    rows = {}
    for line in out.stdout.decode("utf-8", "replace").splitlines():
        parts = line.split()
        if len(parts) == 4 and all(p.isdigit() for p in parts[1:]):
            rows[parts[0]] = {"model_mib": int(parts[1]), "context_mib": int(parts[2]), "compute_mib": int(parts[3])}
    device = next((v for k, v in rows.items() if k != "Host"), None)
    result = {"command": cmd, "rc": out.returncode, "devices": rows}
    if device:
        result["device_total_mib"] = device["model_mib"] + device["context_mib"] + device["compute_mib"]
    else:
        result["stderr_tail"] = out.stderr.decode("utf-8", "replace")[-1500:]
    return result


def llama_bench(bench_bin, model_path, cache_type, n_prompt, n_gen, reps, env, threads):
    cmd = [bench_bin, "-m", model_path, "-ngl", "999", "-fa", "1", "-ctk", cache_type, "-ctv", cache_type,
           "-p", str(n_prompt), "-n", str(n_gen), "-r", str(reps), "-t", str(threads), "-o", "json"]
    try:
        out = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=300, env=env)
        rows = json.loads(out.stdout.decode("utf-8"))
    except (subprocess.TimeoutExpired, ValueError) as err:
        return {"command": cmd, "error": str(err)}
    keep = ("n_prompt", "n_gen", "avg_ts", "stddev_ts", "model_size", "model_n_params", "flash_attn", "type_k",
            "type_v", "n_gpu_layers", "gpu_info", "build_commit", "n_batch", "n_ubatch")
    return {"command": cmd, "results": [dict((k, r.get(k)) for k in keep) for r in rows]}


def measure(name, description, args, cache_type, ctx, slots, ctx_opts):
    """Start, measure memory and speed, stop. ctx_opts: shared context (see main)."""
    o = ctx_opts
    port = o["port"]
    log_path = os.path.join(o["log_dir"], "server-%s.log" % name)
    wait_gpu_released(o["gpu"], o["baseline"])
    before = o["gpu"].used_bytes()
    t0 = time.time()
    proc, cmd, log = start_server(o["server"], args, port, log_path, o["env"])
    entry = {"name": name, "description": description, "command": cmd, "log": os.path.basename(log_path)}
    try:
        client = loadtest.Client("http://127.0.0.1:%d" % port, timeout=300)
        try:
            client.wait_healthy(o["health_timeout"])
        except loadtest.LoadTestError as err:
            entry["error"] = "%s (see %s)" % (err, log_path)
            if proc.poll() is not None:
                entry["error"] += "; exit code %s" % proc.returncode
            return entry
        entry["load_s"] = round(time.time() - t0, 1)
        props = client.props()
        n_ctx = (props.get("default_generation_settings") or {}).get("n_ctx")
        total_slots = props.get("total_slots")
        # n_ctx in /props is per slot; -c = n_ctx x slots (unified KV: the whole pool)
        entry["server_props"] = {"total_slots": total_slots, "n_ctx_per_slot": n_ctx}
        real_slots = int(total_slots or slots or 1)
        # -c as the server allocated it, from its log (/props gives the per-slot
        # figure, which is the whole pool when the KV cache is unified, as with
        # llama.cpp's default -np auto)
        logged = log_context_size(log_path)
        entry["server_props"]["n_ctx_logged"] = logged
        real_ctx = logged or ctx or int(n_ctx or 0) * real_slots
        entry["ctx_size"], entry["parallel"], entry["cache_type"] = real_ctx, real_slots, cache_type
        levels = []
        for lv in [1, 4, o["plan_slots"], real_slots]:
            if lv not in levels:
                levels.append(lv)
        report = loadtest.run(client_url(port), ",".join(str(l) for l in levels), o["n_predict"],
                              timeout=300, budget_s=o["budget_s"], health_timeout=5)
        entry["load_test"] = report
        used = o["gpu"].used_bytes()
        entry["vram"] = {
            "device_used_before_bytes": before,
            "device_used_bytes": used,
            "device_delta_bytes": used - before,
            "process_bytes": o["gpu"].process_bytes(proc.pid),
        }
    finally:
        stop_server(proc, log)
    model, gpu_facts, policy = o["model"], o["gpu_facts"], o["policy"]
    mem = plan_split.budget(model, gpu_facts, policy, real_ctx, real_slots, cache_type)
    ceiling = plan_split.ceiling_for(model, gpu_facts, policy, real_ctx // real_slots, cache_type)
    # what the planner expects of this very configuration (module_utils/plan_speed.py,
    # the built-in table: no fleet calibration here)
    efficiency = plan_speed.efficiency_for(gpu_facts, model)
    expected = plan_speed.expected_decode(ceiling, efficiency["value"], cache_type)
    exponent = plan_speed.aggregate_exponent(gpu_facts, None, efficiency["arch"], real_slots)
    # the same expectation at the fill the load test's streams had (its prompt and half
    # its tokens), not the plan's kv_fill of the slot: the memory model's claim for the
    # conditions measured (a 32k slot half full reads 4 GB more per token than a short prompt)
    streams = ((entry.get("load_test") or {}).get("levels") or [{}])[0].get("streams") or [{}]
    test_fill = int((streams[0].get("prompt_tokens") or 0) + o["n_predict"] // 2)
    per_slot = real_ctx // real_slots
    fill_policy = dict(policy, kv_fill=min(1.0, max(1, test_fill) / float(per_slot)))
    expected_at_fill = plan_speed.expected_decode(
        plan_split.ceiling_for(model, gpu_facts, fill_policy, per_slot, cache_type), efficiency["value"], cache_type)
    entry["predicted"] = {
        "expected_decode_tps": round(expected, 2),
        "test_fill_tokens": test_fill,
        "expected_decode_at_test_fill_tps": round(expected_at_fill, 2),
        "expected_aggregate_at_test_fill_tps": round(plan_speed.expected_aggregate(
            expected_at_fill, real_slots, exponent), 2),
        "expected_aggregate_tps": round(plan_speed.expected_aggregate(expected, real_slots, exponent), 2),
        "aggregate_exponent": exponent,
        "decode_efficiency": efficiency,
        "predicted_used_bytes": mem["predicted_used_bytes"],
        "weights_bytes": mem["weights_bytes"], "kv_bytes": mem["kv_bytes"], "compute_bytes": mem["compute_bytes"],
        "overhead_bytes": mem["overhead_bytes"], "overhead_cuda_bytes": mem["overhead_cuda_bytes"],
        "driver_reserved_bytes": mem["overhead_driver_reserved_bytes"],
        "decode_ceiling_tps": round(ceiling, 2),
    }
    entry["fit_params"] = fit_params_estimate(o["fit_bin"], o["model_path"], real_ctx, real_slots, cache_type,
                                              2048, 512, o["env"])
    entry["figures"] = figures(entry, o)
    return entry


def log_context_size(log_path):
    try:
        with open(log_path, "rb") as handle:
            text = handle.read().decode("utf-8", "replace")
    except (IOError, OSError):
        return None
    # "load_model: initializing, n_slots = 4, n_ctx_slot = 8192, kv_unified = 'false'"
    found = re.findall(r"n_slots = (\d+), n_ctx_slot = (\d+), kv_unified = '(\w+)'", text)
    if not found:
        return None
    slots, per_slot, unified = found[-1]
    # a unified KV cache is one pool that every slot may fill: n_ctx_slot is the whole -c
    return int(per_slot) if unified == "true" else int(per_slot) * int(slots)


def client_url(port):
    return "http://127.0.0.1:%d" % port


def _ratio(a, b):
    return round(a / b, 4) if a is not None and b else None


def figures(entry, o):
    """The headline numbers of one configuration."""
    rep = entry.get("load_test") or {}
    l1 = loadtest.level(rep, 1) or {}
    l4 = loadtest.level(rep, 4) or {}
    lp = loadtest.level(rep, o["plan_slots"]) or {}
    ceiling = entry["predicted"]["decode_ceiling_tps"]
    measured_ceiling = None
    if o.get("bandwidth_bytes_per_s"):
        bw_gpu = dict(o["gpu_facts"], memory_bandwidth_bytes_per_s=o["bandwidth_bytes_per_s"])
        measured_ceiling = round(plan_split.ceiling_for(o["model"], bw_gpu, o["policy"],
                                                        entry["ctx_size"] // entry["parallel"], entry["cache_type"]), 2)
    vram = entry.get("vram") or {}
    proc_bytes = vram.get("process_bytes")
    predicted = entry["predicted"]["predicted_used_bytes"]
    reserved = o["reserved_bytes"]
    fit = entry.get("fit_params") or {}
    single = l1.get("per_stream_tps_mean")
    # decode summed over every slot busy (the streams' own rates: prompt processing
    # and queueing left out), what expected_aggregate_tps predicts
    all_slots = loadtest.level(rep, entry["parallel"]) or {}
    aggregate_decode = all_slots.get("aggregate_decode_tps")
    expected, expected_agg = entry["predicted"]["expected_decode_tps"], entry["predicted"]["expected_aggregate_tps"]
    at_fill = entry["predicted"].get("expected_decode_at_test_fill_tps")
    agg_at_fill = entry["predicted"].get("expected_aggregate_at_test_fill_tps")
    return {
        "expected_decode_tps": expected,
        "single_over_expected": _ratio(single, expected),
        "aggregate_slots_decode_tps": aggregate_decode,
        "expected_aggregate_tps": expected_agg,
        "aggregate_over_expected": _ratio(aggregate_decode, expected_agg),
        "expected_decode_at_test_fill_tps": at_fill,
        "single_over_expected_at_test_fill": _ratio(single, at_fill),
        "expected_aggregate_at_test_fill_tps": agg_at_fill,
        "aggregate_over_expected_at_test_fill": _ratio(aggregate_decode, agg_at_fill),
        "single_stream_tps": single,
        "single_stream_ttft_s": l1.get("ttft_s_mean"),
        "aggregate_4_tps": l4.get("aggregate_tps"),
        "aggregate_plan_slots_tps": lp.get("aggregate_tps"),
        "ceiling_tps": ceiling,
        "measured_bw_ceiling_tps": measured_ceiling,
        "single_ratio": _ratio(single, ceiling),
        "aggregate_4_ratio": _ratio(l4.get("aggregate_tps"), ceiling),
        "aggregate_plan_slots_ratio": _ratio(lp.get("aggregate_tps"), ceiling),
        "single_ratio_measured_bw": _ratio(single, measured_ceiling),
        "vram_process_mib": round(proc_bytes / MIB) if proc_bytes else None,
        "vram_device_delta_mib": round(vram["device_delta_bytes"] / MIB) if vram else None,
        "vram_predicted_mib": round((predicted - reserved) / MIB),
        "vram_measured_over_predicted": _ratio(proc_bytes or vram.get("device_delta_bytes"), predicted - reserved),
        "fit_params_mib": fit.get("device_total_mib"),
    }


def table(results):
    head = ("config", "-c", "-np", "KV", "1-stream", "expect", "1s/exp", "agg@4", "agg@plan", "dec@np", "exp@np",
            "dec/exp", "ceiling", "1s/ceil", "VRAM MiB", "pred MiB", "meas/pred", "fit MiB")
    rows = [head]
    for e in results:
        f = e.get("figures")
        if not f:
            rows.append((e["name"], "-", "-", "-", "error: " + str(e.get("error", "?"))[:60]) + ("",) * 13)
            continue
        rows.append((e["name"], e["ctx_size"], e["parallel"], e["cache_type"], f["single_stream_tps"],
                     f["expected_decode_tps"], f["single_over_expected"], f["aggregate_4_tps"],
                     f["aggregate_plan_slots_tps"], f["aggregate_slots_decode_tps"], f["expected_aggregate_tps"],
                     f["aggregate_over_expected"], f["ceiling_tps"], f["single_ratio"],
                     f["vram_process_mib"] or f["vram_device_delta_mib"], f["vram_predicted_mib"],
                     f["vram_measured_over_predicted"], f["fit_params_mib"]))
    text = [[("%.1f" % c) if isinstance(c, float) else str(c if c is not None else "-") for c in r] for r in rows]
    widths = [max(len(r[i]) for r in text) for i in range(len(head))]
    return "\n".join("  ".join(c.rjust(widths[i]) for i, c in enumerate(r)) for r in text)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--bin-dir", required=True, help="directory with llama-server (and llama-bench, llama-fit-params)")
    p.add_argument("--model", required=True)
    p.add_argument("--gpu", type=int, default=0, help="NVML index of the GPU (also CUDA_VISIBLE_DEVICES)")
    p.add_argument("--port", type=int, default=18080)
    p.add_argument("--configs", default="defaults,seed003,seed000,plan", help="which of (a)-(d) to run, in order")
    p.add_argument("--policy", default="{}", help="planner policy for (d), JSON")
    p.add_argument("--extra-plan", action="append", default=[], metavar="NAME=JSON",
                   help="another plan from another policy (repeatable)")
    p.add_argument("--n-predict", type=int, default=128)
    p.add_argument("--budget-s", type=float, default=240, help="seconds of load test per configuration, at most")
    p.add_argument("--health-timeout", type=float, default=300)
    p.add_argument("--bandwidth-gbs", type=float, default=None, help="measured read bandwidth (GB/s), for a second ceiling")
    p.add_argument("--llama-bench", action="store_true", help="also run llama-bench for the plan's cache type")
    p.add_argument("--llama-bench-p", type=int, default=512)
    p.add_argument("--llama-bench-n", type=int, default=128)
    p.add_argument("--out", default="bench-results.json")
    p.add_argument("--log-dir", default=None)
    p.add_argument("--commit", default=None, help="llama.cpp commit (else what llama-server --version says)")
    p.add_argument("--cuda-version", default=None,
                   help="CUDA version of the build (else its BUILD.json, else nvcc --version)")
    p.add_argument("--cuda-module-loading", default="auto", choices=["auto", "LAZY", "EAGER", ""],
                   help="as roles/llama_server's llama_server_cuda_module_loading (auto: LAZY on CUDA >= 11.7); "
                        "a CUDA_MODULE_LOADING already in the environment wins")
    args = p.parse_args()

    import pynvml
    server = os.path.join(args.bin_dir, "llama-server")
    if not os.access(server, os.X_OK):
        sys.exit("no llama-server in %s" % args.bin_dir)
    log_dir = args.log_dir or os.path.dirname(os.path.abspath(args.out))
    env = dict(os.environ)
    host = nvidia_gpu.read_host(pynvml)
    gpu_facts = host["gpus"][args.gpu]
    env["CUDA_VISIBLE_DEVICES"] = gpu_facts["uuid"]
    # the servers (and llama-bench, llama-fit-params) run with what the role's unit sets
    cuda_env, backend, cuda_version = cuda_environment(args.bin_dir, args.cuda_version, args.cuda_module_loading)
    for key, value in cuda_env.items():
        env.setdefault(key, value)
    print("build: %s, CUDA %s; CUDA_MODULE_LOADING=%s" % (backend, cuda_version or "?",
                                                          env.get("CUDA_MODULE_LOADING", "(CUDA's default)")),
          flush=True)
    gpu = Gpu(args.gpu)
    baseline = gpu.used_bytes()
    meta = gguf_model.read_model(args.model)
    model = plan_model.model_from_metadata(meta.get("file_type"), meta, path=args.model, source="file")

    policies = [("plan", json.loads(args.policy))]
    for spec in args.extra_plan:
        name, _, text = spec.partition("=")
        policies.append((name.strip(), json.loads(text)))
    plans = []
    for name, pol in policies:
        result = llama_plan.plan_host([gpu_facts], [model], pol)
        plans.append((name, result["plans"][0], result["policy"], result["summary"]))
    default_policy = plans[0][2]
    plan_slots = plans[0][1]["parallel"]
    version = subprocess.run([server, "--version"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=60)
    version_text = version.stdout.decode("utf-8", "replace").strip()
    flags = help_flags(server)
    render = role_renderer()

    opts = {
        "server": server, "env": env, "gpu": gpu, "baseline": baseline, "port": args.port, "log_dir": log_dir,
        "health_timeout": args.health_timeout, "n_predict": args.n_predict, "budget_s": args.budget_s,
        "model": model, "model_path": args.model, "gpu_facts": gpu_facts, "policy": default_policy,
        "plan_slots": plan_slots, "fit_bin": os.path.join(args.bin_dir, "llama-fit-params"),
        "bandwidth_bytes_per_s": args.bandwidth_gbs * 1e9 if args.bandwidth_gbs else None,
        # the process's own figure leaves out what the driver reserves: NVML's v2
        # figure where the driver gives it (615 MiB on the H200), as the planner does
        "reserved_bytes": (gpu_facts["memory_reserved_bytes"] if gpu_facts.get("memory_reserved_bytes") is not None
                           else plan_memory.driver_reserved_bytes(gpu_facts["memory_total_bytes"])),
    }
    out = {
        "schema": "llm-fleet-bench/1",
        "started_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "gpu": dict((k, gpu_facts.get(k)) for k in ("index", "name", "uuid", "memory_total_bytes", "compute_capability",
                                                    "memory_bus_width_bits", "max_memory_clock_mhz",
                                                    "memory_bandwidth_bytes_per_s", "max_graphics_clock_mhz",
                                                    "power_limit_w", "cpu_affinity")),
        "gpu_memory_used_before_bytes": baseline,
        "driver_version": host["driver_version"], "cuda_driver_version": host["cuda_driver_version"],
        "llama_cpp": {"version": version_text, "commit": args.commit, "backend": backend,
                      "cuda_version": cuda_version},
        "cuda_module_loading": env.get("CUDA_MODULE_LOADING"),
        "measured_bandwidth_gbs": args.bandwidth_gbs,
        "model": {k: meta.get(k) for k in ("model_path", "architecture", "name", "file_type", "block_count",
                                           "embedding_length", "feed_forward_length", "head_count", "head_count_kv",
                                           "key_length", "vocab_size", "context_length", "parameter_count",
                                           "weight_bytes", "token_embd_bytes", "kv_bytes_per_token")},
        "planner": {"gpu_weight_bytes": model["gpu_weight_bytes"], "plans": []},
        "n_predict": args.n_predict,
        "aggregate_exponent": plan_speed.AGGREGATE_EXPONENT,
        "aggregate_ratio_by_arch": plan_speed.AGGREGATE_RATIO_BY_ARCH,
        "configs": [],
    }
    for name, plan, pol, summary in plans:
        out["planner"]["plans"].append({"name": name, "policy": pol, "summary": summary,
                                        "plan": dict((k, v) for k, v in plan.items() if k not in ("candidates",))})

    def save():
        with open(args.out + ".part", "w") as handle:
            json.dump(out, handle, indent=1, sort_keys=True, default=str)
        os.replace(args.out + ".part", args.out)

    wanted = [c.strip() for c in args.configs.split(",") if c.strip()]
    seeds = dict((c[0], c) for c in seed_configs(args.model, os.cpu_count() or 8))
    for name in wanted + [n for n, _, _, _ in plans[1:]]:
        if name in seeds:
            _, desc, cargs, ct, ctx, slots = seeds[name]
        else:
            match = [p for p in plans if p[0] == name]
            if not match:
                sys.exit("unknown configuration %r (known: %s)" % (name, ", ".join(list(seeds) + [p[0] for p in plans])))
            _, plan, _, summary = match[0]
            plan = dict(plan, model_path=args.model)
            cargs, how = plan_args(plan, flags, render)
            cargs = strip_host_port(cargs)
            desc = "plan (%s): %s" % (how, summary)
            ct, ctx, slots = plan["cache_type_k"], plan["ctx_size"], plan["parallel"]
        print("== %s: %s" % (name, desc), flush=True)
        entry = measure(name, desc, cargs, ct, ctx, slots, opts)
        if name == "plan" and args.llama_bench:
            entry["llama_bench"] = llama_bench(os.path.join(args.bin_dir, "llama-bench"), args.model, ct,
                                               args.llama_bench_p, args.llama_bench_n, 3, env, plans[0][1]["threads"])
        out["configs"].append(entry)
        f = entry.get("figures") or {}
        print("   %s" % (json.dumps(f, sort_keys=True) if f else entry.get("error")), flush=True)
        save()
    out["finished_at"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    out["table"] = table(out["configs"])
    save()
    print(out["table"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
