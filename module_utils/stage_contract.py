# -*- coding: utf-8 -*-
"""The stage contract: what each stage hands to the next.

Every stage records what it left on a host as a local fact,
/etc/ansible/facts.d/llm_fleet_<stage>.fact (JSON; Ansible reads it back as
ansible_local.llm_fleet_<stage>). This file is the one definition of those
facts: where they live, their schema version, and the keys a later stage may
rely on. Writers go through fact_record (roles: the llm_fleet_fact filter),
readers through stage_fact (the llm_fleet_stage_fact filter), which refuses a
fact written under another schema instead of reading half of it.
Pure Python: filter plugins load it on the controller (docs/stages.md)."""
from __future__ import absolute_import, division, print_function

__metaclass__ = type

FACTS_DIR = "/etc/ansible/facts.d"
# Raise when a key below is renamed, removed or changes meaning; readers refuse
# facts of another version (rerunning the stage that wrote one rewrites it).
SCHEMA_VERSION = 1
# stage -> the keys every fact of that stage carries (besides schema_version,
# stage and summary, which all carry), in site.yml's order.
STAGE_KEYS = {
    "nvidia_stack": ("driver_version", "cuda_version", "nccl_version", "gpus", "compute_capabilities"),
    "gpu_tuning": ("settings",),
    # where Prometheus scrapes the GPUs (dcgm-exporter's names), who may, and the
    # prometheus stage's file_sd group for it
    "gpu_exporter": ("url", "allow", "prometheus_targets"),
    "llama_cpp": ("build_key", "commit", "backend", "cuda_version", "cuda_architectures", "targets", "install_dir",
                  "bin_dir", "server", "server_flags"),
    "model": ("plans",),
    "llama_server": ("host", "api_key", "api_key_file", "environment", "instances"),
    # the load balancer in front of the instances: where clients connect, and the runtime
    # socket and names the llama_server and nvidia_stack stages drain servers through;
    # what the prometheus stage scrapes there and the certificate it trusts for it; with
    # several models, the backend of each server (server_backends)
    "frontend": ("url", "tls", "socket", "backend", "servers", "server_backends", "drain_timeout",
                 "prometheus_targets", "certificate_pem"),
    "verify": ("status", "instances"),
    # on the monitoring host(s): where Prometheus answers and how many targets each job scrapes
    "prometheus": ("url", "jobs"),
}
COMMON_KEYS = ("schema_version", "stage", "summary")


class StageContractError(ValueError):
    pass


def _known(stage):
    if stage not in STAGE_KEYS:
        raise StageContractError("%r is not a stage of the contract (stages: %s)" % (stage, ", ".join(STAGE_KEYS)))


def fact_name(stage):
    """ansible_local's key for a stage's fact: llm_fleet_<stage>."""
    _known(stage)
    return "llm_fleet_%s" % stage


def fact_path(stage):
    return "%s/%s.fact" % (FACTS_DIR, fact_name(stage))


def fact_record(content, stage):
    """The fact a stage writes: content with the contract's schema version and
    the stage's name; raises when a key the contract promises is missing."""
    _known(stage)
    record = dict(content or {})
    record["schema_version"] = SCHEMA_VERSION
    record["stage"] = stage
    missing = [key for key in COMMON_KEYS + STAGE_KEYS[stage] if key not in record]
    if missing:
        raise StageContractError("the %s stage's fact lacks %s, which module_utils/stage_contract.py promises to the "
                                 "stages after it" % (stage, ", ".join(missing)))
    return record


def stage_fact(ansible_local, stage):
    """A stage's fact from ansible_local ({} when the stage has not run on the
    host); raises when it was written under another schema version."""
    fact = (ansible_local or {}).get(fact_name(stage))
    if not fact:
        return {}
    if not isinstance(fact, dict):
        raise StageContractError("%s is not a JSON object (%s): rerun the %s stage to rewrite it"
                                 % (fact_path(stage), type(fact).__name__, stage))
    version = fact.get("schema_version")
    if version != SCHEMA_VERSION:
        raise StageContractError(
            "%s has schema_version %s, this llm-fleet reads %d: it was written by %s llm-fleet. Rerun the %s stage "
            "(its playbook, or site.yml) with this version to rewrite it."
            % (fact_path(stage), version, SCHEMA_VERSION,
               "a newer" if isinstance(version, int) and version > SCHEMA_VERSION else "an older", stage))
    return fact
