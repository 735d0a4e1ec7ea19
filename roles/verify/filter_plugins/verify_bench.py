# -*- coding: utf-8 -*-
"""Whether and how the verify stage runs llama-bench on one instance.

llama-bench loads a second copy of the model beside the running server; these
filters decide from the instance's plan (the planner's own memory figures)
whether that copy fits in what the GPU has free, and render its command line
through the project's one llama.cpp flag table (module_utils/llama_flags.py)."""
from __future__ import absolute_import, division, print_function

__metaclass__ = type

import os

import ansible.module_utils

# Ansible ships module_utils/ to modules only; the controller maps the
# repository's copy, so a plugin and a module share one definition.
_MODULE_UTILS = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..",
                                              "module_utils"))
if _MODULE_UTILS not in ansible.module_utils.__path__:
    ansible.module_utils.__path__.append(_MODULE_UTILS)

from ansible.module_utils.llama_flags import BENCH, plan_argv  # noqa: E402
from ansible.module_utils.plan_memory import GIB, MIB, cuda_overhead_bytes  # noqa: E402
from ansible.module_utils.filter_input import guard_filters  # noqa: E402

# llama-bench's own KV cache: its -p/-n contexts are a few hundred tokens.
BENCH_KV_BYTES = 256 * MIB


def verify_bench_needs_bytes(plan, llama_cpp=None):
    """GPU memory a second copy of the model needs: weights, compute buffer, a CUDA
    context (the plan's, else the planner's figure for the build's CUDA) and a small KV."""
    memory = (plan or {}).get("memory") or {}
    overhead = memory.get("overhead_cuda_bytes")
    if overhead is None:
        overhead = cuda_overhead_bytes((llama_cpp or {}).get("cuda_version"))
    return int(memory.get("weights_bytes") or 0) + int(memory.get("compute_bytes") or 0) + int(overhead) \
        + BENCH_KV_BYTES


def verify_bench_decision(plan, gpu, llama_cpp, enabled=True, stop_server=False):
    """{'skip': why llama-bench does not run ('' when it runs), 'stops_server': bool}."""
    llama_cpp = llama_cpp or {}
    targets = llama_cpp.get("targets", ["llama-bench"])
    if not enabled:
        return {"skip": "disabled (verify_llama_bench: false)", "stops_server": False}
    if "llama-bench" not in targets:
        return {"skip": "the build has no llama-bench (targets: %s)" % " ".join(targets), "stops_server": False}
    needs = verify_bench_needs_bytes(plan, llama_cpp)
    free = int((gpu or {}).get("memory_free_bytes") or 0)
    short = llama_cpp.get("backend", "cpu") != "cpu" and free < needs
    if short and not stop_server:
        return {"skip": "needs %.1f GiB of GPU memory beside the running server, %.1f GiB free; set "
                        "verify_llama_bench_stop_server: true to stop the instance for the bench"
                        % (needs / GIB, free / GIB), "stops_server": False}
    return {"skip": "", "stops_server": short}


def verify_bench_argv(instance, plan, bin_dir, prompt_tokens, gen_tokens, repetitions, timeout_s):
    """llama-bench's command line (under timeout) for the instance's model and KV
    types with the plan's offload and flash attention."""
    plan = plan or {}
    settings = {"model_path": instance["model_path"], "n_gpu_layers": plan.get("n_gpu_layers", 999),
                "flash_attn": plan.get("flash_attn", True), "cache_type_k": instance["cache_type_k"],
                "cache_type_v": instance["cache_type_v"]}
    return (["timeout", str(timeout_s), "%s/llama-bench" % bin_dir] + plan_argv(settings, BENCH, short=True)
            + ["-p", str(prompt_tokens), "-n", str(gen_tokens), "-r", str(repetitions), "-o", "json"])


_KINDS = {
    "verify_bench_decision": {"plan": "dict?", "gpu": "dict?", "llama_cpp": "dict?"},
    "verify_bench_argv": {"instance": "dict", "plan": "dict?"},
}


class FilterModule(object):
    def filters(self):
        return guard_filters({
            "verify_bench_decision": verify_bench_decision,
            "verify_bench_argv": verify_bench_argv,
        }, _KINDS)
