#!/usr/bin/env python3
"""Write the generated sections of the documentation.

Two kinds of section, each between markers in README.md or docs/*.md:

    <!-- role-vars: ROLE -->  ...  <!-- /role-vars: ROLE -->
        the role's variable table, from roles/ROLE/meta/argument_specs.yml (the single
        source of truth for role variables: type, default, description);
    <!-- module-doc: MODULE -->  ...  <!-- /module-doc: MODULE -->
        a custom module's description, options and return values, from the DOCUMENTATION
        and RETURN YAML of library/MODULE.py or roles/*/library/MODULE.py.

    <!-- stage-roads -->  ...  <!-- /stage-roads -->
        in docs/stages.md: which files write each stage's fact and which roles read which
        of its keys (`llm_fleet_fact('X')`, `llm_fleet_stage_fact('X').key` in the roles),
        and every variable a role reads from another role that is not its dependency.

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
ROADS_BLOCK = re.compile(r"(<!-- stage-roads -->\n).*?(<!-- /stage-roads -->)", re.S)
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


JINJA = re.compile(r"\{\{.*?\}\}|\{%.*?%\}", re.S)
# keys whose string values are bare Jinja expressions
BARE_JINJA_KEYS = ("when", "that", "until", "changed_when", "failed_when")


def _expressions(node, bare=False):
    """The Jinja a parsed YAML node evaluates: {{ }} and {% %} in strings, and the
    bare expressions of when/that/until/changed_when/failed_when."""
    if isinstance(node, dict):
        return [e for key, value in node.items() for e in _expressions(value, key in BARE_JINJA_KEYS)]
    if isinstance(node, list):
        return [e for item in node for e in _expressions(item, bare)]
    if isinstance(node, str):
        return [node] if bare else JINJA.findall(node)
    return []


def _role_files(role):
    """(path, the Jinja it evaluates) of a role's tasks, handlers, defaults, vars and
    templates: what a role reads, not what its prose or comments mention."""
    out = []
    for path in sorted(glob.glob(os.path.join(ROOT, "roles", role, "**", "*"), recursive=True)):
        if not path.endswith((".yml", ".yaml", ".j2")) or path.endswith("argument_specs.yml"):
            continue
        with open(path) as handle:
            text = handle.read()
        if path.endswith(".j2"):
            code = JINJA.findall(re.sub(r"\{#.*?#\}", "", text, flags=re.S))
        else:
            code = _expressions(yaml.safe_load(text))
        out.append((os.path.relpath(path, ROOT), "\n".join(code)))
    return out


def roles():
    return sorted(r for r in os.listdir(os.path.join(ROOT, "roles")) if os.path.isdir(os.path.join(ROOT, "roles", r)))


def role_variables(role):
    """The variables a role owns: its defaults, vars and argument_specs options."""
    names = set()
    for name in ("defaults/main.yml", "vars/main.yml"):
        path = os.path.join(ROOT, "roles", role, name)
        if os.path.exists(path):
            with open(path) as handle:
                names |= set(yaml.safe_load(handle) or {})
    path = os.path.join(ROOT, "roles", role, "meta", "argument_specs.yml")
    if os.path.exists(path):
        with open(path) as handle:
            for entry in (yaml.safe_load(handle)["argument_specs"] or {}).values():
                names |= set((entry or {}).get("options") or {})
    return names


def role_dependencies(role):
    path = os.path.join(ROOT, "roles", role, "meta", "main.yml")
    with open(path) as handle:
        meta = yaml.safe_load(handle) or {}
    return set(d["role"] if isinstance(d, dict) else d for d in meta.get("dependencies") or [])


def role_dependencies_all(role):
    """A role's dependencies and theirs (fleet_common brings fleet_defaults)."""
    found, todo = set(), [role]
    while todo:
        for dep in role_dependencies(todo.pop()) - found:
            found.add(dep)
            todo.append(dep)
    return found


def cross_role_reads():
    """{(reading role, variable): [files]}: a variable of another role that is not
    one of the reader's dependencies (docs/stages.md: stages talk through facts)."""
    owners = {}
    for role in roles():
        for name in role_variables(role):
            owners.setdefault(name, set()).add(role)
    found = {}
    for role in roles():
        allowed = role_dependencies_all(role) | {role}
        for path, text in _role_files(role):
            # names, not the words of the string literals a message is made of
            code = re.sub(r"'[^'\n]*'|\"[^\"\n]*\"", "''", text)
            for name in set(re.findall(r"\b[a-z][a-z0-9_]*\b", code)):
                if name in owners and not owners[name] & allowed:
                    found.setdefault((role, name), []).append(path)
    return found


FACT_WRITE = re.compile(r"llm_fleet_fact\(['\"](\w+)['\"]")
FACT_READ = re.compile(r"llm_fleet_stage_fact\(['\"](\w+)['\"]\)\)?(?:\.(\w+)|\[['\"](\w+)['\"]\])?")


def stage_roads():
    """The generated section of docs/stages.md."""
    writers, readers = {}, {}
    for role in roles():
        for path, text in _role_files(role):
            for stage in FACT_WRITE.findall(text):
                writers.setdefault(stage, set()).add(path)
            for stage, attr, item in FACT_READ.findall(text):
                readers.setdefault(stage, {}).setdefault(role, set()).add(attr or item or "(the whole fact)")
    out = ["<!-- Generated by scripts/role-docs.py from the roles' code: do not edit. -->", "",
           "| Stage fact | Written by | Read by (role: keys) |", "|---|---|---|"]
    for stage in sorted(set(writers) | set(readers)):
        read = "; ".join("%s: %s" % (role, ", ".join("`%s`" % k for k in sorted(keys)))
                         for role, keys in sorted(readers.get(stage, {}).items()))
        out.append("| `%s` | %s | %s |" % (stage, ", ".join("`%s`" % p for p in sorted(writers.get(stage, ()))) or "-",
                                          read or "-"))
    reads = cross_role_reads()
    if not reads:
        out += ["", "No role reads a variable of another role that is not its dependency "
                "(`tests/unit/test_stage_roads.py` fails on one): what one stage hands to the next is in "
                "the facts above, and what several read is a fleet setting (`llm_fleet_*`, "
                "[fleet_defaults.md](fleet_defaults.md))."]
        return "\n".join(out) + "\n"
    out += ["", "Variables a role reads from another role that is not its dependency (%d; each one a "
            "seam to move into a fact or a fleet-wide setting, and "
            "`tests/unit/test_stage_roads.py` fails on a new one):" % len(reads), "",
            "| Reader | Variable (owner) | Where |", "|---|---|---|"]
    owners = dict((name, role) for role in roles() for name in role_variables(role))
    for (role, name), paths in sorted(reads.items()):
        out.append("| %s | `%s` (%s) | %s |" % (role, name, owners[name], ", ".join("`%s`" % p for p in sorted(paths))))
    return "\n".join(out) + "\n"


def render(text):
    text = ROADS_BLOCK.sub(lambda m: m.group(1) + stage_roads() + m.group(2), text)
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
