"""GPU health through the real pynvml and the mock NVML (ECC counters, retired pages,
remapped rows, compute processes), and module_utils/gpu_health.assess's verdicts."""
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import PROFILE_DIR, ROOT, run_module

sys.path.insert(0, str(ROOT / "module_utils"))
import gpu_health  # noqa: E402

V100_32 = PROFILE_DIR / "v100-sxm2-32gb.profile"
V100_32_UUID = "GPU-4f6a1c2e-8b3d-4e55-9a71-2c0d93b5e7a4"
GIB = 1 << 30


def facts(env):
    result = run_module("nvidia_gpu_facts", env=env)
    assert result["ansible_facts"]["nvidia_nvml_error"] is None, result
    return result["ansible_facts"]["nvidia_gpus"]


def sick_profile(tmp_path, extra, base=V100_32):
    profile = tmp_path / "sick.profile"
    profile.write_text(base.read_text() + "\n" + "\n".join(extra) + "\n")
    return profile


def write_state(env, lines):
    state = Path(env["MOCK_NVML_STATE_DIR"])
    state.mkdir(parents=True, exist_ok=True)
    (state / "state").write_text("\n".join(lines) + "\n")


def test_a_healthy_v100_reports_zero_counters_and_no_processes(gpu_host):
    gpu = facts(gpu_host("v100-sxm2-32gb"))[0]
    assert gpu["health"] == {
        "ecc_enabled": True,
        "ecc_errors": {"corrected_volatile": 0, "corrected_aggregate": 0,
                       "uncorrected_volatile": 0, "uncorrected_aggregate": 0},
        "retired_pages": {"single_bit": 0, "double_bit": 0, "pending": False},
        "remapped_rows": None,  # Volta retires pages; row remapping is Ampere's
        "processes": [],
        "xid_events": None,  # no exporter listens here: unknown, not "none"
    }
    assert gpu_health.assess(gpu["health"]) == []


def test_a_sick_v100_is_read_and_failed(gpu_host, tmp_path):
    env = gpu_host("v100-sxm2-32gb")
    env["MOCK_NVML_PROFILE"] = str(sick_profile(tmp_path, [
        "gpu.retired_pages_sbe=2", "gpu.retired_pages_dbe=1", "gpu.retired_pages_pending=1",
        "gpu.ecc_uncorrected_aggregate=1", "gpu.ecc_corrected_aggregate=40"]))
    # A process of another program holds 14 GiB of the card (the seeds' forgotten one).
    squatter = subprocess.Popen(["sleep", "60"])
    gone = subprocess.Popen(["true"])
    gone.wait()
    try:
        write_state(env, [
            "%s.ecc_uncorrected_volatile=2" % V100_32_UUID,
            "%s.ecc_corrected_volatile=5" % V100_32_UUID,
            "%s.processes=%d:%d,%d:%d" % (V100_32_UUID, squatter.pid, 14 * GIB, gone.pid, 2 * GIB)])
        gpu = facts(env)[0]
    finally:
        squatter.kill()
        squatter.wait()
    health = gpu["health"]
    assert health["ecc_errors"] == {"corrected_volatile": 5, "corrected_aggregate": 45,
                                    "uncorrected_volatile": 2, "uncorrected_aggregate": 3}
    assert health["retired_pages"] == {"single_bit": 2, "double_bit": 1, "pending": True}
    # only the live process: an exited one holds nothing
    assert health["processes"] == [{"pid": squatter.pid, "name": "sleep", "used_bytes": 14 * GIB}]
    assert gpu["memory_used_bytes"] == 324009984 + 14 * GIB

    problems = gpu_health.assess(health)
    assert [p["check"] for p in problems] == ["ecc_uncorrectable", "retired_pages_pending", "foreign_process"]
    assert all(p["severity"] == "fail" for p in problems)
    assert "PID %d (sleep) holds 14336 MiB" % squatter.pid in problems[2]["message"]
    assert not gpu_health.healthy(problems)
    # by policy, the foreign process is only reported, or not at all
    assert gpu_health.assess(health, "warn")[-1]["severity"] == "warn"
    assert "foreign_process" not in [p["check"] for p in gpu_health.assess(health, "ignore")]


def test_the_instance_s_own_process_is_not_foreign(gpu_host):
    health = {"processes": [{"pid": 7, "name": "llama-server", "used_bytes": GIB}]}
    assert gpu_health.assess(health) == []


def test_an_ampere_card_remaps_rows_instead_of_retiring_pages(gpu_host, tmp_path):
    env = gpu_host("v100-sxm2-32gb")
    text = V100_32.read_text().replace("gpu.architecture=5", "gpu.architecture=7")
    profile = tmp_path / "ampere.profile"
    profile.write_text(text + "\ngpu.remapped_rows_uncorrectable=3\ngpu.remapped_rows_failure=1\n")
    env["MOCK_NVML_PROFILE"] = str(profile)
    health = facts(env)[0]["health"]
    assert health["retired_pages"] is None
    assert health["remapped_rows"] == {"correctable": 0, "uncorrectable": 3, "pending": False, "failure": True}
    assert [p["check"] for p in gpu_health.assess(health)] == ["row_remap_failure"]


def test_ecc_off_is_reported_and_its_counters_are_unknown(gpu_host, tmp_path):
    env = gpu_host("v100-sxm2-32gb")
    env["MOCK_NVML_PROFILE"] = str(sick_profile(tmp_path, ["gpu.ecc_enabled=0"]))
    health = facts(env)[0]["health"]
    assert health["ecc_enabled"] is False
    assert set(health["ecc_errors"].values()) == {None}
    problems = gpu_health.assess(health)
    assert [(p["check"], p["severity"]) for p in problems] == [("ecc_disabled", "warn")]
    assert gpu_health.healthy(problems)


@pytest.mark.parametrize("sbe, dbe, checks", [
    (14, 0, []),
    (10, 5, [("retired_pages_many", "warn")]),
    (40, 20, [("retired_pages_limit", "fail")]),
])
def test_retired_page_thresholds_are_dcgm_s(sbe, dbe, checks):
    health = {"retired_pages": {"single_bit": sbe, "double_bit": dbe, "pending": False}}
    assert [(p["check"], p["severity"]) for p in gpu_health.assess(health)] == checks


def test_xids_the_exporter_heard_since_boot_fail_the_card(gpu_host, tmp_path):
    """The GPU exporter's journal (one JSON line per Xid; a line cut short by a crash is
    skipped): a serious Xid fails the card, an application's Xid is a warning, another
    card's Xid is not this one's."""
    journal = tmp_path / "xid-events.jsonl"
    journal.write_text("\n".join([
        '{"time": 1764633600.0, "uuid": "%s", "xid": 31}' % V100_32_UUID,
        '{"time": 1764633660.5, "uuid": "%s", "xid": 79}' % V100_32_UUID,
        '{"time": 1764633700.0, "uuid": "GPU-another-card", "xid": 48}',
        '{"time": 1764633800.0, "uuid": "%s", "xi' % V100_32_UUID]))
    result = run_module("nvidia_gpu_facts", {"xid_journal": str(journal)}, env=gpu_host("v100-sxm2-32gb"))
    health = result["ansible_facts"]["nvidia_gpus"][0]["health"]
    assert health["xid_events"] == [{"time": 1764633600.0, "xid": 31}, {"time": 1764633660.5, "xid": 79}]
    problems = gpu_health.assess(health)
    assert [(p["check"], p["severity"]) for p in problems] == [("xid", "fail"), ("xid_other", "warn")]
    assert problems[0]["message"].startswith(
        "Xid 79 (the GPU has fallen off the bus) at 2025-12-02 00:01:00 UTC: reboot the host")
    assert not gpu_health.healthy(problems)
    # an empty journal: the exporter listens and heard nothing
    journal.write_text("")
    assert gpu_health.read_xid_journal(str(journal)) == {}
    assert gpu_health.read_xid_journal(str(tmp_path / "absent.jsonl")) is None


def test_a_wrong_policy_names_the_choices():
    with pytest.raises(ValueError, match="refuse, warn, plan_around, ignore"):
        gpu_health.assess({}, "plan")


def test_plan_around_warns_and_holds_the_card_only_when_the_process_grew():
    """plan_around: the process is named (warn); the gate holds a plan only when other
    processes hold more than the plan left them (its memory's foreign_bytes, per card)."""
    health = {"processes": [{"pid": 4242, "name": "python3", "used_bytes": 14 << 30},
                            {"pid": 99, "name": "llama-server", "used_bytes": 1 << 30}]}
    (problem,) = gpu_health.assess(health, "plan_around")
    assert problem["severity"] == "warn"
    assert problem["message"] == "PID 4242 (python3) holds 14336 MiB of GPU memory, which the plan leaves to it " \
                                 "(plan_around)"
    assert gpu_health.plan_against_foreign(health, 14 << 30) is None
    assert gpu_health.plan_against_foreign(health, (14 << 30) - (100 << 20)) is None  # within the slack
    grew = gpu_health.plan_against_foreign(health, 8 << 30)
    assert grew["check"] == "foreign_process_grew" and grew["severity"] == "fail"
    assert grew["message"].startswith("other processes hold 14336 MiB of GPU memory (PID 4242 (python3) 14336 MiB) "
                                      "and the plan left them 8192 MiB")
    gate = _gate_filter()
    gpus = [{"index": 0, "uuid": "GPU-a", "health": health}, {"index": 1, "uuid": "GPU-b", "health": {}}]
    planned = {"gpu_index": 0, "gpu_uuid": "GPU-a", "memory": {"foreign_bytes": 14 << 30}}
    verdict = gate([planned], gpus, "plan_around")
    assert verdict["serve"] == [planned] and verdict["warnings"] == [
        "GPU 0: PID 4242 (python3) holds 14336 MiB of GPU memory, which the plan leaves to it (plan_around)"]
    unplanned = {"gpu_index": 0, "gpu_uuid": "GPU-a", "memory": {"foreign_bytes": 0}}
    (held,) = gate([unplanned], gpus, "plan_around")["held"]
    assert [p["check"] for p in held["problems"]] == ["foreign_process_grew"] and held["problems"][0]["gpu_index"] == 0
    # a split: each card against its own share
    split = {"gpu_index": 1, "gpu_uuids": ["GPU-b", "GPU-a"],
             "memory": {"per_gpu": [{"foreign_bytes": 0}, {"foreign_bytes": 14 << 30}]}}
    assert gate([split], gpus, "plan_around")["serve"] == [split]
    swapped = dict(split, gpu_uuids=["GPU-a", "GPU-b"])
    assert gate([swapped], gpus, "plan_around")["held"]
    # refuse still holds it whatever the plan left
    assert gate([planned], gpus, "refuse")["held"]


DUAL_UUIDS = ["GPU-2b8f4e61-0d7c-4a93-8e15-6f3a9c2d1b70", "GPU-e07d35a9-6c21-4b8e-93f4-a5b10e6c2d98"]


def _gate_filter():
    import importlib.util
    spec = importlib.util.spec_from_file_location("gpu_gate", ROOT / "filter_plugins" / "gpu_health.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.llm_fleet_gpu_gate


def test_a_card_that_fell_off_the_bus_is_reported_apart_and_its_plan_held(gpu_host):
    """NVML still counts a card that fell off the bus (Xid 79) but answers GPU_IS_LOST for
    it, its handle included: the other card is read as usual, the lost one is listed apart,
    and the gate holds the plan on it (the mock: "<uuid>.lost=1" in the volatile state)."""
    env = gpu_host("2x-v100-sxm2-16gb-nvlink")
    write_state(env, ["%s.lost=1" % DUAL_UUIDS[1]])
    result = run_module("nvidia_gpu_facts", env=env)
    found = result["ansible_facts"]
    assert found["nvidia_nvml_error"] is None, result
    assert [g["uuid"] for g in found["nvidia_gpus"]] == DUAL_UUIDS[:1] and found["nvidia_gpu_count"] == 1
    assert found["nvidia_gpus_lost"] == [{"index": 1, "error": "GPU is lost", "error_code": "GPU_IS_LOST"}]
    gate = _gate_filter()
    plans = [{"gpu_index": i, "gpu_uuid": uuid} for i, uuid in enumerate(DUAL_UUIDS)]
    verdict = gate(plans, found["nvidia_gpus"], "refuse", found["nvidia_gpus_lost"])
    assert verdict["serve"] == plans[:1]
    (held,) = verdict["held"]
    assert held["gpu_index"] == 1 and [p["check"] for p in held["problems"]] == ["gpu_lost"]
    assert "counts GPU 1 that it cannot reach (GPU is lost)" in held["problems"][0]["message"]
    # a split over both cards is held as a whole
    split = [{"gpu_index": 0, "gpu_uuid": DUAL_UUIDS[0], "gpu_uuids": DUAL_UUIDS}]
    assert gate(split, found["nvidia_gpus"], "refuse", found["nvidia_gpus_lost"])["serve"] == []
    # and with nothing lost, a GPU the host lacks is not the gate's business (validate fails the plan)
    assert gate(plans, found["nvidia_gpus"], "refuse", [])["serve"] == plans
