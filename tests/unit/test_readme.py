"""The README's role variable tables are generated from meta/argument_specs.yml."""
import subprocess
import sys

from conftest import ROOT


def test_role_variable_tables_are_current():
    result = subprocess.run([sys.executable, str(ROOT / "scripts" / "role-docs.py"), "--check"],
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


def test_every_role_is_documented_in_the_readme():
    readme = (ROOT / "README.md").read_text()
    for role in sorted(p.name for p in (ROOT / "roles").iterdir() if (p / "meta" / "argument_specs.yml").exists()):
        assert "<!-- role-vars: %s -->" % role in readme, "README.md has no variable table for role %s" % role
