# -*- coding: utf-8 -*-
"""The stage contract (module_utils/stage_contract.py) as filters, for every role:

- `'llama_cpp' | llm_fleet_fact_path`: /etc/ansible/facts.d/llm_fleet_llama_cpp.fact
- `record | llm_fleet_fact('llama_cpp')`: the fact to write (schema version, stage, promised keys checked)
- `ansible_facts['ansible_local'] | default({}) | llm_fleet_stage_fact('llama_cpp')`: the fact a stage
  reads ({} when absent; an error naming the fix when written under another schema)
"""
from __future__ import absolute_import, division, print_function

__metaclass__ = type

import functools
import os

import ansible.module_utils
from ansible.errors import AnsibleFilterError

# Ansible ships module_utils/ to modules only; the controller maps the
# repository's copy, so a plugin and a module share one definition.
_MODULE_UTILS = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "module_utils"))
if _MODULE_UTILS not in ansible.module_utils.__path__:
    ansible.module_utils.__path__.append(_MODULE_UTILS)

from ansible.module_utils import stage_contract  # noqa: E402
from ansible.module_utils.filter_input import guard_filters  # noqa: E402


def _filter(function):
    @functools.wraps(function)
    def run(*args):
        try:
            return function(*args)
        except stage_contract.StageContractError as err:
            raise AnsibleFilterError(str(err))
    return run


_KINDS = {
    "llm_fleet_fact_path": {"stage": "text"},
    "llm_fleet_fact": {"content": "dict", "stage": "text"},
    "llm_fleet_stage_fact": {"ansible_local": "dict?", "stage": "text"},
}


class FilterModule(object):
    def filters(self):
        return guard_filters({
            "llm_fleet_fact_path": _filter(stage_contract.fact_path),
            "llm_fleet_fact": _filter(stage_contract.fact_record),
            "llm_fleet_stage_fact": _filter(stage_contract.stage_fact),
        }, _KINDS)
