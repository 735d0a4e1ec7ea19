#!/usr/bin/python
# -*- coding: utf-8 -*-
from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
---
module: gguf_info
short_description: Read a GGUF model's shape and cache arithmetic from its header
description:
  - >-
    Reads the header (metadata keys) and the tensor table of a GGUF model file, memory-mapped,
    with its own walk of the header (every length checked against the file's size); arrays
    as long as a vocabulary are walked but not decoded, and the tensor data is never read:
    a 20 GB model with a 152k-token vocabulary is described in under half a second (40x
    faster than decoding it with the C(gguf) package's C(GGUFReader), whose table of ggml
    type sizes is all it uses).
  - Returns the model's architecture and shape, its weight bytes (sum of the tensor
    table's sizes), parameter count, quantization label, and what llama.cpp will cache
    per token and per sequence, layer by layer as llama.cpp reads the model (full
    attention, sliding window, recurrent / linear attention, no cache).
  - >-
    A split model (C(NAME-00001-of-00003.gguf)) is one model: given any shard, every
    shard is read, and weights, tensors and file sizes are summed over all of them.
  - A missing, non-GGUF, truncated or inconsistent file fails with a message naming
    the file and what is wrong with it.
  - The result is the C(metadata) the C(llama_plan) module accepts for a candidate,
    so a plan can be made before a download from a header fetched separately.
options:
  path:
    description:
      - The GGUF file; for a split model, any of its shards (all must be in the same
        directory with the names llama.cpp gave them).
    type: path
    required: true
    aliases: [src]
requirements:
  - gguf (the gguf-py package of llama.cpp, 0.19 or later)
notes:
  - Supports check mode; it only reads.
  - >-
    Layer kinds follow llama.cpp: C(qwen3next)/C(qwen35)/C(qwen35moe) (or any model with
    C({arch}.full_attention_interval)) have full attention on every Nth layer and linear
    attention elsewhere; a per-layer C(head_count_kv) with 0 marks recurrent layers of
    other hybrids; C(gemma2)/C(gemma3)/C(cohere2)/C(gpt-oss) and models with
    C(sliding_window_pattern) use a sliding window on most layers. A sliding window on
    any other architecture is ignored, as llama.cpp does, and those layers count as full.
  - >-
    Approximations: the SWA per-sequence figure assumes llama-server's default ubatch
    (512); recurrent state is computed for Mamba-style, gated-delta-net, RWKV and LFM2
    short-conv layers from their C(ssm.*)/C(wkv.*)/C(shortconv.*) keys, and assumes no
    speculative decoding (which keeps extra state snapshots). MLA caches (DeepSeek) are
    counted with the plain head_count_kv x key_length formula.
author: llm-fleet
"""

EXAMPLES = r"""
- name: Describe the downloaded model
  gguf_info:
    path: /srv/models/Qwen2.5-32B-Instruct-Q4_K_M.gguf
  register: model_info
  vars:
    ansible_python_interpreter: /opt/llm-fleet/venv/bin/python

- name: Show what a cached token costs
  ansible.builtin.debug:
    msg: >-
      {{ model_info.architecture }} {{ model_info.file_type }}:
      {{ model_info.kv_bytes_per_token.f16 }} bytes of f16 KV per token,
      {{ (model_info.weight_bytes / 2**30) | round(2) }} GiB of weights

- name: Describe a split model from its first shard
  gguf_info:
    path: /srv/models/big-model-Q4_K_M-00001-of-00003.gguf
"""

RETURN = r"""
model_path:
  description: The file read (the first shard of a split model).
  returned: success
  type: str
files:
  description: Every file of the model, in shard order (one entry when not split).
  returned: success
  type: list
  elements: str
split_count:
  description: Number of files the model is split into (1 when not split).
  returned: success
  type: int
file_size_bytes:
  description: Size of the file(s) on disk, all shards together.
  returned: success
  type: int
  sample: 19845402112
tensor_count:
  description: Tensors in the tensor table(s), all shards together.
  returned: success
  type: int
architecture:
  description: C(general.architecture), e.g. C(qwen2), C(qwen35), C(gemma3).
  returned: success
  type: str
name:
  description: C(general.name), when present.
  returned: success
  type: str
file_type:
  description: >-
    Quantization label from C(general.file_type) (llama_ftype, named by gguf's
    LlamaFileType), e.g. C(Q4_K_M); when the key is absent, the tensor type holding
    the most bytes among 2-D tensors (e.g. C(Q4_K)).
  returned: success
  type: str
  sample: Q4_K_M
file_type_id:
  description: The raw C(general.file_type) value; null when absent.
  returned: success
  type: int
block_count:
  description: Layers (C({arch}.block_count)), including any trailing NextN/MTP blocks.
  returned: success
  type: int
  sample: 64
embedding_length:
  description: C({arch}.embedding_length) (hidden size).
  returned: success
  type: int
feed_forward_length:
  description: C({arch}.feed_forward_length); an int, or a per-layer list.
  returned: success
  type: raw
head_count:
  description: Attention (query) heads; an int, or a per-layer list.
  returned: success
  type: raw
head_count_kv:
  description: KV heads; an int, or a per-layer list where 0 means the layer has no KV.
  returned: success
  type: raw
key_length:
  description: Elements per K head (C(.attention.key_length), default embedding_length / head_count).
  returned: success
  type: int
value_length:
  description: Elements per V head (C(.attention.value_length), default embedding_length / head_count).
  returned: success
  type: int
context_length:
  description: Trained context length (C({arch}.context_length)).
  returned: success
  type: int
vocab_size:
  description: Vocabulary size (C({arch}.vocab_size), else the token embedding's rows, else the tokenizer's).
  returned: success
  type: int
parameter_count:
  description: Elements of all tensors (the parameter count).
  returned: success
  type: int
  sample: 32763876352
weight_bytes:
  description: Bytes of all tensors per the tensor table (what llama.cpp loads), all shards together.
  returned: success
  type: int
bits_per_weight:
  description: weight_bytes x 8 / parameter_count.
  returned: success
  type: float
token_embd_bytes:
  description: Bytes of C(token_embd.weight), which llama.cpp keeps in host memory.
  returned: success
  type: int
  sample: 437944320
output_bytes:
  description: Bytes of C(output.weight); 0 when the output layer is tied to the token embeddings.
  returned: success
  type: int
tied_embeddings:
  description: True when there is no C(output.weight) (llama.cpp then puts a copy of the embeddings on the GPU).
  returned: success
  type: bool
sliding_window:
  description: C({arch}.attention.sliding_window) in tokens; null when absent.
  returned: success
  type: int
sliding_window_pattern:
  description: C({arch}.attention.sliding_window_pattern) as stored (period or per-layer booleans); null when absent.
  returned: success
  type: raw
full_attention_interval:
  description: C({arch}.full_attention_interval); null when absent (qwen3next/qwen35 then use 4).
  returned: success
  type: int
nextn_predict_layers:
  description: Trailing NextN/MTP blocks, which hold no KV in the serving context; null when absent.
  returned: success
  type: int
key_length_swa:
  description: Elements per K head on sliding-window layers when they differ; null when absent.
  returned: success
  type: int
value_length_swa:
  description: Elements per V head on sliding-window layers when they differ; null when absent.
  returned: success
  type: int
ssm_conv_kernel:
  description: C({arch}.ssm.conv_kernel) of recurrent layers; null when absent.
  returned: success
  type: int
ssm_inner_size:
  description: C({arch}.ssm.inner_size); null when absent.
  returned: success
  type: int
ssm_state_size:
  description: C({arch}.ssm.state_size); null when absent.
  returned: success
  type: int
ssm_group_count:
  description: C({arch}.ssm.group_count); null when absent.
  returned: success
  type: int
ssm_time_step_rank:
  description: C({arch}.ssm.time_step_rank); null when absent.
  returned: success
  type: int
wkv_head_size:
  description: C({arch}.wkv.head_size) (RWKV); null when absent.
  returned: success
  type: int
token_shift_count:
  description: C({arch}.token_shift_count) (RWKV); null when absent.
  returned: success
  type: int
shortconv_l_cache:
  description: C({arch}.shortconv.l_cache) (LFM2); null when absent.
  returned: success
  type: int
layers:
  description: Layer indices by what llama.cpp caches for them.
  returned: success
  type: dict
  contains:
    full_attention:
      description: Layers with a KV cache as long as the context.
      type: list
      elements: int
    sliding_window:
      description: Layers whose KV cache holds only the window (per sequence).
      type: list
      elements: int
    recurrent:
      description: Linear-attention / SSM layers with a fixed-size state per sequence.
      type: list
      elements: int
    none:
      description: Layers with no cache in the serving context (e.g. MTP blocks, KV-less layers).
      type: list
      elements: int
full_attention_layer_count:
  description: Number of full-attention layers.
  returned: success
  type: int
sliding_window_layer_count:
  description: Number of sliding-window layers.
  returned: success
  type: int
recurrent_layer_count:
  description: Number of recurrent layers.
  returned: success
  type: int
kv_bytes_per_token:
  description: >-
    Bytes one cached token costs in the full-attention layers, by cache type:
    sum over those layers of K row + V row, a row being head_count_kv x key_length
    (value_length) values at 2 bytes (f16), 34 bytes per 32 (q8_0) or 18 per 32 (q4_0).
    The context-proportional part of llama.cpp's cache.
  returned: success
  type: dict
  sample: {f16: 262144, q8_0: 139264, q4_0: 73728}
swa_kv_bytes_per_token:
  description: Bytes one cached token costs in the sliding-window layers, by cache type.
  returned: success
  type: dict
swa_kv_bytes_per_sequence:
  description: >-
    Fixed bytes per sequence (slot) of the sliding-window layers, by cache type:
    (sliding_window + 512) rounded up to 256 cells x swa_kv_bytes_per_token.
  returned: success
  type: dict
recurrent_state_bytes_per_sequence:
  description: >-
    Fixed f32 bytes per sequence of all recurrent layers: ((conv_kernel - 1) x
    (inner_size + 2 x group_count x state_size) + state_size x inner_size) x 4 per layer
    (RWKV and LFM2 have their own formulas).
  returned: success
  type: int
  sample: 156893184
"""

import traceback

from ansible.module_utils.basic import AnsibleModule, missing_required_lib
from ansible.module_utils.fleet_errors import fail

try:
    import gguf  # noqa: F401  (imported again, lazily, by gguf_model)
except ImportError:
    HAS_GGUF = False
    GGUF_IMPORT_ERROR = traceback.format_exc()
else:
    HAS_GGUF = True
    GGUF_IMPORT_ERROR = None

from ansible.module_utils.gguf_model import GGUFError, read_model


def main():
    module = AnsibleModule(
        argument_spec={"path": {"type": "path", "required": True, "aliases": ["src"]}},
        supports_check_mode=True,
    )
    if not HAS_GGUF:
        fail(module, missing_required_lib("gguf", reason="to read GGUF headers (install it into the Python this "
                                                         "module runs with, e.g. the project's host venv)"),
             exception=GGUF_IMPORT_ERROR)
    try:
        info = read_model(module.params["path"])
    except GGUFError as err:
        fail(module, "Cannot describe the model: %s" % err)
    module.exit_json(changed=False, **info)


if __name__ == "__main__":
    main()
