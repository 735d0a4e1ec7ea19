# -*- coding: utf-8 -*-
# Plan llama-server per GPU: which quantization, context, slots and KV cache
# type fit a card, from the card's memory and bandwidth and the model's metadata.
#
# All the arithmetic of the llama_plan module lives here, free of Ansible so it
# is unit-testable; docs/planning.md explains every figure and where it comes
# from. Python 3.8-compatible because Ubuntu 20.04 hosts run it.
from __future__ import absolute_import, division, print_function

__metaclass__ = type

from ansible.module_utils.gguf_model import (
    KV_CACHE_TYPES, RECURRENT_STATE_BYTES_PER_VALUE, SWA_CELL_PAD, kv_row_bytes, layer_layout,
    recurrent_state_values, round_up)
from ansible.module_utils.llama_flags import SERVER, plan_argv

MIB = 1 << 20
GIB = 1 << 30

# --- Memory model constants (docs/planning.md, "The memory model") -----------
# CUDA context, cuBLAS workspace and the CUDA pool of one llama-server process,
# beyond what llama.cpp reports for model, context and compute buffers, by the
# CUDA major version of the build. What is measured and what is assumed:
#
#   CUDA    module loading as the roles run it           MiB  status
#   13.x    lazy (CUDA's default since 12.2)               576  MEASURED: 520-630 MiB on an H200, a
#                                                               one-arch (sm_90) build of the pinned
#                                                               llama.cpp; the middle of that range.
#                                                               EAGER there used 114 MiB more (26260
#                                                               vs 26146 MiB, 32B Q4_K, -c 32768 -np 4).
#   12.x    lazy: the default from 12.2; 12.0-12.1 get     576  ASSUMED equal to 13.x (not measured).
#           CUDA_MODULE_LOADING=LAZY from the llama_server
#           role
#   11.x    eager by default; the role sets LAZY, which    576  ASSUMED equal to 13.x (not measured; the
#           11.7+ honours (the fleet's 11.8)                    V100 fleet's toolkit). A V100 has fewer
#                                                               SMs than an H200 (80 vs 132), so its
#                                                               context is likely smaller.
#   <11.7   eager: LAZY is not honoured                     --  not planned for: expect more than the
#                                                               114 MiB measured on CUDA 13 for a
#                                                               one-arch build, more with every arch
#                                                               the build holds; raise policy.overhead_bytes.
#
# Eager loading (LAZY unset on 11.7-12.1, or llama_server_cuda_module_loading:
# EAGER) costs more than the table; the roles do not plan for it. One value for
# every major for now: the lookup is where a measured 11.8 figure goes.
CUDA_OVERHEAD_MIB_BY_MAJOR = {11: 576, 12: 576, 13: 576}
CUDA_OVERHEAD_BYTES = CUDA_OVERHEAD_MIB_BY_MAJOR[13] * MIB
# What the driver keeps of the card before any process starts (NVML counts it as
# used): a few hundred MiB on a V100 with R525; the harness profiles use 309 MiB.
# Subtracted only where the reported total does not already leave it out
# (driver_reserved_bytes()).
DRIVER_RESERVED_BYTES = 309 * MIB
DEFAULT_HEADROOM_BYTES = 512 * MIB
# Compute buffer: activations are f32; ggml-alloc's peak is either the output
# projection (logits of every ubatch token + the normed input) or the FFN (gate,
# up and their product + two embedding-wide tensors + the KQ mask). Calibrated on
# the 32B shape: 512 x 4 x (152064 + 5120) = 307.0 MiB, as measured.
ACTIVATION_BYTES = 4
FFN_LIVE_TENSORS = 3
# llama.cpp sizes caches in cells; context per slot is planned in these steps.
CTX_STEP = 256
# Decode ceiling: a stream reads every weight on the GPU once per token plus the
# KV of the tokens it holds; "typical" = a slot filled to this fraction.
KV_FILL_FRACTION = 0.5
# Host memory bandwidth assumed for layers left in host memory (partial offload
# only): a dual-socket DDR4 server's realistic read bandwidth.
HOST_MEMORY_BANDWIDTH = 100 * 10 ** 9
FLASH_ATTN_MIN_CC = (7, 0)
DEFAULT_UBATCH = 512
DEFAULT_BATCH = 2048

# Bits per weight by quantization label: llama.cpp tools/quantize/README.md
# (Llama-3.1-8B); Q3_K_M is not in that table: 3.6429 x 3.74 GB / 3.41 GB from
# llama-quantize's own size list (Llama-3-8B), the same scaling reproduces the
# README's Q3_K_L (4.30). Higher = better quality; used to rank candidates and to
# estimate sizes that are not given.
QUANT_BPW = {
    "IQ1_S": 2.00, "IQ1_M": 2.15, "IQ2_XXS": 2.38, "IQ2_XS": 2.59, "IQ2_S": 2.74, "IQ2_M": 2.93,
    "Q2_K_S": 2.97, "Q2_K": 3.16, "IQ3_XXS": 3.25, "IQ3_XS": 3.50, "Q3_K_S": 3.64, "IQ3_S": 3.66,
    "IQ3_M": 3.76, "Q3_K_M": 3.99, "Q3_K_L": 4.30, "IQ4_XS": 4.46, "Q4_K_S": 4.67, "IQ4_NL": 4.68,
    "Q4_0": 4.55, "Q4_K_M": 4.89, "Q5_K_S": 5.57, "Q5_K_M": 5.70, "Q6_K": 6.56, "Q8_0": 8.50,
    "BF16": 16.0, "F16": 16.0, "F32": 32.0,
}

DEFAULT_POLICY = {
    "min_ctx": 4096,               # tokens per slot, at least
    "target_ctx": 32768,           # tokens in total (the -c value aimed for, shared by the slots)
    "min_parallel": 1,
    "target_parallel": 4,
    "cache_types": ["f16", "q8_0"],  # in order of preference
    "headroom_bytes": DEFAULT_HEADROOM_BYTES,
    "min_decode_tps": 40.0,
    "allow_partial_offload": False,
    "overhead_bytes": CUDA_OVERHEAD_BYTES,
    "reserved_bytes": None,        # None: driver_reserved_bytes() of the card
    "ubatch_size": DEFAULT_UBATCH,
    "batch_size": DEFAULT_BATCH,
    "threads": None,               # None: physical cores of the GPU's CPU affinity
    "kv_fill": KV_FILL_FRACTION,
    "host_memory_bandwidth_bytes_per_s": HOST_MEMORY_BANDWIDTH,
}
_INT_KEYS = ("min_ctx", "target_ctx", "min_parallel", "target_parallel", "ubatch_size", "batch_size")
_BYTES_KEYS = ("headroom_bytes", "overhead_bytes", "reserved_bytes")


class PlanError(Exception):
    """The inputs are wrong or nothing fits; the message says what to change."""


# --- small helpers -----------------------------------------------------------

def gib(n):
    return "%.2f GiB" % (n / GIB)


def cuda_overhead_bytes(cuda_version=None):
    """Per-process CUDA overhead for a build of this CUDA version ('11.8', '13.0',
    11; None: CUDA_OVERHEAD_BYTES). A major outside the table gets the nearest
    known major's value (see the table at CUDA_OVERHEAD_MIB_BY_MAJOR)."""
    if cuda_version is None or str(cuda_version).strip() == "":
        return CUDA_OVERHEAD_BYTES
    head = str(cuda_version).strip().split(".")[0]
    if not head.isdigit():
        raise PlanError("a CUDA version looks like 11.8 or 13.0, got %r" % (cuda_version,))
    major = int(head)
    known = sorted(CUDA_OVERHEAD_MIB_BY_MAJOR)
    nearest = min(known, key=lambda k: (abs(k - major), -k))
    return CUDA_OVERHEAD_MIB_BY_MAJOR[nearest] * MIB


def _bool(value, name):
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in ("1", "true", "yes", "on", "y"):
        return True
    if text in ("0", "false", "no", "off", "n", ""):
        return False
    raise PlanError("policy.%s must be true or false, got %r" % (name, value))


def _int(value, name, minimum):
    try:
        number = int(value)
        if isinstance(value, float) and value != number:
            raise ValueError
    except (TypeError, ValueError):
        raise PlanError("policy.%s must be a whole number, got %r" % (name, value))
    if number < minimum:
        raise PlanError("policy.%s must be at least %d, got %d" % (name, minimum, number))
    return number


def normalize_policy(policy):
    """The policy with defaults filled in, checked; raises PlanError naming the bad key."""
    policy = dict(policy or {})
    unknown = sorted(set(policy) - set(DEFAULT_POLICY))
    if unknown:
        raise PlanError("unknown policy key(s) %s; known keys: %s" % (", ".join(unknown), ", ".join(sorted(DEFAULT_POLICY))))
    out = dict(DEFAULT_POLICY)
    out.update(dict((k, v) for k, v in policy.items() if v is not None))
    for key in _INT_KEYS:
        out[key] = _int(out[key], key, 1)
    for key in _BYTES_KEYS:
        if out[key] is not None:
            out[key] = _int(out[key], key, 0)
    if out["threads"] is not None:
        out["threads"] = _int(out["threads"], "threads", 1)
    try:
        out["min_decode_tps"] = float(out["min_decode_tps"])
        out["kv_fill"] = float(out["kv_fill"])
        out["host_memory_bandwidth_bytes_per_s"] = float(out["host_memory_bandwidth_bytes_per_s"])
    except (TypeError, ValueError):
        raise PlanError("policy.min_decode_tps, kv_fill and host_memory_bandwidth_bytes_per_s must be numbers")
    if not 0 < out["kv_fill"] <= 1:
        raise PlanError("policy.kv_fill must be in (0, 1], got %s" % out["kv_fill"])
    out["allow_partial_offload"] = _bool(out["allow_partial_offload"], "allow_partial_offload")
    types = out["cache_types"]
    if isinstance(types, str):
        types = [t.strip() for t in types.split(",") if t.strip()]
    types = [str(t).lower() for t in types]
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
    return out


def quant_bpw(label):
    """Bits per weight of a quantization label (case-insensitive), or None."""
    if not label:
        return None
    return QUANT_BPW.get(str(label).upper())


def driver_reserved_bytes(memory_total_bytes, reserved=DRIVER_RESERVED_BYTES):
    """Memory the driver holds before any process starts, that the reported total
    still includes. NVML reports either the whole card (as the harness profiles and
    newer drivers do) or the card less the driver's share (older drivers' v1 call:
    a V100-16GB shows 16160 MiB): what the total lacks up to the next whole GiB is
    taken as already reserved."""
    missing = round_up(memory_total_bytes, GIB) - memory_total_bytes
    return max(0, reserved - missing)


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


# --- the model as the planner sees it -------------------------------------------

_ALIASES = {
    "block_count": ("n_layer", "layer_count", "n_layers"),
    "embedding_length": ("n_embd", "embedding_size", "hidden_size"),
    "head_count": ("n_head", "num_attention_heads"),
    "head_count_kv": ("n_head_kv", "kv_head_count", "num_key_value_heads"),
    "key_length": ("head_dim", "head_dim_k", "n_embd_head_k"),
    "value_length": ("head_dim_v", "n_embd_head_v"),
    "context_length": ("n_ctx_train", "trained_context_length"),
    "vocab_size": ("n_vocab",),
    "feed_forward_length": ("n_ff", "intermediate_size"),
}


def _canonical(meta):
    meta = dict(meta or {})
    for key, aliases in _ALIASES.items():
        if meta.get(key) is None:
            for alias in aliases:
                if meta.get(alias) is not None:
                    meta[key] = meta[alias]
                    break
    if meta.get("value_length") is None and meta.get("key_length") is not None:
        meta["value_length"] = meta["key_length"]
    return meta


def _pseudo_layers(meta, name):
    """Layers rebuilt from gguf_info's per-token figures when the structural keys
    are missing (f16 bytes / 2 = values; spread evenly)."""
    per_token = meta.get("kv_bytes_per_token") or {}
    if "f16" not in per_token:
        raise PlanError("metadata of candidate %s has neither block_count/head_count_kv nor kv_bytes_per_token: "
                        "pass what gguf_info returns for the file" % name)
    n_layer = int(meta.get("block_count") or len(meta.get("layers", {}).get("full_attention", [])) or 1)
    idx = (meta.get("layers") or {}).get("full_attention") or list(range(n_layer))
    values = int(per_token["f16"]) // 2
    layers = [{"kind": "none", "k_values": 0, "v_values": 0} for _ in range(n_layer)]
    for n, il in enumerate(idx):
        share = values // len(idx) + (1 if n < values % len(idx) else 0)
        layers[il] = {"kind": "full", "k_values": share // 2, "v_values": share - share // 2}
    for il in (meta.get("layers") or {}).get("recurrent", []):
        layers[il] = {"kind": "recurrent", "k_values": 0, "v_values": 0}
    return layers


def model_from_metadata(quant, meta, size_bytes=None, path=None, source="declared"):
    """The planner's view of one candidate.

    quant: its label (Q4_K_M, ...); meta: what gguf_info returns (or a subset with
    the structural keys); size_bytes: the file size when planning before download.
    Weights come from the file's tensor table when meta describes this very
    quantization, else from size_bytes, else from parameters x bits per weight."""
    meta = _canonical(meta)
    label = str(quant or meta.get("file_type") or "").upper() or None
    name = label or path or "?"
    if not meta.get("block_count"):
        raise PlanError("metadata of candidate %s lacks block_count (the layer count)" % name)
    n_layer = int(meta["block_count"])
    n_embd = int(meta.get("embedding_length") or 0)
    if meta.get("head_count") is not None and meta.get("embedding_length"):
        try:
            layers = layer_layout(meta)
        except (ValueError, KeyError, TypeError) as err:
            raise PlanError("metadata of candidate %s is inconsistent: %s" % (name, err))
    else:
        layers = _pseudo_layers(meta, name)
    n_recurrent = sum(1 for l in layers if l["kind"] == "recurrent")
    rec_layer = recurrent_state_values(meta) * RECURRENT_STATE_BYTES_PER_VALUE
    if n_recurrent and not rec_layer and meta.get("recurrent_state_bytes_per_sequence"):
        rec_layer = int(meta["recurrent_state_bytes_per_sequence"]) // n_recurrent

    notes = []
    # meta describes this very quantization (its tensor table holds this file's
    # token_embd/output sizes) when its file_type is the candidate's label
    same_file = bool(meta.get("weight_bytes")) and (
        source == "file" or label is None or str(meta.get("file_type") or "").upper() == label)
    bpw_label = quant_bpw(label)
    params = int(meta.get("parameter_count") or 0)
    if size_bytes:
        weight_bytes = int(size_bytes)  # the declared file size (header included: a few MiB high)
    elif same_file:
        weight_bytes = int(meta["weight_bytes"])
    elif params and bpw_label:
        weight_bytes = int(params * bpw_label / 8)
        notes.append("%s: no size given; estimated %s from %d parameters x %.2f bits" %
                     (name, gib(weight_bytes), params, bpw_label))
    else:
        raise PlanError("candidate %s has no size: give size_bytes, or a path to the file" % name)
    if not params and bpw_label:
        params = int(weight_bytes * 8 / bpw_label)
    n_vocab = int(meta.get("vocab_size") or 0)
    if not n_vocab:
        n_vocab = 152064
        notes.append("%s: metadata lacks vocab_size; assumed 152064 for the compute buffer" % name)
    embd_params = n_vocab * n_embd
    if same_file and meta.get("token_embd_bytes") is not None:
        token_embd = int(meta["token_embd_bytes"])
    else:
        bpw = bpw_label or (weight_bytes * 8.0 / params if params else 16.0)
        token_embd = int(embd_params * bpw / 8)
    tied = bool(meta.get("tied_embeddings", False))
    if same_file and meta.get("output_bytes") is not None:
        output_bytes = int(meta["output_bytes"])
    else:
        output_bytes = 0 if tied else token_embd
    # llama.cpp keeps the input embedding table in host memory; a tied output
    # layer is a GPU copy of it (TENSOR_DUPLICATED), so it stays on the card.
    gpu_weights = weight_bytes - token_embd + (token_embd if tied else 0)
    ff = meta.get("feed_forward_length") or 0
    if isinstance(ff, (list, tuple)):
        ff = max(ff) if ff else 0
    heads = meta.get("head_count") or 0
    if isinstance(heads, (list, tuple)):
        heads = max(heads) if heads else 0
    quality = bpw_label if bpw_label else (weight_bytes * 8.0 / params if params else 0.0)
    return {
        "quant": label or "unknown",
        "path": path,
        "source": source,
        "bpw": round(quality, 4),
        "weight_bytes": weight_bytes,
        "token_embd_bytes": token_embd,
        "output_bytes": output_bytes,
        "tied": tied,
        "gpu_weight_bytes": gpu_weights,
        "n_layer": n_layer,
        "n_embd": n_embd,
        "n_ff": int(ff),
        "n_head": int(heads),
        "n_vocab": n_vocab,
        "n_ctx_train": int(meta.get("context_length") or 0),
        "layers": layers,
        "window": int(meta.get("sliding_window") or 0),
        "recurrent_bytes_per_layer": rec_layer,
        "architecture": meta.get("architecture"),
        "notes": notes,
    }


# --- the arithmetic -----------------------------------------------------------------

def kv_bytes_per_token(model, cache_type, first_layer=0):
    """(full-attention bytes per token, sliding-window bytes per cell) of layers >= first_layer."""
    full = swa = 0
    for layer in model["layers"][first_layer:]:
        row = kv_row_bytes(layer["k_values"], cache_type) + kv_row_bytes(layer["v_values"], cache_type)
        if layer["kind"] == "full":
            full += row
        elif layer["kind"] == "swa":
            swa += row
    return full, swa


def swa_cells_per_slot(model, ctx_per_slot, ubatch):
    """Cells of the sliding-window cache per slot (llama-kv-cache-iswa.cpp)."""
    if not model["window"]:
        return 0
    return round_up(min(ctx_per_slot, model["window"] + ubatch), SWA_CELL_PAD)


def cache_bytes(model, ctx_size, parallel, cache_type, ubatch, first_layer=0):
    """Every cache llama.cpp allocates for -c ctx_size -np parallel: full-attention
    KV for ctx_size cells, sliding-window KV per slot, recurrent state per slot."""
    full_pt, swa_pt = kv_bytes_per_token(model, cache_type, first_layer)
    ctx_per_slot = ctx_size // parallel
    n_rec = sum(1 for l in model["layers"][first_layer:] if l["kind"] == "recurrent")
    full = ctx_size * full_pt
    swa = parallel * swa_cells_per_slot(model, ctx_per_slot, ubatch) * swa_pt if swa_pt else 0
    rec = parallel * n_rec * model["recurrent_bytes_per_layer"]
    return {"full": full, "swa": swa, "recurrent": rec, "total": full + swa + rec}


def compute_bytes(model, ubatch, ctx_per_slot, flash_attn=True):
    """The CUDA compute buffer: the peak of ggml-alloc's worst-case graph."""
    a = ACTIVATION_BYTES
    mask = ubatch * ctx_per_slot * a
    logits = ubatch * a * (model["n_vocab"] + model["n_embd"])
    ffn = ubatch * a * (FFN_LIVE_TENSORS * model["n_ff"] + 2 * model["n_embd"]) + mask
    attn = mask
    if not flash_attn:  # KQ scores and their softmax, f32, for the whole slot
        attn += 2 * ubatch * ctx_per_slot * model["n_head"] * a
    return max(logits, ffn, attn)


def kv_read_bytes(model, cache_type, fill_tokens, first_layer=0):
    """Cache bytes one decode step of one stream reads with fill_tokens in its slot."""
    full_pt, swa_pt = kv_bytes_per_token(model, cache_type, first_layer)
    n_rec = sum(1 for l in model["layers"][first_layer:] if l["kind"] == "recurrent")
    swa_tokens = min(fill_tokens, model["window"]) if model["window"] else 0
    return int(fill_tokens * full_pt + swa_tokens * swa_pt + n_rec * model["recurrent_bytes_per_layer"])


def decode_ceiling(bandwidth, gpu_bytes_per_token, host_bytes_per_token=0, host_bandwidth=HOST_MEMORY_BANDWIDTH):
    """Memory-bound single-stream ceiling, tokens/s."""
    seconds = gpu_bytes_per_token / float(bandwidth)
    if host_bytes_per_token:
        seconds += host_bytes_per_token / float(host_bandwidth)
    return 1.0 / seconds if seconds > 0 else float("inf")


def layer_weight_bytes(model):
    """Average bytes of one repeating layer (weights less embedding and output)."""
    rest = model["weight_bytes"] - model["token_embd_bytes"] - (0 if model["tied"] else model["output_bytes"])
    return max(0, rest) // max(1, model["n_layer"])


def budget(model, gpu, policy, ctx_size, parallel, cache_type, n_gpu_layers=None):
    """The memory breakdown of one configuration on one GPU (bytes)."""
    ubatch = policy["ubatch_size"]
    fa = flash_attn_supported(gpu)
    total_card = int(gpu["memory_total_bytes"])
    full_offload = n_gpu_layers is None or n_gpu_layers > model["n_layer"]
    if full_offload:
        weights = model["gpu_weight_bytes"]
        first = 0
    else:
        first = model["n_layer"] - n_gpu_layers  # llama.cpp offloads the last layers
        weights = n_gpu_layers * layer_weight_bytes(model)
    caches = cache_bytes(model, ctx_size, parallel, cache_type, ubatch, first)
    compute = compute_bytes(model, ubatch, ctx_size // parallel, fa)
    reserved = policy["reserved_bytes"]
    if reserved is None:
        # NVML's own figure when the driver gives it (measured: 615 MiB on an H200,
        # which the whole-GiB rule below missed); the rule only for older drivers.
        reserved = gpu.get("memory_reserved_bytes")
    if reserved is None:
        reserved = driver_reserved_bytes(total_card)
    overhead = policy["overhead_bytes"] + reserved
    headroom = policy["headroom_bytes"]
    total = weights + caches["total"] + compute + overhead + headroom
    return {
        "weights_bytes": weights,
        "kv_bytes": caches["total"],
        "compute_bytes": compute,
        "overhead_bytes": overhead,
        "headroom_bytes": headroom,
        "total_bytes": total,
        "gpu_total_bytes": total_card,
        "kv_full_attention_bytes": caches["full"],
        "kv_sliding_window_bytes": caches["swa"],
        "recurrent_state_bytes": caches["recurrent"],
        "overhead_cuda_bytes": policy["overhead_bytes"],
        "overhead_driver_reserved_bytes": reserved,
        "predicted_used_bytes": total - headroom,
        "free_bytes": total_card - total,
        "host_weights_bytes": model["token_embd_bytes"] if full_offload else model["weight_bytes"] - weights,
    }


def fits(memory):
    return memory["total_bytes"] <= memory["gpu_total_bytes"]


def flash_attn_supported(gpu):
    try:
        major, minor = (int(x) for x in str(gpu.get("compute_capability") or "0.0").split(".")[:2])
    except ValueError:
        return False
    return (major, minor) >= FLASH_ATTN_MIN_CC


def ceiling_for(model, gpu, policy, ctx_per_slot, cache_type, n_gpu_layers=None):
    """Decode ceiling (tok/s) of one stream with its slot filled to policy.kv_fill."""
    fill = int(ctx_per_slot * policy["kv_fill"])
    bw = float(gpu["memory_bandwidth_bytes_per_s"])
    if n_gpu_layers is None or n_gpu_layers > model["n_layer"]:
        return decode_ceiling(bw, model["gpu_weight_bytes"] + kv_read_bytes(model, cache_type, fill))
    first = model["n_layer"] - n_gpu_layers
    per_layer = layer_weight_bytes(model)
    gpu_read = n_gpu_layers * per_layer + kv_read_bytes(model, cache_type, fill, first)
    cpu_kv = kv_read_bytes(model, cache_type, fill) - kv_read_bytes(model, cache_type, fill, first)
    output = model["token_embd_bytes"] if model["tied"] else model["output_bytes"]
    host_read = first * per_layer + output + cpu_kv
    return decode_ceiling(bw, gpu_read, host_read, policy["host_memory_bandwidth_bytes_per_s"])


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


def evaluate(model, gpu, policy, n_gpu_layers=None):
    ct, memory, smallest_type = minimum_config(model, gpu, policy, n_gpu_layers, with_type=True)
    min_seq, _ = slot_limits(model, policy)
    ceiling = ceiling_for(model, gpu, policy, min_seq, ct or policy["cache_types"][0], n_gpu_layers)
    return {"model": model, "cache_type": ct, "smallest_type": smallest_type, "memory": memory,
            "fits": ct is not None, "ceiling": ceiling, "n_gpu_layers": n_gpu_layers}


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
    """Best quality among those meeting the floor, else the fastest; (choice, met_floor)."""
    fitting = [e for e in evaluations if e["fits"]]
    if not fitting:
        return None, False
    meeting = [e for e in fitting if e["ceiling"] >= floor]
    if meeting:
        return max(meeting, key=lambda e: (e["model"]["bpw"], e["ceiling"])), True
    return max(fitting, key=lambda e: e["ceiling"]), False


# --- the plan --------------------------------------------------------------------

TABLE_HEAD = "  %-8s %5s %10s %15s %9s %9s %9s %10s %5s %8s  %s" % (
    "quant", "bpw", "weights", "kv(min)", "compute", "overhead", "headroom", "total", "fits", "tok/s", "verdict")


def _row(e, verdict):
    m = e["memory"]
    g = lambda n: "%.2f" % (n / GIB)  # noqa: E731
    kv = "%s %s" % (g(m["kv_bytes"]), e["cache_type"] or e["smallest_type"])
    return "  %-8s %5.2f %10s %15s %9s %9s %9s %10s %5s %8.1f  %s" % (
        e["model"]["quant"], e["model"]["bpw"], g(m["weights_bytes"]), kv, g(m["compute_bytes"]),
        g(m["overhead_bytes"]), g(m["headroom_bytes"]), g(m["total_bytes"]),
        "yes" if e["fits"] else "no", e["ceiling"], verdict)


def gpu_header(gpu):
    return "GPU %s %s: %s, %.0f GB/s, compute capability %s" % (
        gpu.get("index"), gpu.get("name", "?"), gib(int(gpu["memory_total_bytes"])),
        float(gpu["memory_bandwidth_bytes_per_s"]) / 1e9, gpu.get("compute_capability"))


def budget_table(gpu, evaluations, policy, verdicts):
    min_seq = round_up(policy["min_ctx"], CTX_STEP)
    lines = [gpu_header(gpu),
             "  (GiB; kv(min) = %d slot(s) x %d tokens; tok/s = decode ceiling with a slot %d%% full)"
             % (policy["min_parallel"], min_seq, int(policy["kv_fill"] * 100)),
             TABLE_HEAD]
    for e in sorted(evaluations, key=lambda e: e["model"]["bpw"]):
        lines.append(_row(e, verdicts.get(id(e), "")))
    return lines


def _verdicts(evaluations, chosen, floor, met_floor):
    out = {}
    for e in evaluations:
        m = e["model"]
        if e is chosen:
            out[id(e)] = "chosen"
        elif not e["fits"]:
            out[id(e)] = "needs %s, more than the card" % gib(e["memory"]["total_bytes"])
        elif e["ceiling"] < floor:
            out[id(e)] = "ceiling %.1f tok/s below the %.0f tok/s floor" % (e["ceiling"], floor)
        elif chosen is not None and met_floor and m["bpw"] <= chosen["model"]["bpw"]:
            out[id(e)] = "lower quality than %s" % chosen["model"]["quant"]
        elif chosen is not None:
            out[id(e)] = "slower than %s" % chosen["model"]["quant"]
        else:
            out[id(e)] = ""
    return out


def _no_fit_message(gpu, evaluations, policy):
    smallest = min(evaluations, key=lambda e: e["model"]["weight_bytes"])
    m = smallest["memory"]
    table = budget_table(gpu, [smallest], policy, {id(smallest): "smallest candidate"})
    fixed = m["total_bytes"] - m["weights_bytes"]
    room = m["gpu_total_bytes"] - fixed
    min_seq = round_up(policy["min_ctx"], CTX_STEP)
    return (
        "No candidate fits GPU %s (%s, %s) fully with %d slot(s) of %d tokens and %s KV. The smallest, %s, "
        "needs %s (%s more than the card):\n%s\n"
        "What to change: offer a smaller quantization (with this policy at most %s of weights on the GPU fit), "
        "lower policy.min_ctx (%d) or policy.min_parallel (%d), add a more compact type to policy.cache_types "
        "(%s), lower policy.headroom_bytes (%d), or set policy.allow_partial_offload: true to keep layers in "
        "host memory (much slower)."
        % (gpu.get("index"), gpu.get("name", "?"), gib(m["gpu_total_bytes"]), policy["min_parallel"], min_seq,
           "/".join(policy["cache_types"]), smallest["model"]["quant"], gib(m["total_bytes"]),
           gib(m["total_bytes"] - m["gpu_total_bytes"]), "\n".join(table), gib(max(0, room)),
           policy["min_ctx"], policy["min_parallel"], ", ".join(policy["cache_types"]), policy["headroom_bytes"]))


def _server_args(plan):
    """llama-server's command line for the plan (short flags, to read); -fit off
    because the plan already fitted every value."""
    shown = dict(plan, model_path=plan["model_path"] or "MODEL.gguf")
    return plan_argv(shown, SERVER, short=True) + ["-t", str(plan["threads"]), "-fit", "off"]


def plan_gpu(gpu, models, policy, sharing=1):
    """One GPU's plan (dict) and its budget table (list of str); raises PlanError."""
    for key in ("memory_total_bytes", "memory_bandwidth_bytes_per_s"):
        if not gpu.get(key):
            raise PlanError("GPU %s has no %s: pass the entries nvidia_gpu_facts returns" % (gpu.get("index"), key))
    floor = policy["min_decode_tps"]
    warnings = []
    fa = flash_attn_supported(gpu)
    if not fa and any(t != "f16" for t in policy["cache_types"]):
        warnings.append("GPU %s (compute capability %s) runs without flash attention, which llama.cpp needs for a "
                        "quantized V cache: planning f16 KV only" % (gpu.get("index"), gpu.get("compute_capability")))
        policy = dict(policy, cache_types=["f16"])

    evaluations = [evaluate(m, gpu, policy) for m in models]
    chosen, met = pick(evaluations, floor)
    partial = False
    if chosen is None:
        if not policy["allow_partial_offload"]:
            raise PlanError(_no_fit_message(gpu, evaluations, policy))
        partial_evals = []
        for e in evaluations:
            ngl = max_gpu_layers(e["model"], gpu, policy)
            if ngl > 0:
                partial_evals.append(evaluate(e["model"], gpu, policy, ngl))
        chosen, met = pick(partial_evals, floor)
        if chosen is None:
            raise PlanError(_no_fit_message(gpu, evaluations, policy).replace(
                "or set policy.allow_partial_offload: true to keep layers in host memory (much slower).",
                "(partial offload is allowed, but not even one layer fits)."))
        partial = True
        by_model = dict((id(e["model"]), e) for e in partial_evals)
        evaluations = [by_model.get(id(e["model"]), e) for e in evaluations]

    model = chosen["model"]
    verdicts = _verdicts(evaluations, chosen, floor, met)
    table = budget_table(gpu, evaluations, policy, verdicts)

    ngl = chosen["n_gpu_layers"]
    # a partial offload keeps the minimum service; so does a full one where rounding
    # to whole cells leaves no room above the minimum
    config = None if partial else spend(model, gpu, policy)
    if config is None:
        min_seq, _ = slot_limits(model, policy)
        config = {"parallel": policy["min_parallel"], "cache_type": chosen["cache_type"], "ctx_per_slot": min_seq,
                  "ctx_size": min_seq * policy["min_parallel"], "cap": min_seq, "options": []}
    memory = budget(model, gpu, policy, config["ctx_size"], config["parallel"], config["cache_type"], ngl)
    ceiling = ceiling_for(model, gpu, policy, config["ctx_per_slot"], config["cache_type"], ngl)

    threads = policy["threads"]
    cores = physical_cores(gpu.get("cpu_affinity"))
    if threads is None:
        if cores:
            threads = max(1, cores // max(1, sharing))
        else:
            threads = 4
            warnings.append("GPU %s reports no CPU affinity: planned 4 threads (set policy.threads)" % gpu.get("index"))

    if not met:
        warnings.append("GPU %s: no candidate that fits reaches %.0f tok/s (decode ceiling); planned the fastest, "
                        "%s at %.1f tok/s" % (gpu.get("index"), floor, model["quant"], chosen["ceiling"]))
    if partial:
        warnings.append("GPU %s: no candidate fits fully; %s runs with %d of %d layers on the GPU and the rest in "
                        "host memory (ceiling %.1f tok/s assuming %.0f GB/s host bandwidth)"
                        % (gpu.get("index"), model["quant"], ngl, model["n_layer"], ceiling,
                           policy["host_memory_bandwidth_bytes_per_s"] / 1e9))
    elif ceiling < floor <= chosen["ceiling"]:
        warnings.append("GPU %s: with slots %d%% full of the planned %d tokens each, the ceiling drops to %.1f tok/s, "
                        "below the %.0f tok/s floor" % (gpu.get("index"), int(policy["kv_fill"] * 100),
                                                        config["ctx_per_slot"], ceiling, floor))
    used = gpu.get("memory_used_bytes")
    if used is not None and used > memory["overhead_driver_reserved_bytes"] + GIB:
        warnings.append("GPU %s has %s in use now (a running llama-server or another process); the plan budgets "
                        "the whole card" % (gpu.get("index"), gib(used)))
    warnings.extend(model["notes"])

    plan = {
        "gpu_index": gpu.get("index"),
        "gpu_uuid": gpu.get("uuid"),
        "gpu_name": gpu.get("name"),
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
        "flash_attn": fa,
        "batch_size": policy["batch_size"],
        "ubatch_size": policy["ubatch_size"],
        "threads": threads,
        "numa_node": gpu.get("numa_node"),
        "decode_ceiling_tps": round(ceiling, 1),
        "memory": memory,
        "warnings": warnings,
    }
    plan["server_args"] = _server_args(plan)
    plan["reason"] = _reason(gpu, plan, chosen, evaluations, verdicts, config, policy, met, partial)
    plan["candidates"] = [{
        "quant": e["model"]["quant"], "bpw": e["model"]["bpw"], "fits": e["fits"],
        "min_total_bytes": e["memory"]["total_bytes"], "decode_ceiling_tps": round(e["ceiling"], 1),
        "verdict": verdicts.get(id(e), ""),
    } for e in evaluations]
    m = memory
    table.append("  plan: %s -c %d -np %d (%d tokens/slot) %s KV, -ngl %s: weights %.2f + kv %.2f + compute %.2f + "
                 "overhead %.2f + headroom %.2f = %.2f GiB of %.2f GiB; ceiling %.1f tok/s"
                 % (model["quant"], plan["ctx_size"], plan["parallel"], plan["ctx_per_slot"], config["cache_type"],
                    plan["n_gpu_layers"], m["weights_bytes"] / GIB, m["kv_bytes"] / GIB, m["compute_bytes"] / GIB,
                    m["overhead_bytes"] / GIB, m["headroom_bytes"] / GIB, m["total_bytes"] / GIB,
                    m["gpu_total_bytes"] / GIB, ceiling))
    return plan, table


def _reason(gpu, plan, chosen, evaluations, verdicts, config, policy, met, partial):
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
        parts.append("%s: the best quality (%.2f bits/weight) of the %d candidate(s) that fit this %s card with %d "
                     "slot(s) of %d tokens, whose decode ceiling (%.1f tok/s = %.0f GB/s / %.2f GB read per token) "
                     "meets the %.0f tok/s floor." % (
                         model["quant"], model["bpw"], len(fitting), gib(int(gpu["memory_total_bytes"])),
                         policy["min_parallel"], round_up(policy["min_ctx"], CTX_STEP), chosen["ceiling"], bw / 1e9,
                         bw / chosen["ceiling"] / 1e9, floor))
    else:
        parts.append("%s: no candidate that fits reaches the %.0f tok/s floor, so the fastest that fits "
                     "(ceiling %.1f tok/s)." % (model["quant"], floor, chosen["ceiling"]))
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
    parts.append("Memory: weights %s on the GPU (%s), %s, compute %s, "
                 "CUDA and driver overhead %s, headroom %s: %s of %s, %s free. Decode ceiling at %d%% slot fill: "
                 "%.1f tok/s." % (
                     gib(m["weights_bytes"]), embd, kv_desc, gib(m["compute_bytes"]),
                     gib(m["overhead_bytes"]), gib(m["headroom_bytes"]), gib(m["total_bytes"]),
                     gib(m["gpu_total_bytes"]), gib(m["free_bytes"]), int(policy["kv_fill"] * 100),
                     plan["decode_ceiling_tps"]))
    return " ".join(parts)


def plan_host(gpus, models, policy):
    """Plans for every GPU of a host: {plans, table, summary, warnings}."""
    policy = normalize_policy(policy)
    if not gpus:
        raise PlanError("no GPU to plan for: gpus is empty (nvidia_gpu_facts found none; see its nvidia_nvml_error)")
    if not models:
        raise PlanError("no candidate model to plan with: candidates is empty")
    affinity_users = {}
    for gpu in gpus:
        key = tuple(sorted(gpu.get("cpu_affinity") or []))
        affinity_users[key] = affinity_users.get(key, 0) + 1
    plans, table, warnings, summary = [], [], [], []
    for gpu in gpus:
        sharing = affinity_users[tuple(sorted(gpu.get("cpu_affinity") or []))]
        plan, lines = plan_gpu(gpu, models, policy, sharing)
        plans.append(plan)
        table.extend(lines)
        warnings.extend(plan["warnings"])
        summary.append("GPU %s %s: %s, -c %d -np %d (%d tokens/slot), %s KV, %s%.1f GiB used + %.1f GiB headroom "
                       "of %.1f GiB, ceiling %.1f tok/s"
                       % (plan["gpu_index"], plan["gpu_name"], plan["quant"], plan["ctx_size"], plan["parallel"],
                          plan["ctx_per_slot"], plan["cache_type_k"],
                          "-ngl %d (partial), " % plan["n_gpu_layers"] if plan["partial_offload"] else "",
                          plan["memory"]["predicted_used_bytes"] / GIB, plan["memory"]["headroom_bytes"] / GIB,
                          plan["memory"]["gpu_total_bytes"] / GIB, plan["decode_ceiling_tps"]))
    return {"plans": plans, "table": table, "summary": "\n".join(summary), "warnings": warnings, "policy": policy}
