# -*- coding: utf-8 -*-
"""The rollout's canary (module_utils/speed_gate.py) as a filter:
`ansible_play_hosts_all | llm_fleet_canary_hosts(llm_fleet_canary)`, the hosts a
change of build, model or flags reaches first (playbooks/canary.yml)."""
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

from ansible.module_utils.speed_gate import canary_hosts  # noqa: E402
from ansible.module_utils.filter_input import guard_filters  # noqa: E402


def llm_fleet_canary_hosts(hosts, spec=1):
    try:
        return canary_hosts(hosts, spec)
    except ValueError as err:
        raise AnsibleFilterError(str(err))


_KINDS = {
    "llm_fleet_canary_hosts": {"hosts": "list?"},
}


class FilterModule(object):
    def filters(self):
        return guard_filters({"llm_fleet_canary_hosts": llm_fleet_canary_hosts}, _KINDS)
