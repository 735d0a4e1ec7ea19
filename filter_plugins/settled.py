# -*- coding: utf-8 -*-
"""`'gpu_servers' | llm_fleet_unsettled(groups)`: a play's host pattern without the
hosts playbooks/settled.yml found settled (nothing changed since the last complete
run). A stage playbook run alone has no such group: the pattern is left as it is,
with no warning about a group that does not exist. A group the run makes itself
(llm_fleet_canary, llm_fleet_after_canary) that no host joined, because every host
is settled, matches no host, silently."""
from __future__ import absolute_import, division, print_function

__metaclass__ = type

import os

import ansible.module_utils

_MODULE_UTILS = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "module_utils"))
if _MODULE_UTILS not in ansible.module_utils.__path__:
    ansible.module_utils.__path__.append(_MODULE_UTILS)

from ansible.module_utils.filter_input import guard_filters  # noqa: E402

SETTLED_GROUP = "llm_fleet_settled"


NO_HOST = "all:!all"


def llm_fleet_unsettled(pattern, groups, watched=None):
    """watched: a group whose hosts the play's hosts depend on (Prometheus on the GPU
    servers): when one of them is not settled, no host is left out."""
    if pattern.startswith("llm_fleet_") and not groups.get(pattern):
        return NO_HOST
    settled = set(groups.get(SETTLED_GROUP) or [])
    if not settled or (watched and set(groups.get(watched) or []) - settled):
        return pattern
    return "%s:!%s" % (pattern, SETTLED_GROUP)


class FilterModule(object):
    def filters(self):
        return guard_filters({"llm_fleet_unsettled": llm_fleet_unsettled},
                             {"llm_fleet_unsettled": {"pattern": "text", "groups": "dict", "watched": "text?"}})
