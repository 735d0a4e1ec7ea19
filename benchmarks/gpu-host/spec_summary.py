#!/usr/bin/env python3
"""What SPEC=1 of benchmarks/gpu-host/run.sh measured (issue 35): verify's figures without
and with speculative decoding, the verdict it recorded, the plans before and after, the copy
prompt's load test on both servers and the draft acceptance llama-server reported.

    spec_summary.py <OUT>     prints lines to read and writes <OUT>/speculation-summary.json"""
import json
import os
import re
import sys

ACCEPT = re.compile(r"draft acceptance = ([0-9.]+) \(\s*(\d+) accepted /\s*(\d+) generated\), mean len =\s*([0-9.]+)")


def load(out, name):
    try:
        with open(os.path.join(out, name)) as handle:
            return json.load(handle)
    except (OSError, ValueError):
        return None


def all_slots(inst):
    for level in inst.get("levels") or []:
        if level.get("concurrency") == inst.get("parallel") and level.get("aggregate_decode_tps"):
            return level["aggregate_decode_tps"]
    return inst.get("aggregate_slots_tps")


def verify_figures(fact):
    inst = ((fact or {}).get("instances") or [{}])[0]
    return {"spec_type": inst.get("spec_type"), "parallel": inst.get("parallel"), "ctx_size": inst.get("ctx_size"),
            "n_predict": inst.get("n_predict"), "single_stream_tps": inst.get("single_stream_tps"),
            "all_slots_decode_tps": all_slots(inst), "aggregate_slots_tps": inst.get("aggregate_slots_tps"),
            "ttft_s": inst.get("ttft_s"), "ttft_at_slots_s": inst.get("ttft_at_slots_s"),
            "errors": inst.get("errors")}


def copy_figures(run):
    levels = []
    for level in (run or {}).get("levels") or []:
        timings = [s.get("timings") or {} for s in level.get("streams") or []]
        drafted = sum(t.get("draft_n") or 0 for t in timings)
        accepted = sum(t.get("draft_n_accepted") or 0 for t in timings)
        levels.append({"concurrency": level.get("concurrency"), "per_stream_tps_mean": level.get("per_stream_tps_mean"),
                       "aggregate_decode_tps": level.get("aggregate_decode_tps"), "ttft_s_mean": level.get("ttft_s_mean"),
                       "server_predicted_tps_mean": level.get("server_predicted_tps_mean"),
                       "draft_n": drafted, "draft_n_accepted": accepted,
                       "acceptance": round(accepted / float(drafted), 4) if drafted else None,
                       "errors": level.get("errors")})
    return levels


def metric(path, name):
    try:
        with open(path) as handle:
            for line in handle:
                if line.startswith("llamacpp:%s " % name):
                    return float(line.split()[1])
    except OSError:
        pass
    return None


def acceptance_lines(path):
    found = []
    try:
        with open(path) as handle:
            for line in handle:
                match = ACCEPT.search(line)
                if match:
                    found.append((float(match.group(1)), int(match.group(2)), int(match.group(3)), float(match.group(4))))
    except OSError:
        pass
    accepted, drafted = sum(f[1] for f in found), sum(f[2] for f in found)
    return {"requests": len(found), "accepted": accepted, "drafted": drafted,
            "acceptance": round(accepted / float(drafted), 4) if drafted else None}


def main(out):
    summary = {"verify": {}, "copy_prompt": {}, "metrics": {}, "plans": {}}
    for state in ("baseline", "trial"):
        summary["verify"][state] = verify_figures(load(out, "verify-%s.fact.json" % state))
        summary["copy_prompt"][state] = copy_figures(load(out, "copy-prompt-%s.json" % state))
        for when in ("after-verify", "after-copy"):
            path = os.path.join(out, "metrics-%s-%s.txt" % (state, when))
            summary["metrics"]["%s %s" % (state, when)] = dict(
                (name, metric(path, name)) for name in ("spec_decode_num_draft_tokens_total",
                                                        "spec_decode_num_accepted_tokens_total",
                                                        "spec_decode_num_drafts_total", "tokens_predicted_total"))
    summary["server_log_trial"] = acceptance_lines(os.path.join(out, "llama-server-trial.log"))
    trial = load(out, "verify-trial.fact.json") or {}
    summary["verdicts"] = (trial.get("speed_gate") or {}).get("speculation")
    summary["calibration_speculation"] = (load(out, "decode-calibration.json") or {}).get("speculation")
    for name, path in (("baseline", "plan-baseline.json"), ("trial", "plan-trial.json"), ("after verdict", "plan.json")):
        plan = ((load(out, path) or {}).get("plans") or [{}])[0]
        reason = plan.get("reason") or ""
        start = reason.find("Speculative")
        summary["plans"][name] = {"spec_type": plan.get("spec_type"), "quant": plan.get("quant"),
                                  "ctx_size": plan.get("ctx_size"), "parallel": plan.get("parallel"),
                                  "speculation": reason[start:].split(". First token")[0] if start >= 0 else ""}
    with open(os.path.join(out, "speculation-summary.json"), "w") as handle:
        json.dump(summary, handle, indent=1, sort_keys=True)

    base, spec = summary["verify"]["baseline"], summary["verify"]["trial"]
    for name in ("single_stream_tps", "all_slots_decode_tps", "ttft_at_slots_s", "ttft_s"):
        b, s = base.get(name), spec.get(name)
        ratio = "x%.3f" % (s / b) if isinstance(b, (int, float)) and isinstance(s, (int, float)) and b else "-"
        print("verify %-22s without %-10s with ngram-mod %-10s %s" % (name, b, s, ratio))
    for v in summary["verdicts"] or []:
        print("verdict: %s: %s" % (v.get("verdict"), v.get("message")))
    for name, plan in summary["plans"].items():
        print("plan %s: spec_type %s (%s %s x %s): %s" % (name, plan["spec_type"], plan["quant"], plan["ctx_size"],
                                                          plan["parallel"], plan["speculation"]))
    for state in ("baseline", "trial"):
        for level in summary["copy_prompt"][state]:
            print("copy prompt %s, %s stream(s): %s tok/s per stream, %s tok/s summed, first token %s s, drafts "
                  "%s/%s accepted" % (state, level["concurrency"], level["per_stream_tps_mean"],
                                      level["aggregate_decode_tps"], level["ttft_s_mean"], level["draft_n_accepted"],
                                      level["draft_n"]))
    print("llama-server (trial) draft acceptance lines: %s" % summary["server_log_trial"])
    for key, values in summary["metrics"].items():
        print("metrics %s: %s" % (key, values))


if __name__ == "__main__":
    main(sys.argv[1])
