"""Every host after site.yml (check mode ran first on the new hosts: the scenario's
check step, which used to be the default scenario's)."""
import json

from hostprobe import node, only_in_scenario, run_playbook, stage_fact


def test_host_is_up_with_no_failed_units(host):
    assert host.process.get(pid=1).comm == "systemd"
    failed = host.run("systemctl --failed --no-legend --plain").stdout.strip()
    assert failed == "", failed


# The plan each card gets for a real 32B model (llm_model_previews in the harness
# inventory: declared figures only), beside the tiny model the CPU serves.
# The two-card host gets one instance over both cards for it: Q4_K_M split by layer
# (a tensor split is experimental: planned only where the policy lists it), where each
# card alone holds only Q3_K_S (issues 18, 33).
PREVIEW = {"fleet-sxm2-32gb": [("Q4_K_M", "none")], "fleet-sxm2-16gb": [("Q3_K_S", "none")],
           "fleet-2x-sxm2-16gb": [("Q4_K_M", "layer")]}


def test_the_32b_preview_is_planned_per_card_and_not_served(host):
    name = host.backend.get_hostname()
    if name not in PREVIEW:
        return  # fleet_debian11 shares this directory
    fact = json.loads(host.file("/etc/ansible/facts.d/llm_fleet_model.fact").content_string)
    preview, = fact["previews"]
    assert preview["name"] == "Qwen2.5-32B-Instruct"
    assert [(p["quant"], p["split_mode"]) for p in preview["plans"]] == PREVIEW[name]
    if name == "fleet-2x-sxm2-16gb":
        split, = preview["plans"]
        assert split["gpu_indices"] == [0, 1] and "GPUs 0+1 (layer split)" in split["summary"]
        assert "better quant (Q4_K_M over Q3_K_S)" in split["reason"]
        assert any("a layer split is unmeasured on volta cards" in w for w in split["warnings"])
    for plan in preview["plans"]:
        assert plan["expected_decode_tps"] < plan["decode_ceiling_tps"]
        assert plan["summary"] in fact["summary"] and "preview, not served" in fact["summary"]
    # nothing of it is on the host: the tiny model alone is served
    assert not host.run("ls /var/lib/llm-fleet/models | grep -i qwen").stdout.strip()
    assert all(p["quant"] == "F32" for p in fact["plans"])


@only_in_scenario("fleet")
def test_the_summary_shows_the_decisions_on_one_screen(tmp_path):
    hosts = list(PREVIEW)
    result = run_playbook("playbooks/summary.yml", hosts, tmp_path=tmp_path)
    assert result.returncode == 0, result.stdout[-3000:]
    out = result.stdout
    assert "host " in out and "serves" in out and "measured" in out
    for name in hosts:
        host = node(name)
        plans = stage_fact(host, "model")["plans"]
        measured = dict((i["gpu_index"], i) for i in stage_fact(host, "verify")["instances"])
        # (the play recap's lines start with the host too)
        rows = [line for line in out.splitlines() if line.strip().startswith(name + " ") and "ok=" not in line]
        assert len(rows) == len(plans), out[-3000:]
        for row, plan in zip(rows, plans):
            assert "%s c%d x%d" % (plan["quant"], plan["ctx_size"], plan["parallel"]) in row
            assert "%.1f" % measured[plan["gpu_index"]]["single_stream_tps"] in row
            assert " cuda sm_70 " in row
            # the simulated cards compute nothing: the CPU served, and the table says so
            assert row.rstrip().endswith("CPU-served"), row
        assert "%s: Qwen2.5-32B-Instruct -> " % name in out
    assert "CPU-served: a CUDA build whose card" in " ".join(out.split())


@only_in_scenario("fleet")
def test_a_host_short_of_a_card_stops_naming_the_cards_it_shows(tmp_path):
    # as if a card had fallen off the bus: the inventory expects one more than NVML lists
    result = run_playbook("playbooks/nvidia_stack.yml", ["fleet-2x-sxm2-16gb"], tmp_path=tmp_path,
                          extra_vars={"llm_fleet_expected_gpu_count": 3})
    assert result.returncode != 0
    out = " ".join(result.stdout.split())
    assert "shows 2 GPU(s) (00000000:18:00.0, 00000000:86:00.0); the inventory expects 3" in out, out[-3000:]
