"""library/gguf_info.py and module_utils/gguf_model.py over synthetic GGUF models.

Every expected figure is computed here by hand from the model shapes, not by the
code under test."""
import json
import os
import struct
import subprocess
import sys
import time

import pytest

from conftest import ROOT, run_module

import gguf_fixtures

import ansible.module_utils
if str(ROOT / "module_utils") not in ansible.module_utils.__path__:
    ansible.module_utils.__path__.append(str(ROOT / "module_utils"))
from ansible.module_utils import gguf_model  # noqa: E402

MIB = 1 << 20

# Bytes per 256 values of the k-quants (ggml-common.h block sizes).
Q3_K, Q4_K, Q6_K = 110, 144, 210


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    return gguf_fixtures.write_all(tmp_path_factory.mktemp("gguf"))


def info(path):
    result = run_module("gguf_info", {"path": str(path)})
    assert not result.get("failed"), result.get("msg")
    return result


def dense_weight_bytes(base, more, out, embd):
    """Qwen2.5-32B shape, by hand: bytes per 256 values of each tensor class."""
    n_embd, n_ff, vocab, q, kv = 5120, 27648, 152064, 5120, 1024
    total = vocab * n_embd * embd // 256 + vocab * n_embd * out // 256 + n_embd * 4
    more_layers = [i for i in range(64) if i < 8 or i >= 56 or (i - 8) % 3 == 2]
    assert len(more_layers) == 32
    for i in range(64):
        plain = (n_embd * q + n_embd * kv + q * n_embd + 2 * n_embd * n_ff) * base // 256
        extra = (n_embd * kv + n_ff * n_embd) * (more if i in more_layers else base) // 256
        f32 = (2 * n_embd + q + 2 * kv) * 4
        total += plain + extra + f32
    return total


DENSE_PARAMS = 2 * 152064 * 5120 + 5120 + 64 * (
    5120 * 5120 * 2 + 5120 * 1024 * 2 + 3 * 5120 * 27648 + 2 * 5120 + 5120 + 2 * 1024)


def test_dense_model_matches_the_hand_figures(models):
    r = info(models["dense_q4km"])
    assert r["changed"] is False
    assert r["architecture"] == "qwen2"
    assert r["file_type"] == "Q4_K_M" and r["file_type_id"] == 15
    assert (r["block_count"], r["embedding_length"], r["head_count"], r["head_count_kv"]) == (64, 5120, 40, 8)
    assert (r["key_length"], r["value_length"]) == (128, 128)  # default: 5120 / 40
    assert (r["context_length"], r["vocab_size"], r["feed_forward_length"]) == (32768, 152064, 27648)
    assert r["parameter_count"] == DENSE_PARAMS == 32763876352
    assert r["weight_bytes"] == dense_weight_bytes(Q4_K, Q6_K, Q6_K, Q4_K)
    assert r["tensor_count"] == 64 * 12 + 3
    # the token embeddings llama.cpp keeps in host memory: 417 MiB (FACTS, H200 measurement)
    assert r["token_embd_bytes"] == 152064 * 5120 // 256 * Q4_K == 437944320
    assert int(r["token_embd_bytes"] / MIB) == 417
    assert r["output_bytes"] == 152064 * 5120 // 256 * Q6_K and r["tied_embeddings"] is False
    assert r["file_size_bytes"] == os.path.getsize(models["dense_q4km"]) > r["weight_bytes"]
    # KV: 64 layers x (K + V) x 8 heads x 128 values x 2 bytes
    assert r["kv_bytes_per_token"]["f16"] == 64 * 2 * 8 * 128 * 2 == 262144
    assert r["kv_bytes_per_token"]["q8_0"] == 64 * 2 * (8 * 128 // 32) * 34 == 139264
    assert r["kv_bytes_per_token"]["q4_0"] == 64 * 2 * (8 * 128 // 32) * 18 == 73728
    assert r["layers"]["full_attention"] == list(range(64))
    assert r["layers"]["sliding_window"] == r["layers"]["recurrent"] == []
    assert r["recurrent_state_bytes_per_sequence"] == 0
    assert r["swa_kv_bytes_per_sequence"] == {"f16": 0, "q4_0": 0, "q8_0": 0}
    assert r["bits_per_weight"] == round(r["weight_bytes"] * 8 / r["parameter_count"], 4)


def test_q3_k_s_file(models):
    r = info(models["dense_q3ks"])
    assert r["file_type"] == "Q3_K_S"
    assert r["weight_bytes"] == dense_weight_bytes(Q3_K, Q3_K, Q6_K, Q3_K)
    assert 14.3e9 < r["weight_bytes"] < 14.5e9  # Qwen2.5-32B-Instruct-Q3_K_S.gguf is 14.39 GB


def test_hybrid_model_caches_only_every_fourth_layer(models):
    r = info(models["hybrid_q4km"])
    assert r["architecture"] == "qwen35"
    assert r["full_attention_interval"] == 4
    assert r["layers"]["full_attention"] == [3 + 4 * i for i in range(16)]
    assert r["full_attention_layer_count"] == 16 and r["recurrent_layer_count"] == 48
    assert (r["key_length"], r["value_length"], r["head_count_kv"]) == (256, 256, 4)
    # 16 full-attention layers x (K + V) x 4 heads x 256 values x 2 bytes
    assert r["kv_bytes_per_token"]["f16"] == 16 * 2 * 4 * 256 * 2 == 65536
    # per layer: conv state (4 - 1) x (6144 + 2 x 16 x 128) + delta-net state 128 x 6144, f32
    per_layer = (3 * (48 * 128 + 2 * 16 * 128) + 128 * 48 * 128) * 4
    assert per_layer == 3268608
    assert r["recurrent_state_bytes_per_sequence"] == 48 * per_layer == 156893184
    assert r["vocab_size"] == 248320


def test_gemma3_sliding_window_layers(models):
    r = info(models["gemma3_q4km"])
    globals_ = [5 + 6 * i for i in range(10)]  # il % 6 == 5 (llama.cpp gemma3: period 6)
    assert r["layers"]["full_attention"] == globals_
    assert r["sliding_window_layer_count"] == 52 and r["sliding_window"] == 1024
    assert r["kv_bytes_per_token"]["f16"] == 10 * 2 * 16 * 128 * 2 == 81920
    assert r["swa_kv_bytes_per_token"]["f16"] == 52 * 2 * 16 * 128 * 2 == 425984
    # a sequence holds the window + one ubatch (512), padded to 256 cells: 1536 cells
    assert r["swa_kv_bytes_per_sequence"]["f16"] == 1536 * 425984
    assert r["swa_kv_bytes_per_sequence"]["q8_0"] == 1536 * 52 * 2 * (16 * 128 // 32) * 34
    assert r["tied_embeddings"] is True and r["output_bytes"] == 0
    with_key = info(models["gemma3_pattern"])
    assert with_key["sliding_window_pattern"] == 6
    assert with_key["layers"] == r["layers"]


def test_split_model_is_one_model(models):
    single = info(models["dense_q4km"])
    shards = [str(p) for p in models["split_files"]]
    assert len(shards) == 3 and shards[0].endswith("-00001-of-00003.gguf")
    for given in (shards[0], shards[1]):
        r = info(given)
        assert r["files"] == shards and r["split_count"] == 3
        assert r["model_path"] == shards[0]
        assert r["tensor_count"] == single["tensor_count"]
        assert r["weight_bytes"] == single["weight_bytes"]
        assert r["parameter_count"] == single["parameter_count"]
        assert r["file_size_bytes"] == sum(os.path.getsize(p) for p in shards)
        assert r["kv_bytes_per_token"] == single["kv_bytes_per_token"]


def test_a_missing_shard_is_named(models, tmp_path):
    for shard in models["split_files"][:2]:
        (tmp_path / shard.name).symlink_to(shard)
    r = run_module("gguf_info", {"path": str(tmp_path / models["split_files"][0].name)})
    assert r["failed"]
    assert models["split_files"][2].name in r["msg"] and "missing" in r["msg"]


@pytest.mark.parametrize("name, words", [
    ("truncated_data", ["tiny-cut.gguf", "truncated"]),
    ("truncated_header", ["tiny-head.gguf", "truncated"]),
    ("not_gguf", ["not-a-model.gguf", "not a GGUF model"]),
])
def test_bad_files_fail_naming_the_file(models, name, words):
    r = run_module("gguf_info", {"path": str(models[name])})
    assert r["failed"]
    for word in words:
        assert word in r["msg"]


def test_missing_file(tmp_path):
    r = run_module("gguf_info", {"path": str(tmp_path / "absent.gguf")})
    assert r["failed"] and "absent.gguf does not exist" in r["msg"]


def test_check_mode_gives_the_same_answer(models):
    plain = info(models["tiny"])
    checked = run_module("gguf_info", {"path": str(models["tiny"]), "_ansible_check_mode": True})
    assert not checked.get("failed")
    for key in ("weight_bytes", "kv_bytes_per_token", "layers", "file_type"):
        assert checked[key] == plain[key]


def test_reading_does_not_touch_the_weights(models):
    """A 19.8 GB model is described without reading its tensor data: the reading
    process's peak memory stays far below the model's size."""
    code = (
        "import resource, sys, ansible.module_utils\n"
        "ansible.module_utils.__path__.append(sys.argv[1])\n"
        "from ansible.module_utils.gguf_model import read_model\n"
        "before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss\n"
        "m = read_model(sys.argv[2])\n"
        "after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss\n"
        "print(m['weight_bytes'], (after - before) * 1024)\n")
    out = subprocess.run([sys.executable, "-c", code, str(ROOT / "module_utils"), str(models["dense_q4km"])],
                         capture_output=True, text=True, check=True, timeout=60).stdout.split()
    weight_bytes, grown = int(out[0]), int(out[1])
    assert weight_bytes > 19e9
    assert grown < 64 * MIB


# --- the arithmetic helpers, against hand figures ---------------------------------

def test_kv_row_bytes():
    assert gguf_model.kv_row_bytes(1024, "f16") == 2048
    assert gguf_model.kv_row_bytes(1024, "q8_0") == 32 * 34
    assert gguf_model.kv_row_bytes(1024, "q4_0") == 32 * 18
    assert gguf_model.kv_row_bytes(0, "q8_0") == 0
    with pytest.raises(ValueError):
        gguf_model.kv_row_bytes(1024, "q5_1")


def test_per_layer_head_count_kv_with_zeros_marks_recurrent_layers():
    meta = {"architecture": "jamba", "block_count": 4, "embedding_length": 256, "head_count": 4,
            "head_count_kv": [0, 2, 0, 0], "ssm_conv_kernel": 4, "ssm_inner_size": 512, "ssm_state_size": 16,
            "ssm_group_count": 1}
    kinds = [layer["kind"] for layer in gguf_model.layer_layout(meta)]
    assert kinds == ["recurrent", "full", "recurrent", "recurrent"]
    figures = gguf_model.kv_figures(meta)
    assert figures["kv_bytes_per_token"]["f16"] == 2 * 2 * 64 * 2  # one layer, 2 heads x 64
    # Mamba: (4 - 1) x (512 + 2 x 1 x 16) + 16 x 512 values, f32, 3 layers
    assert figures["recurrent_state_bytes_per_sequence"] == 3 * (3 * 544 + 16 * 512) * 4
    # without SSM keys a zero means "no cache", not "recurrent"
    plain = dict(meta, architecture="llama", ssm_inner_size=None, ssm_state_size=None)
    assert [l["kind"] for l in gguf_model.layer_layout(plain)] == ["none", "full", "none", "none"]


def test_mtp_layers_hold_no_kv():
    meta = {"architecture": "qwen35", "block_count": 9, "nextn_predict_layers": 1, "embedding_length": 512,
            "head_count": 4, "head_count_kv": 2, "key_length": 128, "value_length": 128}
    kinds = [layer["kind"] for layer in gguf_model.layer_layout(meta)]
    assert kinds == ["recurrent"] * 3 + ["full"] + ["recurrent"] * 3 + ["full", "none"]


def test_sliding_window_layouts():
    base = {"block_count": 6, "embedding_length": 256, "head_count": 2, "head_count_kv": 1, "sliding_window": 128}
    kinds = lambda meta: "".join(l["kind"][0] for l in gguf_model.layer_layout(meta))  # noqa: E731
    assert kinds(dict(base, architecture="gemma2")) == "sfsfsf"
    assert kinds(dict(base, architecture="cohere2")) == "sssfss"
    assert kinds(dict(base, architecture="gemma3", sliding_window_pattern=3)) == "ssfssf"
    assert kinds(dict(base, architecture="llama")) == "ffffff"  # llama.cpp ignores the window there
    assert kinds(dict(base, architecture="x", sliding_window_pattern=[True, False] * 3)) == "sfsfsf"


def test_rwkv_state():
    meta = {"architecture": "rwkv6", "block_count": 2, "embedding_length": 2048, "wkv_head_size": 64}
    assert gguf_model.recurrent_state_values(meta) == 2 * 2048 + 2048 * 64
    assert gguf_model.kv_figures(meta)["recurrent_state_bytes_per_sequence"] == 2 * (2 * 2048 + 2048 * 64) * 4


def test_file_type_labels():
    assert gguf_model.file_type_label(15) == "Q4_K_M"
    assert gguf_model.file_type_label(11) == "Q3_K_S"
    assert gguf_model.file_type_label(0) == "F32"
    assert gguf_model.file_type_label(None) is None
    assert gguf_model.file_type_label(999) is None


def test_result_is_json_clean(models):
    r = info(models["hybrid_q4km"])
    json.dumps(r)  # the planner receives it through Ansible as metadata


def _header(n_tensors, n_kv, body=b""):
    return b"GGUF" + struct.pack("<IQQ", 3, n_tensors, n_kv) + body


@pytest.mark.parametrize("what, data, words", [
    ("a billion tensors", _header(10 ** 9, 0, b"\0" * 4000), ["1000000000 tensors", "cannot fit"]),
    ("a 2^60-byte key", _header(0, 1, struct.pack("<Q", 1 << 60) + b"\0" * 4000),
     ["metadata entry 0's key", "needs 1152921504606846976 bytes"]),
    ("a huge string array", _header(0, 1, struct.pack("<Q", 1) + b"k" + struct.pack(
        "<IIQ", 9, 8, 1 << 40) + b"\0" * 4000), ["k declares 1099511627776 strings", "cannot fit"]),
    ("a huge number array", _header(0, 1, struct.pack("<Q", 1) + b"k" + struct.pack(
        "<IIQ", 9, 10, 1 << 40) + b"\0" * 4000), ["k (1099511627776 elements)"]),
    ("an unknown type", _header(0, 1, struct.pack("<Q", 1) + b"k" + struct.pack(
        "<I", 77) + b"\0" * 100), ["k has unknown type 77"]),
])
def test_a_header_that_cannot_fit_in_its_file_fails_at_once(tmp_path, what, data, words):
    """A few-KB file that declares huge counts or lengths is refused before any
    reader allocates or loops on them (it once took 10 GB of RSS)."""
    path = tmp_path / "bomb.gguf"
    path.write_bytes(data)
    start = time.monotonic()
    with pytest.raises(gguf_model.GGUFError) as err:
        gguf_model.check_header_bounds(str(path))
    assert time.monotonic() - start < 5, what
    for word in words:
        assert word in str(err.value), (what, str(err.value))


def test_the_vocabulary_is_walked_not_decoded(tmp_path):
    """A real-sized vocabulary (152064 tokens, their types, 151387 merges) is most of a
    Qwen header: the reader checks its bounds but keeps only its length, and reads the
    same shape as without it (benchmarks/gguf_read.py times it against GGUFReader)."""
    path, = gguf_fixtures.write_big_vocab(tmp_path / "qwen2.5-32b-Q4_K_M.gguf")
    header = gguf_model.read_header(str(path))
    tokens, types = header["fields"]["tokenizer.ggml.tokens"], header["fields"]["tokenizer.ggml.token_type"]
    assert isinstance(tokens, gguf_model.UndecodedArray) and len(tokens) == 152064
    assert isinstance(types, gguf_model.UndecodedArray) and len(types) == 152064
    assert len(header["fields"]["tokenizer.ggml.merges"]) == 151387
    assert header["fields"]["tokenizer.ggml.model"] == "gpt2"  # short values are decoded
    meta = gguf_model.read_model(str(path))
    plain = gguf_model.read_model(str(gguf_fixtures.dense_32b(tmp_path / "plain-Q4_K_M.gguf")[0]))
    for key in ("vocab_size", "weight_bytes", "parameter_count", "block_count", "head_count_kv", "kv_bytes_per_token"):
        assert meta[key] == plain[key], key
    # a cut inside the vocabulary is still found
    with open(path, "r+b") as handle:
        handle.truncate(3 << 20)
    with pytest.raises(gguf_model.GGUFError, match=r"is corrupt.*tokenizer\.ggml\.\w+"):
        gguf_model.read_model(str(path))
