#!/usr/bin/env python3
"""Write a random-weight GGUF of a real model's shape, to measure speed and memory
without downloading the model: the shape (and so every byte read per token and
every buffer llama.cpp allocates) is the real one; the text it writes is noise.

Default: the Qwen2.5-32B shape (arch qwen2, 64 layers, 5120 wide, 40 heads,
8 KV heads x 128, FFN 27648, vocabulary 152064, 32768 trained context), every
2-D weight Q4_K (144 bytes per 256 values, 4.5 bits per weight: 18.43 GB),
norms and attention biases f32. A SentencePiece-style vocabulary (byte fallback
plus filler pieces) padded to the shape's vocabulary size.

--shape qwen35-27b: the Qwen3.5-27B hybrid (arch qwen35, 64 layers, 5120 wide,
FFN 17408, vocabulary 248320, 262144 trained context): every 4th layer full
attention (24 heads, 4 KV heads x 256, gated query, M-RoPE on 64 of 256 dims),
the other 48 gated delta net (16 key heads, 48 value heads, 128 wide, conv
kernel 4); ssm_a, ssm_dt.bias and ssm_conv1d f32 too.

Tensor data is streamed: one pool of random Q4_K blocks (with small f16 scales,
so activations stay finite) is generated once and every tensor is a slice of it.

--draft (qwen25-32b): a draft model for speculative decoding of the same vocabulary
(152064 tokens, so llama.cpp pairs it with the 32B-shaped one): a Qwen2.5-0.5B-class
shape, 24 layers, 1024 wide (Q4_K rows must be a multiple of 256; the real 0.5B is
896), 16 heads, 2 KV heads x 64, FFN 4864: about 0.41 GB in Q4_K.

    python make_random_gguf.py OUT.gguf [--shape qwen25-32b|qwen35-27b] [--layers N] [--quick|--draft]
    # needs gguf-py (llama.cpp/gguf-py)
"""
import argparse
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "harness"))  # see tests/harness/paths.py
import gguf  # noqa: E402
from gguf_writer import (QWEN25_32B, QWEN35_27B, add_q4k_tensor_info, add_spm_vocab,  # noqa: E402
                         dense_tensors, hybrid_tensors, stream_random_q4k)

# --shape: (base shape, what --quick changes, general.name)
SHAPES = {
    "qwen25-32b": (QWEN25_32B,
                   dict(n_layer=2, n_embd=512, n_head=8, n_head_kv=2, head_dim=64, n_ff=1024, n_vocab=4096,
                        n_ctx=4096),
                   "random Qwen2.5-32B-shaped Q4_K (llm-fleet benchmark)"),
    # quick: one attention layer (the 4th) and three delta-net ones; the real head widths and
    # rope, so every width the loader checks keeps its meaning (and stays a multiple of 256)
    "qwen35-27b": (QWEN35_27B,
                   dict(n_layer=4, n_embd=512, n_head=2, n_head_kv=1, n_ff=1024, n_vocab=4096, n_ctx=4096,
                        ssm_k_heads=2, ssm_v_heads=6),
                   "random Qwen3.5-27B-shaped Q4_K (llm-fleet benchmark)"),
}


# --draft: (what it changes, general.name) per shape; the vocabulary is the shape's own
DRAFTS = {
    "qwen25-32b": (dict(n_layer=24, n_embd=1024, n_head=16, n_head_kv=2, head_dim=64, n_ff=4864),
                   "random Qwen2.5-0.5B-class draft Q4_K, Qwen2.5 vocabulary (llm-fleet benchmark)"),
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


def tensors_of(s):
    if s["arch"] == "qwen35":
        return hybrid_tensors(s["n_layer"], s["n_embd"], s["n_head"], s["n_head_kv"], s["head_dim"], s["n_ff"],
                              s["n_vocab"], s["ssm_k_heads"], s["ssm_v_heads"], s["ssm_head_dim"], s["ssm_conv"],
                              s["full_attn_interval"])
    return dense_tensors(s["n_layer"], s["n_embd"], s["n_head"], s["n_head_kv"], s["head_dim"], s["n_ff"],
                         s["n_vocab"], bias=True)


def add_hybrid_kv(writer, s):
    """What llama.cpp's qwen35 loader reads beyond the dense keys (as convert_hf_to_gguf.py writes it):
    head width (5120 / 24 is not it), partial rotary dims and their M-RoPE sections (required), the
    delta net's widths (required; state_size is both the key and the value head width)."""
    writer.add_key_length(s["head_dim"])
    writer.add_value_length(s["head_dim"])
    writer.add_rope_dimension_count(s["rope_dim"])
    writer.add_rope_dimension_sections(s["rope_sections"])
    writer.add_ssm_conv_kernel(s["ssm_conv"])
    writer.add_ssm_state_size(s["ssm_head_dim"])
    writer.add_ssm_group_count(s["ssm_k_heads"])
    writer.add_ssm_time_step_rank(s["ssm_v_heads"])
    writer.add_ssm_inner_size(s["ssm_v_heads"] * s["ssm_head_dim"])
    writer.add_full_attention_interval(s["full_attn_interval"])


def write(path, shape=None, name=SHAPES["qwen25-32b"][2], seed=0, base=QWEN25_32B):
    shape = dict(base, **(shape or {}))
    tensors = tensors_of(shape)
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
    if shape["arch"] == "qwen35":
        add_hybrid_kv(writer, shape)
    writer.add_file_type(gguf.LlamaFileType.MOSTLY_Q4_K_M)
    tokens, scores, types = vocabulary(shape["n_vocab"])
    add_spm_vocab(writer, tokens, scores, types)
    biggest = add_q4k_tensor_info(writer, tensors)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    total = stream_random_q4k(writer, tensors, biggest, seed)
    writer.close()
    return total


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out")
    parser.add_argument("--shape", choices=sorted(SHAPES), default="qwen25-32b",
                        help="qwen25-32b: dense (default); qwen35-27b: the hybrid")
    parser.add_argument("--layers", type=int, default=None, help="block count (default: the shape's)")
    parser.add_argument("--quick", action="store_true",
                        help="a small (512-wide, 2 layers; hybrid: 4) model of the same layout (tests)")
    parser.add_argument("--draft", action="store_true",
                        help="a 0.5B-class draft model of the shape's vocabulary (speculative decoding; qwen25-32b)")
    args = parser.parse_args()
    base, quick, name = SHAPES[args.shape]
    if args.draft and (args.quick or args.shape not in DRAFTS):
        parser.error("--draft: only with --shape %s and without --quick" % "/".join(sorted(DRAFTS)))
    shape = dict(quick) if args.quick else {}
    if args.draft:
        shape, name = dict(DRAFTS[args.shape][0]), DRAFTS[args.shape][1]
    if args.layers:
        shape["n_layer"] = args.layers
    start = time.time()
    tmp = args.out + ".part"
    total = write(tmp, shape, name, base=base)
    os.replace(tmp, args.out)
    print("wrote %s: %d tensor bytes, %d file bytes, in %.1f s" % (args.out, total, os.path.getsize(args.out),
                                                                   time.time() - start))
    return 0


if __name__ == "__main__":
    sys.exit(main())
