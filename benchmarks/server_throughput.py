#!/usr/bin/env python3
"""Where the server's throughput goes (issue 34): llama-server against llama.cpp's own
engine, on one GPU and one model, side by side in one run.

  engine       llama-batched-bench: the same model, flash attention and KV type, 1/4/16/32
               sequences decoding together, nothing else (no sampling, no HTTP)
  variants     llama-server started from the plans the project computes (the throughput
               and the latency objective, rendered by roles/llama_server's own filter),
               each with and without what the pinned build offers against the server's
               own costs (--backend-sampling: the sampler chain on the GPU), measured by
               the verify stage's load test (imported) at 1/4/16/32 streams with:
                 greedy   the verify stage's request (top-k 1, streamed)
                 chat     a chat client's sampling (temperature 0.7, llama.cpp's default
                          chain: top-k 40, top-p 0.95, min-p 0.05), streamed
                 whole    greedy, not streamed (one answer per request: no per-token events)
  profile      with --timings-bin (llama-server built with DEBUG_TIMINGS, see
               h200/server_throughput.sh): the server's own averages per main-loop
               iteration (pre-decode, decode = GPU, post-decode, sampling), from its log

Per level: aggregate tok/s, per-stream mean and minimum, each as a ratio to the
single-stream decode ceiling (NVML bandwidth / bytes read per token), and the
per-generated-token time split into engine (batched-bench at that many sequences),
sampling (chat - chat with backend sampling), per-token events (greedy - whole) and the
rest (main loop). Saves JSON and prints a table.

    python benchmarks/server_throughput.py --bin-dir BUILD/bin --model M.gguf --out r.json
"""
from __future__ import absolute_import, division, print_function

import argparse
import json
import os
import re
import subprocess
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_configs as bc  # noqa: E402  (the project's modules, the load test, the renderer)

loadtest, llama_plan, plan_model, gguf_model = bc.loadtest, bc.llama_plan, bc.plan_model, bc.gguf_model
nvidia_gpu = bc.nvidia_gpu

# llama.cpp's default chain with a chat client's temperature (common/common.h defaults)
CHAT = {"temperature": 0.7, "top_k": 40, "top_p": 0.95, "min_p": 0.05}


def payload(mode, n_predict):
    body = loadtest.build_payload(loadtest.DEFAULT_PROMPT, n_predict)
    if mode == "chat":
        for key in ("samplers", "top_k"):
            body.pop(key, None)
        body.update(CHAT)
    if mode == "whole":
        body["stream"] = False
    return body


def whole_completion(client, body):
    """One request answered whole (stream=false): the stream result's shape."""
    start = time.time()
    try:
        status, answer = client.post_json("/completion", body, timeout=600)
    except Exception as err:  # noqa: BLE001 - reported as the stream's error
        return {"ok": False, "tokens": 0, "error": str(err), "decode_tps": None, "ttft_s": None, "timings": None}
    end = time.time()
    if status != 200 or not isinstance(answer, dict):
        return {"ok": False, "tokens": 0, "error": "HTTP %s" % status, "decode_tps": None, "ttft_s": None,
                "timings": None}
    timings = answer.get("timings") or {}
    return {"ok": True, "tokens": int(answer.get("tokens_predicted") or 0), "error": None, "ttft_s": None,
            "total_s": round(end - start, 4), "decode_tps": timings.get("predicted_per_second"),
            "timings": timings}


def run_level(client, streams, body):
    """All streams at once; the load test's own summary of the level."""
    if body.get("stream"):
        return loadtest.run_level(client, streams, body, time.time() + 600)
    results = [None] * streams
    barrier = threading.Barrier(streams)

    def worker(i):
        barrier.wait(timeout=30)
        results[i] = whole_completion(client, body)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(streams)]
    start = time.time()
    for t in threads:
        t.start()
    for t in threads:
        t.join(600)
    return loadtest.summarize_level(streams, [r or {"ok": False, "tokens": 0, "error": "timed out",
                                                    "decode_tps": None, "ttft_s": None, "timings": None}
                                              for r in results], time.time() - start)


TIMING_RE = re.compile(r"avg (t_pre_decode|t_decode|t_post_decode|t_sampl)\s*=\s*([0-9.]+) ms")


def log_timings(path, since):
    """The last DEBUG_TIMINGS averages the server logged after byte offset `since`."""
    with open(path, "rb") as handle:
        handle.seek(since)
        text = handle.read().decode("utf-8", "replace")
    found = {}
    for name, value in TIMING_RE.findall(text):
        found[name] = float(value)
    return found or None


def with_flags(cargs, extra):
    """cargs with extra's flags: a flag cargs already has takes extra's value, others are added."""
    cargs, i = list(cargs), 0
    while i < len(extra):
        flag = extra[i]
        value = extra[i + 1] if i + 1 < len(extra) and not extra[i + 1].startswith("-") else None
        if value is not None and flag in cargs:
            cargs[cargs.index(flag) + 1] = value
        else:
            cargs += [flag] + ([value] if value is not None else [])
        i += 2 if value is not None else 1
    return cargs


def batched_bench(binary, model, cache_type, npl, n_prompt, n_gen, env, ctx=None, extra=()):
    """ctx: the whole KV cache (default: just enough); extra: flags such as -kvu."""
    ctx = ctx or max(npl) * (n_prompt + n_gen) + 256
    cmd = [binary, "-m", model, "-ngl", "999", "-fa", "on", "-ctk", cache_type, "-ctv", cache_type,
           "-c", str(ctx), "-b", "2048", "-ub", "512", "-npp", str(n_prompt), "-ntg", str(n_gen),
           "-npl", ",".join(str(n) for n in npl), "--output-format", "jsonl"] + list(extra)
    out = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=600, env=env)
    rows = []
    for line in out.stdout.decode("utf-8", "replace").splitlines():
        line = line.strip()
        if line.startswith("{") and '"speed_tg"' in line:
            rows.append(json.loads(line))
    return {"command": cmd, "rc": out.returncode, "rows": rows,
            "tail": None if rows else out.stdout.decode("utf-8", "replace")[-2000:]}


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--bin-dir", required=True)
    p.add_argument("--timings-bin", default=None, help="llama-server built with DEBUG_TIMINGS (the profile rows)")
    p.add_argument("--model", required=True)
    p.add_argument("--gpu", type=int, default=0)
    p.add_argument("--port", type=int, default=18090)
    p.add_argument("--n-predict", type=int, default=256)
    p.add_argument("--prompt-tokens", type=int, default=494,
                   help="the load test's prompt in the model's tokens (494: its server log's prompt eval)")
    p.add_argument("--levels", default="1,4,16")
    p.add_argument("--variants", default="all", help="comma list of variant names, or all")
    p.add_argument("--skip-engine", action="store_true")
    p.add_argument("--engines", default="default",
                   help="comma list: default (just enough context, 1/4/16/32 sequences), plan-ctx (the "
                        "throughput plan's -c with its slots as sequences), plan-ctx-kvu (the same, unified KV), "
                        "small-ctx (its slots with just enough context)")
    p.add_argument("--out", required=True)
    p.add_argument("--log-dir", default=None)
    p.add_argument("--custom", action="append", default=[], metavar="NAME;PLAN;FLAGS[;timings]",
                   help="one more variant: PLAN's flags with FLAGS (space-separated), greedy at --levels; "
                        "';timings' runs the DEBUG_TIMINGS build (may repeat)")
    args = p.parse_args()

    import pynvml
    host = nvidia_gpu.read_host(pynvml)
    gpu_facts = host["gpus"][args.gpu]
    env = dict(os.environ, CUDA_VISIBLE_DEVICES=gpu_facts["uuid"])
    cuda_env, _backend, _version = bc.cuda_environment(args.bin_dir, None, "auto")
    for key, value in cuda_env.items():
        env.setdefault(key, value)
    log_dir = args.log_dir or os.path.dirname(os.path.abspath(args.out))
    meta = gguf_model.read_model(args.model)
    model = plan_model.model_from_metadata(meta.get("file_type"), meta, path=args.model, source="file")
    server = os.path.join(args.bin_dir, "llama-server")
    flags = bc.help_flags(server)
    render = bc.role_renderer()
    levels = [int(x) for x in args.levels.split(",")]

    def plan_for(policy):
        result = llama_plan.plan_host([gpu_facts], [model], policy)
        plan = dict(result["plans"][0], model_path=args.model)
        cargs, _how = bc.plan_args(plan, flags, render)
        return plan, bc.strip_host_port(cargs), result["summary"]

    plans = {"throughput": plan_for({"objective": "throughput"}),
             "latency": plan_for({}),
             "throughput32": plan_for({"objective": "throughput", "max_parallel": 32})}
    # name, plan, extra flags, binary, client modes, levels
    variants = [
        ("throughput", "throughput", [], server, ["greedy", "chat", "whole"], levels),
        ("throughput+bs", "throughput", ["-bs"], server, ["greedy", "chat"], levels),
        # one client mode per profiled server: the server logs averages since it started
        ("throughput profile chat", "throughput", [], args.timings_bin, ["chat"], [max(levels)]),
        ("throughput+bs profile chat", "throughput", ["-bs"], args.timings_bin, ["chat"], [max(levels)]),
        ("throughput profile greedy", "throughput", [], args.timings_bin, ["greedy"], [max(levels)]),
        ("latency", "latency", [], server, ["greedy", "chat"], [1, 4]),
        ("latency+bs", "latency", ["-bs"], server, ["greedy", "chat"], [1, 4]),
        # where the decode step goes: the same plan with a small context, and with one unified KV cache
        ("throughput+bs ctx32768", "throughput", ["-bs", "-c", "32768"], server, ["greedy"], [1, 16]),
        ("throughput+bs kvu", "throughput", ["-bs", "-kvu"], server, ["greedy"], [1, 16]),
        ("throughput+bs profile greedy", "throughput", ["-bs"], args.timings_bin, ["greedy"], [max(levels)]),
        ("throughput32", "throughput32", [], server, ["chat"], [1, 32]),
        ("throughput32+bs", "throughput32", ["-bs"], server, ["chat"], [1, 32]),
    ]
    for spec in args.custom:
        parts = spec.split(";")
        binary = args.timings_bin if parts[3:] == ["timings"] else server
        variants.append((parts[0], parts[1], parts[2].split(), binary, ["greedy"], levels))
    wanted = None if args.variants == "all" else set(v.strip() for v in args.variants.split(","))
    out = {"schema": "llm-fleet-server-throughput/1",
           "started_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
           "gpu": dict((k, gpu_facts.get(k)) for k in ("name", "memory_total_bytes", "memory_bandwidth_bytes_per_s",
                                                       "compute_capability")),
           "model": {k: meta.get(k) for k in ("name", "architecture", "file_type", "block_count", "vocab_size")},
           "n_predict": args.n_predict, "plans": {}, "engine": None, "variants": []}
    for name, (plan, cargs, summary) in plans.items():
        out["plans"][name] = {"summary": summary, "args": cargs, "parallel": plan["parallel"],
                              "ctx_size": plan["ctx_size"], "cache_type": plan["cache_type_k"],
                              "expected_decode_tps": plan.get("expected_decode_tps")}
    tp = plans["throughput"][0]
    # the yardstick: the latency plan's single-stream ceiling (252.5 tok/s on the H200)
    out["single_stream_ceiling_tps"] = plans["latency"][0]["decode_ceiling_tps"]

    def save():
        with open(args.out + ".part", "w") as handle:
            json.dump(out, handle, indent=1, sort_keys=True, default=str)
        os.replace(args.out + ".part", args.out)

    bench = os.path.join(args.bin_dir, "llama-batched-bench")
    prompt_tokens = args.prompt_tokens
    if not args.skip_engine and os.access(bench, os.X_OK):
        slots = [tp["parallel"]]
        every = sorted(set(levels + [32]))
        # name: sequences, context, flags, prompt and generated tokens per sequence
        engines = {"default": (every, None, [], 128, 128),
                   "plan-ctx": (slots, tp["ctx_size"], [], 128, 128),
                   "plan-ctx-kvu": (slots, tp["ctx_size"], ["-kvu"], 128, 128),
                   "small-ctx": (slots, None, [], 128, 128),
                   # the load test's request: its prompt's tokens, n_predict generated, the
                   # prompt's time counted (the server's aggregate is tokens over wall time)
                   "load-test": (every, None, [], prompt_tokens, args.n_predict)}
        out["engines"] = {}
        for name in [n.strip() for n in args.engines.split(",") if n.strip()]:
            npl, ctx, extra, npp, ntg = engines[name]
            print("== engine %s: llama-batched-bench, %d+%d tokens" % (name, npp, ntg), flush=True)
            result = batched_bench(bench, args.model, tp["cache_type_k"], npl, npp, ntg, env, ctx, extra)
            out["engines"][name] = result
            if name == "default":
                out["engine"] = result
            for row in result["rows"]:
                whole = row["pl"] * row["tg"] / (row["t_pp"] + row["t_tg"])
                print("   %2d sequences: %.1f tok/s decoding, %.1f generated a second with the prompts' time" % (
                    row["pl"], row["speed_tg"], whole), flush=True)
            save()

    for name, plan_name, extra, binary, modes, lv in variants:
        if wanted is not None and name not in wanted and name not in [c.split(";")[0] for c in args.custom]:
            continue
        if not binary or not os.access(binary, os.X_OK):
            print("== %s: no binary, skipped" % name, flush=True)
            continue
        plan, cargs, _summary = plans[plan_name]
        cargs = with_flags(cargs, extra)
        log_path = os.path.join(log_dir, "server-%s.log" % name.replace(" ", "-").replace("+", "-"))
        print("== %s: %s" % (name, " ".join(cargs)), flush=True)
        proc, cmd, log = bc.start_server(binary, cargs, args.port, log_path, env)
        entry = {"name": name, "plan": plan_name, "extra": extra, "command": cmd, "results": []}
        try:
            client = loadtest.Client("http://127.0.0.1:%d" % args.port, timeout=600)
            client.wait_healthy(300)
            client.stream_completion(payload("greedy", 8))  # warm-up
            for mode in modes:
                for streams in lv:
                    if streams > plan["parallel"]:
                        continue
                    since = os.path.getsize(log_path)
                    summary = run_level(client, streams, payload(mode, args.n_predict))
                    summary.pop("streams", None)
                    row = {"mode": mode, "streams": streams, "summary": summary}
                    if binary == args.timings_bin:
                        time.sleep(5.5)  # the server logs its averages every 5 s while busy
                        client.stream_completion(payload("greedy", 4))
                        row["timings_ms"] = log_timings(log_path, since)
                    entry["results"].append(row)
                    print("   %-6s %2d streams: %7.1f tok/s, per stream mean %.1f min %.1f%s" % (
                        mode, streams, summary["aggregate_tps"] or 0, summary["per_stream_tps_mean"] or 0,
                        summary["per_stream_tps_min"] or 0,
                        (", timings %s" % row.get("timings_ms")) if "timings_ms" in row else ""), flush=True)
        except Exception as err:  # noqa: BLE001 - record and go on to the next variant
            entry["error"] = "%s: %s" % (err.__class__.__name__, err)
            print("   error: %s" % entry["error"], flush=True)
        finally:
            bc.stop_server(proc, log)
        out["variants"].append(entry)
        save()
    out["finished_at"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    save()
    return 0


if __name__ == "__main__":
    sys.exit(main())
