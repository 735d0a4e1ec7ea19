# -*- coding: utf-8 -*-
"""Where a check on the host itself reaches a server that listens on `host`.

`llama_server_host | llm_fleet_local_url(port, scheme='http', what='llama_server_host')`:
a wildcard (0.0.0.0, ::) is probed on the loopback of its family, an IPv6 address in
brackets, any other address or name as it is (an instance bound to ::1 or to one
address of the host does not answer on 127.0.0.1).

Parsed strictly (issue 31): the host is an IP literal (IPv6 with or without its
brackets, a zone like %eth0 allowed) or a host name (letters, digits, - and _ in
dot-separated labels of at most 63, at most 253 in all); a port, a path, a query,
user info or an unbalanced bracket in it is refused. The port is a whole number from
1 to 65535 (an int, or a string of digits; not True, 8080.7 or "80x"). Errors name
`what` (the variable), the value and the fix."""
from __future__ import absolute_import, division, print_function

__metaclass__ = type

import ipaddress
import os
import re

import ansible.module_utils
from ansible.errors import AnsibleFilterError

# Ansible ships module_utils/ to modules only; the controller maps the
# repository's copy, so a plugin and a module share one definition.
_MODULE_UTILS = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "module_utils"))
if _MODULE_UTILS not in ansible.module_utils.__path__:
    ansible.module_utils.__path__.append(_MODULE_UTILS)

from ansible.module_utils.filter_input import guard_filters  # noqa: E402

_WILDCARD_V4 = ("", "0.0.0.0", "*")
_WILDCARD_V6 = ("::", "[::]")
_LABEL = re.compile(r"^[A-Za-z0-9_]([A-Za-z0-9_-]{0,61}[A-Za-z0-9_])?$")
_ZONE = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")
_DIGITS = re.compile(r"^[0-9]{1,5}$")
_SCHEMES = ("http", "https")


def _ipv6(text):
    """`text` as an IPv6 literal (a %zone allowed), or None."""
    address, _, zone = text.partition("%")
    if "%" in text and not _ZONE.match(zone):
        return None
    try:
        ipaddress.IPv6Address(address)
    except ValueError:
        return None
    return text


def _refuse(what, text, why, fix="give an IP address (10.0.0.5, ::1) or a host name, without port or path"):
    raise AnsibleFilterError("%s is %r: %s; %s." % (what, text, why, fix))


def llm_fleet_local_address(host, what="the listen address"):
    """The address a probe on the host itself uses for a server bound to `host`."""
    if host is None:
        host = ""
    if isinstance(host, bool) or not isinstance(host, str):
        _refuse(what, host, "it is a %s, not an address" % type(host).__name__)
    text = host.strip()
    if text in _WILDCARD_V4:
        return "127.0.0.1"
    if text in _WILDCARD_V6:
        return "[::1]"
    if text.startswith("[") or text.endswith("]"):
        if not (text.startswith("[") and text.endswith("]")) or not _ipv6(text[1:-1]):
            _refuse(what, text, "brackets hold an IPv6 address alone, and both must be there",
                    "write [::1] or ::1, and give the port separately")
        return text
    if _ipv6(text):
        return "[%s]" % text
    try:
        ipaddress.IPv4Address(text)
        return text
    except ValueError:
        pass
    for char, why in (("@", "it holds user info (@)"), ("/", "it holds a path (/)"), ("?", "it holds a query (?)"),
                      ("#", "it holds a fragment (#)"), (":", "it holds a port (:) or is not a valid IPv6 address")):
        if char in text:
            _refuse(what, text, why)
    name = text[:-1] if text.endswith(".") else text
    labels = name.split(".")
    if not name or len(name) > 253 or not all(_LABEL.match(label) for label in labels):
        _refuse(what, text, "it is neither an IP address nor a host name (labels of letters, digits, - and _, "
                            "at most 63 characters each)")
    if labels[-1].isdigit():
        _refuse(what, text, "it looks like an IPv4 address but is not a valid one")
    return text


def llm_fleet_port(port, what="the port"):
    """`port` as an int from 1 to 65535: an int or a string of digits."""
    if isinstance(port, bool) or not isinstance(port, (int, str)):
        number = None
    elif isinstance(port, str):
        number = int(port.strip()) if _DIGITS.match(port.strip()) else None
    else:
        number = port
    if number is None or not 0 < number < 65536:
        raise AnsibleFilterError("%s is %r, which is not a TCP port: give a whole number from 1 to 65535."
                                 % (what, port))
    return number


def llm_fleet_local_url(host, port, scheme="http", what="the listen address"):
    if scheme not in _SCHEMES:
        raise AnsibleFilterError("llm_fleet_local_url: the scheme is %r; give http or https." % (scheme,))
    address = llm_fleet_local_address(host, what)
    return "%s://%s:%d" % (scheme, address, llm_fleet_port(port, "llm_fleet_local_url: the port of %s" % what))


# `what` names the variable in every message: text
_KINDS = dict((name, {"what": "text"})
              for name in ("llm_fleet_local_address", "llm_fleet_port", "llm_fleet_local_url"))


class FilterModule(object):
    def filters(self):
        return guard_filters({"llm_fleet_local_address": llm_fleet_local_address,
                              "llm_fleet_local_url": llm_fleet_local_url, "llm_fleet_port": llm_fleet_port}, _KINDS)
