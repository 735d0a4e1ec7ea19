"""The one way tests, benchmarks and scenario helpers import project code.

A script outside tests/harness puts this directory on sys.path, once:

    sys.path.insert(0, str(Path(__file__).resolve().parents[N] / "tests" / "harness"))
    import paths  # noqa: E402
    paths.use_module_utils()   # only where module_utils/ is needed

(tests/unit/conftest.py does the first line for every unit test), then imports
harness modules by name (`import gguf_writer`) and project code through:

- use_module_utils(): module_utils/ mapped into ansible.module_utils, as Ansible
  packages it on a host (`from ansible.module_utils.gguf_model import read_model`);
- load_file(name, path): a script or plugin that is not a package module
  (filter plugins, scripts/*.py), loaded from its path.
"""
import importlib.util
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
HARNESS = ROOT / "tests" / "harness"
MODULE_UTILS = ROOT / "module_utils"

if str(HARNESS) not in sys.path:
    sys.path.insert(0, str(HARNESS))


def use_module_utils():
    """Map module_utils/ into ansible.module_utils (idempotent)."""
    import ansible.module_utils
    if str(MODULE_UTILS) not in ansible.module_utils.__path__:
        ansible.module_utils.__path__.append(str(MODULE_UTILS))


def load_file(name, path):
    """Load the Python file at path (relative to the repository root or absolute) as module name."""
    spec = importlib.util.spec_from_file_location(name, str(ROOT / path))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
