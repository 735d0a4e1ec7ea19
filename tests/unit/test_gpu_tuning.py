"""Resolution of clock and power wishes per card (module_utils/gpu_tuning.py),
against figures worked out by hand from the V100 data sheets, and the
gpu_settings module over the mock NVML."""
import pytest

from conftest import ROOT, run_module

import sys
sys.path.insert(0, str(ROOT / "module_utils"))
from gpu_tuning import TuningError, resolve, resolve_clock, resolve_power  # noqa: E402

# The V100 clock tables: 1530 (SXM2) or 1380 (PCIe) down to 135 MHz in ~7.5 MHz steps.
SXM2 = {"index": 0, "uuid": "GPU-a", "name": "Tesla V100-SXM2-32GB",
        "supported_graphics_clocks_mhz": [1530 - int(k * 7.5 + 0.5) for k in range(187)],
        "power_limit_min_w": 150.0, "power_limit_max_w": 300.0, "power_limit_default_w": 300.0}
PCIE = {"index": 0, "uuid": "GPU-b", "name": "Tesla V100-PCIE-16GB",
        "supported_graphics_clocks_mhz": [1380 - int(k * 7.5 + 0.5) for k in range(167)],
        "power_limit_min_w": 100.0, "power_limit_max_w": 250.0, "power_limit_default_w": 250.0}


def test_the_seeds_clock_is_a_supported_step_on_sxm2():
    assert resolve_clock(SXM2, 1410, strict=False)[0] == 1410


def test_a_clock_between_steps_goes_to_the_step_below():
    clock, why = resolve_clock(SXM2, 1405, strict=False)
    assert clock == 1402
    assert "nearest supported clock below it is 1402 MHz" in why


def test_the_seeds_request_is_clamped_on_a_pcie_card():
    settings = resolve([PCIE], {"locked_graphics_clock_mhz": 1410, "power_limit_w": 300})[0]
    assert settings["locked_graphics_clock_mhz"] == 1380
    assert settings["power_limit_w"] == 250.0


def test_a_too_low_request_is_raised_to_the_minimum():
    assert resolve_clock(PCIE, 100, strict=False)[0] == 135
    assert resolve_power(PCIE, 50, None, strict=False)[0] == 100.0


def test_strict_mode_names_the_card_the_request_and_the_range():
    with pytest.raises(TuningError, match=r"GPU 0 \(Tesla V100-PCIE-16GB\) cannot lock .* 1410 MHz.*135-1380 MHz"):
        resolve([PCIE], {"locked_graphics_clock_mhz": 1410}, strict=True)
    with pytest.raises(TuningError, match=r"power limit of 300 W: its allowed range is 100-250 W"):
        resolve([PCIE], {"power_limit_w": 300}, strict=True)


def test_the_seeds_200_w_on_a_hot_16gb_card_is_valid_on_both():
    assert resolve([PCIE], {"power_limit_w": 200})[0]["power_limit_w"] == 200.0
    assert resolve([SXM2], {"power_limit_w": 200})[0]["power_limit_w"] == 200.0


def test_power_as_a_fraction_of_the_default():
    settings = resolve([SXM2, PCIE], {"power_limit_fraction": 0.8})
    assert [s["power_limit_w"] for s in settings] == [240.0, 200.0]
    assert "0.8 of the default 300 W = 240 W" in settings[0]["reasons"][0]


def test_watts_and_fraction_together_are_refused():
    with pytest.raises(TuningError, match="either"):
        resolve([SXM2], {"power_limit_w": 250, "power_limit_fraction": 0.8})


def test_nothing_requested_leaves_the_card_alone():
    settings = resolve([SXM2], {})[0]
    assert settings["locked_graphics_clock_mhz"] is None and settings["power_limit_w"] is None


@pytest.mark.parametrize("profile,clock,watts", [
    ("v100-sxm2-32gb", 1410, 300.0), ("v100-pcie-16gb", 1380, 250.0), ("t4", 1410, 70.0)])
def test_module_resolves_per_card_through_nvml(gpu_host, profile, clock, watts):
    result = run_module("gpu_settings", {"locked_graphics_clock_mhz": 1410, "power_limit_w": 300},
                        env=gpu_host(profile))
    assert not result.get("failed"), result
    gpu = result["settings"][0]
    assert gpu["power_limit_w"] == watts
    if profile != "t4":
        assert gpu["locked_graphics_clock_mhz"] == clock
    # A fresh card holds none of it yet.
    assert set(result["drift"][gpu["uuid"]]) >= {"persistence", "locked_graphics_clock_mhz"}


def test_module_strict_failure_is_a_clear_message(gpu_host):
    result = run_module("gpu_settings", {"locked_graphics_clock_mhz": 1410, "strict": True},
                        env=gpu_host("v100-pcie-16gb"))
    assert result["failed"]
    assert "135-1380 MHz" in result["msg"]


def test_module_without_nvml_says_what_to_do(gpu_host, tmp_path):
    env = gpu_host("v100-sxm2-32gb")
    env["MOCK_NVML_PROFILE"] = str(tmp_path / "missing")
    result = run_module("gpu_settings", {}, env=env)
    assert result["failed"]
    assert "NVML does not answer" in result["msg"] and "nvidia_stack" in result["msg"]


@pytest.mark.parametrize("key, value", [
    ("power_limit_w", float("nan")), ("power_limit_w", "inf"), ("power_limit_w", -5), ("power_limit_w", "lots"),
    ("locked_graphics_clock_mhz", "1410MHz"), ("locked_graphics_clock_mhz", 1410.5), ("locked_graphics_clock_mhz", 0),
    ("memory_clock_mhz", True), ("power_limit_fraction", float("nan")),
])
def test_a_value_that_is_not_a_positive_number_is_refused_by_name(key, value):
    """nan passed every range check ("within range") and a word ended in a traceback."""
    with pytest.raises(TuningError, match="gpu_tuning_%s must be a positive" % key):
        resolve([SXM2], {key: value})
