"""The generated documentation sections are current: each role's variable table on its
stage's page (from meta/argument_specs.yml) and each custom module's section in
docs/modules.md (from its DOCUMENTATION and RETURN), both written by scripts/role-docs.py."""
import importlib.util
import subprocess
import sys

from conftest import ROOT

SCRIPT = ROOT / "scripts" / "role-docs.py"
# The stage is called model, its role llm_model; every other page is named after its role.
PAGES = {"llm_model": "model"}


def _role_docs():
    spec = importlib.util.spec_from_file_location("role_docs", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_generated_sections_are_current():
    result = subprocess.run([sys.executable, str(SCRIPT), "--check"], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


def test_every_role_has_its_variable_table_on_its_stage_page():
    for role in sorted(p.name for p in (ROOT / "roles").iterdir() if (p / "meta" / "argument_specs.yml").exists()):
        page = ROOT / "docs" / ("%s.md" % PAGES.get(role, role))
        assert page.exists(), "no docs page %s for role %s" % (page.relative_to(ROOT), role)
        assert "<!-- role-vars: %s -->" % role in page.read_text(), (
            "%s has no variable table for role %s" % (page.relative_to(ROOT), role))


def test_every_custom_module_has_a_section():
    modules = _role_docs().module_files()
    assert {"gguf_info", "gpu_settings", "llama_plan", "model_fetch", "nvidia_gpu_facts"} <= set(modules)
    text = (ROOT / "docs" / "modules.md").read_text()
    for name in modules:
        assert "<!-- module-doc: %s -->" % name in text, "docs/modules.md has no section for module %s" % name


def test_check_fails_on_a_stale_table():
    role_docs = _role_docs()
    text = (ROOT / "docs" / "verify.md").read_text()
    stale = text.replace("| `verify_llama_bench` | bool | `true` |", "| `verify_llama_bench` | bool | `false` |")
    assert stale != text
    assert role_docs.render(stale) == text


def test_readme_links_every_stage_page():
    readme = (ROOT / "README.md").read_text()
    for page in ("preflight", "nvidia_stack", "gpu_tuning", "llama_cpp", "model", "llama_server", "frontend",
                 "verify", "fleet_common", "fleet_defaults", "stages", "modules"):
        assert "docs/%s.md" % page in readme, "README.md does not link docs/%s.md" % page
