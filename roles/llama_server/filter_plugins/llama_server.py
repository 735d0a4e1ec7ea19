# -*- coding: utf-8 -*-
"""Render a GPU plan into llama-server's command line, keeping only flags the
installed build has (its --help, recorded by the llama_cpp stage)."""
from __future__ import absolute_import, division, print_function

__metaclass__ = type


def _on_off(value):
    if isinstance(value, str):
        return value if value in ("on", "off", "auto") else ("on" if value.lower() in ("true", "yes", "1") else "off")
    return "on" if value else "off"


def llama_server_args(plan, options, supported_flags):
    """plan: one entry of the planner's `plans`; options: host, port, alias,
    threads, metrics, api_key_file, lock_memory, llama_fit, extra_args.
    Returns {'args': [...], 'dropped': [flags the build lacks]}."""
    supported = set(supported_flags or [])
    wanted = [
        ("--model", plan["model_path"]),
        ("--alias", options.get("alias")),
        ("--host", options["host"]),
        ("--port", options["port"]),
        ("--ctx-size", plan["ctx_size"]),
        ("--parallel", plan["parallel"]),
        ("--n-gpu-layers", plan["n_gpu_layers"]),
        ("--cache-type-k", plan["cache_type_k"]),
        ("--cache-type-v", plan["cache_type_v"]),
        ("--flash-attn", _on_off(plan.get("flash_attn", True))),
        ("--batch-size", plan["batch_size"]),
        ("--ubatch-size", plan["ubatch_size"]),
        ("--threads", options["threads"]),
        ("--threads-batch", options["threads"]),
    ]
    if options.get("metrics"):
        wanted.append(("--metrics", None))
    if options.get("api_key_file"):
        wanted.append(("--api-key-file", options["api_key_file"]))
    if options.get("lock_memory"):
        # Newer builds replaced --mlock with --load-mode; use what this build has.
        wanted.append(("--load-mode", "mlock") if "--load-mode" in supported else ("--mlock", None))
    if not options.get("llama_fit", False):
        # The plan already fitted every value; llama.cpp must not change them silently.
        wanted.append(("--fit", "off"))
    args, dropped = [], []
    for flag, value in wanted:
        if flag not in supported:
            if flag in ("--model", "--ctx-size", "--parallel", "--port", "--host"):
                raise ValueError("the installed llama-server has no %s flag; it cannot run this plan" % flag)
            dropped.append(flag)
            continue
        args.append(flag)
        if value is not None:
            args.append(str(value))
    for extra in options.get("extra_args") or []:
        extra = str(extra)
        if extra.startswith("-") and extra.split("=", 1)[0] not in supported:
            raise ValueError("llama_server_extra_args has %s, which the installed llama-server does not know" % extra)
        args.append(extra)
    return {"args": args, "dropped": dropped}


def llama_server_instance(plan, base_port):
    """What the local fact records of one instance."""
    keys = ("gpu_index", "gpu_uuid", "model_path", "quant", "ctx_size", "parallel", "cache_type_k", "cache_type_v")
    entry = {key: plan.get(key) for key in keys}
    entry["port"] = int(base_port) + int(plan["gpu_index"])
    entry["unit"] = "llama-server@%s.service" % plan["gpu_index"]
    return entry


class FilterModule(object):
    def filters(self):
        return {"llama_server_args": llama_server_args, "llama_server_instance": llama_server_instance}
