#!/usr/bin/env python3
"""Write a random-weight GGUF of a real model's shape, to measure speed and memory
without downloading the model: the shape (and so every byte read per token and
every buffer llama.cpp allocates) is the real one; the text it writes is noise.

Default: the Qwen2.5-32B shape (arch qwen2, 64 layers, 5120 wide, 40 heads,
8 KV heads x 128, FFN 27648, vocabulary 152064, 32768 trained context), every
2-D weight Q4_K (144 bytes per 256 values, 4.5 bits per weight: 18.43 GB),
norms and attention biases f32. A SentencePiece-style vocabulary (byte fallback
plus filler pieces) padded to the shape's vocabulary size.

Tensor data is streamed: one pool of random Q4_K blocks (with small f16 scales,
so activations stay finite) is generated once and every tensor is a slice of it.

    python make_random_gguf.py OUT.gguf [--layers 64] [--quick]   # needs gguf-py (llama.cpp/gguf-py)
"""
import argparse
import os
import sys
import time

import numpy as np

import gguf

QK_K = 256
Q4_K_BLOCK_BYTES = 144

QWEN25_32B = {
    "arch": "qwen2", "n_layer": 64, "n_embd": 5120, "n_head": 40, "n_head_kv": 8, "head_dim": 128,
    "n_ff": 27648, "n_vocab": 152064, "n_ctx": 32768, "rope_theta": 1000000.0, "eps": 1e-6,
}


def vocabulary(n_vocab):
    tokens = ["<unk>", "<s>", "</s>"]
    types = [gguf.TokenType.UNKNOWN, gguf.TokenType.CONTROL, gguf.TokenType.CONTROL]
    for byte in range(256):
        tokens.append("<0x%02X>" % byte)
        types.append(gguf.TokenType.BYTE)
    letters = [chr(c) for c in range(ord("a"), ord("z") + 1)] + [chr(c) for c in range(ord("A"), ord("Z") + 1)]
    for piece in ["\u2581"] + letters + ["\u2581" + c for c in letters]:
        tokens.append(piece)
        types.append(gguf.TokenType.NORMAL)
    n = 0
    while len(tokens) < n_vocab:
        tokens.append("\u2581w%d" % n)
        types.append(gguf.TokenType.NORMAL)
        n += 1
    scores = [-float(i) for i in range(len(tokens))]
    return tokens[:n_vocab], scores[:n_vocab], types[:n_vocab]


def block_pool(n_bytes, seed=0):
    """Random Q4_K blocks: d = 2^-10 and dmin = 2^-12 (f16), random 6-bit scales and 4-bit quants."""
    rng = np.random.default_rng(seed)
    n_blocks = (n_bytes + Q4_K_BLOCK_BYTES - 1) // Q4_K_BLOCK_BYTES
    pool = rng.integers(0, 256, size=(n_blocks, Q4_K_BLOCK_BYTES), dtype=np.uint8)
    pool[:, 0:2] = np.frombuffer(np.float16(2.0 ** -10).tobytes(), dtype=np.uint8)
    pool[:, 2:4] = np.frombuffer(np.float16(2.0 ** -12).tobytes(), dtype=np.uint8)
    return pool.reshape(-1)


def tensor_plan(shape):
    """[(name, numpy shape (rows, cols), kind)] of the qwen2 tensors; kind q4k or f32."""
    e, kv, ff, v = shape["n_embd"], shape["n_head_kv"] * shape["head_dim"], shape["n_ff"], shape["n_vocab"]
    q = shape["n_head"] * shape["head_dim"]
    out = [("token_embd.weight", (v, e), "q4k")]
    for i in range(shape["n_layer"]):
        p = "blk.%d." % i
        out += [
            (p + "attn_norm.weight", (e,), "norm"),
            (p + "attn_q.weight", (q, e), "q4k"), (p + "attn_q.bias", (q,), "bias"),
            (p + "attn_k.weight", (kv, e), "q4k"), (p + "attn_k.bias", (kv,), "bias"),
            (p + "attn_v.weight", (kv, e), "q4k"), (p + "attn_v.bias", (kv,), "bias"),
            (p + "attn_output.weight", (e, q), "q4k"),
            (p + "ffn_norm.weight", (e,), "norm"),
            (p + "ffn_gate.weight", (ff, e), "q4k"),
            (p + "ffn_up.weight", (ff, e), "q4k"),
            (p + "ffn_down.weight", (e, ff), "q4k"),
        ]
    out += [("output_norm.weight", (e,), "norm"), ("output.weight", (v, e), "q4k")]
    return out


def q4k_bytes(rows, cols):
    if cols % QK_K:
        raise ValueError("Q4_K rows must be a multiple of %d values, got %d" % (QK_K, cols))
    return rows * cols // QK_K * Q4_K_BLOCK_BYTES


def write(path, shape=None, name="random Qwen2.5-32B-shaped Q4_K (llm-fleet benchmark)", seed=0):
    shape = dict(QWEN25_32B, **(shape or {}))
    tensors = tensor_plan(shape)
    writer = gguf.GGUFWriter(path, shape["arch"])
    writer.add_name(name)
    writer.add_context_length(shape["n_ctx"])
    writer.add_embedding_length(shape["n_embd"])
    writer.add_block_count(shape["n_layer"])
    writer.add_feed_forward_length(shape["n_ff"])
    writer.add_head_count(shape["n_head"])
    writer.add_head_count_kv(shape["n_head_kv"])
    writer.add_rope_freq_base(shape["rope_theta"])
    writer.add_layer_norm_rms_eps(shape["eps"])
    writer.add_file_type(gguf.LlamaFileType.MOSTLY_Q4_K_M)
    tokens, scores, types = vocabulary(shape["n_vocab"])
    writer.add_tokenizer_model("llama")
    writer.add_token_list(tokens)
    writer.add_token_scores(scores)
    writer.add_token_types(types)
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_unk_token_id(0)
    writer.add_add_bos_token(True)

    biggest = 0
    for tname, tshape, kind in tensors:
        if kind == "q4k":
            nbytes = q4k_bytes(*tshape)
            biggest = max(biggest, nbytes)
            writer.add_tensor_info(tname, (tshape[0], nbytes // tshape[0]), np.dtype(np.uint8), nbytes,
                                   raw_dtype=gguf.GGMLQuantizationType.Q4_K)
        else:
            writer.add_tensor_info(tname, tshape, np.dtype(np.float32), int(np.prod(tshape)) * 4)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()

    pool = block_pool(biggest + 64 * Q4_K_BLOCK_BYTES, seed)
    rng = np.random.default_rng(seed + 1)
    offset = 0
    total = 0
    for tname, tshape, kind in tensors:
        if kind == "q4k":
            nbytes = q4k_bytes(*tshape)
            # rotate the start (whole blocks) so tensors are not byte-identical
            offset = (offset + 7 * Q4_K_BLOCK_BYTES) % (len(pool) - nbytes + 1) // Q4_K_BLOCK_BYTES * Q4_K_BLOCK_BYTES
            data = pool[offset:offset + nbytes]
        elif kind == "norm":
            data = np.ones(tshape, dtype=np.float32)
        else:
            data = (rng.standard_normal(tshape) * 0.01).astype(np.float32)
        writer.write_tensor_data(data)
        total += data.nbytes
    writer.close()
    return total


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out")
    parser.add_argument("--layers", type=int, default=QWEN25_32B["n_layer"])
    parser.add_argument("--quick", action="store_true", help="a 2-layer, 512-wide model of the same layout (tests)")
    args = parser.parse_args()
    shape = {"n_layer": args.layers}
    if args.quick:
        shape.update(n_layer=2, n_embd=512, n_head=8, n_head_kv=2, head_dim=64, n_ff=1024, n_vocab=4096, n_ctx=4096)
    start = time.time()
    tmp = args.out + ".part"
    total = write(tmp, shape)
    os.replace(tmp, args.out)
    print("wrote %s: %d tensor bytes, %d file bytes, in %.1f s" % (args.out, total, os.path.getsize(args.out),
                                                                   time.time() - start))
    return 0


if __name__ == "__main__":
    sys.exit(main())
