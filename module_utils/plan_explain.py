# -*- coding: utf-8 -*-
"""The planner's words: the budget table of every candidate, the verdict on
each, why the chosen plan was chosen, and what to change when nothing fits."""
from __future__ import absolute_import, division, print_function

__metaclass__ = type

from ansible.module_utils.gguf_model import round_up
from ansible.module_utils.plan_memory import CTX_STEP, GIB, gib

# --- the plan --------------------------------------------------------------------

TABLE_HEAD = "  %-8s %5s %10s %15s %9s %9s %9s %10s %5s %8s %8s  %s" % (
    "quant", "bpw", "weights", "kv(min)", "compute", "overhead", "headroom", "total", "fits", "ceiling", "expect",
    "verdict")


def _row(e, verdict):
    m = e["memory"]
    g = lambda n: "%.2f" % (n / GIB)  # noqa: E731
    kv = "%s %s" % (g(m["kv_bytes"]), e["cache_type"] or e["smallest_type"])
    return "  %-8s %5.2f %10s %15s %9s %9s %9s %10s %5s %8.1f %8.1f  %s" % (
        e["model"]["quant"], e["model"]["bpw"], g(m["weights_bytes"]), kv, g(m["compute_bytes"]),
        g(m["overhead_bytes"]), g(m["headroom_bytes"]), g(m["total_bytes"]),
        "yes" if e["fits"] else "no", e["ceiling"], e["expected"], verdict)


def gpu_label(gpu):
    """'GPU 0' for one card, 'GPUs 0+1 (tensor split)' for a split group."""
    split = gpu.get("split")
    if not split:
        return "GPU %s" % gpu.get("index")
    return "GPUs %s (%s split)" % ("+".join(str(g.get("index")) for g in split["gpus"]), split["mode"])


def gpu_header(gpu):
    return "%s %s: %s, %.0f GB/s, compute capability %s" % (
        gpu_label(gpu), gpu.get("name", "?"), gib(int(gpu["memory_total_bytes"])),
        float(gpu["memory_bandwidth_bytes_per_s"]) / 1e9, gpu.get("compute_capability"))


def budget_table(gpu, evaluations, policy, verdicts):
    min_seq = round_up(policy["min_ctx"], CTX_STEP)
    lines = [gpu_header(gpu),
             "  (GiB; kv(min) = %d slot(s) x %d tokens; ceiling = the card's bandwidth over the bytes a stream reads "
             "per token with a slot %d%% full; expect = ceiling x the decode efficiency of the GPU family and weight "
             "type, tok/s)" % (policy["min_parallel"], min_seq, int(policy["kv_fill"] * 100)),
             TABLE_HEAD]
    for e in sorted(evaluations, key=lambda e: e["model"]["bpw"]):
        lines.append(_row(e, verdicts.get(id(e), "")))
    return lines


def candidate_verdicts(evaluations, chosen, floor, met_floor):
    out = {}
    for e in evaluations:
        m = e["model"]
        if e is chosen:
            out[id(e)] = "chosen"
        elif not e["fits"]:
            out[id(e)] = "needs %s, more than the card" % gib(e["memory"]["total_bytes"])
        elif e["expected"] < floor:
            out[id(e)] = "expected %.1f tok/s (ceiling %.1f) below the %.0f tok/s floor" % (
                e["expected"], e["ceiling"], floor)
        elif chosen is not None and met_floor and m["bpw"] <= chosen["model"]["bpw"]:
            out[id(e)] = "lower quality than %s" % chosen["model"]["quant"]
        elif chosen is not None:
            out[id(e)] = "slower than %s" % chosen["model"]["quant"]
        else:
            out[id(e)] = ""
    return out


def no_fit_message(gpu, evaluations, policy):
    smallest = min(evaluations, key=lambda e: e["model"]["weight_bytes"])
    m = smallest["memory"]
    table = budget_table(gpu, [smallest], policy, {id(smallest): "smallest candidate"})
    fixed = m["total_bytes"] - m["weights_bytes"]
    room = m["gpu_total_bytes"] - fixed
    min_seq = round_up(policy["min_ctx"], CTX_STEP)
    return (
        "No candidate fits %s (%s, %s) fully with %d slot(s) of %d tokens and %s KV. The smallest, %s, "
        "needs %s (%s more than the card%s):\n%s\n"
        "What to change: offer a smaller quantization (with this policy at most %s of weights on the GPU fit), "
        "lower policy.min_ctx (%d) or policy.min_parallel (%d), add a more compact type to policy.cache_types "
        "(%s), lower policy.headroom_bytes (%d), or set policy.allow_partial_offload: true to keep layers in "
        "host memory (much slower)."
        % (gpu_label(gpu), gpu.get("name", "?"), gib(m["gpu_total_bytes"]), policy["min_parallel"], min_seq,
           "/".join(policy["cache_types"]), smallest["model"]["quant"], gib(m["total_bytes"]),
           gib(m["total_bytes"] - m["gpu_total_bytes"]),
           ", and each card must hold its own share" if gpu.get("split") else "", "\n".join(table), gib(max(0, room)),
           policy["min_ctx"], policy["min_parallel"], ", ".join(policy["cache_types"]), policy["headroom_bytes"]))


def plan_reason(gpu, plan, chosen, evaluations, verdicts, config, policy, met, partial):
    model = chosen["model"]
    floor = policy["min_decode_tps"]
    bw = float(gpu["memory_bandwidth_bytes_per_s"])
    fitting = [e for e in evaluations if e["fits"]]
    parts = []
    if partial:
        parts.append("%s: no candidate fits this %s card fully, so %s runs with %d of %d layers on the GPU "
                     "(policy.allow_partial_offload), the best quality whose ceiling meets the floor or else the "
                     "fastest." % (model["quant"], gib(int(gpu["memory_total_bytes"])), model["quant"],
                                   chosen["n_gpu_layers"], model["n_layer"]))
    elif met:
        parts.append("%s: the best quality (%.2f bits/weight) of the %d candidate(s) that fit %s with %d "
                     "slot(s) of %d tokens, whose expected decode (%.1f tok/s = a ceiling of %.1f tok/s, %.0f GB/s / "
                     "%.2f GB read per token, x %.2f efficiency) meets the %.0f tok/s floor." % (
                         model["quant"], model["bpw"], len(fitting),
                         ("these %d cards (%s together)" % (len(gpu["split"]["gpus"]), gib(int(gpu["memory_total_bytes"])))
                          if gpu.get("split") else "this %s card" % gib(int(gpu["memory_total_bytes"]))),
                         policy["min_parallel"], round_up(policy["min_ctx"], CTX_STEP), chosen["expected"],
                         chosen["ceiling"], bw / 1e9, bw / chosen["ceiling"] / 1e9, chosen["efficiency"]["value"],
                         floor))
    else:
        parts.append("%s: no candidate that fits is expected to reach the %.0f tok/s floor, so the fastest that fits "
                     "(%.1f tok/s expected, ceiling %.1f)." % (model["quant"], floor, chosen["expected"],
                                                               chosen["ceiling"]))
    rejected = ["%s (%s)" % (e["model"]["quant"], verdicts[id(e)]) for e in
                sorted(evaluations, key=lambda e: -e["model"]["bpw"]) if e is not chosen]
    if rejected:
        parts.append("Not chosen: %s." % "; ".join(rejected))
    m = plan["memory"]
    kv_desc = "%s KV %s" % (config["cache_type"], gib(m["kv_bytes"]))
    if m["recurrent_state_bytes"] or m["kv_sliding_window_bytes"]:
        kv_desc += " (full attention %s, sliding window %s, recurrent state %s)" % (
            gib(m["kv_full_attention_bytes"]), gib(m["kv_sliding_window_bytes"]), gib(m["recurrent_state_bytes"]))
    ctx_text = "-c %d shared by %d slot(s) gives %d tokens each" % (
        config["ctx_size"], config["parallel"], config["ctx_per_slot"])
    if partial:
        parts.append("Context: the minimum, %s, %s." % (ctx_text, kv_desc))
    elif config.get("objective") == "throughput":
        others = "; ".join("%s: %d slot(s), %.1f tok/s" % (ct, p, agg) for ct, p, agg in config["options"]
                           if ct != config["cache_type"])
        parts.append("Context (objective throughput): %d slot(s), the most of at least %d tokens each that fit "
                     "(policy.max_parallel %d), with %s KV, whose expected aggregate is the highest%s; %s, the "
                     "memory left spent on context per slot." % (
                         config["parallel"], policy["min_ctx"], policy["max_parallel"], config["cache_type"],
                         (" (the other types: %s)" % others) if others else "", ctx_text))
    else:
        if config["parallel"] < policy["target_parallel"]:
            slots = "%d slot(s), fewer than the %d targeted: more would leave a slot under %d tokens" % (
                config["parallel"], policy["target_parallel"], policy["min_ctx"])
        else:
            slots = "%d slot(s), the target" % config["parallel"]
        if config["ctx_per_slot"] >= config["cap"]:
            if config["cap"] < policy["target_ctx"] // config["parallel"] // CTX_STEP * CTX_STEP:
                reach = "the model's trained context (%d) per slot" % model["n_ctx_train"]
            else:
                reach = "the %d-token target" % policy["target_ctx"]
            why_ct = ("f16 KV reaches it, so no quantized KV (which costs ~6% of single-stream speed)"
                      if config["cache_type"] == "f16" else
                      "%s is the first cache type in policy.cache_types that reaches it" % config["cache_type"])
            parts.append("Context: %s; %s reaches %s; %s." % (slots, ctx_text, reach, why_ct))
        else:
            others = ", ".join("%s %d/slot" % (ct, seq) for ct, seq in config["options"] if ct != config["cache_type"])
            parts.append("Context: %s; %s, short of the %d-token target: memory allows no more with %s KV%s." % (
                slots, ctx_text, policy["target_ctx"], config["cache_type"],
                (" (the other types: %s)" % others) if others else ""))
    if model["tied"]:
        embd = "the %s token-embedding table is kept in host memory, and a copy on the GPU serves as the tied " \
               "output layer" % gib(model["token_embd_bytes"])
    else:
        embd = "%s of token embeddings stay in host memory" % gib(model["token_embd_bytes"])
    draft = ""
    if m.get("draft_bytes"):
        draft = ", the draft model %s (weights %s, its KV %s, compute %s%s)" % (
            gib(m["draft_bytes"]), gib(m["draft_weights_bytes"]), gib(m["draft_kv_bytes"]),
            gib(m["draft_compute_bytes"]), "" if m.get("draft_loaded") else
            "; kept free while it does not serve, so the configuration stays the same when it is tried")
    parts.append("Memory: weights %s on the GPU (%s), %s, compute %s, "
                 "CUDA and driver overhead %s, headroom %s%s: %s of %s, %s free." % (
                     gib(m["weights_bytes"]), embd, kv_desc, gib(m["compute_bytes"]),
                     gib(m["overhead_bytes"]), gib(m["headroom_bytes"]), draft, gib(m["total_bytes"]),
                     gib(m["gpu_total_bytes"]), gib(m["free_bytes"])))
    eff = plan["decode_efficiency"]
    parts.append("Speed at %d%% slot fill: ceiling %.1f tok/s; expected %.1f tok/s single-stream (efficiency %.2f "
                 "for %s %s %s: %s%s) and %.1f tok/s over %d busy slot(s) (x %d^%.2f)." % (
                     int(policy["kv_fill"] * 100), plan["decode_ceiling_tps"], plan["expected_decode_tps"],
                     eff["value"], eff["gpu_family"], eff["quant_family"], eff["arch"], eff["source"],
                     "" if config["cache_type"] == "f16" else ", less ~6%% for the %s KV" % config["cache_type"],
                     plan["expected_aggregate_tps"], plan["parallel"], plan["parallel"], eff["aggregate_exponent"]))
    return " ".join(parts)


def plan_summary(plan):
    """The one line that sums up a GPU's plan, wherever a plan is shown or recorded:
    'GPU 0 Tesla V100-SXM2-32GB: Q4_K_M, -c 16384 -np 4 (4096 tokens/slot), f16 KV,
    23.2 GiB used + 0.5 GiB headroom of 31.7 GiB, expected 15.8 tok/s (ceiling 45.0)'."""
    memory = plan["memory"]
    ctx_per_slot = plan.get("ctx_per_slot") or plan["ctx_size"] // max(1, plan["parallel"])
    name = " %s" % plan["gpu_name"] if plan.get("gpu_name") else ""
    expected = plan.get("expected_decode_tps")
    speed = ("expected %.1f tok/s (ceiling %.1f)" % (expected, plan["decode_ceiling_tps"]) if expected is not None
             else "ceiling %.1f tok/s" % plan["decode_ceiling_tps"])
    indices = plan.get("gpu_indices") or [plan["gpu_index"]]
    label = ("GPUs %s (%s split)" % ("+".join(str(i) for i in indices), plan.get("split_mode"))
             if plan.get("split_mode", "none") != "none" else "GPU %s" % plan["gpu_index"])
    draft = ""
    if memory.get("draft_bytes"):
        draft = " (with a %.1f GiB draft model)" % (memory["draft_bytes"] / GIB) if memory.get("draft_loaded") else \
            " + %.1f GiB kept free for a draft model" % (memory["draft_bytes"] / GIB)
    return ("%s%s: %s, -c %d -np %d (%d tokens/slot), %s KV, %s%.1f GiB used%s + %.1f GiB headroom of %.1f GiB, "
            "%s"
            % (label, name, plan["quant"], plan["ctx_size"], plan["parallel"], ctx_per_slot,
               plan["cache_type_k"], "-ngl %d (partial), " % plan["n_gpu_layers"] if plan.get("partial_offload") else "",
               memory["predicted_used_bytes"] / GIB, draft, memory.get("headroom_bytes", 0) / GIB,
               memory["gpu_total_bytes"] / GIB, speed))

