# -*- coding: utf-8 -*-
"""One llama-server over several GPUs of a host: where llama.cpp puts the model
on each card, and the speed each split mode allows.

The planner treats the GPUs of a split as one "group" (split_group) and plans it
with the same search as a single card: budget() and ceiling_for() here take a card
or a group (plan_memory knows one card only). docs/planning.md, "Two
GPUs, one model", explains each figure and what is measured.
Free of Ansible (unit-tested); Python 3.8-compatible."""
from __future__ import absolute_import, division, print_function

__metaclass__ = type

from ansible.module_utils.plan_memory import (
    PlanError, cache_bytes, card_budget, card_ceiling, compute_bytes, decode_ceiling, flash_attn_supported,
    kv_read_bytes, layer_weight_bytes)

SPLIT_MODES = ("layer", "tensor")

# Added to every token of a tensor split, per repeating layer: the cards exchange
# the layer's partial results. MEASURED on two H200s joined by NVLink (NV18),
# pinned llama.cpp, 32B-shaped Q4_K, one stream: 87 tok/s on one card, 110.5 split
# (issue 18's table): 1/110.5 - 1/(2 x 87) = 3.30 ms over 64 layers = 51.6 us.
# Without NVLink the exchange crosses PCIe: ASSUMED twice that (not measured).
TENSOR_SYNC_S_PER_LAYER = {"nvlink": 51.6e-6, "pcie": 103.2e-6}

# Architectures the pinned llama.cpp refuses to split by tensor
# (llm_arch_supports_sm_tensor in src/llama-arch.cpp at 0c1e57098bba).
NO_TENSOR_SPLIT_ARCHS = frozenset((
    "grok", "mpt", "plamo2", "minicpm3", "gemma3n", "mamba", "mamba2", "jamba", "falcon-h1", "olmo2", "olmoe",
    "deepseek2", "deepseek32", "hy_v4", "dots3note", "glm-dsa", "bitnet", "t5", "nemotron_h", "nemotron_h_moe",
    "granitehybrid", "minimax-01", "minimax-m2", "minimax-m3", "mistral4", "kimi-linear", "bailingmoe3", "kimi-k3",
    "glm5-next", "qwen3tts", "qwen4exp"))


def nvlink_joined(gpus):
    """Every pair of the GPUs are NVLink peers (nvidia_gpu_facts' nvlink_peers
    lists the PCI bus ids at the other end of each active link)."""
    for a in gpus:
        for b in gpus:
            if a is not b and str(b.get("pci_bus_id") or "").lower() not in [
                    str(p).lower() for p in a.get("nvlink_peers") or []]:
                return False
    return True


def split_group(gpus, mode):
    """The GPUs of one split instance as one planning unit: the fields plan_gpu
    reads (the first GPU's index and uuid name the instance; memory the sum, NUMA
    node the common one or none), plus `split` with the cards themselves."""
    if mode not in SPLIT_MODES:
        raise PlanError("a split mode is one of %s, got %r" % (", ".join(SPLIT_MODES), mode))
    if len(gpus) < 2:
        raise PlanError("a split needs at least two GPUs, got %d" % len(gpus))
    total = sum(int(g["memory_total_bytes"]) for g in gpus)
    fractions = [round(int(g["memory_total_bytes"]) / float(total), 4) for g in gpus]
    nodes = set(g.get("numa_node") for g in gpus)
    numa = nodes.pop() if len(nodes) == 1 else None
    # the threads run where every card is local, or anywhere when the cards sit on
    # different nodes
    affinities = set(tuple(sorted(g.get("cpu_affinity") or [])) for g in gpus)
    affinity = list(affinities.pop()) if len(affinities) == 1 else []
    capability = min((str(g.get("compute_capability") or "0.0") for g in gpus),
                     key=lambda cc: tuple(int(x) for x in cc.split(".")[:2]))
    names = sorted(set(str(g.get("name")) for g in gpus))
    reserved = [g.get("memory_reserved_bytes") for g in gpus]
    return {
        "index": gpus[0].get("index"),
        "uuid": gpus[0].get("uuid"),
        "name": "%d x %s" % (len(gpus), " + ".join(names)) if len(names) == 1 else " + ".join(
            str(g.get("name")) for g in gpus),
        "memory_total_bytes": total,
        "memory_reserved_bytes": None if None in reserved else sum(reserved),
        "memory_bandwidth_bytes_per_s": min(float(g["memory_bandwidth_bytes_per_s"]) for g in gpus),
        "compute_capability": capability,
        "numa_node": numa,
        "cpu_affinity": affinity,
        # threads: the first card's cores (the cards' lists differ when they sit on
        # different nodes, and then nothing is pinned)
        "thread_cpus": list(gpus[0].get("cpu_affinity") or []),
        "split": {"mode": mode, "gpus": list(gpus), "fractions": fractions, "nvlink": nvlink_joined(gpus)},
    }


def layer_owners(n_layer, fractions):
    """Which card holds each repeating layer and the output layer (the last
    entry), as llama.cpp's load_tensors assigns them: layer il of n_layer + 1 goes
    to the first card whose cumulative fraction exceeds il / (n_layer + 1)."""
    total = float(sum(fractions))
    cumulative, running = [], 0.0
    for f in fractions:
        running += f
        cumulative.append(running / total)
    owners = []
    for il in range(n_layer + 1):
        x = float(il) / (n_layer + 1)
        owners.append(next((i for i, c in enumerate(cumulative) if c > x), len(fractions) - 1))
    return owners


def _output_bytes(model):
    """What the output layer (output norm and projection) adds on the GPU."""
    return max(0, model["gpu_weight_bytes"] - model["n_layer"] * layer_weight_bytes(model))


def _layer_cache(model, ctx_size, parallel, cache_type, ubatch, first, last):
    """Cache bytes of the layers first..last-1."""
    head = cache_bytes(model, ctx_size, parallel, cache_type, ubatch, first)["total"]
    tail = cache_bytes(model, ctx_size, parallel, cache_type, ubatch, last)["total"] if last < model["n_layer"] else 0
    return head - tail


# Each card of a split keeps this much more headroom than one card alone: a public
# two-V100 layer split used up to 631 MiB more on its second card than this model
# predicted (benchmarks/v100_public.yml, sudoingx-2xv100-sxm2-16gb-...-layer), more
# than the 512 MiB headroom. Until splits are measured on the fleet's own cards.
SPLIT_CARD_MARGIN_BYTES = 640 * 1024 * 1024


def split_budget(model, group, policy, ctx_size, parallel, cache_type, n_gpu_layers=None):
    """budget() for a split group: every card's share in memory.per_gpu, the sums
    in the usual keys. Layer split: each card holds its layers and their KV, the
    last card the output layer and the logits; tensor split: each card holds its
    fraction of every weight and of the KV. Every card has its own CUDA context,
    driver reservation, headroom and a whole compute buffer (ASSUMED for a split:
    not measured, docs/planning.md)."""
    if n_gpu_layers is not None and n_gpu_layers <= model["n_layer"]:
        raise PlanError("a split instance keeps every layer on its GPUs (no partial offload)")
    split = group["split"]
    cards, fractions = split["gpus"], split["fractions"]
    ubatch = policy["ubatch_size"]
    per_gpu = []
    owners = layer_owners(model["n_layer"], fractions) if split["mode"] == "layer" else None
    per_layer = layer_weight_bytes(model)
    for i, card in enumerate(cards):
        # the card's fixed costs as a single-card budget has them (reserved, overhead,
        # headroom, compute), at the instance's context
        alone = card_budget(model, card, policy, ctx_size, parallel, cache_type)
        if owners is not None:
            layers = [il for il in range(model["n_layer"]) if owners[il] == i]
            holds_output = owners[-1] == i
            weights = len(layers) * per_layer + (_output_bytes(model) if holds_output else 0)
            kv = _layer_cache(model, ctx_size, parallel, cache_type, ubatch, layers[0], layers[-1] + 1) if layers else 0
            # a card without the output layer: no logits, only its own layers' attention
            compute = alone["compute_bytes"] if holds_output else compute_bytes(
                dict(model, n_vocab=0, layers=[model["layers"][il] for il in layers]), ubatch, ctx_size // parallel,
                flash_attn_supported(card), cache_type, parallel)
        else:
            weights = int(model["gpu_weight_bytes"] * fractions[i])
            kv = int(alone["kv_bytes"] * fractions[i])
            compute = alone["compute_bytes"]
        foreign = alone["foreign_bytes"]
        headroom = alone["headroom_bytes"] + SPLIT_CARD_MARGIN_BYTES
        total = weights + kv + compute + alone["overhead_bytes"] + headroom + foreign
        per_gpu.append({
            "gpu_index": card.get("index"), "weights_bytes": weights, "kv_bytes": kv, "compute_bytes": compute,
            "overhead_bytes": alone["overhead_bytes"], "headroom_bytes": headroom,
            "total_bytes": total, "gpu_total_bytes": int(card["memory_total_bytes"]),
            "overhead_driver_reserved_bytes": alone["overhead_driver_reserved_bytes"], "foreign_bytes": foreign,
            "predicted_used_bytes": total - headroom,
            "predicted_process_bytes": total - headroom - alone["overhead_driver_reserved_bytes"] - foreign,
            "free_bytes": int(card["memory_total_bytes"]) - total,
        })
    whole = card_budget(model, cards[0], policy, ctx_size, parallel, cache_type)
    out = dict((key, sum(g[key] for g in per_gpu)) for key in (
        "weights_bytes", "kv_bytes", "compute_bytes", "overhead_bytes", "headroom_bytes", "total_bytes",
        "gpu_total_bytes", "overhead_driver_reserved_bytes", "foreign_bytes", "predicted_used_bytes",
        "predicted_process_bytes", "free_bytes"))
    out.update({
        "kv_full_attention_bytes": whole["kv_full_attention_bytes"],
        "kv_sliding_window_bytes": whole["kv_sliding_window_bytes"],
        "recurrent_state_bytes": whole["recurrent_state_bytes"],
        "overhead_cuda_bytes": policy["overhead_bytes"] * len(cards),
        "host_weights_bytes": whole["host_weights_bytes"],
        "per_gpu": per_gpu,
    })
    return out


def budget(model, gpu, policy, ctx_size, parallel, cache_type, n_gpu_layers=None):
    """The memory breakdown of one configuration on a GPU or a split group (split_group)."""
    if gpu.get("split"):
        return split_budget(model, gpu, policy, ctx_size, parallel, cache_type, n_gpu_layers)
    return card_budget(model, gpu, policy, ctx_size, parallel, cache_type, n_gpu_layers)


def ceiling_for(model, gpu, policy, ctx_per_slot, cache_type, n_gpu_layers=None):
    """Decode ceiling (tok/s) of one stream on a GPU or a split group."""
    if gpu.get("split"):
        return split_ceiling(model, gpu, policy, ctx_per_slot, cache_type)
    return card_ceiling(model, gpu, policy, ctx_per_slot, cache_type, n_gpu_layers)


def split_fits(memory):
    return all(g["total_bytes"] <= g["gpu_total_bytes"] for g in memory["per_gpu"])


def split_ceiling(model, group, policy, ctx_per_slot, cache_type):
    """Single-stream ceiling (tok/s) of a split. Layer: the cards take turns, so
    the time is the sum of each card's bytes over its bandwidth; tensor: the cards
    read their shares at once, so the slowest share sets the time (the exchange
    between the cards is in tensor_sync_seconds, applied to the expected speed)."""
    split = group["split"]
    cards, fractions = split["gpus"], split["fractions"]
    fill = int(ctx_per_slot * policy["kv_fill"])
    whole = model["gpu_weight_bytes"] + kv_read_bytes(model, cache_type, fill)
    if split["mode"] == "tensor":
        seconds = max(whole * f / float(c["memory_bandwidth_bytes_per_s"]) for c, f in zip(cards, fractions))
        return 1.0 / seconds
    owners = layer_owners(model["n_layer"], fractions)
    per_layer = layer_weight_bytes(model)
    seconds = 0.0
    for i, card in enumerate(cards):
        layers = [il for il in range(model["n_layer"]) if owners[il] == i]
        read = len(layers) * per_layer + (_output_bytes(model) if owners[-1] == i else 0)
        if layers:
            read += kv_read_bytes(model, cache_type, fill, layers[0]) - (
                kv_read_bytes(model, cache_type, fill, layers[-1] + 1) if layers[-1] + 1 < model["n_layer"] else 0)
        seconds += 1.0 / decode_ceiling(float(card["memory_bandwidth_bytes_per_s"]), read) if read else 0.0
    return 1.0 / seconds


def tensor_sync_seconds(model, group):
    """Seconds a tensor split adds to every token: an exchange per repeating layer,
    over NVLink when every pair of cards are peers, else over PCIe."""
    split = group.get("split") or {}
    if split.get("mode") != "tensor":
        return 0.0
    link = "nvlink" if split.get("nvlink") else "pcie"
    return model["n_layer"] * TENSOR_SYNC_S_PER_LAYER[link]


def with_sync(expected, model, group):
    """A single-stream expected speed with the tensor split's exchange added."""
    sync = tensor_sync_seconds(model, group)
    if not sync or expected <= 0:
        return expected
    return 1.0 / (1.0 / expected + sync)


def tensor_split_supported(model):
    return str(model.get("architecture") or "").lower() not in NO_TENSOR_SPLIT_ARCHS
