"""The NVIDIA stack after converge, read from the host: real apt against the
local NVIDIA mirror that also offers newer drivers, toolkits and NCCL."""
import pytest
import testinfra

from hostprobe import nvml_probe, recap, run_playbook

CONVERGED = "nvs-sxm2-16gb"
DEBIAN11 = "nvs-pcie-16gb-deb11"
FRESH = "nvs-fresh-pcie"
T4 = "nvs-t4"
PINNED = {
    "nvidia-driver-525": "525.147.05-0ubuntu1",
    "cuda-drivers-525": "525.147.05-1",
    "cuda-toolkit-11-8": "11.8.0-1",
    "libnccl2": "2.15.5-1+cuda11.8",
    "libnccl-dev": "2.15.5-1+cuda11.8",
}


@pytest.fixture(scope="module")
def node():
    return testinfra.get_host("docker://" + CONVERGED)


def installed_versions(node, names):
    out = node.run("dpkg-query -W -f='${Package} ${Version} ${db:Status-Abbrev}\\n' %s" % " ".join(names))
    return {line.split()[0]: line.split()[1] for line in out.stdout.splitlines() if line.split()[2:3] in (["ii"], ["hi"])}


def test_pinned_versions_are_installed_although_newer_exist(node):
    assert installed_versions(node, PINNED) == PINNED
    policy = node.check_output("apt-cache policy libnccl2")
    assert "2.18.3-1+cuda12.2" in policy, "the mirror must offer a newer NCCL for this test to mean anything"
    assert "Candidate: 2.15.5-1+cuda11.8" in policy


def test_stack_packages_are_held(node):
    held = node.check_output("apt-mark showhold").split()
    for name in PINNED:
        assert name in held


def test_apt_upgrade_leaves_the_stack(node):
    node.run_expect([0], "DEBIAN_FRONTEND=noninteractive apt-get -y upgrade")
    node.run_expect([0], "DEBIAN_FRONTEND=noninteractive apt-get -y dist-upgrade")
    assert installed_versions(node, PINNED) == PINNED


def test_nothing_can_pull_in_a_newer_stack(node):
    for request in ("libnccl2=2.18.3-1+cuda12.2", "cuda-drivers", "cuda-toolkit", "nvidia-driver-535"):
        result = node.run("DEBIAN_FRONTEND=noninteractive apt-get -y install %s", request)
        assert result.rc != 0, "apt installed %s past the pins" % request
    assert installed_versions(node, PINNED) == PINNED


def test_unattended_upgrades_leave_the_stack(node):
    """Even when unattended-upgrades is told to take NVIDIA's origin."""
    node.run_expect([0], "echo 'Unattended-Upgrade::Origins-Pattern { \"origin=NVIDIA\"; };' "
                         "> /etc/apt/apt.conf.d/99test-allow-nvidia")
    try:
        result = node.run("unattended-upgrade --dry-run --debug")
        assert result.rc == 0, result.stderr
        assert "2.18.3" not in result.stdout + result.stderr
    finally:
        node.run("rm -f /etc/apt/apt.conf.d/99test-allow-nvidia")
    assert installed_versions(node, PINNED) == PINNED


def test_nvml_answers_with_the_pinned_driver(node):
    seen = nvml_probe(node)
    assert seen.get("driver_version") == "525.147.05", seen
    assert seen["gpus"][0]["name"] == "Tesla V100-SXM2-16GB"


def test_the_oldest_system_installs_reboots_and_answers(node):
    """Debian 11 (glibc 2.31, Python 3.9): the pinned stack installed and held, the
    reboot the driver install asks for done (Docker restarted the host when its PID 1
    ended, as the machine comes back), and NVML loads and answers after it (a library
    built against a newer glibc fails to load there: issue 29)."""
    import subprocess
    old = testinfra.get_host("docker://" + DEBIAN11)
    assert old.file("/etc/debian_version").content_string.startswith("11.")
    assert installed_versions(old, PINNED) == PINNED
    held = old.check_output("apt-mark showhold").split()
    assert all(name in held for name in PINNED)
    restarts = subprocess.run(["docker", "inspect", "-f", "{{.RestartCount}}", DEBIAN11], check=True,
                              capture_output=True, text=True).stdout.strip()
    assert int(restarts) >= 1, "the driver install did not reboot the host"
    seen = nvml_probe(old)
    assert seen.get("driver_version") == "525.147.05", seen
    assert seen["gpus"][0]["name"] == "Tesla V100-PCIE-16GB"


def test_cuda_11_8_is_the_toolkit_builds_find(node):
    assert node.check_output("bash -lc 'command -v nvcc'") == "/usr/local/cuda-11.8/bin/nvcc"
    assert "release 11.8" in node.check_output("bash -lc 'nvcc --version'")
    resolved = node.check_output("ldconfig -p | grep -m1 'libcudart.so.11' | sed 's/.*=> //'")
    assert node.check_output("readlink -f %s", resolved).startswith("/usr/local/cuda-11.8/")
    assert node.check_output("readlink -f /usr/local/cuda") == "/usr/local/cuda-11.8"


def test_nouveau_is_blacklisted(node):
    assert node.file("/etc/modprobe.d/blacklist-nouveau.conf").contains("^blacklist nouveau")


def test_local_fact_records_the_stack(node):
    import json
    fact = json.loads(node.file("/etc/ansible/facts.d/llm_fleet_nvidia_stack.fact").content_string)
    assert fact["driver_version"] == "525.147.05"
    assert fact["gpus"] == ["Tesla V100-SXM2-16GB"]


def test_check_mode_on_a_fresh_host_reports_changes_and_makes_none(tmp_path):
    fresh = testinfra.get_host("docker://" + FRESH)
    result = run_playbook("playbooks/nvidia_stack.yml", [FRESH], check=True, tmp_path=tmp_path)
    assert result.returncode == 0, result.stdout[-3000:]
    assert recap(result.stdout, FRESH).get("changed", 0) > 0
    assert not fresh.file("/etc/apt/preferences.d/nvidia-stack.pref").exists
    assert not fresh.file("/opt/llm-fleet/venv").exists
    assert not fresh.package("nvidia-driver-525").is_installed


def test_a_non_volta_card_is_refused_by_name(tmp_path):
    result = run_playbook("playbooks/nvidia_stack.yml", [T4], tmp_path=tmp_path)
    assert result.returncode != 0
    assert "Tesla T4" in result.stdout and "compute capability\n" not in result.stdout
    assert "7.5" in result.stdout


def test_a_changed_branch_moves_the_pin(node, tmp_path):
    """Last: moves the converged host to driver 535 on purpose, with its reboot."""
    result = run_playbook("playbooks/nvidia_stack.yml", [CONVERGED], tmp_path=tmp_path,
                          extra_vars={"nvidia_stack_driver_branch": "535",
                                      "nvidia_stack_driver_version": "535.129.03"})
    assert result.returncode == 0, result.stdout[-3000:]
    versions = installed_versions(node, ["nvidia-driver-535", "nvidia-driver-525", "libnccl2"])
    assert versions == {"nvidia-driver-535": "535.129.03-0ubuntu1", "libnccl2": "2.15.5-1+cuda11.8"}
    assert "nvidia-driver-535" in node.check_output("apt-mark showhold").split()
    assert "Pin: version 535.129.03-*" in node.file("/etc/apt/preferences.d/nvidia-stack.pref").content_string
    # NVML answers with the new driver: the role rebooted, or it would report a mismatch.
    assert nvml_probe(node).get("driver_version") == "535.129.03"
