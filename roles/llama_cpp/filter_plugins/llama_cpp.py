"""Filters of the llama_cpp role.

`llama_cpp_build_plan` decides which builds a play needs and which host compiles
each (one compile per distinct build key, not one per host).
`llama_cpp_help_flags` turns `llama-server --help` into the sorted list of the
command-line flags the binary accepts, so the server role never renders a flag
the pinned build lacks. `llama_cpp_version_info` parses `--version`.
`llama_cpp_missing_archs` reads `cuobjdump --list-elf` of the CUDA backend and
names the requested architectures it holds no code for.
`llama_cpp_cmake_flags` and `llama_cpp_build_key` name a build from what makes it.
Plain functions, so the unit tests load this file directly; FilterModule checks
what they are given (module_utils/filter_input.py).
"""
import hashlib
import json
import os
import re

import ansible.module_utils

# Ansible ships module_utils/ to modules only; the controller maps the
# repository's copy, so a plugin and a module share one definition.
_MODULE_UTILS = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..",
                                              "module_utils"))
if _MODULE_UTILS not in ansible.module_utils.__path__:
    ansible.module_utils.__path__.append(_MODULE_UTILS)

from ansible.module_utils.filter_input import guard_filters  # noqa: E402

# llama.cpp's common/arg.cpp prints each option as its flags (and value hints)
# padded to column 40, then the help text; flags longer than 37 characters get
# the help text on the next lines, indented by 40 spaces.
_HELP_COLUMN = 40
_FLAG = re.compile(r"(?<![\w-])(--?[A-Za-z][\w.-]*)")
# "version: 0.5.0-dev (build 0, commit 0c1e57098)" (2026), "version: 6500 (0c1e5709)" (older).
_VERSION = re.compile(r"version:\s*(?P<version>\S+)\s*\(build\s+(?P<number>\d+),\s*commit\s+(?P<commit>[^)\s]+)\)")
_VERSION_OLD = re.compile(r"version:\s*(?P<number>\d+)\s*\((?P<commit>[^)\s]+)\)")
# cuobjdump --list-elf: "ELF file    1: libggml-cuda.1.sm_70.cubin" (one line per cubin).
_CUBIN = re.compile(r"\.sm_(?P<arch>\d+[a-z]?)\.cubin\b")
_BUILT_WITH = re.compile(r"built with (?P<compiler>.+?) for (?P<target>\S.*)$", re.MULTILINE)


def _flags_column(line):
    if len(line) > _HELP_COLUMN and line[_HELP_COLUMN - 3:_HELP_COLUMN] == "   ":
        return line[:_HELP_COLUMN]
    return line


def llama_cpp_help_flags(text):
    """Every flag (`-c`, `--ctx-size`, `--no-mmap`, ...) that `--help` lists."""
    flags = set()
    for line in (text or "").splitlines():
        # Option lines start at column 0; help text and "(env: ...)" lines are indented.
        if not line.startswith("-") or line.startswith("---"):
            continue
        flags.update(_FLAG.findall(_flags_column(line)))
    return sorted(flags)


def llama_cpp_version_info(text):
    """`llama-server --version` -> {version, number, commit, compiler, target, text}."""
    text = text or ""
    info = {"version": None, "number": None, "commit": None, "compiler": None, "target": None,
            "text": " ".join(line.strip() for line in text.splitlines()
                             if line.startswith(("version:", "built with")))}
    match = _VERSION.search(text) or _VERSION_OLD.search(text)
    if match:
        info["version"] = match.groupdict().get("version")
        info["number"] = int(match.group("number"))
        info["commit"] = match.group("commit")
    match = _BUILT_WITH.search(text)
    if match:
        info["compiler"] = match.group("compiler")
        info["target"] = match.group("target").strip()
    return info


def llama_cpp_cubin_archs(listing):
    """The architectures `cuobjdump --list-elf` lists cubins for, e.g. ["70"]."""
    return sorted(set(match.group("arch") for match in _CUBIN.finditer(listing or "")))


def llama_cpp_missing_archs(archs, listing):
    """The requested CUDA architectures (["70"], CMake's numbers) that have no
    sm_<arch> cubin in the listing: a build without them cannot run on those GPUs."""
    present = set(llama_cpp_cubin_archs(listing))
    return [str(arch) for arch in archs if str(arch) not in present]


def llama_cpp_cmake_flags(definitions):
    """CMake cache entries as -DNAME=VALUE arguments, sorted by name: the build key
    hashes them, and the order an inventory writes its options in must not make
    a new build."""
    return ["-D%s=%s" % (name, definitions[name]) for name in sorted(definitions)]


def llama_cpp_build_key(material, commit_label, backend, archs):
    """A build's name: commit, backend, CUDA architectures, and a hash of
    everything that changes the binaries (material, hashed in a stable order), e.g.
    0c1e57098-cuda-sm70-57b2fe4890."""
    digest = hashlib.sha256(json.dumps(material, sort_keys=True).encode("utf-8")).hexdigest()[:10]
    label = "%s-%s" % (commit_label, backend)
    if backend == "cuda":
        label += "".join("-sm%s" % arch for arch in archs)
    return "%s-%s" % (label, digest)


def llama_cpp_ninja_progress(text):
    """What the end of ninja's output says of its progress: 'step 412 of 980 (42%)',
    or that it has not started compiling yet."""
    steps = re.findall(r"^\[(\d+)/(\d+)\]", str(text or ""), re.M)
    if not steps:
        return "configuring (ninja has not started a step yet)"
    done, total = (int(n) for n in steps[-1])
    return "step %d of %d (%d%%)" % (done, total, 100 * done // max(total, 1))


def llama_cpp_build_plan(builds, build_host=""):
    """Group the hosts' builds by build key.

    builds: one dict per host of the play, in play order, each with `host`, `key`,
    `spec` and `installed` (the host already has that build).
    Returns {key: {"spec", "hosts", "needed_by", "builder"}}: `needed_by` lists the
    hosts that must install it, `builder` is build_host when given, else the first
    host of the play with that key.
    """
    plan = {}
    for build in builds:
        entry = plan.setdefault(build["key"], {
            "spec": build["spec"], "hosts": [], "needed_by": [],
            "builder": build_host or build["host"]})
        entry["hosts"].append(build["host"])
        if not build["installed"]:
            entry["needed_by"].append(build["host"])
    return plan


_KINDS = {
    "llama_cpp_build_key": {"archs": "list?"},
    "llama_cpp_build_plan": {"builds": "dicts?", "build_host": "text?"},
    "llama_cpp_cmake_flags": {"definitions": "dict?"},
    "llama_cpp_cubin_archs": {"listing": "text?"},
    "llama_cpp_missing_archs": {"archs": "list?", "listing": "text?"},
    "llama_cpp_help_flags": {"text": "text?"},
    "llama_cpp_version_info": {"text": "text?"},
}


class FilterModule(object):
    def filters(self):
        return guard_filters({
            "llama_cpp_ninja_progress": llama_cpp_ninja_progress,
            "llama_cpp_build_key": llama_cpp_build_key,
            "llama_cpp_build_plan": llama_cpp_build_plan,
            "llama_cpp_cmake_flags": llama_cpp_cmake_flags,
            "llama_cpp_cubin_archs": llama_cpp_cubin_archs,
            "llama_cpp_missing_archs": llama_cpp_missing_archs,
            "llama_cpp_help_flags": llama_cpp_help_flags,
            "llama_cpp_version_info": llama_cpp_version_info,
        }, _KINDS)
