"""Helpers for testinfra tests that look at a simulated host from the outside.

Scenario conftest files import the fixtures from here, so every scenario reads
hosts the same way: NVML through the real pynvml, systemd, and restarts through
the Docker engine (a restart is a reboot of the simulated host).
"""
import json
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
