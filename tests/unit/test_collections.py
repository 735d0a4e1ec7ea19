"""requirements.yml names exactly the collections the repository uses, at the
versions installed; the deployment's preflight demands only what the playbooks need."""
import re
import subprocess
import sys

import yaml

from conftest import ROOT

FQCN = re.compile(r"\b([a-z_]+\.[a-z_]+)\.[a-z_]+\b")


def pinned():
    return {c["name"]: c["version"] for c in yaml.safe_load((ROOT / "requirements.yml").read_text())["collections"]}


def used_in(*patterns):
    """Collections named by a module, callback or plugin FQCN in these files."""
    found = set()
    for pattern in patterns:
        for path in ROOT.glob(pattern):
            text = path.read_text()
            found.update(m for m in FQCN.findall(text) if "." in m and m.split(".")[0] in ("ansible", "community")
                         and m not in ("ansible.builtin", "ansible.module_utils", "ansible.errors", "ansible.cfg",
                                       "ansible.plugins", "ansible.parsing", "ansible.utils", "ansible.template"))
    return found


def test_every_collection_used_is_pinned_and_none_more():
    used = used_in("roles/**/*.yml", "playbooks/*.yml", "site.yml", "ansible.cfg", "molecule/**/*.yml",
                   "tests/harness/**/*.yml", "inventories/**/*.yml")
    assert used == set(pinned()), "used: %s, pinned: %s" % (sorted(used), sorted(pinned()))


def test_the_deployment_needs_only_what_its_playbooks_use():
    deploy = used_in("roles/**/*.yml", "playbooks/*.yml", "site.yml", "ansible.cfg")
    required = set(yaml.safe_load((ROOT / "roles/preflight/defaults/main.yml").read_text())
                   ["preflight_required_collections"])
    assert required == deploy


def test_the_pins_are_the_installed_versions():
    galaxy = str(ROOT / ".venv" / "bin" / "ansible-galaxy")
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "check-collections.py"), galaxy],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
