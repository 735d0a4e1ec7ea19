#!/usr/bin/env python3
"""The planner's size term (plan_speed.FIXED_TOKEN_SECONDS), fitted and checked on
this project's own measurements (issue 33: "small models reach a lower share of the
ceiling").

A token costs   weights / (bandwidth x e) + t0.
Two models of the same 32B shape (64 and 6 layers, Q4_K), served side by side on one
H100 through the roles (benchmarks/gpu-host/run.sh MODELS=1), give two equations per
run: e (the kernels' share of the bandwidth) and t0 (the fixed time a token costs).
Fitted on each run, checked on the other: each model's measured share predicts the
other model's speed, with the size term (at the other run's t0) and without it (the
plain ratio the planner used before). Reads the committed results; prints, and with
--save writes table.txt and fit.json.

    .venv/bin/python benchmarks/size_term.py [--save [DIR]]
"""
import argparse
import datetime
import json
import os

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RUNS = ("gpu-host-2026-12-06-models", "gpu-host-2026-12-06-models-b")
H100_BANDWIDTH = 3.35e12   # NVIDIA H100 80GB HBM3 (what NVML reported there)


def measured(run):
    """[(model, weight read seconds, ceiling tok/s, measured tok/s)] of one run."""
    base = os.path.join(ROOT, "benchmarks", "results", run)
    plans = json.load(open(os.path.join(base, "plan-before-calibration.json")))["plans"]
    verify = json.load(open(os.path.join(base, "llm_fleet_verify.fact")))["instances"]
    rows = []
    for p in plans:
        inst = [i for i in verify if str(i.get("instance")) == str(p.get("instance"))][0]
        rows.append((p["model_name"], p["memory"]["weights_bytes"] / H100_BANDWIDTH, p["decode_ceiling_tps"],
                     inst["single_stream_tps"]))
    return sorted(rows, key=lambda r: -r[1])


def fit(rows):
    """(e, t0) through the two models' points: time = seconds / e + t0."""
    (_, s1, _, tps1), (_, s2, _, tps2) = rows
    slope = (1 / tps1 - 1 / tps2) / (s1 - s2)
    return 1 / slope, 1 / tps2 - s2 * slope


def predict(known, other, t0):
    """The other model's tok/s from the known one's measured share, with and without t0."""
    _, s_k, ceil_k, tps_k = known
    _, s_o, ceil_o, _ = other
    share = tps_k / ceil_k
    e_k = s_k / (1 / tps_k - t0)          # the kernels' share, the fixed time taken out
    return 1 / (s_o / e_k + t0), share * ceil_o


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--save", nargs="?", const="", default=None)
    args = parser.parse_args()
    lines, out = [], {"runs": {}}
    fits = {}
    for run in RUNS:
        rows = measured(run)
        e, t0 = fit(rows)
        fits[run] = t0
        out["runs"][run] = {"rows": rows, "e": round(e, 4), "t0_s": round(t0, 6)}
        lines.append("%s: %s" % (run, "; ".join("%s %.2f ms weights, %.1f tok/s" % (m, s * 1e3, tps)
                                                  for m, s, _, tps in rows)))
        lines.append("  fit: e %.3f, t0 %.3f ms a token" % (e, t0 * 1e3))
    lines.append("")
    lines.append("checked across runs (t0 from the other run): predicted / measured")
    lines.append("%-30s %-6s %-6s %9s %11s %9s" % ("run", "from", "to", "measured", "size term", "plain"))
    checks = []
    for run in RUNS:
        t0 = [fits[r] for r in RUNS if r != run][0]
        rows = measured(run)
        for known, other in ((rows[0], rows[1]), (rows[1], rows[0])):
            with_term, plain = predict(known, other, t0)
            checks.append({"run": run, "from": known[0], "to": other[0], "measured": other[3],
                           "size_term": round(with_term / other[3], 3), "plain": round(plain / other[3], 3)})
            lines.append("%-30s %-6s %-6s %9.1f %11.3f %9.3f" % (run, known[0], other[0], other[3],
                                                                  with_term / other[3], plain / other[3]))
    mean_t0 = sum(fits.values()) / len(fits)
    lines.append("")
    lines.append("t0 over the runs: %s ms; mean %.2f ms (plan_speed.FIXED_TOKEN_SECONDS)" % (
        ", ".join("%.2f" % (v * 1e3) for v in fits.values()), mean_t0 * 1e3))
    out.update(checks=checks, mean_t0_s=round(mean_t0, 6))
    print("\n".join(lines))
    if args.save is not None:
        target = args.save or os.path.join(ROOT, "benchmarks", "results",
                                           "size-term-%s" % datetime.datetime.utcnow().strftime("%Y-%m-%d"))
        os.makedirs(target, exist_ok=True)
        with open(os.path.join(target, "table.txt"), "w") as handle:
            handle.write("\n".join(lines) + "\n")
        with open(os.path.join(target, "fit.json"), "w") as handle:
            json.dump(out, handle, indent=1)
        print("saved in %s" % target)


if __name__ == "__main__":
    main()
