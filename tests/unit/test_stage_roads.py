"""Stages talk through their facts (docs/stages.md). The variables a role still reads
from another role that is not its dependency are a known debt, listed here one by one:
a new one fails this test (hand the value over in a fact, or give it one fleet-wide
home), and one paid off must be struck from the list. scripts/role-docs.py finds them in
the Jinja the roles evaluate ({{ }}, {% %}, when/that/until), not in prose or comments."""
import importlib.util

from conftest import ROOT

KNOWN = set()


def _role_docs():
    spec = importlib.util.spec_from_file_location("role_docs", ROOT / "scripts" / "role-docs.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_no_role_reads_another_role_s_variables_beyond_the_known_debt():
    found = _role_docs().cross_role_reads()
    new = sorted(set(found) - KNOWN)
    assert not new, "roles read other roles' variables (pass them in a fact instead): %s" % "; ".join(
        "%s reads %s in %s" % (role, name, ", ".join(found[(role, name)])) for role, name in new)
    paid = sorted(KNOWN - set(found))
    assert not paid, "no longer read, strike from KNOWN: %s" % paid


def test_the_scan_sees_a_read_and_ignores_prose(tmp_path, monkeypatch):
    """The scanner itself: a read in a when: or a {{ }} counts, the same name in a
    comment, in a message's words or in {# #} does not."""
    docs = _role_docs()
    roles = tmp_path / "roles"
    for role, files in {
        "alpha": {"defaults/main.yml": "alpha_port: 1\n", "meta/main.yml": "dependencies: []\n"},
        "beta": {"meta/main.yml": "dependencies: []\n",
                 "tasks/main.yml": "- name: Use it\n  debug:\n    msg: \"{{ 'see alpha_port' }}\"\n"
                                   "  when: alpha_port > 0\n# alpha_port in a comment\n",
                 "templates/x.j2": "{# alpha_port #}text alpha_port\n"},
        "gamma": {"meta/main.yml": "dependencies: []\n", "templates/y.j2": "port={{ alpha_port }}\n"},
    }.items():
        for name, text in files.items():
            path = roles / role / name
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
    monkeypatch.setattr(docs, "ROOT", str(tmp_path))
    found = docs.cross_role_reads()
    assert set(found) == {("beta", "alpha_port"), ("gamma", "alpha_port")}
    assert found[("beta", "alpha_port")] == ["roles/beta/tasks/main.yml"]


def test_no_role_still_defines_a_name_fleet_defaults_refuses():
    """fleet_defaults refuses the old names wherever they appear in `vars`, and a role's
    own defaults or vars are there too once the play loads it: a role that still defines
    one stops every run at the first play that carries both roles (the fleet's check
    mode found verify's verify_api_key_file this way)."""
    import yaml

    renamed = yaml.safe_load((ROOT / "roles/fleet_defaults/vars/main.yml").read_text())["fleet_defaults_renamed"]
    defined = {}
    for path in sorted((ROOT / "roles").glob("*/*/main.yml")):
        if path.parent.name in ("defaults", "vars") and path.parent.parent.name != "fleet_defaults":
            for name in yaml.safe_load(path.read_text()) or {}:
                defined.setdefault(name, []).append(str(path.relative_to(ROOT)))
    clash = {name: defined[name] for name in renamed if name in defined}
    assert not clash, "roles define names fleet_defaults refuses as moved (rename them): %s" % clash
