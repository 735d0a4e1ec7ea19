#!/usr/bin/python
# -*- coding: utf-8 -*-
from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
---
module: fleet_settled
short_description: Compare a host with what the last complete site.yml run left, or record it
description:
  - C(state=check) compares the host with its stamp (O(stamp)) and returns C(settled=true)
    when nothing differs and every instance answers; C(reasons) says what differs otherwise.
  - C(state=record) writes the stamp at the end of a complete run; C(state=absent) removes it,
    before stages change the host.
  - The fingerprint (module_utils/fleet_settled.py) is the metadata of every path under
    O(paths), the state of the units O(units) match, the package database, the kernel, and
    through NVML each GPU's identity, persistence, power limit, the tuning O(tuning_config)
    wants, its health counters and the processes on it.
  - Runs with the project's venv Python (nvidia-ml-py); the action plugin of the same name
    adds the digest of what the controller asks for.
options:
  state:
    description: check, record or absent.
    type: str
    choices: [check, record, absent]
    default: check
  digest:
    description: What the controller asks for (the action plugin's digest); required by check and record.
    type: str
  stamp:
    description: Where the stamp lives.
    type: path
    default: /var/lib/llm-fleet/settled.json
  paths:
    description: Shell globs of the files and directories the stages manage.
    type: list
    elements: str
    default: []
  units:
    description: systemctl globs of the units the stages manage.
    type: list
    elements: str
    default: []
  health_urls:
    description: URLs that must answer 200 for the host to be settled (each instance's /health).
    type: list
    elements: str
    default: []
  held:
    description: GPUs the health gate holds; a host with one is never settled (its re-admission is judged every run).
    type: list
    elements: str
    default: []
  tuning_config:
    description: gpu_tuning's config; each GPU's settings are checked against it.
    type: path
    default: /etc/llm-fleet/gpu-tuning.json
  xid_journal:
    description: The GPU exporter's Xid journal.
    type: path
    default: /run/llm-fleet-gpu-exporter/xid-events.jsonl
  dpkg_status:
    description: The package database (an upgrade, an install or a hold changes it).
    type: path
    default: /var/lib/dpkg/status
requirements:
  - nvidia-ml-py (pynvml) on GPU hosts
notes:
  - Supports check mode; check only reads, record and absent change nothing in check mode.
author: llm-fleet
"""

EXAMPLES = r"""
- name: Compare the host with the last complete run
  fleet_settled:
    state: check
    paths: [/etc/llm-fleet, /opt/llm-fleet]
    units: ["llama-server@*"]
    health_urls: ["http://127.0.0.1:8080/health"]
  vars:
    ansible_python_interpreter: /opt/llm-fleet/venv/bin/python
  register: settled
"""

RETURN = r"""
settled:
  description: Nothing differs from the stamp and every URL answered (check only).
  type: bool
  returned: always
reasons:
  description: What differs, one line each (check only).
  type: list
  elements: str
  returned: always
stamp_written:
  description: When the stamp compared against was written (check), or now (record).
  type: str
  returned: always
"""

import datetime
import os

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.fleet_errors import fail
from ansible.module_utils.fleet_settled import (
    SettledError, differences, fingerprint, gpus, read_stamp, remove_stamp, write_stamp)
from ansible.module_utils.six.moves.urllib.request import urlopen

try:
    import pynvml
except ImportError:
    pynvml = None


def _wanted(path):
    """gpu_tuning's config by GPU UUID ({} when the host has none)."""
    from ansible.module_utils.gpu_tuning import TuningError, parse_config
    if not os.path.exists(path):
        return {}
    try:
        with open(path) as handle:
            config = parse_config(handle.read(), path)
    except (IOError, OSError, TuningError):
        return None
    return dict((gpu["uuid"], gpu) for gpu in config["gpus"])


def _gpu_state(params):
    """The GPUs' part of the fingerprint; None when the host has no NVML (a monitoring host)."""
    if pynvml is None:
        return None
    from ansible.module_utils.gpu_health import counters
    from ansible.module_utils.gpu_tuning import current_state, drift
    from ansible.module_utils.nvidia_gpu import NvmlUnavailable, read_host
    wanted = _wanted(params["tuning_config"])
    if wanted is None:
        return {"error": "%s cannot be read" % params["tuning_config"]}
    try:
        return gpus(pynvml, read_host, counters, current_state, drift, wanted, params["xid_journal"])
    except NvmlUnavailable as err:
        return {"error": "NVML cannot answer: %s" % err.message}


def _unanswered(urls):
    out = []
    for url in urls:
        try:
            response = urlopen(url, timeout=5)
            status = response.getcode()
            response.close()
        except Exception as err:  # noqa: BLE001 - any failure to answer is the answer
            out.append("%s does not answer (%s)" % (url, err))
            continue
        if status != 200:
            out.append("%s answered %s" % (url, status))
    return out


def main():
    module = AnsibleModule(
        argument_spec={
            "state": {"type": "str", "choices": ["check", "record", "absent"], "default": "check"},
            "digest": {"type": "str"},
            "stamp": {"type": "path", "default": "/var/lib/llm-fleet/settled.json"},
            "paths": {"type": "list", "elements": "str", "default": []},
            "units": {"type": "list", "elements": "str", "default": []},
            "health_urls": {"type": "list", "elements": "str", "default": []},
            "held": {"type": "list", "elements": "str", "default": []},
            "tuning_config": {"type": "path", "default": "/etc/llm-fleet/gpu-tuning.json"},
            "xid_journal": {"type": "path", "default": "/run/llm-fleet-gpu-exporter/xid-events.jsonl"},
            "dpkg_status": {"type": "path", "default": "/var/lib/dpkg/status"},
        },
        required_if=[("state", "check", ["digest"]), ("state", "record", ["digest"])],
        supports_check_mode=True,
    )
    params = module.params
    if params["state"] == "absent":
        removed = False if module.check_mode else remove_stamp(params["stamp"])
        module.exit_json(changed=False, settled=False, reasons=[], stamp_written=None, removed=removed)
    now = datetime.datetime.utcnow().strftime("%Y-%m-%dT%H:%M:%SZ")
    try:
        state = fingerprint(params["paths"], params["units"], params["dpkg_status"], _gpu_state(params))
    except SettledError as err:
        fail(module, str(err))
    if params["state"] == "record":
        if not module.check_mode:
            write_stamp(params["stamp"], params["digest"], state, now)
        module.exit_json(changed=False, settled=False, reasons=[], stamp_written=now)
    stamp = read_stamp(params["stamp"])
    reasons = differences(stamp, params["digest"], state)
    if isinstance(state["gpus"], dict) and state["gpus"].get("error"):
        reasons.append(state["gpus"]["error"])
    for held in params["held"]:
        reasons.append("%s is held by the health gate: its re-admission is judged every run" % held)
    if not reasons:
        reasons = _unanswered(params["health_urls"])
    module.exit_json(changed=False, settled=not reasons, reasons=reasons, digest=params["digest"],
                     stamp_written=(stamp or {}).get("written") if isinstance(stamp, dict) else None)


if __name__ == "__main__":
    main()
