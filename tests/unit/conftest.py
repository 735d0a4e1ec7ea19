"""Shared fixtures for unit tests: the mock NVML library and a runner that
executes a project module the way Ansible does (a fresh Python process, JSON in,
JSON out), so pynvml loads the mock library exactly as on a host."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
# The one way tests import project code: tests/harness on sys.path (see tests/harness/paths.py).
sys.path.insert(0, str(ROOT / "tests" / "harness"))
MOCK_DIR = ROOT / "tests" / "harness" / "mock_nvml"
PROFILE_DIR = MOCK_DIR / "profiles"

# Runs library/<module>.py's main() with module_utils/ mapped into
# ansible.module_utils, as Ansible's module packaging does on a host.
_RUNNER = r"""
import importlib, json, sys
import ansible.module_utils
ansible.module_utils.__path__.append(sys.argv[1])
from ansible.module_utils.testing import patch_module_args
sys.path.insert(0, sys.argv[2])
with patch_module_args(json.loads(sys.argv[3])):
    importlib.import_module(sys.argv[4]).main()
"""


def build_mock_nvml(dest, driver="525.147.05", cuda=12000):
    subprocess.run(
        ["make", "-s", "-C", str(MOCK_DIR), "BUILD_DIR=%s" % dest,
         "DRIVER_VERSION=%s" % driver, "CUDA_DRIVER_VERSION=%d" % cuda],
        check=True, capture_output=True, timeout=120)
    return Path(dest)


@pytest.fixture(scope="session")
def mock_nvml_lib(tmp_path_factory):
    """Directory holding a driver-525 libnvidia-ml.so.1 (for LD_LIBRARY_PATH)."""
    return build_mock_nvml(tmp_path_factory.mktemp("mock-nvml-525"))


@pytest.fixture
def gpu_host(mock_nvml_lib, tmp_path):
    """Environment of a freshly booted simulated host with a given profile:
    gpu_host('v100-sxm2-32gb') -> env dict."""
    def make(profile):
        env = dict(os.environ)
        env["LD_LIBRARY_PATH"] = str(mock_nvml_lib)
        env["MOCK_NVML_STATE_DIR"] = str(tmp_path / "run-mock-nvml")
        env["MOCK_NVML_PROFILE"] = str(PROFILE_DIR / (profile + ".profile"))
        return env
    return make


def run_module(name, args=None, env=None):
    """Run library/<name>.py with args; return its JSON result (failed or not)."""
    proc = subprocess.run(
        [sys.executable, "-c", _RUNNER, str(ROOT / "module_utils"), str(ROOT / "library"),
         json.dumps(args or {}), name],
        capture_output=True, text=True, env=env, timeout=120)
    assert proc.stdout.strip(), "module %s printed nothing; stderr:\n%s" % (name, proc.stderr)
    return json.loads(proc.stdout)
