# -*- coding: utf-8 -*-
"""Has anything changed on a host since the last complete site.yml run?

A complete run (every stage, no --tags, no failure) ends by recording a stamp on
each host (/var/lib/llm-fleet/settled.json): the digest of what the controller
asked for (the project's code, the host's variables, the fleet's calibration) and
a fingerprint of what the host holds (the project's files, its units, the package
database, its GPUs: identity, tuning, health counters). The next run compares the
host with its stamp first; a host where nothing differs and every instance answers
its /health is settled, and site.yml's stages skip it (docs/upgrades.md,
"Reruns"). Anything that differs sends the host through every stage, as before.

The comparison errs on the side of running: an unreadable stamp, a file touched,
a package upgraded, a counter moved, a held card: the host is not settled.
Python 3.8-compatible, standard library only (NVML is handed in by the module)."""
from __future__ import absolute_import, division, print_function

__metaclass__ = type

import glob
import hashlib
import json
import os
import stat
import subprocess

STAMP_VERSION = 1
# Named in a reason when more than this many files differ.
_SHOWN = 3


class SettledError(Exception):
    pass


# --- The fingerprint of what the host holds ----------------------------------------

def _entry(path, st):
    """One path's metadata: kind, size, mode, owner, and its change times. A write,
    a rename over it, a chmod or chown all move ctime, which nothing but the kernel
    sets: content is not read (a model file is tens of GB)."""
    link = os.readlink(path) if stat.S_ISLNK(st.st_mode) else None
    return [stat.S_IFMT(st.st_mode), st.st_size if not stat.S_ISDIR(st.st_mode) else 0, stat.S_IMODE(st.st_mode),
            st.st_uid, st.st_gid, st.st_mtime_ns, st.st_ctime_ns, link]


def file_tree(patterns):
    """{path: entry} for every path under the directories and files the patterns
    (shell globs) match, symlinks not followed."""
    out = {}
    for pattern in patterns:
        for root in sorted(glob.glob(pattern)):
            try:
                out[root] = _entry(root, os.lstat(root))
            except OSError:
                continue
            if not os.path.isdir(root) or os.path.islink(root):
                continue
            for directory, dirs, files in os.walk(root):
                for name in dirs + files:
                    path = os.path.join(directory, name)
                    try:
                        out[path] = _entry(path, os.lstat(path))
                    except OSError:
                        continue
    return out


def file_digest(path):
    """sha256 of a file's content, None when it does not exist."""
    digest = hashlib.sha256()
    try:
        with open(path, "rb") as handle:
            for block in iter(lambda: handle.read(1 << 20), b""):
                digest.update(block)
    except (IOError, OSError):
        return None
    return digest.hexdigest()


def units(patterns, run=subprocess.run):
    """{unit: "active/sub enabled-state"} for the loaded units the patterns match
    (systemctl's own globs)."""
    if not patterns:
        return {}
    try:
        listed = run(["systemctl", "list-units", "--all", "--plain", "--no-legend", "--no-pager"] + list(patterns),
                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, universal_newlines=True)
    except OSError as err:
        raise SettledError("systemctl cannot run (%s): a host without systemd compares no units "
                           "(fleet_common_settled_units: [])" % err)
    if listed.returncode != 0:
        raise SettledError("systemctl list-units failed: %s" % listed.stderr.strip())
    states = {}
    for line in listed.stdout.splitlines():
        fields = line.split()
        if len(fields) >= 4 and fields[1] == "loaded":
            states[fields[0]] = "%s/%s" % (fields[2], fields[3])
    if states:
        names = sorted(states)
        enabled = run(["systemctl", "is-enabled"] + names, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                      universal_newlines=True)
        answers = enabled.stdout.split()
        if len(answers) == len(names):
            for name, answer in zip(names, answers):
                states[name] += " " + answer
    return states


def gpus(nvml, read_host, counters, current_state, drift, wanted, xid_journal=None):
    """What identifies the GPUs and what the stages set on them, by UUID: name, bus
    id, memory, persistence and power limit, the settings gpu_tuning's check finds
    drifted from what its config wants (`wanted`: uuid -> the config's entry; a clock
    is compared only where it is locked, an idle card's clock floats), the health
    counters the gate judges (gpu_health.counters), the names of the processes on the
    card. Raises read_host's NvmlUnavailable when NVML cannot answer."""
    host = read_host(nvml, xid_journal)
    out = {"driver_version": host["driver_version"], "lost": [g["index"] for g in host["lost_gpus"]], "gpus": {}}
    nvml.nvmlInit()
    try:
        for gpu in host["gpus"]:
            state = current_state(nvml, nvml.nvmlDeviceGetHandleByIndex(gpu["index"]))
            out["gpus"][gpu["uuid"]] = {
                "index": gpu["index"], "name": gpu["name"], "pci_bus_id": gpu["pci_bus_id"],
                "memory_total_bytes": gpu["memory_total_bytes"],
                "tuning": {"persistence": state["persistence"], "power_limit_w": state["power_limit_w"],
                           "drifted": drift(wanted[gpu["uuid"]], state) if gpu["uuid"] in wanted else None},
                "counters": counters(gpu["health"]),
                "processes": sorted(set(p["name"] or "?" for p in gpu["health"]["processes"])),
            }
    finally:
        try:
            nvml.nvmlShutdown()
        except Exception:  # noqa: BLE001 - shutting down is best effort, as read_host does
            pass
    return out


def kernel():
    return os.uname()[2]


def fingerprint(paths, unit_patterns, dpkg_status, gpu_state):
    """Everything the stamp holds about the host (gpu_state: gpus()'s answer)."""
    return {
        "kernel": kernel(),
        "packages": file_digest(dpkg_status),
        "files": file_tree(paths),
        "units": units(unit_patterns),
        "gpus": gpu_state,
    }


# --- The comparison ---------------------------------------------------------------

def _some(names):
    names = sorted(names)
    shown = ", ".join(names[:_SHOWN])
    return shown + (" and %d more" % (len(names) - _SHOWN) if len(names) > _SHOWN else "")


def differences(stamp, digest, now):
    """Why the host is not settled: [] when `now` (fingerprint()) is what `stamp`
    recorded under the same inputs `digest`."""
    if not isinstance(stamp, dict) or stamp.get("version") != STAMP_VERSION:
        return ["no stamp of a complete run (first run, a failed or partial run, or an older stamp)"]
    reasons = []
    if stamp.get("digest") != digest:
        reasons.append("what the controller asks for changed (the project's code, this host's variables or the "
                       "fleet's calibration)")
    if stamp.get("kernel") != now["kernel"]:
        reasons.append("the kernel is %s, it was %s" % (now["kernel"], stamp.get("kernel")))
    if stamp.get("packages") != now["packages"]:
        reasons.append("the package database changed (an upgrade, an install or a hold)")
    old, new = stamp.get("files") or {}, now["files"]
    gone = set(old) - set(new)
    added = set(new) - set(old)
    touched = set(p for p in set(old) & set(new) if old[p] != new[p])
    for what, names in (("gone", gone), ("new", added), ("changed", touched)):
        if names:
            reasons.append("files %s: %s" % (what, _some(names)))
    old_units, new_units = stamp.get("units") or {}, now["units"]
    for name in sorted(set(old_units) | set(new_units)):
        if old_units.get(name) != new_units.get(name):
            reasons.append("unit %s is %s, it was %s" % (name, new_units.get(name, "not loaded"),
                                                          old_units.get(name, "not loaded")))
    reasons.extend(_gpu_differences(stamp.get("gpus") or {}, now["gpus"] or {}))
    return reasons


def _gpu_differences(old, new):
    reasons = []
    if old.get("driver_version") != new.get("driver_version"):
        reasons.append("the driver is %s, it was %s" % (new.get("driver_version"), old.get("driver_version")))
    if new.get("lost"):
        reasons.append("NVML cannot reach GPU(s) %s" % ", ".join(str(i) for i in new["lost"]))
    old_gpus, new_gpus = old.get("gpus") or {}, new.get("gpus") or {}
    for uuid, gpu in sorted(new_gpus.items()):
        if gpu["tuning"].get("drifted"):
            reasons.append("GPU %s (%s) does not hold what gpu_tuning set: %s"
                           % (gpu["index"], uuid, ", ".join(gpu["tuning"]["drifted"])))
    for uuid in sorted(set(old_gpus) | set(new_gpus)):
        was, now = old_gpus.get(uuid), new_gpus.get(uuid)
        if was is None or now is None:
            reasons.append("GPU %s %s" % (uuid, "is new" if was is None else "is gone"))
            continue
        name = "GPU %s (%s)" % (now["index"], uuid)
        for key, what in (("index", "its index"), ("name", "its name"), ("pci_bus_id", "its bus id"),
                          ("memory_total_bytes", "its memory"), ("tuning", "its clocks, power or persistence"),
                          ("counters", "its health counters (ECC, retired pages, row remaps, Xids)"),
                          ("processes", "the processes on it")):
            if was.get(key) != now.get(key):
                reasons.append("%s: %s changed (%s, was %s)" % (name, what, _short(now.get(key)), _short(was.get(key))))
    return reasons


def _short(value):
    text = json.dumps(value, sort_keys=True)
    return text if len(text) <= 160 else text[:157] + "..."


# --- The stamp --------------------------------------------------------------------

def read_stamp(path):
    """The recorded stamp, None when there is none or it cannot be read."""
    try:
        with open(path) as handle:
            return json.load(handle)
    except (IOError, OSError, ValueError):
        return None


def write_stamp(path, digest, now, written):
    """Write the stamp atomically (a run cut short leaves the old one or none)."""
    stamp = dict(now, version=STAMP_VERSION, digest=digest, written=written)
    directory = os.path.dirname(path)
    if not os.path.isdir(directory):
        os.makedirs(directory, 0o755)
    temporary = path + ".tmp"
    with open(temporary, "w") as handle:
        json.dump(stamp, handle, sort_keys=True)
        handle.flush()
        os.fsync(handle.fileno())
    os.chmod(temporary, 0o600)
    os.rename(temporary, path)
    return stamp


def remove_stamp(path):
    """Forget the stamp; True when there was one."""
    try:
        os.unlink(path)
    except OSError:
        return False
    return True


# --- What the controller asks for -----------------------------------------------

def inputs_digest(root, code, variables, extra_files):
    """sha256 over the project's code (`code`: paths relative to `root`, each with its
    content, so two checkouts of one commit agree), the host's variables as defined
    (their text, templates unexpanded: sorted JSON), and files the run reads on the
    controller (the fleet's calibration; missing is a value too)."""
    digest = hashlib.sha256()
    for path in sorted(code):
        digest.update(("\0code\0%s\0" % path).encode())
        digest.update((file_digest(os.path.join(root, path)) or "missing").encode())
    digest.update(b"\0vars\0")
    digest.update(json.dumps(variables, sort_keys=True, default=str).encode())
    for path in extra_files:
        digest.update(("\0file\0%s\0" % path).encode())
        digest.update((file_digest(path) or "missing").encode())
    return digest.hexdigest()


def code_files(root, entries):
    """The files under root's entries (directories walked, files as they are), as
    paths relative to root; compiled Python and dot-files left out."""
    out = []
    for entry in entries:
        path = os.path.join(root, entry)
        if os.path.isfile(path):
            out.append(entry)
            continue
        for directory, dirs, files in os.walk(path):
            dirs[:] = sorted(d for d in dirs if not d.startswith(".") and d != "__pycache__")
            out.extend(os.path.relpath(os.path.join(directory, f), root) for f in sorted(files)
                       if not f.startswith(".") and not f.endswith((".pyc", ".pyo")))
    return out
