# -*- coding: utf-8 -*-
# The boundary of the project's filters (issue 31): no input makes a filter print a
# traceback. Each plugin's FilterModule returns guard_filters({...}, kinds): every
# argument named in kinds is checked before the filter runs (a mapping, a list, a list
# of mappings, text; "?" allows an empty value, which the filters read as none), and
# the error names the filter, the argument, its value (a short repr) and what is
# expected. A malformed value deeper inside an argument (a plan whose memory is a
# list, a count that is a word) still stops the run with the project's own error
# naming the filter and what it could not read, never a TypeError traceback.
#
# Controller-side only (filter plugins): it imports ansible.errors, so no module may
# import it.
from __future__ import absolute_import, division, print_function

__metaclass__ = type

import functools
import inspect

try:
    from collections.abc import Mapping
except ImportError:  # pragma: no cover (Python 2)
    from collections import Mapping

from ansible.errors import AnsibleError, AnsibleFilterError

SHORT = 60
# What reading a malformed value inside an argument raises in plain Python code.
UNREADABLE = (TypeError, LookupError, AttributeError, ValueError, ArithmeticError, RecursionError, OSError)


class FilterInputError(AnsibleFilterError, ValueError):
    """A filter's input refused by name; also a ValueError, for callers that catch those."""


def short(value, limit=SHORT):
    """repr(value), cut to limit characters."""
    try:
        text = repr(value)
    except Exception:  # a repr that fails (an int of more digits than Python prints)
        text = "<%s>" % type(value).__name__
    return text if len(text) <= limit else text[:limit - 3] + "..."


def _is_list(value):
    return isinstance(value, (list, tuple))


def _as_list(value):
    """A lazy sequence (a generator from Jinja's map, dict values) as a list; else as it is."""
    if isinstance(value, (str, bytes, list, tuple, Mapping)) or value is None:
        return value
    try:
        return list(value)
    except TypeError:
        return value


_KINDS = {
    "dict": (lambda v: isinstance(v, Mapping), "a mapping"),
    "list": (_is_list, "a list"),
    "dicts": (lambda v: _is_list(v) and all(isinstance(item, Mapping) for item in v), "a list of mappings"),
    "texts": (lambda v: _is_list(v) and all(isinstance(item, str) for item in v), "a list of texts"),
    "text": (lambda v: isinstance(v, str), "text"),
}


def check(name, arg, value, kind):
    """value when it is of kind (see _KINDS; 'KIND?': or empty), else FilterInputError
    naming the filter, the argument, the value and what is expected."""
    optional = kind.endswith("?")
    test, expected = _KINDS[kind.rstrip("?")]
    value = _as_list(value)
    if optional and not value:
        return value
    if not test(value):
        raise FilterInputError("%s: %s must be %s%s, got %s"
                               % (name, arg, expected, " (or nothing)" if optional else "", short(value)))
    return value


def guard(name, function, kinds=None):
    """function as the filter name: its arguments checked against kinds ({argument: kind}),
    and a malformed value inside them refused by name instead of a traceback."""
    signature = inspect.signature(function)
    kinds = kinds or {}
    unknown = set(kinds) - set(signature.parameters)
    if unknown:
        raise ValueError("%s has no argument %s" % (name, ", ".join(sorted(unknown))))

    @functools.wraps(function)
    def run(*args, **kwargs):
        try:
            bound = signature.bind(*args, **kwargs)
        except TypeError as err:
            raise FilterInputError("%s: %s" % (name, err))
        for arg, kind in kinds.items():
            if arg in bound.arguments:
                bound.arguments[arg] = check(name, arg, bound.arguments[arg], kind)
        try:
            return function(*bound.args, **bound.kwargs)
        except AnsibleError:
            raise
        except UNREADABLE as err:
            raise FilterInputError("%s: a value inside its arguments is missing, of the wrong type or out of range "
                                   "(%s: %s); arguments: %s" % (
                                       name, type(err).__name__, short(str(err), 200),
                                       ", ".join("%s=%s" % (k, short(v)) for k, v in bound.arguments.items())))
    return run


def guard_filters(filters, kinds=None):
    """A FilterModule's {name: function}, each through guard (kinds: {name: {argument: kind}})."""
    kinds = kinds or {}
    unknown = set(kinds) - set(filters)
    if unknown:
        raise ValueError("no filter %s to guard" % ", ".join(sorted(unknown)))
    return dict((name, guard(name, function, kinds.get(name))) for name, function in filters.items())
