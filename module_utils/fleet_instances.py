# -*- coding: utf-8 -*-
"""How a llama-server instance is named and where it listens, in one place.

One instance per model per GPU (docs/planning.md, several models): the first model's
instance on GPU N is llama-server@N on base_port + N, what one model has always been;
the k-th model's (from 0) is llama-server@N-<name> on base_port + k x step + N. A plan,
the llama_server fact's instance record and verify's record all carry `instance`; a
record written before several models were planned has only its GPU's index.

Models loaded on demand (load: on_demand) have no instance of their own: each card's
llama-server router, llama-server@N-router, starts them. It listens on the port its
first on-demand model's instance would have (base_port + rank x step + N), which no
instance uses; the front reaches each of its models there by name."""
from __future__ import absolute_import, division, print_function

__metaclass__ = type


def instance_id(entry, name=None, rank=None):
    """The systemd instance of a plan or instance record; with name and rank, the one
    the model stage gives a new plan."""
    if rank is not None:
        return "%d" % int(entry["gpu_index"]) if int(rank) == 0 else "%d-%s" % (int(entry["gpu_index"]), name)
    instance = entry.get("instance")
    return str(instance) if instance not in (None, "") else "%d" % int(entry["gpu_index"])


def instance_port(entry, base_port, model_port_step=100):
    """The port of a plan's instance."""
    return int(base_port) + int(model_port_step) * int(entry.get("model_rank") or 0) + int(entry["gpu_index"])


ROUTER_SUFFIX = "router"


def router_id(gpu_index):
    """The systemd instance of a card's router for its on-demand models."""
    return "%d-%s" % (int(gpu_index), ROUTER_SUFFIX)
