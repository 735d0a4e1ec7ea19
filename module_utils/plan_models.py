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

Not here yet: models loaded on demand (llama-server's router mode and --models-max),
splitting one model over several GPUs next to others (a host of several models plans one
instance per card), and the roles that deploy such a plan."""
from __future__ import absolute_import, division, print_function

__metaclass__ = type

from ansible.module_utils.llama_plan import host_gpus, normalize_policy, plan_gpu, prompt_cache, slot_limits
from ansible.module_utils.plan_memory import GIB, PlanError, card_budget, card_room_bytes, flash_attn_supported
from ansible.module_utils.plan_speed import measured_overhead

MODEL_KEYS = ("name", "models", "policy", "gpus")


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


def _assign(cards, entries, room):
    """Step 1: which cards hold which model, from the minimums. Returns (held: {gpu
    index: names in priority order}, minimum: {(name, gpu index): (bytes, quant, cache
    type)}); raises PlanError on the first model that does not fit beside those before."""
    minimum = {}
    held = dict((index, []) for index in cards)
    for entry in entries:
        name = entry["name"]
        for index, gpu in cards.items():
            minimum[(name, index)] = minimum_process_bytes(entry["models"], gpu, entry["policy"])
        left = dict((index, room[index] - sum(minimum[(n, index)][0] for n in held[index])) for index in cards)
        if entry["gpus"] == "every":
            chosen = sorted(cards)
        else:
            if entry["gpus"] > len(cards):
                raise PlanError("model %s wants %d GPUs; this host has %d" % (name, entry["gpus"], len(cards)))
            chosen = sorted(sorted(cards, key=lambda i: (-left[i], i))[:entry["gpus"]])
        short = [i for i in chosen if minimum[(name, i)][0] > left[i]]
        if short:
            raise PlanError("model %s fits on no GPU it needs beside the models before it: %s" % (name, "; ".join(
                "GPU %s (%.1f GiB for instances) holds %s, %.2f GiB left; %s needs at least %.2f GiB (%s, %d slot(s) "
                "of %d tokens, %s KV)" % (
                    i, room[i] / GIB, ", ".join("%s >= %.2f GiB" % (n, minimum[(n, i)][0] / GIB) for n in held[i])
                    or "nothing", left[i] / GIB, name, minimum[(name, i)][0] / GIB, minimum[(name, i)][1],
                    entry["policy"]["min_parallel"], entry["policy"]["min_ctx"], minimum[(name, i)][2])
                for i in short)))
        for i in chosen:
            held[i].append(name)
    return held, minimum


def held_bytes(plan):
    """What a planned instance keeps of its card: its process, and a draft model's memory
    kept free while the draft does not serve (it may be tried on the next run)."""
    memory = plan["memory"]
    return memory["predicted_process_bytes"] + int(memory.get("draft_reserved_bytes") or 0)


def _plan_each(cards, entries, held, minimum, calibration):
    """Step 2: each model planned in priority order on each of its cards, in what the
    models before it took and the minimums of those after it leave. Returns
    ({(name, gpu index): plan}, [(name, plan, table lines)] in order)."""
    sharing = {}
    for index, gpu in cards.items():
        key = tuple(sorted(gpu.get("cpu_affinity") or []))
        sharing[key] = sharing.get(key, 0) + len(held[index])
    planned, order = {}, []
    for entry in entries:
        name = entry["name"]
        for index in sorted(i for i in cards if name in held[i]):
            gpu = cards[index]
            position = held[index].index(name)
            before, after = held[index][:position], held[index][position + 1:]
            others = (sum(held_bytes(planned[(n, index)]) for n in before)
                      + sum(minimum[(n, index)][0] for n in after))
            seen = dict(gpu, memory_foreign_bytes=int(gpu.get("memory_foreign_bytes") or 0) + others)
            try:
                plan, lines = plan_gpu(seen, entry["models"], entry["policy"],
                                       sharing[tuple(sorted(gpu.get("cpu_affinity") or []))], calibration)
            except PlanError as err:
                raise PlanError("model %s on GPU %s, beside %s: %s" % (name, index, ", ".join(before + after), err))
            plan["model_name"] = name
            if before or after:
                _shared(plan, index, gpu, others)
                plan["reason"] += (" Shares GPU %s with %s: %.2f GiB of the card counted as theirs (%s)." % (
                    index, ", ".join(before + after), others / GIB, "; ".join(
                        ["%s planned %.2f GiB" % (n, held_bytes(planned[(n, index)]) / GIB)
                         for n in before] + ["%s kept at least %.2f GiB" % (n, minimum[(n, index)][0] / GIB)
                                             for n in after])))
            planned[(name, index)] = plan
            order.append((name, plan, lines))
    return planned, order


def place_models(gpus, entries, calibration=None, host_memory_bytes=None):
    """Plans for several models on a host's GPUs: {plans (each with model_name), table,
    placement ({gpu index: [model names]}), warnings}. Raises PlanError naming the model
    that fits nowhere, with each card's figures. The card's headroom is the first
    model's policy's."""
    _check(entries)
    gpus = measured_overhead(host_gpus(gpus), calibration, [e.get("policy") for e in entries])
    entries = [dict(e, policy=normalize_policy(e.get("policy") or {}),
                    gpus=e.get("gpus", "every" if i == 0 else 1)) for i, e in enumerate(entries)]
    cards = dict((gpu["index"], gpu) for gpu in gpus)
    room = dict((index, card_room_bytes(gpu, entries[0]["policy"])) for index, gpu in cards.items())
    held, minimum = _assign(cards, entries, room)
    planned, order = _plan_each(cards, entries, held, minimum, calibration)
    plans = [plan for _, plan, _ in order]
    table = ["%s: %s" % (name, line) for name, _, lines in order for line in lines]
    warnings = ["%s: %s" % (name, w) for name, plan, _ in order for w in plan["warnings"]]
    for index in sorted(cards):
        used = sum(held_bytes(planned[(n, index)]) for n in held[index])
        table.append("GPU %s: %s; %.2f of %.2f GiB for instances used, %.2f GiB left" % (
            index, ", ".join("%s %s (%.2f GiB)" % (n, planned[(n, index)]["quant"],
                                                  held_bytes(planned[(n, index)]) / GIB)
                             for n in held[index]) or "no model", used / GIB, room[index] / GIB,
            (room[index] - used) / GIB))
    table.append("host: %s" % prompt_cache(plans, entries[0]["policy"], host_memory_bytes))
    return {"plans": plans, "table": table, "placement": dict((i, list(held[i])) for i in sorted(cards)),
            "warnings": warnings}
