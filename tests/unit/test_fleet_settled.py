"""Reruns: is a host what the last whole run left? (module_utils/fleet_settled.py, the
fleet_settled module over the mock NVML, its action plugin's digest, and the
llm_fleet_unsettled filter that leaves settled hosts out of the stages' plays.)"""
import os
import sys
from pathlib import Path

import pytest

from conftest import ROOT, run_module

sys.path.insert(0, str(ROOT / "module_utils"))
sys.path.insert(0, str(ROOT / "filter_plugins"))
import fleet_settled  # noqa: E402
from settled import NO_HOST, llm_fleet_unsettled  # noqa: E402

V100_32_UUID = "GPU-4f6a1c2e-8b3d-4e55-9a71-2c0d93b5e7a4"


def host_files(tmp_path):
    etc = tmp_path / "etc-llm-fleet"
    etc.mkdir()
    (etc / "plan.json").write_text('{"gpus": []}\n')
    (etc / "api-key").write_text("secret\n")
    models = tmp_path / "models"
    models.mkdir()
    (models / "model.gguf").write_bytes(b"GGUF" + b"\0" * 64)
    os.symlink("model.gguf", str(models / "current.gguf"))
    dpkg = tmp_path / "status"
    dpkg.write_text("Package: nvidia-driver-525\nStatus: hold ok installed\n")
    return etc, models, dpkg


def state(tmp_path, gpus=None):
    etc, models, dpkg = tmp_path / "etc-llm-fleet", tmp_path / "models", tmp_path / "status"
    return fleet_settled.fingerprint([str(etc), str(models) + "/*"], [], str(dpkg), gpus)


# --- the fingerprint and the comparison ------------------------------------------------

def test_the_same_host_is_settled(tmp_path):
    host_files(tmp_path)
    stamp = dict(state(tmp_path), version=fleet_settled.STAMP_VERSION, digest="d")
    assert fleet_settled.differences(stamp, "d", state(tmp_path)) == []


def test_no_stamp_or_another_version_is_not_settled(tmp_path):
    host_files(tmp_path)
    now = state(tmp_path)
    assert "no stamp" in fleet_settled.differences(None, "d", now)[0]
    assert "no stamp" in fleet_settled.differences({"version": 0}, "d", now)[0]
    assert "no stamp" in fleet_settled.differences(["a list"], "d", now)[0]


@pytest.mark.parametrize("change, expected", [
    (lambda etc, models, dpkg: (etc / "plan.json").write_text('{"gpus": [1]}\n'), "files changed: "),
    # the same length, content only: ctime still moves
    (lambda etc, models, dpkg: (etc / "plan.json").write_text('{"gpus": [2]}\n'[:13] + "\n"), "files changed: "),
    (lambda etc, models, dpkg: os.chmod(str(etc / "api-key"), 0o600), "files changed: "),
    (lambda etc, models, dpkg: (etc / "api-key").unlink(), "files gone: "),
    (lambda etc, models, dpkg: (etc / "new.conf").write_text("x"), "files new: "),
    (lambda etc, models, dpkg: (models / "current.gguf").unlink() or os.symlink("other.gguf", str(models / "current.gguf")),
     "files changed: "),
    (lambda etc, models, dpkg: dpkg.write_text("Package: nvidia-driver-535\n"), "the package database changed"),
])
def test_a_change_on_the_host_is_seen_and_named(tmp_path, change, expected):
    etc, models, dpkg = host_files(tmp_path)
    stamp = dict(state(tmp_path), version=fleet_settled.STAMP_VERSION, digest="d")
    # ctime has nanosecond resolution but coarse ticks on some filesystems: make the change later
    os.utime(str(etc), None)
    import time
    time.sleep(0.02)
    change(etc, models, dpkg)
    reasons = fleet_settled.differences(stamp, "d", state(tmp_path))
    assert reasons and reasons[0].startswith(expected), reasons


def test_many_changed_files_are_counted_not_listed(tmp_path):
    etc, _, _ = host_files(tmp_path)
    stamp = dict(state(tmp_path), version=fleet_settled.STAMP_VERSION, digest="d")
    for n in range(6):
        (etc / ("extra-%d" % n)).write_text("x")
    reasons = fleet_settled.differences(stamp, "d", state(tmp_path))
    assert reasons == ["files new: %s, %s, %s and 3 more" % tuple(str(etc / ("extra-%d" % n)) for n in range(3)),
                       "files changed: %s" % etc]  # the directory that holds them


def test_another_digest_is_what_the_controller_asks_for(tmp_path):
    host_files(tmp_path)
    stamp = dict(state(tmp_path), version=fleet_settled.STAMP_VERSION, digest="d")
    assert fleet_settled.differences(stamp, "e", state(tmp_path)) == [
        "what the controller asks for changed (the project's code, this host's variables or the fleet's calibration)"]


def _gpus(**changes):
    gpu = {"index": 0, "name": "Tesla V100-SXM2-32GB", "pci_bus_id": "00000000:18:00.0",
           "memory_total_bytes": 34359738368,
           "tuning": {"persistence": True, "power_limit_w": 300.0, "drifted": []},
           "counters": {"ecc_uncorrected_volatile": 0, "xid": None, "xid_time": None},
           "processes": ["llama-server"]}
    gpu.update(changes)
    return {"driver_version": "525.147.05", "lost": [], "gpus": {V100_32_UUID: gpu}}


@pytest.mark.parametrize("now, expected", [
    (_gpus(counters={"ecc_uncorrected_volatile": 1, "xid": None, "xid_time": None}), "its health counters"),
    (_gpus(counters={"ecc_uncorrected_volatile": 0, "xid": 48, "xid_time": 1764633600.0}), "its health counters"),
    (_gpus(tuning={"persistence": True, "power_limit_w": 250.0, "drifted": []}), "its clocks, power or persistence"),
    (_gpus(processes=[]), "the processes on it"),
    (_gpus(processes=["llama-server", "python3"]), "the processes on it"),
    (dict(_gpus(), driver_version="535.54.03"), "the driver is 535.54.03"),
    (dict(_gpus(), lost=[1]), "NVML cannot reach GPU(s) 1"),
    (dict(_gpus(), gpus={}), "GPU %s is gone" % V100_32_UUID),
])
def test_a_change_on_a_gpu_is_seen_and_named(tmp_path, now, expected):
    host_files(tmp_path)
    before = state(tmp_path, _gpus())
    stamp = dict(before, version=fleet_settled.STAMP_VERSION, digest="d")
    reasons = fleet_settled.differences(stamp, "d", dict(before, gpus=now))
    assert any(expected in reason for reason in reasons), reasons


def test_a_card_that_does_not_hold_its_tuning_is_never_settled(tmp_path):
    host_files(tmp_path)
    drifted = _gpus(tuning={"persistence": True, "power_limit_w": 300.0, "drifted": ["locked_graphics_clock_mhz"]})
    before = state(tmp_path, drifted)
    stamp = dict(before, version=fleet_settled.STAMP_VERSION, digest="d")
    assert fleet_settled.differences(stamp, "d", before) == [
        "GPU 0 (%s) does not hold what gpu_tuning set: locked_graphics_clock_mhz" % V100_32_UUID]


def test_units_are_read_from_systemctl():
    calls = []

    class Done:
        def __init__(self, stdout, returncode=0):
            self.stdout, self.stderr, self.returncode = stdout, "", returncode

    def run(argv, **kwargs):
        calls.append(argv)
        if argv[1] == "list-units":
            return Done("llama-server@0.service loaded active running llama-server on GPU 0\n"
                        "llama-server@1.service loaded failed failed llama-server on GPU 1\n"
                        "haproxy.service not-found inactive dead haproxy.service\n")
        return Done("enabled\nenabled\n")
    assert fleet_settled.units(["llama-server@*", "haproxy.service"], run=run) == {
        "llama-server@0.service": "active/running enabled", "llama-server@1.service": "failed/failed enabled"}
    assert calls[1] == ["systemctl", "is-enabled", "llama-server@0.service", "llama-server@1.service"]
    assert fleet_settled.units([], run=run) == {}

    def missing(argv, **kwargs):
        raise FileNotFoundError(2, "No such file or directory", "systemctl")
    with pytest.raises(fleet_settled.SettledError, match=r"systemctl cannot run .*fleet_common_settled_units: \[\]"):
        fleet_settled.units(["llama-server@*"], run=missing)


def test_the_stamp_is_written_whole_and_read_back(tmp_path):
    host_files(tmp_path)
    path = tmp_path / "var" / "settled.json"
    written = fleet_settled.write_stamp(str(path), "d", state(tmp_path), "2026-12-03T10:00:00Z")
    assert fleet_settled.read_stamp(str(path)) == written
    assert oct(path.stat().st_mode & 0o777) == "0o600" and not Path(str(path) + ".tmp").exists()
    path.write_text('{"version": 1, "dig')
    assert fleet_settled.read_stamp(str(path)) is None
    assert fleet_settled.remove_stamp(str(path)) is True and fleet_settled.remove_stamp(str(path)) is False


# --- what the controller asks for ------------------------------------------------------

def test_the_digest_is_the_same_in_two_checkouts_and_moves_with_code_variables_and_calibration(tmp_path):
    roots = []
    for name in ("a", "b"):
        root = tmp_path / name
        (root / "roles" / "x" / "tasks").mkdir(parents=True)
        (root / "roles" / "x" / "tasks" / "main.yml").write_text("---\n")
        (root / "roles" / "x" / "__pycache__").mkdir()
        (root / "roles" / "x" / "__pycache__" / "y.pyc").write_bytes(os.urandom(8))
        (root / "site.yml").write_text("---\n")
        roots.append(root)
    calibration = tmp_path / "calibration.json"

    def digest(root, variables):
        return fleet_settled.inputs_digest(str(root), fleet_settled.code_files(str(root), ["site.yml", "roles"]),
                                           variables, [str(calibration)])
    base = digest(roots[0], {"x_port": 8080})
    assert digest(roots[1], {"x_port": 8080}) == base
    assert digest(roots[0], {"x_port": 8081}) != base
    calibration.write_text("{}")
    assert digest(roots[0], {"x_port": 8080}) != base
    (roots[0] / "roles" / "x" / "tasks" / "main.yml").write_text("---\n# a comment\n")
    assert digest(roots[0], {"x_port": 8080}) != digest(roots[1], {"x_port": 8080})


def test_the_digest_reads_the_stages_variables_not_those_that_steer_a_run():
    import importlib.util
    spec = importlib.util.spec_from_file_location("settled_action", str(ROOT / "action_plugins" / "fleet_settled.py"))
    plugin = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(plugin)
    names = plugin.variable_names
    got = names(["llama_server_base_port", "llm_fleet_canary", "llm_fleet_full_run", "llm_fleet_state",
                 "llm_fleet_api_key", "ansible_host", "gpu_tuning_power_limit_w", "nvidia_stack_serial",
                 "sim_gpu_profile", "llm_model_policy"], ["llama_server", "gpu_tuning", "nvidia_stack", "llm_model"])
    assert got == ["gpu_tuning_power_limit_w", "llama_server_base_port", "llm_fleet_api_key", "llm_model_policy"]


# --- the module over the mock NVML -----------------------------------------------------

def test_the_module_records_then_finds_the_host_settled_until_a_card_errs(gpu_host, tmp_path):
    etc, models, dpkg = host_files(tmp_path)
    env = gpu_host("v100-sxm2-32gb")
    args = {"digest": "d", "stamp": str(tmp_path / "settled.json"), "paths": [str(etc), str(models)],
            "dpkg_status": str(dpkg), "tuning_config": str(tmp_path / "none.json"),
            "xid_journal": str(tmp_path / "xids.jsonl")}
    first = run_module("fleet_settled", dict(args, state="check"), env=env)
    assert first["settled"] is False and "no stamp" in first["reasons"][0]
    assert run_module("fleet_settled", dict(args, state="record"), env=env)["changed"] is False
    again = run_module("fleet_settled", dict(args, state="check"), env=env)
    assert again["settled"] is True and again["reasons"] == [], again
    assert run_module("fleet_settled", dict(args, state="check", held=["GPU 0"]), env=env)["settled"] is False
    # an uncorrectable ECC error since the stamp
    state_dir = Path(env["MOCK_NVML_STATE_DIR"])
    state_dir.mkdir(parents=True, exist_ok=True)
    (state_dir / "state").write_text("%s.ecc_uncorrected_volatile=1\n" % V100_32_UUID)
    sick = run_module("fleet_settled", dict(args, state="check"), env=env)
    assert sick["settled"] is False
    assert any("its health counters" in reason for reason in sick["reasons"]), sick["reasons"]


def test_an_instance_that_does_not_answer_is_not_settled(gpu_host, tmp_path):
    etc, models, dpkg = host_files(tmp_path)
    env = gpu_host("v100-sxm2-32gb")
    args = {"digest": "d", "stamp": str(tmp_path / "settled.json"), "paths": [str(etc)], "dpkg_status": str(dpkg),
            "tuning_config": str(tmp_path / "none.json")}
    run_module("fleet_settled", dict(args, state="record"), env=env)
    result = run_module("fleet_settled", dict(args, state="check", health_urls=["http://127.0.0.1:9/health"]), env=env)
    assert result["settled"] is False and result["reasons"][0].startswith("http://127.0.0.1:9/health does not answer")


def test_check_mode_writes_and_removes_nothing(gpu_host, tmp_path):
    etc, _, dpkg = host_files(tmp_path)
    env = gpu_host("v100-sxm2-32gb")
    stamp = tmp_path / "settled.json"
    args = {"digest": "d", "stamp": str(stamp), "paths": [str(etc)], "dpkg_status": str(dpkg),
            "tuning_config": str(tmp_path / "none.json"), "_ansible_check_mode": True}
    run_module("fleet_settled", dict(args, state="record"), env=env)
    assert not stamp.exists()
    stamp.write_text("{}")
    run_module("fleet_settled", dict(args, state="absent"), env=env)
    assert stamp.exists()


# --- the stages' plays -----------------------------------------------------------------

def test_the_plays_leave_settled_hosts_out():
    groups = {"all": ["a", "b", "m"], "gpu_servers": ["a", "b"], "monitoring": ["m"]}
    assert llm_fleet_unsettled("gpu_servers", groups) == "gpu_servers"
    settled = dict(groups, llm_fleet_settled=["a", "m"])
    assert llm_fleet_unsettled("gpu_servers", settled) == "gpu_servers:!llm_fleet_settled"
    # Prometheus lists every GPU server's targets: it runs while one of them is not settled
    assert llm_fleet_unsettled("monitoring", settled, "gpu_servers") == "monitoring"
    assert llm_fleet_unsettled("monitoring", dict(settled, llm_fleet_settled=["a", "b", "m"]), "gpu_servers") \
        == "monitoring:!llm_fleet_settled"
    # the canary's groups when no host is left to roll out to
    assert llm_fleet_unsettled("llm_fleet_canary", settled) == NO_HOST


def test_the_stage_tags_a_whole_run_must_not_skip_are_site_yml_s():
    """A --skip-tags naming one of them makes the run partial (no stamp); a new stage's tag
    must be in the list, or skipping it would leave a stamp of a run that did not run it."""
    import yaml
    tags = set()
    for path in ("site.yml", "playbooks/rollout.yml"):
        for entry in yaml.safe_load((ROOT / path).read_text()):
            tags.update(entry.get("tags") or [])
    defaults = yaml.safe_load((ROOT / "roles" / "fleet_common" / "defaults" / "main.yml").read_text())
    assert sorted(tags - {"always"}) == sorted(defaults["fleet_common_settled_stage_tags"])
