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
event API). The GPU exporter (roles/gpu_exporter/files/gpu_exporter.py) listens and appends each
to XID_JOURNAL, under /run so that a reboot clears it, as it clears the condition;
read_xid_journal reads it back for the gate. Without the exporter running, Xids are
not seen here (the kernel log still has them: `journalctl -k | grep Xid`).

Re-admission: the volatile ECC count and the Xid journal stay until a reboot or a GPU
reset, also after the fault was handled. The llama_server stage keeps, per held card,
the counters that matter (counters) and when they last moved; readmission re-admits a
card whose counters have not moved for a soak, with nothing waiting for repair, and the
counts it accepted then (its stage fact's `readmitted`, read_readmitted) are reported,
not failed, by assess until they grow again.
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

# The checks a held card is re-admitted from (readmission): a count that stays until a reset or
# reboot although the fault was handled. Any of BLOCKING_CHECKS (in words) keeps it held whatever
# the soak (gpu_lost: the gate's problem for a card NVML counts but cannot reach); PROCESS_CHECKS
# hold it while the process runs, and are not soaked.
SOAKED_CHECKS = ("ecc_uncorrectable", "xid")
PROCESS_CHECKS = ("foreign_process", "foreign_process_grew")
BLOCKING_CHECKS = {
    "gpu_lost": "NVML cannot reach it",
    "retired_pages_pending": "a page waits for retirement",
    "retired_pages_limit": "its retired pages are at NVIDIA's limit (RMA)",
    "row_remap_pending": "a row remap is pending",
    "row_remap_failure": "a row remapping failed (RMA)",
}
# The llama_server stage's local fact: its `readmitted` list is what read_readmitted gives a
# reader that judges the cards on its own (the GPU exporter).
READMITTED_FACT = "/etc/ansible/facts.d/llm_fleet_llama_server.fact"


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
    processes, running = [], _call(nvml, nvml.nvmlDeviceGetComputeRunningProcesses, handle)
    for proc in running or []:
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
        # False: NVML could not list them (an empty list then means nothing)
        "processes_read": running is not None,
        "xid_events": None if xid_events is None else
        xid_events.get(_text(_call(nvml, nvml.nvmlDeviceGetUUID, handle)), []),
    }


def _text(value):
    return value.decode() if isinstance(value, bytes) else value


def _when(epoch):
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(epoch)) if epoch is not None else "an unknown time"


def _mib(value):
    return "%d MiB" % (int(value) // 1048576) if value is not None else "an unknown amount of memory"


def foreign_processes(health, own_names=("llama-server",)):
    """The compute processes on the card that are not one of ours."""
    return [p for p in (health or {}).get("processes") or [] if p.get("name") not in own_names]


def assess(health, foreign_policy="refuse", own_names=("llama-server",), readmitted=None):
    """What is wrong with the card, worst first. foreign_policy: what a process that
    is not ours holding GPU memory means (FOREIGN_POLICIES): refuse fails the card (the
    plan budgets the whole card, so the model would not fit or would starve it); warn
    and plan_around warn (plan_against_foreign says whether a plan still fits); ignore.
    readmitted: the card's entry in the llama_server fact's `readmitted` (readmission's
    accepted counters and readmitted_at): uncorrectable ECC errors since boot up to the
    accepted count and serious Xids up to the accepted one are warnings (checks
    ecc_uncorrectable_accepted, xid_accepted); more, or a later Xid, fail as usual."""
    if foreign_policy not in FOREIGN_POLICIES:
        raise ValueError("foreign_policy is %r; use one of %s" % (foreign_policy, ", ".join(FOREIGN_POLICIES)))
    if health is None:
        return []
    problems = []

    def add(check, severity, message):
        problems.append({"check": check, "severity": severity, "message": message})

    accepted = (readmitted or {}).get("accepted") or {}
    readmitted_at = _when((readmitted or {}).get("readmitted_at"))
    ecc = health.get("ecc_errors") or {}
    volatile = ecc.get("uncorrected_volatile") or 0
    if volatile > 0 and accepted.get("ecc_uncorrected_volatile") is not None \
            and volatile <= accepted["ecc_uncorrected_volatile"]:
        add("ecc_uncorrectable_accepted", "warn",
            "%d uncorrectable ECC error(s) since boot, none since the card was re-admitted at %s after a clean "
            "soak; a reboot or `nvidia-smi -r` clears the count" % (volatile, readmitted_at))
    elif volatile > 0:
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
        when = _when(event["time"])
        meaning = SERIOUS_XIDS.get(event["xid"])
        if meaning and accepted.get("xid_time") is not None and event["time"] <= accepted["xid_time"]:
            add("xid_accepted", "warn", "Xid %d (%s) at %s, before the card was re-admitted at %s after a clean "
                "soak" % (event["xid"], meaning, when, readmitted_at))
        elif meaning:
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


def read_readmitted(path=READMITTED_FACT):
    """{uuid: entry} of the cards the llama_server stage re-admitted after a hold (its local
    fact's `readmitted`: the counters it accepted), for assess's readmitted; {} without one."""
    try:
        with open(path) as f:
            entries = json.load(f).get("readmitted") or []
    except (IOError, OSError, ValueError, AttributeError):
        return {}
    return dict((e["gpu_uuid"], e) for e in entries if isinstance(e, dict) and e.get("gpu_uuid"))


def counters(health):
    """What a held card is watched on between runs (None: NVML cannot reach it): the
    uncorrectable ECC errors since boot, the retired pages and the pending flags, the row
    remap flags, and the latest serious Xid (number and time; None for none, or when no
    exporter listens). A figure the card does not report is None."""
    if health is None:
        return None
    ecc = health.get("ecc_errors") or {}
    pages = health.get("retired_pages") or {}
    rows = health.get("remapped_rows") or {}
    serious = [e for e in health.get("xid_events") or [] if e.get("xid") in SERIOUS_XIDS]
    latest = max(serious, key=lambda e: e["time"]) if serious else None
    return {
        "ecc_uncorrected_volatile": ecc.get("uncorrected_volatile"),
        "retired_pages_single_bit": pages.get("single_bit"),
        "retired_pages_double_bit": pages.get("double_bit"),
        "retired_pages_pending": pages.get("pending"),
        "row_remap_pending": rows.get("pending"),
        "row_remap_failure": rows.get("failure"),
        "xid": latest["xid"] if latest else None,
        "xid_time": latest["time"] if latest else None,
    }


_COUNTER_NAMES = (
    ("ecc_uncorrected_volatile", "uncorrectable ECC errors since boot"),
    ("retired_pages_single_bit", "single-bit retired pages"),
    ("retired_pages_double_bit", "double-bit retired pages"),
    ("retired_pages_pending", "a page pending retirement"),
    ("row_remap_pending", "a row remap pending"),
    ("row_remap_failure", "a failed row remap"),
)


def _shown(value):
    return "yes" if value is True else "no" if value is False else "unknown" if value is None else str(value)


def _changes(old, new):
    """What moved between two counters() answers, in words."""
    if old is None or new is None:
        return ["NVML reads it again" if new is not None else "NVML cannot reach it"]
    moved = ["%s %s -> %s" % (name, _shown(old.get(key)), _shown(new.get(key)))
             for key, name in _COUNTER_NAMES if old.get(key) != new.get(key)]
    if (old.get("xid"), old.get("xid_time")) != (new.get("xid"), new.get("xid_time")):
        moved.append("Xid %d at %s" % (new["xid"], _when(new["xid_time"])) if new.get("xid") is not None
                     else "its Xids are gone from the journal")
    return moved


def soak_seconds(value, name="the soak"):
    """A re-admission soak as whole seconds >= 0, or None for never (a negative number).
    Takes an int or its digits as text (what `-e name=3600` passes); anything else is a
    ValueError that names it."""
    if isinstance(value, str) and value.strip().lstrip("-").isdigit():
        value = int(value.strip())
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError("%s is %r: give whole seconds, e.g. 86400 (0 re-admits a held card on the next run once its "
                         "counters are clean; a negative number, e.g. -1, never re-admits one automatically)"
                         % (name, value))
    return value if value >= 0 else None


def hold_record(previous, health, now):
    """A held card's record ({"counters", "held_since", "last_change"}) now: previous is the
    record of the last run (None: not held then); last_change moves only when the counters
    differ from the recorded ones, so that a rerun with nothing new changes nothing."""
    seen = counters(health)
    if previous is None:
        return {"counters": seen, "held_since": now, "last_change": now}
    held_since = previous.get("held_since", now)
    if "counters" not in previous or previous["counters"] != seen:
        return {"counters": seen, "held_since": held_since, "last_change": now}
    return {"counters": seen, "held_since": held_since, "last_change": previous.get("last_change", now)}


def readmission(previous, health, now, soak_s, name="the GPU", check_mode=False):
    """Whether a card held for its counters (an uncorrectable ECC error since boot, a serious
    Xid, or one of BLOCKING_CHECKS) serves again: yes once nothing waits for repair (no page
    pending retirement, no pending or failed row remap, not lost, under the retired-page
    limit) and its counters (counters(): no new ECC error, retired page or serious Xid) have
    not moved for soak_s seconds (soak_seconds' answer; None: never).

    previous: the card's hold record of the last run (hold_record's answer; None when it was
    not held), health: read_health's answer now (None: NVML cannot reach the card), now:
    epoch seconds of the host's clock. Returns {"readmit", "state" (new, changed, blocked,
    never, soaking, readmit), "record" (hold_record's answer), "accepted" (when readmit: the
    baseline assess takes as readmitted, with held_since and readmitted_at), "message"}."""
    now = int(now)
    record = hold_record(previous, health, now)
    state = "new" if previous is None else "changed" if previous.get("counters", ()) != record["counters"] else None
    blocking = ["NVML cannot reach it"] if health is None else \
        [BLOCKING_CHECKS[p["check"]] for p in assess(health, "ignore") if p["check"] in BLOCKING_CHECKS]
    last, since = record["last_change"], record["held_since"]
    clean = now - last
    result = {"readmit": False, "record": record, "accepted": None}
    if blocking:
        result.update(state="blocked", message="%s held: %s; it waits for that to clear (a reboot, a GPU reset, or "
                      "a replacement), then for a soak with nothing new" % (name, ", ".join(blocking)))
    elif soak_s is None:
        result.update(state="never", message="%s held: automatic re-admission is off (a negative soak): a GPU reset "
                      "or a reboot clears its counters, and the next run starts its instance" % name)
    elif state == "new":
        result.update(state="new", message="%s held at %s: re-admitted by a run after %s if no new ECC error, Xid or "
                      "pending retirement comes (soak %d s)" % (name, _when(now), _when(now + soak_s), soak_s))
    elif state == "changed":
        result.update(state="changed", message="%s held: its counters moved (%s); the %d s soak starts again: "
                      "re-admitted by a run after %s if nothing new comes"
                      % (name, "; ".join(_changes(previous.get("counters"), record["counters"])), soak_s,
                         _when(now + soak_s)))
    elif clean < soak_s:
        result.update(state="soaking", message="%s held: clean for %d s of the %d s soak; re-admitted by a run after %s"
                      % (name, max(clean, 0), soak_s, _when(last + soak_s)))
    else:
        held = "it was held at %s (soak %d s)" % (_when(since), soak_s) if since == last else \
            "its counters last changed at %s (held since %s; soak %d s)" % (_when(last), _when(since), soak_s)
        result.update(readmit=True, state="readmit",
                      accepted={"accepted": record["counters"], "held_since": since, "readmitted_at": now},
                      message="%s %s: no new ECC error, Xid or pending retirement for %d s since %s"
                      % (name, "would be re-admitted (check mode, nothing changed)" if check_mode else "re-admitted",
                         clean, held))
    return result
