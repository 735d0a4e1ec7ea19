# -*- coding: utf-8 -*-
"""What the project accepts as input, typed, in one place: the GGUF metadata keys it
reads (gguf_info and the planner check the same table) and the GPU facts the planner
plans from. Each check returns the value normalised or raises SchemaError naming the
key, the value and what llama.cpp (or the planner) expects; callers add the file or
the GPU. Free of Ansible; Python 3.8-compatible (Ubuntu 20.04 hosts run it)."""
from __future__ import absolute_import, division, print_function

__metaclass__ = type

import math
import re

# llama.cpp's own bounds (src/llama-hparams.h, src/llama-cparams.h, ggml/include/ggml.h)
LLAMA_MAX_LAYERS = 512
LLAMA_MAX_SEQ = 256
GGML_MAX_DIMS = 4


class SchemaError(ValueError):
    """A value outside what the project (and llama.cpp) accepts. `key` names it."""

    def __init__(self, key, message):
        super(SchemaError, self).__init__("%s %s" % (key, message))
        self.key = key


def _shown(value):
    """A value as an error shows it: repr, cut short (a hostile 1 MB string stays readable)."""
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def whole(key, value, lo, hi, expects="", text_ok=False):
    """An integer in lo..hi (bools, floats and strings are refused: llama.cpp reads these
    keys with a fixed integer type). text_ok: a string of digits is taken (a value
    templated from an inventory)."""
    if text_ok and isinstance(value, str) and value.strip().isdigit():
        value = int(value.strip())
    if isinstance(value, bool) or not isinstance(value, int):
        raise SchemaError(key, "is %s (%s), not a whole number%s" % (_shown(value), type(value).__name__,
                                                                   "; " + expects if expects else ""))
    if not lo <= value <= hi:
        raise SchemaError(key, "is %d, outside %d..%d%s" % (value, lo, hi, "; " + expects if expects else ""))
    return value


def number(key, value, lo, hi, expects="", lo_open=False):
    """A finite real number in lo..hi (lo excluded when lo_open); NaN and infinity refused."""
    if isinstance(value, str):
        try:
            value = float(value.strip())
        except ValueError:
            pass
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise SchemaError(key, "is %s, not a number%s" % (_shown(value), "; " + expects if expects else ""))
    value = float(value)
    if math.isnan(value) or math.isinf(value) or value < lo or value > hi or (lo_open and value == lo):
        raise SchemaError(key, "is %s, outside %s%s..%s%s" % (value, "(" if lo_open else "", lo, hi,
                                                              "; " + expects if expects else ""))
    return value


_TRUE, _FALSE = ("true", "yes", "on", "1"), ("false", "no", "off", "0")


def boolean(key, value):
    """true/false; the strings an inventory may hold ("false", "no", "0") mean false."""
    if isinstance(value, bool):
        return value
    if isinstance(value, int) and value in (0, 1):
        return bool(value)
    if isinstance(value, str) and value.strip().lower() in _TRUE + _FALSE:
        return value.strip().lower() in _TRUE
    raise SchemaError(key, "is %s, not true or false" % _shown(value))


def text(key, value, pattern=None, max_len=256, expects=""):
    """A string of at most max_len characters without control characters (a newline in a
    label ends up in a plan, a unit file, a log line), matching pattern when given."""
    if not isinstance(value, str):
        raise SchemaError(key, "is %s, not a string" % _shown(value))
    if len(value) > max_len or re.search(r"[\x00-\x1f\x7f]", value) or (pattern and not re.match(pattern, value)):
        raise SchemaError(key, "is %s%s" % (_shown(value), "; " + expects if expects else
                                           "; expected at most %d printable characters" % max_len))
    return value


# --- GGUF metadata ---------------------------------------------------------------
# name (gguf_info's output and the planner's metadata) -> (GGUF key, "{arch}" for the
# architecture's prefix; kind; lo; hi; what llama.cpp expects). Kinds: "count" a whole
# number; "layers" a whole number or one per layer (block_count entries); "pattern"
# sliding_window_pattern: a period or one bool per layer.
_LAYERS = "llama.cpp loads at most LLAMA_MAX_LAYERS (%d) layers" % LLAMA_MAX_LAYERS
GGUF_KEYS = {
    "block_count": ("{arch}.block_count", "count", 1, LLAMA_MAX_LAYERS, _LAYERS),
    "embedding_length": ("{arch}.embedding_length", "count", 1, 1 << 20, "the model's hidden size"),
    "feed_forward_length": ("{arch}.feed_forward_length", "layers", 0, 1 << 22, "the FFN width"),
    "head_count": ("{arch}.attention.head_count", "layers", 0, 1 << 14, "attention heads"),
    "head_count_kv": ("{arch}.attention.head_count_kv", "layers", 0, 1 << 14, "KV heads"),
    "key_length": ("{arch}.attention.key_length", "count", 1, 1 << 16, "the K head size"),
    "value_length": ("{arch}.attention.value_length", "count", 1, 1 << 16, "the V head size"),
    "key_length_swa": ("{arch}.attention.key_length_swa", "count", 1, 1 << 16, "the sliding-window K head size"),
    "value_length_swa": ("{arch}.attention.value_length_swa", "count", 1, 1 << 16, "the sliding-window V head size"),
    "context_length": ("{arch}.context_length", "count", 1, 1 << 26, "the trained context in tokens"),
    "vocab_size": ("{arch}.vocab_size", "count", 1, 1 << 24, "the vocabulary size"),
    "sliding_window": ("{arch}.attention.sliding_window", "count", 0, 1 << 26, "the window in tokens"),
    "sliding_window_pattern": ("{arch}.attention.sliding_window_pattern", "pattern", 0, LLAMA_MAX_LAYERS,
                               "a period or one bool per layer"),
    "full_attention_interval": ("{arch}.full_attention_interval", "count", 1, LLAMA_MAX_LAYERS,
                                "every how many layers attention is full"),
    "nextn_predict_layers": ("{arch}.nextn_predict_layers", "count", 0, LLAMA_MAX_LAYERS, "MTP layers"),
    "ssm_conv_kernel": ("{arch}.ssm.conv_kernel", "count", 0, 1 << 10, "the SSM convolution width"),
    "ssm_inner_size": ("{arch}.ssm.inner_size", "count", 0, 1 << 20, "the SSM inner size"),
    "ssm_state_size": ("{arch}.ssm.state_size", "count", 0, 1 << 16, "the SSM state size"),
    "ssm_group_count": ("{arch}.ssm.group_count", "count", 0, 1 << 14, "SSM groups"),
    "ssm_time_step_rank": ("{arch}.ssm.time_step_rank", "count", 0, 1 << 16, "the SSM time-step rank"),
    "wkv_head_size": ("{arch}.wkv.head_size", "count", 0, 1 << 12, "the RWKV head size"),
    "token_shift_count": ("{arch}.token_shift_count", "count", 0, 16, "RWKV token shifts"),
    "shortconv_l_cache": ("{arch}.shortconv.l_cache", "count", 0, 1 << 10, "the short-convolution cache"),
    "file_type_id": ("general.file_type", "count", 0, 1 << 16, "a llama_ftype"),
}
# keys of the file's layout, not the model's shape
GGUF_LAYOUT_KEYS = {
    "general.alignment": ("count", 1, 1 << 30, "a power of two (ggml: GGUF_DEFAULT_ALIGNMENT is 32)"),
    "split.count": ("count", 1, 99999, "gguf-split writes NAME-0000n-of-0000N.gguf"),
    "split.tensors.count": ("count", 0, 1 << 32, "the tensors of all shards"),
}
ARCH_PATTERN = r"^[a-z0-9][a-z0-9_.-]{0,63}$"
# the planner's own figures (gguf_info computes them; a catalogue may declare them)
PLANNER_KEYS = {
    "parameter_count": (0, 1 << 50), "weight_bytes": (0, 1 << 50), "token_embd_bytes": (0, 1 << 50),
    "output_bytes": (0, 1 << 50),
}


def _check_value(key, kind, lo, hi, expects, value, n_layer, text_ok):
    if kind == "pattern" and isinstance(value, (list, tuple)):
        if n_layer is not None and len(value) != n_layer:
            raise SchemaError(key, "has %d entries for %d layers; %s" % (len(value), n_layer, expects))
        return [boolean("%s[%d]" % (key, i), v) for i, v in enumerate(value)]
    if kind in ("layers", "pattern") and isinstance(value, (list, tuple)):
        if n_layer is not None and len(value) != n_layer:
            raise SchemaError(key, "has %d entries for %d layers; one per layer or a single number" % (
                len(value), n_layer))
        return [whole("%s[%d]" % (key, i), v, lo, hi, expects, text_ok) for i, v in enumerate(value)]
    return whole(key, value, lo, hi, expects, text_ok)


def check_gguf_fields(fields):
    """A GGUF file's metadata {key: value} checked against GGUF_KEYS and
    GGUF_LAYOUT_KEYS (only the keys present); the architecture's name first."""
    arch = fields.get("general.architecture")
    if arch is not None:
        text("general.architecture", arch, ARCH_PATTERN, 64,
             "expected an architecture name llama.cpp knows, like llama or gemma3")
    if fields.get("general.name") is not None:
        text("general.name", fields["general.name"], None, 1024)
    for key, (kind, lo, hi, expects) in GGUF_LAYOUT_KEYS.items():
        if key in fields:
            whole(key, fields[key], lo, hi, expects)
    alignment = fields.get("general.alignment")
    if alignment is not None and alignment & (alignment - 1):
        raise SchemaError("general.alignment", "is %d, not a power of two" % alignment)
    if not arch:
        return
    n_layer = None
    present = {}
    for name, (pattern, kind, lo, hi, expects) in GGUF_KEYS.items():
        key = pattern.format(arch=arch)
        if key in fields:
            present[name] = (key, kind, lo, hi, expects, fields[key])
    if "block_count" in present:
        n_layer = _check_value(*present.pop("block_count"), n_layer=None, text_ok=False)
    for name, (key, kind, lo, hi, expects, value) in present.items():
        _check_value(key, kind, lo, hi, expects, value, n_layer, False)


def _per_layer(value, n_layer):
    return list(value) if isinstance(value, (list, tuple)) else [value] * n_layer


def check_model_metadata(meta, recurrent_archs=()):
    """The planner's metadata (gguf_info's names, or a catalogue's declared figures):
    every key of GGUF_KEYS and PLANNER_KEYS present checked, strings of digits taken,
    tied_embeddings a bool; then the shape as a whole: a model that is not recurrent
    has attention heads, and no layer more KV heads than heads. Returns the metadata
    with the checked values in place."""
    meta = dict(meta)
    n_layer = None
    if meta.get("block_count") is not None:
        n_layer = meta["block_count"] = whole("block_count", meta["block_count"], 1, LLAMA_MAX_LAYERS, _LAYERS, True)
    for name, (_key, kind, lo, hi, expects) in GGUF_KEYS.items():
        if name != "block_count" and meta.get(name) is not None:
            meta[name] = _check_value(name, kind, lo, hi, expects, meta[name], n_layer, True)
    for name, (lo, hi) in PLANNER_KEYS.items():
        if meta.get(name) is not None:
            meta[name] = whole(name, meta[name], lo, hi, "a byte or element count", True)
    if meta.get("tied_embeddings") is not None:
        meta["tied_embeddings"] = boolean("tied_embeddings", meta["tied_embeddings"])
    if meta.get("architecture") is not None:
        text("architecture", meta["architecture"], ARCH_PATTERN, 64,
             "expected an architecture name llama.cpp knows, like llama or gemma3")
    if n_layer and meta.get("head_count") is not None and meta.get("architecture") not in recurrent_archs:
        heads = _per_layer(meta["head_count"], n_layer)
        if not any(heads):
            raise SchemaError("head_count", "is 0 on every layer of a %s model; llama.cpp needs attention heads "
                                            "(only recurrent architectures have none)" % meta.get("architecture"))
        first = next((h for h in heads if h), 0)
        if meta.get("key_length") is None and meta.get("embedding_length") and first > meta["embedding_length"]:
            raise SchemaError("head_count", "is %d, above embedding_length (%d): no head size is left (a file "
                                            "that means it gives attention.key_length)" % (first, meta["embedding_length"]))
        if meta.get("head_count_kv") is not None:
            for il, (h, kv) in enumerate(zip(heads, _per_layer(meta["head_count_kv"], n_layer))):
                if h and kv > h:
                    raise SchemaError("head_count_kv", "is %d on layer %d, above its %d attention heads" % (kv, il, h))
    return meta


# --- GPU facts --------------------------------------------------------------------

def parse_cpu_list(key, value):
    """CPU numbers from a list of ints or the kernel's cpulist text ("0-19,40-59")."""
    if isinstance(value, str):
        cpus = []
        for part in [p.strip() for p in value.split(",") if p.strip()]:
            match = re.match(r"^(\d+)(?:-(\d+))?$", part)
            if not match or (match.group(2) and int(match.group(2)) < int(match.group(1))):
                raise SchemaError(key, "is %s, not a CPU list (like [0, 1, 2] or \"0-19,40-59\")" % _shown(value))
            first, last = int(match.group(1)), int(match.group(2) or match.group(1))
            if last - first > 65535:
                raise SchemaError(key, "is %s: a range of more than 65536 CPUs" % _shown(value))
            cpus.extend(range(first, last + 1))
        return cpus
    if not isinstance(value, (list, tuple)):
        raise SchemaError(key, "is %s, not a CPU list (like [0, 1, 2] or \"0-19,40-59\")" % _shown(value))
    return [whole("%s[%d]" % (key, i), cpu, 0, 65535, "a CPU number", True) for i, cpu in enumerate(value)]


_GPU_BYTES = 1 << 42  # 4 TiB: above any card
GPU_FACTS = {
    "memory_total_bytes": lambda k, v: whole(k, v, 1 << 20, _GPU_BYTES, "bytes, as nvidia_gpu_facts reports", True),
    "memory_bandwidth_bytes_per_s": lambda k, v: number(k, v, 0, 1e14, "bytes a second (a V100 is 9e11)", True),
    "memory_foreign_bytes": lambda k, v: whole(k, v, 0, _GPU_BYTES, "bytes", True),
    "memory_reserved_bytes": lambda k, v: whole(k, v, 0, _GPU_BYTES, "bytes", True),
    "memory_used_bytes": lambda k, v: whole(k, v, 0, _GPU_BYTES, "bytes", True),
    "numa_node": lambda k, v: whole(k, v, -1, 1023, "a NUMA node (-1: none)", True),
    "cpu_affinity": parse_cpu_list,
    "name": lambda k, v: text(k, v, None, 256),
}


def check_gpus(gpus):
    """The GPU facts the planner plans from: a list of dicts, each with a whole `index`
    and a `uuid` (both unique on the host), the keys of GPU_FACTS checked where present
    (memory_total_bytes and memory_bandwidth_bytes_per_s required). Returns the list
    with normalised copies; raises SchemaError naming the GPU and the key."""
    if not isinstance(gpus, (list, tuple)):
        raise SchemaError("gpus", "is %s, not a list of GPU facts" % _shown(gpus))
    out, indices, uuids = [], set(), set()
    for n, gpu in enumerate(gpus):
        where = "gpus[%d]" % n
        if not isinstance(gpu, dict):
            raise SchemaError(where, "is %s, not a dict of facts (nvidia_gpu_facts' entries)" % _shown(gpu))
        gpu = dict(gpu)
        if gpu.get("index") is None or gpu.get("uuid") is None:
            raise SchemaError(where, "has no %s: pass the entries nvidia_gpu_facts returns"
                              % ("index" if gpu.get("index") is None else "uuid"))
        gpu["index"] = whole(where + ".index", gpu["index"], 0, 1023, "the NVML index", True)
        gpu["uuid"] = text(where + ".uuid", gpu["uuid"], r"^[A-Za-z0-9_.:-]+$", 128, "expected a GPU UUID like GPU-8f1...")
        for key, seen in (("index", indices), ("uuid", uuids)):
            if gpu[key] in seen:
                raise SchemaError(where + "." + key, "is %s, which another GPU of the host has too" % _shown(gpu[key]))
            seen.add(gpu[key])
        for key in ("memory_total_bytes", "memory_bandwidth_bytes_per_s"):
            if gpu.get(key) is None:
                raise SchemaError("GPU %s" % gpu["index"], "has no %s: pass the entries nvidia_gpu_facts returns" % key)
        for key, check in GPU_FACTS.items():
            if gpu.get(key) is not None:
                gpu[key] = check("GPU %s %s" % (gpu["index"], key), gpu[key])
        if (gpu.get("memory_foreign_bytes") or 0) > gpu["memory_total_bytes"]:
            raise SchemaError("GPU %s memory_foreign_bytes" % gpu["index"], "(%d) is above the card's %d bytes" % (
                gpu["memory_foreign_bytes"], gpu["memory_total_bytes"]))
        out.append(gpu)
    return out
