#!/usr/bin/env python3
"""Read the llama_server role's check-mode --diff output and print, as JSON, what its
systemd units would run: the drop-in's ExecStart and the Environment= of the unit
template and the drop-in (systemd applies both), for each instance (llama-server@<key>).

    unit_from_diff.py llama_server-check.log > units.json
"""
import json
import re
import shlex
import sys

AFTER = re.compile(r"^\+\+\+ after: (?P<path>\S+)")
TASK = re.compile(r"^TASK \[(?P<name>.*)\]")


def files_from_diff(text):
    """{(task name, template): content} of every file the diff shows as written: the '+' lines
    after '+++ after: <template source>' (the template module names its source, not its dest)."""
    files, path, lines, task = {}, None, [], ""
    for line in text.splitlines():
        match = TASK.match(line)
        if match:
            task = match.group("name")
        match = AFTER.match(line)
        if match:
            if path:
                files[path] = "\n".join(lines)
            path, lines = (task, match.group("path").rsplit("/", 1)[-1]), []
            continue
        if path is None:
            continue
        if line.startswith("@@"):
            continue
        if line.startswith("+"):
            lines.append(line[1:])
        elif line.startswith(" "):
            lines.append(line[1:])
        else:
            files[path] = "\n".join(lines)
            path, lines = None, []
    if path:
        files[path] = "\n".join(lines)
    return files


def systemd_words(value):
    """The words of an ExecStart=/Environment= value as systemd reads them: quotes and
    backslash escapes (shlex), then %% and $$ (the role escapes % and $ that way)."""
    return [word.replace("%%", "%").replace("$$", "$") for word in shlex.split(value)]


def service_lines(content, key):
    return [line.split("=", 1)[1] for line in content.splitlines() if line.startswith(key + "=")]


def units(text):
    files = files_from_diff(text)
    template = next((c for (_, src), c in files.items() if src.startswith("llama-server@.service")), "")
    out = {}
    for (task, src), content in sorted(files.items()):
        # "GPU 0", or "GPU 0 (small)" for a model after the first (llama-server@0-small); a
        # card's router for its models loaded on demand (router.conf): llama-server@0-router
        match = re.search(r"GPU (\d+)(?: \(([^)]+)\))?$", task)
        if not src.startswith(("plan.conf", "router.conf")) or not match:
            continue
        key = match.group(1) if not match.group(2) else "%s-%s" % (match.group(1), match.group(2))
        if src.startswith("router.conf"):
            key = "%s-router" % match.group(1)
        path = "/etc/systemd/system/llama-server@%s.service.d/plan.conf" % key
        exec_start = [v for v in service_lines(content, "ExecStart") if v]
        env = {}
        for value in service_lines(template, "Environment") + service_lines(content, "Environment"):
            for assignment in systemd_words(value):
                name, _, val = assignment.partition("=")
                env[name] = val
        out[key] = {"dropin": path, "exec_start": exec_start[-1] if exec_start else None,
                               "argv": systemd_words(exec_start[-1]) if exec_start else [],
                               "environment": env, "dropin_text": content}
        if src.startswith("router.conf"):
            # the models' preset it reads (--models-preset), written by the stage's copy task
            out[key]["preset_text"] = next((c for (_, name), c in files.items() if name == key + ".ini"), None)
    return out


if __name__ == "__main__":
    print(json.dumps(units(open(sys.argv[1]).read()), indent=2))
