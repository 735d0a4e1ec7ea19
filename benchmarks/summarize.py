#!/usr/bin/env python3
"""Markdown summary of a bench_configs.py result file.

    python benchmarks/summarize.py results.json [bandwidth.json] > summary.md
"""
import json
import sys

MIB = 1 << 20


def fmt(value, spec="%.1f"):
    if value is None:
        return "-"
    if isinstance(value, float):
        return spec % value
    return str(value)


def pct(a, b):
    if not a or not b:
        return "-"
    return "%+.1f%%" % ((float(a) / b - 1) * 100)


def render(data, bandwidth=None):
    gpu = data["gpu"]
    model = data["model"]
    lines = ["# Side-by-side benchmark: %s" % gpu.get("name"), ""]
    lines.append("- GPU: %s, %d MiB, compute capability %s, driver %s (CUDA %s); NVML bandwidth %.0f GB/s "
                 "(%d-bit bus x %d MHz x 2)" % (gpu.get("name"), gpu["memory_total_bytes"] // MIB,
                                                gpu.get("compute_capability"), data.get("driver_version"),
                                                data.get("cuda_driver_version"),
                                                gpu["memory_bandwidth_bytes_per_s"] / 1e9,
                                                gpu.get("memory_bus_width_bits") or 0,
                                                gpu.get("max_memory_clock_mhz") or 0))
    if data.get("measured_bandwidth_gbs"):
        lines.append("- Measured read bandwidth: %.0f GB/s%s" % (
            data["measured_bandwidth_gbs"], (" (%s)" % bandwidth["method"]) if bandwidth else ""))
    lines.append("- llama.cpp: %s%s" % ((data.get("llama_cpp") or {}).get("commit") or "",
                                        " (%s)" % " ".join((data.get("llama_cpp") or {}).get("version", "").split())))
    lines.append("- Model: %s, %s, %s layers, embedding %s, FFN %s, %s heads / %s KV heads x %s, vocabulary %s, "
                 "%.2f B parameters, %.2f GB of tensors (%d MiB; %d MiB on the GPU per the planner)" % (
                     model.get("architecture"), model.get("file_type"), model.get("block_count"),
                     model.get("embedding_length"), model.get("feed_forward_length"), model.get("head_count"),
                     model.get("head_count_kv"), model.get("key_length"), model.get("vocab_size"),
                     (model.get("parameter_count") or 0) / 1e9, (model.get("weight_bytes") or 0) / 1e9,
                     (model.get("weight_bytes") or 0) // MIB, data["planner"]["gpu_weight_bytes"] // MIB))
    lines.append("- Load test: %s tokens per stream, fixed prompt, ignore_eos, streamed; aggregate = all tokens / "
                 "wall time of the level" % data.get("n_predict"))
    lines += ["", "## Speed", "",
              "| config | -c | -np | KV | 1 stream tok/s | TTFT s | agg @4 | agg @plan slots | agg @own slots | "
              "ceiling (NVML bw) | 1 stream / ceiling | agg@4 / ceiling | ceiling (measured bw) | 1 stream / that |",
              "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for c in data["configs"]:
        f = c.get("figures")
        if not f:
            lines.append("| %s | error: %s |" % (c["name"], c.get("error")))
            continue
        own = None
        for level in (c.get("load_test") or {}).get("levels", []):
            if level["concurrency"] == c["parallel"]:
                own = level.get("aggregate_tps")
        lines.append("| %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |" % (
            c["name"], c["ctx_size"], c["parallel"], c["cache_type"], fmt(f["single_stream_tps"]),
            fmt(f["single_stream_ttft_s"], "%.3f"), fmt(f["aggregate_4_tps"]), fmt(f["aggregate_plan_slots_tps"]),
            fmt(own), fmt(f["ceiling_tps"]), fmt(f["single_ratio"], "%.3f"), fmt(f["aggregate_4_ratio"], "%.3f"),
            fmt(f["measured_bw_ceiling_tps"]), fmt(f["single_ratio_measured_bw"], "%.3f")))
    lines += ["", "## Expected speed against measured", "",
              "Expected = the planner's figures for the configuration's own -c/-np/KV type (`plan_speed`: "
              "ceiling x the built-in efficiency of this GPU family and weight type, x 0.94 for a quantized KV; "
              "aggregate = single x slots^exponent, the exponent per architecture kind and KV type). Measured "
              "aggregate = the streams' own decode rates summed with every slot busy (prompt processing left out).", "",
              "| config | -c | -np | KV | efficiency used | expected 1 stream | measured | measured / expected "
              "| exponent | expected all slots | measured decode, all slots | measured / expected |",
              "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for c in data["configs"]:
        f = c.get("figures")
        if not f or f.get("expected_decode_tps") is None:
            continue
        eff = (c.get("predicted") or {}).get("decode_efficiency") or {}
        lines.append("| %s | %s | %s | %s | %s (%s) | %s | %s | %s | %s | %s | %s | %s |" % (
            c["name"], c["ctx_size"], c["parallel"], c["cache_type"], fmt(eff.get("value"), "%.3f"), eff.get("from"),
            fmt(f["expected_decode_tps"]), fmt(f["single_stream_tps"]), pct(f["single_stream_tps"],
                                                                             f["expected_decode_tps"]),
            fmt((c.get("predicted") or {}).get("aggregate_exponent", data.get("aggregate_exponent")), "%.3f"),
            fmt(f["expected_aggregate_tps"]), fmt(f["aggregate_slots_decode_tps"]),
            pct(f["aggregate_slots_decode_tps"], f["expected_aggregate_tps"])))
    lines += ["", "### The same expectation at the load test's own fill", "",
              "The plan's expected speed reads each slot filled to the policy's kv_fill (half); the load test's "
              "streams hold a short prompt and their tokens. Here the planner's expectation for the fill the "
              "streams had (prompt + half the generated tokens): what the memory-bound model claims for the "
              "conditions measured.", "",
              "| config | fill tokens | expected 1 stream | measured | measured / expected | expected all slots "
              "| measured decode, all slots | measured / expected |",
              "|---|---|---|---|---|---|---|---|"]
    for c in data["configs"]:
        f, pr = c.get("figures") or {}, c.get("predicted") or {}
        if f.get("expected_decode_at_test_fill_tps") is None:
            continue
        lines.append("| %s | %s | %s | %s | %s | %s | %s | %s |" % (
            c["name"], pr.get("test_fill_tokens"), fmt(f["expected_decode_at_test_fill_tps"]),
            fmt(f["single_stream_tps"]), pct(f["single_stream_tps"], f["expected_decode_at_test_fill_tps"]),
            fmt(f["expected_aggregate_at_test_fill_tps"]), fmt(f["aggregate_slots_decode_tps"]),
            pct(f["aggregate_slots_decode_tps"], f["expected_aggregate_at_test_fill_tps"])))
    lines += ["", "## GPU memory: measured against predicted", "",
              "Predicted = the planner's memory model (`plan_split.budget`) for the configuration's own "
              "-c/-np/KV type, less the driver's reservation (%d MiB on this card: the process's own figure leaves it "
              "out). Measured = NVML's figure for "
              "the llama-server process (and the card's used memory less what was used before it started)."
              % ((data["configs"][0].get("predicted") or {}).get("driver_reserved_bytes", 0) // MIB), "",
              "| config | -c | -np | KV | predicted MiB (weights + KV + compute + CUDA overhead) | process MiB | card delta MiB "
              "| process vs predicted | llama-fit-params MiB (model+context+compute) | process vs fit-params "
              "| card used MiB (NVML) | card used vs predicted_used |",
              "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for c in data["configs"]:
        f = c.get("figures")
        if not f:
            continue
        p = c["predicted"]
        fit = c.get("fit_params") or {}
        dev = [v for k, v in (fit.get("devices") or {}).items() if k != "Host"]
        fit_text = "-"
        if dev:
            fit_text = "%d (%d + %d + %d)" % (fit["device_total_mib"], dev[0]["model_mib"], dev[0]["context_mib"],
                                              dev[0]["compute_mib"])
        card = (c.get("vram") or {}).get("device_used_bytes")
        lines.append("| %s | %s | %s | %s | %d (%d + %d + %d + %d) | %s | %s | %s | %s | %s | %s | %s |" % (
            c["name"], c["ctx_size"], c["parallel"], c["cache_type"], f["vram_predicted_mib"],
            p["weights_bytes"] // MIB, p["kv_bytes"] // MIB, p["compute_bytes"] // MIB,
            p.get("overhead_cuda_bytes", p["overhead_bytes"]) // MIB,
            fmt(f["vram_process_mib"]), fmt(f["vram_device_delta_mib"]),
            pct(f["vram_process_mib"] or f["vram_device_delta_mib"], f["vram_predicted_mib"]), fit_text,
            pct(f["vram_process_mib"] or f["vram_device_delta_mib"], fit.get("device_total_mib")),
            card // MIB if card else "-", pct(card, p["predicted_used_bytes"])))
    before = data.get("gpu_memory_used_before_bytes")
    if before is not None:
        lines += ["", "Before any server started, NVML reported %d MiB of the card in use (the driver's reservation; "
                  "`nvidia-smi` shows it as reserved, not used). The planner's `driver_reserved_bytes()` counted %d MiB "
                  "for this card." % (before // MIB, (data["configs"][0].get("predicted") or {}).get(
                      "driver_reserved_bytes", 0) // MIB)]
    benches = [(c["name"], c["llama_bench"]) for c in data["configs"] if c.get("llama_bench")]
    for name, bench in benches:
        lines += ["", "## llama-bench (%s)" % name, "", "`%s`" % " ".join(bench.get("command", [])), ""]
        if bench.get("error"):
            lines.append("error: %s" % bench["error"])
            continue
        lines += ["| test | KV | FA | avg tok/s | stddev |", "|---|---|---|---|---|"]
        for r in bench.get("results", []):
            test = ("pp%d" % r["n_prompt"]) if r.get("n_prompt") else ("tg%d" % r["n_gen"])
            lines.append("| %s | %s | %s | %.1f | %.1f |" % (test, r.get("type_k"), r.get("flash_attn"),
                                                            r.get("avg_ts") or 0, r.get("stddev_ts") or 0))
    lines += ["", "## Commands", ""]
    for c in data["configs"]:
        lines.append("- %s: `%s`" % (c["name"], " ".join(c["command"])))
    return "\n".join(lines) + "\n"


def main():
    with open(sys.argv[1]) as handle:
        data = json.load(handle)
    bandwidth = None
    if len(sys.argv) > 2:
        with open(sys.argv[2]) as handle:
            bandwidth = json.load(handle)
    sys.stdout.write(render(data, bandwidth))


if __name__ == "__main__":
    main()
