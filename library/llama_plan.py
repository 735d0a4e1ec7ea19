#!/usr/bin/python
# -*- coding: utf-8 -*-
from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
---
module: llama_plan
short_description: Plan llama-server for each GPU of a host from its memory, bandwidth and the model's metadata
description:
  - >-
    Given one host's GPUs (as C(nvidia_gpu_facts) returns them), candidate quantizations of
    a model and a policy, returns one plan per GPU (one llama-server instance per GPU):
    which quantization, C(-c), C(-np), KV cache type, offload, batch sizes, threads and NUMA
    node, with the memory budget behind it, the predicted decode ceiling and a paragraph
    saying why.
  - "Quantization: among the candidates that fit fully on the card with C(min_parallel)
    slots of C(min_ctx) tokens (with the most compact allowed cache type if need be), the
    best quality (highest bits per weight) whose expected decode meets C(min_decode_tps);
    if none does, the fastest expected that fits, with a warning. Ceiling = memory
    bandwidth / bytes read per token = weights on the GPU + the cache a stream reads with
    its slot C(kv_fill) full; expected = ceiling x the efficiency llama.cpp reaches on
    that GPU family with that weight type (the fleet's calibration, else a measured table)."
  - "Then slots and context: as many slots as possible up to C(target_parallel), each with at
    least C(min_ctx) tokens; then context up to C(target_ctx) in total (capped at the
    model's trained context per slot); f16 KV when it reaches that target, else the cache
    type in C(cache_types) that gives the most context."
  - Partial offload (layers in host memory) is planned only when nothing fits fully and
    C(allow_partial_offload) is true. When nothing fits, the module fails with the budget
    table of the smallest candidate and what to change.
  - On a host with two or more GPUs, one instance over all of them (C(split_mode) C(tensor)
    or C(layer)) is planned instead of one per GPU when it serves a better quantization
    that meets the floor, or meets the floor one card alone misses, or is the only fit;
    with the same quantization either way, one instance per GPU (about twice the
    aggregate, and a card lost leaves the other serving). Such a plan names every GPU in
    C(gpu_indices) and C(gpu_uuids), and each card's share in C(memory.per_gpu).
  - The arithmetic and every constant are explained in C(docs/planning.md).
options:
  gpus:
    description:
      - The host's GPUs, entries as C(nvidia_gpu_facts) returns them in
        C(ansible_facts.nvidia_gpus). Used keys are C(index), C(name), C(uuid),
        C(memory_total_bytes), C(memory_bandwidth_bytes_per_s), C(compute_capability),
        C(numa_node), C(cpu_affinity), C(pci_bus_id) and C(nvlink_peers) (a split's
        exchange between cards) and, for a warning only, C(memory_used_bytes).
    type: list
    elements: dict
    required: true
  candidates:
    description:
      - The quantizations to choose from. Each is either C({quant, path}), a local GGUF
        file read with the same code as C(gguf_info) (any shard of a split model), or
        C({quant, size_bytes, metadata}) to plan before downloading, where C(metadata) is
        what C(gguf_info) returns for the model (any quantization of it) and C(size_bytes)
        the file size of this quantization. When both a C(path) and C(metadata) are given,
        the file is read if it exists, else the declared figures are used and the plan's
        C(model_path) is the path (where the file will be).
      - C(quant) is the label (C(Q4_K_M), ...); optional with a C(path) (the file's
        C(general.file_type) is used). Other keys (a URL, a checksum) are ignored and
        returned with the plan in C(candidate).
    type: list
    elements: dict
  models:
    description:
      - Several models on the host instead of one (C(candidates) and C(policy)), in priority
        order; each C({name, candidates, policy, gpus, load}), C(candidates) and C(policy) as
        above, C(gpus) C(every) (an instance on every GPU, the first model's default) or a
        number of GPUs (default 1, those with the most room). Every resident model's memory
        is counted on its card; a model that fits nowhere beside those before it fails the
        module by name with the figures. C(load) C(on_demand) (default C(resident)) plans a
        model for llama-server's router, alone in what the resident models leave (the
        resident ones keep the largest on-demand minimum free), and C(routers) gives each
        card's C(--models-max). Each plan then has C(model_name), and
        C(placement) says which GPU holds which models (C(docs/planning.md), several
        models on one host). An entry may have a C(draft), as the option below.
    type: list
    elements: dict
  draft:
    description:
      - A draft model for speculative decoding (C(policy.speculative) C(draft-simple)), in a
        candidate's form. Its weights, a KV cache of the target's context, slots and type, and
        its compute buffer are budgeted on the card before the target's context is spent, so
        the configuration is the same with the draft on or off; its vocabulary must be the
        target's (llama.cpp refuses a difference over 128 tokens). A plan with a draft is
        not split over GPUs.
    type: dict
  policy:
    description:
      - What the service needs; every key is optional.
      - C(min_ctx) (int, default 4096) tokens per slot at least.
      - C(target_ctx) (int, default 32768) tokens in total to aim for; this is C(-c), which
        llama.cpp shares across the slots.
      - C(min_parallel) (int, default 1) and C(target_parallel) (int, default 4) slots (C(-np)).
      - C(objective) (str, default C(latency)) C(latency) plans C(target_parallel) slots sharing
        C(target_ctx), each stream's speed first; C(throughput) plans the most slots of
        C(min_ctx) that fit (up to C(max_parallel), int, default 16), with the KV type whose
        expected aggregate is highest, and spends the memory left on context per slot.
      - C(cache_types) (list, default C([f16, q8_0])) KV cache types allowed, in order of
        preference; among C(f16), C(q8_0), C(q4_0).
      - C(headroom_bytes) (int, default 536870912 = 512 MiB) left free on the card.
      - C(min_decode_tps) (float, default 25) floor on the expected single-stream decode
        (the ceiling times the decode efficiency of the GPU family and weight type).
      - C(allow_partial_offload) (bool, default false).
      - C(allow_split) (bool, default true) one instance over all the host's GPUs may be
        planned (see above); C(split_modes) (list, default C([layer])) the modes to
        consider; C(tensor) is experimental at the pinned llama.cpp, so it is planned only where
        listed here (C([tensor, layer])); C(row) does not load on CUDA. Each card of a split keeps
        640 MiB more headroom than one card alone, and a split on a GPU family where none was
        measured (all but Hopper) says so in its warnings.
      - C(prefer_split) (bool, default false) one instance over all the GPUs whenever a split
        fits, even when each card alone serves the same quantization (one endpoint, the
        cards' KV together, a faster stream with C(tensor)).
      - C(backend_sampling) (str or bool, default C(auto)) sample on the GPU
        (llama-server C(--backend-sampling), experimental at the pinned llama.cpp); C(auto) is
        on for the C(throughput) objective only, where it was measured faster.
      - C(overhead_bytes) (int, default 603979776 = 576 MiB) CUDA context, cuBLAS workspace
        and pool of one llama-server process.
      - C(reserved_bytes) (int, default computed per card) memory the driver holds before any
        process; by default 309 MiB less what the reported total already lacks up to a
        whole GiB.
      - C(ubatch_size) (int, default 512) and C(batch_size) (int, default 2048).
      - C(threads) (int, default the physical cores of the GPU's C(cpu_affinity), split
        between GPUs that share it).
      - C(kv_fill) (float, default 0.5) how full a slot is for the decode ceiling.
      - C(host_memory_bandwidth_bytes_per_s) (float, default 100e9) used for the ceiling of a
        partial offload only.
    type: dict
    default: {}
  calibration:
    description:
      - The fleet's measured decode efficiencies, as the verify stage keeps them on the
        controller (C({version, records})); a record counts for GPUs of the same name
        (then family), weight type family and architecture kind. Empty or omitted - the
        built-in table of C(module_utils/plan_speed.py) only. Each plan says which figure
        it used (C(decode_efficiency.source)).
    type: dict
    default: {}
requirements:
  - gguf (only for candidates given by C(path))
  - Exactly one of C(candidates) and C(models).
notes:
  - Supports check mode; it only reads.
  - >-
    Deterministic: the plan depends on the card's total memory, not on what is in use,
    so a rerun while llama-server runs plans the same.
author: llm-fleet
"""

EXAMPLES = r"""
- name: Read the GPUs
  nvidia_gpu_facts:

- name: Plan before downloading (metadata from gguf_info of any quantization's header)
  llama_plan:
    gpus: "{{ ansible_facts.nvidia_gpus }}"
    candidates:
      - {quant: Q3_K_S, size_bytes: 14386352128, metadata: "{{ model_header }}"}
      - {quant: Q4_K_M, size_bytes: 19845357568, metadata: "{{ model_header }}"}
      - {quant: Q5_K_M, size_bytes: 23262157056, metadata: "{{ model_header }}"}
    policy:
      target_ctx: 32768
      target_parallel: 4
  register: llama_plan_result

- name: Plan with local files
  llama_plan:
    gpus: "{{ ansible_facts.nvidia_gpus }}"
    candidates:
      - path: /srv/models/Qwen2.5-32B-Instruct-Q3_K_S.gguf
      - path: /srv/models/Qwen2.5-32B-Instruct-Q4_K_M.gguf
    policy:
      cache_types: [f16, q8_0, q4_0]
      min_decode_tps: 35

- name: Show the budget
  ansible.builtin.debug:
    msg: "{{ llama_plan_result.table }}"
"""

RETURN = r"""
placement:
  description: With C(models), which resident models each GPU holds (GPU index to model names, in priority order).
  returned: success, with C(models)
  type: dict
routers:
  description:
    - With C(models), one entry per GPU holding models loaded on demand, C({gpu_index, models,
      models_max, room_bytes, reason}); C(models_max) is the most of them that fit together in
      C(room_bytes), what the resident models leave (at least one).
  returned: success, with C(models)
  type: list
  elements: dict
plans:
  description: One plan per GPU, in the order of C(gpus) (with C(models), per model and GPU, with C(model_name)).
  returned: success
  type: list
  elements: dict
  contains:
    gpu_index: {description: NVML index of the GPU (C(CUDA_VISIBLE_DEVICES) for its instance)., type: int}
    gpu_uuid: {description: UUID of the GPU., type: str}
    gpu_name: {description: Name of the GPU., type: str}
    quant: {description: Chosen quantization label., type: str, sample: Q4_K_M}
    candidate_index: {description: Index of the chosen entry in C(candidates)., type: int}
    candidate: {description: The chosen candidate as given (without its metadata)., type: dict}
    model_path: {description: Path of the chosen file (null for a declared candidate without one)., type: str}
    ctx_size: {description: "C(-c): tokens of context in total, shared by the slots.", type: int, sample: 32768}
    ctx_per_slot: {description: ctx_size / parallel, the tokens each slot holds., type: int, sample: 8192}
    parallel: {description: "C(-np): slots (concurrent sequences).", type: int, sample: 4}
    cache_type_k: {description: "C(-ctk): K cache type.", type: str, sample: f16}
    cache_type_v: {description: "C(-ctv): V cache type (same as K).", type: str, sample: f16}
    n_gpu_layers: {description: "C(-ngl): block_count + 1 (every layer and the output) unless partial.", type: int}
    partial_offload: {description: True when some layers stay in host memory., type: bool}
    flash_attn: {description: "C(-fa on) when true: compute capability 7.0 or later.", type: bool}
    batch_size: {description: "C(-b).", type: int, sample: 2048}
    ubatch_size: {description: "C(-ub).", type: int, sample: 512}
    threads: {description: "C(-t): physical cores near the GPU.", type: int, sample: 20}
    numa_node: {description: NUMA node of the GPU (for numactl / CPUAffinity)., type: int}
    decode_ceiling_tps: {description: Predicted single-stream decode ceiling with a slot C(kv_fill) full., type: float}
    expected_decode_tps:
      description: Expected single-stream decode, tok/s - the ceiling x the decode efficiency (less ~6% for a quantized KV).
      type: float
    expected_aggregate_tps:
      description: Expected decode summed over every slot busy - single stream x parallel ** aggregate_exponent.
      type: float
    decode_efficiency:
      description: The efficiency used and where it comes from.
      type: dict
      contains:
        value: {description: Measured decode / ceiling., type: float, sample: 0.32}
        source: {description: The measurement behind it (a calibration median, a table entry, or the default)., type: str}
        from: {description: "C(calibration), C(table) or C(default).", type: str}
        gpu_family: {description: From the compute capability (volta, hopper, ...)., type: str}
        quant_family: {description: The weight type's kernel family (Q4_K for Q4_K_M)., type: str}
        arch: {description: "C(dense) or C(hybrid) (sliding-window or recurrent layers).", type: str}
        aggregate_exponent: {description: Exponent of the aggregate over slots., type: float}
    reason:
      description: Why this quantization, context, slots and cache type; what was rejected and why.
      type: str
    memory:
      description: The budget of the plan on the GPU, in bytes; total_bytes is the sum of the first five.
      type: dict
      contains:
        weights_bytes: {description: Weights on the GPU (all tensors less the token embeddings kept in host memory)., type: int}
        kv_bytes: {description: "Every cache for ctx_size: full-attention KV + sliding-window KV + recurrent state.", type: int}
        compute_bytes: {description: CUDA compute buffer at ubatch_size., type: int}
        overhead_bytes: {description: CUDA context/cuBLAS/pool of the process + the driver's reservation., type: int}
        headroom_bytes: {description: Left free on purpose., type: int}
        total_bytes: {description: Sum of the five above; never more than gpu_total_bytes., type: int}
        gpu_total_bytes: {description: The card's memory as NVML reports it., type: int}
        kv_full_attention_bytes: {description: Part of kv_bytes in full-attention layers., type: int}
        kv_sliding_window_bytes: {description: Part of kv_bytes in sliding-window layers., type: int}
        recurrent_state_bytes: {description: Part of kv_bytes in recurrent state., type: int}
        overhead_cuda_bytes: {description: Part of overhead_bytes for the process., type: int}
        overhead_driver_reserved_bytes: {description: Part of overhead_bytes the driver holds., type: int}
        predicted_used_bytes:
          description: >-
            The card's used memory with the server loaded, as NVML counts it (v2 used + reserved, v1 used):
            total less headroom. verify compares it with nvidia_gpu_facts' memory_used_bytes.
          type: int
        predicted_process_bytes:
          description: >-
            The process's own use, what nvidia-smi --query-compute-apps shows - predicted_used_bytes less
            the driver's reservation.
          type: int
        free_bytes: {description: gpu_total_bytes - total_bytes (beyond the headroom)., type: int}
        host_weights_bytes: {description: Weights kept in host memory., type: int}
    warnings: {description: This GPU's warnings., type: list, elements: str}
    server_args:
      description: >-
        The plan as llama-server arguments, without host, port and API key; C(-m) is
        C(MODEL.gguf) when the candidate has no path. Ends with C(-fit off) so llama.cpp's
        own fitting does not change the plan.
      type: list
      elements: str
    candidates:
      description: Every candidate's figures at the minimum configuration and the verdict on it.
      type: list
      elements: dict
table:
  description: The budget table of every GPU, as lines of text (GiB), ending with each plan's line.
  returned: always
  type: list
  elements: str
summary:
  description: One line per GPU.
  returned: success
  type: str
plan_warnings:
  description: >-
    Every plan's warnings, as plain strings (the module also emits each as an Ansible
    warning, which ansible-core reports under its own C(warnings) key).
  returned: success
  type: list
  elements: str
policy:
  description: The policy used, defaults filled in.
  returned: success
  type: dict
"""

import os
import traceback

from ansible.module_utils.basic import AnsibleModule, missing_required_lib

from ansible.module_utils.fleet_errors import fail
from ansible.module_utils.gguf_model import GGUFError, read_model
from ansible.module_utils.llama_plan import plan_host
from ansible.module_utils.plan_explain import plan_summary
from ansible.module_utils.plan_memory import PlanError
from ansible.module_utils.plan_model import model_from_metadata
from ansible.module_utils.plan_models import place_models
from ansible.module_utils.llama_plan import attach_draft


def load_candidates(candidates):
    """Candidates -> planner models; raises PlanError / GGUFError / ImportError."""
    models, warnings = [], []
    for index, cand in enumerate(candidates):
        if not isinstance(cand, dict):
            raise PlanError("candidates[%d] must be a dict with quant and path, or quant, size_bytes and metadata; "
                            "got %r" % (index, cand))
        quant, path = cand.get("quant"), cand.get("path")
        metadata, size = cand.get("metadata"), cand.get("size_bytes")
        if path and os.path.exists(path):
            meta = read_model(path)
            if quant and meta.get("file_type") and str(quant).upper() != str(meta["file_type"]).upper():
                warnings.append("candidates[%d]: quant %s but %s says %s; planned as %s"
                                % (index, quant, path, meta["file_type"], quant))
            model = model_from_metadata(quant or meta.get("file_type"), meta, path=meta["model_path"], source="file")
        elif metadata:
            if not isinstance(metadata, dict):
                raise PlanError("candidates[%d].metadata must be a dict (what gguf_info returns), got %r"
                                % (index, type(metadata).__name__))
            if not quant:
                raise PlanError("candidates[%d] declares metadata without quant: name its quantization" % index)
            if size is not None:
                try:
                    size = int(size)
                except (TypeError, ValueError):
                    raise PlanError("candidates[%d].size_bytes must be a whole number, got %r" % (index, size))
            model = model_from_metadata(quant, metadata, size_bytes=size, path=path, source="declared")
        elif path:
            raise PlanError("candidates[%d]: %s does not exist; download it first, or declare size_bytes and metadata "
                            "(gguf_info of any quantization of the model) to plan before the download" % (index, path))
        else:
            raise PlanError("candidates[%d] (%s) has neither path nor metadata" % (index, quant or "no quant"))
        model["candidate_index"] = index
        model["candidate"] = dict((k, v) for k, v in cand.items() if k != "metadata")
        models.append(model)
    return models, warnings


def load_draft(draft):
    """The draft model (a candidate's form: quant and path, or quant, size_bytes and
    metadata) as a planner model, or None."""
    if not draft:
        return None
    try:
        (model,), _ = load_candidates([draft])
    except PlanError as err:
        raise PlanError(str(err).replace("candidates[0]", "the draft model", 1))
    return model


def host_memory_bytes():
    """The host's RAM (MemTotal), which bounds the instances' prompt caches; None when
    /proc/meminfo cannot be read."""
    try:
        with open("/proc/meminfo") as handle:
            for line in handle:
                if line.startswith("MemTotal:"):
                    return int(line.split()[1]) * 1024
    except (IOError, OSError, ValueError, IndexError):
        return None
    return None


def plan_several(gpus, entries, calibration):
    """place_models over the entries' candidates loaded as load_candidates does:
    (result with a summary line per plan, load warnings named by model)."""
    placed, warnings = [], []
    for index, entry in enumerate(entries):
        if not isinstance(entry.get("candidates"), list):
            raise PlanError("models[%d] (%s) needs candidates, a list as the candidates option takes"
                            % (index, entry.get("name") or "no name"))
        models, load_warnings = load_candidates(entry["candidates"])
        warnings.extend("%s: %s" % (entry.get("name"), w) for w in load_warnings)
        placed.append(dict((k, v) for k, v in entry.items() if k not in ("candidates", "draft")))
        placed[-1]["models"] = attach_draft(models, load_draft(entry.get("draft")), entry.get("policy"),
                                            "model %s" % entry.get("name"))
    result = place_models(gpus, placed, calibration, host_memory_bytes())
    result["summary"] = "\n".join("%s: %s" % (p["model_name"], plan_summary(p)) for p in result["plans"])
    return result, warnings


def main():
    module = AnsibleModule(
        argument_spec={
            "gpus": {"type": "list", "elements": "dict", "required": True},
            "candidates": {"type": "list", "elements": "dict"},
            "models": {"type": "list", "elements": "dict"},
            "draft": {"type": "dict"},
            "policy": {"type": "dict", "default": {}},
            "calibration": {"type": "dict", "default": {}},
        },
        required_one_of=[("candidates", "models")],
        mutually_exclusive=[("candidates", "models")],
        supports_check_mode=True,
    )
    try:
        if module.params["models"]:
            result, load_warnings = plan_several(module.params["gpus"], module.params["models"],
                                                 module.params["calibration"] or None)
        else:
            models, load_warnings = load_candidates(module.params["candidates"])
            models = attach_draft(models, load_draft(module.params["draft"]), module.params["policy"])
            result = plan_host(module.params["gpus"], models, module.params["policy"] or {},
                               module.params["calibration"] or None, host_memory_bytes())
    except ImportError:
        fail(module, missing_required_lib("gguf", reason="to read the candidates given by path"),
             exception=traceback.format_exc())
    except (GGUFError, PlanError) as err:
        fail(module, str(err), table=str(err).splitlines())
    result["warnings"] = load_warnings + result["warnings"]
    for warning in result["warnings"]:
        module.warn(warning)
    module.exit_json(changed=False, plan_warnings=result["warnings"], **dict(
        (k, result[k]) for k in ("plans", "table", "summary", "policy", "placement", "routers") if k in result))


if __name__ == "__main__":
    main()
