# -*- coding: utf-8 -*-
# The one way a module of this project fails: `fail(module, msg)` instead of
# `module.fail_json(msg=...)` (tests/unit/test_fleet_errors.py checks every module
# in library/ for it).
#
# Before the message leaves the host it is scrubbed of secrets: every value of a
# no_log option (a Hugging Face token, a mirror's header) and any other secret the
# caller names, in the forms a message can carry it (as it is, as repr() or JSON
# escape it: a token holding a newline comes back as 'a\nb', which Ansible's own
# no_log masking, looking for the raw value, misses; and line by line), the
# user:password of a URL, the value of an Authorization-like header or a signed
# URL's query parameter. The async job file Ansible writes holds the module's
# result, so it is scrubbed too. Python 3.8-compatible, standard library only.
#
# Named fleet_errors, not errors: ansible.module_utils.errors is ansible-core's own.
from __future__ import absolute_import, division, print_function

__metaclass__ = type

import json
import re
import sys
import traceback

REDACTED = "********"
# Shorter "secrets" would blank out ordinary words of a message.
MIN_SECRET_LENGTH = 3
# Header names whose values are credentials.
SECRET_HEADER = re.compile(r"(?i)^(cookie|set-cookie|.*(auth|token|secret|passw(or)?d|credential|signature|"
                           r"session).*|(.*[_-])?key)$")
_URL_USERINFO = re.compile(r"(?i)\b([a-z][a-z0-9+.-]*://)[^/\s@?#]*@")
_AUTH_SCHEME = re.compile(r"(?i)\b(bearer|basic|token|digest)(\s+)[A-Za-z0-9._~+/=:-]{4,}")
_SECRET_QUERY = re.compile(r"(?i)([?&](?:[a-z0-9_.-]*(?:token|secret|signature|sig|password|passwd|credential|"
                           r"key|auth)[a-z0-9_.-]*)=)[^&#\s'\"]*")
_HEADER_LINE = re.compile(r"(?im)\b((?:proxy-)?authorization|cookie|x-api-key)(\s*[:=]\s*)[^\r\n,;'\"}]+")


def _strings(value):
    """Every string inside `value` (dict values, list items), as a list."""
    if value is None or isinstance(value, bool):
        return []
    if isinstance(value, dict):
        out = []
        for item in value.values():
            out.extend(_strings(item))
        return out
    if isinstance(value, (list, tuple, set, frozenset)):
        out = []
        for item in value:
            out.extend(_strings(item))
        return out
    if isinstance(value, bytes):
        value = value.decode("utf-8", "replace")
    return [str(value)]


def secret_forms(secrets):
    """The texts to blank out for these secrets, longest first: each secret as it is,
    as repr() and JSON write it, and each of its lines."""
    forms = set()
    for text in _strings(list(secrets or [])):
        candidates = [text, repr(text)[1:-1], json.dumps(text)[1:-1], json.dumps(text, ensure_ascii=False)[1:-1]]
        candidates.extend(re.split(r"[\r\n]+", text))
        for form in candidates:
            form = form.strip()
            if len(form) >= MIN_SECRET_LENGTH:
                forms.add(form)
    return sorted(forms, key=len, reverse=True)


def scrub(text, secrets=()):
    """`text` with every secret blanked out (see the top of this file)."""
    if text is None:
        return None
    text = text if isinstance(text, str) else str(text)
    for form in secret_forms(secrets):
        text = text.replace(form, REDACTED)
    text = _URL_USERINFO.sub(lambda m: m.group(1) + REDACTED + "@", text)
    text = _AUTH_SCHEME.sub(lambda m: m.group(1) + m.group(2) + REDACTED, text)
    text = _SECRET_QUERY.sub(lambda m: m.group(1) + REDACTED, text)
    text = _HEADER_LINE.sub(lambda m: m.group(1) + m.group(2) + REDACTED, text)
    return text


def scrub_data(value, secrets=()):
    """A copy of `value` (dicts, lists, strings) with every string scrubbed."""
    if isinstance(value, dict):
        return dict((key, scrub_data(item, secrets)) for key, item in value.items())
    if isinstance(value, (list, tuple)):
        return [scrub_data(item, secrets) for item in value]
    if isinstance(value, str):
        return scrub(value, secrets)
    return value


def header_secrets(headers):
    """The values of `headers` (a dict) that are credentials by their name; every
    value of a no_log option is scrubbed anyway, this is for headers passed without."""
    return [value for key, value in (headers or {}).items() if SECRET_HEADER.match(str(key))]


def fail(module, msg, secrets=(), **kwargs):
    """module.fail_json with `msg` and every other value scrubbed of the module's
    no_log values and of `secrets`. A pending exception's traceback (which carries
    the unscrubbed message) is replaced by its scrubbed text."""
    known = list(secrets or []) + list(getattr(module, "no_log_values", None) or [])
    kwargs = scrub_data(kwargs, known)
    if "exception" not in kwargs and sys.exc_info()[1] is not None:
        kwargs["exception"] = scrub("".join(traceback.format_exception(*sys.exc_info())), known)
    module.fail_json(msg=scrub(msg, known), **kwargs)
