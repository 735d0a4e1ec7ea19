"""GPU tuning read from outside the role: NVML through the real pynvml, systemd,
and reboots (container restarts, after which the mock card has forgotten
everything, like a real one)."""
import json

import pytest
import testinfra

from gpu_profile import load_profile
from hostprobe import nvml_probe, reboot, recap, run_playbook

# What the seeds' 1410 MHz / 300 W request must become on each card.
EXPECTED = {
    "gt-sxm2-32gb": {"clock": 1410, "power_mw": 300000, "gpus": 1},
    "gt-pcie-16gb": {"clock": 1380, "power_mw": 250000, "gpus": 1},
    "gt-2x-sxm2-16gb": {"clock": 1410, "power_mw": 300000, "gpus": 2},
}


def node(name):
    return testinfra.get_host("docker://" + name)


def assert_tuned(name):
    seen = nvml_probe(node(name))
    want = EXPECTED[name]
    assert len(seen["gpus"]) == want["gpus"]
    for gpu in seen["gpus"]:
        assert gpu["persistence_mode"] == 1, gpu
        assert gpu["gfx_clock_mhz"] == want["clock"], gpu
        assert gpu["power_limit_mw"] == want["power_mw"], gpu


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_nvml_shows_the_resolved_settings(name):
    assert_tuned(name)


def test_pcie_card_records_why_it_got_1380_mhz_and_250_w():
    fact = json.loads(node("gt-pcie-16gb").file("/etc/ansible/facts.d/llm_fleet_gpu_tuning.fact").content_string)
    reasons = " ".join(fact["settings"][0]["reasons"])
    assert "1410 MHz is above this card's maximum, clamped to 1380 MHz" in reasons
    assert "300 W is above this card's maximum, clamped to 250 W" in reasons


@pytest.mark.parametrize("name", ["gt-sxm2-32gb", "gt-pcie-16gb"])
def test_settings_are_applied_again_at_boot_before_the_gpu_target(name):
    host = node(name)
    reboot(host)
    assert_tuned(name)
    unit = host.service("gpu-tuning.service")
    assert unit.is_enabled
    done = int(host.check_output("systemctl show -P ActiveEnterTimestampMonotonic gpu-tuning.service"))
    target = int(host.check_output("systemctl show -P ActiveEnterTimestampMonotonic llm-fleet-gpu.target"))
    assert 0 < done <= target, "gpu-tuning.service must finish before llm-fleet-gpu.target"
    assert "nvidia-persistenced.service" in host.check_output("systemctl show -P After gpu-tuning.service")


def test_check_mode_reports_a_change_and_makes_none(tmp_path):
    result = run_playbook("playbooks/gpu_tuning.yml", ["gt-sxm2-32gb"], check=True, tmp_path=tmp_path,
                          extra_vars={"gpu_tuning_locked_graphics_clock_mhz": 1300, "gpu_tuning_power_limit_w": 300})
    assert result.returncode == 0, result.stdout[-3000:]
    assert recap(result.stdout, "gt-sxm2-32gb")["changed"] > 0
    assert_tuned("gt-sxm2-32gb")
    config = json.loads(node("gt-sxm2-32gb").file("/etc/llm-fleet/gpu-tuning.json").content_string)
    assert config["gpus"][0]["locked_graphics_clock_mhz"] == 1410


def test_strict_mode_refuses_the_seeds_request_on_a_pcie_card(tmp_path):
    result = run_playbook("playbooks/gpu_tuning.yml", ["gt-pcie-16gb"], tmp_path=tmp_path,
                          extra_vars={"gpu_tuning_locked_graphics_clock_mhz": 1410, "gpu_tuning_power_limit_w": 300,
                                      "gpu_tuning_strict": True})
    assert result.returncode != 0
    output = " ".join(result.stdout.split())  # YAML output wraps long messages
    assert "GPU 0 (Tesla V100-PCIE-16GB) cannot lock its graphics clock at 1410 MHz" in output
    assert "supported range is 135-1380 MHz" in output
    assert_tuned("gt-pcie-16gb")  # nothing was changed by the refused run


def test_a_failing_boot_unit_is_logged_and_does_not_block_boot():
    """NVML does not answer for the unit at boot: it gives up after its wait,
    says why in the journal, and the boot reaches the GPU target anyway."""
    host = node("gt-sxm2-32gb")
    host.run_expect([0], "mkdir -p /etc/systemd/system/gpu-tuning.service.d && printf '[Service]\\n"
                         "Environment=MOCK_NVML_PROFILE=/nonexistent\\n' > /etc/systemd/system/gpu-tuning.service.d/broken.conf")
    try:
        state = reboot(host, timeout=120)
        assert state == "degraded"
        assert host.service("gpu-tuning.service").systemd_properties["Result"] == "exit-code"
        log = host.check_output("journalctl -b -u gpu-tuning.service --no-pager")
        assert "NVML did not answer within 5s" in log
        assert host.service("llm-fleet-gpu.target").is_running
    finally:
        host.run("rm -rf /etc/systemd/system/gpu-tuning.service.d")
    reboot(host)
    assert_tuned("gt-sxm2-32gb")


def test_absent_resets_the_cards_to_their_defaults(tmp_path):
    name = "gt-2x-sxm2-16gb"
    result = run_playbook("playbooks/gpu_tuning.yml", [name], tmp_path=tmp_path,
                          extra_vars={"gpu_tuning_state": "absent"})
    assert result.returncode == 0, result.stdout[-3000:]
    profile = load_profile("2x-v100-sxm2-16gb-nvlink")
    for gpu, spec in zip(nvml_probe(node(name))["gpus"], profile["gpus"]):
        assert gpu["power_limit_mw"] == int(spec["power_default_mw"])
        assert gpu["gfx_clock_mhz"] == int(spec["idle_gfx_clock_mhz"])
        assert gpu["persistence_mode"] == 0
    assert not node(name).file("/etc/systemd/system/gpu-tuning.service").exists
