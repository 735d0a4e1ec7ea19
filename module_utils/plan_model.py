# -*- coding: utf-8 -*-
"""A model's shape for the planner: GGUF metadata (or a catalogue's declared
figures) in llama.cpp's names, turned into the layer layout, sizes and bits per
weight the memory arithmetic needs."""
from __future__ import absolute_import, division, print_function

__metaclass__ = type

import re

from ansible.module_utils.gguf_model import (
    RECURRENT_ARCHS, RECURRENT_STATE_BYTES_PER_VALUE, layer_layout, recurrent_state_values)
from ansible.module_utils.input_schema import SchemaError, check_model_metadata
from ansible.module_utils.plan_memory import PlanError, gib

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


# The fewest bits a weight any llama.cpp quantization stores (IQ1_S: 1.5625 bits in
# the blocks, more with the tensors kept at higher precision).
MIN_BITS_PER_WEIGHT = 1.5


def quant_bpw(label):
    """Bits per weight of a quantization label (case-insensitive), or None."""
    if not label:
        return None
    return QUANT_BPW.get(str(label).upper())

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


def _check_metadata(meta, size_bytes, name):
    """Refuse metadata a plan would turn into nonsense (-c -1024, -ngl -4, an
    infinite ceiling) or a traceback: input_schema's table, the same gguf_info
    applies to a file; names the candidate, the key, the value and what is expected."""
    try:
        meta = check_model_metadata(meta, RECURRENT_ARCHS)
    except SchemaError as err:
        raise PlanError("metadata of candidate %s: %s" % (name, err))
    if size_bytes is not None and (isinstance(size_bytes, bool) or not str(size_bytes).strip().isdigit()):
        raise PlanError("candidate %s: size_bytes is %r, not a byte count" % (name, size_bytes))
    return meta


def model_from_metadata(quant, meta, size_bytes=None, path=None, source="declared"):
    """The planner's view of one candidate.

    quant: its label (Q4_K_M, ...); meta: what gguf_info returns (or a subset with
    the structural keys); size_bytes: the file size when planning before download.
    Weights come from the file's tensor table when meta describes this very
    quantization, else from size_bytes, else from parameters x bits per weight."""
    meta = _canonical(meta)
    label = str(quant or meta.get("file_type") or "").upper() or None
    if label is not None and not re.match(r"^[A-Z0-9][A-Z0-9_.-]{0,31}$", label):
        raise PlanError("candidate quant %r is not a quantization label (like Q4_K_M: letters, digits and _ only)"
                        % (quant or meta.get("file_type"),))
    name = label or path or "?"
    meta = _check_metadata(meta, size_bytes, name)
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
    if params and weight_bytes * 8.0 / params < MIN_BITS_PER_WEIGHT:
        raise PlanError("candidate %s: %d bytes for %d parameters is %.3f bits a weight, below any llama.cpp "
                        "quantization (IQ1_S is about 1.6): a truncated file or a wrong size_bytes; download it "
                        "again or fix size_bytes" % (name, weight_bytes, params, weight_bytes * 8.0 / params))
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
    # the query's width (heads x key length), for the compute buffer's attention point
    head_k = int(meta.get("key_length") or (n_embd // int(heads) if heads else 0))
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
        "q_values": int(heads) * head_k,
        "n_vocab": n_vocab,
        "n_ctx_train": int(meta.get("context_length") or 0),
        # the parameters (the prompt's arithmetic: 2 x params per token)
        "params": params,
        "layers": layers,
        "window": int(meta.get("sliding_window") or 0),
        "recurrent_bytes_per_layer": rec_layer,
        "architecture": meta.get("architecture"),
        "notes": notes,
    }
