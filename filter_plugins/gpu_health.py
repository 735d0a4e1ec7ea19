# -*- coding: utf-8 -*-
"""The GPU health gate (module_utils/gpu_health.py) as a filter: which plans may
start an instance, and which are held back because a GPU they use fails its check.

- `plans | llm_fleet_gpu_gate(gpus, foreign_policy, lost)`: {"serve": [plans],
  "held": [{"gpu_index", "gpu_uuids", "problems"}], "warnings": ["GPU 0: ..."]};
  gpus are nvidia_gpu_facts' nvidia_gpus (each with its `health`), lost its
  nvidia_gpus_lost: a plan on a GPU NVML no longer reads, while NVML counts a
  card it cannot reach, is held (check `gpu_lost`). Under the foreign-process
  policy plan_around, a card whose other processes now hold more than the plan
  left them (its memory's foreign_bytes) is held (check `foreign_process_grew`).
- `..., previous=fact)`: the llama_server stage's fact of the last run; the cards its
  `readmitted` lists are judged against the counts accepted then (the verify stage).
- `..., previous=fact, now=epoch, soak_s=N, check_mode=bool)`: the llama_server stage
  also watches the held cards (gpu_health.readmission): each held plan carries `cards`
  (per card of its own problems: gpu_uuid, gpu_index, counters, held_since,
  last_change), a card clean for the soak is re-admitted, and the answer adds
  "readmitted" (the accepted baselines in force: the fact's `readmitted`) and "notes"
  (per held or re-admitted card, what the run decided, for the operator).
"""
from __future__ import absolute_import, division, print_function

__metaclass__ = type

import os

import ansible.module_utils
from ansible.errors import AnsibleFilterError

# Ansible ships module_utils/ to modules only; the controller maps the
# repository's copy, so a plugin and a module share one definition.
_MODULE_UTILS = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "module_utils"))
if _MODULE_UTILS not in ansible.module_utils.__path__:
    ansible.module_utils.__path__.append(_MODULE_UTILS)

from ansible.module_utils.gpu_health import (PROCESS_CHECKS, SOAKED_CHECKS, assess, healthy,  # noqa: E402
                                            hold_record, plan_against_foreign, readmission, soak_seconds)
from ansible.module_utils.filter_input import guard_filters  # noqa: E402


def _lost_problem(uuid, lost):
    indices = ", ".join(str(g.get("index")) for g in lost)
    return {"check": "gpu_lost", "severity": "fail", "gpu_index": None, "gpu_uuid": uuid,
            "message": "NVML no longer reads this GPU and counts GPU %s that it cannot reach (%s): the card fell off "
                       "the bus (Xid 79) or died; reboot the host, and reseat or replace the card if it does not "
                       "come back" % (indices, lost[0].get("error") or "GPU is lost")}


def _planned_foreign(plan, position):
    """What the plan left other processes on its position-th card (memory.foreign_bytes)."""
    memory = plan.get("memory") or {}
    per_gpu = memory.get("per_gpu")
    if per_gpu:
        return (per_gpu[position] if position < len(per_gpu) else {}).get("foreign_bytes") or 0
    return memory.get("foreign_bytes") or 0


def _counts_fail(problems):
    """Problems of the card's own counters (not a process of another program)."""
    return [p for p in problems if p["check"] not in PROCESS_CHECKS]


def llm_fleet_gpu_gate(plans, gpus, foreign_policy="refuse", lost=None, previous=None, now=None, soak_s=None,
                       check_mode=False):
    previous = previous or {}
    readmitted = dict((r.get("gpu_uuid"), r) for r in previous.get("readmitted") or [])
    records = dict((c.get("gpu_uuid"), c) for h in previous.get("held") or [] for c in h.get("cards") or [])
    watch = now is not None
    if watch:
        try:
            soak = soak_seconds(soak_s, "llama_server_gpu_readmit_soak_s")
        except ValueError as err:
            raise AnsibleFilterError(str(err))
        now = int(float(now))  # the host's epoch seconds (ansible_facts.date_time.epoch is text)
    by_uuid = dict((g.get("uuid"), g) for g in gpus or [])
    try:
        verdicts = dict((uuid, assess(g.get("health"), foreign_policy, readmitted=readmitted.get(uuid)))
                        for uuid, g in by_uuid.items())
    except ValueError as err:
        raise AnsibleFilterError("llm_fleet_foreign_gpu_processes: %s" % err)
    serve, held, warnings, notes, kept = [], [], [], [], {}
    for plan in plans or []:
        uuids = plan.get("gpu_uuids") or [plan.get("gpu_uuid")]
        indices = plan.get("gpu_indices") or [plan.get("gpu_index")]
        problems, cards = [], []
        for position, uuid in enumerate(uuids):
            gpu = by_uuid.get(uuid)
            if gpu is None and not lost:
                continue
            index = gpu.get("index") if gpu else indices[position] if position < len(indices) else None
            health = gpu.get("health") if gpu else None
            own = [] if gpu else [_lost_problem(uuid, lost)]
            if foreign_policy == "plan_around" and gpu:
                grew = plan_against_foreign(health, _planned_foreign(plan, position))
                if grew:
                    own.append(dict(grew, gpu_index=index, gpu_uuid=uuid))
            verdict = verdicts.get(uuid, [])
            if uuid in readmitted and _counts_fail([p for p in verdict if p["severity"] == "fail"]):
                verdict = assess(health, foreign_policy)  # held again: the accepted counts no longer apply
            for problem in verdict:
                if problem["severity"] == "fail":
                    own.append(dict(problem, gpu_index=index, gpu_uuid=uuid))
                else:
                    warnings.append("GPU %s: %s" % (index, problem["message"]))
            if watch and _counts_fail(own):
                # a card held again after a re-admission: its counters against those it accepted then
                record = records.get(uuid) or (
                    {"counters": readmitted[uuid].get("accepted"), "held_since": now,
                     "last_change": readmitted[uuid].get("readmitted_at")} if uuid in readmitted else None)
                decision = readmission(record, health, now, soak, "GPU %s" % index, check_mode)
                note = decision["message"]
                if decision["readmit"]:
                    # what it accepted is reported from now on, not failed (assess's readmitted)
                    kept[uuid] = dict(decision["accepted"], gpu_uuid=uuid, gpu_index=index)
                    warnings.extend("GPU %s: %s" % (index, p["message"])
                                    for p in assess(health, "ignore", readmitted=kept[uuid])
                                    if p["check"] in ("ecc_uncorrectable_accepted", "xid_accepted"))
                    own = [p for p in own if p["check"] in PROCESS_CHECKS]
                    if own:
                        note += "; it stays held for: %s" % ", ".join(p["check"] for p in own)
                notes.append(note)
                if own:
                    cards.append(dict(decision["record"], gpu_uuid=uuid, gpu_index=index))
            elif watch and own:  # a process of another program only: held while it runs, nothing soaked
                cards.append(dict(hold_record(records.get(uuid), health, now), gpu_uuid=uuid, gpu_index=index))
            # an accepted baseline stays while the card passes with it and would not without it (its
            # counts stay until a reset or reboot); held again, or reset, the card drops it
            if uuid in readmitted and uuid not in kept and gpu and not _counts_fail(own) and any(
                    p["check"] in SOAKED_CHECKS and p["severity"] == "fail" for p in assess(health, "ignore")):
                kept[uuid] = readmitted[uuid]
            problems.extend(own)
        if problems and not healthy(problems):
            entry = {"gpu_index": plan.get("gpu_index"), "gpu_uuids": uuids, "problems": problems}
            held.append(dict(entry, cards=cards) if watch else entry)
        else:
            serve.append(plan)
    # several models share a card: the card is held once, and said once
    held = list(dict((tuple(h["gpu_uuids"]), h) for h in held).values())
    return {"serve": serve, "held": held, "warnings": _once(warnings), "notes": _once(notes),
            "readmitted": list(kept.values())}


def _once(lines):
    return [line for i, line in enumerate(lines) if line not in lines[:i]]


_KINDS = {
    "llm_fleet_gpu_gate": {"plans": "dicts?", "gpus": "dicts?", "lost": "dicts?", "previous": "dict?"},
}


class FilterModule(object):
    def filters(self):
        return guard_filters({"llm_fleet_gpu_gate": llm_fleet_gpu_gate}, _KINDS)
