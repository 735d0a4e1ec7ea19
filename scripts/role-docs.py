#!/usr/bin/env python3
"""Write each role's variable table into README.md from its meta/argument_specs.yml.

argument_specs is the single source of truth for role variables (type, default,
description); the README shows them between markers:
    <!-- role-vars: ROLE -->  ...  <!-- /role-vars: ROLE -->
Usage: scripts/role-docs.py [--check]   (--check: exit 1 if README.md is stale)
"""
import os
import re
import sys

import yaml

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
README = os.path.join(ROOT, "README.md")
BLOCK = re.compile(r"(<!-- role-vars: (\S+) -->\n).*?(<!-- /role-vars: \2 -->)", re.S)


def cell(text):
    return " ".join(str(text).split()).replace("|", "\\|")


def table(role):
    with open(os.path.join(ROOT, "roles", role, "meta", "argument_specs.yml")) as handle:
        specs = yaml.safe_load(handle)["argument_specs"]
    rows = ["| Variable | Type | Default | Description |", "|---|---|---|---|"]
    for entry in specs.values():
        for name, opt in entry.get("options", {}).items():
            default = "-"  # no default in the spec: null, or computed (the description says)
            if "default" in opt:
                default = "`%s`" % cell(yaml.safe_dump(opt["default"], default_flow_style=True).strip()
                                       .removesuffix("...").strip())
            desc = opt.get("description", "")
            desc = " ".join(desc) if isinstance(desc, list) else desc
            kind = opt.get("type", "str") + (" of " + opt["elements"] if "elements" in opt else "")
            rows.append("| `%s` | %s | %s | %s |" % (name, kind, default, cell(desc)))
    return "\n".join(rows) + "\n"


def render(text):
    return BLOCK.sub(lambda m: m.group(1) + table(m.group(2)) + m.group(3), text)


def main():
    with open(README) as handle:
        text = handle.read()
    new = render(text)
    if "--check" in sys.argv:
        if new != text:
            print("README.md role variable tables are stale: run scripts/role-docs.py", file=sys.stderr)
            return 1
        return 0
    with open(README, "w") as handle:
        handle.write(new)
    return 0


if __name__ == "__main__":
    sys.exit(main())
