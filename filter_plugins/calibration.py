# -*- coding: utf-8 -*-
"""The fleet's decode calibration (module_utils/plan_speed.py) as filters: the
verify stage records what each GPU really decoded against its plan's ceiling in a
file the controller keeps (fleet_common_calibration_file); the model stage reads it
back so the next plan expects what this fleet measured, not a table's figure.

- `text | llm_fleet_calibration(path)`: the file's content (a lookup's text; empty
  when there is no file yet) as the dict llama_plan takes;
- `existing | llm_fleet_calibration_merge(records)`: the file's new content.
"""
from __future__ import absolute_import, division, print_function

__metaclass__ = type

import json
import os

import ansible.module_utils
from ansible.errors import AnsibleFilterError

# Ansible ships module_utils/ to modules only; the controller maps the
# repository's copy, so a plugin and a module share one definition.
_MODULE_UTILS = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "module_utils"))
if _MODULE_UTILS not in ansible.module_utils.__path__:
    ansible.module_utils.__path__.append(_MODULE_UTILS)

from ansible.module_utils.plan_speed import CALIBRATION_VERSION, merge_calibration  # noqa: E402
from ansible.module_utils.speculation import merge_verdicts  # noqa: E402
from ansible.module_utils.speed_gate import merge_baselines  # noqa: E402
from ansible.module_utils.filter_input import guard_filters  # noqa: E402


def llm_fleet_calibration(text, path="the calibration file"):
    """{} for no file or an empty one; the parsed content otherwise. A file that is
    not this format stops the run naming it (a plan must not silently ignore it)."""
    if isinstance(text, dict):
        content = text
    elif text is None or not str(text).strip():
        return {}
    else:
        try:
            content = json.loads(str(text))
        except ValueError as err:
            raise AnsibleFilterError("%s is not JSON (%s): fix it, or delete it to plan from the built-in table; "
                                     "the verify stage writes it again" % (path, err))
    if not isinstance(content, dict) or content.get("version") != CALIBRATION_VERSION \
            or not isinstance(content.get("records"), list):
        raise AnsibleFilterError("%s is not a calibration file of version %d ({version, records}): delete it to plan "
                                 "from the built-in table; the verify stage writes it again" % (path, CALIBRATION_VERSION))
    return content


def llm_fleet_calibration_merge(existing, records):
    return merge_calibration(existing or {}, records or [])


def llm_fleet_baselines_merge(calibration, gates, measured_at=None):
    """The calibration file's content with the speed baselines of the hosts whose
    measurement the rollout's speed gate accepted (gates: [{host, gate}]), each
    replacing that card's older entry for the same configuration."""
    out = dict(calibration or {})
    baselines = out.get("baselines") or []
    speculation = out.get("speculation") or []
    for item in gates or []:
        baselines = merge_baselines(baselines, item.get("host"), (item.get("gate") or {}).get("verdicts"), measured_at)
        # whether speculative decoding paid, which the next plan follows (module_utils/speculation.py)
        speculation = merge_verdicts(speculation, item.get("host"), (item.get("gate") or {}).get("speculation"),
                                     measured_at)
    if baselines:
        out["baselines"] = baselines
    if speculation:
        out["speculation"] = speculation
    return out


def llm_fleet_calibration_line(record):
    """One measured record, to read: 'gpu01 Tesla V100-SXM2-32GB (GPU-...) Q4_K_M dense:
    efficiency 0.6 (26.1 of 43.5 tok/s), aggregate exponent 0.58'."""
    return "%s %s (%s) %s %s: efficiency %s (%s of %s tok/s), aggregate exponent %s" % (
        record.get("host"), record.get("gpu_name"), record.get("gpu_uuid"), record.get("quant"), record.get("arch"),
        record.get("efficiency"), record.get("single_stream_tps"), record.get("decode_ceiling_tps"),
        record.get("aggregate_exponent") if record.get("aggregate_exponent") is not None else "-")


_KINDS = {
    "llm_fleet_calibration_merge": {"existing": "dict?", "records": "dicts?"},
    "llm_fleet_calibration_line": {"record": "dict"},
    "llm_fleet_baselines_merge": {"calibration": "dict?", "gates": "dicts?"},
}


class FilterModule(object):
    def filters(self):
        return guard_filters({
            "llm_fleet_calibration": llm_fleet_calibration,
            "llm_fleet_calibration_merge": llm_fleet_calibration_merge,
            "llm_fleet_calibration_line": llm_fleet_calibration_line,
            "llm_fleet_baselines_merge": llm_fleet_baselines_merge,
        }, _KINDS)
