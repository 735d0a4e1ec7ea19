# -*- coding: utf-8 -*-
"""What the rollout's speed gate needs from an instance's drop-in and fact when it
switches instances back to the plan they served before (tasks/rollback.yml)."""
from __future__ import absolute_import, division, print_function

__metaclass__ = type

import os
import re

import ansible.module_utils
from ansible.errors import AnsibleFilterError

# Ansible ships module_utils/ to modules only; the controller maps the
# repository's copy, so a plugin and a module share one definition.
_MODULE_UTILS = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..",
                                              "module_utils"))
if _MODULE_UTILS not in ansible.module_utils.__path__:
    ansible.module_utils.__path__.append(_MODULE_UTILS)

from ansible.module_utils.filter_input import guard_filters  # noqa: E402
from ansible.module_utils.fleet_instances import instance_id  # noqa: E402


def llama_server_dropin_build(text):
    """The llama.cpp build key a drop-in runs: its '# build KEY' line (templates/plan.conf.j2)."""
    match = re.search(r"^# build (\S+)\s*$", str(text or ""), re.MULTILINE)
    if not match:
        raise AnsibleFilterError("the drop-in names no build ('# build KEY' line): it was not written by this role")
    return match.group(1)


def llama_server_record_rollback(fact, rolled_back, fingerprints=None):
    """The llama_server fact with the switched-back instances' build and fingerprint,
    and its summary saying so."""
    fact = dict(fact or {})
    # an instance is named by its id (several models share a GPU); a record of before by its GPU
    back = dict((instance_id(r), r) for r in rolled_back or [])
    instances = []
    for entry in fact.get("instances") or []:
        entry = dict(entry)
        if instance_id(entry) in back:
            refused = entry.get("build_key")
            entry["build_key"] = back[instance_id(entry)]["build_key"]
            entry["fingerprint"] = (fingerprints or {}).get(instance_id(entry), entry.get("fingerprint"))
            entry["rolled_back_from"] = refused
        instances.append(entry)
    fact["instances"] = instances
    notes = ["GPU %s%s switched back to build %s" % (
        r["gpu_index"], " (%s)" % r["model_name"] if r.get("model_rank") else "", r["build_key"])
        for r in rolled_back or []]
    fact["summary"] = "%s; %s (the rollout's speed gate refused the change)" % (
        str(fact.get("summary") or "").rstrip(), ", ".join(notes)) if notes else fact.get("summary")
    return fact


_KINDS = {
    "llama_server_record_rollback": {"fact": "dict?", "rolled_back": "dicts?", "fingerprints": "dict?"},
}


class FilterModule(object):
    def filters(self):
        return guard_filters({
            "llama_server_dropin_build": llama_server_dropin_build,
            "llama_server_record_rollback": llama_server_record_rollback,
        }, _KINDS)
