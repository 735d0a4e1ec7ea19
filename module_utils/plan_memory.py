# -*- coding: utf-8 -*-
"""The memory and speed arithmetic of a llama-server process on one GPU: what
the weights, KV cache, compute buffer and CUDA context take, whether it fits,
and the decode ceiling the card's bandwidth allows. Engine-neutral figures
apart from the constants measured for llama.cpp; docs/planning.md explains
each. Free of Ansible (unit-tested); Python 3.8-compatible (Ubuntu 20.04)."""
from __future__ import absolute_import, division, print_function

__metaclass__ = type

from ansible.module_utils.gguf_model import SWA_CELL_PAD, kv_row_bytes, round_up
from ansible.module_utils.plan_speed import gpu_family

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
# every major for now: the lookup is where a measured 11.8 figure goes. Once verify
# has measured processes on cards of a name (an H100 with CUDA 13: 505-509 MiB,
# benchmarks/results/gpu-host-2026-12-06-models), the plan budgets that median
# instead (plan_speed.measured_overhead), unless the policy sets overhead_bytes.
CUDA_OVERHEAD_MIB_BY_MAJOR = {11: 576, 12: 576, 13: 576}

CUDA_OVERHEAD_BYTES = CUDA_OVERHEAD_MIB_BY_MAJOR[13] * MIB

# What the driver keeps of the card before any process starts (NVML v1 counts it
# as used; v2 reports it as `reserved`, and nvidia-smi's memory.used leaves it out
# on R510+ drivers). NVML's own figure is used where the driver gives it; else this
# per-family table:
#   hopper  615 MiB  MEASURED: NVML v2 on an H200 (driver 580), before any process;
#                    its total includes it
#   volta   309 MiB  ASSUMED: "a few hundred MiB" on a V100 with R525; the harness
#                    profiles use it (NVIDIA publishes no figure). Older drivers' v1
#                    total may already leave it out (a V100-16GB shows 16160 MiB):
#                    driver_reserved_bytes() counts only what the total still holds
#   others  309 MiB  the same rule
DRIVER_RESERVED_MIB_BY_FAMILY = {"hopper": 615}

DRIVER_RESERVED_BYTES = 309 * MIB

DEFAULT_HEADROOM_BYTES = 512 * MIB

# Compute buffer (compute_bytes below; docs/planning.md, "Compute buffer"):
# activations are f32; the KQ mask is f16 with flash attention, f32 without
# (llama-graph.cpp build_attn_inp_kq_mask); the f16 copies of a quantized K/V
# that CUDA's flash attention makes are 2 bytes a value (ggml-cuda/fattn-common.cuh).
ACTIVATION_BYTES = 4

MASK_BYTES_FLASH_ATTN = 2

F16_BYTES = 2

FFN_LIVE_TENSORS = 3

# Embedding-wide (n_embd) and query-wide (n_head x head_dim) f32 tensors live
# beside the flash-attention node: the residual, the freed attention norm's
# hole, then the roped query and the attention output (2), or, with a gated
# query (the projection is query + gate, twice as wide), that projection (2),
# the freed normed query's hole, the roped query and the output (5). Read off
# ggml-alloc's placement of the pinned build's qwen2 and qwen35 graphs (an
# allocator trace of a CPU build; they reproduce the H200's 568 and 608 MiB).
ATTN_LIVE_EMBD = 2

ATTN_LIVE_QUERY = 2

ATTN_LIVE_QUERY_GATED = 5

# llama.cpp graphs whose query projection carries a gate (src/models/qwen35.cpp,
# qwen35moe.cpp, qwen3next.cpp: "Qcur_full", n_embd_head * 2 per head).
GATED_QUERY_ARCHS = ("qwen3next", "qwen35", "qwen35moe")

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


def driver_reserved_bytes(memory_total_bytes, reserved=DRIVER_RESERVED_BYTES):
    """Memory the driver holds before any process starts, that the reported total
    still includes. NVML reports either the whole card (as the harness profiles and
    newer drivers do) or the card less the driver's share (older drivers' v1 call:
    a V100-16GB shows 16160 MiB): what the total lacks up to the next whole GiB is
    taken as already reserved."""
    missing = round_up(memory_total_bytes, GIB) - memory_total_bytes
    return max(0, reserved - missing)


def flash_attn_supported(gpu):
    try:
        major, minor = (int(x) for x in str(gpu.get("compute_capability") or "0.0").split(".")[:2])
    except ValueError:
        return False
    return (major, minor) >= FLASH_ATTN_MIN_CC


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


def compute_bytes(model, ubatch, ctx_per_slot, flash_attn=True, cache_type="f16", parallel=1, kv_unified=False,
                  first_layer=0, outputs=None):
    """The CUDA compute buffer: the peak of ggml-alloc's worst-case graph.

    llama-context.cpp sched_reserve() sizes it on a prompt ubatch of ubatch
    tokens spread over every slot (n_seqs = parallel), with an output for each
    token (n_outputs = min(ubatch, n_batch)) and the KV cache at its full size
    (llama-kv-cache.cpp init_full: n_kv = the cache's cells per stream). Its peak
    is the largest of three points of the graph:

    - the output projection: the logits (n_vocab f32 per token) above one
      embedding-wide tensor. In a hybrid graph (qwen35) the residual stays above
      the KQ mask, which ggml-alloc places first (ggml-alloc.c: inputs are
      allocated before the nodes), so the mask and one more embedding-wide
      tensor lie below the logits as well; in the dense one (qwen2) the last
      layer's residual falls into the freed mask's place.
    - the flash-attention node of the widest attention layer: the KQ mask, the
      tensors live beside it (ATTN_LIVE_*), and, when the cache is not f16, the
      f16 copies of that layer's K and V views which CUDA's flash attention
      (MMA/tile kernels, a prompt ubatch) makes inside the node's own allocation
      (ggml-cuda.cu buffer_type_get_alloc_size -> fattn.cu
      ggml_cuda_flash_attn_ext_get_alloc_size): one K and one V row per cell of
      every stream, i.e. the whole -c, whatever the slot count.
      Without flash attention: the f32 scores and their softmax for every head.
    - the FFN: gate, up and their product, two embedding-wide tensors, the mask.

    outputs: the context's n_outputs_max where it is below the ubatch (a draft
    model's: one per slot, common/speculative.cpp common_base_params_to_speculative;
    llama-context.cpp reserves min(ubatch, n_outputs_max) outputs).
    cache_type: the K/V cache type; parallel: the slots (streams, unless
    kv_unified: one stream of ctx_per_slot x parallel cells, llama-server's
    default with -np auto only). Measured on an H200 (docs/planning.md): 307 MiB
    for the 32B shape whatever its f16 context, 568 MiB at -c 131072 -np 8 q8_0."""
    a = ACTIVATION_BYTES
    n_embd = model["n_embd"]
    layers = model["layers"][first_layer:]
    kinds = set(l["kind"] for l in layers)
    # cells of each attention cache one stream's mask covers (its n_kv at reserve)
    cells = {}
    if "full" in kinds:
        cells["full"] = ctx_per_slot * parallel if kv_unified else ctx_per_slot
    if "swa" in kinds:
        swa = swa_cells_per_slot(model, ctx_per_slot, ubatch)
        cells["swa"] = swa * parallel if kv_unified else swa
    streams = 1 if kv_unified else parallel
    # one KQ mask per attention cache: n_kv x ubatch (n_kv x ubatch/streams x streams)
    mask = ubatch * sum(cells.values()) * (MASK_BYTES_FLASH_ATTN if flash_attn else a)

    # logits of every output (n_outputs = ubatch, or fewer) above the last residual; a
    # hybrid graph keeps the mask (allocated first) and one more residual below them
    n_outputs = ubatch if outputs is None else min(ubatch, int(outputs))
    logits = n_outputs * a * (model["n_vocab"] + n_embd)
    if "recurrent" in kinds and cells:
        logits += mask + ubatch * a * n_embd
    # FFN: gate, up, their product (f32, n_ff wide), residual and norm, the mask
    ffn = ubatch * a * (FFN_LIVE_TENSORS * model["n_ff"] + 2 * n_embd) + mask
    if not cells:
        return max(logits, ffn)
    if flash_attn:
        query = model.get("q_values") or n_embd
        live_query = ATTN_LIVE_QUERY_GATED if model.get("architecture") in GATED_QUERY_ARCHS else ATTN_LIVE_QUERY
        # a non-f16 K/V: fattn.cu ggml_cuda_flash_attn_ext_get_alloc_size adds f16
        # copies of the layer's K and V views (n_kv x streams cells) to the node
        copies = 0
        if cache_type != "f16":
            for layer in layers:
                if layer["kind"] in cells:
                    values = layer["k_values"] + layer["v_values"]
                    copies = max(copies, F16_BYTES * values * cells[layer["kind"]] * streams)
        # mask + residual/norm + query-wide tensors (the node's own output included)
        attn = mask + ubatch * a * (ATTN_LIVE_EMBD * n_embd + live_query * query) + copies
    else:  # KQ scores and their softmax, f32, every head over the widest mask
        attn = mask + 2 * ubatch * max(cells.values()) * model["n_head"] * a
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


def card_reserved_bytes(gpu, policy):
    """What the driver keeps of the card whatever runs on it: policy.reserved_bytes, else
    NVML's own figure when the driver gives it (measured: 615 MiB on an H200, which the
    whole-GiB rule missed), else the GPU family's figure or the rule for older drivers."""
    reserved = policy["reserved_bytes"]
    if reserved is None:
        reserved = gpu.get("memory_reserved_bytes")
    if reserved is None:
        family_mib = DRIVER_RESERVED_MIB_BY_FAMILY.get(gpu_family(gpu))
        reserved = family_mib * MIB if family_mib else driver_reserved_bytes(int(gpu["memory_total_bytes"]))
    return reserved


def card_room_bytes(gpu, policy):
    """What a card gives its llama-server processes together: its memory less the
    driver's reservation, the policy's headroom and what other programs hold."""
    return (int(gpu["memory_total_bytes"]) - card_reserved_bytes(gpu, policy) - policy["headroom_bytes"]
            - int(gpu.get("memory_foreign_bytes") or 0))


def card_budget(model, gpu, policy, ctx_size, parallel, cache_type, n_gpu_layers=None):
    """The memory breakdown of one configuration on one GPU (bytes). A split
    group's is plan_split.split_budget's, built on this one."""
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
    # the roles always pass --parallel, so llama-server keeps one KV stream per slot
    compute = compute_bytes(model, ubatch, ctx_size // parallel, fa, cache_type, parallel, first_layer=first)
    reserved = card_reserved_bytes(gpu, policy)
    # the CUDA context verify measured on cards of this name (plan_speed.measured_overhead), else the policy's
    cuda = int(gpu.get("cuda_overhead_bytes") or policy["overhead_bytes"])
    overhead = cuda + reserved
    headroom = policy["headroom_bytes"]
    # what other processes hold on the card, when the policy plans around them (plan_around)
    foreign = int(gpu.get("memory_foreign_bytes") or 0)
    draft = draft_budget(model.get("draft"), policy, ctx_size, parallel, cache_type, fa)
    total = weights + caches["total"] + compute + overhead + headroom + foreign + draft["total"]
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
        "overhead_cuda_bytes": cuda,
        "overhead_driver_reserved_bytes": reserved,
        "foreign_bytes": foreign,
        # the card's used memory with the server loaded, as NVML counts it (v2 used
        # + reserved; v1 used): what verify compares with nvidia_gpu_facts
        "predicted_used_bytes": total - headroom,
        # the process's own use, what `nvidia-smi --query-compute-apps` shows
        "predicted_process_bytes": total - headroom - reserved - foreign,
        "free_bytes": total_card - total,
        "host_weights_bytes": model["token_embd_bytes"] if full_offload else model["weight_bytes"] - weights,
        # a draft model for speculative decoding, in the same process (0 without one)
        "draft_bytes": draft["total"],
        "draft_weights_bytes": draft["weights"],
        "draft_kv_bytes": draft["kv"],
        "draft_compute_bytes": draft["compute"],
    }


def draft_budget(draft, policy, ctx_size, parallel, cache_type, flash_attn=True):
    """What a draft model (-md) adds to its server's process: all its layers on the card
    (-ngld), a context of the target's size and slots (llama.cpp's draft context holds as
    many tokens per sequence as the target's, common/speculative.cpp) with the target's
    KV type (-ctkd/-ctvd), and its own compute buffer, whose logits are one per slot (the
    draft's n_outputs_max), not one per ubatch token. Zeros without a draft."""
    if not draft:
        return {"weights": 0, "kv": 0, "compute": 0, "total": 0}
    ubatch = policy["ubatch_size"]
    kv = cache_bytes(draft, ctx_size, parallel, cache_type, ubatch)["total"]
    compute = compute_bytes(draft, ubatch, ctx_size // parallel, flash_attn, cache_type, parallel, outputs=parallel)
    weights = draft["gpu_weight_bytes"]
    return {"weights": weights, "kv": kv, "compute": compute, "total": weights + kv + compute}


def fits(memory):
    """Every card holds its share (one card: the whole)."""
    return all(m["total_bytes"] <= m["gpu_total_bytes"] for m in memory.get("per_gpu") or [memory])


def card_ceiling(model, gpu, policy, ctx_per_slot, cache_type, n_gpu_layers=None):
    """Decode ceiling (tok/s) of one stream on one GPU with its slot filled to
    policy.kv_fill (a split group's: plan_split.split_ceiling)."""
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
