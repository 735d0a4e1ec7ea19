#!/usr/bin/python
# -*- coding: utf-8 -*-
"""Find the tools a llama.cpp build uses on the build host, and decide where CMake comes from."""
from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
module: llama_cpp_build_tools
short_description: Find CMake, Ninja and ccache on a llama.cpp build host and choose the CMake to use
description:
  - Looks for cmake, ninja and ccache in I(tool_dirs) first, then in the directories of I(search_path), and reads
    their versions. Changes nothing.
  - Decides where CMake comes from. The pinned llama.cpp needs CMake >= 3.18 (ggml-cuda's CMakeLists), which
    Ubuntu 20.04's apt cmake (3.16.3) is not. C(auto) uses the first cmake found that is new enough, else the
    C(cmake) wheel from PyPI in the build venv I(venv); C(always) always uses the wheel; C(never) never does.
  - Returns C(cmake_pip) true when the wheel must be (re)installed into I(venv) (absent, or not the pinned version).
  - Runs on Python 3.8 (Ubuntu 20.04 build hosts).
options:
  tool_dirs: {type: list, elements: path, default: [], description: Directories searched first (tools an operator installed outside the PATH).}
  search_path: {type: str, default: "", description: "Directories searched next, ':'-separated; empty: the module's PATH plus the usual system directories."}
  venv: {type: path, required: true, description: The build venv that holds the cmake wheel (its bin/cmake).}
  cmake_min_version: {type: str, default: "3.18", description: Oldest CMake the build accepts.}
  cmake_from_pip: {type: str, default: auto, choices: [auto, always, never], description: Where CMake comes from (above).}
  cmake_pip_version: {type: str, required: true, description: The version of the cmake wheel installed into I(venv).}
  ccache: {type: bool, default: true, description: "Use ccache where it is installed; false, never."}
"""

RETURN = r"""
cmake: {description: "The CMake the build runs: path, version, source (tool_dirs, path or venv); null when none fits.", type: dict, returned: always}
cmake_pip: {description: The cmake wheel must be installed into the build venv first., type: bool, returned: always}
cmake_candidates: {description: Every cmake found with its version (the venv's too)., type: list, returned: always}
ninja: {description: "The Ninja the build runs: path, version; null when none is found.", type: dict, returned: always}
ccache: {description: "The ccache the build uses: path, version; null when disabled or not installed.", type: dict, returned: always}
path_dirs: {description: "The chosen tools' directories, in order, to put first on the build's PATH.", type: list, returned: always}
problems: {description: "What stops a build (no cmake new enough and the wheel not allowed, no ninja).", type: list, returned: always}
"""

import os
import re
import subprocess

SYSTEM_DIRS = ["/usr/local/sbin", "/usr/local/bin", "/usr/sbin", "/usr/bin", "/sbin", "/bin"]
_VERSION = re.compile(r"(\d+(?:\.\d+)+)")


def parse_version(text):
    """'cmake version 3.16.3' -> (3, 16, 3); '1.10.0' -> (1, 10, 0); None when there is no number."""
    match = _VERSION.search(text or "")
    if not match:
        return None
    return tuple(int(part) for part in match.group(1).split("."))


def version_text(version):
    return ".".join(str(part) for part in version) if version else None


def at_least(version, minimum):
    """version (a tuple or None) >= minimum (a tuple), comparing missing parts as 0."""
    if version is None:
        return False
    width = max(len(version), len(minimum))
    pad = lambda v: tuple(v) + (0,) * (width - len(v))  # noqa: E731
    return pad(version) >= pad(minimum)


def search_dirs(tool_dirs, search_path):
    """tool_dirs, then search_path's directories, each once, in order."""
    dirs = []
    for directory in list(tool_dirs or []) + [d for d in (search_path or "").split(os.pathsep) if d]:
        directory = os.path.normpath(directory)
        if directory not in dirs:
            dirs.append(directory)
    return dirs


def find_all(name, dirs, is_executable=None):
    """Every executable `name` in dirs, in order, as (path, dir)."""
    is_executable = is_executable or (lambda p: os.path.isfile(p) and os.access(p, os.X_OK))
    return [os.path.join(d, name) for d in dirs if is_executable(os.path.join(d, name))]


def choose_cmake(candidates, venv_cmake, minimum, mode, pip_version):
    """Decide which CMake the build runs.

    candidates: the cmakes found (tool_dirs, then PATH), in order, as dicts with path, version (tuple or
    None) and source. venv_cmake: the build venv's cmake as such a dict, or None. minimum: a tuple.
    mode: auto, always or never. pip_version: the wheel's pinned version (text).
    Returns (chosen dict or None, cmake_pip, problem text or None).
    """
    pinned = parse_version(pip_version)
    venv_current = venv_cmake is not None and venv_cmake["version"] == pinned
    venv_choice = dict(venv_cmake) if venv_current else None
    if mode == "always":
        return venv_choice, not venv_current, None
    for candidate in candidates:
        if at_least(candidate["version"], minimum):
            return candidate, False, None
    if mode == "auto":
        return venv_choice, not venv_current, None
    found = ", ".join("%s %s" % (c["path"], version_text(c["version"]) or "(no version)") for c in candidates)
    return None, False, (
        "no CMake >= %s on the build host (found: %s) and llama_cpp_cmake_from_pip is never: install a newer "
        "cmake, or allow the cmake wheel from PyPI (auto)" % (version_text(minimum), found or "none"))


def _run_version(path):
    try:
        proc = subprocess.Popen([path, "--version"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        out, _ = proc.communicate()
        return parse_version(out.decode("utf-8", "replace"))
    except OSError:
        return None


def inspect(tool_dirs, search_path, venv, minimum, mode, pip_version, use_ccache,
            run_version=_run_version, is_executable=None):
    """Everything the module returns, with the version reader injectable for tests."""
    dirs = search_dirs(tool_dirs, search_path)
    tool_set = set(os.path.normpath(d) for d in tool_dirs or [])
    venv_bin = os.path.normpath(os.path.join(venv, "bin"))

    def tool(path, source):
        return {"path": path, "version": run_version(path), "source": source}

    candidates = [tool(p, "tool_dirs" if os.path.dirname(p) in tool_set else "path")
                  for p in find_all("cmake", [d for d in dirs if d != venv_bin], is_executable)]
    venv_paths = find_all("cmake", [venv_bin], is_executable)
    venv_cmake = tool(venv_paths[0], "venv") if venv_paths else None
    cmake, cmake_pip, problem = choose_cmake(candidates, venv_cmake, minimum, mode, pip_version)
    if cmake is None and cmake_pip:
        # Not installed yet: the path it will have once the wheel is in the venv.
        cmake = {"path": os.path.join(venv_bin, "cmake"), "version": parse_version(pip_version), "source": "venv"}
    problems = [problem] if problem else []

    ninjas = find_all("ninja", dirs, is_executable)
    ninja = tool(ninjas[0], None) if ninjas else None
    if ninja is None:
        problems.append("no ninja on the build host (install ninja-build, or name its directory in llama_cpp_build_tool_dirs)")
    ccaches = find_all("ccache", dirs, is_executable) if use_ccache else []
    ccache = tool(ccaches[0], None) if ccaches else None

    path_dirs = []
    for chosen in (cmake, ninja, ccache):
        if chosen and os.path.dirname(chosen["path"]) not in path_dirs:
            path_dirs.append(os.path.dirname(chosen["path"]))

    def public(entry):
        if entry is None:
            return None
        out = {"path": entry["path"], "version": version_text(entry["version"])}
        if entry.get("source"):
            out["source"] = entry["source"]
        return out

    return {
        "cmake": public(cmake),
        "cmake_pip": cmake_pip,
        "cmake_candidates": [public(c) for c in candidates + ([venv_cmake] if venv_cmake else [])],
        "ninja": public(ninja),
        "ccache": public(ccache),
        "path_dirs": path_dirs,
        "problems": problems,
    }


def main():
    from ansible.module_utils.basic import AnsibleModule

    module = AnsibleModule(
        argument_spec=dict(
            tool_dirs=dict(type="list", elements="path", default=[]),
            search_path=dict(type="str", default=""),
            venv=dict(type="path", required=True),
            cmake_min_version=dict(type="str", default="3.18"),
            cmake_from_pip=dict(type="str", default="auto", choices=["auto", "always", "never"]),
            cmake_pip_version=dict(type="str", required=True),
            ccache=dict(type="bool", default=True),
        ),
        supports_check_mode=True,
    )
    p = module.params
    search_path = p["search_path"] or os.pathsep.join(
        [d for d in os.environ.get("PATH", "").split(os.pathsep) if d] + SYSTEM_DIRS)
    minimum = parse_version(p["cmake_min_version"])
    if minimum is None or parse_version(p["cmake_pip_version"]) is None:
        module.fail_json(msg="cmake_min_version and cmake_pip_version must be versions such as 3.18")
    result = inspect(p["tool_dirs"], search_path, p["venv"], minimum, p["cmake_from_pip"],
                     p["cmake_pip_version"], p["ccache"])
    module.exit_json(changed=False, **result)


if __name__ == "__main__":
    main()
