#!/usr/bin/env python3
"""Public V100 measurements against what this project's planner expects (issue 33).

Reads benchmarks/v100_public.yml (public llama.cpp figures on Tesla V100 cards, each
with its address) and, for every entry, computes the planner's expected single-stream
decode for that very configuration with module_utils, the way llama_plan.evaluate()
and plan_gpu() do:

    model    = plan_model.model_from_metadata(quant, metadata, file_bytes)
    ceiling  = plan_split.ceiling_for(model, gpu_or_split_group, policy, depth, kv_type)
    eff      = plan_speed.efficiency_for(gpu, model)          (no fleet calibration)
    expected = llama_plan.expected_for(model, gpu, ceiling, eff["value"], kv_type)

The KV fill is the measured depth (policy kv_fill 1.0, tokens per slot = depth), not
the planner's planned half-full slot: this compares like with like. Where a row
measured the prompt too, the planner's expected prompt speed is printed beside it
(plan_speed.expected_prefill, from the model's parameters).

Prints a table (id, model, quant, card, role, measured, expected, expected/measured)
and, per role, the mean and largest absolute error for 27-32B models and for all rows.
Reads and prints only: no GPU, no network, no planner constant changed.

    .venv/bin/python benchmarks/v100_check.py [--data benchmarks/v100_public.yml] [--save [DIR]]

--save writes the printed table (table.txt) and the rows (rows.json) to DIR, by default
benchmarks/results/v100-public-<UTC date>/.
"""
import argparse
import datetime
import json
import os
import sys

import yaml

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GIB = 1 << 30
V100_BANDWIDTH = 900e9     # HBM2, SXM2 and PCIe alike (../shared/FACTS.md: "~900 GB/s")
V100_CC = "7.0"
BIG = (27, 32)             # the model sizes the 5% target is about (billions)


sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
# module_utils as the hosts map it (ansible.module_utils), imported as the other benchmarks do
from bench_configs import llama_plan, plan_model, plan_speed, plan_split  # noqa: E402

# The real architectures' shapes, in gguf_info's names, from public config figures.
# Figures marked "assumed" were not found in a source read; each says what it affects.
SHAPES = {
    # Qwen3.5/3.6/3.8-27B (arch qwen35, the same layout in all three): THUDM/slime
    # scripts/models/qwen3.5-27B.sh (64 layers, 5120 wide, 24 heads, 4 KV groups, head 256,
    # FFN 17408, vocabulary 248320) and this repository's tests/harness/gguf_writer.py
    # QWEN35_27B (every 4th layer full attention; gated delta net 16 key / 48 value heads of
    # 128, conv kernel 4); 262144 trained context (llama.cpp PR #23398 log: n_ctx_train).
    # The GGUF's 65th block (MTP head) keeps no KV and is read only with MTP on: left out.
    "qwen35-27b": dict(architecture="qwen35", block_count=64, embedding_length=5120, head_count=24,
                       head_count_kv=4, key_length=256, value_length=256, feed_forward_length=17408,
                       vocab_size=248320, context_length=262144, full_attention_interval=4,
                       ssm_conv_kernel=4, ssm_state_size=128, ssm_group_count=16, ssm_time_step_rank=48,
                       ssm_inner_size=48 * 128),
    # Qwen3.5-9B: hidden 4096, 16 heads, 4 KV heads of 256, FFN 12288 (paiml/aprender's
    # Qwen3.5-9B shape contract). ASSUMED: 32 layers, the 27B's vocabulary and interval,
    # no recurrent-state figures (the state is <2% of a token's bytes): they move the
    # ceiling by the embedding table only (host-side) and by the state.
    "qwen35-9b": dict(architecture="qwen35", block_count=32, embedding_length=4096, head_count=16,
                      head_count_kv=4, key_length=256, value_length=256, feed_forward_length=12288,
                      vocab_size=248320, context_length=262144, full_attention_interval=4),
    # gemma-4-31B: THUDM/slime scripts/models/gemma4-31B.sh (60 layers, 5376 wide, FFN 21504,
    # 32 heads, 16 KV groups of 256, vocabulary 262144); 5 sliding layers then 1 global as
    # in the Gemma 4 configs (layer_types); tied embeddings (Gemma). ASSUMED: a 1024-token
    # window and head 256 on the global layers too (Gemma 4 configs give global layers a
    # 512 head): at short depth the KV read is <1% of the weights either way.
    "gemma4-31b": dict(architecture="gemma4", block_count=60, embedding_length=5376, head_count=32,
                       head_count_kv=16, key_length=256, value_length=256, feed_forward_length=21504,
                       vocab_size=262144, sliding_window=1024,
                       sliding_window_pattern=[il % 6 < 5 for il in range(60)], tied_embeddings=True),
    # Llama-2-7B, the shape llama-bench calls "llama 7B": 32 layers, 4096 wide, 32 heads and
    # 32 KV heads, FFN 11008, vocabulary 32000, 4096 context (a llama.cpp load log of it,
    # ggml-org/llama.cpp issue #2641).
    "llama2-7b": dict(architecture="llama", block_count=32, embedding_length=4096, head_count=32,
                      head_count_kv=32, feed_forward_length=11008, vocab_size=32000, context_length=4096),
    # Llama-3.x-8B, llama-bench's "llama 8B": 32 layers, 4096 wide, 32 heads, 8 KV heads, FFN
    # 14336 (a GGUF dump of a Llama-3-8B fine-tune); vocabulary 128256, 131072 context (Llama 3.1).
    "llama31-8b": dict(architecture="llama", block_count=32, embedding_length=4096, head_count=32,
                       head_count_kv=8, feed_forward_length=14336, vocab_size=128256, context_length=131072),
}


def v100(index, card):
    mem = 16 if "16GB" in card.replace(" ", "") else 32
    return {"index": index, "uuid": "GPU-public-v100-%d" % index, "name": card, "memory_total_bytes": mem * GIB,
            "memory_bandwidth_bytes_per_s": V100_BANDWIDTH, "compute_capability": V100_CC,
            "pci_bus_id": "00000000:%02X:00.0" % (index + 1), "cpu_affinity": [], "numa_node": 0}


def gpu_for(entry):
    """One card, or the split group llama_plan plans a split with."""
    if int(entry.get("cards") or 1) == 1:
        return v100(0, entry["card"])
    cards = [v100(i, entry["card"]) for i in range(int(entry["cards"]))]
    if "nvlink" in (entry.get("test") or "").lower():
        for c in cards:
            c["nvlink_peers"] = [o["pci_bus_id"] for o in cards if o is not c]
    return plan_split.split_group(cards, entry["split"])


def expected(entry):
    meta = dict(SHAPES[entry["shape"]])
    meta["parameter_count"] = int(float(entry["params_b"]) * 1e9)
    size = entry.get("file_bytes")
    if size is None and entry.get("file_gib") is not None:
        size = int(float(entry["file_gib"]) * GIB)
    model = plan_model.model_from_metadata(entry["quant"], meta, int(size) if size else None)
    gpu = gpu_for(entry)
    cache_type = entry.get("cache_type") or "f16"
    policy = llama_plan.normalize_policy({"kv_fill": 1.0, "cache_types": [cache_type]})
    depth = int(entry.get("depth_tokens") or 0)
    ceiling = plan_split.ceiling_for(model, gpu, policy, depth, cache_type)
    eff = plan_speed.efficiency_for(gpu, model)
    exp = llama_plan.expected_for(model, gpu, ceiling, eff["value"], cache_type)
    measured = float(entry["decode_tps"])
    prefill = plan_speed.expected_prefill(gpu, model, int(entry.get("depth_tokens") or 0))
    return {
        "id": entry["id"], "model": entry["model"], "params_b": float(entry["params_b"]), "quant": entry["quant"],
        "card": entry["card"], "cards": int(entry.get("cards") or 1), "split": entry.get("split") or "none",
        "role": entry["role"], "depth_tokens": depth, "cache_type": cache_type, "url": entry["url"],
        "measured_tps": measured, "prompt_tps": entry.get("prompt_tps"),
        "expected_prompt_tps": prefill["prompt_tps"],
        "prompt_ratio": round(prefill["prompt_tps"] / float(entry["prompt_tps"]), 3)
        if entry.get("prompt_tps") and prefill["prompt_tps"] else None,
        "ceiling_tps": round(ceiling, 2), "efficiency": eff["value"], "efficiency_from": eff["from"],
        "arch_kind": eff["arch"], "quant_family": eff["quant_family"], "expected_tps": round(exp, 2),
        "ratio": round(exp / measured, 3),
        # what the measurement implies for the table's figure (the KV type's cost taken out)
        "implied_efficiency": round(measured / ceiling / plan_speed.KV_TYPE_SPEED.get(cache_type, 1.0), 3),
        "gpu_weight_gb": round(model["gpu_weight_bytes"] / 1e9, 2),
    }


def summary(rows, label):
    if not rows:
        return "  %-34s no rows" % label
    errors = [r["ratio"] - 1 for r in rows]
    worst = max(rows, key=lambda r: abs(r["ratio"] - 1))
    return "  %-34s n=%d  mean error %+.1f%%  mean |error| %.1f%%  max |error| %.1f%% (%s)" % (
        label, len(rows), 100 * sum(errors) / len(errors), 100 * sum(abs(e) for e in errors) / len(errors),
        100 * abs(worst["ratio"] - 1), worst["id"])


def render(rows, data_path):
    out = []
    out.append("Public V100 measurements vs the planner's expected decode (%s)" % os.path.relpath(data_path, ROOT))
    out.append("expected = ceiling (900 GB/s, weights on the GPU + KV at the measured depth) x efficiency "
               "(plan_speed table, no calibration) x KV-type factor; ratio = expected / measured")
    out.append("")
    head = "%-48s %-30s %-7s %-28s %-5s %8s %8s %6s %7s %5s %6s %8s %8s" % (
        "id", "model", "quant", "card", "role", "measured", "expected", "ratio", "ceiling", "eff", "impl", "prompt",
        "exp.pr.")
    out.append(head)
    out.append("-" * len(head))
    for r in rows:
        card = r["card"].split(" (")[0]
        if r["cards"] > 1:
            card = "%dx %s %s" % (r["cards"], card.replace("Tesla ", ""), r["split"])
        out.append("%-48s %-30s %-7s %-28s %-5s %8.2f %8.2f %6.3f %7.1f %5.2f %6.3f %8s %8s" % (
            r["id"][:48], r["model"].split(" (")[0][:30], r["quant"], card[:28], r["role"], r["measured_tps"],
            r["expected_tps"], r["ratio"], r["ceiling_tps"], r["efficiency"], r["implied_efficiency"],
            "%.0f" % r["prompt_tps"] if r["prompt_tps"] else "-",
            "%.0f" % r["expected_prompt_tps"] if r["prompt_tps"] and r["expected_prompt_tps"] else "-"))
    out.append("")
    out.append("eff: the planner's efficiency (from its table or its default); impl: measured / ceiling / KV factor, "
               "what the row implies for that figure")
    out.append("")
    big = [r for r in rows if BIG[0] <= r["params_b"] <= BIG[1]]
    out.append("Summary (error = expected / measured - 1):")
    for role in ("fit", "check"):
        out.append(summary([r for r in big if r["role"] == role], "27-32B, %s" % role))
    for role in ("fit", "check"):
        out.append(summary([r for r in rows if r["role"] == role], "all sizes, %s" % role))
    for r in rows:
        if r["prompt_ratio"] is not None:
            out.append("  prompt, %-5s %-40s expected %.0f tok/s against %.0f measured, context depth %d (%+.1f%%)" % (
                r["role"], r["id"][:40], r["expected_prompt_tps"], r["prompt_tps"], r["depth_tokens"],
                100 * (r["prompt_ratio"] - 1)))
    single = [r for r in big if r["cards"] == 1 and r["quant_family"] == "Q4_K" and r["depth_tokens"] < 4096]
    if single:
        values = sorted(r["implied_efficiency"] for r in single)
        out.append("  27-32B Q4_K on one card at short depth: implied efficiency %s (the table says %.2f)" % (
            ", ".join("%.3f" % v for v in values), single[0]["efficiency"]))
    return "\n".join(out)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", default=os.path.join(ROOT, "benchmarks", "v100_public.yml"))
    parser.add_argument("--save", nargs="?", const="", default=None,
                        help="write table.txt and rows.json (default dir benchmarks/results/v100-public-<UTC date>)")
    args = parser.parse_args()
    with open(args.data) as handle:
        entries = yaml.safe_load(handle)
    rows = [expected(e) for e in entries]
    text = render(rows, args.data)
    print(text)
    if args.save is not None:
        folder = args.save or os.path.join(ROOT, "benchmarks", "results", "v100-public-%s"
                                           % datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d"))
        os.makedirs(folder, exist_ok=True)
        with open(os.path.join(folder, "table.txt"), "w") as handle:
            handle.write(text + "\n")
        with open(os.path.join(folder, "rows.json"), "w") as handle:
            json.dump(rows, handle, indent=1, sort_keys=True)
            handle.write("\n")
        print("\nsaved to %s" % os.path.relpath(folder, ROOT))


if __name__ == "__main__":
    main()
