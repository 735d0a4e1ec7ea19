#!/usr/bin/env python3
"""How long reading a model's header takes: module_utils/gguf_model.read_model (its own
header walk, the vocabulary skipped) against gguf-py's GGUFReader (which decodes every
token, merge, score and type), side by side on the same file: a Qwen2.5-32B-shaped
header with a 152064-token vocabulary and 151387 merges (sparse: no weights on disk).

    .venv/bin/python benchmarks/gguf_read.py [--out benchmarks/results/gguf-read.json]
"""
import argparse
import json
import os
import platform
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests", "harness"))
sys.path.insert(0, os.path.join(ROOT, "tests", "unit"))
import ansible.module_utils  # noqa: E402
ansible.module_utils.__path__.append(os.path.join(ROOT, "module_utils"))
from ansible.module_utils import gguf_model  # noqa: E402

import gguf_fixtures  # noqa: E402

VOCAB, MERGES = 152064, 151387


def best_of(fn, repeat):
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--out")
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    from gguf import GGUFReader
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "qwen2.5-32b-Q4_K_M.gguf")
        gguf_fixtures.write_big_vocab(path, VOCAB, MERGES)
        header = os.path.getsize(path)
        ours = best_of(lambda: gguf_model.read_model(path), args.repeat)

        def theirs():
            reader = GGUFReader(path, "r")
            for field in reader.fields.values():
                field.contents()
        reference = best_of(theirs, args.repeat)
        meta = gguf_model.read_model(path)
    result = {"vocab": VOCAB, "merges": MERGES, "file_bytes": header, "read_model_s": round(ours, 3),
              "gguf_reader_s": round(reference, 3), "speedup": round(reference / ours, 1),
              "vocab_size_read": meta["vocab_size"], "python": platform.python_version(),
              "machine": platform.machine(), "cpus": os.cpu_count()}
    print("read_model %.3f s, GGUFReader + decode %.3f s (%.1fx) on a %d-token vocabulary"
          % (ours, reference, reference / ours, VOCAB))
    if args.out:
        with open(args.out, "w") as handle:
            json.dump(result, handle, indent=1)
            handle.write("\n")


if __name__ == "__main__":
    main()
