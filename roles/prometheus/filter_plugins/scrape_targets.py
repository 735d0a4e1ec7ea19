# -*- coding: utf-8 -*-
"""Which of the stages' Prometheus targets the monitoring host can reach."""
from __future__ import absolute_import, division, print_function

__metaclass__ = type

import ipaddress
import os

import ansible.module_utils

# Ansible ships module_utils/ to modules only; the controller maps the
# repository's copy, so a plugin and a module share one definition.
_MODULE_UTILS = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..",
                                              "module_utils"))
if _MODULE_UTILS not in ansible.module_utils.__path__:
    ansible.module_utils.__path__.append(_MODULE_UTILS)

from ansible.module_utils.filter_input import guard_filters  # noqa: E402


def _loopback(address):
    if address == "localhost":
        return True
    try:
        return ipaddress.ip_address(address).is_loopback
    except ValueError:
        return False  # a name: the network's to resolve


def llm_fleet_reachable_targets(groups, monitoring_host):
    """file_sd groups ([{targets, labels}]) as monitoring_host can scrape them:
    {"targets": the groups it keeps, "unreachable": [{host, job, target}]}. A loopback
    target is its own host's service only: kept for the monitoring host itself, left out
    for any other host (no other machine reaches another's 127.0.0.1)."""
    kept, unreachable = [], []
    for group in groups or []:
        labels = dict(group.get("labels") or {})
        targets = []
        for target in group.get("targets") or []:
            address = str(target).rpartition(":")[0].strip("[]")
            if _loopback(address) and labels.get("host") != monitoring_host:
                unreachable.append({"host": labels.get("host"), "job": labels.get("job"), "target": target})
            else:
                targets.append(target)
        if targets:
            kept.append({"targets": targets, "labels": labels})
    return {"targets": kept, "unreachable": unreachable}


_KINDS = {
    "llm_fleet_reachable_targets": {"groups": "dicts?"},
}


class FilterModule(object):
    def filters(self):
        return guard_filters({"llm_fleet_reachable_targets": llm_fleet_reachable_targets}, _KINDS)
