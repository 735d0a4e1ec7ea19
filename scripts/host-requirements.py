#!/usr/bin/env python3
"""Print the host requirements that apply to one target Python version.

roles/fleet_common/files/requirements-host.txt pins a version per Python range
with environment markers (gguf 0.19.0 needs Python >= 3.10; Ubuntu 20.04 has
3.8). A host's pip evaluates those markers against its own Python, but
`pip download --python-version X` (the wheelhouse, the resolution test)
evaluates them against the Python running pip, not X. This script evaluates
them for X and prints the lines that apply, without markers, for pip -r.

    scripts/host-requirements.py --python-version 3.9 [FILE] > reqs-3.9.txt

Runs on the control node (needs `packaging`, which ansible-core brings).
"""
import argparse
import os
import sys

from packaging.markers import Marker
from packaging.requirements import Requirement

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT_FILE = os.path.join(ROOT, "roles", "fleet_common", "files", "requirements-host.txt")

# The hosts: Linux x86_64 CPython (Ubuntu 20.04/22.04, Debian 11/12).
HOST_ENVIRONMENT = {
    "os_name": "posix",
    "sys_platform": "linux",
    "platform_system": "Linux",
    "platform_machine": "x86_64",
    "platform_python_implementation": "CPython",
    "implementation_name": "cpython",
}


def marker_environment(python_version):
    parts = python_version.split(".")
    if len(parts) < 2 or not all(p.isdigit() for p in parts):
        raise ValueError("python version must look like 3.8 or 3.8.10, got %r" % python_version)
    env = dict(HOST_ENVIRONMENT)
    env["python_version"] = "%s.%s" % (parts[0], parts[1])
    env["python_full_version"] = ".".join(parts + ["0"] * (3 - len(parts)))
    env["implementation_version"] = env["python_full_version"]
    return env


def requirements_for(python_version, path=DEFAULT_FILE):
    """Requirement strings (markers evaluated and removed) of `path` that apply
    to a Linux x86_64 CPython `python_version` host."""
    env = marker_environment(python_version)
    out = []
    with open(path) as handle:
        for number, raw in enumerate(handle, 1):
            line = raw.split(" #", 1)[0].strip()
            if not line or line.startswith("#"):
                continue
            if line.startswith("-"):
                raise ValueError("%s:%d: pip options are not supported here: %s" % (path, number, line))
            req = Requirement(line)
            if req.marker is not None and not Marker(str(req.marker)).evaluate(env):
                continue
            req.marker = None
            out.append(str(req))
    names = [Requirement(r).name.lower() for r in out]
    doubled = sorted(set(n for n in names if names.count(n) > 1))
    if doubled:
        raise ValueError("%s: more than one line applies to Python %s for %s (overlapping markers)"
                         % (path, python_version, ", ".join(doubled)))
    return out


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--python-version", required=True, help="target Python, e.g. 3.8")
    parser.add_argument("file", nargs="?", default=DEFAULT_FILE)
    args = parser.parse_args(argv)
    try:
        lines = requirements_for(args.python_version, args.file)
    except (OSError, ValueError) as err:
        print("host-requirements: %s" % err, file=sys.stderr)
        return 1
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
