#!/usr/bin/env python3
"""Writes dashboards/llm-fleet.json, the fleet's Grafana dashboard: serving (llama-server's
/metrics: tok/s, requests in flight and queued, busy slots per decode) and GPUs (the
gpu_exporter stage: dcgm-exporter's names, so the GPU panels also work on a fleet that
runs NVIDIA's dcgm-exporter), health and ECC. Import it in Grafana (Dashboards > Import)
and pick the Prometheus data source.

    python3 scripts/grafana-dashboard.py          # rewrite the file
    python3 scripts/grafana-dashboard.py --check  # exit 1 when the file is not current

tests/unit/test_grafana_dashboard.py checks that every metric a panel queries is one the
exporter serves or the pinned llama-server serves (recorded from it)."""
import json
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT = os.path.join(ROOT, "dashboards", "llm-fleet.json")
DS = {"type": "prometheus", "uid": "${datasource}"}
GPU = '{Hostname=~"$host"}'
GPU_LEGEND = "{{Hostname}} GPU {{gpu}}"

# (row, [(title, unit, [(expr, legend)], kind)])
ROWS = [
    ("Serving (llama-server /metrics)", [
        ("Fleet decode tok/s", "short", [("sum(rate(llamacpp:tokens_predicted_total[1m]))", "generated tok/s"),
                                         ("sum(rate(llamacpp:prompt_tokens_total[1m]))", "prompt tok/s")], "timeseries"),
        ("Decode tok/s per instance", "short",
         [("sum by (instance) (rate(llamacpp:tokens_predicted_total[1m]))", "{{instance}}")], "timeseries"),
        ("Requests in flight and queued", "short",
         [("sum by (instance) (llamacpp:requests_processing)", "{{instance}} processing"),
          ("sum by (instance) (llamacpp:requests_deferred)", "{{instance}} queued")], "timeseries"),
        ("Busy slots per decode", "short",
         [("avg by (instance) (llamacpp:n_busy_slots_per_decode)", "{{instance}}")], "timeseries"),
    ]),
    ("GPUs (gpu_exporter, dcgm-exporter names)", [
        ("GPU utilisation", "percent", [("DCGM_FI_DEV_GPU_UTIL" + GPU, GPU_LEGEND)], "timeseries"),
        ("GPU memory used", "percentunit",
         [("DCGM_FI_DEV_FB_USED%s / (DCGM_FI_DEV_FB_USED%s + DCGM_FI_DEV_FB_FREE%s)" % (GPU, GPU, GPU), GPU_LEGEND)],
         "timeseries"),
        ("Power draw and limit", "watt",
         [("DCGM_FI_DEV_POWER_USAGE" + GPU, GPU_LEGEND),
          ("DCGM_FI_DEV_POWER_MGMT_LIMIT" + GPU, GPU_LEGEND + " limit"),
          ("llm_fleet_gpu_power_limit_requested_watts" + GPU, GPU_LEGEND + " asked")], "timeseries"),
        ("Temperature", "celsius", [("DCGM_FI_DEV_GPU_TEMP" + GPU, GPU_LEGEND)], "timeseries"),
        ("SM clock and lock", "hertz",
         [("DCGM_FI_DEV_SM_CLOCK%s * 1e6" % GPU, GPU_LEGEND),
          ("llm_fleet_gpu_clock_lock_requested_mhz%s * 1e6" % GPU, GPU_LEGEND + " lock asked")], "timeseries"),
        ("Memory clock", "hertz", [("DCGM_FI_DEV_MEM_CLOCK%s * 1e6" % GPU, GPU_LEGEND)], "timeseries"),
    ]),
    ("Health", [
        ("GPUs failing the health check", "short",
         [("count(llm_fleet_gpu_healthy%s == 0) or vector(0)" % GPU, "unhealthy")], "stat"),
        ("Health problems", "short",
         [("llm_fleet_gpu_health_problem" + GPU, GPU_LEGEND + " {{check}} ({{severity}})")], "timeseries"),
        ("Uncorrectable (DBE) and corrected (SBE) ECC errors since boot", "short",
         [("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL" + GPU, GPU_LEGEND + " DBE"),
          ("DCGM_FI_DEV_ECC_SBE_VOL_TOTAL" + GPU, GPU_LEGEND + " SBE")], "timeseries"),
        ("Retired pages (Volta) and remapped rows (Ampere+)", "short",
         [("DCGM_FI_DEV_RETIRED_DBE" + GPU, GPU_LEGEND + " retired DBE"),
          ("DCGM_FI_DEV_RETIRED_SBE" + GPU, GPU_LEGEND + " retired SBE"),
          ("DCGM_FI_DEV_RETIRED_PENDING" + GPU, GPU_LEGEND + " pending"),
          ("DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS" + GPU, GPU_LEGEND + " remapped (uncorr.)")], "timeseries"),
        ("Last Xid since boot (0: none)", "short",
         [("DCGM_FI_DEV_XID_ERRORS" + GPU, GPU_LEGEND)], "timeseries"),
        ("GPU memory held per process", "bytes",
         [("llm_fleet_gpu_process_memory_bytes" + GPU, GPU_LEGEND + " {{process}} ({{pid}})")], "timeseries"),
        ("Exporter reads NVML", "short",
         [("min(llm_fleet_gpu_exporter_nvml_up%s)" % GPU, "NVML up")], "stat"),
        ("Exporter hears Xid events", "short",
         [("min(llm_fleet_gpu_exporter_xid_listening%s)" % GPU, "listening")], "stat"),
    ]),
]


def panel(pid, title, unit, targets, kind, x, y):
    return {
        "id": pid, "type": kind, "title": title, "datasource": DS,
        "gridPos": {"h": 8, "w": 12, "x": x, "y": y},
        "fieldConfig": {"defaults": {"unit": unit}, "overrides": []},
        "options": {"legend": {"displayMode": "list", "placement": "bottom"}} if kind == "timeseries" else {},
        "targets": [{"refId": chr(ord("A") + n), "datasource": DS, "expr": expr, "legendFormat": legend}
                    for n, (expr, legend) in enumerate(targets)],
    }


def dashboard():
    panels, pid, y = [], 1, 0
    for row_title, row in ROWS:
        panels.append({"id": pid, "type": "row", "title": row_title, "collapsed": False,
                       "gridPos": {"h": 1, "w": 24, "x": 0, "y": y}, "panels": []})
        pid, y = pid + 1, y + 1
        for n, (title, unit, targets, kind) in enumerate(row):
            panels.append(panel(pid, title, unit, targets, kind, 12 * (n % 2), y + 8 * (n // 2)))
            pid += 1
        y += 8 * ((len(row) + 1) // 2)
    return {
        "title": "llm-fleet", "uid": "llm-fleet", "tags": ["llm-fleet", "llama.cpp", "gpu"],
        "schemaVersion": 39, "version": 1, "editable": True, "time": {"from": "now-6h", "to": "now"},
        "refresh": "30s",
        "templating": {"list": [
            {"name": "datasource", "label": "Prometheus", "type": "datasource", "query": "prometheus"},
            {"name": "host", "label": "Host", "type": "query", "datasource": DS, "includeAll": True, "multi": True,
             "allValue": ".*", "query": {"query": "label_values(DCGM_FI_DEV_GPU_UTIL, Hostname)", "refId": "host"},
             "refresh": 2},
        ]},
        "panels": panels,
    }


def main(argv):
    text = json.dumps(dashboard(), indent=2, sort_keys=True) + "\n"
    if "--check" in argv:
        current = open(OUT).read() if os.path.exists(OUT) else ""
        if current != text:
            print("%s is not current: run python3 scripts/grafana-dashboard.py" % os.path.relpath(OUT, ROOT))
            return 1
        return 0
    os.makedirs(os.path.dirname(OUT), exist_ok=True)
    with open(OUT, "w") as f:
        f.write(text)
    print("wrote %s (%d panels)" % (os.path.relpath(OUT, ROOT), len(dashboard()["panels"])))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
