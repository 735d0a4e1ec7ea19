"""filter_plugins/fleet_summary.py: the decisions table, from the facts the stages
wrote on the lent H200 (benchmarks/results/gpu-host-2026-12-01e) and from a
two-card host's split plan."""
import copy
import json

import paths

summary = paths.load_file("fleet_summary", "filter_plugins/fleet_summary.py")
RESULTS = paths.ROOT / "benchmarks" / "results" / "gpu-host-2026-12-01e"


def local_facts():
    return {"llm_fleet_%s" % stage: json.loads((RESULTS / ("llm_fleet_%s.fact" % stage)).read_text())
            for stage in ("model", "llama_cpp", "verify")}


def test_a_real_gpu_host_row_has_the_plan_the_expectation_and_the_measurement():
    local = local_facts()
    lines = summary.llm_fleet_decisions(["gpu-host"], {"gpu-host": {"ansible_facts": {"ansible_local": local}}})
    row = next(line for line in lines if line.startswith("gpu-host"))
    plan = local["llm_fleet_model"]["plans"][0]
    measured = local["llm_fleet_verify"]["instances"][0]["single_stream_tps"]
    assert "0 H200" in row and "cuda sm_90" in row
    assert "%s c%d x%d %s" % (plan["quant"], plan["ctx_size"], plan["parallel"], plan["cache_type_k"]) in row
    assert "%.1f" % plan["expected_decode_tps"] in row and "%.1f" % measured in row and " ok" in row
    assert max(len(line) for line in lines[:3]) <= 160  # one screen wide


def test_a_split_a_cpu_build_tuning_and_a_preview():
    local = local_facts()
    model = copy.deepcopy(local["llm_fleet_model"])
    plan = dict(model["plans"][0], gpu_index=0, gpu_indices=[0, 1], split_mode="tensor",
                gpu_name="2 x Tesla V100-SXM2-16GB")
    model["plans"] = [plan]
    model["previews"] = [{"name": "Qwen2.5-32B-Instruct", "plans": [
        {"gpu_index": 0, "gpu_indices": [0, 1], "split_mode": "tensor", "quant": "Q6_K",
         "expected_decode_tps": 35.6}]}]
    tuning = {"settings": [{"index": 0, "locked_graphics_clock_mhz": 1410, "power_limit_w": 300.0},
                           {"index": 1, "locked_graphics_clock_mhz": 1410, "power_limit_w": 300.0}]}
    cpu = dict(local["llm_fleet_llama_cpp"], backend="cpu")
    facts = {"llm_fleet_model": model, "llm_fleet_llama_cpp": cpu, "llm_fleet_gpu_tuning": tuning}
    lines = summary.llm_fleet_decisions(["pair", "new"], {"pair": {"ansible_facts": {"ansible_local": facts}},
                                                          "new": {"ansible_facts": {"ansible_local": {}}}})
    row = next(line for line in lines if line.startswith("pair"))
    assert "0+1 V100-SXM2-16GB tensor" in row and "1410 MHz 300 W" in row and " cpu " in row
    assert "%.1f" % plan["expected_decode_tps"] not in row  # no GPU expectation for a CPU build
    assert any(line.startswith("new") and "no plan recorded yet" in line for line in lines)
    assert "  pair: Qwen2.5-32B-Instruct -> 0+1 Q6_K (35.6 tok/s)" in lines


def test_a_flagged_instance_and_a_large_expectation_read_whole():
    local = local_facts()
    local["llm_fleet_model"]["plans"][0]["expected_decode_tps"] = 568384.4
    local["llm_fleet_verify"]["instances"][0]["flagged"] = True
    lines = summary.llm_fleet_decisions(["gpu-host"], {"gpu-host": {"ansible_facts": {"ansible_local": local}}})
    row = next(line for line in lines if line.startswith("gpu-host"))
    assert " 568384 " in row and row.endswith("FLAGGED")


def test_a_cuda_build_the_cpu_served_says_so_and_expects_nothing():
    local = local_facts()
    local["llm_fleet_model"]["plans"][0]["expected_decode_tps"] = 568384.4
    local["llm_fleet_verify"]["instances"][0].update(flagged=True, served_by="cpu")
    lines = summary.llm_fleet_decisions(["gpu-host"], {"gpu-host": {"ansible_facts": {"ansible_local": local}}})
    row = next(line for line in lines if line.startswith("gpu-host"))
    assert row.endswith("CPU-served") and "568384" not in row
    assert any(line.startswith("CPU-served: ") and "simulated cards" in line for line in lines)


def test_a_gpu_held_by_its_health_check_says_why():
    local = local_facts()
    plan = local["llm_fleet_model"]["plans"][0]
    local["llm_fleet_llama_server"] = {"held": [{"gpu_index": plan["gpu_index"], "problems": [
        {"check": "ecc_uncorrectable", "severity": "fail", "message": "2 uncorrectable ECC error(s) since boot"},
        {"check": "foreign_process", "severity": "fail", "message": "PID 7 (python3) holds 14336 MiB"}]}]}
    lines = summary.llm_fleet_decisions(["gpu-host"], {"gpu-host": {"ansible_facts": {"ansible_local": local}}})
    row = next(line for line in lines if line.startswith("gpu-host"))
    assert row.endswith("HELD ecc_uncorrectable,foreign_process")
