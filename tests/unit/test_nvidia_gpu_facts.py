"""library/nvidia_gpu_facts.py over the mock NVML profiles, through the real pynvml."""
import os

import pytest

from conftest import PROFILE_DIR, run_module

import sys
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "harness"))
from gpu_profile import int_list, load_profile, parse_cpu_list  # noqa: E402

REQUIRED_KEYS = {
    "index", "name", "uuid", "pci_bus_id", "memory_total_bytes", "memory_bandwidth_bytes_per_s",
    "compute_capability", "numa_node", "cpu_affinity", "supported_graphics_clocks_mhz",
    "power_limit_min_w", "power_limit_max_w", "power_limit_default_w",
}
PROFILES = sorted(p.name[:-len(".profile")] for p in PROFILE_DIR.glob("*.profile"))


@pytest.mark.parametrize("profile", PROFILES)
def test_facts_match_the_profile(gpu_host, profile):
    result = run_module("nvidia_gpu_facts", env=gpu_host(profile))
    facts = result["ansible_facts"]
    want = load_profile(profile)
    assert result["changed"] is False
    assert facts["nvidia_nvml_error"] is None
    assert facts["nvidia_driver_version"] == "525.147.05"
    assert facts["nvidia_cuda_driver_version"] == "12.0"
    assert facts["nvidia_gpu_count"] == want["gpu_count"] == len(facts["nvidia_gpus"])
    for index, (gpu, spec) in enumerate(zip(facts["nvidia_gpus"], want["gpus"])):
        assert REQUIRED_KEYS <= set(gpu)
        assert gpu["index"] == index
        assert gpu["name"] == spec["name"]
        assert gpu["uuid"] == spec["uuid"]
        assert gpu["pci_bus_id"] == spec["pci_bus_id"]
        assert gpu["memory_total_bytes"] == int(spec["memory_total_bytes"])
        assert gpu["compute_capability"] == "%s.%s" % (spec["cuda_cc_major"], spec["cuda_cc_minor"])
        expected_bw = int(spec["memory_bus_width_bits"]) // 8 * int(spec["max_mem_clock_mhz"]) * 2 * 10**6
        assert gpu["memory_bandwidth_bytes_per_s"] == expected_bw
        assert gpu["numa_node"] == int(spec["numa_node"])
        assert gpu["cpu_affinity"] == parse_cpu_list(spec["cpu_affinity"])
        assert gpu["supported_graphics_clocks_mhz"] == sorted(int_list(spec["supported_gfx_clocks_mhz"]), reverse=True)
        assert gpu["power_limit_min_w"] == int(spec["power_min_mw"]) / 1000
        assert gpu["power_limit_max_w"] == int(spec["power_max_mw"]) / 1000
        assert gpu["power_limit_default_w"] == int(spec["power_default_mw"]) / 1000
        assert gpu["nvlink_peers"] == sorted(p for p in spec.get("nvlink_peers", "").split(",") if p)


def test_v100_bandwidth_is_about_900_gb_per_s(gpu_host):
    gpu = run_module("nvidia_gpu_facts", env=gpu_host("v100-sxm2-32gb"))["ansible_facts"]["nvidia_gpus"][0]
    assert 890e9 < gpu["memory_bandwidth_bytes_per_s"] < 905e9
    assert gpu["cuda_arch"] == "70"


def test_no_gpu_gives_an_empty_list_and_the_reason(gpu_host, tmp_path):
    env = gpu_host("v100-sxm2-32gb")
    env["MOCK_NVML_PROFILE"] = str(tmp_path / "no-such-profile")
    result = run_module("nvidia_gpu_facts", env=env)
    facts = result["ansible_facts"]
    assert not result.get("failed")
    assert facts["nvidia_gpus"] == []
    assert facts["nvidia_nvml_error_code"] == "DRIVER_NOT_LOADED"
    assert "Driver Not Loaded" in facts["nvidia_nvml_error"]


@pytest.mark.skipif(__import__("ctypes.util").util.find_library("nvidia-ml") is not None,
                    reason="this machine has a real libnvidia-ml in its linker cache (e.g. after make cuda-build-check)")
def test_no_driver_library_gives_library_not_found(tmp_path):
    env = dict(os.environ, LD_LIBRARY_PATH=str(tmp_path))
    facts = run_module("nvidia_gpu_facts", env=env)["ansible_facts"]
    assert facts["nvidia_gpus"] == []
    assert facts["nvidia_nvml_error_code"] == "LIBRARY_NOT_FOUND"


def test_driver_library_mismatch_is_named(gpu_host, tmp_path):
    """The loaded kernel module is 535 (upgrade without reboot); the library is 525."""
    env = gpu_host("v100-sxm2-32gb")
    state = tmp_path / "run-mock-nvml"
    state.mkdir(parents=True, exist_ok=True)
    (state / "loaded_kernel_module_version").write_text("535.129.03\n")
    facts = run_module("nvidia_gpu_facts", env=env)["ansible_facts"]
    assert facts["nvidia_gpus"] == []
    assert facts["nvidia_nvml_error_code"] == "LIB_RM_VERSION_MISMATCH"
    assert "version mismatch" in facts["nvidia_nvml_error"]
