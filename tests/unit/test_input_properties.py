"""Bad input as a class (issue 31): property-based tests with hypothesis over what the
project reads. GGUF headers of valid structure carrying hostile values (every GGUF type
for every key the project reads, out-of-range counts, duplicates, misaligned offsets,
truncation at any byte) and hostile GPU facts and policies: each gives a result or the
project's own error naming the bad key, within 5 s, never a traceback. Fixed seeds
(derandomize) and bounded example counts keep the cost to seconds; what the search
found is kept as plain tests at the end."""
import math
import struct
import time

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from conftest import ROOT

import ansible.module_utils
if str(ROOT / "module_utils") not in ansible.module_utils.__path__:
    ansible.module_utils.__path__.append(str(ROOT / "module_utils"))
from ansible.module_utils import gguf_model, input_schema, plan_memory, plan_model  # noqa: E402
from ansible.module_utils import llama_plan as lp  # noqa: E402

PROPERTY = settings(derandomize=True, max_examples=300, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
BOUND_S = 5.0

# --- a raw GGUF writer: any type for any key, nothing checked ------------------------
U8, I8, U16, I16, U32, I32, F32, BOOL, STR, ARR, U64, I64, F64 = range(13)
_FMT = {U8: "B", I8: "b", U16: "H", I16: "h", U32: "I", I32: "i", F32: "f", BOOL: "?", U64: "Q", I64: "q", F64: "d"}


def _string(text):
    data = text.encode("utf-8") if isinstance(text, str) else text
    return struct.pack("<Q", len(data)) + data


def _value(kind, value):
    if kind == STR:
        return _string(value)
    if kind == ARR:
        inner, items = value
        out = struct.pack("<IQ", inner, len(items))
        return out + b"".join(_value(inner, item) for item in items)
    return struct.pack("<" + _FMT[kind], value)


def gguf_bytes(kv, tensors, alignment=32):
    """kv: [(key, kind, value)]; tensors: [(name, shape, ggml type, offset, n_bytes)]."""
    head = b"GGUF" + struct.pack("<IQQ", 3, len(tensors), len(kv))
    head += b"".join(_string(key) + struct.pack("<I", kind) + _value(kind, value) for key, kind, value in kv)
    for name, shape, ttype, offset, _ in tensors:
        head += _string(name) + struct.pack("<I", len(shape)) + struct.pack("<%dQ" % len(shape), *shape)
        head += struct.pack("<IQ", ttype, offset)
    pad = (-len(head)) % alignment
    data = max([offset + n for _, _, _, offset, n in tensors] or [0])
    return head + b"\0" * (pad + data)


N_LAYER, N_EMBD, N_VOCAB = 2, 32, 64


def valid_model():
    """A tiny llama: every key the project reads, f32 tensors laid out aligned."""
    kv = [("general.architecture", STR, "llama"), ("general.name", STR, "tiny"),
          ("general.file_type", U32, 0), ("general.alignment", U32, 32),
          ("llama.block_count", U32, N_LAYER), ("llama.embedding_length", U32, N_EMBD),
          ("llama.feed_forward_length", U32, 64), ("llama.attention.head_count", U32, 4),
          ("llama.attention.head_count_kv", U32, 2), ("llama.context_length", U32, 4096),
          ("llama.vocab_size", U32, N_VOCAB)]
    tensors, offset = [], 0
    shapes = [("token_embd.weight", [N_EMBD, N_VOCAB])] + [
        ("blk.%d.%s.weight" % (il, part), [N_EMBD, N_EMBD]) for il in range(N_LAYER) for part in ("attn_q", "ffn_up")]
    for name, shape in shapes:
        n_bytes = 4 * shape[0] * shape[1]
        tensors.append((name, shape, 0, offset, n_bytes))
        offset += n_bytes + (-n_bytes) % 32
    return kv, tensors


_ANY_SCALAR = st.one_of(
    st.tuples(st.just(U8), st.integers(0, 255)), st.tuples(st.just(I8), st.integers(-128, 127)),
    st.tuples(st.just(U32), st.integers(0, 2 ** 32 - 1)), st.tuples(st.just(I32), st.integers(-2 ** 31, 2 ** 31 - 1)),
    st.tuples(st.just(U64), st.integers(0, 2 ** 64 - 1)), st.tuples(st.just(I64), st.integers(-2 ** 63, 2 ** 63 - 1)),
    st.tuples(st.just(F32), st.floats(width=32, allow_nan=True)), st.tuples(st.just(F64), st.floats()),
    st.tuples(st.just(BOOL), st.booleans()), st.tuples(st.just(STR), st.text(max_size=20)),
)
_ANY_VALUE = st.one_of(_ANY_SCALAR, st.tuples(st.just(ARR), st.tuples(st.just(U32), st.lists(
    st.integers(0, 2 ** 32 - 1), max_size=6))), st.tuples(st.just(ARR), st.tuples(st.just(I32), st.lists(
        st.integers(-2 ** 31, 2 ** 31 - 1), min_size=N_LAYER, max_size=N_LAYER))))


def _read(tmp_path, data):
    path = tmp_path / "model.gguf"
    path.write_bytes(data)
    start = time.monotonic()
    try:
        return gguf_model.read_model(str(path)), None
    except gguf_model.GGUFError as err:
        return None, str(err)
    finally:
        assert time.monotonic() - start < BOUND_S


def test_the_valid_model_reads():
    kv, tensors = valid_model()
    import tempfile
    from pathlib import Path
    with tempfile.TemporaryDirectory() as tmp:
        meta, err = _read(Path(tmp), gguf_bytes(kv, tensors))
    assert err is None and meta["block_count"] == N_LAYER and meta["head_count_kv"] == 2


@PROPERTY
@given(index=st.integers(0, 10), value=_ANY_VALUE)
def test_any_value_of_any_type_for_a_read_key_answers_clearly(tmp_path, index, value):
    kv, tensors = valid_model()
    key = kv[index][0]
    kv[index] = (key, value[0], value[1])
    meta, err = _read(tmp_path, gguf_bytes(kv, tensors))
    if err is not None:
        assert str(tmp_path) in err and (key in err or key.split(".")[-1] in err or "corrupt" in err), err
        return
    # accepted: the values the planner reads are whole numbers in range, and it plans or refuses by name
    for name in ("block_count", "embedding_length", "context_length", "vocab_size"):
        assert meta[name] is None or (isinstance(meta[name], int) and meta[name] >= 1)
    _plan_or_refuse(meta)


@PROPERTY
@given(cut=st.integers(0, 2000))
def test_a_file_cut_at_any_byte_is_refused(tmp_path, cut):
    kv, tensors = valid_model()
    data = gguf_bytes(kv, tensors)
    meta, err = _read(tmp_path, data[:min(cut, len(data) - 1)])
    assert meta is None and err


@PROPERTY
@given(extra=st.lists(st.tuples(st.sampled_from(["general.architecture", "llama.block_count", "x.y"]), _ANY_SCALAR),
                      min_size=1, max_size=3))
def test_duplicate_keys_are_refused_like_llama_cpp_does(tmp_path, extra):
    kv, tensors = valid_model()
    kv += [(key, kind, value) for key, (kind, value) in extra]
    meta, err = _read(tmp_path, gguf_bytes(kv, tensors))
    if any(key != "x.y" for key, _ in extra) or sum(1 for key, _ in extra if key == "x.y") > 1:
        assert meta is None and "appears twice" in err, err


@pytest.mark.parametrize("change, words", [
    (lambda t: t.append(t[0]), "token_embd.weight appears twice"),
    (lambda t: t.__setitem__(1, t[1][:3] + (t[1][3] + 4,) + t[1][4:]), "not a multiple of general.alignment"),
    (lambda t: t.__setitem__(0, (t[0][0], [2, 2, 2, 2, 2], 0, 0, 128)), "5 dimensions (ggml has at most 4)"),
])
def test_a_broken_tensor_table_is_refused_by_name(tmp_path, change, words):
    kv, tensors = valid_model()
    change(tensors)
    meta, err = _read(tmp_path, gguf_bytes(kv, tensors))
    assert meta is None and words in err, err


@pytest.mark.parametrize("key, kind, value, words", [
    ("llama.block_count", U64, 1 << 40, "llama.block_count is 1099511627776, outside 1..512"),
    ("llama.block_count", I32, -3, "outside 1..512"),
    ("llama.block_count", F32, 2.0, "not a whole number"),
    ("llama.block_count", STR, "2", "not a whole number"),
    ("llama.context_length", STR, "4096", "llama.context_length is '4096' (str), not a whole number"),
    ("llama.attention.head_count", U32, 0, "head_count is 0 on every layer"),
    ("llama.attention.head_count_kv", U32, 8, "above its 4 attention heads"),
    ("llama.embedding_length", F32, 32.0, "llama.embedding_length is 32.0 (float)"),
    ("general.alignment", U32, 24, "general.alignment is 24, not a power of two"),
    ("general.alignment", U32, 0, "general.alignment is 0, outside"),
    ("general.architecture", STR, "lla\nma", "general.architecture is 'lla\\nma'"),
    ("llama.attention.head_count", ARR, (U32, [4, 4, 4]), "3 entries for 2 layers"),
])
def test_what_the_search_found_stays_refused(tmp_path, key, kind, value, words):
    """Examples found by the properties above (and the sweep of issue 31), kept as plain tests."""
    kv, tensors = valid_model()
    kv = [(k, kind, value) if k == key else (k, t, v) for k, t, v in kv]
    meta, err = _read(tmp_path, gguf_bytes(kv, tensors))
    assert meta is None and words in err, err


# --- the planner's facts and policy ----------------------------------------------------
V100 = {"index": 0, "uuid": "GPU-0", "name": "Tesla V100-SXM2-32GB", "memory_total_bytes": 34359738368,
        "memory_bandwidth_bytes_per_s": 898e9, "compute_capability": "7.0", "numa_node": 0,
        "cpu_affinity": list(range(20)), "memory_used_bytes": 0}
META = {"architecture": "qwen2", "block_count": 64, "context_length": 32768, "embedding_length": 5120,
        "head_count": 40, "head_count_kv": 8, "feed_forward_length": 27648, "vocab_size": 152064,
        "parameter_count": 32 * 10 ** 9}
CANDIDATE = {"quant": "Q4_K_M", "size_bytes": 19 << 30, "metadata": META}


def _plan_or_refuse(meta=None, gpus=None, policy=None, candidates=None):
    start = time.monotonic()
    try:
        models = [plan_model.model_from_metadata(c["quant"], c["metadata"], c.get("size_bytes"))
                  for c in (candidates or [dict(CANDIDATE, metadata=meta or META)])]
        result = lp.plan_host(gpus if gpus is not None else [V100], models, policy or {})
    except plan_memory.PlanError as err:
        result = str(err)
        assert result.strip()
    assert time.monotonic() - start < BOUND_S
    return result


_HOSTILE = st.one_of(st.none(), st.booleans(), st.integers(-2 ** 70, 2 ** 70), st.floats(allow_nan=True),
                     st.text(max_size=12), st.lists(st.integers(-5, 70), max_size=4),
                     st.dictionaries(st.text(max_size=3), st.integers(), max_size=2),
                     st.sampled_from(["16GB", "fast", "0-19", "nan", "inf", "-1", "1e400", "0-19,40-59"]))
_GPU_KEYS = ["index", "uuid", "name", "memory_total_bytes", "memory_bandwidth_bytes_per_s", "numa_node",
             "cpu_affinity", "memory_used_bytes", "memory_foreign_bytes"]


@PROPERTY
@given(changes=st.dictionaries(st.sampled_from(_GPU_KEYS), _HOSTILE, min_size=1, max_size=3))
def test_any_gpu_fact_plans_or_is_refused_by_name(changes):
    result = _plan_or_refuse(gpus=[dict(V100, **changes)])
    if isinstance(result, str):
        assert any(key in result for key in changes) or "GPU" in result, result
    else:
        for plan in result["plans"]:
            assert plan["memory"]["total_bytes"] > 0 and plan["ctx_size"] > 0 and plan["parallel"] >= 1


_POLICY_KEYS = ["min_ctx", "target_ctx", "min_parallel", "target_parallel", "max_parallel", "min_decode_tps",
                "kv_fill", "headroom_bytes", "threads", "objective", "cache_types", "allow_partial_offload",
                "host_memory_bandwidth_bytes_per_s", "ubatch_size", "batch_size"]


@PROPERTY
@given(changes=st.dictionaries(st.sampled_from(_POLICY_KEYS), _HOSTILE, min_size=1, max_size=3))
def test_any_policy_value_plans_or_is_refused_by_name(changes):
    result = _plan_or_refuse(policy=changes)
    if isinstance(result, str):
        assert "policy" in result or "fits" in result or "GPU" in result, result
    else:
        for plan in result["plans"]:
            assert 1 <= plan["parallel"] <= input_schema.LLAMA_MAX_SEQ
            assert math.isfinite(plan["expected_decode_tps"])


_META_KEYS = list(input_schema.GGUF_KEYS) + list(input_schema.PLANNER_KEYS) + ["tied_embeddings"]


@PROPERTY
@given(changes=st.dictionaries(st.sampled_from(_META_KEYS), _HOSTILE, min_size=1, max_size=3))
def test_any_declared_metadata_plans_or_is_refused_by_name(changes):
    result = _plan_or_refuse(meta=dict(META, **changes))
    if isinstance(result, str):
        assert any(key in result for key in changes) or "candidate" in result or "fits" in result, result


@pytest.mark.parametrize("gpu, words", [
    (dict(V100, memory_total_bytes="16GB"), "GPU 0 memory_total_bytes is '16GB' (str), not a whole number"),
    (dict(V100, memory_bandwidth_bytes_per_s="fast"), "memory_bandwidth_bytes_per_s is 'fast', not a number"),
    (dict(V100, memory_bandwidth_bytes_per_s=float("nan")), "memory_bandwidth_bytes_per_s is nan, outside"),
    (dict(V100, memory_foreign_bytes=-77 * 10 ** 9), "memory_foreign_bytes is -77000000000, outside 0.."),
    (dict(V100, uuid=None), "gpus[0] has no uuid"),
    (dict(V100, index="x"), "gpus[0].index is 'x'"),
])
def test_gpu_facts_the_sweep_found_are_refused_by_name(gpu, words):
    result = _plan_or_refuse(gpus=[gpu])
    assert isinstance(result, str) and words in result, result


def test_two_gpus_with_one_uuid_are_refused():
    result = _plan_or_refuse(gpus=[V100, dict(V100, index=1)])
    assert isinstance(result, str) and "gpus[1].uuid is 'GPU-0', which another GPU of the host has too" in result


def test_a_cpu_list_in_the_kernel_s_text_is_read():
    result = _plan_or_refuse(gpus=[dict(V100, cpu_affinity="0-9,20-29")])
    assert result["plans"][0]["threads"] > 0


@pytest.mark.parametrize("policy, words", [
    ({"min_decode_tps": float("nan")}, "policy.min_decode_tps is nan"),
    ({"min_decode_tps": "inf"}, "policy.min_decode_tps is inf"),
    ({"max_parallel": 10 ** 6}, "policy.max_parallel must be at most 256"),
    ({"allow_partial_offload": "perhaps"}, "policy.allow_partial_offload must be true or false"),
])
def test_policies_the_sweep_found_are_refused_by_name(policy, words):
    result = _plan_or_refuse(policy=policy)
    assert isinstance(result, str) and words in result, result


def test_a_string_false_is_false_and_a_one_byte_model_is_refused():
    tied = plan_model.model_from_metadata("Q4_K_M", dict(META, tied_embeddings="false"), 19 << 30)
    assert tied["tied"] is False
    result = _plan_or_refuse(candidates=[dict(CANDIDATE, size_bytes=1)])
    assert isinstance(result, str) and "bits a weight, below any llama.cpp quantization" in result, result


def test_a_quant_label_with_a_newline_is_refused():
    result = _plan_or_refuse(candidates=[dict(CANDIDATE, quant="Q4_K_M\nExecStart=/bin/sh")])
    assert isinstance(result, str) and "is not a quantization label" in result, result


def test_a_trained_context_below_the_minimum_is_a_warning():
    result = _plan_or_refuse(meta=dict(META, context_length=1024))
    assert any("trained on 1024 tokens of context, below policy.min_ctx (4096)" in w for w in result["warnings"])
