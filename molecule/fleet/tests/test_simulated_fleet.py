"""The simulated fleet itself: each host is a real systemd machine with no
route out whose GPUs, read through the real pynvml, are the profile's figures,
and whose GPU settings are lost at a reboot like a real card's."""
import json
import subprocess

from gpu_profile import int_list, parse_cpu_list
from hostprobe import host_name, nvml_probe, reboot


def test_host_runs_systemd_as_pid1(host):
    assert host.process.get(pid=1).comm == "systemd"
    assert host.run("systemctl is-system-running").stdout.strip() in ("running", "degraded")


def test_host_has_no_route_out(host):
    """Loopback only, or (the fleet scenario, for its fleet front) the scenario's internal
    network besides: no route beyond it."""
    links = [line.split(":")[1].strip().split("@")[0] for line in host.run("ip -o link show").stdout.splitlines()]
    assert links[0] == "lo" and len(links) <= 2, links
    networks = json.loads(subprocess.run(
        ["docker", "inspect", "-f", "{{json .NetworkSettings.Networks}}", host_name(host)],
        check=True, capture_output=True, text=True).stdout)
    for network in networks:
        if network != "none":
            internal = subprocess.run(["docker", "network", "inspect", "-f", "{{.Internal}}", network],
                                      check=True, capture_output=True, text=True).stdout.strip()
            assert internal == "true", "%s is on %s, which routes out" % (host_name(host), network)


def test_nvml_reports_the_profile(host, sim_profile):
    seen = nvml_probe(host)
    assert "error" not in seen, seen
    assert len(seen["gpus"]) == sim_profile["gpu_count"]
    for gpu, want in zip(seen["gpus"], sim_profile["gpus"]):
        assert gpu["name"] == want["name"]
        assert gpu["uuid"] == want["uuid"]
        assert gpu["pci_bus_id"] == want["pci_bus_id"]
        assert gpu["memory_total_bytes"] == int(want["memory_total_bytes"])
        assert gpu["compute_capability"] == "%s.%s" % (want["cuda_cc_major"], want["cuda_cc_minor"])
        assert gpu["memory_bus_width_bits"] == int(want["memory_bus_width_bits"])
        assert gpu["max_mem_clock_mhz"] == int(want["max_mem_clock_mhz"])
        assert gpu["max_gfx_clock_mhz"] == int(want["max_gfx_clock_mhz"])
        assert gpu["supported_gfx_clocks_mhz"] == int_list(want["supported_gfx_clocks_mhz"])
        assert gpu["power_min_mw"] == int(want["power_min_mw"])
        assert gpu["power_max_mw"] == int(want["power_max_mw"])
        assert gpu["power_default_mw"] == int(want["power_default_mw"])
        assert gpu["numa_node"] == int(want["numa_node"])
        assert gpu["cpu_affinity"] == parse_cpu_list(want["cpu_affinity"])
        assert gpu["nvlink_peers"] == sorted(int_list_or_ids(want.get("nvlink_peers", "")))


def int_list_or_ids(text):
    return [v.strip() for v in text.split(",") if v.strip()]


def test_gpu_settings_are_lost_at_reboot(host, sim_profile):
    """Locked clocks and a power limit set by hand through NVML (nvidia-smi) hold
    until the simulated reboot, then the card is back at its defaults, as the
    seeds found on real cards. (Persistence comes back after the reboot: the
    deployment runs nvidia-persistenced.)"""
    want = sim_profile["gpus"][0]
    clock = int_list(want["supported_gfx_clocks_mhz"])[len(int_list(want["supported_gfx_clocks_mhz"])) // 2]
    watts = int(want["power_min_mw"]) // 1000
    host.run_expect([0], "nvidia-smi -i 0 -lgc %d,%d" % (clock, clock))
    host.run_expect([0], "nvidia-smi -i 0 -pl %d" % watts)
    before = nvml_probe(host)["gpus"][0]
    assert before["gfx_clock_mhz"] == clock
    assert before["power_limit_mw"] == watts * 1000

    reboot(host)

    after = nvml_probe(host)["gpus"][0]
    assert after["gfx_clock_mhz"] != clock
    assert after["power_limit_mw"] == int(want["power_default_mw"])
