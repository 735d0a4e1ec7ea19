# -*- coding: utf-8 -*-
"""The fleet's decisions on one screen: a row per llama-server instance with the
card(s), the tuning applied, the build, what the planner chose and the speed
expected against the speed measured, and what each previewed model would get.
Read from the stages' local facts (what the hosts really hold), by
playbooks/summary.yml."""
from __future__ import absolute_import, division, print_function

__metaclass__ = type

import os

import ansible.module_utils

# Ansible ships module_utils/ to modules only; the controller maps the
# repository's copy, so a plugin and a module share one definition.
_MODULE_UTILS = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "module_utils"))
if _MODULE_UTILS not in ansible.module_utils.__path__:
    ansible.module_utils.__path__.append(_MODULE_UTILS)

from ansible.module_utils.filter_input import guard_filters  # noqa: E402
from ansible.module_utils.fleet_instances import instance_id  # noqa: E402

COLUMNS = (("host", 20), ("GPU", 26), ("tuning", 15), ("build", 13), ("serves", 27), ("expect", 8),
           ("measured", 9), ("verify", 7))


def _short_gpu(name):
    for prefix in ("Tesla ", "NVIDIA "):
        if str(name or "").startswith(prefix):
            name = name[len(prefix):]
    return str(name or "?")


def _indices(plan):
    return plan.get("gpu_indices") or [plan.get("gpu_index")]


def _gpu_cell(plan):
    label = "+".join(str(i) for i in _indices(plan))
    split = plan.get("split_mode") or "none"
    name = _short_gpu(str(plan.get("gpu_name") or "").split(" x ", 1)[-1])
    if split != "none":
        name = "%s %s" % (name, split)
    return "%s %s" % (label, name)


def _tuning_cell(tuning, plan):
    cells = []
    settings = dict((s.get("index"), s) for s in (tuning or {}).get("settings") or [])
    for index in _indices(plan):
        s = settings.get(index)
        if s is None:
            cells.append("-")
            continue
        clock = "%s MHz" % s["locked_graphics_clock_mhz"] if s.get("locked_graphics_clock_mhz") else "unlocked"
        power = "%g W" % float(s["power_limit_w"]) if s.get("power_limit_w") else "default W"
        cells.append("%s %s" % (clock, power))
    return cells[0] if len(set(cells)) == 1 else "/".join(cells)


def _build_cell(llama_cpp):
    if not llama_cpp:
        return "-"
    backend = llama_cpp.get("backend") or "?"
    archs = llama_cpp.get("cuda_architectures") or []
    if isinstance(archs, str):
        archs = [a for a in archs.replace(",", ";").split(";") if a]
    return "%s %s" % (backend, " ".join("sm_%s" % a for a in archs)) if backend == "cuda" and archs else backend


def _instance(entry):
    try:
        return instance_id(entry)
    except (KeyError, TypeError, ValueError):
        return None


def _serves_cell(plan):
    # several models: the model's name before its quant
    return "%s%s c%d x%d %s" % ("%s " % plan["model_name"] if plan.get("model_rank") else "", plan.get("quant"), int(plan.get("ctx_size") or 0), int(plan.get("parallel") or 0),
                              plan.get("cache_type_k"))


def _num(value):
    if value is None:
        return "-"
    return "%.1f" % float(value) if float(value) < 10000 else "%.0f" % float(value)


def _row(values):
    # the last column (the verdict, or why a GPU is held) is never cut
    last = len(COLUMNS) - 1
    return "  ".join((str(v) if n == last else str(v)[:w]).ljust(w)
                     for n, (v, (_, w)) in enumerate(zip(values, COLUMNS))).rstrip()


def _cpu_served(inst, gpu_build, seen):
    """The status word of an instance a GPU build served from the CPU (None otherwise)."""
    if gpu_build and inst.get("served_by") == "cpu":
        seen.append(inst)
        return "CPU-served"
    return None


def llm_fleet_decisions(hosts, hostvars):
    """Lines of the decisions table for hosts (names) read from hostvars' local
    facts (ansible_facts.ansible_local.llm_fleet_*)."""
    lines = [_row([c for c, _ in COLUMNS]), _row(["-" * w for _, w in COLUMNS])]
    previews, cpu_served = [], []
    for host in hosts or []:
        local = ((hostvars[host].get("ansible_facts") or {}).get("ansible_local") or {}) if host in hostvars else {}
        model = local.get("llm_fleet_model") or {}
        llama_cpp = local.get("llm_fleet_llama_cpp") or {}
        verify = local.get("llm_fleet_verify") or {}
        tuning = local.get("llm_fleet_gpu_tuning") or {}
        gpu_build = (llama_cpp.get("backend") or "cpu") != "cpu"
        # one row per plan: per model and card (several models share a GPU)
        measured = dict((_instance(i), i) for i in verify.get("instances") or [])
        # planned GPUs the llama_server stage kept its instance off (failed health check)
        held = dict((h.get("gpu_index"), h) for h in (local.get("llm_fleet_llama_server") or {}).get("held") or [])
        plans = model.get("plans") or []
        if not plans:
            lines.append(_row([host, "no plan recorded yet"]))
        for plan in plans:
            inst = measured.get(_instance(plan)) or {}
            lines.append(_row([
                host, _gpu_cell(plan), _tuning_cell(tuning, plan), _build_cell(llama_cpp), _serves_cell(plan),
                # the plan's expectation is a GPU figure: nothing to expect of a CPU build, or of a
                # GPU build the CPU served (its card never showed the process: verify's served_by)
                _num(plan.get("expected_decode_tps")) if gpu_build and inst.get("served_by") != "cpu" else "-",
                _num(inst.get("single_stream_tps")),
                # below the planned share of the ceiling: flagged, not failed (verify's own words)
                "HELD " + ",".join(p.get("check", "?") for p in held[plan.get("gpu_index")].get("problems") or [])
                if plan.get("gpu_index") in held else
                ("ERROR" if not inst.get("ok") else _cpu_served(inst, gpu_build, cpu_served)
                 or ("FLAGGED" if inst.get("flagged") else "ok")) if inst
                else (verify.get("status") or "-")]))
        for preview in model.get("previews") or []:
            chosen = ", ".join("%s %s (%s tok/s)" % (_gpu_cell(p).split(" ")[0], p.get("quant"),
                                                     _num(p.get("expected_decode_tps")))
                               for p in preview.get("plans") or [])
            previews.append("  %s: %s -> %s" % (host, preview.get("name"), chosen))
    lines.append("expect/measured: single-stream tok/s (expected only for a GPU build); serves: quant, "
                 "-c total x slots, KV type")
    if cpu_served:
        lines.append("CPU-served: a CUDA build whose card showed no process while it served (NVML), so the CPU "
                     "answered and the GPU's expectation does not apply. On simulated cards (make demo, molecule), "
                     "which compute nothing, that is what they can show; on a real host it is a fault of the "
                     "driver or the build.")
    if previews:
        lines.append("previewed, not served (the plan each host would get):")
        lines.extend(previews)
    return lines


_KINDS = {
    "llm_fleet_decisions": {"hosts": "texts?", "hostvars": "dict"},
}


class FilterModule(object):
    def filters(self):
        return guard_filters({"llm_fleet_decisions": llm_fleet_decisions}, _KINDS)
