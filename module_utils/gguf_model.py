# -*- coding: utf-8 -*-
# Read what llama.cpp needs to know about a GGUF model from its header and
# tensor table, never from its weights.
#
# Shared by the gguf_info module and the llama_plan module. The arithmetic here
# (which layers hold a KV cache, how many bytes a cached token costs) is plain
# Python over a metadata dict, so the planner can use it on metadata declared
# before a download; read_model() parses the header itself (skipping the
# vocabulary) and needs only the `gguf` package's table of ggml type sizes,
# imported when called. Python 3.8-compatible because Ubuntu 20.04 hosts run it.
from __future__ import absolute_import, division, print_function

__metaclass__ = type

import mmap
import os
import re
import struct

from ansible.module_utils.input_schema import GGML_MAX_DIMS, SchemaError, check_gguf_fields, check_model_metadata

# KV cache element types llama-server accepts for -ctk/-ctv that flash attention
# handles on CUDA without GGML_CUDA_FA_ALL_QUANTS: (values per block, bytes per block).
# f16: 2 bytes a value; q8_0: 32 int8 + one f16 scale = 34 bytes per 32 values;
# q4_0: 32 4-bit values + one f16 scale = 18 bytes per 32 values (ggml-common.h).
KV_CACHE_TYPES = {
    "f16": (1, 2),
    "q8_0": (32, 34),
    "q4_0": (32, 18),
}

# Recurrent state (Mamba conv/ssm state, gated-delta-net state, RWKV state) is
# always f32 in llama.cpp (llama-model.cpp create_memory: GGML_TYPE_F32).
RECURRENT_STATE_BYTES_PER_VALUE = 4

# llama.cpp pads the sliding-window cache of each sequence to 256 cells
# (llama-kv-cache-iswa.cpp: GGML_PAD(min(n_ctx_seq, n_swa + n_ubatch), 256)).
SWA_CELL_PAD = 256
# The ubatch llama-server uses unless -ub says otherwise; only used to report a
# per-sequence SWA figure in gguf_info (the planner uses its own ubatch).
DEFAULT_UBATCH = 512

# Architectures whose layers alternate linear attention (fixed recurrent state)
# with full attention: layer il is full attention when (il + 1) % interval == 0
# (llama.cpp qwen3next/qwen35 load_arch_hparams, default interval 4); the
# trailing nextn_predict_layers (MTP) blocks keep no KV in the main context.
INTERVAL_HYBRID_ARCHS = ("qwen3next", "qwen35", "qwen35moe")
DEFAULT_FULL_ATTENTION_INTERVAL = 4

# Architectures with only recurrent layers (no KV cache at all).
RECURRENT_ARCHS = ("mamba", "mamba2", "rwkv6", "rwkv6qwen2", "rwkv7", "arwkv7")

# Sliding-window layouts llama.cpp applies when the GGUF has a sliding window
# but no sliding_window_pattern key: (period, dense_first). With dense_first
# False, layer il uses the window when il % period < period - 1 (the last layer
# of each period is global); with True, when il % period != 0
# (llama-hparams.cpp set_swa_pattern).
SWA_ARCH_DEFAULTS = {
    "gemma2": (2, False),
    "gemma3": (6, False),
    "cohere2": (4, False),
    "gpt-oss": (2, False),
}

SPLIT_RE = re.compile(r"^(?P<prefix>.*)-(?P<no>\d{5})-of-(?P<count>\d{5})\.gguf$")
SPLIT_NAME = "%s-%05d-of-%05d.gguf"


class GGUFError(Exception):
    """A GGUF file is missing, unreadable, truncated or not GGUF at all."""


def round_up(value, multiple):
    return (value + multiple - 1) // multiple * multiple


def kv_row_bytes(values, cache_type):
    """Bytes of one cached K (or V) row of `values` elements in `cache_type`."""
    if cache_type not in KV_CACHE_TYPES:
        raise ValueError("unknown KV cache type %r (known: %s)" % (cache_type, ", ".join(sorted(KV_CACHE_TYPES))))
    block_values, block_bytes = KV_CACHE_TYPES[cache_type]
    return (values + block_values - 1) // block_values * block_bytes


def _per_layer(value, n_layer, name):
    """A scalar or per-layer array key -> list of n_layer ints."""
    if isinstance(value, (list, tuple)):
        if len(value) != n_layer:
            raise ValueError("%s has %d entries for %d layers" % (name, len(value), n_layer))
        return [int(v) for v in value]
    return [int(value)] * n_layer


def _first_nonzero(values):
    for v in values:
        if v:
            return v
    return 0


def layer_layout(meta):
    """Which layers hold what kind of cache, as llama.cpp reads the model.

    meta: dict with architecture, block_count, embedding_length, head_count,
    head_count_kv (int or per-layer list), and optional key_length, value_length,
    sliding_window, sliding_window_pattern (int period or per-layer bools),
    full_attention_interval, nextn_predict_layers, ssm / wkv / shortconv keys.

    Returns a list of one dict per layer: kind ('full', 'swa', 'recurrent' or
    'none'), k_values and v_values (elements of one token's K and V rows).
    """
    arch = meta.get("architecture") or ""
    n_layer = int(meta["block_count"])
    n_embd = int(meta.get("embedding_length") or 0)
    heads = _per_layer(meta.get("head_count") or 0, n_layer, "head_count")
    kv_raw = meta.get("head_count_kv")
    heads_kv = _per_layer(kv_raw if kv_raw is not None else heads, n_layer, "head_count_kv")
    n_head0 = _first_nonzero(heads)
    head_k = int(meta.get("key_length") or (n_embd // n_head0 if n_head0 else 0))
    head_v = int(meta.get("value_length") or (n_embd // n_head0 if n_head0 else 0))
    head_k_swa = int(meta.get("key_length_swa") or head_k)
    head_v_swa = int(meta.get("value_length_swa") or head_v)

    has_ssm = bool(meta.get("ssm_inner_size") or meta.get("ssm_state_size") or meta.get("wkv_head_size")
                   or meta.get("shortconv_l_cache"))
    kinds = ["full"] * n_layer
    interval = meta.get("full_attention_interval")
    if arch in RECURRENT_ARCHS:
        kinds = ["recurrent"] * n_layer
    elif arch in INTERVAL_HYBRID_ARCHS or interval:
        interval = int(interval or DEFAULT_FULL_ATTENTION_INTERVAL)
        n_main = n_layer - int(meta.get("nextn_predict_layers") or 0)
        for il in range(n_layer):
            if il >= n_main:
                kinds[il] = "none"        # MTP block: no KV in the serving context
            elif (il + 1) % interval != 0:
                kinds[il] = "recurrent"
    elif isinstance(kv_raw, (list, tuple)):
        for il in range(n_layer):
            if heads_kv[il] == 0:
                kinds[il] = "recurrent" if has_ssm else "none"

    window = int(meta.get("sliding_window") or 0)
    if window > 0:
        swa = _swa_layers(arch, n_layer, meta.get("sliding_window_pattern"))
        for il in range(n_layer):
            if swa[il] and kinds[il] == "full":
                kinds[il] = "swa"

    layers = []
    for il in range(n_layer):
        kind = kinds[il]
        if kind in ("full", "swa") and heads_kv[il] > 0:
            hk, hv = (head_k_swa, head_v_swa) if kind == "swa" else (head_k, head_v)
            layers.append({"kind": kind, "k_values": heads_kv[il] * hk, "v_values": heads_kv[il] * hv})
        else:
            layers.append({"kind": kind if kind == "recurrent" else "none", "k_values": 0, "v_values": 0})
    return layers


def _swa_layers(arch, n_layer, pattern):
    """Per-layer True where the sliding window applies."""
    if isinstance(pattern, (list, tuple)):
        if len(pattern) != n_layer:
            raise ValueError("sliding_window_pattern has %d entries for %d layers" % (len(pattern), n_layer))
        return [bool(v) for v in pattern]
    if pattern:
        period, dense_first = int(pattern), SWA_ARCH_DEFAULTS.get(arch, (0, False))[1]
    elif arch in SWA_ARCH_DEFAULTS:
        period, dense_first = SWA_ARCH_DEFAULTS[arch]
    else:
        # A sliding window without a known layout: llama.cpp ignores it for most
        # architectures (e.g. llama/mistral), so every layer keeps a full cache.
        return [False] * n_layer
    if dense_first:
        return [il % period != 0 for il in range(n_layer)]
    return [il % period < period - 1 for il in range(n_layer)]


def recurrent_state_values(meta):
    """f32 values of one sequence's recurrent state in ONE recurrent layer
    (llama-hparams.cpp n_embd_r() + n_embd_s())."""
    n_embd = int(meta.get("embedding_length") or 0)
    wkv = int(meta.get("wkv_head_size") or 0)
    if wkv:
        return int(meta.get("token_shift_count") or 2) * n_embd + n_embd * wkv
    l_cache = int(meta.get("shortconv_l_cache") or 0)
    if l_cache:
        return n_embd * (l_cache - 1)
    d_conv = int(meta.get("ssm_conv_kernel") or 0)
    d_inner = int(meta.get("ssm_inner_size") or 0)
    d_state = int(meta.get("ssm_state_size") or 0)
    n_group = int(meta.get("ssm_group_count") or 0)
    conv = (d_conv - 1 if d_conv > 0 else 0) * (d_inner + 2 * n_group * d_state)
    return conv + d_state * d_inner


def kv_figures(meta, ubatch=DEFAULT_UBATCH):
    """The cache arithmetic gguf_info reports, from the structural keys."""
    layers = layer_layout(meta)
    full = [l for l in layers if l["kind"] == "full"]
    swa = [l for l in layers if l["kind"] == "swa"]
    n_recurrent = sum(1 for l in layers if l["kind"] == "recurrent")
    window = int(meta.get("sliding_window") or 0)
    swa_cells = round_up(window + ubatch, SWA_CELL_PAD) if swa else 0

    def per_token(group, cache_type):
        return sum(kv_row_bytes(l["k_values"], cache_type) + kv_row_bytes(l["v_values"], cache_type) for l in group)

    out = {
        "layers": {
            "full_attention": [i for i, l in enumerate(layers) if l["kind"] == "full"],
            "sliding_window": [i for i, l in enumerate(layers) if l["kind"] == "swa"],
            "recurrent": [i for i, l in enumerate(layers) if l["kind"] == "recurrent"],
            "none": [i for i, l in enumerate(layers) if l["kind"] == "none"],
        },
        "full_attention_layer_count": len(full),
        "sliding_window_layer_count": len(swa),
        "recurrent_layer_count": n_recurrent,
        "kv_bytes_per_token": dict((t, per_token(full, t)) for t in sorted(KV_CACHE_TYPES)),
        "swa_kv_bytes_per_token": dict((t, per_token(swa, t)) for t in sorted(KV_CACHE_TYPES)),
        "swa_kv_bytes_per_sequence": dict((t, swa_cells * per_token(swa, t)) for t in sorted(KV_CACHE_TYPES)),
        "recurrent_state_bytes_per_sequence":
            n_recurrent * recurrent_state_values(meta) * RECURRENT_STATE_BYTES_PER_VALUE,
    }
    return out


# ---------------------------------------------------------------------------
# Reading a file


def shard_paths(path):
    """All files of a model: [path] for a single file, every shard (in order)
    for a split one named NAME-0000i-of-0000N.gguf (any shard may be given)."""
    match = SPLIT_RE.match(os.path.basename(path))
    if not match:
        return [path]
    count = int(match.group("count"))
    if count < 1:
        raise GGUFError("%s: split count 0 in the file name" % path)
    prefix = os.path.join(os.path.dirname(path), match.group("prefix"))
    paths = [SPLIT_NAME % (prefix, i, count) for i in range(1, count + 1)]
    missing = [p for p in paths if not os.path.isfile(p)]
    if missing:
        raise GGUFError("%s is shard of a %d-file split model, but %s %s missing; download every shard into %s"
                        % (path, count, ", ".join(missing), "is" if len(missing) == 1 else "are",
                           os.path.dirname(path) or "."))
    return paths


# GGUF value types (ggml's gguf.h): struct formats of the fixed ones; 8 is a
# string, 9 an array.
_GGUF_FORMATS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
_GGUF_FIXED = dict((kind, struct.calcsize(fmt)) for kind, fmt in _GGUF_FORMATS.items())
_GGUF_STRING, _GGUF_ARRAY = 8, 9
# The smallest a metadata entry (key length, a 1-byte key, type, a 1-byte value)
# and a tensor entry (name length, 1-byte name, n_dims, one dim, type, offset) can be.
_MIN_KV_BYTES = 8 + 1 + 4 + 1
_MIN_TENSOR_BYTES = 8 + 1 + 4 + 8 + 4 + 8
# Arrays longer than these are walked (bounds checked) but not decoded: the
# vocabulary (152k tokens, as many merges, scores and types on a Qwen model) is
# most of a header and nothing the planner reads; its length is kept.
_DECODE_MAX_STRINGS = 1024
_DECODE_MAX_NUMBERS = 65536
_DEFAULT_ALIGNMENT = 32


class UndecodedArray(object):
    """A metadata array left undecoded (too long to matter): its element type and length."""

    def __init__(self, kind, length):
        self.kind, self.length = kind, length

    def __len__(self):
        return self.length

    def __repr__(self):
        return "<GGUF array of %d elements of type %d, not decoded>" % (self.length, self.kind)


def check_header_bounds(path):
    """Walk a GGUF header and refuse one whose counts or lengths cannot fit in the
    file, before anything allocates or loops on them: a few-KB file declaring a
    billion tensors, a 2^60-byte string or array must fail at once, naming the
    entry, not exhaust the host's memory. Returns the header's (version,
    tensor count, metadata count)."""
    header = read_header(path)
    return header["version"], len(header["tensors"]), len(header["fields"])


def read_header(path):
    """{version, fields, tensors, data_offset} of one GGUF file, from its header and
    tensor table only (the weights are never read), checked against the file's size."""
    size = os.path.getsize(path)
    with open(path, "rb") as handle:
        data = mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ)
    try:
        return _walk_header(path, data, size)
    finally:
        data.close()


def _walk_header(path, data, size):
    order = "<"
    version = struct.unpack_from("<I", data, 4)[0]
    if version not in (2, 3) and struct.unpack_from(">I", data, 4)[0] in (2, 3):
        order, version = ">", struct.unpack_from(">I", data, 4)[0]
    if version not in (2, 3):
        raise GGUFError("%s has GGUF version %d; llama.cpp writes versions 2 and 3" % (path, version))
    n_tensors, n_kv = struct.unpack_from(order + "QQ", data, 8)
    offset = 24

    def need(count, what):
        if offset + count > size:
            raise GGUFError("%s is corrupt or truncated: %s needs %d bytes at offset %d, the file has %d"
                            % (path, what, count, offset, size))

    def number(fmt, what):
        nonlocal offset
        need(struct.calcsize(fmt), what)
        value = struct.unpack_from(order + fmt, data, offset)[0]
        offset += struct.calcsize(fmt)
        return value

    def string(what, decode=True):
        nonlocal offset
        length = number("Q", what)
        need(length, "%s (a string of %d bytes)" % (what, length))
        value = bytes(data[offset:offset + length]).decode("utf-8", "replace") if decode else None
        offset += length
        return value

    for count, least, what in ((n_tensors, _MIN_TENSOR_BYTES, "tensors"), (n_kv, _MIN_KV_BYTES, "metadata entries")):
        if count * least > size - offset:
            raise GGUFError("%s is truncated or corrupt: its header declares %d %s, which cannot fit in a %d-byte "
                            "file (an interrupted download?)" % (path, count, what, size))
    fields = {}
    for index in range(n_kv):
        key = string("metadata entry %d's key" % index)
        if key in fields:
            raise GGUFError("%s is corrupt: metadata key %s appears twice (llama.cpp refuses duplicate keys)"
                            % (path, key))
        kind = number("I", "the type of %s" % key)
        if kind == _GGUF_ARRAY:
            kind, count = number("I", "the element type of %s" % key), number("Q", "the length of %s" % key)
            if kind == _GGUF_STRING:
                if count * 8 > size - offset:
                    raise GGUFError("%s is corrupt: %s declares %d strings, which cannot fit in a %d-byte file"
                                    % (path, key, count, size))
                decode = count <= _DECODE_MAX_STRINGS
                items = [string("%s[%d]" % (key, item), decode) for item in range(count)]
                fields[key] = items if decode else UndecodedArray(kind, count)
                continue
            if kind not in _GGUF_FIXED:
                raise GGUFError("%s is corrupt: %s is an array of unknown type %d" % (path, key, kind))
            need(count * _GGUF_FIXED[kind], "%s (%d elements)" % (key, count))
            if count <= _DECODE_MAX_NUMBERS:
                fields[key] = list(struct.unpack_from("%s%d%s" % (order, count, _GGUF_FORMATS[kind]), data, offset))
            else:
                fields[key] = UndecodedArray(kind, count)
            offset += count * _GGUF_FIXED[kind]
        elif kind == _GGUF_STRING:
            fields[key] = string(key)
        elif kind in _GGUF_FIXED:
            fields[key] = number(_GGUF_FORMATS[kind], key)
        else:
            raise GGUFError("%s is corrupt: %s has unknown type %d" % (path, key, kind))
    try:
        check_gguf_fields(fields)
    except SchemaError as err:
        raise GGUFError("%s: %s" % (path, err))
    alignment = fields.get("general.alignment") or _DEFAULT_ALIGNMENT
    tensors, names = [], set()
    for index in range(n_tensors):
        name = string("tensor %d's name" % index)
        if name in names:
            raise GGUFError("%s is corrupt: tensor %s appears twice (llama.cpp refuses duplicate tensor names)"
                            % (path, name))
        names.add(name)
        n_dims = number("I", "the dimension count of %s" % name)
        if n_dims > GGML_MAX_DIMS:
            raise GGUFError("%s is corrupt: tensor %s declares %d dimensions (ggml has at most %d)"
                            % (path, name, n_dims, GGML_MAX_DIMS))
        need(8 * n_dims + 12, "tensor %s's shape, type and offset" % name)
        shape = list(struct.unpack_from("%s%dQ" % (order, n_dims), data, offset))
        offset += 8 * n_dims
        tensor_type = number("I", "the type of %s" % name)
        tensor_offset = number("Q", "the offset of %s" % name)
        if tensor_offset % alignment:
            raise GGUFError("%s is corrupt: tensor %s starts at data offset %d, not a multiple of general.alignment "
                            "(%d), which llama.cpp requires" % (path, name, tensor_offset, alignment))
        tensors.append({"name": name, "shape": shape, "type": tensor_type, "offset": tensor_offset})
    return {"version": version, "fields": fields, "tensors": tensors,
            "data_offset": round_up(offset, alignment)}


def _tensor_sizes(path, tensors, data_offset):
    """The tensor table's entries with type name, element and byte counts (ggml's
    block sizes, from gguf-py's table), and the end of the last tensor's data."""
    from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType  # the table only: no reader
    out, end = [], 0
    for t in tensors:
        try:
            qtype = GGMLQuantizationType(t["type"])
            block, type_size = GGML_QUANT_SIZES[qtype]
        except (ValueError, KeyError):
            raise GGUFError("%s is corrupt or newer than this gguf package: tensor %s has type %d, which it does not "
                            "know" % (path, t["name"], t["type"]))
        n_elements = 1
        for d in t["shape"]:
            n_elements *= int(d)
        n_bytes = n_elements * type_size // block
        out.append({"name": t["name"], "type": t["type"], "type_name": qtype.name, "shape": t["shape"],
                    "n_elements": n_elements, "n_bytes": n_bytes})
        end = max(end, data_offset + int(t["offset"]) + n_bytes)
    return out, end


def _read_one(path):
    """(fields dict, tensor list, file size) of one GGUF file, header only."""
    if not os.path.exists(path):
        raise GGUFError("%s does not exist" % path)
    if not os.path.isfile(path):
        raise GGUFError("%s is not a regular file" % path)
    size = os.path.getsize(path)
    if size < 24:
        raise GGUFError("%s is not a GGUF model: %d bytes, shorter than a GGUF header (truncated or empty download?)"
                        % (path, size))
    try:
        with open(path, "rb") as handle:
            magic = handle.read(4)
    except (IOError, OSError) as err:
        raise GGUFError("%s cannot be read: %s" % (path, err))
    if magic != b"GGUF":
        raise GGUFError("%s is not a GGUF model: it starts with %r, not b'GGUF'" % (path, magic))
    header = read_header(path)
    tensors, end = _tensor_sizes(path, header["tensors"], header["data_offset"])
    if end > size:
        raise GGUFError("%s is truncated: the tensor table needs %d bytes, the file has %d (incomplete download?)"
                        % (path, end, size))
    return header["fields"], tensors, size


def file_type_label(file_type_id):
    """general.file_type (llama_ftype) -> label like Q4_K_M, or None."""
    if file_type_id is None:
        return None
    try:
        from gguf import LlamaFileType
        name = LlamaFileType(int(file_type_id)).name
    except (ImportError, ValueError):
        return None
    for prefix in ("MOSTLY_", "ALL_"):
        if name.startswith(prefix):
            return name[len(prefix):]
    return name


def _guess_file_type(tensors):
    """Label of the quantization that holds the most bytes among 2-D tensors."""
    totals = {}
    for t in tensors:
        if len(t["shape"]) >= 2:
            totals[t["type_name"]] = totals.get(t["type_name"], 0) + t["n_bytes"]
    if not totals:
        return None
    return max(sorted(totals), key=lambda k: totals[k])


def _key(fields, arch, suffix, default=None):
    return fields.get("%s.%s" % (arch, suffix), default)


def read_model(path):
    """Everything gguf_info returns about the model at `path` (a single file or
    any shard of a split one). Raises GGUFError naming the file."""
    paths = shard_paths(path)
    fields, tensors, sizes = None, [], []
    for shard_no, shard in enumerate(paths):
        shard_fields, shard_tensors, size = _read_one(shard)
        if fields is None:
            fields = shard_fields
        declared = shard_fields.get("split.count")
        if declared is not None and int(declared) != len(paths):
            raise GGUFError("%s says split.count=%s but %d shard files were found" % (shard, declared, len(paths)))
        tensors.extend(shard_tensors)
        sizes.append(size)
    if len(paths) == 1 and int(fields.get("split.count") or 1) > 1:
        raise GGUFError("%s is shard 1 of a %s-file split model but is not named NAME-00001-of-%05d.gguf; "
                        "keep the shard names llama.cpp wrote" % (path, fields.get("split.count"),
                                                                  int(fields.get("split.count"))))
    expected = fields.get("split.tensors.count")
    if expected is not None and int(expected) != len(tensors):
        raise GGUFError("%s: split.tensors.count is %s but the shards hold %d tensors" % (paths[0], expected, len(tensors)))

    arch = fields.get("general.architecture")
    if not arch:
        raise GGUFError("%s has no general.architecture key: not a llama.cpp model" % paths[0])
    block_count = _key(fields, arch, "block_count")
    if block_count is None:
        raise GGUFError("%s has no %s.block_count key: cannot tell its layers" % (paths[0], arch))
    by_name = dict((t["name"], t) for t in tensors)
    embd = by_name.get("token_embd.weight")
    output = by_name.get("output.weight")
    n_embd = _key(fields, arch, "embedding_length") or (embd["shape"][0] if embd else None)
    vocab = _key(fields, arch, "vocab_size")
    if vocab is None and embd is not None and len(embd["shape"]) > 1:
        vocab = embd["shape"][1]
    if vocab is None and isinstance(fields.get("tokenizer.ggml.tokens"), (list, UndecodedArray)):
        vocab = len(fields["tokenizer.ggml.tokens"])
    head_count = _key(fields, arch, "attention.head_count", 0)
    file_type_id = fields.get("general.file_type")
    weight_bytes = sum(t["n_bytes"] for t in tensors)
    parameter_count = sum(t["n_elements"] for t in tensors)
    ff = _key(fields, arch, "feed_forward_length")

    meta = {
        "model_path": paths[0],
        "files": paths,
        "split_count": len(paths),
        "file_size_bytes": sum(sizes),
        "tensor_count": len(tensors),
        "architecture": arch,
        "name": fields.get("general.name"),
        "file_type": file_type_label(file_type_id) or _guess_file_type(tensors),
        "file_type_id": int(file_type_id) if file_type_id is not None else None,
        "block_count": int(block_count),
        "embedding_length": int(n_embd) if n_embd else None,
        "feed_forward_length": ff,
        "head_count": head_count,
        "head_count_kv": _key(fields, arch, "attention.head_count_kv", head_count),
        "key_length": None,
        "value_length": None,
        "context_length": _key(fields, arch, "context_length"),
        "vocab_size": int(vocab) if vocab is not None else None,
        "parameter_count": parameter_count,
        "weight_bytes": weight_bytes,
        "bits_per_weight": round(weight_bytes * 8.0 / parameter_count, 4) if parameter_count else None,
        "token_embd_bytes": embd["n_bytes"] if embd else 0,
        "output_bytes": output["n_bytes"] if output else 0,
        "tied_embeddings": output is None,
        "sliding_window": _key(fields, arch, "attention.sliding_window"),
        "sliding_window_pattern": _key(fields, arch, "attention.sliding_window_pattern"),
        "full_attention_interval": _key(fields, arch, "full_attention_interval"),
        "nextn_predict_layers": _key(fields, arch, "nextn_predict_layers"),
        "key_length_swa": _key(fields, arch, "attention.key_length_swa"),
        "value_length_swa": _key(fields, arch, "attention.value_length_swa"),
        "ssm_conv_kernel": _key(fields, arch, "ssm.conv_kernel"),
        "ssm_inner_size": _key(fields, arch, "ssm.inner_size"),
        "ssm_state_size": _key(fields, arch, "ssm.state_size"),
        "ssm_group_count": _key(fields, arch, "ssm.group_count"),
        "ssm_time_step_rank": _key(fields, arch, "ssm.time_step_rank"),
        "wkv_head_size": _key(fields, arch, "wkv.head_size"),
        "token_shift_count": _key(fields, arch, "token_shift_count"),
        "shortconv_l_cache": _key(fields, arch, "shortconv.l_cache"),
    }
    meta["key_length"] = _key(fields, arch, "attention.key_length")
    meta["value_length"] = _key(fields, arch, "attention.value_length")
    try:
        check_model_metadata(meta, RECURRENT_ARCHS)
    except SchemaError as err:
        raise GGUFError("%s: %s" % (paths[0], err))
    n_head0 = _first_nonzero(head_count) if isinstance(head_count, list) else head_count
    default_dim = meta["embedding_length"] // n_head0 if n_head0 and meta["embedding_length"] else None
    for name in ("key_length", "value_length"):
        if meta[name] is None:
            meta[name] = default_dim
    try:
        meta.update(kv_figures(meta))
    except (ValueError, KeyError, TypeError, ZeroDivisionError) as err:
        raise GGUFError("%s: inconsistent attention metadata: %s" % (paths[0], err))
    return meta
