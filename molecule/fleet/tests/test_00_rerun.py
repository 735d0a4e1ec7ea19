"""Reruns (docs/upgrades.md, "Reruns"): site.yml run again the way molecule ran it (its
inventory, converge.yml's settings) but without llm_fleet_full_run. A host where nothing
changed since the last whole run is settled and every stage skips it; a host where a
file, a unit or a card changed goes through every stage, which puts it right; after a
reboot the hosts are settled again. Runs first in the scenario (the file name): right
after molecule's idempotence run recorded the stamps, before other tests change hosts."""
import json
import os
import re
import subprocess
import sys

import pytest

from hostprobe import node, only_in_scenario, reboot, recap

pytestmark = only_in_scenario("fleet")

HOSTS = ("fleet-sxm2-32gb", "fleet-sxm2-16gb", "fleet-2x-sxm2-16gb")
DRIFTED = "fleet-sxm2-16gb"
REBOOTED = "fleet-sxm2-32gb"
MONITORING = "fleet-2x-sxm2-16gb"
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


def tasks_on(output, host, status="ok|changed"):
    """The names of the tasks that ran on the host with that status."""
    names = []
    for block in output.split("\nTASK [")[1:]:
        name, _, lines = block.partition("]")
        if re.search(r"^(%s): \[%s\]" % (status, re.escape(host)), lines, re.M):
            names.append(name)
    return names


def ran_a_stage(output, host):
    """Whether a task of a stage ran on the host (the llama_server stage's, for one)."""
    return any(name.startswith("llama_server : ") for name in tasks_on(output, host))


def test_nothing_changed_every_host_is_settled_and_every_stage_skips_it():
    result = rerun()
    assert settled(result.stdout) == sorted(HOSTS), result.stdout[-6000:]
    assert "TASK [llama_server" not in result.stdout and "TASK [nvidia_stack" not in result.stdout
    for name in HOSTS:
        counts = recap(result.stdout, name)
        assert counts["changed"] == 0 and counts["failed"] == 0, (name, counts)
    # the summary still reads every stage's fact, and says the host was left as it was
    assert "(settled: nothing changed since the whole run of" in result.stdout


@pytest.mark.day_two
def test_a_changed_file_and_a_stopped_instance_send_that_host_through_every_stage():
    host = node(DRIFTED)
    # and a lost front certificate: the fleet's CA issues a new one, which Prometheus must trust
    host.check_output("systemctl stop llama-server@0.service && chmod 0600 /etc/llm-fleet/plan.json"
                      " && rm /etc/haproxy/llm-fleet/fleet-ca.pem")
    result = rerun()
    out = result.stdout
    assert settled(out) == sorted(set(HOSTS) - {DRIFTED}), out[-6000:]
    reasons = re.search(r"Every stage runs on %s: ([^\n]*(?:\n {8}[^\n]*)*)" % DRIFTED, out).group(1)
    reasons = " ".join(reasons.split())
    assert "files gone: /etc/haproxy/llm-fleet/fleet-ca.pem;" in reasons, reasons
    assert re.search(r"files changed: [^;]*/etc/llm-fleet/plan\.json", reasons), reasons
    assert "unit llama-server@0.service is inactive/dead enabled, it was active/running enabled" in reasons, reasons
    # put right by the stages, and only there: the monitoring host's Prometheus stage reran
    # for it and trusts the new certificate
    assert host.service("llama-server@0.service").is_running
    assert host.file("/etc/llm-fleet/plan.json").mode == 0o644
    assert host.file("/etc/haproxy/llm-fleet/fleet-ca.pem").exists
    assert recap(out, DRIFTED)["changed"] >= 2 and ran_a_stage(out, DRIFTED)
    assert not ran_a_stage(out, "fleet-sxm2-32gb") and not ran_a_stage(out, MONITORING)
    assert recap(out, "fleet-sxm2-32gb")["changed"] == 0
    changed = tasks_on(out, MONITORING, "changed")
    assert changed and all(name.startswith("prometheus : ") for name in changed), changed
    served = host.check_output("openssl x509 -in /etc/haproxy/llm-fleet/fleet-ca.pem").strip()
    assert served in node(MONITORING).file("/etc/prometheus/llm-fleet/fronts-ca.pem").content_string
    # and every host recorded what it holds now, the monitoring host too: the reboot test's
    # run (next) finds every host settled


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
