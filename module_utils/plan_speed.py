# -*- coding: utf-8 -*-
"""The speed a plan will see, not only the ceiling the card allows.

decode ceiling (plan_memory) x decode efficiency = expected single-stream decode.
The efficiency (measured decode / ceiling) depends on the GPU's kernels and the
weight type (Q3_K_M decodes slower than Q4_K_M on an H200 although it reads
fewer bytes), so it is looked up per (GPU family, quant family, architecture
kind): first in the fleet's own calibration (figures the verify stage measured on
cards of the same name), then in the table below, whose every entry names its
source. docs/planning.md, "Expected speed", explains each figure.
Free of Ansible (unit-tested); Python 3.8-compatible."""
from __future__ import absolute_import, division, print_function

__metaclass__ = type

import math

# compute capability (major, minor) -> GPU family
_FAMILIES = {(6, 0): "pascal", (6, 1): "pascal", (7, 0): "volta", (7, 2): "volta", (7, 5): "turing",
             (8, 0): "ampere", (8, 6): "ampere", (8, 7): "ampere", (8, 9): "ada", (9, 0): "hopper",
             (10, 0): "blackwell", (12, 0): "blackwell"}

# (GPU family, quant family, architecture kind or "*") -> (efficiency, source).
# Single-stream decode measured with llama.cpp (flash attention, all layers on the
# GPU, short context) over plan_memory.decode_ceiling for the same file.
EFFICIENCY_TABLE = {
    # H200, pinned llama.cpp, CUDA 13, llama-bench tg128 of one random-weight
    # 32B-shaped file requantized to each type (benchmarks/results/h200-quant-sweep-2026-12-01)
    ("hopper", "Q3_K", "*"): (0.197, "H200 quant sweep 2026-12-01 (Q3_K_M, llama-bench)"),
    ("hopper", "Q4_K", "*"): (0.322, "H200 quant sweep 2026-12-01 (Q4_K_M, llama-bench); 0.31-0.32 through "
                                     "llama-server in gpu-host-2026-12-01c"),
    ("hopper", "Q5_K", "*"): (0.343, "H200 quant sweep 2026-12-01 (Q5_K_M, llama-bench)"),
    ("hopper", "Q6_K", "*"): (0.312, "H200 quant sweep 2026-12-01 (Q6_K, llama-bench)"),
    ("hopper", "Q8_0", "*"): (0.488, "H200 quant sweep 2026-12-01 (Q8_0, llama-bench)"),
    # a hybrid (gated delta net + every 4th layer full attention) decodes a smaller
    # share of its ceiling: the dense figure predicted it 15-25% high
    ("hopper", "Q4_K", "hybrid"): (0.245, "H200 2026-12-01, random-weight Qwen3.5-27B-shaped hybrid Q4_K, "
                                          "llama-server single stream, -c 32768 -np 4 (h200-hybrid-2026-12-01)"),
    # the other types: the hybrid quant sweep (16 layers, llama-bench) scaled by the
    # Q4_K ratio of the whole model through llama-server to the sweep (0.245 / 0.280);
    # the dense figures over-predicted these 10-15% (h200-hybrid-quant-sweep-2026-12-01)
    ("hopper", "Q3_K", "hybrid"): (0.168, "H200 hybrid quant sweep 2026-12-01: Q3_K_M 0.192 x 0.875"),
    ("hopper", "Q5_K", "hybrid"): (0.264, "H200 hybrid quant sweep 2026-12-01: Q5_K_M 0.302 x 0.875"),
    ("hopper", "Q6_K", "hybrid"): (0.248, "H200 hybrid quant sweep 2026-12-01: Q6_K 0.283 x 0.875"),
    ("hopper", "Q8_0", "hybrid"): (0.384, "H200 hybrid quant sweep 2026-12-01: Q8_0 0.439 x 0.875"),
    # V100: public measurements, not this project's (no V100 here); docs/planning.md
    # lists each source. 900 GB/s ceiling, ~27B files unless said.
    # Q4_K fitted on the one-card rows kept for fitting in benchmarks/v100_public.yml
    # (27B Q4_K_M: 0.610 and 0.581 of the ceiling); the two-card layer split's 0.70 is
    # not one card's figure. The rows kept for checking are within 4-7% of it.
    ("volta", "Q4_K", "*"): (0.60, "public V100 figures, 27B Q4_K_M on one card: 0.61 (sudoingX/qwen38-mtp, "
                                   "V100 32GB) and 0.58 (ebongard/renfield PR #1267, V100-SXM2-32GB)"),
    ("volta", "Q5_K", "*"): (0.60, "no V100 measurement: Q4_K's figure (on the H200 Q5_K and Q6_K were within 7% "
                                   "of Q4_K)"),
    ("volta", "Q6_K", "*"): (0.60, "no V100 measurement: Q4_K's figure (on the H200 Q5_K and Q6_K were within 7% "
                                   "of Q4_K)"),
    ("volta", "Q4_0", "*"): (0.55, "public V100-SXM2-32GB figure, llama 7B Q4_0, llama-bench tg128 ~132 tok/s "
                                   "(llama.cpp discussion #15013): a 7B's share, low for a 27B"),
    ("volta", "Q8_0", "*"): (0.62, "public V100-PCIE figure, 7B Q8_0, 2024 build (llama.cpp PR #4809): low "
                                   "confidence"),
    # Q3_K and Q2_K: the 8B figures as measured; the size term moves them to a 27B
    ("volta", "Q3_K", "*"): (0.31, "public V100-PCIE figure, llama 8B Q3_K_S, llama-bench at one token a step "
                                   "(llama.cpp PR #28912)"),
    ("volta", "Q2_K", "*"): (0.375, "public V100-PCIE figure, llama 8B Q2_K, llama-bench at one token a step "
                                    "(llama.cpp PR #28912)"),
    ("volta", "F16", "*"): (0.75, "public V100-PCIE figure, 7B F16 0.79, 2024 build (llama.cpp PR #4809): low "
                                  "confidence"),
}

# The model size each table figure was measured at (billions of parameters): a figure
# moves to another size through the fixed time a token costs (FIXED_TOKEN_SECONDS).
# (GPU family, quant family) first, then (GPU family, "*"); none: the figure is used as is.
REFERENCE_PARAMS_B = {
    ("hopper", "*"): 32.8,                      # the 32B-shaped quant sweeps and servers
    ("volta", "*"): 27.0,                       # Q4_K (and Q5_K / Q6_K, which borrow it)
    ("volta", "Q4_0"): 6.74, ("volta", "Q8_0"): 6.74, ("volta", "F16"): 6.74,   # llama 7B
    ("volta", "Q3_K"): 8.0, ("volta", "Q2_K"): 8.0,                             # llama 8B
}

# The size term. A token costs the time to read the weights at the kernels' speed plus
# a fixed time that does not grow with the model (the server's loop, sampling, the
# graph's launch): time = weights / (bandwidth x e) + t0, so a small model reaches a
# lower share of its ceiling than a large one at the same e. Fitted on two models of
# the same 32B shape (64 and 6 layers, Q4_K) served on one H100 through the roles, in
# two runs: t0 0.31 and 0.47 ms (benchmarks/size_term.py over gpu-host-2026-12-06-models
# and -models-b). Taken for every family: it is mostly host time (no V100 pair of one
# weight type at two sizes is in the public figures kept for fitting).
FIXED_TOKEN_SECONDS = (0.00039, "two models of one 32B shape (64 and 6 layers, Q4_K) on an H100 through the "
                                "roles: 0.31 and 0.47 ms a token (benchmarks/size_term.py)")

# The size term holds within the sizes it was fitted on: the pair's weights took 5.37 and
# 0.62 ms to read (8.7x apart). Far outside, a token's fixed cost is not one constant: a
# 135M model read in 0.03 ms served 598 tok/s on the same H100 (1.7 ms a token, where t0
# says 0.4), and its record would plan a 32B there at a seventh of its speed. So a
# calibration record is used for a model only where their weight read times are at most
# this factor apart; farther records are left out (the source counts them).
CALIBRATION_SIZE_FACTOR = 10.0

# A weight type the table lacks on a family it has (IQ4_XS on a V100): that family's
# Q4_K figure, the closest kernel measured on the same cards, labelled assumed. A
# family the table lacks: the H200's Q4_K figure, the one the project measured both
# through llama-bench and through llama-server.
DEFAULT_EFFICIENCY = (0.32, "assumed: the H200's Q4_K figure (no measurement for this GPU family and weight type)")

# The prompt (prefill) is bound by the card's arithmetic, not by its memory: 2 x the
# parameters in operations per token, so prompt tokens/s x parameters stays about
# constant on one GPU family and build. GPU family -> (prompt tokens/s x 10^9
# parameters, source): a short prompt, flash attention, every layer on the GPU.
# Checked against a long prompt in benchmarks/v100_check.py (attention over a deep
# context adds work this leaves out).
PREFILL_RATE_TABLE = {
    "hopper": (67100, "this project: llama-bench pp256 of a 32.8B-parameter Q4_K file on an H200, 2047 tok/s, "
                      "through the verify stage (gpu-host-2026-12-03c)"),
    "volta": (20500, "public: llama 7B Q4_0 (6.74B parameters), llama-bench pp512 3043 tok/s on a "
                     "V100-SXM2-32GB (llama.cpp discussion #15013)"),
}

# Aggregate decode over n busy slots = single stream x n ** exponent; the exponent
# depends on n. llama.cpp's CUDA backend multiplies a quantized weight by up to 8
# streams' vectors at once with its mat-vec kernel (MMVQ_MAX_BATCH_SIZE 8,
# ggml-cuda/mmvq.cuh), by more with the tiled MMQ kernel: 8 streams batch worst.
# Measured through llama-server on an H200, streams' summed decode / one stream
# (h200-expected-2026-12-01, h200-hybrid-2026-12-01): dense 2.30-2.34 at 4, 2.62
# (q8_0) and 2.77 (f16) at 8, 4.59 at 16 (q4_0); hybrid (its recurrent layers run
# per sequence) 2.10-2.14 at 4, 2.47 at 8, 3.41 at 16. Between the points the ratio
# is interpolated in log-log; past the last one it grows with the last point's
# exponent. The KV type's own effect on batching was within the spread (q8_0 2.62 vs
# f16 2.77 at 8 slots).
AGGREGATE_RATIO_BY_ARCH = {
    "dense": ((1, 1.0), (4, 2.30), (8, 2.70), (16, 4.59)),
    "hybrid": ((1, 1.0), (4, 2.10), (8, 2.47), (16, 3.41)),
}
# the power-law summary of the dense curve at 4 and 16 slots, for what has no curve
AGGREGATE_EXPONENT = 0.58

# A quantized KV cache costs single-stream speed (measured on an H200: q8_0 78 vs
# f16 83 tok/s, same file and binary): expected decode is scaled by this.
KV_TYPE_SPEED = {"f16": 1.0, "q8_0": 0.94, "q4_0": 0.94}

# Calibration figures outside this range are measurement failures (a stalled
# stream, a CPU build), not efficiencies: they are not recorded or used.
EFFICIENCY_RANGE = (0.02, 1.5)

CALIBRATION_VERSION = 1

# A new measurement within this fraction of the recorded one keeps the record as
# it is, so a rerun that measures the same service does not move the next plan
# (and the model stage stays idempotent); a real change replaces it.
CALIBRATION_TOLERANCE = 0.05


def gpu_family(gpu):
    """'volta', 'hopper', ... from the compute capability; 'unknown' when absent."""
    try:
        major, minor = (int(x) for x in str(gpu.get("compute_capability") or "").split(".")[:2])
    except ValueError:
        return "unknown"
    if (major, minor) in _FAMILIES:
        return _FAMILIES[(major, minor)]
    same_major = [f for (ma, _), f in sorted(_FAMILIES.items()) if ma == major]
    return same_major[-1] if same_major else "unknown"


def quant_family(quant):
    """The weight type's kernel family: Q4_K_M and Q4_K_S -> Q4_K, Q8_0 -> Q8_0, IQ4_XS as is."""
    label = str(quant or "").upper()
    for suffix in ("_XXS", "_XS", "_S", "_M", "_L"):
        if label.startswith("Q") and "_K" in label and label.endswith(suffix):
            return label[: -len(suffix)]
    return label or "unknown"


def arch_kind(model):
    """'dense' when every layer is full attention; 'hybrid' with sliding-window or recurrent layers."""
    kinds = set(layer["kind"] for layer in model.get("layers") or [] if layer["kind"] != "none")
    return "dense" if kinds <= {"full"} else "hybrid"


def _median(values):
    values = sorted(values)
    n = len(values)
    return values[n // 2] if n % 2 else (values[n // 2 - 1] + values[n // 2]) / 2.0


def _records(calibration):
    if not calibration:
        return []
    records = calibration.get("records") if isinstance(calibration, dict) else calibration
    out = []
    for r in records or []:
        try:
            eff = float(r.get("efficiency"))
        except (TypeError, ValueError, AttributeError):
            continue
        if EFFICIENCY_RANGE[0] <= eff <= EFFICIENCY_RANGE[1]:
            out.append(r)
    return out


def weight_read_seconds(gpu, model):
    """The time the card takes to read the model's GPU weights once (a token's floor),
    or None where the bandwidth or the size is unknown."""
    try:
        seconds = float(model.get("gpu_weight_bytes") or 0) / float(gpu.get("memory_bandwidth_bytes_per_s") or 0)
    except (TypeError, ValueError, ZeroDivisionError):
        return None
    return seconds if seconds > 0 else None


def at_size(efficiency, measured_s, planned_s):
    """An efficiency measured where reading the weights took measured_s, moved to a model
    whose weights take planned_s (FIXED_TOKEN_SECONDS); as is where either is unknown."""
    if not measured_s or not planned_s or measured_s <= 0 or planned_s <= 0:
        return efficiency
    inverse = 1.0 / efficiency + FIXED_TOKEN_SECONDS[0] * (1.0 / planned_s - 1.0 / measured_s)
    return min(max(1.0 / inverse, EFFICIENCY_RANGE[0]), EFFICIENCY_RANGE[1]) if inverse > 0 else EFFICIENCY_RANGE[1]


def _record_seconds(record):
    """The weight read time of the model a calibration record measured (older records:
    its ceiling's time, which also counts the planned KV)."""
    if isinstance(record.get("weight_read_s"), (int, float)) and record["weight_read_s"] > 0:
        return float(record["weight_read_s"])
    ceiling = record.get("decode_ceiling_tps")
    return 1.0 / float(ceiling) if isinstance(ceiling, (int, float)) and ceiling > 0 else None


def _reference_seconds(family, qfam, model, planned_s):
    """The weight read time, on this card, of the model size the table's figure was measured at."""
    ref_b = REFERENCE_PARAMS_B.get((family, qfam), REFERENCE_PARAMS_B.get((family, "*")))
    params = float(model.get("params") or 0)
    if not ref_b or params <= 0 or not planned_s:
        return None, None
    return planned_s * ref_b * 1e9 / params, ref_b


def _sized(value, measured_s, planned_s, what):
    """(the value at the planned size, the words that say it moved) for a source."""
    moved = at_size(value, measured_s, planned_s)
    if abs(moved - value) < 0.0005:
        return round(value, 3), ""
    return round(moved, 3), "; %.3f at this model's size (%s, %.2f ms a token fixed)" % (
        moved, what, FIXED_TOKEN_SECONDS[0] * 1000)


def near_in_size(record, planned_s):
    """Whether a calibration record measured a model close enough in size to this one
    (CALIBRATION_SIZE_FACTOR) to be moved to it; a record or model without a size is."""
    measured_s = _record_seconds(record)
    if not measured_s or not planned_s:
        return True
    return max(measured_s / planned_s, planned_s / measured_s) <= CALIBRATION_SIZE_FACTOR


def _far_note(count):
    return ("; %d record(s) of models more than %gx larger or smaller left out" % (count, CALIBRATION_SIZE_FACTOR)
            if count else "")


def efficiency_for(gpu, model, calibration=None):
    """{value, source, gpu_family, quant_family, arch, from, weight_read_s}: the fleet's
    median for cards of this name (then of this family) with this weight type and
    architecture kind, else the table's figure, else the table's Q4_K figure for this
    family, else DEFAULT_EFFICIENCY; each moved to this model's size (at_size)."""
    family, qfam, arch = gpu_family(gpu), quant_family(model.get("quant")), arch_kind(model)
    planned_s = weight_read_seconds(gpu, model)
    out = {"gpu_family": family, "quant_family": qfam, "arch": arch,
           "weight_read_s": round(planned_s, 6) if planned_s else None}
    same_kind = [r for r in _records(calibration) if r.get("quant_family") == qfam and r.get("arch") == arch]
    records = [r for r in same_kind if near_in_size(r, planned_s)]
    far = len(same_kind) - len(records)
    for scope, same in (("name", lambda r: r.get("gpu_name") == gpu.get("name")),
                        ("family", lambda r: r.get("gpu_family") == family)):
        matching = [r for r in records if same(r)]
        if matching:
            # each record moved from the size it measured to this model's, then the median
            value = _median([at_size(float(r["efficiency"]), _record_seconds(r), planned_s) for r in matching])
            plain = _median([float(r["efficiency"]) for r in matching])
            where = gpu.get("name") if scope == "name" else "%s cards" % family
            note = "" if abs(value - plain) < 0.0005 else "; %.3f as measured, %.3f at this model's size" % (
                plain, value)
            out.update(value=round(value, 3), source="fleet calibration: median of %d measurement(s) on %s, %s %s%s%s"
                       % (len(matching), where, qfam, arch, note, _far_note(far)), **{"from": "calibration"})
            return out
    for key, assumed in (((family, qfam, arch), False), ((family, qfam, "*"), False),
                         ((family, "Q4_K", arch), True), ((family, "Q4_K", "*"), True)):
        if key in EFFICIENCY_TABLE:
            value, source = EFFICIENCY_TABLE[key]
            if assumed:
                source = "assumed: the %s Q4_K figure (no measurement of %s on %s cards; %s)" % (
                    family, qfam, family, source)
            ref_s, ref_b = _reference_seconds(family, key[1], model, planned_s)
            value, note = _sized(value, ref_s, planned_s, "the figure is for %sB parameters" % ref_b)
            out.update(value=value, source=source + note + _far_note(far), **{"from": "table"})
            return out
    value, source = DEFAULT_EFFICIENCY
    ref_s, ref_b = _reference_seconds("hopper", "Q4_K", model, planned_s)
    value, note = _sized(value, ref_s, planned_s, "the figure is for %sB parameters" % ref_b)
    out.update(value=value, source=source + note, **{"from": "default"})
    return out


def curve_exponent(arch, slots):
    """The built-in curve's exponent at this slot count: log(ratio) / log(slots)."""
    points = AGGREGATE_RATIO_BY_ARCH.get(arch, AGGREGATE_RATIO_BY_ARCH["dense"])
    n = max(2, int(slots))  # one stream has no exponent: the curve's first segment's
    for (n0, r0), (n1, r1) in zip(points, points[1:]):
        if n <= n1:
            t = (math.log(n) - math.log(n0)) / (math.log(n1) - math.log(n0))
            return round((math.log(r0) + t * (math.log(r1) - math.log(r0))) / math.log(n), 3)
    last_n, last_r = points[-1]
    return round(math.log(last_r) / math.log(last_n), 3)


def aggregate_exponent(gpu, calibration=None, arch="dense", slots=4):
    """The fleet's median exponent for cards of this name and architecture kind at
    this slot count (verify measures at the planned slots), else the built-in curve's."""
    values = [float(r["aggregate_exponent"]) for r in _records(calibration)
              if r.get("gpu_name") == gpu.get("name") and r.get("arch", "dense") == arch
              and r.get("parallel") == int(slots)
              and isinstance(r.get("aggregate_exponent"), (int, float)) and 0 < r["aggregate_exponent"] <= 1]
    return round(_median(values), 3) if values else curve_exponent(arch, slots)


def expected_decode(ceiling, efficiency, cache_type="f16"):
    """Expected single-stream decode, tok/s."""
    return ceiling * efficiency * KV_TYPE_SPEED.get(cache_type, 1.0)


# a measured prompt rate (tok/s x 10^9 parameters) outside this range is a failed
# measurement (a CPU build, a stalled request), not a GPU's figure
PREFILL_RATE_RANGE = (500.0, 2000000.0)


def measured_prefill_rate(gpu, calibration=None, planned_s=None):
    """(rate, count): the median prompt rate verify measured on cards of this name (its
    first-token prompt: tok/s x 10^9 parameters) of models near this one's size (a small
    model's prompt is bound by more than its parameters), or None where none was measured."""
    values = [float(r["prefill_rate"]) for r in _records(calibration)
              if r.get("gpu_name") == gpu.get("name") and isinstance(r.get("prefill_rate"), (int, float))
              and near_in_size(r, planned_s)
              and PREFILL_RATE_RANGE[0] <= r["prefill_rate"] <= PREFILL_RATE_RANGE[1]]
    return (round(_median(values), 1), len(values)) if values else None


def expected_prefill(gpu, model, prompt_tokens, calibration=None):
    """{prompt_tps, ttft_s, prompt_tokens, params, source}: the prompt speed the plan expects
    and the time to the first token of a prompt of prompt_tokens: from what verify measured
    on cards of this name where it has (the calibration learns it as it learns decode),
    else the family's table figure; both None, and the source saying why, where there is
    neither or the model has no parameter count."""
    family, params = gpu_family(gpu), float(model.get("params") or 0)
    out = {"prompt_tokens": int(prompt_tokens), "prompt_tps": None, "ttft_s": None, "params": int(params) or None}
    if params <= 0:
        return dict(out, source="the model's parameter count is unknown")
    measured = measured_prefill_rate(gpu, calibration, weight_read_seconds(gpu, model))
    if measured:
        rate, source = measured[0], ("verify measured on %s: %.0f prompt tok/s x 10^9 parameters, the median of %d "
                                     "first-token prompt(s)" % (gpu.get("name"), measured[0], measured[1]))
    elif family in PREFILL_RATE_TABLE:
        rate, source = PREFILL_RATE_TABLE[family]
    else:
        return dict(out, source="no prompt-speed figure for %s cards" % family)
    tps = rate * 1e9 / params
    return dict(out, prompt_tps=round(tps, 1), ttft_s=round(prompt_tokens / tps, 2), source=source)


def expected_aggregate(single, parallel, exponent=AGGREGATE_EXPONENT):
    """Expected decode summed over `parallel` busy slots, tok/s."""
    return single * max(1, int(parallel)) ** exponent


# --- calibration: what verify measured, kept on the controller ------------------

def calibration_record(instance, plan, host, measured_at=None, build=None):
    """(record, None) from a verify instance record and its plan, or (None, why not)
    when the instance gives no GPU efficiency (CPU build, no single-stream figure,
    a partial offload, a plan without the efficiency's keys, an implausible ratio)."""
    ratio = instance.get("ceiling_ratio")
    eff = plan.get("decode_efficiency") or {}
    if ratio is None:
        return None, "no ratio to the ceiling (%s)" % (instance.get("ceiling_note") or "not measured")
    if plan.get("partial_offload"):
        return None, "a partial offload says nothing of the GPU's own efficiency"
    if (instance.get("spec_type") or plan.get("spec_type") or "none") != "none":
        # its speed and memory are the speculation's (a draft's too), not the plain decode's
        # the next plan without it expects: module_utils/speculation.py keeps its verdict
        return None, "speculative decoding (%s) served: its figures are the trial's, not the card's decode" % (
            instance.get("spec_type") or plan.get("spec_type"))
    if not eff.get("quant_family"):
        return None, "the plan has no decode_efficiency (planned by an older llm-fleet)"
    # the ratio is measured against the ceiling; the plan's expected speed also
    # carries the KV type's cost, which the efficiency must not count twice
    efficiency = float(ratio) / KV_TYPE_SPEED.get(plan.get("cache_type_k") or "f16", 1.0)
    if not EFFICIENCY_RANGE[0] <= efficiency <= EFFICIENCY_RANGE[1]:
        return None, "efficiency %.3f is outside %.2f-%.2f: a failed measurement, not a GPU's figure" % (
            efficiency, EFFICIENCY_RANGE[0], EFFICIENCY_RANGE[1])
    exponent = None
    single, slots = instance.get("single_stream_tps"), instance.get("parallel")
    # the aggregate the plan predicts is decode only: the streams' own rates summed
    # with every slot busy, not all tokens over the wall time (which counts the
    # prompts and the first tokens' wait too)
    level = [l for l in instance.get("levels") or [] if slots and l.get("concurrency") == int(slots)]
    full = (level[0].get("aggregate_decode_tps") if level else None) or instance.get("aggregate_slots_tps")
    if single and full and slots and int(slots) > 1 and full > single:
        exponent = round(math.log(float(full) / float(single)) / math.log(int(slots)), 3)
    # the first token's prompt speed, as a rate that moves to another model's size
    measured_first, planned_first = instance.get("first_token") or {}, plan.get("first_token") or {}
    prefill_rate = None
    if measured_first.get("prompt_tps") and planned_first.get("params") and plan.get("split_mode", "none") == "none":
        prefill_rate = round(float(measured_first["prompt_tps"]) * float(planned_first["params"]) / 1e9, 1)
        if not PREFILL_RATE_RANGE[0] <= prefill_rate <= PREFILL_RATE_RANGE[1]:
            prefill_rate = None
    return {
        "host": host, "gpu_uuid": instance.get("gpu_uuid"), "gpu_name": instance.get("gpu_name") or plan.get("gpu_name"),
        "gpu_family": eff.get("gpu_family"), "quant": plan.get("quant"), "quant_family": eff.get("quant_family"),
        "arch": eff.get("arch"), "cache_type": plan.get("cache_type_k"), "parallel": slots,
        "efficiency": round(efficiency, 3), "aggregate_exponent": exponent,
        "single_stream_tps": single, "decode_ceiling_tps": plan.get("decode_ceiling_tps"),
        # the size it was measured at (the size term moves it to another model's)
        "weight_read_s": eff.get("weight_read_s"),
        # the process's CUDA context as measured (verify: what NVML saw less the plan's other parts)
        "cuda_overhead_bytes": (instance.get("vram") or {}).get("cuda_overhead_bytes"),
        # prompt tok/s x 10^9 parameters of the first-token prompt, and that prompt's length
        "prefill_rate": prefill_rate,
        "prefill_prompt_tokens": measured_first.get("prompt_tokens") if prefill_rate else None,
        "build": build, "measured_at": measured_at,
    }, None


def _close(old, new):
    try:
        a, b = float(old["efficiency"]), float(new["efficiency"])
    except (KeyError, TypeError, ValueError):
        return False
    ea, eb = old.get("aggregate_exponent"), new.get("aggregate_exponent")
    same_exponent = (ea is None) == (eb is None) and (ea is None or abs(float(ea) - float(eb)) <= 0.05)
    oa, ob = old.get("cuda_overhead_bytes"), new.get("cuda_overhead_bytes")
    same_overhead = (oa is None) == (ob is None) and (oa is None or abs(float(oa) - float(ob)) <= 16 * (1 << 20))
    pa, pb = old.get("prefill_rate"), new.get("prefill_rate")
    same_prefill = (pa is None) == (pb is None) and (pa is None or abs(float(pb) - float(pa)) <= CALIBRATION_TOLERANCE
                                                     * float(pa))
    return abs(b - a) <= CALIBRATION_TOLERANCE * a and same_exponent and same_overhead and same_prefill


def merge_calibration(existing, new_records):
    """The calibration file's content with new_records replacing the older entry of
    the same card, weight type and build (a rerun refreshes, it does not pile up);
    a new figure within CALIBRATION_TOLERANCE of the recorded one keeps the record."""
    key = lambda r: (r.get("host"), r.get("gpu_uuid"), r.get("quant"), r.get("arch"), r.get("build"))  # noqa: E731
    old = dict((key(r), r) for r in _records(existing))
    fresh = [old[key(r)] if key(r) in old and _close(old[key(r)], r) else r for r in new_records or [] if r]
    keys = set(key(r) for r in fresh)
    kept = [r for r in old.values() if key(r) not in keys]
    records = sorted(kept + fresh, key=lambda r: (str(r.get("gpu_name")), str(r.get("quant")), str(r.get("host")),
                                                   str(r.get("gpu_uuid"))))
    out = {"version": CALIBRATION_VERSION, "records": records}
    # the rollout's speed baselines (module_utils/speed_gate.py) and whether speculative
    # decoding paid (module_utils/speculation.py) live in the same file
    for kept_key in ("baselines", "speculation"):
        if isinstance(existing, dict) and existing.get(kept_key):
            out[kept_key] = existing[kept_key]
    return out


# a measured CUDA context outside this range is a failed measurement, not a context
OVERHEAD_RANGE = (64 << 20, 4 << 30)


def measured_overhead(gpus, calibration=None, policies=()):
    """The GPUs with the CUDA context verify measured on cards of their name (the
    median of the calibration's records: cuda_overhead_bytes, cuda_overhead_source),
    which the memory budget then uses instead of the table's figure; unchanged where
    none was measured or a policy sets overhead_bytes itself (the operator's figure wins)."""
    if any("overhead_bytes" in (p or {}) for p in policies):
        return gpus
    out = []
    for gpu in gpus:
        values = []
        for r in (calibration or {}).get("records") or [] if isinstance(calibration, dict) else []:
            try:
                value = int(r.get("cuda_overhead_bytes"))
            except (TypeError, ValueError, AttributeError):
                continue
            if r.get("gpu_name") == gpu.get("name") and OVERHEAD_RANGE[0] <= value <= OVERHEAD_RANGE[1]:
                values.append(value)
        if values:
            value = int(_median(values))
            gpu = dict(gpu, cuda_overhead_bytes=value, cuda_overhead_source=(
                "the CUDA context verify measured on %s: %d MiB, the median of %d process(es)"
                % (gpu.get("name"), value >> 20, len(values))))
        out.append(gpu)
    return out
