"""Write a tiny but complete llama-architecture GGUF that llama.cpp loads and
serves on a CPU: random f32 weights, a small SentencePiece-style vocabulary with
byte fallback. Its text is noise; what matters is that the server loads it,
answers /health and completes prompts, so the service can be tested for real.

    python tiny_model.py OUT.gguf [--layers 2] [--embd 64] [--ctx 4096]
"""
import argparse

import numpy as np
import gguf

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
    writer.add_tokenizer_model("llama")
    writer.add_token_list(tokens)
    writer.add_token_scores(scores)
    writer.add_token_types(types)
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_unk_token_id(0)
    writer.add_add_bos_token(True)

    def tensor(name, *shape):
        # gguf-py takes numpy shapes (rows, cols); llama.cpp reads them reversed.
        writer.add_tensor(name, (rng.standard_normal(shape) * 0.05).astype(np.float32))

    tensor("token_embd.weight", n_vocab, n_embd)
    for i in range(n_layer):
        writer.add_tensor("blk.%d.attn_norm.weight" % i, np.ones(n_embd, dtype=np.float32))
        tensor("blk.%d.attn_q.weight" % i, n_embd, n_embd)
        tensor("blk.%d.attn_k.weight" % i, n_head_kv * head_dim, n_embd)
        tensor("blk.%d.attn_v.weight" % i, n_head_kv * head_dim, n_embd)
        tensor("blk.%d.attn_output.weight" % i, n_embd, n_embd)
        writer.add_tensor("blk.%d.ffn_norm.weight" % i, np.ones(n_embd, dtype=np.float32))
        tensor("blk.%d.ffn_gate.weight" % i, n_ff, n_embd)
        tensor("blk.%d.ffn_up.weight" % i, n_ff, n_embd)
        tensor("blk.%d.ffn_down.weight" % i, n_embd, n_ff)
    writer.add_tensor("output_norm.weight", np.ones(n_embd, dtype=np.float32))
    tensor("output.weight", n_vocab, n_embd)
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
