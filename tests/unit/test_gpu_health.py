"""GPU health through the real pynvml and the mock NVML (ECC counters, retired pages,
remapped rows, compute processes), and module_utils/gpu_health.assess's verdicts."""
import json
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
        "processes_read": True,  # an empty list that means none, not "NVML could not say"
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


# --- Re-admission of a held card (issue 29) -------------------------------------------------
HELD_AT = 1764640000  # the host's epoch seconds when the card was first held
XID_AT = 1764633660.5
SOAK = 3600


def _health(ecc=2, xids=((XID_AT, 48),), pending=False, procs=()):
    return {"ecc_enabled": True,
            "ecc_errors": {"corrected_volatile": 0, "corrected_aggregate": 0,
                           "uncorrected_volatile": ecc, "uncorrected_aggregate": ecc},
            "retired_pages": {"single_bit": 0, "double_bit": 1, "pending": pending},
            "remapped_rows": None,
            "processes": [{"pid": pid, "name": "sleep", "used_bytes": 14 * GIB} for pid in procs],
            "xid_events": [{"time": t, "xid": x} for t, x in xids]}


def _run(health, previous, now, soak=SOAK, lost=None, check_mode=False, plans=None):
    """One llama_server run's gate on a two-card host (GPU 1 is the sick one), and the fact it
    writes, as the next run reads it back (JSON)."""
    gpus = [{"index": 0, "uuid": "GPU-a", "health": _health(0, ())}]
    if health is not None:
        gpus.append({"index": 1, "uuid": "GPU-b", "health": health})
    plans = plans or [{"gpu_index": 0, "gpu_uuid": "GPU-a"}, {"gpu_index": 1, "gpu_uuid": "GPU-b"}]
    verdict = _gate_filter()(plans, gpus, "refuse", lost or [], previous=previous, now=str(now), soak_s=soak,
                             check_mode=check_mode)
    fact = json.loads(json.dumps({"held": verdict["held"], "readmitted": verdict["readmitted"]}))
    return verdict, fact


def _served(verdict):
    return [p["gpu_index"] for p in verdict["serve"]]


def test_a_held_card_soaks_then_is_re_admitted_and_its_accepted_counts_are_reported_not_failed():
    v, fact = _run(_health(), {}, HELD_AT)
    assert _served(v) == [0]
    (card,) = fact["held"][0]["cards"]
    assert card == {"gpu_uuid": "GPU-b", "gpu_index": 1, "held_since": HELD_AT, "last_change": HELD_AT,
                    "counters": {"ecc_uncorrected_volatile": 2, "retired_pages_single_bit": 0,
                                 "retired_pages_double_bit": 1, "retired_pages_pending": False,
                                 "row_remap_pending": None, "row_remap_failure": None,
                                 "xid": 48, "xid_time": XID_AT}}
    assert v["notes"] == ["GPU 1 held at 2025-12-02 01:46:40 UTC: re-admitted by a run after 2025-12-02 02:46:40 UTC "
                          "if no new ECC error, Xid or pending retirement comes (soak 3600 s)"]
    # still soaking: the run says how long is left, and the fact it writes is the one it read (no flapping)
    v, again = _run(_health(), fact, HELD_AT + 12)
    assert _served(v) == [0] and again == fact
    assert v["notes"] == ["GPU 1 held: clean for 12 s of the 3600 s soak; re-admitted by a run after "
                          "2025-12-02 02:46:40 UTC"]
    assert _run(_health(), again, HELD_AT + SOAK - 1)[1] == fact
    # the soak is over: re-admitted, and the counts it accepted are warnings from now on
    v, after = _run(_health(), fact, HELD_AT + 3650)
    assert _served(v) == [0, 1] and after["held"] == []
    assert v["notes"] == ["GPU 1 re-admitted: no new ECC error, Xid or pending retirement for 3650 s since it was "
                          "held at 2025-12-02 01:46:40 UTC (soak 3600 s)"]
    (accepted,) = after["readmitted"]
    assert accepted == {"gpu_uuid": "GPU-b", "gpu_index": 1, "accepted": card["counters"],
                        "held_since": HELD_AT, "readmitted_at": HELD_AT + 3650}
    assert [w.split(",")[0] for w in v["warnings"]] == [
        "GPU 1: 2 uncorrectable ECC error(s) since boot", "GPU 1: Xid 48 (a double-bit ECC error) at 2025-12-02 "
        "00:01:00 UTC"]
    checks = [(p["check"], p["severity"]) for p in gpu_health.assess(_health(), readmitted=accepted)]
    assert checks == [("ecc_uncorrectable_accepted", "warn"), ("xid_accepted", "warn")]
    # later runs keep serving it on the same baseline, and say nothing more of it
    v, later = _run(_health(), after, HELD_AT + 9999)
    assert _served(v) == [0, 1] and later == after and v["notes"] == []
    # the verify stage (no clock: no hold records) judges it against the same baseline
    gpus = [{"index": 1, "uuid": "GPU-b", "health": _health()}]
    plan = [{"gpu_index": 1, "gpu_uuid": "GPU-b"}]
    assert _gate_filter()(plan, gpus, "refuse", [], previous=after)["held"] == []
    assert _gate_filter()(plan, gpus, "refuse", [])["held"]
    # a reset or reboot clears the counts: the baseline is dropped with them
    v, reset = _run(_health(0, ()), after, HELD_AT + 10000)
    assert _served(v) == [0, 1] and reset == {"held": [], "readmitted": []}


def test_counters_that_grow_during_the_soak_restart_it():
    _, fact = _run(_health(), {}, HELD_AT)
    v, grown = _run(_health(ecc=3), fact, HELD_AT + 100)
    assert _served(v) == [0]
    (card,) = grown["held"][0]["cards"]
    assert (card["held_since"], card["last_change"], card["counters"]["ecc_uncorrected_volatile"]) == \
        (HELD_AT, HELD_AT + 100, 3)
    assert v["notes"] == ["GPU 1 held: its counters moved (uncorrectable ECC errors since boot 2 -> 3); the 3600 s "
                          "soak starts again: re-admitted by a run after 2025-12-02 02:48:20 UTC if nothing new comes"]
    # the soak counts from the change, not from the hold
    assert _served(_run(_health(ecc=3), grown, HELD_AT + 3650)[0]) == [0]
    v, after = _run(_health(ecc=3), grown, HELD_AT + 100 + SOAK)
    assert _served(v) == [0, 1]
    assert v["notes"] == ["GPU 1 re-admitted: no new ECC error, Xid or pending retirement for 3600 s since its "
                          "counters last changed at 2025-12-02 01:48:20 UTC (held since 2025-12-02 01:46:40 UTC; "
                          "soak 3600 s)"]
    # a re-admitted card whose count grows again is held again, its baseline dropped, a new soak
    v, again = _run(_health(ecc=4), after, HELD_AT + 9000)
    assert _served(v) == [0] and again["readmitted"] == []
    assert [p["check"] for p in again["held"][0]["problems"]] == ["ecc_uncorrectable", "xid"]
    (card,) = again["held"][0]["cards"]
    assert card["held_since"] == card["last_change"] == HELD_AT + 9000
    assert "its counters moved (uncorrectable ECC errors since boot 3 -> 4)" in v["notes"][0]


def test_a_new_serious_xid_keeps_the_card_held_an_application_s_does_not():
    _, fact = _run(_health(), {}, HELD_AT)
    later = XID_AT + 7200
    v, moved = _run(_health(xids=((XID_AT, 48), (later, 94))), fact, HELD_AT + SOAK)
    assert _served(v) == [0] and moved["held"][0]["cards"][0]["last_change"] == HELD_AT + SOAK
    assert "its counters moved (Xid 94 at 2025-12-02 02:01:00 UTC)" in v["notes"][0]
    # Xid 31 (an application's fault) is not the card's: the soak goes on and ends
    v, _ = _run(_health(xids=((XID_AT, 48), (later, 31))), fact, HELD_AT + SOAK)
    assert _served(v) == [0, 1] and v["notes"][0].startswith("GPU 1 re-admitted")


def test_a_page_pending_retirement_keeps_the_card_held_whatever_the_soak():
    _, fact = _run(_health(pending=True), {}, HELD_AT)
    v, still = _run(_health(pending=True), fact, HELD_AT + 10 * SOAK)
    assert _served(v) == [0] and still == fact
    assert v["notes"] == ["GPU 1 held: a page waits for retirement; it waits for that to clear (a reboot, a GPU reset, "
                          "or a replacement), then for a soak with nothing new"]
    # cleared (without the counts: say a retirement the driver finished): the soak starts then
    v, cleared = _run(_health(), still, HELD_AT + 10 * SOAK + 1)
    assert _served(v) == [0] and cleared["held"][0]["cards"][0]["last_change"] == HELD_AT + 10 * SOAK + 1
    assert "a page pending retirement yes -> no" in v["notes"][0]


def test_a_lost_card_stays_held_and_soaks_from_when_nvml_reads_it_again():
    lost = [{"index": 1, "error": "GPU is lost", "error_code": "GPU_IS_LOST"}]
    _, fact = _run(None, {}, HELD_AT, lost=lost)
    (card,) = fact["held"][0]["cards"]
    assert (card["gpu_index"], card["counters"]) == (1, None)
    v, still = _run(None, fact, HELD_AT + 10 * SOAK, lost=lost)
    assert _served(v) == [0] and still == fact
    assert v["notes"][0].startswith("GPU 1 held: NVML cannot reach it;")
    # back, with its Xid 79 still in the journal (no reboot): held, and the soak starts now
    v, back = _run(_health(0, ((XID_AT, 79),)), still, HELD_AT + 10 * SOAK + 5)
    assert _served(v) == [0] and "its counters moved (NVML reads it again)" in v["notes"][0]
    assert back["held"][0]["cards"][0]["last_change"] == HELD_AT + 10 * SOAK + 5


def test_a_soak_of_0_re_admits_on_the_next_run_and_a_negative_one_never():
    _, fact = _run(_health(), {}, HELD_AT, soak=0)
    assert fact["held"]
    v, after = _run(_health(), fact, HELD_AT, soak="0")
    assert _served(v) == [0, 1] and after["readmitted"]
    v, still = _run(_health(), fact, HELD_AT + 10 ** 7, soak=-1)
    assert _served(v) == [0] and still == fact
    assert v["notes"][0].startswith("GPU 1 held: automatic re-admission is off (a negative soak)")
    # check mode says what a run would do (the role writes nothing then)
    v, _ = _run(_health(), fact, HELD_AT + 5, soak=0, check_mode=True)
    assert v["notes"][0].startswith("GPU 1 would be re-admitted (check mode, nothing changed): no new ECC error")


@pytest.mark.parametrize("value", [None, "1h", "", 1.5, True, [3600], "3600.0"])
def test_a_soak_that_is_not_whole_seconds_is_refused_naming_the_variable(value):
    with pytest.raises(ValueError, match=r"the soak is .*: give whole seconds, e\.g\. 86400 \(0 re-admits"):
        gpu_health.soak_seconds(value)
    from ansible.errors import AnsibleFilterError
    with pytest.raises(AnsibleFilterError, match="^llama_server_gpu_readmit_soak_s is "):
        _run(_health(), {}, HELD_AT, soak=value)


@pytest.mark.parametrize("value, seconds", [(0, 0), ("3600", 3600), (" 86400 ", 86400), (-1, None), ("-5", None)])
def test_a_soak_in_whole_seconds_is_read_as_such(value, seconds):
    assert gpu_health.soak_seconds(value) == seconds


def test_a_foreign_process_holds_the_card_only_while_it_runs():
    """Its hold clears with the process, with no soak; on a card also held for its counts,
    a soak that ends while the process runs accepts the counts and the card stays held."""
    v, fact = _run(_health(0, (), procs=(4242,)), {}, HELD_AT)
    assert [p["check"] for p in fact["held"][0]["problems"]] == ["foreign_process"] and v["notes"] == []
    v, gone = _run(_health(0, ()), fact, HELD_AT + 1)
    assert _served(v) == [0, 1] and gone == {"held": [], "readmitted": []}

    _, fact = _run(_health(procs=(4242,)), {}, HELD_AT)
    v, soaked = _run(_health(procs=(4242,)), fact, HELD_AT + SOAK)
    assert _served(v) == [0] and [p["check"] for p in soaked["held"][0]["problems"]] == ["foreign_process"]
    assert v["notes"][0].startswith("GPU 1 re-admitted: ") and v["notes"][0].endswith(
        "; it stays held for: foreign_process")
    assert [r["gpu_uuid"] for r in soaked["readmitted"]] == ["GPU-b"]
    v, rerun = _run(_health(procs=(4242,)), soaked, HELD_AT + SOAK + 60)
    assert _served(v) == [0] and rerun == soaked and v["notes"] == []
    v, gone = _run(_health(), rerun, HELD_AT + SOAK + 120)
    assert _served(v) == [0, 1] and gone == {"held": [], "readmitted": soaked["readmitted"]}


def test_a_split_is_held_until_each_of_its_held_cards_is_re_admitted():
    split = [{"gpu_index": 0, "gpu_uuids": ["GPU-a", "GPU-b"], "gpu_indices": [0, 1]}]
    _, fact = _run(_health(), {}, HELD_AT, plans=split)
    assert [c["gpu_uuid"] for c in fact["held"][0]["cards"]] == ["GPU-b"]
    assert _run(_health(), fact, HELD_AT + 60, plans=split)[0]["serve"] == []
    assert _run(_health(), fact, HELD_AT + SOAK, plans=split)[0]["serve"] == split


def test_readmission_s_decisions_follow_the_counters_over_random_histories():
    """A property over 300 seeded (reproducible) random histories of one held card: a rerun
    with nothing new changes nothing, last_change moves exactly when the counters move, and
    the card is re-admitted exactly when nothing waits for repair and its counters have been
    still for the soak."""
    import random
    rng = random.Random(29)
    for _ in range(300):
        soak = rng.choice([0, 1, 60, SOAK])
        record, now, health = None, HELD_AT, _health()
        for _ in range(rng.randint(1, 12)):
            now += rng.choice([0, 1, 30, 59, 60, 3599, 3600, 5000])
            roll = rng.random()
            if roll < 0.2:
                health = _health(ecc=health["ecc_errors"]["uncorrected_volatile"] + 1)
            elif roll < 0.3:
                health = _health(pending=not health["retired_pages"]["pending"])
            elif roll < 0.4:
                health = _health(xids=[(e["time"], e["xid"]) for e in health["xid_events"]] + [(now, 48)])
            decision = gpu_health.readmission(record, health, now, soak, "GPU 1")
            moved = record is None or record["counters"] != gpu_health.counters(health)
            assert (decision["record"]["last_change"] == now) or not moved
            if record is not None and not moved:
                assert decision["record"] == record
            still = record is not None and not moved and not health["retired_pages"]["pending"]
            assert decision["readmit"] == (still and now - record["last_change"] >= soak), (record, health, now)
            if decision["readmit"]:
                break
            record = decision["record"]


def test_the_exporter_judges_a_re_admitted_card_against_the_counts_accepted(gpu_host, tmp_path):
    """The GPU exporter's verdict (llm_fleet_gpu_healthy) reads the llama_server
    fact's readmitted list (read_readmitted): the accepted count passes, one more fails."""
    env = gpu_host("v100-sxm2-32gb")
    fact = tmp_path / "llm_fleet_llama_server.fact"
    accepted = gpu_health.counters(_health(ecc=2, xids=()))
    fact.write_text(json.dumps({"readmitted": [{"gpu_uuid": V100_32_UUID, "gpu_index": 0, "accepted": accepted,
                                                "held_since": HELD_AT, "readmitted_at": HELD_AT + SOAK}]}))
    script = ("import json, sys; sys.path[:0] = sys.argv[1].split(':'); import pynvml, gpu_exporter, gpu_health; "
              "pynvml.nvmlInit(); families = gpu_exporter.collect(pynvml, 'h', readmitted=gpu_health.read_readmitted("
              "sys.argv[2])); print(json.dumps([v for n, _, s in families if n == 'llm_fleet_gpu_healthy' "
              "for _, v in s]))")
    healthy = []
    for count in (2, 3):
        write_state(env, ["%s.ecc_uncorrected_volatile=%d" % (V100_32_UUID, count)])
        out = subprocess.run([sys.executable, "-c", script, "%s:%s" % (ROOT / "roles" / "gpu_exporter" / "files", ROOT / "module_utils"), str(fact)], env=env,
                             capture_output=True, text=True, timeout=60, check=True).stdout
        healthy.append(json.loads(out))
    assert healthy == [[1], [0]]
    assert gpu_health.read_readmitted(str(tmp_path / "absent.fact")) == {}
