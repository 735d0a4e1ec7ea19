"""The verify stage after site.yml, checked from outside: the host's fact and script, the served
API measured again on the host, and the fleet report on the controller."""
import json
import os
import shlex

import pytest

from hostprobe import node, only_in_scenario, stage_fact

HOSTS = ["fleet-sxm2-32gb", "fleet-sxm2-16gb", "fleet-2x-sxm2-16gb"]
SCRIPT = "/opt/llm-fleet/bin/llm-fleet-loadtest"
# fleet_debian11 shares this directory.
pytestmark = only_in_scenario("fleet")


@pytest.mark.parametrize("name", HOSTS)
def test_fact_has_plausible_figures(name):
    host = node(name)
    f = host.file("/etc/ansible/facts.d/llm_fleet_verify.fact")
    assert f.exists and f.mode == 0o644 and f.user == "root"
    record = json.loads(f.content_string)
    served = stage_fact(host, "llama_server")["instances"]
    # The build is CUDA's, the simulated GPUs do no arithmetic: the CPU serves and no
    # process ever shows on the card (NVML), so verify says the CPU served, expects no
    # GPU figure of it and flags it (reporting only: the harness sets
    # verify_fail_below_ceiling: false) without calling it an error.
    assert record["status"] == "FLAGGED" and record["errors"] == [], record["errors"]
    assert record["summary"].startswith("FLAGGED: "), record["summary"]
    assert [i["port"] for i in record["instances"]] == [i["port"] for i in served]
    for inst in record["instances"]:
        assert 0 < inst["single_stream_tps"] < 100000
        assert 0 < inst["aggregate_4_tps"] and 0 < inst["aggregate_slots_tps"]
        assert 0 < inst["ttft_s"] < 30
        levels = {l["concurrency"]: l for l in inst["levels"]}
        assert 1 in levels and 4 in levels and inst["parallel"] in levels
        for c, level in levels.items():
            assert level["errors"] == [] and level["streams_ok"] == c
            assert level["tokens"] == c * inst["n_predict"]  # ignore_eos: exactly n_predict each
        cards = ",".join(str(i) for i in inst["gpu_indices"])
        assert inst["served_by"] == "cpu" and inst["ceiling_ratio"] is None and inst["expected_decode_tps"] is None
        assert "no process on GPU %s while the instance served" % cards in inst["ceiling_note"]
        assert inst["flagged"] and inst["problems"] == ["served from the CPU: no process on GPU %s (NVML)" % cards]
        assert inst["vram"]["measured_over_predicted"] is None
        # the first token of a prompt as long as the plan assumes (the tiny model's slot, half full),
        # measured through the served API beside the plan's expectation for the card
        first = inst["first_token"]
        plan = [p for p in stage_fact(host, "model")["plans"] if p["gpu_index"] == inst["gpu_index"]][0]
        assert first["error"] is None and first["prompt_tokens"] == plan["first_token"]["prompt_tokens"] > 0, first
        assert first["ttft_s"] > 0 and first["prompt_tps"] > 0
        # the plan's figure is a GPU's (for the tiny model it rounds to 0.0 s): nothing to expect of the CPU
        assert plan["first_token"]["ttft_s"] is not None and first["expected_ttft_s"] is None
        assert inst["llama_bench"]["status"] in ("ok", "skipped")
        if inst["llama_bench"]["status"] == "ok":
            assert inst["llama_bench"]["decode_tps"] > 0 and inst["llama_bench"]["prompt_tps"] > 0


@pytest.mark.parametrize("name", HOSTS)
def test_load_test_script_is_installed_and_measures_the_served_api(name):
    host = node(name)
    script = host.file(SCRIPT)
    assert script.exists and script.mode == 0o755
    port = stage_fact(host, "llama_server")["instances"][0]["port"]
    key = "/etc/llm-fleet/llama-server/api-key"
    key_arg = " --api-key-file %s" % key if stage_fact(host, "llama_server")["api_key"] else ""
    out = host.run("/opt/llm-fleet/venv/bin/python %s --url http://127.0.0.1:%d --streams 2 --n-predict 4 "
                   "--no-warmup --strip-streams%s" % (SCRIPT, port, key_arg))
    assert out.rc == 0, out.stdout + out.stderr
    report = json.loads(out.stdout)
    assert report["ok"] and report["levels"][0]["tokens"] == 8


@pytest.mark.parametrize("name", HOSTS[:1])
def test_load_test_script_refuses_other_hosts(name):
    out = node(name).run("/opt/llm-fleet/venv/bin/python %s --url %s" % (SCRIPT, shlex.quote("http://10.0.0.1:8080")))
    assert out.rc == 2 and "only 127.0.0.1" in json.loads(out.stdout)["error"]


def test_fleet_report_on_the_controller():
    reports = os.path.join(os.environ["MOLECULE_EPHEMERAL_DIRECTORY"], "reports")
    with open(os.path.join(reports, "fleet-verify.json")) as handle:
        report = json.load(handle)
    assert sorted(r["host"] for r in report["records"]) == sorted(HOSTS)
    # Every host flagged (simulated GPUs: the CPU serves), none in error.
    assert report["instances"] == 4 and report["error_hosts"] == []
    assert sorted(report["flagged_hosts"]) == sorted(HOSTS)
    with open(os.path.join(reports, "fleet-verify.md")) as handle:
        text = handle.read()
    for name in HOSTS:
        assert "| %s |" % name in text
    assert os.path.getsize(os.path.join(reports, "fleet-verify.svg")) > 200


def test_the_cpu_figures_do_not_calibrate_the_fleet():
    """Verify keeps the fleet's measured decode efficiencies for the next plan; what a
    CPU serves behind simulated GPUs (no process on the card) is not a Volta figure:
    the file is written, with no record, and the host record says why."""
    path = os.path.join(os.environ["MOLECULE_EPHEMERAL_DIRECTORY"], "reports", "decode-calibration.json")
    with open(path) as handle:
        content = json.load(handle)
    # beside the (empty) decode records, the rollout's speed baselines (test_upgrade.py)
    assert (content["version"], content["records"]) == (1, [])
    # and whether speculative decoding paid where a policy asked for it (test_speculation.py)
    assert set(content) <= {"version", "records", "baselines", "speculation"}
    for name in HOSTS:
        record = json.loads(node(name).file("/etc/ansible/facts.d/llm_fleet_verify.fact").content_string)
        assert record["calibration"] == []
        assert len(record["not_calibrated"]) == len(record["instances"])
        assert all("the CPU served" in line for line in record["not_calibrated"]), record["not_calibrated"]
    # ... so the plans used the built-in figures (the tiny F32 model has no Volta
    # entry: the stated default), and said so
    for name in HOSTS:
        for plan in stage_fact(node(name), "model")["plans"]:
            eff = plan["decode_efficiency"]
            assert eff["from"] in ("table", "default") and eff["gpu_family"] == "volta" and eff["source"]
            kv = 1.0 if plan["cache_type_k"] == "f16" else 0.94
            assert abs(plan["expected_decode_tps"] - plan["decode_ceiling_tps"] * eff["value"] * kv) < 1
