#!/usr/bin/python
# -*- coding: utf-8 -*-
from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
---
module: unit_ready
short_description: Wait for a systemd unit's health URL, failing as soon as the unit's process exits
description:
  - Polls O(url) every O(delay) seconds until it answers 200, for at most O(timeout) seconds.
  - Reads the unit's state (C(systemctl show)) after every poll and fails at once when its main
    process has exited (the unit failed, stopped, or systemd restarted it since the wait began),
    naming how it ended (exit status or signal). Waiting for a process that crash-loops under
    C(Restart=on-failure) would only delay the rollback by the whole timeout.
  - Logic in module_utils/unit_ready.py.
options:
  url:
    description: The health URL (C(/health) of the instance).
    type: str
    required: true
  unit:
    description: The systemd unit that serves O(url).
    type: str
    required: true
  timeout:
    description: Seconds to wait for a 200 while the unit runs.
    type: int
    required: true
  delay:
    description: Seconds between polls.
    type: int
    default: 2
  hint:
    description: What the timeout's message tells to do (the variable that sets the timeout).
    type: str
    default: it may need longer
notes:
  - Supports check mode (it only reads).
author: llm-fleet
"""

EXAMPLES = r"""
- name: Wait for /health on GPU 0's instance
  unit_ready:
    url: http://127.0.0.1:8080/health
    unit: llama-server@0.service
    timeout: 300
    hint: "raise llama_server_health_timeout_base"
"""

RETURN = r"""
status:
  description: The health URL's last answer (200).
  type: int
  returned: success
waited:
  description: Seconds until it answered 200.
  type: float
  returned: success
polls:
  description: How many times it was asked.
  type: int
  returned: success
"""

import time

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.fleet_errors import fail
from ansible.module_utils.six.moves.urllib.error import HTTPError
from ansible.module_utils.unit_ready import PROPERTIES, NotReady, UnitStopped, parse_show, wait
from ansible.module_utils.urls import open_url


def _probe(url):
    """The URL's HTTP status; None when nothing answered (still starting)."""
    def probe():
        try:
            response = open_url(url, timeout=5, validate_certs=False, use_proxy=False)
            status = response.getcode()
            response.close()
            return status
        except HTTPError as err:
            return err.code
        except Exception:  # noqa: BLE001 - refused, reset or timed out: not up yet
            return None
    return probe


def main():
    module = AnsibleModule(
        argument_spec={
            "url": {"type": "str", "required": True},
            "unit": {"type": "str", "required": True},
            "timeout": {"type": "int", "required": True},
            "delay": {"type": "int", "default": 2},
            "hint": {"type": "str", "default": "it may need longer"},
        },
        supports_check_mode=True,
    )
    params = module.params
    systemctl = module.get_bin_path("systemctl", required=True)

    def read_state():
        rc, out, err = module.run_command([systemctl, "show", "--property=" + ",".join(PROPERTIES), params["unit"]])
        if rc != 0:
            fail(module, "systemctl show %s failed (rc %d): %s" % (params["unit"], rc, err.strip()))
        return parse_show(out)

    try:
        result = wait(params["unit"], params["url"], _probe(params["url"]), read_state, params["timeout"],
                      max(1, params["delay"]), time.monotonic, time.sleep, params["hint"])
    except (UnitStopped, NotReady) as err:
        fail(module, str(err))
    module.exit_json(changed=False, **result)


if __name__ == "__main__":
    main()
