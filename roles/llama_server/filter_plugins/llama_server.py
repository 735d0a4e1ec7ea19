# -*- coding: utf-8 -*-
"""Render a GPU plan into llama-server's command line, keeping only flags the
installed build has (its --help, recorded by the llama_cpp stage); and the
host-dependent parts of its unit: the CPU list of the GPU's NUMA affinity, the
CUDA environment the build needs, and the host's systemd version."""
from __future__ import absolute_import, division, print_function

__metaclass__ = type

import math
import os
import re

import ansible.module_utils

# Ansible ships module_utils/ to modules only; the controller maps the
# repository's copy, so a plugin and a module share one definition.
_MODULE_UTILS = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..",
                                              "module_utils"))
if _MODULE_UTILS not in ansible.module_utils.__path__:
    ansible.module_utils.__path__.append(_MODULE_UTILS)

from ansible.module_utils.llama_flags import (PLAN_FLAGS, RUN_FLAGS, SERVER, plan_flags, router_preset,  # noqa: E402
                                              run_flag)
from ansible.module_utils.filter_input import FilterInputError, guard_filters, short  # noqa: E402
from ansible.module_utils.fleet_instances import instance_id, instance_port, router_id  # noqa: E402

# CUDA_MODULE_LOADING=LAZY is honoured from CUDA 11.7 on; lazy loading is the
# default only from 12.2, so an 11.8 build (the V100 fleet's) loads every kernel
# module of every architecture at start unless told otherwise.
CUDA_LAZY_LOADING_SINCE = (11, 7)
CUDA_MODULE_LOADING_VALUES = ("LAZY", "EAGER")
# The oldest systemd the roles support (Ubuntu 20.04: 245.4). A host whose version
# cannot be read gets a unit with nothing newer than this.
SYSTEMD_OLDEST_SUPPORTED = 245
# Linux's largest CONFIG_NR_CPUS is 8192; a CPU list reaching past this bound is not
# a host's (and "0-99999999999" would take minutes to expand).
CPU_ID_LIMIT = 1 << 16
# Flags the role cannot run without: a build that lacks one cannot serve the plan
# as asked (and without --api-key-file it would serve without authentication).
_ESSENTIAL_FLAGS = ("--model", "--ctx-size", "--parallel", "--port", "--host", "--api-key-file",
                    # a plan whose draft model serves (the verdict would measure something else without it)
                    "--model-draft")
# Other spellings of flags the role sets, which llama_server_extra_args may not repeat.
_OWNED_ALIASES = ("-a", "--gpu-layers", "--api-key", "--mlock", "--load-mode")


def llama_server_args(plan, options, supported_flags):
    """plan: one entry of the planner's `plans`; options: host, port, alias,
    threads, metrics, api_key_file, lock_memory, llama_fit, extra_args.
    Returns {'args': [...], 'dropped': [flags the build lacks]}."""
    supported = set(supported_flags or [])
    wanted = plan_flags(plan, SERVER)
    # The network options right after the model, where they have always been (a
    # changed ExecStart would restart every instance on upgrade).
    wanted[1:1] = [("--alias", options.get("alias")), ("--host", options["host"]), ("--port", options["port"])]
    wanted += [run_flag("threads", options["threads"]), run_flag("threads_batch", options["threads"])]
    if options.get("metrics"):
        wanted.append(("--metrics", None))
    if options.get("api_key_file"):
        wanted.append(("--api-key-file", options["api_key_file"]))
    if options.get("lock_memory"):
        # Newer builds replaced --mlock with --load-mode; use what this build has.
        wanted.append(("--load-mode", "mlock") if "--load-mode" in supported else ("--mlock", None))
    if not options.get("llama_fit", False):
        # The plan already fitted every value; llama.cpp must not change them silently.
        wanted.append(run_flag("fit", "off"))
    args, dropped = [], []
    for flag, value in wanted:
        if flag not in supported:
            if flag in _ESSENTIAL_FLAGS:
                raise FilterInputError("the installed llama-server has no %s flag; it cannot run this plan as asked "
                                 "(build a llama.cpp that has it: the llama_cpp stage)" % flag)
            dropped.append(flag)
            continue
        args.append(flag)
        if value is not None:
            args.append(str(value))
    owned = (set(flag for flag, _ in wanted) | set(_OWNED_ALIASES) | set(short for _, _, short, _ in PLAN_FLAGS)
             | set(short for _, _, short in RUN_FLAGS))
    for extra in options.get("extra_args") or []:
        extra = str(extra)
        name = extra.split("=", 1)[0]
        if extra.startswith("-") and name in owned:
            raise FilterInputError("llama_server_extra_args has %s, which the role sets itself (from the plan and the "
                             "llama_server_* variables, after its checks): set the variable instead" % name)
        if extra.startswith("-") and name not in supported:
            raise FilterInputError("llama_server_extra_args has %s, which the installed llama-server does not know"
                                   % extra)
        args.append(extra)
    return {"args": args, "dropped": dropped}


def llama_server_health_retries(model_bytes, base_s, per_gib_s, delay_s):
    """Polls of /health (every delay_s) to allow an instance to load a model of
    model_bytes: base_s plus per_gib_s per GiB of model, rounded up."""
    seconds = float(base_s) + float(per_gib_s) * int(model_bytes or 0) / (1 << 30)
    return int(math.ceil(seconds / float(delay_s)))


def llama_server_instance_id(plan):
    """The systemd instance of a plan (llama-server@<id>; module_utils/fleet_instances)."""
    return instance_id(plan)


def llama_server_port(plan, base_port, model_port_step=100):
    """The port of a plan's instance (module_utils/fleet_instances)."""
    return instance_port(plan, base_port, model_port_step)


def llama_server_instance(plan, base_port, build_key="", fingerprints=None, model_port_step=100):
    """What the local fact records of one instance (build_key: the llama.cpp build
    it runs, which the llama_cpp stage never prunes; fingerprints: {instance id:
    hash of what it serves: drop-in, unit template, API key})."""
    keys = ("gpu_index", "gpu_uuid", "model_path", "quant", "ctx_size", "parallel", "cache_type_k", "cache_type_v")
    entry = {key: plan.get(key) for key in keys}
    entry["spec_type"] = plan.get("spec_type") or "none"
    instance = instance_id(plan)
    entry["instance"] = instance
    entry["model_name"] = plan.get("model_name") or ""
    entry["model_rank"] = int(plan.get("model_rank") or 0)
    # every GPU the instance uses (a split plan: more than one)
    entry["gpu_indices"] = plan.get("gpu_indices") or [plan.get("gpu_index")]
    entry["gpu_uuids"] = plan.get("gpu_uuids") or [plan.get("gpu_uuid")]
    entry["split_mode"] = plan.get("split_mode") or "none"
    entry["port"] = instance_port(plan, base_port, model_port_step)
    entry["unit"] = "llama-server@%s.service" % instance
    entry["build_key"] = build_key
    entry["fingerprint"] = (fingerprints or {}).get(instance)
    return entry


def llama_server_router_preset(plans, options, supported_flags):
    """The --models-preset INI of a card's router: one section per on-demand plan, its
    model's name, holding the flags llama_server_args renders for it (the router sets
    each child's host, port and alias and keeps the API key)."""
    sections = []
    for plan in plans:
        # options' threads: the host's CPUs, which each plan's own count may not pass
        threads = min(int(plan.get("threads") or options["threads"]), int(options["threads"]))
        args = llama_server_args(plan, dict(options, alias=plan.get("model_name"), threads=threads),
                                 supported_flags)["args"]
        sections.append((plan.get("model_name"), args))
    try:
        return router_preset(sections, comment="llm-fleet: the models loaded on demand on this GPU, one section each "
                                               "(llama-server --models-preset)")
    except ValueError as err:
        raise FilterInputError("the router's preset: %s" % err)


def llama_server_router_args(router, options, supported_flags):
    """The router's own command line: where it listens, its preset and --models-max,
    and the API key it checks (its children listen on 127.0.0.1 without one)."""
    supported = set(supported_flags or [])
    for flag in ("--models-preset", "--models-max"):
        if flag not in supported:
            raise FilterInputError("the installed llama-server has no %s flag, which serving models on demand needs "
                                   "(llama-server's router mode): build a llama.cpp that has it (the llama_cpp "
                                   "stage), or set load: resident" % flag)
    args = ["--host", str(options["host"]), "--port", str(options["port"]), "--models-preset",
            str(options["preset"]), "--models-max", str(int(router["models_max"]))]
    if options.get("api_key_file"):
        args += ["--api-key-file", str(options["api_key_file"])]
    return args


def llama_server_on_demand_instance(plan, router, base_port, build_key="", fingerprints=None, model_port_step=100):
    """The fact's record of a model loaded on demand: llama_server_instance's, reached
    through its card's router (its port and unit), with load on_demand."""
    entry = llama_server_instance(plan, base_port, build_key, None, model_port_step)
    rid = router_id(router["gpu_index"])
    entry.update(load="on_demand", router=rid, port=instance_port(router, base_port, model_port_step),
                 unit="llama-server@%s.service" % rid, fingerprint=(fingerprints or {}).get(rid))
    return entry


def _version_tuple(text):
    """'11.8' / '12.2.140' / 13 -> (11, 8) / (12, 2) / (13, 0); None when there is none."""
    match = re.match(r"\s*(\d+)(?:\.(\d+))?", str(text if text is not None else ""))
    if not match:
        return None
    return int(match.group(1)), int(match.group(2) or 0)


def llama_server_environment(llama_cpp_fact, cuda_module_loading="auto"):
    """Environment variables llama-server needs beyond CUDA_VISIBLE_DEVICES, from
    the llama_cpp stage's fact (backend, cuda_version).

    cuda_module_loading: 'auto' sets CUDA_MODULE_LOADING=LAZY on a CUDA build of
    11.7 or newer (on 11.7-12.1 that saves the memory of every kernel the process
    never runs; from 12.2 it is CUDA's default and only made explicit); 'LAZY' or
    'EAGER' force that value on any CUDA build; '' leaves CUDA's own default.
    A CPU build gets nothing. Returns a dict (empty when nothing is needed)."""
    fact = llama_cpp_fact or {}
    choice = str(cuda_module_loading if cuda_module_loading is not None else "").strip()
    if choice.upper() in CUDA_MODULE_LOADING_VALUES:
        choice = choice.upper()
    elif choice.lower() in ("auto", ""):
        choice = choice.lower()
    else:
        raise FilterInputError("llama_server_cuda_module_loading must be auto, LAZY, EAGER or '' (CUDA's default), "
                               "got %r" % cuda_module_loading)
    if fact.get("backend") != "cuda" or choice == "":
        return {}
    if choice == "auto":
        version = _version_tuple(fact.get("cuda_version"))
        if version is None or version < CUDA_LAZY_LOADING_SINCE:
            return {}
        choice = "LAZY"
    return {"CUDA_MODULE_LOADING": choice}


def _cpu_ids(value):
    """CPU ids from a list of ints or a Linux cpu list ('0-3,8,10-11'); a
    Cpus_allowed_list line of /proc/<pid>/status is read too. Empty when there is
    none."""
    if value is None:
        return set()
    if isinstance(value, (list, tuple, set)):
        cpus = set(int(cpu) for cpu in value)
        if any(cpu < 0 or cpu >= CPU_ID_LIMIT for cpu in cpus):
            raise FilterInputError("llama_server_cpu_list: %s holds a CPU id outside 0-%d"
                                   % (short(value), CPU_ID_LIMIT - 1))
        return cpus
    text = str(value)
    match = re.search(r"Cpus_allowed_list:\s*(\S*)", text)
    if match:
        text = match.group(1)
    if not re.match(r"^[\d\s,-]*$", text):
        return set()
    cpus = set()
    for part in re.split(r"[\s,]+", text.strip()):
        if not part:
            continue
        first, _, last = part.partition("-")
        first, last = int(first), int(last or first)
        if last >= CPU_ID_LIMIT or last - first >= CPU_ID_LIMIT:
            raise FilterInputError("llama_server_cpu_list: %s is not a CPU list of this host (CPU ids below %d, "
                                   "e.g. '0-19,40-59')" % (short(value), CPU_ID_LIMIT))
        cpus.update(range(first, last + 1))
    return cpus


def llama_server_cpu_list(cpus, usable=None):
    """The CPUs of a GPU's affinity (NVML's, a list of ids) as systemd's
    CPUAffinity= takes them: ranges separated by spaces ('0-19 40-59').
    usable: the CPUs this host lets processes run on (a list, a cpu list or
    /proc/self/status; unread or empty: not applied); the affinity is cut to those,
    since a mask without any usable CPU fails the start (status 242/CPU_AFFINITY).
    '' when nothing is left, so the line is left out."""
    ids = _cpu_ids(cpus)
    usable_ids = _cpu_ids(usable)
    if usable_ids:
        ids &= usable_ids
    runs = []
    for cpu in sorted(ids):
        if runs and cpu == runs[-1][1] + 1:
            runs[-1][1] = cpu
        else:
            runs.append([cpu, cpu])
    return " ".join(str(a) if a == b else "%d-%d" % (a, b) for a, b in runs)


def llama_server_systemd_version(systemctl_version):
    """The systemd version from `systemctl --version` ('systemd 245 (245.4-4ubuntu3.23)'),
    or an int / ansible_facts['systemd']['version']. SYSTEMD_OLDEST_SUPPORTED when
    it cannot be read, so the unit holds nothing newer than the oldest supported host."""
    if isinstance(systemctl_version, int) and not isinstance(systemctl_version, bool):
        return systemctl_version
    match = re.search(r"\bsystemd\s+(\d+)", str(systemctl_version or "")) or \
        re.match(r"\s*(\d+)\s*$", str(systemctl_version or ""))
    return int(match.group(1)) if match else SYSTEMD_OLDEST_SUPPORTED


_KINDS = {
    "llama_server_args": {"plan": "dict", "options": "dict", "supported_flags": "list?"},
    "llama_server_instance": {"plan": "dict", "fingerprints": "dict?"},
    "llama_server_instance_id": {"plan": "dict"},
    "llama_server_port": {"plan": "dict"},
    "llama_server_environment": {"llama_cpp_fact": "dict?"},
    "llama_server_router_preset": {"plans": "dicts", "options": "dict", "supported_flags": "list?"},
    "llama_server_router_args": {"router": "dict", "options": "dict", "supported_flags": "list?"},
    "llama_server_on_demand_instance": {"plan": "dict", "router": "dict", "fingerprints": "dict?"},
}


class FilterModule(object):
    def filters(self):
        return guard_filters({
            "llama_server_args": llama_server_args,
            "llama_server_instance": llama_server_instance,
            "llama_server_instance_id": llama_server_instance_id,
            "llama_server_port": llama_server_port,
            "llama_server_health_retries": llama_server_health_retries,
            "llama_server_environment": llama_server_environment,
            "llama_server_router_preset": llama_server_router_preset,
            "llama_server_router_args": llama_server_router_args,
            "llama_server_on_demand_instance": llama_server_on_demand_instance,
            "llama_server_cpu_list": llama_server_cpu_list,
            "llama_server_systemd_version": llama_server_systemd_version,
        }, _KINDS)
