"""Reruns (docs/upgrades.md, "Reruns") and re-provisioning: site.yml run again the way
molecule ran it (its inventory, converge.yml's settings) but without llm_fleet_full_run.
A host where nothing changed since the last whole run is settled and every stage skips
it; a host where a file, a unit or a card changed goes through every stage, which puts
it right; a host that playbooks/uninstall.yml emptied (nothing of the deployment left, a
second uninstall changes nothing) is deployed again by the same rerun; after a reboot
the hosts are settled again. Runs first in the scenario (the file name): right after
molecule's idempotence run recorded the stamps, before other tests change hosts."""
import json
import os
import re
import subprocess
import sys

import pytest

from hostprobe import node, only_in_scenario, reboot, recap, run_playbook, stage_fact

pytestmark = only_in_scenario("fleet")

HOSTS = ("fleet-sxm2-32gb", "fleet-sxm2-16gb", "fleet-2x-sxm2-16gb")
DRIFTED = "fleet-sxm2-32gb"
UNINSTALLED = "fleet-sxm2-16gb"
REBOOTED = "fleet-sxm2-32gb"
MONITORING = "fleet-2x-sxm2-16gb"
# What site.yml puts on a host, beyond the packages: none of it may outlive an uninstall.
PROJECT_PATHS = ["/opt/llm-fleet", "/etc/llm-fleet", "/var/lib/llm-fleet", "/var/cache/llm-fleet",
                 "/etc/systemd/system/llama-server@.service", "/etc/systemd/system/gpu-tuning.service",
                 "/etc/systemd/system/llm-fleet-gpu.target", "/etc/apt/preferences.d/nvidia-stack.pref",
                 "/etc/apt/apt.conf.d/51nvidia-stack-unattended", "/etc/haproxy",
                 "/etc/systemd/system/llm-fleet-gpu-exporter.service", "/run/llm-fleet-gpu-exporter"]
SCENARIO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
REPO = os.path.dirname(os.path.dirname(SCENARIO))


def rerun():
    """site.yml through converge.yml, as molecule ran it, settled hosts left out."""
    inventory = os.path.join(os.environ["MOLECULE_EPHEMERAL_DIRECTORY"], "inventory")
    argv = [os.path.join(os.path.dirname(sys.executable), "ansible-playbook"), "-i", inventory,
            os.path.join(SCENARIO, "converge.yml"), "-e", json.dumps({"llm_fleet_full_run": False})]
    env = dict(os.environ, ANSIBLE_CONFIG=os.path.join(REPO, "ansible.cfg"), ANSIBLE_NOCOLOR="1",
               ANSIBLE_FORCE_COLOR="0")
    result = subprocess.run(argv, capture_output=True, text=True, env=env, cwd=REPO, timeout=1200)
    assert result.returncode == 0, result.stdout[-6000:]
    return result


def settled(output):
    return sorted(set(re.findall(r"(\S+) is settled: nothing changed since the whole run", output)))


def ran_a_stage(output, host):
    """Whether a task of a stage ran on the host (the llama_server stage's, for one)."""
    for block in output.split("\nTASK [")[1:]:
        name, _, lines = block.partition("]")
        if name.startswith("llama_server : ") and re.search(r"^(ok|changed): \[%s\]" % re.escape(host), lines, re.M):
            return True
    return False


def changed_tasks(output, host):
    """The tasks and handlers that changed something on the host."""
    names = []
    for block in re.split(r"\n(?:TASK|RUNNING HANDLER) \[", output)[1:]:
        name, _, lines = block.partition("]")
        if re.search(r"^changed: \[%s\]" % re.escape(host), lines, re.M):
            names.append(name)
    return names


def test_nothing_changed_every_host_is_settled_and_every_stage_skips_it():
    result = rerun()
    assert settled(result.stdout) == sorted(HOSTS), result.stdout[-6000:]
    assert "TASK [llama_server" not in result.stdout and "TASK [nvidia_stack" not in result.stdout
    for name in HOSTS:
        counts = recap(result.stdout, name)
        assert counts["changed"] == 0 and counts["failed"] == 0, (name, counts)
    # the summary still reads every stage's fact, and says the host was left as it was
    assert "(settled: nothing changed since the whole run of" in result.stdout


@pytest.fixture(scope="module")
def uninstalled(tmp_path_factory):
    host = node(UNINSTALLED)
    assert host.file("/opt/llm-fleet/venv").exists and stage_fact(host, "llama_server")["instances"]
    result = run_playbook("playbooks/uninstall.yml", [UNINSTALLED], tmp_path=tmp_path_factory.mktemp("uninstall"),
                          extra_vars={"llm_model_remove_models": True})
    assert result.returncode == 0, result.stdout[-4000:]
    return host


def test_uninstall_leaves_nothing_of_the_deployment(uninstalled):
    host = uninstalled
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


def test_a_second_uninstall_changes_nothing(uninstalled, tmp_path):
    result = run_playbook("playbooks/uninstall.yml", [UNINSTALLED], tmp_path=tmp_path,
                          extra_vars={"llm_model_remove_models": True})
    assert result.returncode == 0, result.stdout[-4000:]
    assert recap(result.stdout, UNINSTALLED)["changed"] == 0, result.stdout[-4000:]


def test_a_drifted_host_is_put_right_and_an_emptied_one_deployed_again_by_one_rerun(uninstalled):
    host = node(DRIFTED)
    host.check_output("systemctl stop llama-server@0.service && chmod 0600 /etc/llm-fleet/plan.json")
    result = rerun()
    out = result.stdout
    assert settled(out) == [MONITORING], out[-6000:]
    reasons = re.search(r"Every stage runs on %s: ([^\n]*(?:\n {8}[^\n]*)*)" % DRIFTED, out).group(1)
    reasons = " ".join(reasons.split())
    assert "files changed: /etc/llm-fleet/plan.json" in reasons, reasons
    assert "unit llama-server@0.service is inactive/dead enabled, it was active/running enabled" in reasons, reasons
    assert "Every stage runs on %s: " % UNINSTALLED in out
    # put right by the stages, and only there (the monitoring host's Prometheus stage reran
    # for them: it lists the instances' targets)
    assert host.service("llama-server@0.service").is_running
    assert host.file("/etc/llm-fleet/plan.json").mode == 0o644
    assert recap(out, DRIFTED)["changed"] >= 2 and ran_a_stage(out, DRIFTED)
    # on the monitoring host only Prometheus changed (the emptied host's front came back with
    # a new certificate and targets, which Prometheus scrapes), and so its stamp
    assert not ran_a_stage(out, MONITORING)
    changed = changed_tasks(out, MONITORING)
    assert len(changed) == recap(out, MONITORING)["changed"], (changed, recap(out, MONITORING))
    assert all(name.startswith(("prometheus : ", "fleet_common : Record what this run left")) for name in changed), \
        changed
    # the emptied host serves again: every instance answers, the front and the exporter run
    again = uninstalled
    assert ran_a_stage(out, UNINSTALLED)
    for instance in stage_fact(again, "llama_server")["instances"]:
        health = again.run("python3 -c \"import urllib.request as u; print(u.urlopen('http://127.0.0.1:%d/health')"
                           ".status)\"" % instance["port"])
        assert health.stdout.strip() == "200"
    assert again.service("haproxy").is_running
    assert again.service("llm-fleet-gpu-exporter").is_running
    # and the run recorded every host again (the monitoring host too, which Prometheus
    # changed): the reboot test's run (next) finds every host settled


def test_after_a_reboot_the_host_is_settled_and_nothing_changes():
    host = node(REBOOTED)
    reboot(host, timeout=120)
    result = rerun()
    assert settled(result.stdout) == sorted(HOSTS), result.stdout[-6000:]
    for name in HOSTS:
        assert recap(result.stdout, name)["changed"] == 0, name
    # settled means the boot re-applied the tuning and the instance serves: check it from outside
    assert host.service("llama-server@0.service").is_running
    assert host.run("python3 -c \"import urllib.request as u; u.urlopen('http://127.0.0.1:8080/health', timeout=5)\"").rc == 0
