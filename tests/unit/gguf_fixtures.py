"""Synthetic GGUF models for the unit tests, written sparse by tests/harness/gguf_writer.py.

The headers and tensor tables are real (real shapes and quantization types, so
the tensor table's byte counts are those of the real model), but no weight is
ever written: after the tensor table, each file is extended with truncate() to
the size its tensor data would take, which makes a sparse file. A 20 GB-shaped
32B model costs a few hundred KiB of disk and writes in well under a second.

Shapes (ggml order: ne0 first, as llama.cpp and the tensor table list them):
- dense_32b: Qwen2.5-32B (qwen2): 64 layers, 40 heads, 8 KV heads, head_dim 128,
  embedding 5120, ffn 27648, vocab 152064, untied output.
- hybrid_27b: Qwen3.5-27B (qwen35): 64 layers, every 4th full attention (24 heads,
  4 KV heads x 256), 48 gated-delta-net layers (16 key heads, 48 value heads,
  128 x 128, conv kernel 4), embedding 5120, ffn 17408, vocab 248320.
- gemma3_27b: Gemma-3-27B (gemma3): 62 layers, 32 heads, 16 KV heads x 128,
  embedding 5376, ffn 21504, vocab 262208, sliding window 1024 on 5 of every 6
  layers, tied embeddings.
"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "harness"))  # conftest does it too
from gguf import GGMLQuantizationType as Q  # noqa: E402
from gguf_writer import (F32, RECIPES, dense_32b, dense_tensors, ffn_tensors, file_type,  # noqa: E402,F401
                         hybrid_tensors, quantize, tensor_nbytes, use_more_bits, write_sparse)

write_gguf = write_sparse  # the name the tests know


def _common_kv(arch, name, ftype, n_layer, n_ctx, n_embd, n_ff, n_head, n_head_kv):
    return {
        "general.name": name,
        "general.file_type": file_type(ftype),
        "%s.block_count" % arch: n_layer,
        "%s.context_length" % arch: n_ctx,
        "%s.embedding_length" % arch: n_embd,
        "%s.feed_forward_length" % arch: n_ff,
        "%s.attention.head_count" % arch: n_head,
        "%s.attention.head_count_kv" % arch: n_head_kv,
    }


def hybrid_27b(path, ftype="Q4_K_M"):
    """Qwen3.5-27B-shaped hybrid: 16 full-attention layers, 48 gated-delta-net layers."""
    arch, n_layer, n_embd, n_ff, vocab = "qwen35", 64, 5120, 17408, 248320
    n_head, n_head_kv, hd = 24, 4, 256
    k_heads, v_heads, dk, dv, conv = 16, 48, 128, 128, 4
    kv = _common_kv(arch, "Qwen3.5-27B-synthetic", ftype, n_layer, 262144, n_embd, n_ff, n_head, n_head_kv)
    kv.update({
        "%s.attention.key_length" % arch: hd,
        "%s.attention.value_length" % arch: hd,
        "%s.full_attention_interval" % arch: 4,
        "%s.ssm.conv_kernel" % arch: conv,
        "%s.ssm.state_size" % arch: dk,
        "%s.ssm.group_count" % arch: k_heads,
        "%s.ssm.time_step_rank" % arch: v_heads,
        "%s.ssm.inner_size" % arch: v_heads * dv,
    })
    tensors = quantize(hybrid_tensors(n_layer, n_embd, n_head, n_head_kv, hd, n_ff, vocab, k_heads, v_heads, dk, conv),
                       ftype, n_layer)
    return write_gguf(path, arch, kv, tensors)


def gemma3_27b(path, ftype="Q4_K_M", write_pattern=False):
    """Gemma-3-27B-shaped: sliding window 1024 on 5 of every 6 layers, tied embeddings."""
    arch, n_layer, n_embd, n_ff, vocab = "gemma3", 62, 5376, 21504, 262208
    n_head, n_head_kv, hd = 32, 16, 128
    embd_t = RECIPES[ftype][3]
    kv = _common_kv(arch, "Gemma-3-27B-synthetic", ftype, n_layer, 131072, n_embd, n_ff, n_head, n_head_kv)
    kv.update({
        "%s.attention.key_length" % arch: hd,
        "%s.attention.value_length" % arch: hd,
        "%s.attention.sliding_window" % arch: 1024,
    })
    if write_pattern:
        kv["%s.attention.sliding_window_pattern" % arch] = 6
    tensors = quantize(dense_tensors(n_layer, n_embd, n_head, n_head_kv, hd, n_ff, vocab, tied=True),  # tied output
                       ftype, n_layer, embd_type=Q.Q6_K if embd_t != Q.Q8_0 else embd_t)
    return write_gguf(path, arch, kv, tensors)


def tiny(path, n_layer=2):
    """A small dense model (a few KiB of weights, written as holes too)."""
    arch = "llama"
    kv = _common_kv(arch, "tiny", "Q8_0", n_layer, 2048, 256, 512, 4, 2)
    tensors = [("token_embd.weight", (256, 1000), Q.Q8_0)]
    for i in range(n_layer):
        tensors += [
            ("blk.%d.attn_q.weight" % i, (256, 256), Q.Q8_0),
            ("blk.%d.attn_k.weight" % i, (256, 128), Q.Q8_0),
            ("blk.%d.attn_v.weight" % i, (256, 128), Q.Q8_0),
            ("blk.%d.attn_output.weight" % i, (256, 256), Q.Q8_0),
        ]
    tensors += [("output.weight", (256, 1000), Q.Q8_0)]
    return write_gguf(path, arch, kv, tensors)


def truncate(path, keep_bytes):
    """Cut a file to its first keep_bytes bytes (an interrupted download)."""
    with open(path, "r+b") as handle:
        handle.truncate(keep_bytes)
    return path


def write_big_vocab(path, vocab=152064, merges=151387):
    """The dense 32B shape with a real-sized BPE vocabulary in its header (tokens,
    types, merges): what makes a real Qwen header ~7 MB."""
    from gguf_writer import QWEN25_32B
    s, arch = QWEN25_32B, QWEN25_32B["arch"]
    kv = {
        "general.name": "Qwen2.5-32B-synthetic-vocab",
        "general.file_type": file_type("Q4_K_M"),
        "%s.block_count" % arch: 64,
        "%s.context_length" % arch: s["n_ctx"],
        "%s.embedding_length" % arch: s["n_embd"],
        "%s.feed_forward_length" % arch: s["n_ff"],
        "%s.attention.head_count" % arch: s["n_head"],
        "%s.attention.head_count_kv" % arch: s["n_head_kv"],
        "tokenizer.ggml.model": "gpt2",
        "tokenizer.ggml.tokens": ["tok%d" % i for i in range(vocab)],
        "tokenizer.ggml.token_type": [1] * vocab,
        "tokenizer.ggml.merges": ["m%d n%d" % (i, i) for i in range(merges)],
    }
    tensors = dense_tensors(64, s["n_embd"], s["n_head"], s["n_head_kv"], s["head_dim"], s["n_ff"], vocab, bias=True)
    return write_sparse(path, arch, kv, quantize(tensors, "Q4_K_M", 64))


def write_all(directory):
    """Every model the tests use, by name -> path of the file to give gguf_info."""
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    models = {
        "dense_q4km": dense_32b(d / "qwen2.5-32b-Q4_K_M.gguf", "Q4_K_M")[0],
        "dense_q3ks": dense_32b(d / "qwen2.5-32b-Q3_K_S.gguf", "Q3_K_S")[0],
        "hybrid_q4km": hybrid_27b(d / "qwen3.5-27b-Q4_K_M.gguf", "Q4_K_M")[0],
        "gemma3_q4km": gemma3_27b(d / "gemma-3-27b-Q4_K_M.gguf", "Q4_K_M")[0],
        "gemma3_pattern": gemma3_27b(d / "gemma-3-27b-pattern-Q4_K_M.gguf", "Q4_K_M", write_pattern=True)[0],
    }
    split = dense_32b(d / "qwen2.5-32b-split-Q4_K_M.gguf", "Q4_K_M", split_max_tensors=300)
    models["split_first"] = split[0]
    models["split_files"] = split
    models["tiny"] = tiny(d / "tiny.gguf")[0]
    models["truncated_data"] = truncate(tiny(d / "tiny-cut.gguf")[0], (d / "tiny-cut.gguf").stat().st_size - 1000)
    models["truncated_header"] = truncate(tiny(d / "tiny-head.gguf")[0], 200)
    not_gguf = d / "not-a-model.gguf"
    not_gguf.write_text("<html>404 Not Found</html>\n")
    models["not_gguf"] = not_gguf
    return models
