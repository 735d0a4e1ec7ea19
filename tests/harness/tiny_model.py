"""Write a tiny but complete llama-architecture GGUF that llama.cpp loads and
serves on a CPU: random f32 weights, a small SentencePiece-style vocabulary with
byte fallback. Its text is noise; what matters is that the server loads it,
answers /health and completes prompts, so the service can be tested for real.

    python tiny_model.py OUT.gguf [--layers 2] [--embd 64] [--ctx 4096]
"""
import argparse

import numpy as np
import gguf

from gguf_writer import add_random_f32, add_spm_vocab, dense_tensors  # tests/harness: beside this file

WORDS = ["the", "of", "and", "to", "in", "is", "capital", "France", "Paris", "model", "GPU", "fast",
         "hello", "world", "llama", "server", "token", "test", "yes", "no"]


def vocabulary():
    tokens, scores, types = ["<unk>", "<s>", "</s>"], [0.0, 0.0, 0.0], [
        gguf.TokenType.UNKNOWN, gguf.TokenType.CONTROL, gguf.TokenType.CONTROL]
    for byte in range(256):
        tokens.append("<0x%02X>" % byte)
        scores.append(0.0)
        types.append(gguf.TokenType.BYTE)
    pieces = ["\u2581"] + [chr(c) for c in range(ord("a"), ord("z") + 1)] + ["\u2581" + w for w in WORDS]
    for rank, piece in enumerate(pieces):
        tokens.append(piece)
        scores.append(-float(rank))
        types.append(gguf.TokenType.NORMAL)
    return tokens, scores, types


def write(path, n_layer=2, n_embd=64, n_head=4, n_head_kv=2, n_ff=128, n_ctx=4096, seed=0):
    rng = np.random.default_rng(seed)
    tokens, scores, types = vocabulary()
    n_vocab = len(tokens)
    head_dim = n_embd // n_head
    writer = gguf.GGUFWriter(path, "llama")
    writer.add_name("llm-fleet tiny test model")
    writer.add_context_length(n_ctx)
    writer.add_embedding_length(n_embd)
    writer.add_block_count(n_layer)
    writer.add_feed_forward_length(n_ff)
    writer.add_head_count(n_head)
    writer.add_head_count_kv(n_head_kv)
    writer.add_rope_dimension_count(head_dim)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)
    add_spm_vocab(writer, tokens, scores, types)
    add_random_f32(writer, dense_tensors(n_layer, n_embd, n_head, n_head_kv, head_dim, n_ff, n_vocab), rng)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("path")
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--embd", type=int, default=64)
    parser.add_argument("--ctx", type=int, default=4096)
    args = parser.parse_args()
    write(args.path, n_layer=args.layers, n_embd=args.embd, n_ctx=args.ctx)


if __name__ == "__main__":
    main()
