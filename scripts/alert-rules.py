#!/usr/bin/env python3
"""Writes dashboards/llm-fleet-alerts.yml: the fleet's Prometheus alert rules
(roles/prometheus/templates/llm-fleet-alerts.yml.j2) rendered as the prometheus stage
renders them, with the role's defaults (roles/prometheus/defaults/main.yml), for a
Prometheus of your own (its rule_files). Other thresholds or `for:` durations: --set.

    python3 scripts/alert-rules.py                  # rewrite the file
    python3 scripts/alert-rules.py --check          # exit 1 when the file is not current
    python3 scripts/alert-rules.py --set prometheus_alert_down_for=10m -o /etc/prometheus/llm-fleet-alerts.yml

Needs jinja2 and PyYAML (the project venv has both). tests/unit/test_alert_rules.py runs
--check, `promtool check rules` on the file and `promtool test rules` on its tests."""
import argparse
import os
import sys

import jinja2
import yaml

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ROLE = os.path.join(ROOT, "roles", "prometheus")
TEMPLATE = "llm-fleet-alerts.yml.j2"
OUT = os.path.join(ROOT, "dashboards", "llm-fleet-alerts.yml")


def defaults():
    """The role's alert variables (prometheus_alert_*), as defaults/main.yml sets them."""
    with open(os.path.join(ROLE, "defaults", "main.yml")) as f:
        values = yaml.safe_load(f)
    return dict((k, v) for k, v in values.items() if k.startswith("prometheus_alert_"))


def render(overrides=None):
    """The rules file, rendered as Ansible's template module does (trim_blocks, the final
    newline kept); a variable the template names and nobody set is an error."""
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(os.path.join(ROLE, "templates")),
                             trim_blocks=True, keep_trailing_newline=True, undefined=jinja2.StrictUndefined)
    values = defaults()
    values.update(overrides or {})
    return env.get_template(TEMPLATE).render(**values)


def main(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true",
                        help="exit 1 when %s is not current" % os.path.relpath(OUT, ROOT))
    parser.add_argument("--set", action="append", default=[], metavar="NAME=VALUE",
                        help="a role variable other than its default (a YAML value), "
                             "e.g. prometheus_alert_down_for=10m")
    parser.add_argument("-o", "--output", default=OUT, help="where to write it ('-': standard output)")
    args = parser.parse_args(argv)
    overrides = {}
    for item in args.set:
        name, sep, value = item.partition("=")
        if not sep or name not in defaults():
            parser.error("--set %s: use NAME=VALUE with one of %s" % (item, ", ".join(sorted(defaults()))))
        overrides[name] = yaml.safe_load(value)
    text = render(overrides)
    if args.check:
        current = open(OUT).read() if os.path.exists(OUT) else ""
        if current != text:
            print("%s is not current: run python3 scripts/alert-rules.py" % os.path.relpath(OUT, ROOT))
            return 1
        return 0
    if args.output == "-":
        sys.stdout.write(text)
        return 0
    with open(args.output, "w") as f:
        f.write(text)
    print("wrote %s" % args.output)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
