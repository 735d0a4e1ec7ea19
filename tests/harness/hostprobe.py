"""Helpers for testinfra tests that look at a simulated host from the outside.

Scenario conftest files import the fixtures from here, so every scenario reads
hosts the same way: NVML through the real pynvml, systemd, and restarts through
the Docker engine (a restart is a reboot of the simulated host).
"""
import json
import sys
import os
import subprocess
import time

import pytest

HARNESS_DIR = os.path.dirname(os.path.abspath(__file__))
PROBE_VENV = "/opt/test-probe"
with open(os.path.join(HARNESS_DIR, "nvml_probe.py")) as _handle:
    PROBE_SOURCE = _handle.read()


def host_name(host):
    return host.backend.get_hostname()


def ensure_probe_venv(host):
    """A venv with only nvidia-ml-py, from the host's wheelhouse: the test's own
    reader, independent of anything the roles install."""
    if not host.file(PROBE_VENV + "/bin/python").exists:
        host.run_expect([0], "python3 -m venv %s" % PROBE_VENV)
        host.run_expect([0], "%s/bin/pip install -q --no-index --find-links /srv/wheelhouse nvidia-ml-py"
                        % PROBE_VENV)
    return PROBE_VENV + "/bin/python"


def nvml_probe(host):
    """What NVML reports on the host right now (dict), or {'error': ...}."""
    python = ensure_probe_venv(host)
    result = host.run("%s -c %s", python, PROBE_SOURCE)
    assert result.rc == 0, result.stderr
    return json.loads(result.stdout)


def node(name):
    """The testinfra host of a scenario's container."""
    import testinfra
    return testinfra.get_host("docker://" + name)


def stage_fact(host, stage):
    """A stage's local fact on the host (/etc/ansible/facts.d/llm_fleet_<stage>.fact)."""
    return json.loads(host.file("/etc/ansible/facts.d/llm_fleet_%s.fact" % stage).content_string)


def only_in_scenario(name):
    """Marks tests that name one scenario's hosts (another scenario may share the directory)."""
    return pytest.mark.skipif(os.environ.get("MOLECULE_SCENARIO_NAME", name) != name,
                              reason="names the %s scenario's hosts" % name)


def reboot(host, timeout=60):
    """Restart the host's container (the simulated reboot) and wait for systemd."""
    subprocess.run(["docker", "restart", host_name(host)], check=True, capture_output=True)
    deadline = time.time() + timeout
    state = ""
    while time.time() < deadline:
        state = host.run("systemctl is-system-running").stdout.strip()
        if state in ("running", "degraded"):
            return state
        time.sleep(1)
    pytest.fail("%s did not finish booting after a restart (state %r)" % (host_name(host), state))


@pytest.fixture
def sim_profile(host):
    """The hardware profile the harness gave this host."""
    from gpu_profile import load_profile
    return load_profile(host.ansible.get_variables()["sim_gpu_profile"])


def harness_group_vars():
    """What every simulated host's inventory carries (tests/harness/group_vars/all.yml)."""
    import yaml
    with open(os.path.join(HARNESS_DIR, "group_vars", "all.yml")) as handle:
        return yaml.safe_load(handle)


def run_playbook(playbook, hosts, extra_vars=None, check=False, tmp_path=None, skip_tags=None, tags=None, groups=None,
                 diff=False):
    """Run one of the project's playbooks against simulated hosts (put in
    gpu_servers, and in the other groups of `groups`: {group: [host]}) the way an
    operator would, with an inventory written here. Returns the CompletedProcess;
    output is in .stdout."""
    import tempfile
    import yaml
    repo = os.path.dirname(os.path.dirname(HARNESS_DIR))
    workdir = str(tmp_path) if tmp_path else tempfile.mkdtemp(prefix="llm-fleet-test-")
    inventory = os.path.join(workdir, "hosts.yml")
    with open(inventory, "w") as handle:
        yaml.safe_dump({"all": {"vars": harness_group_vars(),
                                "children": dict({"gpu_servers": {"hosts": {h: {} for h in hosts}}},
                                                 **{g: {"hosts": {h: {} for h in members}}
                                                    for g, members in (groups or {}).items()})}}, handle,
                       sort_keys=False)  # the hosts in the order given (site.yml's canary is the first)
    argv = [os.path.join(os.path.dirname(sys.executable), "ansible-playbook"), "-i", inventory,
            os.path.join(repo, playbook)]
    if extra_vars:
        argv += ["-e", json.dumps(extra_vars)]
    if check:
        argv.append("--check")
    if diff:
        argv.append("--diff")
    if skip_tags:
        argv += ["--skip-tags", ",".join(skip_tags)]
    if tags:
        argv += ["--tags", ",".join(tags)]
    env = dict(os.environ, ANSIBLE_CONFIG=os.path.join(repo, "ansible.cfg"), ANSIBLE_NOCOLOR="1",
               ANSIBLE_FORCE_COLOR="0")
    result = subprocess.run(argv, capture_output=True, text=True, env=env, cwd=repo, timeout=1200)
    # the whole output beside the inventory (pytest keeps the last runs' tmp dirs) ...
    with open(os.path.join(workdir, "ansible.log"), "w") as handle:
        handle.write(result.stdout + "\n--- stderr\n" + result.stderr)
    # ... and the failed tasks at the end, where a test's message (the output's tail) shows them
    if result.returncode != 0:
        result.stdout += failed_tasks(result.stdout)
    return result


def failed_tasks(output, limit=3000):
    """The task header and the first lines of every fatal/failed result in an ansible
    output, so a failing run's message names the task even when the output is long."""
    lines, excerpts = output.splitlines(), []
    task = ""
    for number, line in enumerate(lines):
        if line.startswith("TASK ["):
            task = line
        elif line.startswith(("fatal: [", "failed: [")):
            block = [line]
            for after in lines[number + 1:number + 12]:
                if not after.strip() or after.startswith(("TASK [", "PLAY", "NO MORE HOSTS", "RUNNING HANDLER")):
                    break  # the result ends here (never the recap: recap() must count it once)
                block.append(after)
            excerpts.append("\n".join([task] + block))
    if not excerpts:
        return ""
    return "\n== failed tasks (the whole output: ansible.log beside the test's inventory)\n" + \
        "\n".join(excerpts)[:limit] + "\n"


def recap(output, host):
    """The PLAY RECAP counters of one host: {'ok': 3, 'changed': 1, ...}."""
    import re
    counters = {}
    for line in output.splitlines():
        if line.startswith(host + " ") and ":" in line and "ok=" in line:
            for key, value in re.findall(r"(\w+)=(\d+)", line):
                counters[key] = counters.get(key, 0) + int(value)
    return counters
