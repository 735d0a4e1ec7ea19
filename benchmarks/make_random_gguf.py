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
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "harness"))  # see tests/harness/paths.py
import gguf  # noqa: E402
from gguf_writer import QWEN25_32B, add_q4k_tensor_info, add_spm_vocab, dense_tensors, stream_random_q4k  # noqa: E402


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


def write(path, shape=None, name="random Qwen2.5-32B-shaped Q4_K (llm-fleet benchmark)", seed=0):
    shape = dict(QWEN25_32B, **(shape or {}))
    tensors = dense_tensors(shape["n_layer"], shape["n_embd"], shape["n_head"], shape["n_head_kv"],
                            shape["head_dim"], shape["n_ff"], shape["n_vocab"], bias=True)
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
