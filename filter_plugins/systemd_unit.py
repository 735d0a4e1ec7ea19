# -*- coding: utf-8 -*-
"""Values written into systemd unit files, for every role that writes one.

A unit file is line-based and systemd expands `%` specifiers in most settings and
`$VAR` in command lines, so a value taken from the inventory, a plan or a model's
name could otherwise add directives (a newline followed by `ExecStartPre=+...`,
a root command) or change meaning (`%i`, `$HOME`). Every value goes through one
of these filters:

- `args | systemd_exec_args(what)`: the arguments of an ExecStart= line, one word each
  (quoted when needed; `%` -> `%%`, `$` -> `$$`, `\\` and `"` escaped)
- `path | systemd_exec_path(what)`: the executable of an ExecStart= line (absolute)
- `name | systemd_env(value, what)`: one Environment= assignment, quoted
- `path | systemd_path(what)`: an absolute path in WorkingDirectory=, ReadWritePaths=, ...
- `text | systemd_line(what)`: text on a comment line (one line, nothing else)
- `name | systemd_user(what)`: a User=/Group= name

Anything with a control character (newline, carriage return, tab, NUL, ...) is
refused, naming the value and `what` it was. Quoting and escapes follow
systemd.service(5) "Command lines" and systemd.unit(5) "Specifiers", which
systemd 245 (Ubuntu 20.04) already implements.
"""
from __future__ import absolute_import, division, print_function

__metaclass__ = type

import re

from ansible.errors import AnsibleFilterError

# Characters a word may hold without quotes (after % and $ are doubled).
_BARE = re.compile(r"^[A-Za-z0-9_@+=:,./%$-]+$")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_USER = re.compile(r"^[a-z_][a-z0-9_-]{0,31}$")
# Paths in settings that split on whitespace and take no quotes on systemd 245.
_PATH = re.compile(r"^/[^\s\"'\\]*$")


def _refuse_control(value, what):
    text = str(value)
    if _CONTROL.search(text):
        raise AnsibleFilterError(
            "%s is %r, which holds a control character (a newline, tab, ...): in a systemd unit it would "
            "end the line and start a directive of its own. Remove it." % (what, text))
    return text


def _specifiers(text):
    return text.replace("%", "%%")


def systemd_exec_args(args, what="an argument of the command line"):
    """The words of an ExecStart= line after the executable, each one argument
    to the process exactly as given."""
    if isinstance(args, (str, bytes)) or not hasattr(args, "__iter__"):
        raise AnsibleFilterError("systemd_exec_args takes a list of arguments, got %r" % (args,))
    words = []
    for arg in args:
        text = _refuse_control(arg, what)
        escaped = _specifiers(text).replace("$", "$$")
        if _BARE.match(escaped):
            words.append(escaped)
        else:
            words.append('"%s"' % escaped.replace("\\", "\\\\").replace('"', '\\"'))
    return " ".join(words)


def systemd_exec_path(path, what="the executable"):
    """The executable of an ExecStart= line: an absolute path without spaces or
    quotes (systemd 245 takes the first word as it is)."""
    text = _refuse_control(path, what)
    if not _PATH.match(text):
        raise AnsibleFilterError("%s is %r: it must be an absolute path without spaces or quotes." % (what, text))
    return _specifiers(text).replace("$", "$$")


def systemd_env(name, value, what="an environment variable"):
    """One Environment= assignment, NAME=value in double quotes."""
    name = _refuse_control(name, what)
    if not _ENV_NAME.match(name):
        raise AnsibleFilterError("%s has the name %r: environment variable names are letters, digits and _, "
                                 "not starting with a digit." % (what, name))
    text = _refuse_control(value, "%s %s" % (what, name))
    return '"%s=%s"' % (name, _specifiers(text).replace("\\", "\\\\").replace('"', '\\"'))


def systemd_path(path, what="a path"):
    """An absolute path for WorkingDirectory=, ReadWritePaths=, Documentation=file://..."""
    text = _refuse_control(path, what)
    if not _PATH.match(text):
        raise AnsibleFilterError("%s is %r: it must be an absolute path without spaces, quotes or "
                                 "backslashes." % (what, text))
    return _specifiers(text)


def systemd_line(text, what="a value"):
    """Text for a comment line: one line, as it is."""
    return _refuse_control("" if text is None else text, what)


def systemd_user(name, what="a user name"):
    text = _refuse_control(name, what)
    if not _USER.match(text):
        raise AnsibleFilterError("%s is %r: a system user name is lower-case letters, digits, _ and -, "
                                 "starting with a letter or _, at most 32 characters." % (what, text))
    return text


class FilterModule(object):
    def filters(self):
        return {
            "systemd_exec_args": systemd_exec_args,
            "systemd_exec_path": systemd_exec_path,
            "systemd_env": systemd_env,
            "systemd_path": systemd_path,
            "systemd_line": systemd_line,
            "systemd_user": systemd_user,
        }
