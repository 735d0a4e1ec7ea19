"""The project's one GGUF test-model writer (pure gguf-py, Python 3.9+).

The per-layer tensor layout of a dense llama-family model (dense_tensors) and of
the Qwen3.5 hybrid (hybrid_tensors) is written here once; three modes fill it:

- sparse (write_sparse): real header and tensor table, no weights: the file is
  extended with truncate() to the size of its data, so a 20 GB-shaped model
  costs a few hundred KiB of disk. Used by tests/unit/gguf_fixtures.py and
  molecule/model/files/make_standins.py.
- tiny f32 (add_random_f32): random f32 weights, norms one; a small model
  llama.cpp loads and serves (tests/harness/tiny_model.py).
- Q4_K random (add_q4k_tensor_info + stream_random_q4k): every weight a slice of
  one pool of random Q4_K blocks, streamed tensor by tensor, so memory stays
  bounded by the largest tensor (benchmarks/make_random_gguf.py).

Tensors are (name, ne, role, layer): ne in ggml order (ne0 first, as llama.cpp
lists them; numpy shape is reversed(ne)), role one of embd, norm, bias, weight,
more (attn_v/ffn_down: more bits in *_M quants), output, or one of the hybrid's other
f32 tensors (conv: ssm_conv1d, ssm_a, ssm_dt: F32_ROLES); layer None outside blocks.

Import (see tests/harness/paths.py): put tests/harness on sys.path, then
`import gguf_writer`.
"""
import math
from pathlib import Path

import numpy as np
import gguf
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType as Q, GGUFWriter, LlamaFileType

F32 = Q.F32
QK_K = 256
Q4_K_BLOCK_BYTES = 144

# Qwen2.5-32B (qwen2): the shape of the benchmarks' random model and of the tests' dense model.
QWEN25_32B = {
    "arch": "qwen2", "n_layer": 64, "n_embd": 5120, "n_head": 40, "n_head_kv": 8, "head_dim": 128,
    "n_ff": 27648, "n_vocab": 152064, "n_ctx": 32768, "rope_theta": 1000000.0, "eps": 1e-6,
}

# Qwen3.5-27B (qwen35): every 4th layer full attention (gated query, 256-wide heads, partial
# interleaved M-RoPE), the other 48 gated delta net (ssm_*: 16 key heads, 48 value heads, 128 wide).
QWEN35_27B = {
    "arch": "qwen35", "n_layer": 64, "n_embd": 5120, "n_head": 24, "n_head_kv": 4, "head_dim": 256,
    "n_ff": 17408, "n_vocab": 248320, "n_ctx": 262144, "rope_theta": 10000000.0, "eps": 1e-6,
    "rope_dim": 64, "rope_sections": [11, 11, 10, 0], "full_attn_interval": 4,
    "ssm_k_heads": 16, "ssm_v_heads": 48, "ssm_head_dim": 128, "ssm_conv": 4,
}

# roles stored f32 (the rest are quantized)
F32_ROLES = ("norm", "bias", "conv", "ssm_a", "ssm_dt")

RECIPES = {
    # ftype: (base type, type of attn_v/ffn_down in use_more_bits layers, output, token_embd)
    "Q3_K_S": (Q.Q3_K, Q.Q3_K, Q.Q6_K, Q.Q3_K),
    "Q4_K_M": (Q.Q4_K, Q.Q6_K, Q.Q6_K, Q.Q4_K),
    "Q5_K_M": (Q.Q5_K, Q.Q6_K, Q.Q6_K, Q.Q5_K),
    "Q8_0": (Q.Q8_0, Q.Q8_0, Q.Q8_0, Q.Q8_0),
}


def use_more_bits(i, n):
    """llama.cpp's rule for the layers whose attn_v/ffn_down get more bits in *_M quants."""
    return i < n // 8 or i >= 7 * n // 8 or (i - n // 8) % 3 == 2


def ffn_tensors(i, n_embd, n_ff):
    """A block's feed-forward tensors (SwiGLU), ffn_norm first."""
    p = "blk.%d." % i
    return [
        (p + "ffn_norm.weight", (n_embd,), "norm", i),
        (p + "ffn_gate.weight", (n_embd, n_ff), "weight", i),
        (p + "ffn_up.weight", (n_embd, n_ff), "weight", i),
        (p + "ffn_down.weight", (n_ff, n_embd), "more", i),
    ]


def dense_tensors(n_layer, n_embd, n_head, n_head_kv, head_dim, n_ff, n_vocab, bias=False, tied=False):
    """The tensors of a dense GQA llama-family model (llama, qwen2 with bias=True, gemma3 with tied=True)."""
    q, kv = n_head * head_dim, n_head_kv * head_dim
    out = [("token_embd.weight", (n_embd, n_vocab), "embd", None)]
    for i in range(n_layer):
        p = "blk.%d." % i
        out.append((p + "attn_norm.weight", (n_embd,), "norm", i))
        out.append((p + "attn_q.weight", (n_embd, q), "weight", i))
        if bias:
            out.append((p + "attn_q.bias", (q,), "bias", i))
        out.append((p + "attn_k.weight", (n_embd, kv), "weight", i))
        if bias:
            out.append((p + "attn_k.bias", (kv,), "bias", i))
        out.append((p + "attn_v.weight", (n_embd, kv), "more", i))
        if bias:
            out.append((p + "attn_v.bias", (kv,), "bias", i))
        out.append((p + "attn_output.weight", (q, n_embd), "weight", i))
        out += ffn_tensors(i, n_embd, n_ff)
    out.append(("output_norm.weight", (n_embd,), "norm", None))
    if not tied:
        out.append(("output.weight", (n_embd, n_vocab), "output", None))
    return out


def hybrid_tensors(n_layer, n_embd, n_head, n_head_kv, head_dim, n_ff, n_vocab,
                   ssm_k_heads, ssm_v_heads, ssm_head_dim, ssm_conv, full_attn_interval=4):
    """The tensors of a Qwen3.5 hybrid (qwen35): layer i is full attention when
    (i + 1) % full_attn_interval == 0 (attn_q holds query and output gate: 2 x n_head x head_dim
    rows), else gated delta net (key and value heads both ssm_head_dim wide, as llama.cpp reads
    them from ssm.state_size); post_attention_norm instead of ffn_norm; untied output."""
    kv = n_head_kv * head_dim
    value_dim = ssm_v_heads * ssm_head_dim
    conv_dim = 2 * ssm_k_heads * ssm_head_dim + value_dim  # q, k, v through the causal conv
    out = [("token_embd.weight", (n_embd, n_vocab), "embd", None)]
    for i in range(n_layer):
        p = "blk.%d." % i
        out.append((p + "attn_norm.weight", (n_embd,), "norm", i))
        if (i + 1) % full_attn_interval == 0:
            out += [
                (p + "attn_q.weight", (n_embd, n_head * head_dim * 2), "weight", i),  # query + output gate
                (p + "attn_q_norm.weight", (head_dim,), "norm", i),
                (p + "attn_k.weight", (n_embd, kv), "weight", i),
                (p + "attn_k_norm.weight", (head_dim,), "norm", i),
                (p + "attn_v.weight", (n_embd, kv), "more", i),
                (p + "attn_output.weight", (n_head * head_dim, n_embd), "weight", i),
            ]
        else:
            out += [
                (p + "attn_qkv.weight", (n_embd, conv_dim), "weight", i),
                (p + "attn_gate.weight", (n_embd, value_dim), "weight", i),
                (p + "ssm_conv1d.weight", (ssm_conv, conv_dim), "conv", i),
                (p + "ssm_a", (ssm_v_heads,), "ssm_a", i),
                (p + "ssm_dt.bias", (ssm_v_heads,), "ssm_dt", i),
                (p + "ssm_beta.weight", (n_embd, ssm_v_heads), "weight", i),
                (p + "ssm_alpha.weight", (n_embd, ssm_v_heads), "weight", i),
                (p + "ssm_norm.weight", (ssm_head_dim,), "norm", i),
                (p + "ssm_out.weight", (value_dim, n_embd), "weight", i),
            ]
        out.append((p + "post_attention_norm.weight", (n_embd,), "norm", i))
        out += ffn_tensors(i, n_embd, n_ff)[1:]  # no ffn_norm: post_attention_norm is it
    out.append(("output_norm.weight", (n_embd,), "norm", None))
    out.append(("output.weight", (n_embd, n_vocab), "output", None))
    return out


def quantize(tensors, ftype, n_layer, embd_type=None):
    """[(name, ne, GGMLQuantizationType)] of tensors under a RECIPES ftype."""
    base, more, out_t, embd_t = RECIPES[ftype]
    types = dict({role: F32 for role in F32_ROLES}, weight=base, output=out_t, embd=embd_type or embd_t)
    return [(name, ne, (more if use_more_bits(i, n_layer) else base) if role == "more" else types[role])
            for name, ne, role, i in tensors]


def tensor_nbytes(ne, qtype):
    block, size = GGML_QUANT_SIZES[qtype]
    n = math.prod(ne)
    assert n % block == 0, (ne, qtype)
    return n // block * size


def file_type(label):
    return int(getattr(LlamaFileType, "MOSTLY_" + label))


def _add_kv(writer, key, value):
    if isinstance(value, bool):
        writer.add_bool(key, value)
    elif isinstance(value, int):
        writer.add_uint32(key, value)
    elif isinstance(value, float):
        writer.add_float32(key, value)
    elif isinstance(value, str):
        writer.add_string(key, value)
    elif isinstance(value, (list, tuple)):
        writer.add_array(key, list(value))
    else:
        raise TypeError(key)


def write_sparse(path, arch, kv, tensors, split_max_tensors=0):
    """Sparse mode: write a GGUF file (or split set) whose weights are holes.
    kv is {key: value} (ints as uint32), tensors is [(name, ne, GGMLQuantizationType)].
    Returns the list of files written."""
    path = Path(path)
    writer = GGUFWriter(str(path), arch, split_max_tensors=split_max_tensors)
    for key, value in kv.items():
        _add_kv(writer, key, value)
    for name, ne, qtype in tensors:
        writer.add_tensor_info(name, tuple(reversed(ne)), np.float32, tensor_nbytes(ne, qtype), raw_dtype=qtype)
    files = writer.format_shard_names(path)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    align = writer.data_alignment
    for fout, shard in zip(writer.fout, writer.tensors):
        writer.write_padding(fout, fout.tell())
        data = sum(GGUFWriter.ggml_pad(ti.nbytes, align) for ti in shard.values())
        fout.truncate(fout.tell() + data)  # sparse: the weights are holes
    writer.close()
    return files


def add_spm_vocab(writer, tokens, scores, types, bos=1, eos=2, unk=0):
    """A SentencePiece-style ("llama") tokenizer."""
    writer.add_tokenizer_model("llama")
    writer.add_token_list(tokens)
    writer.add_token_scores(scores)
    writer.add_token_types(types)
    writer.add_bos_token_id(bos)
    writer.add_eos_token_id(eos)
    writer.add_unk_token_id(unk)
    writer.add_add_bos_token(True)


def f32_values(role, shape, rng):
    """Data of an f32 tensor (numpy shape) in the random modes, values that keep activations finite:
    norms one; ssm_a = -exp(A_log) in [-16, -1] and ssm_dt.bias = softplus^-1(dt), dt log-uniform
    in [0.001, 0.1], the Mamba-2 style initialisation (llama.cpp's decay exp(softplus(alpha + dt) * a)
    stays below one); conv kernels uniform +-1/sqrt(kernel) (torch's Conv1d default);
    biases normal(0, 0.01)."""
    if role == "norm":
        return np.ones(shape, dtype=np.float32)
    if role == "ssm_a":
        return -rng.uniform(1.0, 16.0, size=shape).astype(np.float32)
    if role == "ssm_dt":
        dt = np.exp(rng.uniform(math.log(1e-3), math.log(0.1), size=shape))
        return (dt + np.log(-np.expm1(-dt))).astype(np.float32)
    if role == "conv":
        bound = 1.0 / math.sqrt(shape[-1])
        return rng.uniform(-bound, bound, size=shape).astype(np.float32)
    return (rng.standard_normal(shape) * 0.01).astype(np.float32)


def add_random_f32(writer, tensors, rng, scale=0.05):
    """Tiny f32 mode: add every tensor with data, norms one (and the hybrid's ssm/conv tensors
    as f32_values makes them), the rest normal(0, scale)."""
    for name, ne, role, _ in tensors:
        shape = tuple(reversed(ne))
        if role in ("norm", "conv", "ssm_a", "ssm_dt"):
            writer.add_tensor(name, f32_values(role, shape, rng))
        else:
            writer.add_tensor(name, (rng.standard_normal(shape) * scale).astype(np.float32))


def q4k_bytes(rows, cols):
    if cols % QK_K:
        raise ValueError("Q4_K rows must be a multiple of %d values, got %d" % (QK_K, cols))
    return rows * cols // QK_K * Q4_K_BLOCK_BYTES


def q4k_block_pool(n_bytes, seed=0):
    """Random Q4_K blocks: d = 2^-10 and dmin = 2^-12 (f16), random 6-bit scales and 4-bit quants."""
    rng = np.random.default_rng(seed)
    n_blocks = (n_bytes + Q4_K_BLOCK_BYTES - 1) // Q4_K_BLOCK_BYTES
    pool = rng.integers(0, 256, size=(n_blocks, Q4_K_BLOCK_BYTES), dtype=np.uint8)
    pool[:, 0:2] = np.frombuffer(np.float16(2.0 ** -10).tobytes(), dtype=np.uint8)
    pool[:, 2:4] = np.frombuffer(np.float16(2.0 ** -12).tobytes(), dtype=np.uint8)
    return pool.reshape(-1)


def _is_f32(role):
    return role in F32_ROLES


def add_q4k_tensor_info(writer, tensors):
    """Q4_K random mode, step 1: the tensor table (every weight Q4_K, F32_ROLES f32).
    Returns the largest tensor's byte count."""
    biggest = 0
    for name, ne, role, _ in tensors:
        shape = tuple(reversed(ne))
        if _is_f32(role):
            writer.add_tensor_info(name, shape, np.dtype(np.float32), int(np.prod(shape)) * 4)
        else:
            nbytes = q4k_bytes(*shape)
            biggest = max(biggest, nbytes)
            writer.add_tensor_info(name, (shape[0], nbytes // shape[0]), np.dtype(np.uint8), nbytes,
                                   raw_dtype=gguf.GGMLQuantizationType.Q4_K)
    return biggest


def stream_random_q4k(writer, tensors, biggest, seed=0):
    """Q4_K random mode, step 2 (after the header, kv and tensor table are written): stream
    the data one tensor at a time. Returns the tensor bytes written."""
    pool = q4k_block_pool(biggest + 64 * Q4_K_BLOCK_BYTES, seed)
    rng = np.random.default_rng(seed + 1)
    offset = 0
    total = 0
    for _, ne, role, _ in tensors:
        shape = tuple(reversed(ne))
        if _is_f32(role):
            data = f32_values(role, shape, rng)
        else:
            nbytes = q4k_bytes(*shape)
            # rotate the start (whole blocks) so tensors are not byte-identical
            offset = (offset + 7 * Q4_K_BLOCK_BYTES) % (len(pool) - nbytes + 1) // Q4_K_BLOCK_BYTES * Q4_K_BLOCK_BYTES
            data = pool[offset:offset + nbytes]
        writer.write_tensor_data(data)
        total += data.nbytes
    return total


def dense_32b(path, ftype="Q4_K_M", split_max_tensors=0, n_layer=64):
    """Sparse mode, Qwen2.5-32B-shaped dense GQA model (the size a real ftype file has).
    Returns the list of files written."""
    s = QWEN25_32B
    arch = s["arch"]
    kv = {
        "general.name": "Qwen2.5-32B-synthetic",
        "general.file_type": file_type(ftype),
        "%s.block_count" % arch: n_layer,
        "%s.context_length" % arch: s["n_ctx"],
        "%s.embedding_length" % arch: s["n_embd"],
        "%s.feed_forward_length" % arch: s["n_ff"],
        "%s.attention.head_count" % arch: s["n_head"],
        "%s.attention.head_count_kv" % arch: s["n_head_kv"],
        "%s.attention.layer_norm_rms_epsilon" % arch: s["eps"],
    }
    tensors = dense_tensors(n_layer, s["n_embd"], s["n_head"], s["n_head_kv"], s["head_dim"], s["n_ff"],
                            s["n_vocab"], bias=True)
    return write_sparse(path, arch, kv, quantize(tensors, ftype, n_layer), split_max_tensors=split_max_tensors)
