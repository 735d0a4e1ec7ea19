"""Resolution of clock and power wishes per card (module_utils/gpu_tuning.py),
against figures worked out by hand from the V100 data sheets, and the
gpu_settings module over the mock NVML."""
import pytest

from conftest import ROOT, run_module

import sys
sys.path.insert(0, str(ROOT / "module_utils"))
from gpu_tuning import TuningError, resolve, resolve_clock, resolve_memory_clock, resolve_power  # noqa: E402

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


def test_a_request_near_the_range_is_clamped_and_said():
    settings = resolve([PCIE], {"locked_graphics_clock_mhz": 1500, "power_limit_w": 90})[0]
    assert settings["locked_graphics_clock_mhz"] == 1380 and settings["power_limit_w"] == 100.0
    assert len(settings["warnings"]) == 2
    assert all("clamped" in warning and "Tesla V100-PCIE-16GB" in warning for warning in settings["warnings"])


def test_a_supported_step_is_no_warning():
    assert resolve([SXM2], {"locked_graphics_clock_mhz": 1405, "power_limit_w": 250})[0]["warnings"] == []


@pytest.mark.parametrize("clock, hint", [(141, "did you mean 1410"), (100, ""), (600, "")])
def test_a_clock_lock_that_would_cripple_the_card_is_refused(clock, hint):
    """141 (a typo for 1410) used to lock the card at 135 MHz without a word."""
    with pytest.raises(TuningError) as err:
        resolve_clock(SXM2, clock, strict=False)
    message = str(err.value)
    assert "gpu_tuning_locked_graphics_clock_mhz is %d MHz" % clock in message
    assert "between 765 and 1530 MHz" in message and hint in message


@pytest.mark.parametrize("request_", [{"locked_graphics_clock_mhz": 15300}, {"power_limit_w": 3000},
                                      {"power_limit_w": 30}, {"power_limit_fraction": 1.4}])
def test_a_request_far_outside_the_range_is_refused_not_clamped(request_):
    with pytest.raises(TuningError, match=r"(135-1380 MHz|100-250 W).*(only requests up to 1725 MHz|within 25%)"):
        resolve([PCIE], request_)


def test_a_memory_clock_of_another_card_is_left_alone_with_a_warning():
    """877 MHz (a V100's) left in group_vars used to become another card's lowest clock without a word."""
    other = dict(SXM2, name="NVIDIA A100-SXM4-40GB", supported_memory_clocks_mhz=[1215])
    settings = resolve([other], {"memory_clock_mhz": 877})[0]
    assert settings["memory_clock_mhz"] is None
    assert "NOT APPLIED" in settings["warnings"][0] and "1215" in settings["warnings"][0]


def test_a_memory_clock_near_a_supported_one_uses_it():
    card = dict(SXM2, supported_memory_clocks_mhz=[877, 810])
    assert resolve_memory_clock(card, 870, strict=False)[0] == 877
    assert resolve_memory_clock(card, 877, strict=False) == (877, "requested memory clock 877 MHz is supported")
    with pytest.raises(TuningError, match="877, 810|810, 877"):
        resolve_memory_clock(card, 870, strict=True)


def test_strict_mode_names_the_card_the_request_and_the_range():
    with pytest.raises(TuningError, match=r"GPU 0 \(Tesla V100-PCIE-16GB\) cannot lock .* 1410 MHz.*135-1380 MHz"):
        resolve([PCIE], {"locked_graphics_clock_mhz": 1410}, strict=True)
    with pytest.raises(TuningError, match=r"power limit of 300 W \(requested 300 W\): its allowed range is 100-250 W"):
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
    ("v100-sxm2-32gb", 1410, 300.0), ("v100-pcie-16gb", 1380, 250.0)])
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


def test_module_refuses_a_request_far_from_the_card(gpu_host):
    """300 W is the seeds' V100 limit; a T4 allows 70 W at most: a mistake, not a wish to clamp."""
    result = run_module("gpu_settings", {"locked_graphics_clock_mhz": 1410, "power_limit_w": 300}, env=gpu_host("t4"))
    assert result["failed"] and "power limit of 300 W" in result["msg"] and "-70 W" in result["msg"], result


def test_module_warns_about_a_clamped_request(gpu_host):
    result = run_module("gpu_settings", {"locked_graphics_clock_mhz": 1410, "power_limit_w": 300},
                        env=gpu_host("v100-pcie-16gb"))
    # ansible-core 2.19 returns warnings as {'event': {'msg': ...}}, older releases as strings.
    shown = [w["event"]["msg"] if isinstance(w, dict) else w for w in result.get("warnings", [])]
    assert any("clamped to 250 W" in warning for warning in shown), result


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


# --- The boot-time tool's config (gpu-tuning.json) ------------------------------

def _boot_tool(tmp_path, env):
    """The tool and the host library laid out as the roles install them (bin/, lib/),
    lib/ on the path as fleet_common's llm-fleet.pth puts it on the venv's."""
    import shutil
    (tmp_path / "bin").mkdir()
    (tmp_path / "lib").mkdir()
    shutil.copy(ROOT / "roles/gpu_tuning/files/gpu-tuning-apply", tmp_path / "bin")
    shutil.copy(ROOT / "module_utils/gpu_tuning.py", tmp_path / "lib")
    env["PYTHONPATH"] = str(tmp_path / "lib")
    return tmp_path / "bin" / "gpu-tuning-apply"


@pytest.mark.parametrize("content, said", [
    (None, "cannot read"), ("", "empty"), ('{"gpus": [{"uuid": "GPU-', "truncated"), ("[]", "no list of gpus"),
    ('{"gpus": [{"index": 0}]}', "lacks its uuid"),
    ('{"gpus": [{"index": 0, "uuid": "GPU-a", "power_limit_w": "300"}]}', "power_limit_w is '300'"),
])
def test_the_boot_tool_refuses_a_missing_or_broken_config_without_a_traceback(gpu_host, tmp_path, content, said):
    """At boot nobody reads a traceback: the journal must say which file and what to run."""
    import json
    import subprocess
    env = gpu_host("v100-sxm2-32gb")
    tool = _boot_tool(tmp_path, env)
    config = tmp_path / "gpu-tuning.json"
    if content is not None:
        config.write_text(content)
    proc = subprocess.run([sys.executable, str(tool), "--config", str(config)], capture_output=True, text=True,
                          env=env, timeout=60)
    assert proc.returncode == 2, proc
    assert "Traceback" not in proc.stderr
    assert said in proc.stderr and str(config) in proc.stderr and "gpu_tuning stage" in proc.stderr
    assert "NOT applied" in proc.stderr
    assert said in json.loads(proc.stdout)["error"]


def test_the_boot_tool_applies_a_good_config(gpu_host, tmp_path):
    import json
    import subprocess
    env = gpu_host("v100-sxm2-32gb")
    gpu = run_module("gpu_settings", {"locked_graphics_clock_mhz": 1410}, env=env)["settings"][0]
    config = tmp_path / "gpu-tuning.json"
    config.write_text(json.dumps({"gpus": [gpu], "nvml_wait_seconds": 5}))
    proc = subprocess.run([sys.executable, str(_boot_tool(tmp_path, env)), "--config", str(config)], capture_output=True,
                          text=True, env=env, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["gpus"][0]["state"]["graphics_clock_mhz"] == 1410
