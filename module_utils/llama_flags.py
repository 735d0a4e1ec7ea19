# -*- coding: utf-8 -*-
"""llama.cpp's command-line flags for a plan: the one place that says which
plan key is which flag of which llama.cpp program.

Every command line built from a plan goes through plan_argv (and run_flag for
the few flags that are no plan key): the planner's
`server_args` (short flags, to read), the llama_server role's unit (long flags,
filtered by the installed build's --help), llama-fit-params in the llm_model
role and llama-bench in the verify role. Pure Python (no Ansible imports): the
filter plugins load it on the controller too.
"""
from __future__ import absolute_import, division, print_function

__metaclass__ = type

SERVER = "llama-server"
FIT_PARAMS = "llama-fit-params"
BENCH = "llama-bench"
_ALL = (SERVER, FIT_PARAMS, BENCH)

# (plan key, long flag, short flag, the programs that take it), in command-line order.
# llama-bench sizes its own context (-p/-n) and batches; llama-fit-params has no
# --parallel (a server-only flag; -c is the total the slots share anyway).
PLAN_FLAGS = (
    ("model_path", "--model", "-m", _ALL),
    ("ctx_size", "--ctx-size", "-c", (SERVER, FIT_PARAMS)),
    ("parallel", "--parallel", "-np", (SERVER,)),
    ("n_gpu_layers", "--n-gpu-layers", "-ngl", _ALL),
    ("cache_type_k", "--cache-type-k", "-ctk", _ALL),
    ("cache_type_v", "--cache-type-v", "-ctv", _ALL),
    ("flash_attn", "--flash-attn", "-fa", _ALL),
    ("batch_size", "--batch-size", "-b", (SERVER, FIT_PARAMS)),
    ("ubatch_size", "--ubatch-size", "-ub", (SERVER, FIT_PARAMS)),
    ("split_mode", "--split-mode", "-sm", _ALL),
    ("tensor_split", "--tensor-split", "-ts", _ALL),
    # a switch (no value): the sampler chain in the model's graph on the GPU
    ("backend_sampling", "--backend-sampling", "-bs", (SERVER,)),
    # the prompt cache in host RAM (MiB) and how much of a slot's prompt a request must share to get it
    ("cache_ram_mib", "--cache-ram", "-cram", (SERVER,)),
    ("slot_prompt_similarity", "--slot-prompt-similarity", "-sps", (SERVER,)),
    # speculative decoding, where verify measured it pays (module_utils/speculation.py)
    ("spec_type", "--spec-type", "--spec-type", (SERVER,)),
    # its draft model (spec_type draft-simple): all its layers on the card, the target's KV type
    ("draft_model_path", "--model-draft", "-md", (SERVER,)),
    ("draft_n_gpu_layers", "--gpu-layers-draft", "-ngld", (SERVER,)),
    ("draft_cache_type_k", "--cache-type-k-draft", "-ctkd", (SERVER,)),
    ("draft_cache_type_v", "--cache-type-v-draft", "-ctvd", (SERVER,)),
)

# Plan keys whose flag takes no value: present when the plan's value is true. A plan
# recorded before the key existed runs without it.
_SWITCH_KEYS = ("backend_sampling",)
# Plan keys a plan recorded before them lacks: such a plan runs with llama.cpp's default.
_OPTIONAL_KEYS = ("cache_ram_mib", "slot_prompt_similarity", "spec_type", "draft_model_path", "draft_n_gpu_layers",
                  "draft_cache_type_k", "draft_cache_type_v")
# ... and the value that means llama.cpp's default, left off the command line
_OFF_VALUES = {"spec_type": "none"}

# Flags of llama-server that are no plan key, (name, long flag, short flag): the thread
# count (decode and batch alike), and llama.cpp's own fitting, which the server runs
# with off because the plan already fitted every value.
RUN_FLAGS = (
    ("threads", "--threads", "-t"),
    ("threads_batch", "--threads-batch", "-tb"),
    ("fit", "--fit", "-fit"),
)

# Only a plan over several GPUs carries these; a one-GPU plan leaves llama.cpp's
# own default (its only device holds everything) and its command line unchanged.
_SPLIT_KEYS = ("split_mode", "tensor_split")


def split_value(plan, key, program):
    """None when the plan runs on one GPU; else the flag's value. llama-bench
    separates the proportions with '/' (its ',' lists several test values)."""
    if plan.get("split_mode", "none") in ("none", None):
        return None
    if key == "split_mode":
        return str(plan["split_mode"])
    return ("/" if program == BENCH else ",").join("%g" % float(f) for f in plan["tensor_split"])


def flash_attn_value(value, program):
    """llama-server and llama-fit-params take on/off/auto; llama-bench takes 1/0."""
    if isinstance(value, str) and value in ("on", "off", "auto"):
        enabled = value
    elif isinstance(value, str):
        enabled = "on" if value.lower() in ("true", "yes", "1") else "off"
    else:
        enabled = "on" if value else "off"
    if program == BENCH:
        return "0" if enabled == "off" else "1"
    return enabled


def plan_flags(plan, program, short=False):
    """[(flag, value)] of a plan's settings that `program` takes, in order (value None:
    a switch). Every key the program takes must be in the plan (KeyError names it),
    but a switch, which is off when absent."""
    if program not in _ALL:
        raise ValueError("no llama.cpp flags are known for %r (known: %s)" % (program, ", ".join(_ALL)))
    pairs = []
    for key, long_flag, short_flag, programs in PLAN_FLAGS:
        if program not in programs:
            continue
        if key in _SPLIT_KEYS:
            value = split_value(plan, key, program)
            if value is None:
                continue
        elif key in _SWITCH_KEYS:
            if plan.get(key) is not True:
                continue
            value = None
        elif key == "flash_attn":  # plans recorded before it was planned ran with it on
            value = flash_attn_value(plan.get(key, True), program)
        elif key in _OPTIONAL_KEYS:
            if plan.get(key) is None or (key in _OFF_VALUES and plan[key] == _OFF_VALUES[key]):
                continue
            value = "%g" % plan[key] if isinstance(plan[key], float) else str(plan[key])
        else:
            value = str(plan[key])
        pairs.append((short_flag if short else long_flag, value))
    return pairs


def plan_argv(plan, program, short=False):
    """The flags of plan_flags as one argument list."""
    argv = []
    for flag, value in plan_flags(plan, program, short):
        argv.extend((flag,) if value is None else (flag, value))
    return argv


def run_flag(name, value, short=False):
    """(flag, value) of one of RUN_FLAGS."""
    for key, long_flag, short_flag in RUN_FLAGS:
        if key == name:
            return short_flag if short else long_flag, str(value)
    raise ValueError("no llama-server flag is known for %r (known: %s)" % (name, ", ".join(k for k, _, _ in RUN_FLAGS)))


# llama-server's router (--models-preset) starts each on-demand model's child from one
# INI section: keys are the long flags without their dashes, a switch is "true". The
# router sets a child's host, port and alias itself and keeps the API key and TLS for
# its own port (tools/server/server-models.cpp at the pinned commit: unset_reserved_args,
# update_args); a value ends at ';', '#' or the line's end (common/preset.cpp's grammar).
ROUTER_OWNED = ("--host", "--port", "--alias", "--api-key", "--api-key-file", "--ssl-key-file", "--ssl-cert-file")
_INI_FORBIDDEN = (";", "#", "\n", "\r")


def _is_flag(token):
    return (token.startswith("-") and len(token) > 1 and not token[1].isdigit()
            and token.lstrip("-")[:1].isalpha())


def preset_options(argv):
    """[(key, value)] of a llama-server argument list as a router preset section takes
    them; raises ValueError naming an argument the INI cannot hold."""
    options, seen, index = [], set(), 0
    while index < len(argv):
        token = str(argv[index])
        if not _is_flag(token):
            raise ValueError("argument %r is no flag and follows no flag that takes a value" % token)
        flag, _, value = token.partition("=")
        if not value and index + 1 < len(argv) and not _is_flag(str(argv[index + 1])):
            value = str(argv[index + 1])
            index += 1
        index += 1
        if flag in ROUTER_OWNED:
            continue
        key = flag.lstrip("-")
        if key in seen:
            raise ValueError("%s is given twice; a preset section holds each flag once" % flag)
        if any(c in value for c in _INI_FORBIDDEN) or value != value.strip():
            raise ValueError("%s's value %r cannot be written to the router's preset (llama.cpp's INI ends a value "
                             "at ';', '#' or a line break and trims spaces): rename the path or drop the argument"
                             % (flag, value))
        seen.add(key)
        options.append((key, value or "true"))
    return options


def router_preset(sections, comment=""):
    """The text of a --models-preset file: sections [(model name, llama-server argv)]."""
    lines = ["; %s" % line for line in comment.splitlines()] + ["version = 1", ""]
    for name, argv in sections:
        if not name or any(c in name for c in "[]" + "".join(_INI_FORBIDDEN)) or name != name.strip():
            raise ValueError("model name %r cannot name a router preset section" % (name,))
        lines.append("[%s]" % name)
        lines.extend("%s = %s" % pair for pair in preset_options(argv))
        lines.append("")
    return "\n".join(lines)
