"""The code and packages that run on GPU hosts work with every host Python the
project supports (docs/os-support.md): 3.8 (Ubuntu 20.04), 3.9 (Debian 11),
3.10 (Ubuntu 22.04), 3.11 (Debian 12).

1. Every file that runs on a host (custom modules, module_utils, the scripts the
   roles copy) is 3.8-clean: vermin finds no syntax or library call newer than 3.8,
   and it parses with the 3.8 grammar.
2. roles/fleet_common/files/requirements-host.txt resolves, as wheels, for each of
   those Pythons (needs PyPI; skipped, saying so, only where PyPI is unreachable).
"""
import ast
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import urllib.error
import urllib.request

import pytest

from conftest import ROOT

HOST_PYTHONS = ["3.8", "3.9", "3.10", "3.11"]
OLDEST = (3, 8)
REQUIREMENTS_HOST = ROOT / "roles" / "fleet_common" / "files" / "requirements-host.txt"

_spec = importlib.util.spec_from_file_location("host_requirements", str(ROOT / "scripts" / "host-requirements.py"))
host_requirements = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(host_requirements)


def _is_python(path):
    if path.suffix == ".py":
        return True
    if path.suffix or not path.is_file():
        return False
    with open(path, "rb") as handle:
        first = handle.readline(200)
    return first.startswith(b"#!") and b"python" in first


def host_python_files():
    """Python that runs on hosts: modules and module_utils (project-wide and in
    roles), and every Python file the roles copy (roles/*/files, any depth,
    with or without a .py suffix)."""
    found = set()
    for pattern in ("library/*.py", "module_utils/*.py", "roles/*/library/*.py", "roles/*/module_utils/*.py"):
        found.update(ROOT.glob(pattern))
    found.update(p for p in ROOT.glob("roles/*/files/**/*") if _is_python(p))
    return sorted(found)


def harness_host_python_files():
    """The simulated hosts' stand-ins (mock nvidia-smi, fake nvcc, ...): they run
    inside the test hosts, the oldest of which is Debian 11 (3.9)."""
    return sorted(p for p in (ROOT / "tests" / "harness").rglob("*")
                  if "__pycache__" not in p.parts and not p.suffix and _is_python(p))


def _vermin():
    exe = os.path.join(os.path.dirname(sys.executable), "vermin")
    if os.path.exists(exe):
        return [exe]
    if importlib.util.find_spec("vermin") is None:
        pytest.fail("vermin is not installed in this Python; it is pinned in requirements.txt (make setup)")
    return [sys.executable, "-m", "vermin"]


def vermin(target, paths):
    # --eval-annotations: hosts evaluate annotations at definition time unless a
    # file says otherwise, so list[int] in a signature counts as 3.9.
    cmd = _vermin() + ["-t=%s-" % target, "--no-tips", "--violations", "--eval-annotations"]
    cmd += [str(p) for p in paths]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=300)


def rel(paths):
    return [str(p.relative_to(ROOT)) for p in paths]


def test_host_file_list_covers_what_the_roles_ship():
    files = rel(host_python_files())
    for expected in ("library/gguf_info.py", "module_utils/gguf_model.py",
                     "roles/gpu_tuning/files/gpu-tuning-apply", "roles/verify/files/llm_fleet_loadtest.py",
                     "roles/gpu_exporter/files/gpu_exporter.py"):
        assert expected in files, files


def test_host_code_follows_one_convention():
    """docs/fleet_common.md, "The host library": a program on a host lives in its role's
    files/ and imports what it shares with the modules from the host library fleet_common
    installs; so no program patches sys.path, and no role but fleet_common copies from
    module_utils/."""
    programs = [p for p in ROOT.glob("roles/*/files/**/*") if _is_python(p)]
    assert programs
    for program in programs:
        assert "sys.path" not in program.read_text(), "%s patches sys.path" % program.relative_to(ROOT)
    for tasks in ROOT.glob("roles/*/tasks/*.yml"):
        if re.search(r"src:.*module_utils/", tasks.read_text()):
            assert tasks.parts[-3] == "fleet_common", "%s copies from module_utils/" % tasks.relative_to(ROOT)


def test_vermin_flags_newer_python(tmp_path):
    """The check itself: vermin with these flags does report 3.9+ code."""
    newer = tmp_path / "newer"
    newer.write_text('#!/usr/bin/env python3\ndef f(x: list[int]) -> str:\n    return "ab".removeprefix("a")\n')
    result = vermin("3.8", [newer])
    assert result.returncode != 0, result.stdout + result.stderr
    assert "removeprefix" in result.stdout, result.stdout


def test_host_code_is_python_3_8_clean():
    files = host_python_files()
    result = vermin("3.8", files)
    assert result.returncode == 0, (
        "code that runs on hosts needs a Python newer than 3.8 (Ubuntu 20.04):\n%s%s"
        % (result.stdout, result.stderr))


@pytest.mark.parametrize("path", host_python_files(), ids=rel(host_python_files()))
def test_host_code_parses_with_the_3_8_grammar(path):
    source = path.read_text(encoding="utf-8")
    try:
        ast.parse(source, filename=str(path), feature_version=OLDEST)
    except SyntaxError as err:
        pytest.fail("%s does not parse as Python 3.8: %s" % (path.relative_to(ROOT), err))


def test_simulated_host_stand_ins_are_python_3_9_clean():
    files = harness_host_python_files()
    assert files, "no executable Python stand-ins found under tests/harness"
    result = vermin("3.9", files)
    assert result.returncode == 0, (
        "a stand-in that runs inside the Debian 11 test host needs a Python newer than 3.9:\n%s%s"
        % (result.stdout, result.stderr))


# ---------------------------------------------------------------------------
# The host requirements, per Python (markers evaluated offline)


@pytest.mark.parametrize("python", HOST_PYTHONS)
def test_one_pin_per_package_for_each_host_python(python):
    reqs = host_requirements.requirements_for(python, str(REQUIREMENTS_HOST))
    pins = dict(line.split("==", 1) for line in reqs)
    assert all("==" in line for line in reqs), reqs
    assert set(pins) >= {"nvidia-ml-py", "gguf", "numpy"}, reqs


def test_gguf_pins_follow_its_python_requirement():
    """gguf 0.19.0 declares Requires-Python >= 3.10 (checked online below too)."""
    gguf = dict((py, dict(r.split("==", 1) for r in host_requirements.requirements_for(py))["gguf"])
                for py in HOST_PYTHONS)
    assert gguf["3.8"] == gguf["3.9"] == "0.17.1", gguf
    assert gguf["3.10"] == gguf["3.11"], gguf


def test_controller_tests_the_gguf_debian_12_hosts_run():
    """The unit tests run on the controller's gguf: the same as Debian 12's (3.11)."""
    controller = re.search(r"^gguf==(\S+)", (ROOT / "requirements.txt").read_text(), re.M).group(1)
    host = dict(r.split("==", 1) for r in host_requirements.requirements_for("3.11"))["gguf"]
    assert controller == host


def test_markers_are_evaluated_for_the_target_python(tmp_path):
    req = tmp_path / "r.txt"
    req.write_text('a==1 ; python_version < "3.10"\na==2 ; python_version >= "3.10"\n'
                   'b==1 ; sys_platform == "win32"\n')
    assert host_requirements.requirements_for("3.8", str(req)) == ["a==1"]
    assert host_requirements.requirements_for("3.10", str(req)) == ["a==2"]
    req.write_text('a==1 ; python_version < "3.11"\na==2 ; python_version >= "3.10"\n')
    with pytest.raises(ValueError, match="overlapping"):
        host_requirements.requirements_for("3.10", str(req))


# ---------------------------------------------------------------------------
# Resolution against PyPI

INDEX_URL = os.environ.get("PIP_INDEX_URL", "https://pypi.org/simple").rstrip("/")
# Local settings that would let a wheel from somewhere other than the index
# satisfy the check (this machine's pip config adds local wheel folders).
_PIP_ENV_DROP = ("PIP_FIND_LINKS", "PIP_EXTRA_INDEX_URL", "PIP_CONSTRAINT", "PIP_NO_INDEX",
                 "PIP_REQUIRE_VIRTUALENV", "PIP_TARGET", "PIP_USER")
# Ubuntu 20.04's venv pip is 20.0.2: it predates PEP 600, so a compiled wheel must
# also carry a legacy manylinux tag to install there.
_LEGACY_TAG = re.compile(r"manylinux(1|2010|2014)_x86_64")


@pytest.fixture(scope="module")
def pypi():
    url = INDEX_URL + "/gguf/"
    try:
        with urllib.request.urlopen(url, timeout=20) as response:
            response.read(1)
    except urllib.error.HTTPError:
        pass  # it answered: reachable; the resolution below says what is wrong
    except (urllib.error.URLError, OSError) as err:
        pytest.skip("PyPI is unreachable from here (%s: %s): cannot check that the host requirements "
                    "resolve; CI and the test machine reach it" % (url, err))
    return INDEX_URL


@pytest.mark.parametrize("python", HOST_PYTHONS)
def test_host_requirements_resolve_as_wheels(pypi, python, tmp_path):
    reqs = host_requirements.requirements_for(python, str(REQUIREMENTS_HOST))
    req_file = tmp_path / ("requirements-%s.txt" % python)
    req_file.write_text("\n".join(reqs) + "\n")
    report = tmp_path / "report.json"
    env = dict((k, v) for k, v in os.environ.items() if k not in _PIP_ENV_DROP)
    env["PIP_CONFIG_FILE"] = os.devnull
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    # The resolver of `pip download` without fetching every wheel: wheels only,
    # for a CPython of that version on manylinux2014 x86_64.
    cmd = [sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed", "--quiet",
           "--index-url", pypi, "--only-binary=:all:", "--python-version", python, "--implementation", "cp",
           "--platform", "manylinux2014_x86_64", "--report", str(report), "-r", str(req_file)]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 0, (
        "requirements-host.txt does not resolve for Python %s:\n%s\n%s%s"
        % (python, "\n".join(reqs), proc.stdout, proc.stderr[-4000:]))
    resolved = {}
    for item in json.loads(report.read_text())["install"]:
        name = item["metadata"]["name"].lower().replace("_", "-")
        resolved[name] = (item["metadata"]["version"], item["download_info"]["url"].rsplit("/", 1)[-1])
    for line in reqs:
        name, version = line.split("==", 1)
        assert resolved.get(name.lower(), (None,))[0] == version, (line, resolved)
    if python == "3.8":
        compiled = [wheel for _, wheel in resolved.values() if not wheel.endswith("-none-any.whl")]
        assert compiled, resolved
        old_pip = [w for w in compiled if not _LEGACY_TAG.search(w)]
        assert not old_pip, "wheels Ubuntu 20.04's pip 20.0.2 cannot install: %s" % old_pip
