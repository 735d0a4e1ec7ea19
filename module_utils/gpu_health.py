# -*- coding: utf-8 -*-
"""A GPU's memory health and who holds its memory, read through NVML, and the
verdict the fleet acts on: an instance is not started on a card that fails it.

read_health(nvml, handle) -> plain dict (nvidia_gpu_facts puts it on every GPU);
assess(health, ...)       -> problems, each {"check", "severity", "message"}:
  severity "fail" keeps llama-server off the card, "warn" is reported only.

The thresholds follow NVIDIA's own tools: DCGM fails a card at 60 retired pages
(DCGM_LIMIT_MAX_RETIRED_PAGES) and warns at 15; an uncorrectable ECC error since
boot, a page waiting for retirement (Volta/Turing) or a row remap pending or failed
(Ampere and later) all mean the card's memory cannot be trusted until a reset or
reboot (or, for a failed remap, an RMA).

Xid events are not here: NVML reports them only to a process listening when they
happen (its event API); the kernel log is where they stay (`journalctl -k | grep Xid`).
"""
from __future__ import absolute_import, division, print_function

__metaclass__ = type

MAX_RETIRED_PAGES = 60  # DCGM_LIMIT_MAX_RETIRED_PAGES
RETIRED_PAGES_WARN = 15  # DCGM_LIMIT_MAX_RETIRED_PAGES_SOFT_LIMIT

# nvml.h enums (pynvml names them the same)
_CORRECTED, _UNCORRECTED = 0, 1
_VOLATILE, _AGGREGATE = 0, 1
_CAUSE_SBE, _CAUSE_DBE = 0, 1

FOREIGN_POLICIES = ("refuse", "warn", "ignore")


def _call(nvml, func, *args):
    """An NVML getter this card or driver may not support: None when it cannot answer."""
    try:
        return func(*args)
    except nvml.NVMLError:
        return None


def _process_name(pid, proc_root="/proc"):
    try:
        with open("%s/%d/comm" % (proc_root, pid)) as f:
            return f.read().strip() or None
    except (IOError, OSError):
        return None


def read_health(nvml, handle, proc_root="/proc"):
    """ECC mode and counters, retired pages, remapped rows and the compute processes
    of one GPU. A figure the card does not report is None (a V100 retires pages, an
    A100 or H100 remaps rows; neither does both)."""
    mode = _call(nvml, nvml.nvmlDeviceGetEccMode, handle)
    ecc_enabled = bool(mode[0]) if mode is not None else None
    ecc = {}
    for kind, error_type in (("corrected", _CORRECTED), ("uncorrected", _UNCORRECTED)):
        for counter, counter_type in (("volatile", _VOLATILE), ("aggregate", _AGGREGATE)):
            value = _call(nvml, nvml.nvmlDeviceGetTotalEccErrors, handle, error_type, counter_type) \
                if ecc_enabled else None
            ecc["%s_%s" % (kind, counter)] = int(value) if value is not None else None
    sbe = _call(nvml, nvml.nvmlDeviceGetRetiredPages, handle, _CAUSE_SBE)
    dbe = _call(nvml, nvml.nvmlDeviceGetRetiredPages, handle, _CAUSE_DBE)
    pending = _call(nvml, nvml.nvmlDeviceGetRetiredPagesPendingStatus, handle)
    rows = _call(nvml, nvml.nvmlDeviceGetRemappedRows, handle)
    processes = []
    for proc in _call(nvml, nvml.nvmlDeviceGetComputeRunningProcesses, handle) or []:
        used = getattr(proc, "usedGpuMemory", None)
        processes.append({
            "pid": int(proc.pid),
            "name": _process_name(int(proc.pid), proc_root),
            "used_bytes": int(used) if used is not None else None,
        })
    return {
        "ecc_enabled": ecc_enabled,
        "ecc_errors": ecc,
        "retired_pages": None if sbe is None and dbe is None else {
            "single_bit": len(sbe or []),
            "double_bit": len(dbe or []),
            "pending": bool(pending) if pending is not None else None,
        },
        "remapped_rows": None if rows is None else {
            "correctable": int(rows[0]),
            "uncorrectable": int(rows[1]),
            "pending": bool(rows[2]),
            "failure": bool(rows[3]),
        },
        "processes": sorted(processes, key=lambda p: p["pid"]),
    }


def _mib(value):
    return "%d MiB" % (int(value) // 1048576) if value is not None else "an unknown amount of memory"


def foreign_processes(health, own_names=("llama-server",)):
    """The compute processes on the card that are not one of ours."""
    return [p for p in (health or {}).get("processes") or [] if p.get("name") not in own_names]


def assess(health, foreign_policy="refuse", own_names=("llama-server",)):
    """What is wrong with the card, worst first. foreign_policy: what a process that
    is not ours holding GPU memory means: refuse (fail: the plan budgets the whole card,
    so the model would not fit or would starve it), warn (start anyway), ignore."""
    if foreign_policy not in FOREIGN_POLICIES:
        raise ValueError("foreign_policy is %r; use one of %s" % (foreign_policy, ", ".join(FOREIGN_POLICIES)))
    if health is None:
        return []
    problems = []

    def add(check, severity, message):
        problems.append({"check": check, "severity": severity, "message": message})

    ecc = health.get("ecc_errors") or {}
    if (ecc.get("uncorrected_volatile") or 0) > 0:
        add("ecc_uncorrectable", "fail",
            "%d uncorrectable ECC error(s) since boot: what the card computes may be wrong; reboot (or "
            "`nvidia-smi -r`) so the driver retires the page, then watch the count" % ecc["uncorrected_volatile"])
    elif (ecc.get("uncorrected_aggregate") or 0) > 0:
        add("ecc_uncorrectable_history", "warn",
            "%d uncorrectable ECC error(s) over the card's life (none since boot)" % ecc["uncorrected_aggregate"])
    if health.get("ecc_enabled") is False:
        add("ecc_disabled", "warn",
            "ECC is off: memory errors go unnoticed; `nvidia-smi -e 1` and a reboot turn it on")

    pages = health.get("retired_pages")
    if pages:
        total = pages["single_bit"] + pages["double_bit"]
        if pages.get("pending"):
            add("retired_pages_pending", "fail",
                "a memory page waits for retirement (after an uncorrectable error): reboot or reset the GPU")
        if total >= MAX_RETIRED_PAGES:
            add("retired_pages_limit", "fail",
                "%d retired pages (%d double-bit), at or over NVIDIA's limit of %d: the card is due for "
                "replacement (RMA)" % (total, pages["double_bit"], MAX_RETIRED_PAGES))
        elif total >= RETIRED_PAGES_WARN:
            add("retired_pages_many", "warn",
                "%d retired pages (%d double-bit); NVIDIA's limit is %d" % (total, pages["double_bit"],
                                                                           MAX_RETIRED_PAGES))

    rows = health.get("remapped_rows")
    if rows:
        if rows.get("failure"):
            add("row_remap_failure", "fail",
                "a row remapping failed: the card has run out of spare rows and is due for replacement (RMA)")
        elif rows.get("pending"):
            add("row_remap_pending", "fail",
                "a row remap is pending (after an uncorrectable error): reset the GPU or reboot")

    if foreign_policy != "ignore":
        for proc in foreign_processes(health, own_names):
            add("foreign_process", "fail" if foreign_policy == "refuse" else "warn",
                "PID %d (%s) holds %s of GPU memory, which the plan counts as the model's; stop "
                "it, or set the foreign-process policy to warn" % (proc["pid"], proc.get("name") or "exited", _mib(proc.get("used_bytes"))))
    problems.sort(key=lambda p: p["severity"] != "fail")
    return problems


def healthy(problems):
    return not any(p["severity"] == "fail" for p in problems)
