# -*- coding: utf-8 -*-
"""The controller's half of the fleet_settled module: the digest of what the
controller asks for of this host, handed to the module on the host.

The digest covers the project's code (site.yml, ansible.cfg, playbooks/, roles/,
library/, module_utils/, the plugins, dashboards/), every variable of the host
whose name starts with a role's name or llm_fleet_ (as defined: inventory,
group_vars, play vars, -e; templates are hashed unexpanded, so a change of what
they read shows in the host's fingerprint instead) and the files in `inputs` (the
fleet's calibration, which the planner reads). Variables that only steer a run
(RUN_ONLY) are left out: changing the canary count changes no host. Computed once,
when the run starts (playbooks/settled.yml), before any stage registers a variable
of its own; the stamp at the end records that digest (`digest` given: kept)."""
from __future__ import absolute_import, division, print_function

__metaclass__ = type

import os
import re

import ansible.module_utils
from ansible.plugins.action import ActionBase

_ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
_MODULE_UTILS = os.path.join(_ROOT, "module_utils")
if _MODULE_UTILS not in ansible.module_utils.__path__:
    ansible.module_utils.__path__.append(_MODULE_UTILS)

from ansible.module_utils.fleet_settled import code_files, inputs_digest  # noqa: E402

CODE = ("ansible.cfg", "site.yml", "playbooks", "roles", "library", "module_utils", "filter_plugins",
        "action_plugins", "dashboards")
# Variables that steer a run, not what a host holds.
RUN_ONLY = frozenset(("llm_fleet_canary", "llm_fleet_full_run", "llm_fleet_rollout_hosts", "llm_fleet_state",
                      "nvidia_stack_serial", "llama_server_serial"))


def variable_names(names, roles):
    """The names of `names` that belong to a stage: a role's prefix or llm_fleet_."""
    prefix = re.compile(r"^(%s)_" % "|".join(re.escape(r) for r in sorted(set(roles) | {"llm_fleet"})))
    return sorted(n for n in names if prefix.match(n) and n not in RUN_ONLY)


class ActionModule(ActionBase):
    TRANSFERS_FILES = False

    def run(self, tmp=None, task_vars=None):
        task_vars = task_vars or {}
        result = super(ActionModule, self).run(tmp, task_vars)
        args = dict(self._task.args)
        inputs = args.pop("inputs", []) or []
        if args.get("state", "check") in ("check", "record") and not args.get("digest"):
            roles = os.listdir(os.path.join(_ROOT, "roles"))
            # facts (a module's ansible_facts become variables too) are the host's, not asked for
            facts = task_vars.get("ansible_facts") or {}
            names = [n for n in variable_names(task_vars, roles) if n not in facts]
            variables = dict((name, task_vars[name]) for name in names)
            args["digest"] = inputs_digest(_ROOT, code_files(_ROOT, CODE), variables, inputs)
        result.update(self._execute_module(module_name="fleet_settled", module_args=args, task_vars=task_vars))
        # kept when the module could not start (a new host without the venv): its first run records it
        if args.get("digest"):
            result["digest"] = args["digest"]
        return result
