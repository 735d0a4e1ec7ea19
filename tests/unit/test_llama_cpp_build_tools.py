"""The llama_cpp role's build-tool finder (roles/llama_cpp/library/llama_cpp_build_tools.py):
which CMake the build runs (the OS's, an operator's, or the cmake wheel in the build venv),
Ninja, optional ccache, and the directories put first on the build's PATH."""
import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
MODULE = ROOT / "roles" / "llama_cpp" / "library" / "llama_cpp_build_tools.py"
_spec = importlib.util.spec_from_file_location("llama_cpp_build_tools", MODULE)
tools = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(tools)

VENV = "/var/cache/llm-fleet/build-venv"
MIN = (3, 18)
PIN = "3.31.6"


def inspect(files, tool_dirs=(), search_path="/usr/local/bin:/usr/bin", mode="auto", ccache=True):
    """files: {path: '--version' output}; every listed path is an executable."""
    return tools.inspect(list(tool_dirs), search_path, VENV, MIN, mode, PIN, ccache,
                         run_version=lambda p: tools.parse_version(files[p]),
                         is_executable=lambda p: p in files)


UBUNTU_2004 = {"/usr/bin/cmake": "cmake version 3.16.3", "/usr/bin/ninja": "1.10.0", "/usr/bin/ccache": "ccache version 3.7.7"}
UBUNTU_2204 = {"/usr/bin/cmake": "cmake version 3.22.1", "/usr/bin/ninja": "1.10.1", "/usr/bin/ccache": "ccache version 4.5.1"}


def test_versions_are_read_from_the_tools_output():
    assert tools.parse_version("cmake version 3.16.3\n\nCMake suite maintained") == (3, 16, 3)
    assert tools.parse_version("1.13.2.git.kitware.jobserver-pipe-1") == (1, 13, 2)
    assert tools.parse_version("ccache version 4.8.2") == (4, 8, 2)
    assert tools.parse_version("") is None
    assert tools.at_least((3, 18), (3, 18)) and tools.at_least((4, 4, 3), (3, 18))
    assert not tools.at_least((3, 16, 3), (3, 18)) and not tools.at_least(None, (3, 18))


def test_ubuntu_2004_gets_the_cmake_wheel():
    result = inspect(UBUNTU_2004)
    assert result["cmake_pip"] is True
    assert result["cmake"] == {"path": VENV + "/bin/cmake", "version": PIN, "source": "venv"}
    assert result["problems"] == []
    # The venv's bin first, then ninja's and ccache's directory.
    assert result["path_dirs"] == [VENV + "/bin", "/usr/bin"]


def test_ubuntu_2004_after_the_wheel_is_installed_needs_nothing_more():
    result = inspect(dict(UBUNTU_2004, **{VENV + "/bin/cmake": "cmake version 3.31.6"}))
    assert result["cmake_pip"] is False
    assert result["cmake"]["path"] == VENV + "/bin/cmake"
    assert [c["version"] for c in result["cmake_candidates"]] == ["3.16.3", "3.31.6"]


def test_an_older_wheel_in_the_venv_is_replaced_by_the_pinned_one():
    result = inspect(dict(UBUNTU_2004, **{VENV + "/bin/cmake": "cmake version 3.27.0"}))
    assert result["cmake_pip"] is True


def test_a_new_enough_os_cmake_is_used_as_it_is():
    result = inspect(UBUNTU_2204)
    assert result["cmake"] == {"path": "/usr/bin/cmake", "version": "3.22.1", "source": "path"}
    assert result["cmake_pip"] is False
    assert result["ninja"]["version"] == "1.10.1" and result["ccache"]["path"] == "/usr/bin/ccache"
    assert result["path_dirs"] == ["/usr/bin"]


def test_always_takes_the_wheel_even_where_the_os_cmake_would_do():
    assert inspect(UBUNTU_2204, mode="always")["cmake_pip"] is True


def test_never_stops_on_an_old_cmake_with_a_message():
    result = inspect(UBUNTU_2004, mode="never")
    assert result["cmake"] is None and result["cmake_pip"] is False
    assert "no CMake >= 3.18" in result["problems"][0] and "/usr/bin/cmake 3.16.3" in result["problems"][0]


def test_tools_outside_the_path_come_first():
    # The lent GPU machine: cmake 4.4 and ninja inside a Python env, no ccache.
    files = {"/opt/torch/.venv/bin/cmake": "cmake version 4.4.3", "/opt/torch/.venv/bin/ninja": "1.13.2",
             "/usr/bin/cmake": "cmake version 3.16.3"}
    result = inspect(files, tool_dirs=["/opt/torch/.venv/bin"])
    assert result["cmake"] == {"path": "/opt/torch/.venv/bin/cmake", "version": "4.4.3", "source": "tool_dirs"}
    assert result["ninja"]["path"] == "/opt/torch/.venv/bin/ninja"
    assert result["ccache"] is None and result["problems"] == []
    assert result["path_dirs"] == ["/opt/torch/.venv/bin"]


def test_a_later_new_enough_cmake_on_the_path_beats_the_wheel():
    files = dict(UBUNTU_2004, **{"/usr/local/bin/cmake": "cmake version 3.28.1"})
    result = inspect(files)
    assert result["cmake"]["path"] == "/usr/local/bin/cmake" and result["cmake_pip"] is False


def test_ccache_is_optional():
    no_ccache = {k: v for k, v in UBUNTU_2204.items() if "ccache" not in k}
    assert inspect(no_ccache)["ccache"] is None
    assert inspect(no_ccache)["problems"] == []
    assert inspect(UBUNTU_2204, ccache=False)["ccache"] is None


def test_a_missing_ninja_is_a_problem():
    result = inspect({"/usr/bin/cmake": "cmake version 3.25.1"})
    assert result["problems"] and "ninja" in result["problems"][0]


def test_the_module_runs_on_real_executables(tmp_path):
    bindir = tmp_path / "bin"
    bindir.mkdir()
    for name, out in (("cmake", "cmake version 3.16.3"), ("ninja", "1.10.0")):
        exe = bindir / name
        exe.write_text("#!/bin/sh\necho '%s'\n" % out)
        exe.chmod(0o755)
    result = tools.inspect([str(bindir)], "", str(tmp_path / "venv"), MIN, "auto", PIN, True)
    assert result["cmake_candidates"] == [{"path": str(bindir / "cmake"), "version": "3.16.3", "source": "tool_dirs"}]
    assert result["cmake_pip"] is True and result["ninja"]["version"] == "1.10.0"


@pytest.mark.skipif(subprocess.run([sys.executable, "-m", "vermin", "--version"], capture_output=True).returncode != 0,
                    reason="vermin is not installed")
def test_the_module_runs_on_python_38():
    out = subprocess.run([sys.executable, "-m", "vermin", "-t=3.8-", "--no-tips", "--violations", str(MODULE)],
                         capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr
