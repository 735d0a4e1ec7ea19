# -*- coding: utf-8 -*-
# Wait for a systemd unit's HTTP health URL, and stop waiting as soon as the unit's
# process has exited. A llama-server that cannot load its model (a bad flag, a
# truncated file, too little memory) exits at once, and with Restart=on-failure
# systemd starts it again every RestartSec: polling /health alone would wait out
# the whole load timeout (minutes for a 32 GB model) before the rollback starts.
# Python 3.8-compatible, standard library only.
from __future__ import absolute_import, division, print_function

__metaclass__ = type

import signal

# What `systemctl show` is asked for (all exist in systemd 245; NRestarts since 235).
PROPERTIES = ("LoadState", "ActiveState", "SubState", "NRestarts", "ExecMainCode", "ExecMainStatus")
# ExecMainCode is the siginfo code of the main process's end (CLD_* in <signal.h>).
_CLD_EXITED, _CLD_KILLED, _CLD_DUMPED = 1, 2, 3


class UnitStopped(Exception):
    """The unit's process exited while its health URL was awaited."""


class NotReady(Exception):
    """The health URL did not answer in time, and the unit still runs."""


def parse_show(text):
    """`systemctl show --property=...` output (Key=value lines) as a dict."""
    state = {}
    for line in text.splitlines():
        key, sep, value = line.partition("=")
        if sep:
            state[key.strip()] = value.strip()
    return state


def _int(value):
    try:
        return int(value)
    except (TypeError, ValueError):
        return 0


def _signal_name(number):
    try:
        return signal.Signals(number).name
    except ValueError:
        return "signal %d" % number


def how_it_ended(state):
    """The main process's last end, in words ('' when it has not ended)."""
    code, status = _int(state.get("ExecMainCode")), _int(state.get("ExecMainStatus"))
    if code == _CLD_EXITED:
        return "exited with status %d" % status
    if code == _CLD_KILLED:
        return "was killed by %s" % _signal_name(status)
    if code == _CLD_DUMPED:
        return "dumped core on %s" % _signal_name(status)
    return ""


def stopped(unit, first, now):
    """Why `unit` counts as stopped, comparing its state now with its state when the
    wait began; None while it runs (or loads)."""
    if now.get("LoadState") == "not-found":
        return "%s is not installed" % unit
    restarts = _int(now.get("NRestarts")) - _int(first.get("NRestarts"))
    active, sub = now.get("ActiveState", ""), now.get("SubState", "")
    if restarts <= 0 and active not in ("failed", "inactive") and sub != "auto-restart":
        return None
    ended = how_it_ended(now) or "stopped"
    detail = "ActiveState=%s, SubState=%s" % (active, sub)
    if restarts > 0:
        detail += ", restarted %d time(s) by systemd since the wait began" % restarts
    return "%s %s (%s)" % (unit, ended, detail)


def wait(unit, url, probe, read_state, timeout, delay, clock, sleep, hint="it may need longer"):
    """Poll `probe()` (an HTTP status, or None when nothing answered) every `delay` s
    until it gives 200, for at most `timeout` s. Raises UnitStopped as soon as
    `read_state()` (the unit's `systemctl show` dict) says the process exited, and
    NotReady at the deadline. Returns {"status", "waited", "polls"}."""
    first = read_state()
    start = clock()
    polls, status = 0, None
    while True:
        polls += 1
        status = probe()
        if status == 200:
            return {"status": status, "waited": round(clock() - start, 1), "polls": polls}
        why = stopped(unit, first, read_state())
        if why:
            raise UnitStopped("%s while %s was awaited, after %.0f s: its journal says why "
                              "(journalctl -u %s)" % (why, url, clock() - start, unit))
        if clock() - start >= timeout:
            last = "nothing answered" if status is None else "the last answer was %s" % status
            raise NotReady("%s did not answer 200 within %d s (%s); %s still runs: %s"
                           % (url, timeout, last, unit, hint))
        sleep(delay)
