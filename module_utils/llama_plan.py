# -*- coding: utf-8 -*-
"""Plan llama-server per GPU: which quantization, context, slots and KV cache
type fit a card, from the card's memory and bandwidth and the model's metadata.

The policy and the search live here; the model's shape in plan_model.py, one
card's memory arithmetic in plan_memory.py, a split's in plan_split.py, the
explanations in plan_explain.py: import each name from its home. docs/planning.md explains
every figure. Free of Ansible (unit-tested); Python 3.8-compatible."""
from __future__ import absolute_import, division, print_function

__metaclass__ = type

from ansible.module_utils.gguf_model import KV_CACHE_TYPES, round_up
from ansible.module_utils.input_schema import LLAMA_MAX_SEQ, SchemaError, check_gpus, number
from ansible.module_utils.llama_flags import SERVER, plan_argv, run_flag
from ansible.module_utils.speculation import SPEC_TYPES, plan_speculation
from ansible.module_utils.plan_explain import (
    budget_table, candidate_verdicts, no_fit_message, plan_reason, plan_summary)
from ansible.module_utils.plan_memory import (
    CTX_STEP, CUDA_OVERHEAD_BYTES, DEFAULT_BATCH, DEFAULT_HEADROOM_BYTES, DEFAULT_UBATCH, GIB, HOST_MEMORY_BANDWIDTH,
    KV_FILL_FRACTION, MIB, PlanError, driver_reserved_bytes, fits, flash_attn_supported, gib)
from ansible.module_utils.plan_speed import (
    aggregate_exponent, efficiency_for, expected_aggregate, expected_decode, expected_prefill, gpu_family,
    measured_overhead)
from ansible.module_utils.plan_split import (
    SPLIT_CARD_MARGIN_BYTES, SPLIT_MODES, budget, ceiling_for, split_group, tensor_split_supported, with_sync)

# GPU families a split plan was measured on (two H200s, issue 18); elsewhere it says so.
SPLIT_MEASURED_FAMILIES = ("hopper",)

DEFAULT_POLICY = {
    "min_ctx": 4096,               # tokens per slot, at least
    "target_ctx": 32768,           # tokens in total (the -c value aimed for, shared by the slots)
    "min_parallel": 1,
    "target_parallel": 4,
    # latency: target_parallel slots sharing target_ctx, the speed of each stream
    # first; throughput: as many slots of min_ctx as fit (up to max_parallel), the KV
    # type with the most expected aggregate, the rest of the memory as context
    "objective": "latency",
    "max_parallel": 16,
    "cache_types": ["f16", "q8_0"],  # in order of preference
    "headroom_bytes": DEFAULT_HEADROOM_BYTES,
    # expected single-stream decode (ceiling x efficiency), tok/s: docs/planning.md
    "min_decode_tps": 25.0,
    "allow_partial_offload": False,
    "overhead_bytes": CUDA_OVERHEAD_BYTES,
    "reserved_bytes": None,        # None: driver_reserved_bytes() of the card
    "ubatch_size": DEFAULT_UBATCH,
    "batch_size": DEFAULT_BATCH,
    "threads": None,               # None: physical cores of the GPU's CPU affinity
    "kv_fill": KV_FILL_FRACTION,
    "host_memory_bandwidth_bytes_per_s": HOST_MEMORY_BANDWIDTH,
    # a host with two or more GPUs may run one instance over all of them when that
    # serves a better quant or meets the floor one card misses (docs/planning.md)
    "allow_split": True,
    # a tensor split is EXPERIMENTAL at the pinned llama.cpp: only where the policy lists it
    "split_modes": ["layer"],
    # one instance over all the GPUs whenever a split fits, even when each card alone
    # serves the same quant: one endpoint, the cards' KV together (a longer context),
    # a faster stream with tensor split; at about half the aggregate of two instances
    "prefer_split": False,
    # the sampler chain in the model's graph on the GPU (llama-server --backend-sampling,
    # experimental at the pinned llama.cpp): auto is on for the throughput objective, where
    # it was measured (+13% aggregate at 16 streams, one stream unchanged; docs/planning.md)
    "backend_sampling": "auto",
    # llama-server's prompt cache in host RAM (--cache-ram, MiB per instance; llama.cpp's
    # default 8192, 0 turns it off): a conversation's earlier turns are restored from it,
    # not prefilled again. At most prompt_cache_host_share of the host's RAM for all of the
    # host's instances together (docs/planning.md, "The prompt cache").
    "prompt_cache_mib": 8192,
    "prompt_cache_host_share": 0.25,
    # how much of a slot's cached prompt a request must share to be given that slot
    # (--slot-prompt-similarity, llama.cpp's default 0.1; 0 turns the preference off)
    "slot_prompt_similarity": 0.1,
    # speculative decoding (llama-server --spec-type): none, ngram-mod (drafts from the
    # context's n-grams, no extra weights) or draft-simple (a small draft model of the same
    # vocabulary, -md: its weights, KV and compute budgeted on the card); served only where
    # verify measured that it pays (module_utils/speculation.py)
    "speculative": "none",
}

# whole-number keys and their upper bounds: slots are sequences, and llama.cpp refuses
# more than LLAMA_MAX_SEQ (the bound also keeps every search short); contexts within
# what a model's trained context can be; batches within what a card can compute
_INT_KEYS = {"min_ctx": 1 << 26, "target_ctx": 1 << 26, "min_parallel": LLAMA_MAX_SEQ,
             "target_parallel": LLAMA_MAX_SEQ, "max_parallel": LLAMA_MAX_SEQ, "ubatch_size": 1 << 16,
             "batch_size": 1 << 20}

OBJECTIVES = ("latency", "throughput")

_BYTES_KEYS = ("headroom_bytes", "overhead_bytes", "reserved_bytes")


def _bool(value, name):
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in ("1", "true", "yes", "on", "y"):
        return True
    if text in ("0", "false", "no", "off", "n", ""):
        return False
    raise PlanError("policy.%s must be true or false, got %r" % (name, value))


def _int(value, name, minimum, maximum=1 << 50):
    try:
        if isinstance(value, bool):
            raise ValueError
        number = int(value)
        if isinstance(value, float) and value != number:
            raise ValueError
    except (TypeError, ValueError, OverflowError):
        raise PlanError("policy.%s must be a whole number, got %r" % (name, value))
    if number < minimum:
        raise PlanError("policy.%s must be at least %d, got %d" % (name, minimum, number))
    if number > maximum:
        raise PlanError("policy.%s must be at most %d, got %d%s" % (
            name, maximum, number, " (llama.cpp's LLAMA_MAX_SEQ)" if maximum == LLAMA_MAX_SEQ else ""))
    return number


def normalize_policy(policy):
    """The policy with defaults filled in, checked; raises PlanError naming the bad key."""
    policy = dict(policy or {})
    unknown = sorted(set(policy) - set(DEFAULT_POLICY))
    if unknown:
        raise PlanError("unknown policy key(s) %s; known keys: %s" % (", ".join(unknown), ", ".join(sorted(DEFAULT_POLICY))))
    out = dict(DEFAULT_POLICY)
    out.update(dict((k, v) for k, v in policy.items() if v is not None))
    for key, maximum in _INT_KEYS.items():
        out[key] = _int(out[key], key, 1, maximum)
    for key in _BYTES_KEYS:
        if out[key] is not None:
            out[key] = _int(out[key], key, 0)
    if out["threads"] is not None:
        out["threads"] = _int(out["threads"], "threads", 1)
    out["prompt_cache_mib"] = _int(out["prompt_cache_mib"], "prompt_cache_mib", 0, 1 << 20)
    try:
        out["min_decode_tps"] = number("policy.min_decode_tps", out["min_decode_tps"], 0, 1e6, "tokens a second")
        out["kv_fill"] = number("policy.kv_fill", out["kv_fill"], 0, 1, "the share of a slot's cache a stream "
                                "reads, in (0, 1]", lo_open=True)
        out["host_memory_bandwidth_bytes_per_s"] = number(
            "policy.host_memory_bandwidth_bytes_per_s", out["host_memory_bandwidth_bytes_per_s"], 0, 1e14,
            "bytes a second", lo_open=True)
        out["prompt_cache_host_share"] = number("policy.prompt_cache_host_share", out["prompt_cache_host_share"],
                                                0, 0.9, "a share of the host's RAM, in [0, 0.9]")
        out["slot_prompt_similarity"] = number("policy.slot_prompt_similarity", out["slot_prompt_similarity"],
                                               0, 1, "a share of a slot's prompt, in [0, 1]")
    except SchemaError as err:
        raise PlanError(str(err))
    out["allow_partial_offload"] = _bool(out["allow_partial_offload"], "allow_partial_offload")
    out["allow_split"] = _bool(out["allow_split"], "allow_split")
    out["prefer_split"] = _bool(out["prefer_split"], "prefer_split")
    if str(out["backend_sampling"]).strip().lower() == "auto":
        out["backend_sampling"] = "auto"
    else:
        try:
            out["backend_sampling"] = _bool(out["backend_sampling"], "backend_sampling")
        except PlanError:
            raise PlanError("policy.backend_sampling must be auto, true or false, got %r" % (out["backend_sampling"],))
    modes = out["split_modes"]
    if isinstance(modes, str):
        modes = [m.strip() for m in modes.split(",") if m.strip()]
    modes = [str(m).lower() for m in modes] if isinstance(modes, (list, tuple)) else [repr(modes)] if modes else []
    if [m for m in modes if m not in SPLIT_MODES]:
        raise PlanError("policy.split_modes must list modes among %s (row does not load on CUDA at the pinned "
                        "llama.cpp), got %r" % (", ".join(SPLIT_MODES), out["split_modes"]))
    out["split_modes"] = list(dict.fromkeys(modes))
    out["objective"] = str(out["objective"]).strip().lower()
    if out["objective"] not in OBJECTIVES:
        raise PlanError("policy.objective must be one of %s, got %r" % (", ".join(OBJECTIVES), policy["objective"]))
    if out["max_parallel"] < out["min_parallel"]:
        raise PlanError("policy.max_parallel (%d) is below policy.min_parallel (%d)"
                        % (out["max_parallel"], out["min_parallel"]))
    types = out["cache_types"]
    if isinstance(types, str):
        types = [t.strip() for t in types.split(",") if t.strip()]
    types = [str(t).lower() for t in types] if isinstance(types, (list, tuple)) else [repr(types)]
    bad = [t for t in types if t not in KV_CACHE_TYPES]
    if not types or bad:
        raise PlanError("policy.cache_types must list KV cache types among %s (flash attention's default pairs "
                        "on CUDA), got %r" % (", ".join(sorted(KV_CACHE_TYPES)), out["cache_types"]))
    out["cache_types"] = list(dict.fromkeys(types))
    if out["target_parallel"] < out["min_parallel"]:
        raise PlanError("policy.target_parallel (%d) is below policy.min_parallel (%d)"
                        % (out["target_parallel"], out["min_parallel"]))
    if out["target_ctx"] < out["min_ctx"] * out["min_parallel"]:
        raise PlanError("policy.target_ctx (%d tokens in total) is below policy.min_ctx x policy.min_parallel "
                        "(%d x %d): raise target_ctx or lower the minimums"
                        % (out["target_ctx"], out["min_ctx"], out["min_parallel"]))
    if out["batch_size"] < out["ubatch_size"]:
        raise PlanError("policy.batch_size (%d) must be at least policy.ubatch_size (%d)"
                        % (out["batch_size"], out["ubatch_size"]))
    if out["speculative"] not in SPEC_TYPES:
        raise PlanError("policy.speculative must be one of %s, got %r" % (", ".join(SPEC_TYPES), out["speculative"]))
    return out


# llama.cpp refuses a draft whose vocabulary differs from the target's by more than
# this many tokens (common/speculative.cpp SPEC_VOCAB_MAX_SIZE_DIFFERENCE)
DRAFT_VOCAB_MAX_DIFFERENCE = 128


def attach_draft(models, draft, policy, what="the model"):
    """The candidate models with the draft model (plan_model's dict, or None) attached,
    which plan_memory.card_budget then counts; raises PlanError where the policy and the
    draft disagree or llama.cpp would refuse the pair."""
    wanted = (policy or {}).get("speculative", "none")
    if draft is None:
        if wanted == "draft-simple":
            raise PlanError("policy.speculative is draft-simple for %s, but no draft model is given: set its draft "
                            "(llm_model_draft, or the model's draft in llm_model_models), or choose ngram-mod "
                            "(no extra weights)" % what)
        return models
    if wanted != "draft-simple":
        raise PlanError("%s has a draft model (%s), but policy.speculative is %r: set it to draft-simple to plan "
                        "the draft, or remove the draft" % (what, draft.get("path") or draft["quant"], wanted))
    for model in models:
        if abs(int(model["n_vocab"]) - int(draft["n_vocab"])) > DRAFT_VOCAB_MAX_DIFFERENCE:
            raise PlanError("the draft model %s has %d tokens in its vocabulary and %s (%s) %d: llama.cpp refuses a "
                            "draft whose vocabulary differs by more than %d tokens; choose a draft of the same "
                            "family (the same tokenizer)" % (draft.get("path") or draft["quant"], draft["n_vocab"],
                                                             what, model["quant"], model["n_vocab"],
                                                             DRAFT_VOCAB_MAX_DIFFERENCE))
        model["draft"] = draft
    return models


def draft_settings(plan, model):
    """The plan's draft: what it holds and, where speculation serves, the flags' keys. A
    draft that does not serve (measured first, or no gain) keeps its memory reserved, so
    the configuration is the same when it is tried, but the process does not hold it."""
    draft = model.get("draft")
    if not draft:
        return
    memory = plan["memory"]
    plan["draft"] = {"path": draft.get("path"), "quant": draft["quant"], "n_vocab": draft["n_vocab"],
                     "weights_bytes": memory["draft_weights_bytes"], "kv_bytes": memory["draft_kv_bytes"],
                     "compute_bytes": memory["draft_compute_bytes"], "total_bytes": memory["draft_bytes"]}
    if plan["spec_type"] == "draft-simple":
        plan.update(draft_model_path=draft.get("path"), draft_n_gpu_layers=draft["n_layer"] + 1,
                    draft_cache_type_k=plan["cache_type_k"], draft_cache_type_v=plan["cache_type_v"])
        memory["draft_loaded"] = True
        return
    memory["draft_loaded"] = False
    memory["draft_reserved_bytes"] = memory["draft_bytes"]
    for key in ("predicted_used_bytes", "predicted_process_bytes"):
        memory[key] -= memory["draft_bytes"]


def physical_cores(cpus):
    """Physical cores among a list of logical CPU ids. Linux numbers the second
    hyperthread of every core after all first threads, so a GPU's NUMA-local list
    reads as two runs of equal length at a fixed offset (0-19,40-59 on a 2 x 20 core
    host): only the first half counts. Any other list counts in full."""
    cpus = sorted(set(int(c) for c in cpus or []))
    if not cpus:
        return 0
    runs = []
    for c in cpus:
        if runs and c == runs[-1][1] + 1:
            runs[-1][1] = c
        else:
            runs.append([c, c])
    if len(runs) % 2 == 0:
        half = len(runs) // 2
        first, second = runs[:half], runs[half:]
        offset = second[0][0] - first[0][0]
        if offset > 0 and all(b[0] - a[0] == offset and b[1] - a[1] == offset for a, b in zip(first, second)):
            return sum(r[1] - r[0] + 1 for r in first)
    return len(cpus)


# --- choosing ---------------------------------------------------------------------

def slot_limits(model, policy):
    """(min tokens per slot, max tokens per slot) as multiples of CTX_STEP."""
    min_seq = round_up(policy["min_ctx"], CTX_STEP)
    max_seq = model["n_ctx_train"] or (1 << 30)
    min_seq = min(min_seq, max_seq // CTX_STEP * CTX_STEP or CTX_STEP)
    return min_seq, max_seq


def minimum_config(model, gpu, policy, n_gpu_layers=None, with_type=False):
    """(cache type, memory) of the minimum configuration (min_parallel slots of
    min_ctx) with the first cache type, in preference order, that fits; or
    (None, memory with the most compact type) when none fits."""
    min_seq, _ = slot_limits(model, policy)
    p = policy["min_parallel"]
    tried = []
    for ct in policy["cache_types"]:
        memory = budget(model, gpu, policy, min_seq * p, p, ct, n_gpu_layers)
        if fits(memory):
            return (ct, memory, ct) if with_type else (ct, memory)
        tried.append((memory["total_bytes"], ct, memory))
    smallest = min(tried, key=lambda t: t[0])
    return (None, smallest[2], smallest[1]) if with_type else (None, smallest[2])


def largest_slot(model, gpu, policy, parallel, cache_type, lo, hi, n_gpu_layers=None):
    """Largest tokens-per-slot in [lo, hi] (CTX_STEP multiples) that fits, or None."""
    if lo > hi or not fits(budget(model, gpu, policy, lo * parallel, parallel, cache_type, n_gpu_layers)):
        return None
    a, b = lo // CTX_STEP, hi // CTX_STEP
    while a < b:
        mid = (a + b + 1) // 2
        if fits(budget(model, gpu, policy, mid * CTX_STEP * parallel, parallel, cache_type, n_gpu_layers)):
            a = mid
        else:
            b = mid - 1
    return a * CTX_STEP


def spend(model, gpu, policy, n_gpu_layers=None):
    """Slots first (up to target_parallel, each with at least min_ctx), then context
    up to target_ctx in total; the first cache type in preference order that reaches
    the target, else the one that gives the most context. Returns a dict or None."""
    min_seq, max_seq = slot_limits(model, policy)
    for p in range(policy["target_parallel"], policy["min_parallel"] - 1, -1):
        cap = min(policy["target_ctx"] // p, max_seq) // CTX_STEP * CTX_STEP
        if cap < min_seq:
            continue
        options = []
        for ct in policy["cache_types"]:
            seq = largest_slot(model, gpu, policy, p, ct, min_seq, cap, n_gpu_layers)
            if seq:
                options.append((ct, seq))
        if not options:
            continue
        reaching = [o for o in options if o[1] >= cap]
        ct, seq = reaching[0] if reaching else max(options, key=lambda o: o[1])
        return {"parallel": p, "cache_type": ct, "ctx_per_slot": seq, "ctx_size": seq * p, "cap": cap,
                "options": options}
    return None


def most_slots(model, gpu, policy, cache_type, seq, n_gpu_layers=None):
    """Most slots in [min_parallel, max_parallel] of seq tokens each that fit, or 0."""
    lo, hi = policy["min_parallel"], policy["max_parallel"]
    if not fits(budget(model, gpu, policy, seq * lo, lo, cache_type, n_gpu_layers)):
        return 0
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if fits(budget(model, gpu, policy, seq * mid, mid, cache_type, n_gpu_layers)):
            lo = mid
        else:
            hi = mid - 1
    return lo


def expected_for(model, gpu, ceiling, efficiency, cache_type):
    """Expected single-stream decode: ceiling x efficiency, plus a tensor split's
    exchange between its cards."""
    return with_sync(expected_decode(ceiling, efficiency, cache_type), model, gpu)


def spend_throughput(model, gpu, policy, efficiency, exponent_for):
    """The throughput objective: for each cache type, the most slots of min_ctx that
    fit (up to max_parallel); the type whose expected aggregate is highest (at each
    slot count's own exponent: exponent_for(slots)); then the memory left as context
    per slot. Returns a dict like spend(), or None."""
    min_seq, max_seq = slot_limits(model, policy)
    options = []
    for ct in policy["cache_types"]:
        p = most_slots(model, gpu, policy, ct, min_seq)
        if p:
            single = expected_for(model, gpu, ceiling_for(model, gpu, policy, min_seq, ct), efficiency, ct)
            options.append((expected_aggregate(single, p, exponent_for(p)), ct, p))
    if not options:
        return None
    aggregate, ct, p = max(options, key=lambda o: (o[0], -policy["cache_types"].index(o[1])))
    seq = largest_slot(model, gpu, policy, p, ct, min_seq, max_seq) or min_seq
    return {"parallel": p, "cache_type": ct, "ctx_per_slot": seq, "ctx_size": seq * p, "cap": max_seq,
            "options": [(o[1], o[2], round(o[0], 1)) for o in options], "objective": "throughput"}


def evaluate(model, gpu, policy, n_gpu_layers=None, calibration=None):
    ct, memory, smallest_type = minimum_config(model, gpu, policy, n_gpu_layers, with_type=True)
    min_seq, _ = slot_limits(model, policy)
    cache_type = ct or policy["cache_types"][0]
    ceiling = ceiling_for(model, gpu, policy, min_seq, cache_type, n_gpu_layers)
    efficiency = efficiency_for(gpu, model, calibration)
    return {"model": model, "cache_type": ct, "smallest_type": smallest_type, "memory": memory,
            "fits": ct is not None, "ceiling": ceiling, "efficiency": efficiency,
            "expected": expected_for(model, gpu, ceiling, efficiency["value"], cache_type),
            "n_gpu_layers": n_gpu_layers}


def max_gpu_layers(model, gpu, policy):
    """Most layers that fit on the GPU at the minimum configuration (0 if none)."""
    lo, hi = 0, model["n_layer"]
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if minimum_config(model, gpu, policy, mid)[0] is not None:
            lo = mid
        else:
            hi = mid - 1
    return lo


def pick(evaluations, floor):
    """Best quality among those whose expected decode meets the floor, else the
    fastest expected (not the highest ceiling: a smaller file can decode slower);
    (choice, met_floor)."""
    fitting = [e for e in evaluations if e["fits"]]
    if not fitting:
        return None, False
    meeting = [e for e in fitting if e["expected"] >= floor]
    if meeting:
        return max(meeting, key=lambda e: (e["model"]["bpw"], e["expected"])), True
    return max(fitting, key=lambda e: e["expected"]), False


def backend_sampling(policy):
    """Whether the plan samples on the GPU: policy.backend_sampling, where auto is on for
    the throughput objective only (many slots, where the CPU's sampling one slot after
    another holds the GPU up; one stream gains nothing)."""
    if policy["backend_sampling"] == "auto":
        return policy["objective"] == "throughput"
    return policy["backend_sampling"]


def _server_args(plan):
    """llama-server's command line for the plan (short flags, to read); -fit off
    because the plan already fitted every value."""
    shown = dict(plan, model_path=plan["model_path"] or "MODEL.gguf")
    if shown.get("draft_model_path") is None and "draft_model_path" in shown:
        shown["draft_model_path"] = "DRAFT.gguf"
    return plan_argv(shown, SERVER, short=True) + list(run_flag("threads", plan["threads"], short=True)) + list(
        run_flag("fit", "off", short=True))


def _choose(gpu, models, policy, calibration):
    """Search step 1: every candidate evaluated, the chosen one (a partial offload when
    none fits whole and the policy allows it). Returns (evaluations, chosen, met, partial)."""
    floor = policy["min_decode_tps"]
    evaluations = [evaluate(m, gpu, policy, calibration=calibration) for m in models]
    chosen, met = pick(evaluations, floor)
    if chosen is not None:
        return evaluations, chosen, met, False
    if not policy["allow_partial_offload"] or gpu.get("split"):
        raise PlanError(no_fit_message(gpu, evaluations, policy))
    partial_evals = []
    for e in evaluations:
        ngl = max_gpu_layers(e["model"], gpu, policy)
        if ngl > 0:
            partial_evals.append(evaluate(e["model"], gpu, policy, ngl, calibration))
    chosen, met = pick(partial_evals, floor)
    if chosen is None:
        raise PlanError(no_fit_message(gpu, evaluations, policy).replace(
            "or set policy.allow_partial_offload: true to keep layers in host memory (much slower).",
            "(partial offload is allowed, but not even one layer fits)."))
    by_model = dict((id(e["model"]), e) for e in partial_evals)
    return [by_model.get(id(e["model"]), e) for e in evaluations], chosen, met, True


def _configure(gpu, policy, chosen, partial, exponent_for):
    """Search step 2: the chosen candidate's slots, context and KV type. A partial
    offload keeps the minimum service; so does a full one where rounding to whole
    cells leaves no room above the minimum."""
    model = chosen["model"]
    if partial:
        config = None
    elif policy["objective"] == "throughput":
        config = spend_throughput(model, gpu, policy, chosen["efficiency"]["value"], exponent_for)
    else:
        config = spend(model, gpu, policy)
    if config is None:
        min_seq, _ = slot_limits(model, policy)
        config = {"parallel": policy["min_parallel"], "cache_type": chosen["cache_type"], "ctx_per_slot": min_seq,
                  "ctx_size": min_seq * policy["min_parallel"], "cap": min_seq, "options": []}
    return config


def _first_token(gpu, model, config, policy, partial, calibration=None):
    """The prompt speed and the time to the first token of a prompt that fills a slot as
    far as the decode expectation assumes (policy.kv_fill): the rate verify measured on
    cards of this name where there is one, else the family's figure."""
    tokens = int(config["ctx_per_slot"] * policy["kv_fill"])
    if partial:
        return {"prompt_tokens": tokens, "prompt_tps": None, "ttft_s": None,
                "source": "not modelled for a partial offload (the layers in host memory bound the prompt)"}
    out = expected_prefill(gpu, model, tokens, None if gpu.get("split") else calibration)
    if gpu.get("split") and out["prompt_tps"] is not None:
        out["source"] = "one card's figure, unmeasured for a split: " + out["source"]
    return out


def _threads(gpu, policy, sharing, warnings):
    """The CPU threads of the instance: policy.threads, else the physical cores of the
    GPU's CPUs shared among the instances on them."""
    if policy["threads"] is not None:
        return policy["threads"]
    cores = physical_cores(gpu.get("thread_cpus", gpu.get("cpu_affinity")))
    if cores:
        return max(1, cores // max(1, sharing))
    warnings.append("GPU %s reports no CPU affinity: planned 4 threads (set policy.threads)" % gpu.get("index"))
    return 4


def _plan_warnings(gpu, policy, model, chosen, met, partial, config, memory, ceiling, expected):
    """What the plan's reader should know: a floor not met, a partial offload, memory
    planned around or in use, a model trained on a short context."""
    floor = policy["min_decode_tps"]
    warnings = []
    if not met:
        warnings.append("GPU %s: no candidate that fits is expected to reach %.0f tok/s; planned the fastest, "
                        "%s at %.1f tok/s expected (ceiling %.1f)" % (gpu.get("index"), floor, model["quant"],
                                                                       chosen["expected"], chosen["ceiling"]))
    if partial:
        warnings.append("GPU %s: no candidate fits fully; %s runs with %d of %d layers on the GPU and the rest in "
                        "host memory (ceiling %.1f tok/s assuming %.0f GB/s host bandwidth)"
                        % (gpu.get("index"), model["quant"], chosen["n_gpu_layers"], model["n_layer"], ceiling,
                           policy["host_memory_bandwidth_bytes_per_s"] / 1e9))
    elif expected < floor <= chosen["expected"]:
        warnings.append("GPU %s: with slots %d%% full of the planned %d tokens each, the expected decode drops to "
                        "%.1f tok/s, below the %.0f tok/s floor" % (gpu.get("index"), int(policy["kv_fill"] * 100),
                                                                    config["ctx_per_slot"], expected, floor))
    if memory.get("foreign_bytes"):
        warnings.append("GPU %s: planned around %s that other processes hold (foreign-process policy plan_around); "
                        "the plan grows back when they exit and the model stage runs again"
                        % (gpu.get("index"), gib(memory["foreign_bytes"])))
    used = gpu.get("memory_used_bytes")
    if used is not None and used > memory["overhead_driver_reserved_bytes"] + GIB:
        warnings.append("GPU %s has %s in use now (a running llama-server or another process); the plan budgets "
                        "the whole card" % (gpu.get("index"), gib(used)))
    if model["n_ctx_train"] and model["n_ctx_train"] < policy["min_ctx"]:
        warnings.append("GPU %s: %s was trained on %d tokens of context, below policy.min_ctx (%d): each slot gets "
                        "%d tokens; lower policy.min_ctx or choose a model with a longer context"
                        % (gpu.get("index"), model["quant"], model["n_ctx_train"], policy["min_ctx"],
                           config["ctx_per_slot"]))
    return warnings + list(model["notes"])


def _plan_line(plan, expected, ceiling, aggregate, efficiency):
    """The budget table's last line: the plan's memory and speed in one line."""
    m = plan["memory"]
    others = (" + others %.2f" % (m["foreign_bytes"] / GIB)) if m.get("foreign_bytes") else ""
    if m.get("draft_bytes"):
        others += " + draft %.2f%s" % (m["draft_bytes"] / GIB, "" if m.get("draft_loaded", True) else " (kept free)")
    return ("  plan: %s -c %d -np %d (%d tokens/slot) %s KV, -ngl %s: weights %.2f + kv %.2f + compute %.2f + "
            "overhead %.2f + headroom %.2f%s = %.2f GiB of %.2f GiB; expected %.1f tok/s (ceiling %.1f x %.2f "
            "efficiency, %s), %.1f tok/s over %d slot(s)"
            % (plan["quant"], plan["ctx_size"], plan["parallel"], plan["ctx_per_slot"], plan["cache_type_k"],
               plan["n_gpu_layers"], m["weights_bytes"] / GIB, m["kv_bytes"] / GIB, m["compute_bytes"] / GIB,
               m["overhead_bytes"] / GIB, m["headroom_bytes"] / GIB, others, m["total_bytes"] / GIB,
               m["gpu_total_bytes"] / GIB, expected, ceiling, efficiency["value"], efficiency["source"], aggregate,
               plan["parallel"]))


def plan_gpu(gpu, models, policy, sharing=1, calibration=None):
    """One GPU's plan (dict) and its budget table (list of str); raises PlanError.
    The steps: the candidates and the choice (_choose), the slots and context
    (_configure), memory and speed, the threads, the warnings, the record."""
    for key in ("memory_total_bytes", "memory_bandwidth_bytes_per_s"):
        if not gpu.get(key):
            raise PlanError("GPU %s has no %s: pass the entries nvidia_gpu_facts returns" % (gpu.get("index"), key))
    fa = flash_attn_supported(gpu)
    early_warnings = []
    if not fa and any(t != "f16" for t in policy["cache_types"]):
        early_warnings.append("GPU %s (compute capability %s) runs without flash attention, which llama.cpp needs for "
                              "a quantized V cache: planning f16 KV only" % (gpu.get("index"),
                                                                             gpu.get("compute_capability")))
        policy = dict(policy, cache_types=["f16"])

    evaluations, chosen, met, partial = _choose(gpu, models, policy, calibration)
    model, efficiency, ngl = chosen["model"], chosen["efficiency"], chosen["n_gpu_layers"]
    verdicts = candidate_verdicts(evaluations, chosen, policy["min_decode_tps"], met)
    table = budget_table(gpu, evaluations, policy, verdicts)

    def exponent_for(slots):
        return aggregate_exponent(gpu, calibration, efficiency["arch"], slots)

    config = _configure(gpu, policy, chosen, partial, exponent_for)
    memory = budget(model, gpu, policy, config["ctx_size"], config["parallel"], config["cache_type"], ngl)
    ceiling = ceiling_for(model, gpu, policy, config["ctx_per_slot"], config["cache_type"], ngl)
    expected = expected_for(model, gpu, ceiling, efficiency["value"], config["cache_type"])
    exponent = exponent_for(config["parallel"])
    aggregate = expected_aggregate(expected, config["parallel"], exponent)
    first_token = _first_token(gpu, model, config, policy, partial, calibration)
    threads = _threads(gpu, policy, sharing, early_warnings)
    warnings = early_warnings + _plan_warnings(gpu, policy, model, chosen, met, partial, config, memory, ceiling,
                                               expected)

    split = gpu.get("split")
    plan = {
        "gpu_index": gpu.get("index"),
        "gpu_uuid": gpu.get("uuid"),
        "gpu_name": gpu.get("name"),
        # every GPU the instance uses, and how llama.cpp spreads the model over them
        "gpu_indices": [g.get("index") for g in split["gpus"]] if split else [gpu.get("index")],
        "gpu_uuids": [g.get("uuid") for g in split["gpus"]] if split else [gpu.get("uuid")],
        "split_mode": split["mode"] if split else "none",
        "tensor_split": split["fractions"] if split else [1.0],
        "quant": model["quant"],
        "candidate_index": model.get("candidate_index"),
        "candidate": model.get("candidate"),
        "model_path": model["path"],
        "ctx_size": config["ctx_size"],
        "ctx_per_slot": config["ctx_per_slot"],
        "parallel": config["parallel"],
        "cache_type_k": config["cache_type"],
        "cache_type_v": config["cache_type"],
        "n_gpu_layers": ngl if partial else model["n_layer"] + 1,
        "partial_offload": partial,
        "objective": policy["objective"],
        "flash_attn": fa,
        "batch_size": policy["batch_size"],
        "ubatch_size": policy["ubatch_size"],
        "backend_sampling": backend_sampling(policy),
        "threads": threads,
        "numa_node": gpu.get("numa_node"),
        "decode_ceiling_tps": round(ceiling, 1),
        "expected_decode_tps": round(expected, 1),
        "expected_aggregate_tps": round(aggregate, 1),
        "decode_efficiency": dict(efficiency, aggregate_exponent=exponent),
        # the prompt's speed and the wait for the first token at the planned fill
        "first_token": first_token,
        "memory": memory,
        "warnings": warnings,
    }
    plan["spec_type"], spec_reason = plan_speculation(plan, policy["speculative"], calibration, model.get("draft"))
    draft_settings(plan, model)
    plan["server_args"] = _server_args(plan)
    plan["reason"] = plan_reason(gpu, plan, chosen, evaluations, verdicts, config, policy, met, partial)
    if plan["backend_sampling"]:
        plan["reason"] += (" Sampling runs on the GPU (--backend-sampling, %s): the slots' sampling no longer waits "
                           "on the CPU one slot after another between decode steps." % (
                               "the throughput objective's default" if policy["backend_sampling"] == "auto"
                               else "policy.backend_sampling"))
    if spec_reason:
        plan["reason"] += " " + spec_reason
    if gpu.get("cuda_overhead_source"):
        plan["reason"] += " Memory counts %s." % gpu["cuda_overhead_source"]
    if first_token["ttft_s"] is not None:
        plan["reason"] += (" First token: a prompt of %d tokens (the planned fill) takes about %.1f s at %.0f tok/s "
                           "of prompt (%s)." % (first_token["prompt_tokens"], first_token["ttft_s"],
                                                first_token["prompt_tps"], first_token["source"]))
    plan["candidates"] = [{
        "quant": e["model"]["quant"], "bpw": e["model"]["bpw"], "fits": e["fits"],
        "min_total_bytes": e["memory"]["total_bytes"], "decode_ceiling_tps": round(e["ceiling"], 1),
        "expected_decode_tps": round(e["expected"], 1), "decode_efficiency": e["efficiency"]["value"],
        "verdict": verdicts.get(id(e), ""),
    } for e in evaluations]
    table.append(_plan_line(plan, expected, ceiling, aggregate, efficiency))
    return plan, table


def _rank(plan, floor):
    """Quality first among plans that meet the floor, else speed: (met, bpw, expected)."""
    met = plan["expected_decode_tps"] >= floor
    return (met, plan["bpw"] if met else 0.0, plan["expected_decode_tps"])


def plan_split(gpus, models, policy, calibration=None):
    """The best split of all the host's GPUs over policy.split_modes: (plan, table)
    or (None, [why not]). Ties between modes go to the faster expected stream."""
    best, notes = None, []
    if any(m.get("draft") for m in models):
        return None, ["no split: a draft model is planned on one card only (its memory on a split is not modelled)"]
    for mode in policy["split_modes"]:
        usable = models if mode != "tensor" else [m for m in models if tensor_split_supported(m)]
        if not usable:
            notes.append("%s split: the pinned llama.cpp cannot split %s by tensor"
                         % (mode, ", ".join(sorted(set(str(m.get("architecture")) for m in models)))))
            continue
        group = split_group(gpus, mode)
        try:
            plan, lines = plan_gpu(group, usable, dict(policy, allow_partial_offload=False), 1, calibration)
        except PlanError as err:
            notes.append("%s split: %s" % (mode, str(err).split("\n")[0]))
            continue
        plan["bpw"] = next(m["bpw"] for m in usable if m["quant"] == plan["quant"])
        if plan["split_mode"] == "tensor":
            plan["warnings"].append("GPUs %s: tensor split is EXPERIMENTAL at the pinned llama.cpp"
                                    % ",".join(str(i) for i in plan["gpu_indices"]))
        if gpu_family(group) not in SPLIT_MEASURED_FAMILIES:
            plan["warnings"].append("GPUs %s: a %s split is unmeasured on %s cards: its expected speed and each card's "
                                    "memory are the model's (each card keeps %s more headroom)"
                                    % (",".join(str(i) for i in plan["gpu_indices"]), plan["split_mode"],
                                       gpu_family(group), gib(SPLIT_CARD_MARGIN_BYTES)))
        plan["cpu_affinity"] = group["cpu_affinity"]
        floor = policy["min_decode_tps"]
        if best is None or _rank(plan, floor) > _rank(best[0], floor):
            best = (plan, lines)
    return best if best else (None, notes)


def _split_verdict(singles, split, floor, prefer=False):
    """Whether the split serves better than one instance per GPU, and why (text)."""
    s = split
    if singles is None:
        return True, "no candidate fits one GPU alone; over GPUs %s together %s fits" % (
            ",".join(str(i) for i in s["gpu_indices"]), s["quant"])
    if prefer:
        return True, "one instance over GPUs %s (%s split, policy.prefer_split): %s at %.1f tok/s per stream" % (
            ",".join(str(i) for i in s["gpu_indices"]), s["split_mode"], s["quant"], s["expected_decode_tps"])
    worst = min(singles, key=lambda p: _rank(p, floor))
    if _rank(s, floor) > _rank(worst, floor) and (s["quant"] != worst["quant"] or not worst["expected_decode_tps"] >= floor):
        why = ("a better quant (%s over %s) meets the %.0f tok/s floor" % (s["quant"], worst["quant"], floor)
               if s["bpw"] > worst["bpw"] and s["expected_decode_tps"] >= floor
               else "one GPU alone is expected below the %.0f tok/s floor (%.1f) and the split reaches %.1f"
               % (floor, worst["expected_decode_tps"], s["expected_decode_tps"]))
        return True, "%s split over GPUs %s: %s" % (s["split_mode"], ",".join(str(i) for i in s["gpu_indices"]), why)
    return False, ("one instance per GPU: %s on each card already %s; independent instances give about twice "
                   "the aggregate and survive the loss of a card (a %s split would run %s at %.1f tok/s per "
                   "stream)" % (worst["quant"], "meets the floor" if worst["expected_decode_tps"] >= floor else
                                "is the fastest", s["split_mode"], s["quant"], s["expected_decode_tps"]))


def prompt_cache(plans, policy, host_memory_bytes, at_once=None):
    """Each plan's prompt cache in host RAM (cache_ram_mib, --cache-ram) and slot prompt
    similarity: policy.prompt_cache_mib per instance, at most policy.prompt_cache_host_share
    of the host's RAM for all the instances together (host_memory_bytes None: not bounded,
    said so). at_once: how many of the plans run at the same time (default all; a router
    holds at most --models-max of its on-demand models). Adds the cost to each plan's
    reason; returns the host's line for the table."""
    running = len(plans) if at_once is None else at_once
    wanted = policy["prompt_cache_mib"]
    share = policy["prompt_cache_host_share"]
    if wanted and host_memory_bytes:
        bound = int(share * host_memory_bytes / MIB / max(running, 1))
        each = min(wanted, bound)
    else:
        bound, each = None, wanted
    for plan in plans:
        plan["cache_ram_mib"] = each
        plan["slot_prompt_similarity"] = policy["slot_prompt_similarity"]
        plan["server_args"] = _server_args(plan)
        if each:
            plan["reason"] += (" Prompt cache: up to %d MiB of host RAM for this instance (--cache-ram%s): a "
                               "conversation's earlier turns are restored from it instead of prefilled again." % (
                                   each, "" if bound is None or each == wanted else
                                   ", policy.prompt_cache_mib %d bounded by %.0f%% of the host's %.0f GiB over %d "
                                   "instance(s)" % (wanted, share * 100, host_memory_bytes / GIB, running)))
    if not each:
        return "prompt cache off (%s)" % ("policy.prompt_cache_mib 0" if not wanted else
                                          "policy.prompt_cache_host_share leaves no RAM for it")
    total = each * running
    if host_memory_bytes:
        return "prompt cache %d MiB x %d instance(s) = %.1f GiB of the host's %.1f GiB RAM (at most %.0f%%)" % (
            each, running, total / 1024.0, host_memory_bytes / GIB, share * 100)
    return "prompt cache %d MiB x %d instance(s) = %.1f GiB of host RAM (the host's RAM unknown: not bounded)" % (
        each, running, total / 1024.0)


def host_gpus(gpus):
    """The host's GPU facts, checked (nvidia_gpu_facts' entries); raises PlanError."""
    if not gpus:
        raise PlanError("no GPU to plan for: gpus is empty (nvidia_gpu_facts found none; see its nvidia_nvml_error)")
    try:
        return check_gpus(gpus)
    except SchemaError as err:
        raise PlanError("GPU facts: %s" % err)


def plan_host(gpus, models, policy, calibration=None, host_memory_bytes=None):
    """Plans for the GPUs of a host: {plans, table, summary, warnings, policy,
    split}. One plan per GPU, or one plan over all of them (split_mode layer or
    tensor) when that serves a better quant or the only fit (docs/planning.md).
    calibration: the fleet's measured efficiencies (plan_speed.merge_calibration's
    content), or None for the built-in table only. host_memory_bytes: the host's RAM,
    which bounds the instances' prompt caches (None: not bounded)."""
    raw, policy = policy, normalize_policy(policy)
    gpus = measured_overhead(host_gpus(gpus), calibration, [raw])
    if not models:
        raise PlanError("no candidate model to plan with: candidates is empty")
    bpw = dict((m["quant"], m["bpw"]) for m in models)
    affinity_users = {}
    for gpu in gpus:
        key = tuple(sorted(gpu.get("cpu_affinity") or []))
        affinity_users[key] = affinity_users.get(key, 0) + 1
    singles, table, failure = [], [], None
    for gpu in gpus:
        sharing = affinity_users[tuple(sorted(gpu.get("cpu_affinity") or []))]
        try:
            plan, lines = plan_gpu(gpu, models, policy, sharing, calibration)
        except PlanError as err:
            failure = failure or err
            continue
        plan["bpw"] = bpw.get(plan["quant"], 0.0)
        singles.append((plan, lines))
    split_note = None
    if len(gpus) >= 2 and policy["allow_split"] and policy["split_modes"]:
        split, split_lines = plan_split(gpus, models, policy, calibration)
        if split is not None:
            use, split_note = _split_verdict([p for p, _ in singles] if failure is None else None, split,
                                             policy["min_decode_tps"], policy["prefer_split"])
            if use:
                split["reason"] = "%s. %s" % (split_note[0].upper() + split_note[1:], split["reason"])
                singles, failure = [(split, split_lines)], None
        elif failure is not None:
            split_note = "no split fits either: %s" % "; ".join(split_lines)
    if failure is not None:
        raise PlanError("%s%s" % (failure, ("\n" + split_note[0].upper() + split_note[1:]) if split_note else ""))
    plans, warnings, summary = [], [], []
    for plan, lines in singles:
        plan.pop("bpw", None)
        plans.append(plan)
    cache_line = prompt_cache(plans, policy, host_memory_bytes)
    for plan, lines in singles:
        table.extend(lines)
        warnings.extend(plan["warnings"])
        summary.append(plan_summary(plan))
    if split_note:
        table.append("host: %s" % split_note)
    table.append("host: %s" % cache_line)
    return {"plans": plans, "table": table, "summary": "\n".join(summary), "warnings": warnings, "policy": policy,
            "split": split_note}
