#!/usr/bin/env python3
"""Check the installed Ansible collections against requirements.yml.

Exit 0 when every collection requirements.yml names is installed at its pinned
version; otherwise print what differs and the command that fixes it, exit 1.
Usage: scripts/check-collections.py [ansible-galaxy]   (default: the one on PATH)"""
import json
import os
import subprocess
import sys

import yaml

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def wanted():
    with open(os.path.join(ROOT, "requirements.yml")) as handle:
        return {entry["name"]: str(entry["version"]) for entry in yaml.safe_load(handle)["collections"]}


def installed(galaxy):
    out = subprocess.run([galaxy, "collection", "list", "--format", "json"], capture_output=True, text=True,
                         check=True).stdout
    found = {}
    # {path: {name: {"version": ...}}}; the first path on ANSIBLE_COLLECTIONS_PATH wins, as for Ansible
    for collections in json.loads(out).values():
        for name, info in collections.items():
            found.setdefault(name, info.get("version"))
    return found


def main():
    galaxy = sys.argv[1] if len(sys.argv) > 1 else "ansible-galaxy"
    have = installed(galaxy)
    wrong = ["%s %s (installed: %s)" % (name, version, have.get(name, "none"))
             for name, version in sorted(wanted().items()) if have.get(name) != version]
    if wrong:
        print("requirements.yml pins collections the control node does not have: %s. Install them: "
              "ansible-galaxy collection install -r requirements.yml (or change the pins with the `ansible` "
              "package of requirements.txt)." % "; ".join(wrong), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
