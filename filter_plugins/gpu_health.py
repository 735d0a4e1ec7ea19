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

from ansible.module_utils.gpu_health import assess, healthy, plan_against_foreign  # noqa: E402


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


def llm_fleet_gpu_gate(plans, gpus, foreign_policy="refuse", lost=None):
    by_uuid = dict((g.get("uuid"), g) for g in gpus or [])
    try:
        verdicts = dict((uuid, assess(g.get("health"), foreign_policy)) for uuid, g in by_uuid.items())
    except ValueError as err:
        raise AnsibleFilterError("llama_server_foreign_gpu_processes: %s" % err)
    serve, held, warnings = [], [], []
    for plan in plans or []:
        uuids = plan.get("gpu_uuids") or [plan.get("gpu_uuid")]
        problems = []
        for position, uuid in enumerate(uuids):
            if uuid not in by_uuid and lost:
                problems.append(_lost_problem(uuid, lost))
                continue
            index = (by_uuid.get(uuid) or {}).get("index")
            if foreign_policy == "plan_around" and uuid in by_uuid:
                grew = plan_against_foreign(by_uuid[uuid].get("health"), _planned_foreign(plan, position))
                if grew:
                    problems.append(dict(grew, gpu_index=index, gpu_uuid=uuid))
            for problem in verdicts.get(uuid, []):
                entry = dict(problem, gpu_index=index, gpu_uuid=uuid)
                if problem["severity"] == "fail":
                    problems.append(entry)
                else:
                    warnings.append("GPU %s: %s" % (index, problem["message"]))
        if problems and not healthy(problems):
            held.append({"gpu_index": plan.get("gpu_index"), "gpu_uuids": uuids, "problems": problems})
        else:
            serve.append(plan)
    return {"serve": serve, "held": held, "warnings": warnings}


class FilterModule(object):
    def filters(self):
        return {"llm_fleet_gpu_gate": llm_fleet_gpu_gate}
