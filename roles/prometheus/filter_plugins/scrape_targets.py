# -*- coding: utf-8 -*-
"""What the monitoring host scrapes: the targets the hosts' stage facts name, which of
them it can reach, and the fronts' split by the key each wants."""
from __future__ import absolute_import, division, print_function

__metaclass__ = type

import ipaddress
import os
import re

import ansible.module_utils

# Ansible ships module_utils/ to modules only; the controller maps the
# repository's copy, so a plugin and a module share one definition.
_MODULE_UTILS = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..",
                                              "module_utils"))
if _MODULE_UTILS not in ansible.module_utils.__path__:
    ansible.module_utils.__path__.append(_MODULE_UTILS)

from ansible.module_utils.filter_input import guard_filters  # noqa: E402

_PEM = re.compile(r"-----BEGIN CERTIFICATE-----.*?-----END CERTIFICATE-----", re.S)


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


FRONT_JOBS = ("llm-fleet-llama-server", "llm-fleet-frontend")


def llm_fleet_fact_targets(hosts, previous=None, previous_pem=""):
    """What to scrape, from what the hosts' stage facts name. hosts: one entry per host
    the delegated setup tried, {host, read (bool: its facts came back), why (when not),
    gpu (the gpu_exporter fact's prometheus_targets), fronts (the frontend fact's),
    certificate (the frontend fact's certificate_pem)}. Returns {"gpu": the GPU
    exporters' file_sd groups, "fronts": the fronts' (each instance's /metrics and
    HAProxy's), "certificates": the PEMs the fronts serve, "unread": [{host, why}],
    "carried": [hosts]}.
    previous (the file_sd groups the monitoring host has now) and previous_pem (the
    certificates it trusts now): a host whose facts could not be read keeps its groups and
    certificates, so Prometheus goes on scraping it and a down host's alerts fire, instead
    of the host dropping out of the monitoring. A host read without a stage's fact (not
    deployed there, or uninstalled) has no target of that stage."""
    gpu, fronts, certificates, unread, read = [], [], [], [], set()
    for entry in hosts or []:
        host = str(entry.get("host"))
        if not entry.get("read"):
            unread.append({"host": host, "why": str(entry.get("why") or "no facts")})
            continue
        read.add(host)
        gpu.extend(entry.get("gpu") or [])
        fronts.extend(entry.get("fronts") or [])
        certificates.extend(_PEM.findall(entry.get("certificate") or ""))
    carried = set()
    if unread:
        missing = set(u["host"] for u in unread)
        for group in previous or []:
            host = str((group.get("labels") or {}).get("host"))
            if host in missing and host not in read:
                carried.add(host)
                (gpu if (group.get("labels") or {}).get("job") == "llm-fleet-gpu" else fronts).append(group)
        certificates.extend(_PEM.findall(previous_pem or ""))
    unique = []
    for pem in certificates:
        if pem not in unique:
            unique.append(pem)
    return {"gpu": gpu, "fronts": fronts, "certificates": unique, "unread": unread, "carried": sorted(carried)}


def llm_fleet_front_groups(groups, keys, fallback=""):
    """The fronts' file_sd groups split by the key each front wants: keys is
    {inventory host: its key}, a host not in it wants fallback. Prometheus sends one
    bearer token per scrape configuration, so each distinct key gets its own (suffix ''
    for the first, then -2, -3 ...), in the order of the first host that wants it; the
    groups keep their own job label, so the series are the same whichever configuration
    scraped them. No front at all: one configuration with the fallback key, empty."""
    order, by_key = [], {}
    for group in sorted(groups or [], key=lambda g: str((g.get("labels") or {}).get("host"))):
        labels = group.get("labels") or {}
        if labels.get("job") not in FRONT_JOBS:
            continue
        key = (keys or {}).get(labels.get("host"), fallback) or ""
        if key not in by_key:
            order.append(key)
            by_key[key] = {job: [] for job in FRONT_JOBS}
        by_key[key][labels["job"]].append(group)
    if not order:
        order, by_key = [fallback or ""], {fallback or "": {job: [] for job in FRONT_JOBS}}
    return [{"suffix": "" if i == 0 else "-%d" % (i + 1), "key": key,
             "llama_servers": by_key[key]["llm-fleet-llama-server"], "frontends": by_key[key]["llm-fleet-frontend"]}
            for i, key in enumerate(order)]


_KINDS = {
    "llm_fleet_reachable_targets": {"groups": "dicts?"},
    "llm_fleet_front_groups": {"groups": "dicts?", "keys": "dict?", "fallback": "text?"},
    "llm_fleet_fact_targets": {"hosts": "dicts?", "previous": "dicts?", "previous_pem": "text?"},
}


class FilterModule(object):
    def filters(self):
        return guard_filters({"llm_fleet_reachable_targets": llm_fleet_reachable_targets,
                              "llm_fleet_front_groups": llm_fleet_front_groups,
                              "llm_fleet_fact_targets": llm_fleet_fact_targets}, _KINDS)
