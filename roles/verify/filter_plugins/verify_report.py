# -*- coding: utf-8 -*-
"""Turn what the verify stage measured on a host into its record (the local fact
llm_fleet_verify) and the records of the fleet into its report (a JSON-ready dict;
verify_render.py draws it as Markdown and SVG).

Plain functions over plain dicts, so tests/unit/test_verify_report.py can call
them without Ansible; the FilterModule at the end exposes them as filters.
Runs on the controller."""
from __future__ import absolute_import, division, print_function

__metaclass__ = type

import json
import os

import ansible.module_utils

# Ansible ships module_utils/ to modules only; the controller maps the
# repository's copy, so a plugin and a module share one definition.
_MODULE_UTILS = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..",
                                              "module_utils"))
if _MODULE_UTILS not in ansible.module_utils.__path__:
    ansible.module_utils.__path__.append(_MODULE_UTILS)

from ansible.module_utils.fleet_instances import instance_id  # noqa: E402
from ansible.module_utils.plan_speed import calibration_record  # noqa: E402
from ansible.module_utils.speed_gate import model_file  # noqa: E402
from ansible.module_utils.filter_input import guard_filters  # noqa: E402

RECORD_VERSION = 1
# The load-test levels the record keeps per instance (besides every level as measured).
_LEVEL_KEYS = ("concurrency", "streams_ok", "tokens", "wall_s", "aggregate_tps", "aggregate_decode_tps",
               "per_stream_tps_mean", "per_stream_tps_min", "server_predicted_tps_mean", "ttft_s_mean",
               "ttft_s_max", "errors")


def _num(value, digits=1):
    return None if value is None else round(float(value), digits)


def _level(report, concurrency):
    for entry in (report or {}).get("levels", []):
        if entry.get("concurrency") == concurrency:
            return entry
    return None


def _find_plan(plans, instance):
    if instance.get("instance") not in (None, ""):
        for plan in plans or []:
            if plan.get("instance") not in (None, "") and instance_id(plan) == instance_id(instance):
                return plan
    for plan in plans or []:
        if instance.get("gpu_uuid") and plan.get("gpu_uuid") == instance.get("gpu_uuid"):
            return plan
    for plan in plans or []:
        if plan.get("gpu_index") == instance.get("gpu_index"):
            return plan
    return {}


def _find_gpu(gpus, instance):
    for gpu in gpus or []:
        if instance.get("gpu_uuid") and gpu.get("uuid") == instance.get("gpu_uuid"):
            return gpu
    for gpu in gpus or []:
        if gpu.get("index") == instance.get("gpu_index"):
            return gpu
    return {}


def _parse_json(text):
    """A command's stdout as JSON, or None (the last line that parses: tools may log first)."""
    if isinstance(text, dict):
        return text
    if not text:
        return None
    try:
        return json.loads(text)
    except ValueError:
        pass
    for line in reversed(str(text).splitlines()):
        line = line.strip()
        if line.startswith("{") or line.startswith("["):
            try:
                return json.loads(line)
            except ValueError:
                continue
    return None


def llama_bench_figures(result):
    """What the record keeps of llama-bench's -o json output: prompt and decode rates."""
    if not result:
        return None
    if result.get("skipped_reason"):
        return {"status": "skipped", "reason": result["skipped_reason"]}
    rows = _parse_json(result.get("stdout"))
    if result.get("rc", 0) != 0 or not isinstance(rows, list):
        tail = (result.get("stderr") or result.get("stdout") or "").strip().splitlines()[-3:]
        return {"status": "error", "reason": "llama-bench exited with %s: %s" % (result.get("rc"), " / ".join(tail))}
    out = {"status": "ok", "tests": []}
    for row in rows:
        n_prompt, n_gen = int(row.get("n_prompt") or 0), int(row.get("n_gen") or 0)
        name = "pp%d" % n_prompt if n_prompt and not n_gen else ("tg%d" % n_gen if n_gen and not n_prompt
                                                                  else "pp%d+tg%d" % (n_prompt, n_gen))
        test = {"test": name, "avg_ts": _num(row.get("avg_ts"), 2), "stddev_ts": _num(row.get("stddev_ts"), 2),
                "n_prompt": n_prompt, "n_gen": n_gen, "type_k": row.get("type_k"), "type_v": row.get("type_v"),
                "flash_attn": row.get("flash_attn"), "n_gpu_layers": row.get("n_gpu_layers")}
        out["tests"].append(test)
        if n_prompt and not n_gen:
            out["prompt_tps"] = test["avg_ts"]
        if n_gen and not n_prompt:
            out["decode_tps"] = test["avg_ts"]
        out.setdefault("build_commit", row.get("build_commit"))
        out.setdefault("gpu_info", row.get("gpu_info"))
    return out


def _split_vram(memory, gpus, gpu_backend):
    """A split instance's memory card by card: (measured total, [per card])."""
    cards, measured = [], 0
    for share in memory.get("per_gpu") or []:
        gpu = _find_gpu(gpus, {"gpu_index": share.get("gpu_index")})
        used = gpu.get("memory_used_bytes")
        measured = measured + used if used is not None and measured is not None else None
        predicted = share.get("predicted_used_bytes")
        cards.append({"gpu_index": share.get("gpu_index"), "measured_used_bytes": used,
                      "predicted_used_bytes": predicted,
                      "measured_over_predicted": round(float(used) / predicted, 4)
                      if gpu_backend and used and predicted else None})
    return measured, cards


def _process_vram(gpu, pid, processes=None):
    """The card's compute process of this PID ({pid, name, used_bytes}), or None.
    processes: the card's processes read right after the load test, where given (a model
    loaded on demand: a later model's load may have stopped its child since)."""
    if not pid:
        return None
    for proc in (processes if processes is not None else ((gpu or {}).get("health") or {}).get("processes")) or []:
        if str(proc.get("pid")) == str(pid):
            return proc
    return None


def _idle_cards(instance, plan, gpu, gpus):
    """The instance's GPUs on which NVML listed no compute process at all while it
    served, or [] when any card holds one or was not read. A CUDA build that finds no
    usable device serves from the CPU and never shows on its card: a simulated card
    (which computes nothing), or on a real host a driver or build at fault."""
    indices = instance.get("gpu_indices") or plan.get("gpu_indices")
    cards = [_find_gpu(gpus, {"gpu_index": i}) for i in indices] if indices and len(indices) > 1 else [gpu]
    health = [(c or {}).get("health") or {} for c in cards]
    if not cards or not all(h.get("processes_read") and not h.get("processes") for h in health):
        return []
    return [c.get("index") for c in cards]


def instance_record(instance, plan, gpu, loadtest, bench, backend, min_fraction, gpus=None):
    """One instance's figures, ratios and verdict (gpus: every GPU of the host, for
    a split instance's cards)."""
    problems = []
    lt = _parse_json((loadtest or {}).get("stdout")) if loadtest and "stdout" in loadtest else loadtest
    if not lt:
        problems.append("load test gave no result (%s)" % ((loadtest or {}).get("stderr") or "no output").strip()[:300])
        lt = {}
    elif lt.get("error"):
        problems.append("load test: %s" % lt["error"])
    for entry in lt.get("levels", []):
        if entry.get("errors"):
            problems.append("%d stream(s): %d error(s), first: %s" % (entry["concurrency"], len(entry["errors"]),
                                                                     entry["errors"][0][:200]))
    for skipped in lt.get("skipped", []):
        problems.append("%s stream(s) not measured: %s" % (skipped.get("concurrency"), skipped.get("reason")))
    slots = int(instance.get("parallel") or lt.get("total_slots") or 1)
    one, four, full = _level(lt, 1) or {}, _level(lt, 4) or {}, _level(lt, slots) or {}
    single = one.get("per_stream_tps_mean")
    memory = plan.get("memory") or {}
    ceiling = plan.get("decode_ceiling_tps")
    gpu_build = str(backend or "").lower() not in ("cpu", "")
    idle = _idle_cards(instance, plan, gpu, gpus or [gpu]) if gpu_build else []
    # served by the GPU: a GPU build whose cards were not seen idle while it served
    gpu_backend = gpu_build and not idle
    if idle:
        ceiling_note = ("not applicable: the CPU served (no process on GPU %s while the instance served, by NVML; "
                        "a simulated card computes nothing, on a real host check the driver and the CUDA build)"
                        % ",".join(str(i) for i in idle))
        ratio = None
    elif not gpu_backend:
        ceiling_note = "not applicable: llama.cpp backend is %s, the GPU ceiling says nothing about it" % (
            backend or "unknown")
        ratio = None
    elif not ceiling:
        ceiling_note = "no decode_ceiling_tps in the model stage's plan for this GPU"
        ratio = None
    elif single is None:
        ceiling_note = "no single-stream figure measured"
        ratio = None
    else:
        ratio = round(float(single) / float(ceiling), 3)
        ceiling_note = "1 stream %.1f tok/s of a %.1f tok/s ceiling" % (single, ceiling)
    errors = list(problems)
    bench_figures = llama_bench_figures(bench)
    if bench_figures and bench_figures["status"] == "error":
        # reported, not fatal: the served speed above is what the stage verifies
        problems.append("llama-bench: %s" % bench_figures["reason"])
    # the first token of a prompt as long as the plan assumes, beside the plan's figure
    measured_first, planned_first = lt.get("first_token") or {}, plan.get("first_token") or {}
    first_token = None
    if measured_first or planned_first:
        first_token = {
            "prompt_tokens": measured_first.get("prompt_tokens"),
            "ttft_s": _num(measured_first.get("ttft_s"), 3),
            "prompt_tps": _num(measured_first.get("prompt_tps"), 1),
            "expected_ttft_s": planned_first.get("ttft_s") if gpu_backend else None,
            "expected_prompt_tps": planned_first.get("prompt_tps") if gpu_backend else None,
            "error": measured_first.get("error"),
        }
        if measured_first.get("error"):
            problems.append("first token: %s" % str(measured_first["error"])[:300])  # reported, not fatal
    flagged = bool(idle) or (ratio is not None and min_fraction is not None and ratio < float(min_fraction))
    if idle:
        problems.append("served from the CPU: no process on GPU %s (NVML)" % ",".join(str(i) for i in idle))
    elif flagged:
        problems.append("below %.0f%% of the decode ceiling: %.1f of %.1f tok/s (%.0f%%)"
                        % (float(min_fraction) * 100, single, ceiling, ratio * 100))
    predicted = memory.get("predicted_used_bytes")
    if predicted is None and memory.get("total_bytes") is not None:
        predicted = memory["total_bytes"] - (memory.get("headroom_bytes") or 0)
    used = gpu.get("memory_used_bytes")
    per_gpu, process = None, None
    process_scope = bool(memory.get("other_models_bytes")) or instance.get("load") == "on_demand"
    if memory.get("per_gpu"):
        used, per_gpu = _split_vram(memory, gpus or [gpu], gpu_backend)
    elif process_scope:
        # other models' instances share the card, or the model runs in its router's child:
        # this process's own memory (NVML, by the PID that served the load test) against
        # what the plan gave the process alone
        process = _process_vram(gpu, (loadtest or {}).get("pid"), (loadtest or {}).get("processes"))
        used, predicted = (process or {}).get("used_bytes"), memory.get("predicted_process_bytes")
    vram = {
        "measured_used_bytes": used,
        "total_bytes": gpu.get("memory_total_bytes"),
        "predicted_used_bytes": predicted,
        "planned_total_bytes": memory.get("total_bytes"),
        "measured_over_predicted": round(float(used) / predicted, 4) if gpu_backend and used and predicted else None,
        "note": None if gpu_backend else "not applicable: the CPU served (no process on its GPU)" if idle else
        "not applicable: a %s build keeps the model in host memory" % (backend or "?"),
    }
    if per_gpu is not None:
        vram["per_gpu"] = per_gpu
    elif vram["measured_over_predicted"] is not None and memory.get("overhead_cuda_bytes"):
        # what the process's CUDA context really took: the plan's figure plus the whole
        # difference (weights, KV and compute buffers match llama-fit-params to the MiB);
        # the calibration keeps it and the next plan budgets it (plan_speed.measured_overhead)
        vram["cuda_overhead_bytes"] = int(memory["overhead_cuda_bytes"]) + int(used) - int(predicted)
    if process_scope:
        vram["scope"] = "process"
        vram["pid"] = (loadtest or {}).get("pid")
        if process is None and gpu_backend:
            vram["note"] = "the process (PID %s) was not among the card's compute processes (NVML)" % vram["pid"]
    return {
        "instance": instance_id(instance) if instance.get("gpu_index") is not None else instance.get("instance"),
        "model_name": instance.get("model_name") or plan.get("model_name") or "",
        "model_rank": int(instance.get("model_rank") or 0),
        "gpu_index": instance.get("gpu_index"),
        "gpu_uuid": instance.get("gpu_uuid"),
        "gpu_indices": instance.get("gpu_indices") or plan.get("gpu_indices") or [instance.get("gpu_index")],
        "split_mode": plan.get("split_mode") or "none",
        "gpu_name": plan.get("gpu_name") if plan.get("split_mode", "none") != "none" else (
            gpu.get("name") or plan.get("gpu_name")),
        "port": instance.get("port"),
        "unit": instance.get("unit"),
        "quant": instance.get("quant"),
        # the model's file name: the speed gate's baselines are per model (module_utils/speed_gate.py)
        "model_file": model_file(instance) or model_file(plan),
        "ctx_size": instance.get("ctx_size"),
        "parallel": slots,
        "cache_type_k": instance.get("cache_type_k"),
        "cache_type_v": instance.get("cache_type_v"),
        # speculative decoding the instance served with (none, ngram-mod), and what the plan was
        # for (latency, throughput): what speculation must gain (module_utils/speculation.py)
        "spec_type": instance.get("spec_type") or plan.get("spec_type") or "none",
        "objective": plan.get("objective") or "latency",
        # resident, or on_demand: served by its card's router (module_utils/speed_gate.py keys on it)
        "load": instance.get("load") or "resident",
        # the draft model it served with (draft-simple): a verdict is that draft's only
        "draft_model": (plan.get("draft") or {}).get("path") if plan.get("spec_type") == "draft-simple" else None,
        "n_predict": lt.get("n_predict"),
        # the load test's prompt ('default', or its sha256's first 12 hex digits)
        "prompt_id": lt.get("prompt_id"),
        "single_stream_tps": _num(single, 2),
        "ttft_s": _num(one.get("ttft_s_mean"), 3),
        "aggregate_4_tps": _num(four.get("aggregate_tps"), 2),
        "aggregate_slots_tps": _num(full.get("aggregate_tps"), 2),
        "per_stream_at_slots_tps": _num(full.get("per_stream_tps_mean"), 2),
        "ttft_at_slots_s": _num(full.get("ttft_s_mean"), 3),
        "first_token": first_token,
        "levels": [dict((k, e.get(k)) for k in _LEVEL_KEYS) for e in lt.get("levels", [])],
        "decode_ceiling_tps": ceiling,
        # the plan's expectation, beside what was measured (None on a CPU build)
        "expected_decode_tps": plan.get("expected_decode_tps") if gpu_backend else None,
        "expected_aggregate_tps": plan.get("expected_aggregate_tps") if gpu_backend else None,
        "ceiling_ratio": ratio,
        "ceiling_note": ceiling_note,
        # gpu: served by its card(s); cpu: a CPU build, or a GPU build that never showed on its card
        "served_by": "gpu" if gpu_backend else "cpu",
        "llama_bench": bench_figures,
        "vram": vram,
        "flagged": flagged,
        "problems": problems,
        "errors": errors,
        "ok": not errors,
    }


def verify_host_record(host, instances, plans, gpus, loadtests, benches, llama_cpp, min_fraction, measured_at=None):
    """The whole llm_fleet_verify fact of one host.

    instances: the llama_server fact's `instances`; plans: the model fact's `plans`;
    gpus: nvidia_gpu_facts' `nvidia_gpus` read after the load tests; loadtests and
    benches: one registered command result (or parsed dict) per instance, in the
    same order (a bench may be None or {'skipped_reason': ...}); llama_cpp: the
    llama_cpp fact (backend, commit, build_key)."""
    llama_cpp = llama_cpp or {}
    backend = llama_cpp.get("backend")
    loadtests, benches = list(loadtests or []), list(benches or [])
    records, calibration, not_calibrated = [], [], []
    for n, inst in enumerate(instances or []):
        plan = _find_plan(plans, inst)
        record = instance_record(inst, plan, _find_gpu(gpus, inst), loadtests[n] if n < len(loadtests) else None,
                                 benches[n] if n < len(benches) else None, backend, min_fraction, gpus)
        records.append(record)
        if record["split_mode"] != "none":
            # its speed holds the exchange between the cards: not one card's efficiency
            entry, why_not = None, "a %s split over GPUs %s is not a one-card figure" % (
                record["split_mode"], ",".join(str(i) for i in record["gpu_indices"]))
        else:
            entry, why_not = calibration_record(record, plan, host, measured_at, llama_cpp.get("build_key"))
        if entry:
            calibration.append(entry)
        else:
            not_calibrated.append("%s GPU %s: %s" % (host, record["gpu_index"], why_not))
    errors = [p for r in records for p in r["errors"]]
    flagged = [r for r in records if r["flagged"]]
    several = any(r["model_rank"] for r in records)
    parts = []
    for r in records:
        text = "GPU %s%s :%s %s %s tok/s 1-stream" % (r["gpu_index"], " %s" % r["model_name"] if several else "",
                                                      r["port"], r["quant"] or "",
                                                      r["single_stream_tps"] if r["single_stream_tps"] is not None
                                                      else "?")
        if r["ceiling_ratio"] is not None:
            text += " (%.0f%% of %.0f)" % (r["ceiling_ratio"] * 100, r["decode_ceiling_tps"])
        if r["aggregate_slots_tps"] is not None:
            text += ", %s tok/s x%d" % (r["aggregate_slots_tps"], r["parallel"])
        parts.append(text)
    status = "ERROR" if errors else ("FLAGGED" if flagged else "ok")
    summary = "%s: %s%s" % (status, "; ".join(parts) or "no instance", "" if backend != "cpu" else
                            " (cpu build: ceiling n/a)")
    # What a rerun must reproduce for the stage to count as unchanged: the
    # instances and their configuration, the build and the verdicts, not the
    # figures, which move a little on every measurement.
    verdict_key = json.dumps({
        "build": llama_cpp.get("build_key"), "backend": backend,
        "instances": [[r["gpu_uuid"], r["port"], r["quant"], r["ctx_size"], r["parallel"], r["cache_type_k"],
                       r["ok"], r["flagged"]] for r in records],
    }, sort_keys=True)
    return {
        "version": RECORD_VERSION,
        "host": host,
        "measured_at": measured_at,
        "status": status,
        "summary": summary,
        "llama_cpp": {"commit": llama_cpp.get("commit"), "build_key": llama_cpp.get("build_key"), "backend": backend},
        "min_ceiling_fraction": min_fraction,
        "instances": records,
        # what this measurement adds to the fleet's decode calibration (plan_speed)
        "calibration": calibration,
        "not_calibrated": not_calibrated,
        "flagged": bool(flagged),
        "errors": errors,
        "verdict_key": verdict_key,
    }


def verify_progress_line(record):
    """One line per instance for the run's output."""
    return ["%s %s" % (record.get("host"), line) for line in record.get("summary", "").split("; ")]


def verify_fleet_report(records, generated_at=None, settings=None):
    """The fleet report as one JSON-ready dict."""
    records = [r for r in records or [] if r]
    instances = [i for r in records for i in r.get("instances", [])]
    ratios = [i["ceiling_ratio"] for i in instances if i.get("ceiling_ratio") is not None]
    return {
        "schema": "llm-fleet-verify-report/1",
        "generated_at": generated_at,
        "settings": settings or {},
        "hosts": len(records),
        "instances": len(instances),
        "flagged_hosts": sorted(r["host"] for r in records if r.get("flagged")),
        "error_hosts": sorted(r["host"] for r in records if r.get("errors")),
        "single_stream_tps_total": round(sum(i["single_stream_tps"] or 0 for i in instances), 1),
        "aggregate_slots_tps_total": round(sum(i["aggregate_slots_tps"] or 0 for i in instances), 1),
        "ceiling_ratio_min": min(ratios) if ratios else None,
        "ceiling_ratio_mean": round(sum(ratios) / len(ratios), 3) if ratios else None,
        "records": records,
    }


_KINDS = {
    "verify_host_record": {
        "instances": "dicts?", "plans": "dicts?", "gpus": "dicts?", "loadtests": "list?", "benches": "list?",
        "llama_cpp": "dict?"},
    "verify_progress_line": {"record": "dict"},
    "verify_fleet_report": {"records": "list?", "settings": "dict?"},
    "verify_llama_bench_figures": {"result": "dict?"},
}


class FilterModule(object):
    def filters(self):
        return guard_filters({
            "verify_host_record": verify_host_record,
            "verify_progress_line": verify_progress_line,
            "verify_fleet_report": verify_fleet_report,
            "verify_llama_bench_figures": llama_bench_figures,
        }, _KINDS)
