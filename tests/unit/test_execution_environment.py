"""execution-environment.yml carries what the controller code needs, and
ansible-builder accepts it (building the image needs quay.io, PyPI and Galaxy,
which CI cannot reach; `ansible-builder create` writes the build context offline)."""
import ast
import subprocess
import sys

import yaml

from conftest import ROOT

EE = yaml.safe_load((ROOT / "execution-environment.yml").read_text())
# Import names of the distributions the EE installs.
IMPORT_NAMES = {"jinja2": "jinja2", "pyyaml": "yaml"}


def _imports(path):
    """(top-level modules, module_utils names) a Python file imports when it is
    loaded (imports inside functions run only where those functions do: gguf_model
    reads files with `gguf` on the hosts, never on the controller)."""
    top, utils = set(), set()
    statements, todo = [], list(ast.parse(path.read_text()).body)
    while todo:
        node = todo.pop()
        statements.append(node)
        if isinstance(node, (ast.If, ast.Try)):
            todo += node.body + node.orelse + getattr(node, "finalbody", [])
            todo += [stmt for handler in getattr(node, "handlers", []) for stmt in handler.body]
    for node in statements:
        if isinstance(node, ast.Import):
            top.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            top.add(node.module.split(".")[0])
            if node.module == "ansible.module_utils":
                utils.update(alias.name for alias in node.names)
            elif node.module.startswith("ansible.module_utils."):
                utils.add(node.module.split(".")[2])
    return top, utils


def controller_imports():
    """Top-level modules imported by the code Ansible runs on the controller: filter
    plugins and the module_utils they map, followed through module_utils (the
    modules themselves run on the hosts, with the host wheelhouse)."""
    todo = list(ROOT.glob("filter_plugins/*.py")) + list(ROOT.glob("roles/*/filter_plugins/*.py"))
    local = {p.stem for p in ROOT.glob("module_utils/*.py")}
    found, seen = set(), set()
    while todo:
        path = todo.pop()
        if path in seen:
            continue
        seen.add(path)
        top, utils = _imports(path)
        found |= top
        todo += [ROOT / "module_utils" / (name + ".py") for name in utils & local]
        # module_utils import each other as plain modules too (from plan_model import ...)
        todo += [ROOT / "module_utils" / (name + ".py") for name in top & local]
    assert len(seen) > 5, "the walk found too little to mean anything: %s" % seen
    return {name for name in found - local - {"__future__", "ansible"} if name not in sys.stdlib_module_names}


def test_every_third_party_import_of_the_controller_code_is_installed_by_the_ee():
    installed = {IMPORT_NAMES.get(line.split("==")[0].lower(), line.split("==")[0].lower())
                 for line in EE["dependencies"]["python"]}
    missing = controller_imports() - installed
    assert not missing, "the controller code imports %s, which execution-environment.yml does not install" % missing
    # the preflight role checks the same modules on a plain control node
    preflight = yaml.safe_load((ROOT / "roles/preflight/defaults/main.yml").read_text())
    assert set(preflight["preflight_controller_python_modules"]) <= installed


def test_the_ee_has_the_deployments_collections_at_the_pinned_versions():
    pins = {c["name"]: c["version"] for c in yaml.safe_load((ROOT / "requirements.yml").read_text())["collections"]}
    preflight = yaml.safe_load((ROOT / "roles/preflight/defaults/main.yml").read_text())
    ee = {c["name"]: c["version"] for c in EE["dependencies"]["galaxy"]["collections"]}
    assert set(ee) == set(preflight["preflight_required_collections"])
    assert all(pins[name] == version for name, version in ee.items())


def test_the_ee_runs_the_pinned_ansible_core():
    pinned = [line for line in (ROOT / "requirements.txt").read_text().splitlines() if line.startswith("ansible-core==")]
    assert EE["dependencies"]["ansible_core"]["package_pip"] == pinned[0]


def test_ansible_builder_accepts_it(tmp_path):
    builder = ROOT / ".venv" / "bin" / "ansible-builder"
    proc = subprocess.run([str(builder), "create", "-f", str(ROOT / "execution-environment.yml"), "-c", str(tmp_path)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    context = (tmp_path / "_build" / "requirements.yml").read_text()
    assert "ansible.posix" in context
