"""The verify stage's record and fleet report (roles/verify/filter_plugins/verify_report.py, drawn by verify_render.py):
built from a real load test and a real llama-bench run of a CPU llama.cpp build (see
test_loadtest.py for where the build comes from), and from synthetic GPU figures for
the ratios, flags and errors a CPU build cannot show."""
import importlib.util
import json
import subprocess
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

import paths

from test_loadtest import Server, free_port, llama_bin_dir, lt, served, tiny_model  # noqa: F401 (fixtures)

ROOT = Path(__file__).resolve().parents[2]
GIB = 1 << 30


def load_filters(name):
    path = ROOT / "roles" / "verify" / "filter_plugins" / (name + ".py")
    spec = importlib.util.spec_from_file_location(name, str(path))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


vr = load_filters("verify_report")
render = load_filters("verify_render")

UUID = "GPU-4f6a1c2e-8b3d-4e55-9a71-2c0d93b5e7a4"
INSTANCE = {"gpu_index": 0, "gpu_uuid": UUID, "port": 8080, "unit": "llama-server@0.service",
            "model_path": "/srv/models/qwen-q4_k_m.gguf", "quant": "Q4_K_M", "ctx_size": 32768, "parallel": 4,
            "cache_type_k": "f16", "cache_type_v": "f16"}
PLAN = {"gpu_index": 0, "gpu_uuid": UUID, "gpu_name": "Tesla V100-SXM2-32GB", "decode_ceiling_tps": 43.5,
        "memory": {"total_bytes": int(27.91 * GIB), "headroom_bytes": GIB // 2,
                   "predicted_used_bytes": int(27.41 * GIB)}}
GPU = {"index": 0, "uuid": UUID, "name": "Tesla V100-SXM2-32GB", "memory_total_bytes": 32 * GIB,
       "memory_used_bytes": int(27.0 * GIB), "memory_free_bytes": 5 * GIB}
CUDA_BUILD = {"backend": "cuda", "commit": "0c1e57098bba", "build_key": "0c1e57098-cuda-abc", "bin_dir": "/x"}


def synthetic_loadtest(single=20.0, agg4=60.0, errors=None):
    def level(c, per, agg):
        return {"concurrency": c, "streams_ok": c, "errors": list(errors or []) if c == 4 else [], "wall_s": 7.0,
                "tokens": 128 * c, "aggregate_tps": agg, "aggregate_decode_tps": per * c, "per_stream_tps_mean": per,
                "per_stream_tps_min": per, "server_predicted_tps_mean": per, "ttft_s_mean": 0.2, "ttft_s_max": 0.3,
                "streams": []}
    return {"version": 1, "ok": not errors, "total_slots": 4, "n_predict": 128,
            "levels": [level(1, single, single * 0.9), level(4, agg4 / 4, agg4)], "skipped": []}


def record(loadtest, min_fraction=0.25, llama_cpp=CUDA_BUILD, bench=None, host="gpu01"):
    return vr.verify_host_record(host, [INSTANCE], [PLAN], [GPU], [{"rc": 0, "stdout": json.dumps(loadtest)}],
                                 [bench], llama_cpp, min_fraction, "2026-11-30T12:00:00Z")


# --- synthetic GPU figures --------------------------------------------------------------

def test_ratio_vram_and_summary_on_a_gpu_build():
    rec = record(synthetic_loadtest(single=20.0, agg4=60.0))
    inst = rec["instances"][0]
    assert inst["ceiling_ratio"] == pytest.approx(20.0 / 43.5, abs=1e-3)
    assert inst["single_stream_tps"] == 20.0 and inst["aggregate_4_tps"] == 60.0 and inst["aggregate_slots_tps"] == 60.0
    assert inst["vram"]["measured_over_predicted"] == pytest.approx(27.0 / 27.41, abs=1e-3)
    assert not inst["flagged"] and inst["ok"] and rec["status"] == "ok"
    assert rec["summary"].startswith("ok: GPU 0 :8080 Q4_K_M 20.0 tok/s 1-stream (46% of 44)")
    json.dumps(rec)  # the fact is JSON
    # a plan of an older llm-fleet (no decode_efficiency) gives no calibration record, and says so
    assert rec["calibration"] == [] and "older llm-fleet" in rec["not_calibrated"][0]


def test_a_gpu_measurement_calibrates_the_fleet():
    plan = dict(PLAN, quant="Q4_K_M", cache_type_k="f16", expected_decode_tps=27.8, expected_aggregate_tps=62.0,
                decode_efficiency={"gpu_family": "volta", "quant_family": "Q4_K", "arch": "dense", "value": 0.64})
    rec = vr.verify_host_record("gpu01", [INSTANCE], [plan], [GPU],
                                [{"rc": 0, "stdout": json.dumps(synthetic_loadtest(single=26.1, agg4=60.0))}],
                                [None], CUDA_BUILD, 0.25, "2026-11-30T12:00:00Z")
    entry, = rec["calibration"]
    assert entry["efficiency"] == pytest.approx(26.1 / 43.5, abs=1e-3) and entry["gpu_name"] == GPU["name"]
    assert (entry["quant_family"], entry["arch"], entry["build"], entry["host"]) == ("Q4_K", "dense",
                                                                                     CUDA_BUILD["build_key"], "gpu01")
    assert rec["not_calibrated"] == []
    md = render.verify_fleet_markdown(vr.verify_fleet_report([rec], "now", {"min_ceiling_fraction": 0.25}))
    assert "| 27.8 / 62.0 | 43.5 |" in md  # expected beside measured


def test_the_first_token_is_recorded_beside_the_plan_s_figure_and_its_failure_is_not_fatal():
    plan = dict(PLAN, first_token={"prompt_tokens": 4096, "prompt_tps": 625.8, "ttft_s": 6.55, "source": "s"})
    measured = dict(synthetic_loadtest(single=20.0, agg4=60.0),
                    first_token={"prompt_tokens_asked": 4096, "prompt_tokens": 4096, "ttft_s": 7.01234,
                                 "prompt_tps": 590.04, "error": None})
    rec = vr.verify_host_record("gpu01", [INSTANCE], [plan], [GPU], [{"rc": 0, "stdout": json.dumps(measured)}],
                                [None], CUDA_BUILD, 0.25, "2026-11-30T12:00:00Z")
    first = rec["instances"][0]["first_token"]
    assert first == {"prompt_tokens": 4096, "ttft_s": 7.012, "prompt_tps": 590.0, "expected_ttft_s": 6.55,
                     "expected_prompt_tps": 625.8, "error": None}
    failed = dict(measured, first_token=dict(measured["first_token"], error="HTTP 400: too long", ttft_s=None))
    rec = vr.verify_host_record("gpu01", [INSTANCE], [plan], [GPU], [{"rc": 0, "stdout": json.dumps(failed)}],
                                [None], CUDA_BUILD, 0.25, "2026-11-30T12:00:00Z")
    inst = rec["instances"][0]
    assert "first token: HTTP 400: too long" in inst["problems"] and inst["ok"] and inst["errors"] == []


def test_a_split_instance_is_measured_card_by_card_and_not_calibrated():
    uuid1 = UUID[:-1] + "5"
    instance = dict(INSTANCE, gpu_indices=[0, 1], gpu_uuids=[UUID, uuid1], split_mode="tensor")
    share = {"predicted_used_bytes": int(13.5 * GIB)}
    plan = dict(PLAN, gpu_name="2 x Tesla V100-SXM2-16GB", gpu_indices=[0, 1], split_mode="tensor",
                decode_efficiency={"gpu_family": "volta", "quant_family": "Q6_K", "arch": "dense", "value": 0.64},
                memory=dict(PLAN["memory"], predicted_used_bytes=27 * GIB,
                            per_gpu=[dict(share, gpu_index=0), dict(share, gpu_index=1)]))
    gpus = [dict(GPU, memory_used_bytes=int(13.0 * GIB)), dict(GPU, index=1, uuid=uuid1, memory_used_bytes=14 * GIB)]
    rec = vr.verify_host_record("gpu02", [instance], [plan], gpus,
                                [{"rc": 0, "stdout": json.dumps(synthetic_loadtest(single=30.0, agg4=80.0))}],
                                [None], CUDA_BUILD, 0.25, "2026-11-30T12:00:00Z")
    inst, = rec["instances"]
    assert inst["gpu_indices"] == [0, 1] and inst["split_mode"] == "tensor"
    assert inst["vram"]["measured_used_bytes"] == int(13.0 * GIB) + 14 * GIB  # both cards, not the first
    assert [c["measured_over_predicted"] for c in inst["vram"]["per_gpu"]] == [
        pytest.approx(13.0 / 13.5, abs=1e-3), pytest.approx(14 / 13.5, abs=1e-3)]
    assert rec["calibration"] == [] and "tensor split over GPUs 0,1" in rec["not_calibrated"][0]


def test_a_cuda_build_its_card_never_saw_is_cpu_served_flagged_and_not_calibrated():
    """The simulated fleet's case, and a real host's broken driver: the GPU build runs,
    NVML lists no process on the card, so the CPU served and no GPU figure applies."""
    plan = dict(PLAN, quant="Q4_K_M", expected_decode_tps=27.8, first_token={"ttft_s": 2.0, "prompt_tps": 900},
                decode_efficiency={"gpu_family": "volta", "quant_family": "Q4_K", "arch": "dense", "value": 0.6})
    idle = dict(GPU, health={"processes": [], "processes_read": True})
    rec = vr.verify_host_record("gpu01", [INSTANCE], [plan], [idle], [{"rc": 0, "stdout": json.dumps(
        synthetic_loadtest(single=600.0))}], [None], CUDA_BUILD, 0.25, "2026-12-05T12:00:00Z")
    inst = rec["instances"][0]
    assert inst["served_by"] == "cpu" and inst["flagged"] and inst["ok"] and rec["status"] == "FLAGGED"
    assert inst["ceiling_ratio"] is None and inst["expected_decode_tps"] is None
    assert inst["vram"]["measured_over_predicted"] is None and "CPU served" in inst["vram"]["note"]
    assert "no process on GPU 0" in inst["ceiling_note"]
    assert inst["problems"] == ["served from the CPU: no process on GPU 0 (NVML)"]
    assert rec["calibration"] == [] and "CPU served" in rec["not_calibrated"][0]
    # the same card holding a process, or not read, is the GPU's
    for health in ({"processes": [{"pid": 7, "name": "llama-server", "used_bytes": GIB}], "processes_read": True},
                   {"processes": [], "processes_read": False}, None):
        busy = dict(GPU, health=health)
        rec = vr.verify_host_record("gpu01", [INSTANCE], [plan], [busy], [{"rc": 0, "stdout": json.dumps(
            synthetic_loadtest(single=20.0))}], [None], CUDA_BUILD, 0.25)
        assert rec["instances"][0]["served_by"] == "gpu" and rec["instances"][0]["ceiling_ratio"] is not None


def test_two_models_on_one_card_are_measured_process_by_process():
    """Several models (issue 35): each instance's memory is its own process's (NVML's compute
    process with the PID that served its load test) against what the plan gave the process
    alone; the card's total holds both and says nothing about either."""
    second = dict(INSTANCE, instance="0-code", model_name="code", model_rank=1, port=8180,
                  unit="llama-server@0-code.service", quant="Q6_K", model_path=None)
    first = dict(INSTANCE, instance="0", model_name="chat", model_rank=0)
    shared = {"other_models_bytes": 6 * GIB, "predicted_used_bytes": int(27.41 * GIB)}
    plans = [dict(PLAN, instance="0", model_name="chat",
                  memory=dict(PLAN["memory"], predicted_process_bytes=20 * GIB, **shared)),
             dict(PLAN, instance="0-code", model_name="code", quant="Q6_K", model_path="/srv/models/code-q6_k.gguf",
                  memory=dict(PLAN["memory"], predicted_process_bytes=6 * GIB,
                              **dict(shared, other_models_bytes=20 * GIB)))]
    gpu = dict(GPU, health={"processes_read": True, "processes": [
        {"pid": 101, "name": "llama-server", "used_bytes": int(19.9 * GIB)},
        {"pid": 202, "name": "llama-server", "used_bytes": int(6.1 * GIB)}]})
    tests = [{"rc": 0, "stdout": json.dumps(synthetic_loadtest()), "pid": "101"},
             {"rc": 0, "stdout": json.dumps(synthetic_loadtest(single=30.0)), "pid": "202"}]
    rec = vr.verify_host_record("gpu01", [second, first], plans, [gpu], tests[::-1], [None, None], CUDA_BUILD, 0.25)
    code, chat = rec["instances"]
    assert (code["instance"], code["model_name"], chat["instance"], chat["model_name"]) == ("0-code", "code", "0",
                                                                                          "chat")
    assert code["vram"]["scope"] == "process" and code["vram"]["pid"] == "202"
    assert code["vram"]["measured_used_bytes"] == int(6.1 * GIB)
    assert code["vram"]["predicted_used_bytes"] == 6 * GIB
    assert code["vram"]["measured_over_predicted"] == round(6.1 / 6, 4)
    assert chat["vram"]["measured_over_predicted"] == round(19.9 / 20, 4)
    assert code["quant"] == "Q6_K"
    # each model's speed baseline is its own (module_utils/speed_gate.py)
    # (the file the instance serves; the plan's where the instance names none)
    assert (code["model_file"], chat["model_file"]) == ("code-q6_k.gguf", "qwen-q4_k_m.gguf")
    assert "GPU 0 code :8180" in rec["summary"] and "GPU 0 chat :8080" in rec["summary"]
    # a PID NVML does not list: no ratio, and the record says why
    gone = vr.verify_host_record("gpu01", [second], plans, [gpu], [dict(tests[1], pid="999")], [None], CUDA_BUILD, 0.25)
    assert gone["instances"][0]["vram"]["measured_over_predicted"] is None
    assert "PID 999" in gone["instances"][0]["vram"]["note"]


def test_a_model_loaded_on_demand_is_measured_by_its_child_as_read_after_its_load_test():
    """A model loaded on demand runs in its router's child: its memory is that process's, even
    alone on the card (no resident model), and read right after its own load test, since a
    later model's load past --models-max stops the child before the host's last NVML read."""
    lazy = dict(INSTANCE, instance="0-small", model_name="small", model_rank=1, port=8180,
                unit="llama-server@0-router.service", load="on_demand", router="0-router")
    plan = dict(PLAN, instance="0-small", model_name="small", load="on_demand",
                memory=dict(PLAN["memory"], predicted_process_bytes=4 * GIB))
    # at the host's last read, another child (PID 303) replaced it
    later = dict(GPU, health={"processes_read": True, "processes": [
        {"pid": 303, "name": "llama-server", "used_bytes": 9 * GIB}]})
    read_then = [{"pid": 202, "name": "llama-server", "used_bytes": int(4.04 * GIB)}]
    test = {"rc": 0, "stdout": json.dumps(synthetic_loadtest()), "pid": "202", "processes": read_then}
    vram = vr.verify_host_record("gpu01", [lazy], [plan], [later], [test], [None], CUDA_BUILD,
                                 0.25)["instances"][0]["vram"]
    assert vram["scope"] == "process" and vram["pid"] == "202"
    assert vram["measured_used_bytes"] == int(4.04 * GIB) and vram["predicted_used_bytes"] == 4 * GIB
    assert vram["measured_over_predicted"] == round(4.04 / 4, 4)
    # without the read after its load test, the card's last read does not hold it: no ratio, and why
    vram = vr.verify_host_record("gpu01", [lazy], [plan], [later], [dict(test, processes=None)], [None], CUDA_BUILD,
                                 0.25)["instances"][0]["vram"]
    assert vram["measured_over_predicted"] is None and "PID 202" in vram["note"]


def test_below_the_fraction_is_flagged_not_an_error():
    rec = record(synthetic_loadtest(single=20.0), min_fraction=0.5)
    inst = rec["instances"][0]
    assert inst["flagged"] and rec["flagged"] and rec["status"] == "FLAGGED"
    assert rec["errors"] == [] and inst["ok"]
    assert any(p.startswith("below 50% of the decode ceiling: 20.0 of 43.5 tok/s") for p in inst["problems"])


def test_stream_errors_and_failed_runs_are_errors():
    rec = record(synthetic_loadtest(errors=["HTTP 503: loading"]))
    assert rec["status"] == "ERROR" and rec["errors"][0].startswith("4 stream(s): 1 error(s), first: HTTP 503")
    failed = vr.verify_host_record("gpu02", [INSTANCE], [PLAN], [GPU],
                                   [{"rc": 2, "stdout": json.dumps({"ok": False, "error": "not healthy after 60 s"}),
                                     "stderr": ""}], [None], CUDA_BUILD, 0.25)
    assert failed["errors"] == ["load test: not healthy after 60 s"]
    silent = vr.verify_host_record("gpu03", [INSTANCE], [PLAN], [GPU], [{"rc": 1, "stdout": "", "stderr": "boom"}],
                                   [None], CUDA_BUILD, 0.25)
    assert silent["errors"] and "boom" in silent["errors"][0]


def test_the_verdict_key_ignores_figures_but_not_verdicts():
    a = record(synthetic_loadtest(single=20.0))
    b = record(synthetic_loadtest(single=21.3, agg4=66.0))
    assert a["verdict_key"] == b["verdict_key"]
    assert record(synthetic_loadtest(single=5.0))["verdict_key"] != a["verdict_key"]  # newly flagged
    other_build = dict(CUDA_BUILD, build_key="0c1e57098-cuda-def")
    assert record(synthetic_loadtest(), llama_cpp=other_build)["verdict_key"] != a["verdict_key"]


def test_llama_bench_skips_and_failures_are_reported_not_fatal():
    rec = record(synthetic_loadtest(), bench={"skipped_reason": "needs 18.1 GiB beside the server, 5.0 GiB free"})
    assert rec["instances"][0]["llama_bench"] == {"status": "skipped",
                                                  "reason": "needs 18.1 GiB beside the server, 5.0 GiB free"}
    broken = record(synthetic_loadtest(), bench={"rc": 1, "stdout": "", "stderr": "CUDA error: out of memory"})
    assert broken["status"] == "ok" and broken["errors"] == []
    assert "llama-bench: llama-bench exited with 1: CUDA error: out of memory" in broken["instances"][0]["problems"]


def test_plan_memory_without_predicted_used_falls_back_to_total_less_headroom():
    plan = dict(PLAN, memory={"total_bytes": 20 * GIB, "headroom_bytes": GIB})
    rec = vr.verify_host_record("h", [INSTANCE], [plan], [GPU], [synthetic_loadtest()], [None], CUDA_BUILD, 0.25)
    assert rec["instances"][0]["vram"]["predicted_used_bytes"] == 19 * GIB


def test_fleet_report_lists_flagged_errors_and_missing_hosts():
    good = record(synthetic_loadtest(single=30.0), host="gpu01")
    slow = record(synthetic_loadtest(single=5.0), host="gpu02")
    report = vr.verify_fleet_report([good, slow], "2026-11-30T12:00:00Z", {"min_ceiling_fraction": 0.25})
    assert report["hosts"] == 2 and report["instances"] == 2 and report["flagged_hosts"] == ["gpu02"]
    assert report["single_stream_tps_total"] == 35.0
    assert report["ceiling_ratio_min"] == pytest.approx(5.0 / 43.5, abs=1e-3)
    md = render.verify_fleet_markdown(report, ["gpu03"])
    assert "**Flagged (below the ceiling fraction):** gpu02" in md
    assert "**No result (unreachable or failed before measuring):** gpu03" in md
    assert "| gpu01 | 0 Tesla V100-SXM2-32GB | Q4_K_M | 32768 / 4 | f16 | 30.0 |" in md
    assert "| 69% |" in md and "FLAGGED |" in md
    assert "GPUs failing their health check" not in md
    report["settings"]["held_gpus"] = ["gpu02 GPU 1: 2 uncorrectable ECC error(s) since boot"]
    assert "- gpu02 GPU 1: 2 uncorrectable ECC error(s) since boot" in render.verify_fleet_markdown(report)
    svg = ET.fromstring(render.verify_fleet_svg(report))
    assert svg.tag.endswith("svg") and len([e for e in svg.iter() if e.tag.endswith("rect")]) == 4
    json.dumps(report)


def test_the_fleet_report_says_what_the_speed_gate_judged_and_the_speculation_verdicts():
    rec = record(synthetic_loadtest(single=30.0))
    assert "## Speed gate" not in render.verify_fleet_markdown(vr.verify_fleet_report([rec], "now"))
    rec["speed_gate"] = {
        "verdicts": [{"verdict": "not_gated", "gated": False, "message": "GPU 0: unchanged"},
                     {"verdict": "refuse", "gated": True, "message": "GPU 1: below 0.90 of the fleet's baseline"},
                     {"verdict": "no_baseline", "gated": False, "message": "GPU 2: unchanged, not gated; recorded"}],
        "speculation": [{"verdict": "outdated", "message": "GPU 3: the load-test prompt changed"}]}
    md = render.verify_fleet_markdown(vr.verify_fleet_report([rec], "now"))
    section = md.split("## Speed gate and speculative decoding", 1)[1]
    assert "- gpu01 refuse: GPU 1: below 0.90" in section and "- gpu01 no_baseline: GPU 2: unchanged" in section
    assert "- gpu01 speculation outdated: GPU 3: the load-test prompt changed" in section
    assert "GPU 0: unchanged" not in section


def test_the_plot_keeps_every_label_inside_the_frame_and_names_an_off_scale_ceiling():
    import xml.etree.ElementTree as ET
    near = record(synthetic_loadtest(single=30.0, agg4=90.0), host="gpu01")  # ceiling 43.5: drawn
    tiny = record(synthetic_loadtest(single=20.0), host="gpu02")
    tiny["instances"][0]["decode_ceiling_tps"] = 1776202.0  # a tiny model: named, not drawn
    svg = ET.fromstring(render.verify_fleet_svg(vr.verify_fleet_report([near, tiny], "now", {})))
    width = float(svg.get("width"))
    texts = [e for e in svg.iter() if e.tag.endswith("text")]
    for t in texts:  # a value label starts at most ~8 characters (7 px each) before the right edge
        if t.get("text-anchor") != "end":
            assert float(t.get("x")) + 7 * len(t.text) <= width, (t.text, t.get("x"))
    assert any(t.text == "ceiling 1776202, off scale" for t in texts)
    lines = [e for e in svg.iter() if e.tag.endswith("line") and e.get("stroke") == "#c00"]
    assert len(lines) == 1  # only the near ceiling is a red line


# --- a real CPU llama-server ------------------------------------------------------------

def test_record_from_a_real_server_on_a_cpu_build(served):
    loadtest = lt.run(served.url, "1,4,slots", n_predict=16, budget_s=120)
    instance = dict(INSTANCE, port=served.port, parallel=4, ctx_size=8192, quant="F32")
    rec = vr.verify_host_record("testhost", [instance], [PLAN], [GPU], [{"rc": 0, "stdout": json.dumps(loadtest)}],
                                [None], {"backend": "cpu", "commit": "0c1e57098bba", "build_key": "k"}, 0.25)
    inst = rec["instances"][0]
    assert rec["status"] == "ok", rec["errors"]
    # measured figures are still reported ...
    assert inst["single_stream_tps"] > 0 and inst["aggregate_4_tps"] > 0 and inst["ttft_s"] > 0
    assert [l["concurrency"] for l in inst["levels"]] == [1, 4]
    # ... but the GPU ceiling and VRAM comparison do not apply to a CPU build
    assert inst["ceiling_ratio"] is None and inst["ceiling_note"].startswith("not applicable: llama.cpp backend is cpu")
    assert inst["vram"]["measured_over_predicted"] is None and inst["vram"]["measured_used_bytes"] == GPU["memory_used_bytes"]
    assert not inst["flagged"]
    assert rec["summary"].endswith("(cpu build: ceiling n/a)")
    md = render.verify_fleet_markdown(vr.verify_fleet_report([rec], "now", {"min_ceiling_fraction": 0.25}))
    assert "| n/a | n/a (cpu) |" in md and "ceiling ratio not applicable" in md


def test_llama_bench_output_of_a_real_build(llama_bin_dir, tiny_model):
    out = subprocess.run([str(Path(llama_bin_dir) / "llama-bench"), "-m", str(tiny_model), "-p", "16", "-n", "4",
                          "-r", "1", "-t", "2", "-o", "json"], capture_output=True, text=True, timeout=300)
    figures = vr.llama_bench_figures({"rc": out.returncode, "stdout": out.stdout, "stderr": out.stderr})
    assert figures["status"] == "ok", figures
    assert [t["test"] for t in figures["tests"]] == ["pp16", "tg4"]
    assert figures["prompt_tps"] > 0 and figures["decode_tps"] > 0
    assert figures["build_commit"]


def test_the_vram_plot_shows_measured_against_predicted_on_gpu_builds_only():
    import xml.etree.ElementTree as ET
    rec = record(synthetic_loadtest(single=30.0))
    svg = ET.fromstring(render.verify_fleet_vram_svg(vr.verify_fleet_report([rec], "now", {})))
    texts = [e.text for e in svg.iter() if e.tag.endswith("text")]
    assert "27.00 / 27.41 (-1.5%)" in texts
    cpu = record(synthetic_loadtest(single=30.0), llama_cpp=dict(CUDA_BUILD, backend="cpu"))
    assert render.verify_fleet_vram_svg(vr.verify_fleet_report([cpu], "now", {})) == ""


def test_the_measured_cuda_context_goes_to_the_calibration():
    """The process's CUDA context as measured (the plan's figure plus the whole difference:
    weights, KV and compute match llama-fit-params), kept by the calibration record, and a
    new figure replaces a record that had none."""
    plan = dict(PLAN, partial_offload=False, decode_efficiency={"gpu_family": "volta", "quant_family": "Q4_K",
                                                                 "arch": "dense"},
                memory=dict(PLAN["memory"], overhead_cuda_bytes=576 << 20))
    gpu = dict(GPU, memory_used_bytes=PLAN["memory"]["predicted_used_bytes"] - (70 << 20))
    rec = vr.verify_host_record("gpu01", [INSTANCE], [plan], [gpu], [{"rc": 0, "stdout": json.dumps(
        synthetic_loadtest())}], [None], CUDA_BUILD, 0.25)
    inst, = rec["instances"]
    assert inst["vram"]["cuda_overhead_bytes"] == 506 << 20
    entry, = rec["calibration"]
    assert entry["cuda_overhead_bytes"] == 506 << 20
    merged = paths.load_file("plan_speed_t", "module_utils/plan_speed.py").merge_calibration({"version": 1, "records": [dict(entry, cuda_overhead_bytes=None)]}, [entry])
    assert merged["records"][0]["cuda_overhead_bytes"] == 506 << 20
