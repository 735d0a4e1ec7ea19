# -*- coding: utf-8 -*-
"""Several models on one host (issue 35), the planner's part: which GPU holds which
model, with every resident model's memory counted on its card.

Each model is an entry {name, models (its candidates, planner form), policy, gpus}:
gpus "every" puts an instance on every GPU of the host (the one-model plan of today),
a number n puts that many instances on the n GPUs with the most memory left. Every
instance on a card is its own llama-server process, so each pays its own CUDA context,
weights, KV cache and compute buffers; the card's driver reservation and the policy's
headroom are kept once.

The order of the list is the priority. Cards are assigned first, from each model's
minimum (its smallest candidate at its policy's minimum slots and context, in its most
compact cache type); a card whose minimums do not fit together refuses the model that
broke it, with the figures. Then each model is planned in order by plan_gpu, in what the
card has left after the models planned before it and the minimums of those after it: the
first model takes the best quantization and context the others leave room for, and each
later one at least its minimum. plan_gpu sees the others as memory another program holds
(memory_foreign_bytes), so its budget table and its refusal say the same as alone.

A model loaded on demand (load: on_demand) is served by llama-server's router on its
card, which starts a child llama-server for it when a request names it and, past
--models-max children, stops the least recently used one (tools/server/server-models.cpp
at the pinned commit: server_lru_sched, unload_lru). So such a model needs room only for
itself beside the resident models, not beside the other on-demand ones: cards are
assigned keeping the largest on-demand minimum free, each resident model is planned with
it kept, and each on-demand model is then planned alone in what all the resident models
took. --models-max is the largest number of them whose plans fit that room together (the
largest ones, since the router may hold any of them), at least one. The router itself
loads no model and opens no CUDA context (server.cpp: "router server never loads a model
and must not touch the GPU"); each child pays its own, as a resident instance does.

Not here yet: splitting one model over several GPUs next to others (a host of several
models plans one instance per card), and the roles that serve on-demand models (the
llm_model role refuses load: on_demand by name)."""
from __future__ import absolute_import, division, print_function

__metaclass__ = type

from ansible.module_utils.llama_plan import host_gpus, normalize_policy, plan_gpu, prompt_cache, slot_limits
from ansible.module_utils.plan_memory import GIB, PlanError, card_budget, card_room_bytes, flash_attn_supported
from ansible.module_utils.plan_speed import measured_overhead

MODEL_KEYS = ("name", "models", "policy", "gpus", "load")
LOADS = ("resident", "on_demand")


def minimum_process_bytes(models, gpu, policy):
    """(bytes, quant, cache type) of the least an instance of this model can hold on the
    card: its smallest candidate at min_parallel slots of min_ctx, in its most compact
    cache type (the process alone: no headroom, driver reservation or other program)."""
    best = None
    bare = dict(gpu, memory_foreign_bytes=0)
    # without flash attention llama.cpp takes no quantized V cache (plan_gpu plans f16 then)
    cache_types = policy["cache_types"] if flash_attn_supported(gpu) else ["f16"]
    for model in models:
        seq, _ = slot_limits(model, policy)
        slots = policy["min_parallel"]
        for cache_type in cache_types:
            need = card_budget(model, bare, policy, seq * slots, slots, cache_type)["predicted_process_bytes"]
            if best is None or need < best[0]:
                best = (need, model["quant"], cache_type)
    return best


def _shared(plan, index, gpu, others):
    """plan_gpu took the other models' instances for another program's memory: count
    them as what they are (memory.other_models_bytes) and keep the other-program warning
    for what other programs really hold."""
    own_foreign = int(gpu.get("memory_foreign_bytes") or 0)
    plan["memory"]["foreign_bytes"] = own_foreign
    plan["memory"]["other_models_bytes"] = others
    plan["warnings"] = [w for w in plan["warnings"] if not w.startswith("GPU %s: planned around" % index)]
    if own_foreign:
        plan["warnings"].append("GPU %s: planned around %.1f GiB that other processes hold (foreign-process policy "
                                "plan_around); the plan grows back when they exit and the model stage runs again"
                                % (index, own_foreign / GIB))


def _check(entries):
    if not isinstance(entries, list) or not entries:
        raise PlanError("models must be a non-empty list of {name, models, policy, gpus}, got %r" % (entries,))
    names = []
    for index, entry in enumerate(entries):
        if not isinstance(entry, dict):
            raise PlanError("models[%d] must be a mapping {name, models, policy, gpus}, got %r" % (index, entry))
        unknown = sorted(set(entry) - set(MODEL_KEYS))
        if unknown:
            raise PlanError("models[%d] has unknown key(s) %s; known keys: %s" % (index, ", ".join(unknown),
                                                                                 ", ".join(MODEL_KEYS)))
        name = entry.get("name")
        if not isinstance(name, str) or not name:
            raise PlanError("models[%d].name must be a non-empty text (it names the model's instances)" % index)
        if name in names:
            raise PlanError("models[%d].name %r is used twice: each model needs its own name" % (index, name))
        names.append(name)
        if not entry.get("models"):
            raise PlanError("model %s has no candidate to plan with" % name)
        gpus = entry.get("gpus", "every" if index == 0 else 1)
        if gpus != "every" and (isinstance(gpus, bool) or not isinstance(gpus, int) or gpus < 1):
            raise PlanError("model %s: gpus must be \"every\" or a whole number of GPUs >= 1, got %r" % (name, gpus))
        if entry.get("load", "resident") not in LOADS:
            raise PlanError("model %s: load must be resident (always loaded) or on_demand (loaded by the router when "
                            "a request names it), got %r" % (name, entry.get("load")))


def _resident_min(minimum, held, index):
    return sum(minimum[(n, index)][0] for n in held[index])


def _on_demand_min(minimum, on_demand, index):
    """What the on-demand models of a card keep free while the resident ones are
    placed: the largest minimum (the router holds at least one of them)."""
    return max([minimum[(n, index)][0] for n in on_demand[index]] or [0])


def _assign(cards, entries, room):
    """Step 1: which cards hold which model, from the minimums. Returns (held: {gpu
    index: resident names in priority order}, on_demand: {gpu index: on-demand names},
    minimum: {(name, gpu index): (bytes, quant, cache type)}); raises PlanError on the
    first model that does not fit beside those before."""
    minimum = {}
    held = dict((index, []) for index in cards)
    on_demand = dict((index, []) for index in cards)
    for entry in entries:
        name, lazy = entry["name"], entry["load"] == "on_demand"
        for index, gpu in cards.items():
            minimum[(name, index)] = minimum_process_bytes(entry["models"], gpu, entry["policy"])
        # an on-demand model needs room beside the resident ones only: the router unloads
        # the others first
        left = dict((index, room[index] - _resident_min(minimum, held, index)
                     - (0 if lazy else _on_demand_min(minimum, on_demand, index))) for index in cards)
        if entry["gpus"] == "every":
            chosen = sorted(cards)
        else:
            if entry["gpus"] > len(cards):
                raise PlanError("model %s wants %d GPUs; this host has %d" % (name, entry["gpus"], len(cards)))
            # an on-demand model goes where it and the other on-demand ones fit together best
            # (so their router unloads least); a resident one where most is left
            rank = dict((i, left[i] - (sum(minimum[(n, i)][0] for n in on_demand[i]) if lazy else 0)) for i in cards)
            chosen = sorted(sorted(cards, key=lambda i: (-rank[i], i))[:entry["gpus"]])
        short = [i for i in chosen if minimum[(name, i)][0] > left[i]]
        if short:
            raise PlanError("model %s%s fits on no GPU it needs beside the models before it: %s" % (
                name, " (loaded on demand: beside the resident models only)" if lazy else "", "; ".join(
                    "GPU %s (%.1f GiB for instances) holds %s, %.2f GiB left; %s needs at least %.2f GiB (%s, %d "
                    "slot(s) of %d tokens, %s KV)" % (
                        i, room[i] / GIB, ", ".join(
                            ["%s >= %.2f GiB" % (n, minimum[(n, i)][0] / GIB) for n in held[i]]
                            + ["%s on demand >= %.2f GiB" % (n, minimum[(n, i)][0] / GIB) for n in on_demand[i]])
                        or "nothing", left[i] / GIB, name, minimum[(name, i)][0] / GIB, minimum[(name, i)][1],
                        entry["policy"]["min_parallel"], entry["policy"]["min_ctx"], minimum[(name, i)][2])
                    for i in short)))
        for i in chosen:
            (on_demand if lazy else held)[i].append(name)
    return held, on_demand, minimum


def held_bytes(plan):
    """What a planned instance keeps of its card: its process, and a draft model's memory
    kept free while the draft does not serve (it may be tried on the next run)."""
    memory = plan["memory"]
    return memory["predicted_process_bytes"] + int(memory.get("draft_reserved_bytes") or 0)


def models_max(sizes, room):
    """The most on-demand children a router may hold at once: the largest k whose k
    largest plans fit the room together (the router may keep any k of them), at least
    one (each was planned to fit alone)."""
    total, count = 0, 0
    for size in sorted(sizes, reverse=True):
        if total + size > room:
            break
        total, count = total + size, count + 1
    return max(count, 1)


def _plan_one(entry, index, gpu, others, sharing, calibration, beside):
    seen = dict(gpu, memory_foreign_bytes=int(gpu.get("memory_foreign_bytes") or 0) + others)
    try:
        plan, lines = plan_gpu(seen, entry["models"], entry["policy"], sharing, calibration)
    except PlanError as err:
        raise PlanError("model %s on GPU %s, beside %s: %s" % (entry["name"], index, ", ".join(beside) or "nothing",
                                                              err))
    plan["model_name"] = entry["name"]
    if entry["load"] == "on_demand":  # a resident plan stays as it was recorded before
        plan["load"] = "on_demand"
    if others:
        _shared(plan, index, gpu, others)
    return plan, lines


def _plan_each(cards, entries, held, on_demand, minimum, calibration):
    """Step 2: each resident model planned in priority order on each of its cards, in
    what the models before it took and the minimums of those after it (and the largest
    on-demand one) leave; then each on-demand model alone, in what every resident model
    took. Returns ({(name, gpu index): plan}, [(name, plan, table lines)] in order)."""
    sharing = {}
    for index, gpu in cards.items():
        key = tuple(sorted(gpu.get("cpu_affinity") or []))
        sharing[key] = sharing.get(key, 0) + len(held[index]) + len(on_demand[index])
    planned, order = {}, []
    for entry in [e for e in entries if e["load"] == "resident"]:
        name = entry["name"]
        for index in sorted(i for i in cards if name in held[i]):
            gpu = cards[index]
            position = held[index].index(name)
            before, after = held[index][:position], held[index][position + 1:]
            lazy_min = _on_demand_min(minimum, on_demand, index)
            others = (sum(held_bytes(planned[(n, index)]) for n in before)
                      + sum(minimum[(n, index)][0] for n in after) + lazy_min)
            plan, lines = _plan_one(entry, index, gpu, others, sharing[tuple(sorted(gpu.get("cpu_affinity") or []))],
                                    calibration, before + after + on_demand[index])
            if others:
                plan["reason"] += (" Shares GPU %s with %s: %.2f GiB of the card counted as theirs (%s)." % (
                    index, ", ".join(before + after + on_demand[index]), others / GIB, "; ".join(
                        ["%s planned %.2f GiB" % (n, held_bytes(planned[(n, index)]) / GIB) for n in before]
                        + ["%s kept at least %.2f GiB" % (n, minimum[(n, index)][0] / GIB) for n in after]
                        + (["the largest model loaded on demand kept at least %.2f GiB" % (lazy_min / GIB)]
                           if lazy_min else []))))
            planned[(name, index)] = plan
            order.append((name, plan, lines))
    for entry in [e for e in entries if e["load"] == "on_demand"]:
        name = entry["name"]
        for index in sorted(i for i in cards if name in on_demand[i]):
            gpu = cards[index]
            others = sum(held_bytes(planned[(n, index)]) for n in held[index])
            plan, lines = _plan_one(entry, index, gpu, others, sharing[tuple(sorted(gpu.get("cpu_affinity") or []))],
                                    calibration, held[index])
            plan["reason"] += (" Loaded on demand on GPU %s by its router, alone in what the resident models leave%s." % (
                index, " (%s: %.2f GiB)" % (", ".join("%s %.2f GiB" % (n, held_bytes(planned[(n, index)]) / GIB)
                                                      for n in held[index]), others / GIB) if held[index] else ""))
            planned[(name, index)] = plan
            order.append((name, plan, lines))
    return planned, order


def _router(index, names, planned, room, residents):
    """A card's router: its on-demand models, --models-max and why."""
    left = room - residents
    sizes = [held_bytes(planned[(n, index)]) for n in names]
    most = models_max(sizes, left)
    largest = sorted(zip(sizes, names), key=lambda pair: -pair[0])[:most]
    why = "%d of %d on-demand model(s) fit together in the %.2f GiB the resident models leave (%s)" % (
        most, len(names), left / GIB, ", ".join("%s %.2f GiB" % (n, s / GIB) for s, n in largest))
    if most < len(names):
        why += "; loading another unloads the least recently used"
    return {"gpu_index": index, "models": list(names), "models_max": most, "room_bytes": left, "reason": why}


def place_models(gpus, entries, calibration=None, host_memory_bytes=None):
    """Plans for several models on a host's GPUs: {plans (each with model_name, an
    on-demand one with load), table, placement ({gpu index: [resident model names]}), routers ([{gpu_index,
    models (on-demand names), models_max, room_bytes, reason}]), warnings}. Raises PlanError naming the model
    that fits nowhere, with each card's figures. The card's headroom is the first
    model's policy's."""
    _check(entries)
    gpus = measured_overhead(host_gpus(gpus), calibration, [e.get("policy") for e in entries])
    entries = [dict(e, policy=normalize_policy(e.get("policy") or {}), load=e.get("load", "resident"),
                    gpus=e.get("gpus", "every" if i == 0 else 1)) for i, e in enumerate(entries)]
    cards = dict((gpu["index"], gpu) for gpu in gpus)
    room = dict((index, card_room_bytes(gpu, entries[0]["policy"])) for index, gpu in cards.items())
    held, on_demand, minimum = _assign(cards, entries, room)
    planned, order = _plan_each(cards, entries, held, on_demand, minimum, calibration)
    plans = [plan for _, plan, _ in order]
    table = ["%s: %s" % (name, line) for name, _, lines in order for line in lines]
    warnings = ["%s: %s" % (name, w) for name, plan, _ in order for w in plan["warnings"]]
    routers = []
    for index in sorted(cards):
        used = sum(held_bytes(planned[(n, index)]) for n in held[index])
        line = "GPU %s: %s; %.2f of %.2f GiB for instances used, %.2f GiB left" % (
            index, ", ".join("%s %s (%.2f GiB)" % (n, planned[(n, index)]["quant"],
                                                  held_bytes(planned[(n, index)]) / GIB)
                             for n in held[index]) or "no resident model", used / GIB, room[index] / GIB,
            (room[index] - used) / GIB)
        if on_demand[index]:
            routers.append(_router(index, on_demand[index], planned, room[index], used))
            line += "; on demand: %s; --models-max %d: %s" % (
                ", ".join("%s %s (%.2f GiB)" % (n, planned[(n, index)]["quant"], held_bytes(planned[(n, index)]) / GIB)
                          for n in on_demand[index]), routers[-1]["models_max"], routers[-1]["reason"])
        table.append(line)
    # the host's RAM for prompt caches: the resident processes and at most --models-max children per router
    at_once = sum(len(names) for names in held.values()) + sum(router["models_max"] for router in routers)
    table.append("host: %s" % prompt_cache(plans, entries[0]["policy"], host_memory_bytes, at_once))
    return {"plans": plans, "table": table, "placement": dict((i, list(held[i])) for i in sorted(cards)),
            "routers": routers, "warnings": warnings}
