#!/usr/bin/env python3
"""Write the model scenario's catalogue and the small files its mirror serves.

The catalogue describes Qwen2.5-32B honestly where the plan is concerned: each
quantization's size_bytes is the size of a real-shaped file (written sparse by
tests/harness/gguf_writer.py, never read), and metadata is what gguf_info reads
from that file's header. Downloading 14-23 GB per test host is not possible
here, so each entry's files are small stand-ins: real GGUF files (llama
architecture, the same quantization types, 4 layers), whose own sha256 and
size_bytes are what model_fetch verifies. The role says so when it runs: the
files' sizes do not add up to the entry's size_bytes.

    make_standins.py OUTDIR MIRROR_URL
writes OUTDIR/served/*.gguf and OUTDIR/catalogue.json; the same bytes every time.
"""
import hashlib
import json
import os
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "tests" / "harness"))  # the one way in: tests/harness/paths.py

import paths  # noqa: E402
from gguf_writer import dense_32b, dense_tensors, file_type, quantize, write_sparse  # noqa: E402

paths.use_module_utils()
from ansible.module_utils.gguf_model import read_model  # noqa: E402

QUANTS = ("Q3_K_S", "Q4_K_M", "Q5_K_M", "Q8_0")


def standin(path, ftype):
    """A small real GGUF of the same quantization (a few MiB, sparse)."""
    arch, n_layer, n_embd, n_ff, n_head, n_head_kv, vocab = "llama", 4, 512, 1536, 8, 4, 8192
    hd = n_embd // n_head
    kv = {
        "general.name": "stand-in for Qwen2.5-32B-Instruct %s" % ftype,
        "general.file_type": file_type(ftype),
        "%s.block_count" % arch: n_layer,
        "%s.context_length" % arch: 32768,
        "%s.embedding_length" % arch: n_embd,
        "%s.feed_forward_length" % arch: n_ff,
        "%s.attention.head_count" % arch: n_head,
        "%s.attention.head_count_kv" % arch: n_head_kv,
        "%s.attention.layer_norm_rms_epsilon" % arch: 1e-6,
    }
    tensors = quantize(dense_tensors(n_layer, n_embd, n_head, n_head_kv, hd, n_ff, vocab), ftype, n_layer)
    return write_sparse(path, arch, kv, tensors)[0]


def sha256(path):
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def main(outdir, mirror_url):
    outdir = Path(outdir)
    served = outdir / "served"
    served.mkdir(parents=True, exist_ok=True)
    catalogue = []
    with tempfile.TemporaryDirectory() as tmp:
        # The real shape, once per quantization: sizes and metadata for the plan.
        real = dict((q, read_model(str(dense_32b(Path(tmp) / ("qwen2.5-32b-%s.gguf" % q), q)[0])))
                    for q in QUANTS)
    shape = dict((k, v) for k, v in real["Q4_K_M"].items() if k not in ("model_path", "files"))
    for quant in QUANTS:
        name = "qwen2.5-32b-instruct-%s-standin.gguf" % quant.lower()
        path = standin(served / name, quant)
        catalogue.append({
            "quant": quant,
            "size_bytes": real[quant]["file_size_bytes"],
            "metadata": shape,
            "files": [{"url": "%s/%s" % (mirror_url.rstrip("/"), name), "sha256": sha256(path),
                       "size_bytes": os.path.getsize(path)}],
        })
    text = json.dumps({"llm_model_catalogue": catalogue}, indent=1, sort_keys=True) + "\n"
    target = outdir / "catalogue.json"
    if not target.exists() or target.read_text() != text:
        target.write_text(text)
    for quant, entry in zip(QUANTS, catalogue):
        print("%s: plan budgets %d bytes; serves %s (%d bytes)" % (
            quant, entry["size_bytes"], entry["files"][0]["url"], entry["files"][0]["size_bytes"]))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
