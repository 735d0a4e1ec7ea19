#!/usr/bin/env python3
"""Decode efficiency per quantization on one GPU: llama-bench's single-stream decode
(tg) divided by the planner's bandwidth ceiling for the same file, for each
quantization the planner may pick. The figures the planner's expected speed
(issue 14) is to be calibrated with.

Every file is requantized (llama-quantize --allow-requantize) from one random-weight
GGUF of a real shape (make_random_gguf.py), so the shapes are the real ones and only
the weight type differs. Results are written after each quantization (a cut-off run
keeps what it measured).

    quant_sweep.py --bin-dir BUILD/bin --base MODEL-Q4_K.gguf --work DIR --out sweep.json \
        [--quants Q3_K_M,Q4_K_M,Q5_K_M,Q6_K,Q8_0] [--gpu 0] [--reps 3] [--n-gen 128]
"""
import argparse
import json
import os
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_configs import gguf_model, llama_plan, nvidia_gpu, plan_model  # noqa: E402  (module_utils, as the hosts map it)

from ansible.module_utils.plan_memory import decode_ceiling  # noqa: E402


def bench(bin_dir, path, reps, n_gen, threads):
    cmd = [os.path.join(bin_dir, "llama-bench"), "-m", path, "-ngl", "999", "-fa", "1", "-p", "512", "-n", str(n_gen),
           "-r", str(reps), "-t", str(threads), "-o", "json"]
    out = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=300)
    rows = json.loads(out.stdout.decode("utf-8"))
    tg = [r for r in rows if r.get("n_gen")]
    pp = [r for r in rows if r.get("n_prompt") and not r.get("n_gen")]
    return {"command": cmd, "tg_tps": tg[0]["avg_ts"], "tg_stddev": tg[0]["stddev_ts"],
            "pp512_tps": pp[0]["avg_ts"] if pp else None, "model_size": tg[0].get("model_size")}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bin-dir", required=True)
    parser.add_argument("--base", required=True, help="the random-weight GGUF to requantize from")
    parser.add_argument("--work", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--quants", default="Q3_K_M,Q4_K_M,Q5_K_M,Q6_K,Q8_0")
    parser.add_argument("--gpu", type=int, default=0)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--n-gen", type=int, default=128)
    args = parser.parse_args()

    import pynvml
    pynvml.nvmlInit()
    gpu = nvidia_gpu.read_gpu(pynvml, args.gpu)
    pynvml.nvmlShutdown()
    bandwidth = float(gpu["memory_bandwidth_bytes_per_s"])
    threads = os.cpu_count() or 8
    record = {"gpu": {k: gpu.get(k) for k in ("name", "memory_total_bytes", "memory_bandwidth_bytes_per_s",
                                               "driver_version")},
              "base": args.base, "n_gen": args.n_gen, "reps": args.reps, "results": []}
    files = [("base", args.base)] + [(q, os.path.join(args.work, "sweep-%s.gguf" % q)) for q in args.quants.split(",")]
    for label, path in files:
        entry = {"label": label, "path": path}
        try:
            if label != "base" and not os.path.exists(path):
                start = time.time()
                subprocess.run([os.path.join(args.bin_dir, "llama-quantize"), "--allow-requantize", args.base, path,
                                label, str(threads)], check=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                               timeout=900)
                entry["quantize_s"] = round(time.time() - start, 1)
            meta = gguf_model.read_model(path)
            model = plan_model.model_from_metadata(meta.get("file_type"), meta, path=path, source="file")
            ceiling = decode_ceiling(bandwidth, model["gpu_weight_bytes"])
            measured = bench(args.bin_dir, path, args.reps, args.n_gen, threads)
            entry.update(quant=model.get("quant"), file_bytes=os.path.getsize(path),
                         gpu_weight_bytes=model["gpu_weight_bytes"], ceiling_tps=round(ceiling, 2), **measured)
            entry["efficiency"] = round(measured["tg_tps"] / ceiling, 3)
            print("%-8s %-8s %6.2f GB  ceiling %7.1f tok/s  measured %7.1f tok/s  efficiency %.3f  pp512 %7.0f"
                  % (label, entry["quant"], entry["file_bytes"] / 1e9, ceiling, measured["tg_tps"],
                     entry["efficiency"], measured["pp512_tps"] or 0), flush=True)
        except Exception as err:  # keep going: one quant's failure must not lose the others
            entry["error"] = "%s: %s" % (type(err).__name__, err)
            print("%-8s error: %s" % (label, entry["error"]), flush=True)
        record["results"].append(entry)
        with open(args.out, "w") as handle:
            json.dump(record, handle, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
