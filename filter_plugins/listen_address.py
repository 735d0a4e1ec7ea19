# -*- coding: utf-8 -*-
"""Where a check on the host itself reaches a server that listens on `host`.

`llama_server_host | llm_fleet_local_url(port)`: a wildcard (0.0.0.0, ::) is probed
on the loopback of its family, an IPv6 address in brackets, any other address or
name as it is (an instance bound to ::1 or to one address of the host does not
answer on 127.0.0.1)."""
from __future__ import absolute_import, division, print_function

__metaclass__ = type

from ansible.errors import AnsibleFilterError

_WILDCARD_V4 = ("", "0.0.0.0", "*")
_WILDCARD_V6 = ("::", "[::]")


def llm_fleet_local_address(host):
    text = str(host if host is not None else "").strip()
    if text in _WILDCARD_V4:
        return "127.0.0.1"
    if text in _WILDCARD_V6:
        return "[::1]"
    if text.startswith("[") and text.endswith("]"):
        return text
    if ":" in text:
        return "[%s]" % text
    return text


def llm_fleet_local_url(host, port, scheme="http"):
    try:
        port = int(port)
    except (TypeError, ValueError):
        port = -1
    if not 0 < port < 65536:
        raise AnsibleFilterError("llm_fleet_local_url: %r is not a TCP port" % (port,))
    return "%s://%s:%d" % (scheme, llm_fleet_local_address(host), port)


class FilterModule(object):
    def filters(self):
        return {"llm_fleet_local_address": llm_fleet_local_address, "llm_fleet_local_url": llm_fleet_local_url}
