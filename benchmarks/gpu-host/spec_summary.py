#!/usr/bin/env python3
"""What SPEC=1 of benchmarks/gpu-host/run.sh measured (issue 35): verify's figures without
and with speculative decoding, the verdict it recorded, the plans before and after, the copy
prompt's load test on both servers and the draft acceptance llama-server reported; with
PROMPT_WALK=1, each step of the walk with verify's prompt set to the copy prompt.

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


def process_mib(path):
    """(the server's own MiB, the card's used MiB) from nvidia-smi-compute-apps-<state>.csv
    (run.sh: server_pid=, the compute apps, the card); Nones where absent."""
    try:
        with open(path) as handle:
            lines = handle.read().splitlines()
    except OSError:
        return None, None
    pid = next((line.split("=", 1)[1].strip() for line in lines if line.startswith("server_pid=")), None)
    own = card = None
    for line in lines:
        cells = [c.strip() for c in line.split(",")]
        if len(cells) == 3 and cells[0] == pid and cells[2].endswith("MiB"):
            own = int(cells[2].split()[0])
        elif len(cells) == 2 and cells[0].endswith("MiB") and cells[1].endswith("MiB"):
            card = int(cells[0].split()[0])
    return own, card


def memory_figures(out, state, plan, fact):
    """What the plan predicted for the server's process and the card, and what was measured:
    nvidia-smi's per-process figure (run.sh, after verify) and verify's own VRAM reading."""
    memory = plan.get("memory") or {}
    vram = (((fact or {}).get("instances") or [{}])[0]).get("vram") or {}
    own, card = process_mib(os.path.join(out, "nvidia-smi-compute-apps-%s.csv" % state))
    mib = 1 << 20
    predicted = memory.get("predicted_process_bytes")
    row = {"predicted_process_bytes": predicted, "predicted_used_bytes": memory.get("predicted_used_bytes"),
           "draft_loaded": memory.get("draft_loaded"), "draft_bytes": memory.get("draft_bytes"),
           "draft_weights_bytes": memory.get("draft_weights_bytes"), "draft_kv_bytes": memory.get("draft_kv_bytes"),
           "draft_compute_bytes": memory.get("draft_compute_bytes"),
           "draft_reserved_bytes": memory.get("draft_reserved_bytes"),
           "overhead_cuda_bytes": memory.get("overhead_cuda_bytes"),
           "measured_process_mib": own, "measured_card_used_mib": card,
           "verify_measured_used_bytes": vram.get("measured_used_bytes"),
           "verify_predicted_used_bytes": vram.get("predicted_used_bytes"),
           "verify_measured_over_predicted": vram.get("measured_over_predicted"), "verify_scope": vram.get("scope")}
    row["predicted_process_mib"] = round(predicted / float(mib), 1) if predicted else None
    row["process_measured_over_predicted"] = round(own * mib / float(predicted), 4) if own and predicted else None
    return row


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
    summary["memory"] = {}
    for state in ("baseline", "trial"):
        plan = ((load(out, "plan-%s.json" % state) or {}).get("plans") or [{}])[0]
        summary["memory"][state] = memory_figures(out, state, plan, load(out, "verify-%s.fact.json" % state))
    with open(os.path.join(out, "speculation-summary.json"), "w") as handle:
        json.dump(summary, handle, indent=1, sort_keys=True)

    base, spec = summary["verify"]["baseline"], summary["verify"]["trial"]
    kind = spec.get("spec_type") or summary["plans"]["trial"]["spec_type"] or "speculation"
    for name in ("single_stream_tps", "all_slots_decode_tps", "ttft_at_slots_s", "ttft_s"):
        b, s = base.get(name), spec.get(name)
        ratio = "x%.3f" % (s / b) if isinstance(b, (int, float)) and isinstance(s, (int, float)) and b else "-"
        print("verify %-22s without %-10s with %s %-10s %s" % (name, b, kind, s, ratio))
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
    mib = float(1 << 20)
    for state in ("baseline", "trial"):
        m = summary["memory"][state]
        print("memory %s: process predicted %s MiB (predicted_process_bytes %s; draft loaded %s), measured %s MiB "
              "(nvidia-smi, the server's PID), measured/predicted %s; card used %s MiB; verify: %s of %s bytes "
              "predicted (%s, %s)" % (state, m["predicted_process_mib"], m["predicted_process_bytes"], m["draft_loaded"],
                                      m["measured_process_mib"], m["process_measured_over_predicted"],
                                      m["measured_card_used_mib"], m["verify_measured_used_bytes"],
                                      m["verify_predicted_used_bytes"], m["verify_measured_over_predicted"],
                                      m["verify_scope"] or "card"))
    trial, base_m = summary["memory"]["trial"], summary["memory"]["baseline"]
    if trial.get("draft_bytes"):
        share = {"predicted_draft_mib": round(trial["draft_bytes"] / mib, 1),
                 "predicted_weights_mib": round((trial["draft_weights_bytes"] or 0) / mib, 1),
                 "predicted_kv_mib": round((trial["draft_kv_bytes"] or 0) / mib, 1),
                 "predicted_compute_mib": round((trial["draft_compute_bytes"] or 0) / mib, 1)}
        if trial["predicted_process_bytes"]:
            share["predicted_share_of_process"] = round(trial["draft_bytes"] / float(trial["predicted_process_bytes"]), 4)
        if trial["measured_process_mib"] and base_m["measured_process_mib"]:
            delta = trial["measured_process_mib"] - base_m["measured_process_mib"]
            share.update(measured_trial_minus_baseline_mib=delta,
                         measured_over_predicted=round(delta / (trial["draft_bytes"] / mib), 4),
                         measured_share_of_process=round(delta / float(trial["measured_process_mib"]), 4))
        summary["memory"]["draft_share"] = share
        print("draft: predicted %(predicted_draft_mib)s MiB (weights %(predicted_weights_mib)s, KV "
              "%(predicted_kv_mib)s, compute %(predicted_compute_mib)s)" % share
              + ", %s of the process" % share.get("predicted_share_of_process")
              + ("; measured trial - baseline %s MiB (x%s of predicted), %s of the process" % (
                  share["measured_trial_minus_baseline_mib"], share["measured_over_predicted"],
                  share["measured_share_of_process"]) if "measured_trial_minus_baseline_mib" in share else ""))
        with open(os.path.join(out, "speculation-summary.json"), "w") as handle:
            json.dump(summary, handle, indent=1, sort_keys=True)
    for key, values in summary["metrics"].items():
        print("metrics %s: %s" % (key, values))
    walk(out, summary)


def walk(out, summary):
    """PROMPT_WALK=1: verify's prompt set to the copy prompt, served without it (copy-off: the
    verdict marked outdated, the prompt's baseline recorded), then the trial again (copy-trial)."""
    states = [s for s in ("copy-off", "copy-trial") if load(out, "verify-%s.fact.json" % s)]
    if not states:
        return
    summary["walk"] = {}
    for state in states:
        fact = load(out, "verify-%s.fact.json" % state)
        gate = fact.get("speed_gate") or {}
        plan = ((load(out, "plan-%s.json" % state) or {}).get("plans") or [{}])[0]
        reason = plan.get("reason") or ""
        start = reason.find("Speculative")
        summary["walk"][state] = {
            "plan_spec_type": plan.get("spec_type"),
            "plan_speculation": reason[start:].split(". First token")[0] if start >= 0 else "",
            "verify": verify_figures(fact),
            "prompt_id": ((fact.get("instances") or [{}])[0]).get("prompt_id"),
            "speed_gate": [{"verdict": v.get("verdict"), "gated": v.get("gated"), "message": v.get("message")}
                           for v in gate.get("verdicts") or []],
            "speculation": [{"verdict": v.get("verdict"), "build": v.get("build"), "message": v.get("message")}
                            for v in gate.get("speculation") or []],
            "metrics_after_verify": dict(
                (name, metric(os.path.join(out, "metrics-%s-after-verify.txt" % state), name))
                for name in ("spec_decode_num_draft_tokens_total", "spec_decode_num_accepted_tokens_total")),
            "server_log": acceptance_lines(os.path.join(out, "llama-server-%s.log" % state))}
    with open(os.path.join(out, "speculation-summary.json"), "w") as handle:
        json.dump(summary, handle, indent=1, sort_keys=True)
    for state, step in summary["walk"].items():
        print("walk %s: plan spec_type %s: %s" % (state, step["plan_spec_type"], step["plan_speculation"]))
        fig = step["verify"]
        print("walk %s: verify (prompt %s) 1 stream %s tok/s, every slot busy %s tok/s, first token at slots %s s"
              % (state, step["prompt_id"], fig["single_stream_tps"], fig["all_slots_decode_tps"],
                 fig["ttft_at_slots_s"]))
        for v in step["speed_gate"]:
            print("walk %s: speed gate %s (gated %s): %s" % (state, v["verdict"], v["gated"], v["message"]))
        for v in step["speculation"]:
            print("walk %s: speculation %s (build %s): %s" % (state, v["verdict"], v["build"], v["message"]))
        print("walk %s: drafts %s" % (state, step["server_log"]))


if __name__ == "__main__":
    main(sys.argv[1])
