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

Xid events: NVML reports them only to a process listening when they happen (its
event API). The GPU exporter (module_utils/gpu_exporter.py) listens and appends each
to XID_JOURNAL, under /run so that a reboot clears it, as it clears the condition;
read_xid_journal reads it back for the gate. Without the exporter running, Xids are
not seen here (the kernel log still has them: `journalctl -k | grep Xid`).
"""
from __future__ import absolute_import, division, print_function

__metaclass__ = type

import json
import time

MAX_RETIRED_PAGES = 60  # DCGM_LIMIT_MAX_RETIRED_PAGES
RETIRED_PAGES_WARN = 15  # DCGM_LIMIT_MAX_RETIRED_PAGES_SOFT_LIMIT

# nvml.h enums (pynvml names them the same)
_CORRECTED, _UNCORRECTED = 0, 1
_VOLATILE, _AGGREGATE = 0, 1
_CAUSE_SBE, _CAUSE_DBE = 0, 1

# What a process that is not ours holding a card's memory means: refuse (hold the card),
# warn (start anyway: the plan budgets the whole card), plan_around (the model stage budgets
# what it holds as taken; the gate holds the card only when it holds more than was planned),
# ignore.
FOREIGN_POLICIES = ("refuse", "warn", "plan_around", "ignore")

# NVML's answers for a card it counts but cannot reach: GPU_IS_LOST (fell off the bus,
# Xid 79) and RESET_REQUIRED. Such a card is reported apart; the others are read as usual.
LOST_ERRORS = (15, 16)

FOREIGN_SLACK_BYTES = 256 * 1048576

XID_JOURNAL = "/run/llm-fleet-gpu-exporter/xid-events.jsonl"
# The Xids that mean the card (not the program) failed, from NVIDIA's Xid catalog
# (docs.nvidia.com/deploy/xid-errors): the instance stays off until a reboot clears them.
# Any other Xid (13, 31, 43: an application's fault) is reported as a warning.
SERIOUS_XIDS = {
    48: "a double-bit ECC error",
    63: "an ECC page retirement or row remapping event",
    64: "an ECC page retirement or row remapping failure",
    74: "an NVLink error",
    79: "the GPU has fallen off the bus",
    92: "a high single-bit ECC error rate",
    94: "a contained ECC error",
    95: "an uncontained ECC error",
    119: "a GSP RPC timeout",
    120: "a GSP error",
}


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


def read_xid_journal(path=XID_JOURNAL):
    """{uuid: [{"time": epoch seconds, "xid": N}, ...]} of the Xids the exporter heard since
    boot; None when nothing listens (no journal): unknown, not "no Xid"."""
    try:
        with open(path) as f:
            lines = f.read().splitlines()
    except (IOError, OSError):
        return None
    events = {}
    for line in lines:
        try:
            event = json.loads(line)
            events.setdefault(str(event["uuid"]), []).append({"time": float(event["time"]), "xid": int(event["xid"])})
        except (ValueError, KeyError, TypeError):
            continue  # a line cut short by a crash mid-write
    return events


def read_health(nvml, handle, proc_root="/proc", xid_events=None):
    """ECC mode and counters, retired pages, remapped rows, the compute processes and
    the Xids since boot (xid_events: read_xid_journal's answer) of one GPU. A figure the
    card does not report is None (a V100 retires pages, an A100 or H100 remaps rows;
    neither does both)."""
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
        "xid_events": None if xid_events is None else
        xid_events.get(_text(_call(nvml, nvml.nvmlDeviceGetUUID, handle)), []),
    }


def _text(value):
    return value.decode() if isinstance(value, bytes) else value


def _mib(value):
    return "%d MiB" % (int(value) // 1048576) if value is not None else "an unknown amount of memory"


def foreign_processes(health, own_names=("llama-server",)):
    """The compute processes on the card that are not one of ours."""
    return [p for p in (health or {}).get("processes") or [] if p.get("name") not in own_names]


def assess(health, foreign_policy="refuse", own_names=("llama-server",)):
    """What is wrong with the card, worst first. foreign_policy: what a process that
    is not ours holding GPU memory means (FOREIGN_POLICIES): refuse fails the card (the
    plan budgets the whole card, so the model would not fit or would starve it); warn
    and plan_around warn (plan_against_foreign says whether a plan still fits); ignore."""
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

    for event in health.get("xid_events") or []:
        when = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(event["time"]))
        meaning = SERIOUS_XIDS.get(event["xid"])
        if meaning:
            add("xid", "fail", "Xid %d (%s) at %s: reboot the host (or reset the GPU and delete its lines "
                "from %s); if it comes back, the card is due for replacement" % (event["xid"], meaning, when,
                                                                                XID_JOURNAL))
        else:
            add("xid_other", "warn", "Xid %d at %s: an application's or the driver's fault, not the card's "
                "(NVIDIA's Xid catalog says which)" % (event["xid"], when))

    if foreign_policy != "ignore":
        for proc in foreign_processes(health, own_names):
            who = "PID %d (%s) holds %s of GPU memory" % (proc["pid"], proc.get("name") or "exited",
                                                         _mib(proc.get("used_bytes")))
            if foreign_policy == "plan_around":
                add("foreign_process", "warn", who + ", which the plan leaves to it (plan_around)")
            else:
                add("foreign_process", "fail" if foreign_policy == "refuse" else "warn",
                    who + ", which the plan counts as the model's; stop it, or set the foreign-process policy "
                    "to plan_around (plan the model in what is left) or warn")
    problems.sort(key=lambda p: p["severity"] != "fail")
    return problems


def plan_against_foreign(health, planned_bytes, own_names=("llama-server",)):
    """Under plan_around: a problem when other processes now hold more of the card than
    the plan left them (planned_bytes, its memory's foreign_bytes), else None. A slack of
    FOREIGN_SLACK_BYTES absorbs the few MiB a process's use moves between two reads."""
    procs = foreign_processes(health, own_names)
    held = sum(int(p.get("used_bytes") or 0) for p in procs)
    if held <= int(planned_bytes or 0) + FOREIGN_SLACK_BYTES:
        return None
    names = ", ".join("PID %d (%s) %s" % (p["pid"], p.get("name") or "exited", _mib(p.get("used_bytes")))
                      for p in procs)
    return {"check": "foreign_process_grew", "severity": "fail",
            "message": "other processes hold %s of GPU memory (%s) and the plan left them %s: the model would "
                       "not fit beside them; run the model stage again (site.yml, or --tags model,llama_server) to "
                       "plan around what they hold now" % (_mib(held), names, _mib(planned_bytes or 0))}


def healthy(problems):
    return not any(p["severity"] == "fail" for p in problems)
