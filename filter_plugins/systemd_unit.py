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
- `name | systemd_user(what, allow_root=false)`: a User=/Group= name; `root` only when
  allow_root is true (a service that runs as root says so where it is written)

Anything with a control character (newline, carriage return, tab, NUL, ...) is
refused, naming the value and `what` it was. So is a value that is not a string or a
number (None, a list or mapping inside the arguments, bytes, a boolean: they used to be
rendered as words, "None", "[1, 2]", "b'x'"), a `$` in the executable's path (systemd
245 does not expand variables there, so `$$` would stay in the path), and a value
that would make its line longer than systemd reads: LONG_LINE_MAX, 1 MiB in systemd
245 (src/basic/fileio.h) as today; a longer line fails the whole unit to load. Quoting and escapes follow
systemd.service(5) "Command lines" and systemd.unit(5) "Specifiers", which
systemd 245 (Ubuntu 20.04) already implements.
"""
from __future__ import absolute_import, division, print_function

__metaclass__ = type

import os
import re

try:
    from collections.abc import Mapping
except ImportError:  # pragma: no cover - Python 2
    from collections import Mapping

import ansible.module_utils
from ansible.errors import AnsibleFilterError

# Ansible ships module_utils/ to modules only; the controller maps the
# repository's copy, so a plugin and a module share one definition.
_MODULE_UTILS = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "module_utils"))
if _MODULE_UTILS not in ansible.module_utils.__path__:
    ansible.module_utils.__path__.append(_MODULE_UTILS)

from ansible.module_utils.filter_input import guard_filters  # noqa: E402

# Characters a word may hold without quotes (after % and $ are doubled).
_BARE = re.compile(r"^[A-Za-z0-9_@+=:,./%$-]+$")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_USER = re.compile(r"^[a-z_][a-z0-9_-]{0,31}$")
# Paths in settings that split on whitespace and take no quotes on systemd 245.
_PATH = re.compile(r"^/[^\s\"'\\]*$")
# systemd's LONG_LINE_MAX (src/basic/fileio.h, 1 MiB since long before 245).
LONG_LINE_MAX = 1024 * 1024
# What one value may take of a line: the rest is its key (ExecStart=) and the executable.
VALUE_MAX = LONG_LINE_MAX - 8192


def _text(value, what):
    """A scalar as its text; anything else is refused by name."""
    if isinstance(value, bool) or value is None or not isinstance(value, (str, int, float)):
        kind = "a boolean" if isinstance(value, bool) else "null (None)" if value is None \
            else "a %s" % type(value).__name__
        raise AnsibleFilterError("%s is %s (%s), not a string or a number: in a systemd unit it would be written as "
                                 "the word %r. Give the value itself (a list of arguments is flat)."
                                 % (what, kind, _shorten(value), str(value)[:40]))
    if isinstance(value, float) and value != value or value in (float("inf"), float("-inf")):
        raise AnsibleFilterError("%s is %r: give a finite number." % (what, value))
    return str(value)


def _shorten(value, limit=80):
    text = repr(value)
    return text if len(text) <= limit else "%s... (%d characters)" % (text[:limit], len(text))


def _refuse_long(text, what):
    if len(text) > VALUE_MAX:
        raise AnsibleFilterError("%s is %d bytes long: systemd refuses unit file lines over %d bytes (LONG_LINE_MAX), "
                                 "and the whole unit then fails to load. Shorten it (a long value belongs in a file "
                                 "the service reads)." % (what, len(text), LONG_LINE_MAX))
    return text


def _refuse_control(value, what):
    text = _text(value, what)
    if _CONTROL.search(text):
        raise AnsibleFilterError(
            "%s is %s, which holds a control character (a newline, tab, ...): in a systemd unit it would "
            "end the line and start a directive of its own. Remove it." % (what, _shorten(text)))
    return _refuse_long(text, what)


def _specifiers(text):
    return text.replace("%", "%%")


def systemd_exec_args(args, what="an argument of the command line"):
    """The words of an ExecStart= line after the executable, each one argument
    to the process exactly as given."""
    if isinstance(args, (str, bytes, Mapping)) or not hasattr(args, "__iter__"):
        raise AnsibleFilterError("%s: systemd_exec_args takes a list of arguments, got %s"
                                 % (what, _shorten(args)))
    words = []
    for index, arg in enumerate(args):
        text = _refuse_control(arg, "%s (argument %d)" % (what, index + 1))
        escaped = _specifiers(text).replace("$", "$$")
        if _BARE.match(escaped):
            words.append(escaped)
        else:
            words.append('"%s"' % escaped.replace("\\", "\\\\").replace('"', '\\"'))
    return _refuse_long(" ".join(words), "%s (all arguments together)" % what)


def systemd_exec_path(path, what="the executable"):
    """The executable of an ExecStart= line: an absolute path without spaces or
    quotes (systemd 245 takes the first word as it is)."""
    text = _refuse_control(path, what)
    if not _PATH.match(text):
        raise AnsibleFilterError("%s is %s: it must be an absolute path without spaces or quotes."
                                 % (what, _shorten(text)))
    if "$" in text:
        raise AnsibleFilterError("%s is %s: a $ in the executable's path is not expanded by systemd 245 (and $$ "
                                 "would stay in the path); give the path without $." % (what, _shorten(text)))
    return _specifiers(text)


def systemd_env(name, value, what="an environment variable"):
    """One Environment= assignment, NAME=value in double quotes."""
    name = _refuse_control(name, what)
    if not _ENV_NAME.match(name):
        raise AnsibleFilterError("%s has the name %s: environment variable names are letters, digits and _, "
                                 "not starting with a digit." % (what, _shorten(name)))
    text = _refuse_control(value, "%s %s" % (what, name))
    return _refuse_long('"%s=%s"' % (name, _specifiers(text).replace("\\", "\\\\").replace('"', '\\"')),
                        "%s %s" % (what, name))


def systemd_path(path, what="a path"):
    """An absolute path for WorkingDirectory=, ReadWritePaths=, Documentation=file://..."""
    text = _refuse_control(path, what)
    if not _PATH.match(text):
        raise AnsibleFilterError("%s is %s: it must be an absolute path without spaces, quotes or "
                                 "backslashes." % (what, _shorten(text)))
    return _specifiers(text)


def systemd_line(text, what="a value"):
    """Text for a comment line: one line, as it is."""
    return _refuse_control("" if text is None else text, what)


def systemd_user(name, what="a user name", allow_root=False):
    """A User=/Group= name. root (every privilege) only with allow_root=true."""
    text = _refuse_control(name, what)
    if not _USER.match(text):
        raise AnsibleFilterError("%s is %s: a system user name is lower-case letters, digits, _ and -, "
                                 "starting with a letter or _, at most 32 characters." % (what, _shorten(text)))
    if text == "root" and allow_root is not True:
        raise AnsibleFilterError("%s is root: the service would run with every privilege. Give it a user of its own "
                                 "(the role's default), or, where root is really meant, pass allow_root=true to "
                                 "systemd_user." % what)
    return text


# `what` names the variable in every message: text
_KINDS = dict((name, {"what": "text"}) for name in (
    "systemd_exec_args", "systemd_exec_path", "systemd_env", "systemd_path", "systemd_line", "systemd_user"))


class FilterModule(object):
    def filters(self):
        return guard_filters({
            "systemd_exec_args": systemd_exec_args,
            "systemd_exec_path": systemd_exec_path,
            "systemd_env": systemd_env,
            "systemd_path": systemd_path,
            "systemd_line": systemd_line,
            "systemd_user": systemd_user,
        }, _KINDS)
