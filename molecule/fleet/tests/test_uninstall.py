"""playbooks/uninstall.yml on one host of the deployed fleet: the host is back to its
state before site.yml (no unit, no listener, no user, no file under the project's
paths, no pin or hold), a second run changes nothing, and site.yml deploys it again.
Runs last in the scenario (the file name), on the single-card 16 GB host."""
import pytest

from hostprobe import node, only_in_scenario, recap, run_playbook, stage_fact

HOST = "fleet-sxm2-16gb"
pytestmark = [only_in_scenario("fleet"), pytest.mark.day_two]

PROJECT_PATHS = ["/opt/llm-fleet", "/etc/llm-fleet", "/var/lib/llm-fleet", "/var/cache/llm-fleet",
                 "/etc/systemd/system/llama-server@.service", "/etc/systemd/system/gpu-tuning.service",
                 "/etc/systemd/system/llm-fleet-gpu.target", "/etc/apt/preferences.d/nvidia-stack.pref",
                 "/etc/apt/apt.conf.d/51nvidia-stack-unattended", "/etc/haproxy",
                 "/etc/systemd/system/llm-fleet-gpu-exporter.service", "/run/llm-fleet-gpu-exporter"]


@pytest.fixture(scope="module")
def removed(tmp_path_factory):
    host = node(HOST)
    assert host.file("/opt/llm-fleet/venv").exists and stage_fact(host, "llama_server")["instances"]
    result = run_playbook("playbooks/uninstall.yml", [HOST], tmp_path=tmp_path_factory.mktemp("uninstall"),
                          extra_vars={"llm_model_remove_models": True})
    assert result.returncode == 0, result.stdout[-4000:]
    return host


def test_nothing_of_the_deployment_is_left(removed):
    host = removed
    left = [path for path in PROJECT_PATHS if host.file(path).exists]
    assert left == []
    assert host.run("ls /etc/ansible/facts.d/llm_fleet_*.fact").rc != 0, "a stage's fact is left"
    units = host.run("systemctl list-units --all --no-legend --plain 'llama-server@*' gpu-tuning.service "
                     "llm-fleet-gpu-exporter.service").stdout
    assert units.strip() == ""
    assert not host.user("llama").exists and not host.group("llama").exists
    assert not host.user("llm-gpu-exporter").exists
    for port in (8080, 8443, 9400):
        listening = host.run("python3 -c \"import socket; socket.create_connection(('127.0.0.1', %d), 2)\"" % port)
        assert listening.rc != 0, "something still listens on %d" % port
    assert not host.package("haproxy").is_installed
    held = host.check_output("apt-mark showhold").split()
    assert not [name for name in held if name.startswith(("nvidia-", "libnvidia-", "cuda-", "libnccl"))], held
    # The driver stays: a GPU driver is the operator's to remove.
    assert host.package("libnccl2").is_installed


def test_a_second_uninstall_changes_nothing(removed, tmp_path):
    result = run_playbook("playbooks/uninstall.yml", [HOST], tmp_path=tmp_path,
                          extra_vars={"llm_model_remove_models": True})
    assert result.returncode == 0, result.stdout[-4000:]
    assert recap(result.stdout, HOST)["changed"] == 0, result.stdout[-4000:]


def test_site_yml_deploys_the_host_again(removed, tmp_path):
    # verify measured this host already (test_fleet_verify); the health gate proves it serves.
    result = run_playbook("site.yml", [HOST], tmp_path=tmp_path, skip_tags=["verify"])
    assert result.returncode == 0, result.stdout[-4000:]
    host = removed
    for instance in stage_fact(host, "llama_server")["instances"]:
        health = host.run("python3 -c \"import urllib.request as u; print(u.urlopen('http://127.0.0.1:%d/health')"
                          ".status)\"" % instance["port"])
        assert health.stdout.strip() == "200"
    assert host.service("haproxy").is_running
    assert host.service("llm-fleet-gpu-exporter").is_running
