# -*- coding: utf-8 -*-
"""The rollout's speed gate on one host (module_utils/speed_gate.py): which
instances changed since the verify stage last accepted them, and whether each
changed one serves at least min_ratio of the fleet's baseline."""
from __future__ import absolute_import, division, print_function

__metaclass__ = type

import os

import ansible.module_utils
from ansible.errors import AnsibleFilterError

# Ansible ships module_utils/ to modules only; the controller maps the
# repository's copy, so a plugin and a module share one definition.
_MODULE_UTILS = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..",
                                              "module_utils"))
if _MODULE_UTILS not in ansible.module_utils.__path__:
    ansible.module_utils.__path__.append(_MODULE_UTILS)

from ansible.module_utils.fleet_instances import instance_id  # noqa: E402
from ansible.module_utils.speculation import (  # noqa: E402
    check_min_gain, outdated_verdicts, plan_baseline, speculation_verdict)
from ansible.module_utils.speed_gate import baseline_for, check_min_ratio, config_key, judge  # noqa: E402
from ansible.module_utils.filter_input import guard_filters  # noqa: E402


def verify_speed_gate(record, served, accepted, calibration, min_ratio=0.9, enabled=True, spec_min_gain=0.05):
    """record: this run's verify record of the host; served: the llama_server
    fact's instances (each with the fingerprint of what it serves); accepted:
    {gpu index: fingerprint} the previous verify fact accepted; calibration: the
    fleet's calibration file's content (its `baselines`).

    Returns {enabled, gated, refused, verdicts, accepted, messages}: `accepted` is
    what the next run compares against (a refused instance keeps its old entry)."""
    try:
        check_min_ratio(min_ratio)
    except ValueError as err:
        raise AnsibleFilterError("verify_speed_gate_min_ratio: %s" % err)
    try:
        check_min_gain(spec_min_gain)
    except ValueError as err:
        raise AnsibleFilterError("verify_speculation_min_gain: %s" % err)
    build = ((record or {}).get("llama_cpp") or {}).get("build_key")
    # keyed by instance (several models share a GPU); the first model's is its GPU's index, as before
    fingerprints = dict((instance_id(i), i.get("fingerprint")) for i in served or [])
    previous = dict((str(k), v) for k, v in (accepted or {}).items())
    baselines = (calibration or {}).get("baselines") or []
    verdicts, now_accepted = [], {}
    for inst in (record or {}).get("instances") or []:
        index = instance_id(inst)
        fingerprint = fingerprints.get(index)
        gated = bool(enabled) and fingerprint is not None and previous.get(index) != fingerprint
        verdict = judge(inst, baselines, min_ratio, gated=gated, build=build)
        verdict["fingerprint"] = fingerprint
        verdicts.append(verdict)
        if verdict["verdict"] == "refuse":
            if index in previous:
                now_accepted[index] = previous[index]
        elif fingerprint is not None and (gated or not enabled or index in previous):
            now_accepted[index] = fingerprint
        elif index in previous:
            now_accepted[index] = previous[index]
    refused = [v for v in verdicts if v["verdict"] == "refuse"]
    # speculative decoding against its configuration's baseline without it (module_utils/speculation.py)
    speculation = []
    for inst, verdict in zip((record or {}).get("instances") or [], verdicts):
        plain = dict(inst, spec_type="none", n_predict=inst.get("n_predict"))
        base = dict((name, value) for name, (value, _) in baseline_for(
            plain, baselines, ("single_stream_tps", "all_slots_decode_tps", "ttft_at_slots_s")).items()) \
            or plan_baseline(plain, baselines)
        spec = speculation_verdict(dict(inst, all_slots_decode_tps=verdict["figures"].get("all_slots_decode_tps")),
                                   base, spec_min_gain, "GPU %s%s" % (inst.get("gpu_index"), " %s" % inst["model_name"]
                                                                     if inst.get("model_rank") else ""))
        if spec:
            # the build: a verdict from before an upgrade is tried again (module_utils/speculation.py)
            speculation.append(dict(spec, gpu_uuid=inst.get("gpu_uuid"), instance=instance_id(inst), build=build,
                                    config=config_key(plain), **({"draft": inst["draft_model"]}
                                                                 if inst.get("draft_model") else {})))
        # served without it under another prompt or build than its verdict: the next plan tries again
        speculation.extend(outdated_verdicts(inst, (calibration or {}).get("speculation"), (record or {}).get("host"),
                                             build))
    return {
        "enabled": bool(enabled),
        "min_ratio": float(min_ratio),
        "build": build,
        "gated": [v["gpu_index"] for v in verdicts if v["gated"]],
        "refused": [v["gpu_index"] for v in refused],
        "verdicts": verdicts,
        "accepted": now_accepted,
        "messages": [v["message"] for v in verdicts if v["gated"] or v["verdict"] == "no_baseline"]
        + [v["message"] for v in speculation],
        "speculation": speculation,
    }


_KINDS = {
    "verify_speed_gate": {"record": "dict?", "served": "dicts?", "accepted": "dict?", "calibration": "dict?"},
}


class FilterModule(object):
    def filters(self):
        return guard_filters({"verify_speed_gate": verify_speed_gate}, _KINDS)
