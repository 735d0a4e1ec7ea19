#!/usr/bin/env python3
"""Write the generated sections of the documentation.

Two kinds of section, each between markers in README.md or docs/*.md:

    <!-- role-vars: ROLE -->  ...  <!-- /role-vars: ROLE -->
        the role's variable table, from roles/ROLE/meta/argument_specs.yml (the single
        source of truth for role variables: type, default, description);
    <!-- module-doc: MODULE -->  ...  <!-- /module-doc: MODULE -->
        a custom module's description, options and return values, from the DOCUMENTATION
        and RETURN YAML of library/MODULE.py or roles/*/library/MODULE.py.

And one whole file per role, roles/ROLE/README.md (Galaxy's convention), from the same
argument_specs.yml and meta/main.yml: what the role does, its entry points, dependencies,
variables, an example play, and the stage page that explains it.

Usage: scripts/role-docs.py [--check]   (--check: exit 1, naming the files, if any is stale)
"""
import ast
import glob
import os
import re
import sys

import yaml

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ROLE_BLOCK = re.compile(r"(<!-- role-vars: (\S+) -->\n).*?(<!-- /role-vars: \2 -->)", re.S)
MODULE_BLOCK = re.compile(r"(<!-- module-doc: (\S+) -->\n).*?(<!-- /module-doc: \2 -->)", re.S)
# Ansible's documentation markup: C(code), I(option), B(bold), O(option), V(value), U(url), L(text,url)
MARKUP = re.compile(r"\b([CIBOVUL])\(([^()]*)\)")


def doc_files():
    """The files that may hold generated sections."""
    return [os.path.join(ROOT, "README.md")] + sorted(glob.glob(os.path.join(ROOT, "docs", "*.md")))


def module_files():
    """Every custom module: {name: path}."""
    paths = glob.glob(os.path.join(ROOT, "library", "*.py")) + glob.glob(os.path.join(ROOT, "roles", "*", "library",
                                                                                     "*.py"))
    return dict((os.path.splitext(os.path.basename(p))[0], p) for p in sorted(paths)
                if not os.path.basename(p).startswith("_"))


def _markup(match):
    kind, text = match.groups()
    if kind == "B":
        return "**%s**" % text
    if kind == "L":
        return text.split(",")[0]
    if kind == "U":
        return text
    return "`%s`" % text


def cell(text):
    if isinstance(text, list):
        text = " ".join(str(t) for t in text)
    return MARKUP.sub(_markup, " ".join(str(text).split())).replace("|", "\\|")


def flow(value):
    return yaml.safe_dump(value, default_flow_style=True).strip().removesuffix("...").strip()


def table(role):
    with open(os.path.join(ROOT, "roles", role, "meta", "argument_specs.yml")) as handle:
        specs = yaml.safe_load(handle)["argument_specs"]
    rows = ["| Variable | Type | Default | Description |", "|---|---|---|---|"]
    for entry in specs.values():
        for name, opt in entry.get("options", {}).items():
            default = "-"  # no default in the spec: null, or computed (the description says)
            if "default" in opt:
                default = "`%s`" % cell(flow(opt["default"]))
            kind = opt.get("type", "str") + (" of " + opt["elements"] if "elements" in opt else "")
            rows.append("| `%s` | %s | %s | %s |" % (name, kind, default, cell(opt.get("description", ""))))
    return "\n".join(rows) + "\n"


def module_yaml(path):
    """(DOCUMENTATION, RETURN) of a module file, parsed."""
    with open(path) as handle:
        tree = ast.parse(handle.read())
    found = {}
    for node in tree.body:
        if (isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name)
                and node.targets[0].id in ("DOCUMENTATION", "RETURN")):
            found[node.targets[0].id] = yaml.safe_load(node.value.value) or {}
    return found.get("DOCUMENTATION", {}), found.get("RETURN", {})


def _kind(spec):
    return str(spec.get("type", "str")) + (" of " + str(spec["elements"]) if "elements" in spec else "")


def _returns(values, prefix=""):
    rows = []
    for name, spec in (values or {}).items():
        spec = spec or {}
        full = prefix + name
        rows.append("| `%s` | %s | %s | %s |" % (full, _kind(spec), cell(spec.get("returned", "")),
                                                cell(spec.get("description", ""))))
        sub = full + ("[]." if spec.get("type") == "list" else ".")
        rows.extend(_returns(spec.get("contains"), sub))
    return rows


def module_section(name):
    path = module_files()[name]
    doc, ret = module_yaml(path)
    out = ["`%s`: %s" % (os.path.relpath(path, ROOT), cell(doc.get("short_description", ""))), ""]
    description = doc.get("description", [])
    for para in description if isinstance(description, list) else [description]:
        out += [cell(para), ""]
    if doc.get("requirements"):
        out += ["Requirements: %s." % cell("; ".join(str(r) for r in doc["requirements"])), ""]
    for note in doc.get("notes") or []:
        out += ["Note: %s" % cell(note), ""]
    options = doc.get("options") or {}
    if options:
        out += ["| Option | Type | Required | Default | Description |", "|---|---|---|---|---|"]
        for opt, spec in options.items():
            default = "`%s`" % cell(flow(spec["default"])) if "default" in spec else "-"
            desc = cell(spec.get("description", ""))
            if spec.get("choices"):
                desc += " One of: %s." % ", ".join("`%s`" % c for c in spec["choices"])
            out.append("| `%s` | %s | %s | %s | %s |" % (opt, _kind(spec), "yes" if spec.get("required") else "no",
                                                        default, desc))
    else:
        out.append("No options.")
    out.append("")
    rows = _returns(ret)
    if rows:
        out += ["| Returns | Type | Returned | Description |", "|---|---|---|---|"] + rows + [""]
    return "\n".join(out)


def stage_page(role):
    """The docs page holding the role's variable table (its stage page)."""
    for path in doc_files():
        with open(path) as handle:
            if "<!-- role-vars: %s -->" % role in handle.read():
                return os.path.relpath(path, ROOT)
    return None


def role_readme(role):
    base = os.path.join(ROOT, "roles", role)
    with open(os.path.join(base, "meta", "argument_specs.yml")) as handle:
        specs = yaml.safe_load(handle)["argument_specs"]
    with open(os.path.join(base, "meta", "main.yml")) as handle:
        meta = yaml.safe_load(handle) or {}
    main = specs.get("main", {})
    page = stage_page(role)
    out = ["<!-- Generated by scripts/role-docs.py from meta/argument_specs.yml and meta/main.yml: do not edit. -->",
           "# Role `%s`" % role, "", cell(main.get("short_description", "")), ""]
    description = main.get("description", [])
    for para in description if isinstance(description, list) else [description]:
        if para:
            out += [cell(para), ""]
    if page:
        out += ["How it works, what it records and how it is tested: [%s](../../%s)." % (page, page), ""]
    out += ["## Entry points", ""]
    for name, entry in specs.items():
        out.append("- `%s` (`tasks/%s.yml`): %s" % (name, name, cell(entry.get("short_description", ""))))
    deps = [d["role"] if isinstance(d, dict) else d for d in meta.get("dependencies") or []]
    out += ["", "## Dependencies", "", ", ".join("`%s`" % d for d in deps) if deps else "None.", "",
            "## Variables", "", table(role).rstrip("\n"), "",
            "## Example", "", "```yaml", "- hosts: gpu_servers", "  roles:", "    - role: %s" % role, "```", ""]
    return "\n".join(out)


def render(text):
    text = ROLE_BLOCK.sub(lambda m: m.group(1) + table(m.group(2)) + m.group(3), text)
    return MODULE_BLOCK.sub(lambda m: m.group(1) + module_section(m.group(2)) + m.group(3), text)


def main():
    stale = []
    for path in doc_files():
        with open(path) as handle:
            text = handle.read()
        new = render(text)
        if new == text:
            continue
        stale.append(os.path.relpath(path, ROOT))
        if "--check" not in sys.argv:
            with open(path, "w") as handle:
                handle.write(new)
    for role in sorted(os.listdir(os.path.join(ROOT, "roles"))):
        if not os.path.exists(os.path.join(ROOT, "roles", role, "meta", "argument_specs.yml")):
            continue
        path = os.path.join(ROOT, "roles", role, "README.md")
        new = role_readme(role)
        old = open(path).read() if os.path.exists(path) else None
        if new == old:
            continue
        stale.append(os.path.relpath(path, ROOT))
        if "--check" not in sys.argv:
            with open(path, "w") as handle:
                handle.write(new)
    if stale and "--check" in sys.argv:
        print("generated sections are stale in %s: run scripts/role-docs.py" % ", ".join(stale), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
