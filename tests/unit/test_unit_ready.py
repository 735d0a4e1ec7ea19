"""The health wait of llama-server's gate (module_utils/unit_ready.py, library/unit_ready.py):
it returns on a 200, fails at once when the unit's process exited, and times out only
while the unit still runs. The `systemctl show` outputs were recorded from systemd 252
(Debian 12) and 247 (Debian 11), which printed them identically, for a unit with
Restart=on-failure RestartSec=5 whose process exits 3, and one killed by SIGKILL."""
import http.server
import os
import sys
import threading

import pytest

from conftest import ROOT, run_module

sys.path.insert(0, str(ROOT / "module_utils"))
import unit_ready  # noqa: E402

UNIT = "llama-server@0.service"
URL = "http://127.0.0.1:8080/health"

RUNNING = """NRestarts=0
ExecMainCode=0
ExecMainStatus=0
LoadState=loaded
ActiveState=active
SubState=running
"""
# 1 s later the process exited 3; systemd waits RestartSec before starting it again
EXITED_WAITING = """NRestarts=0
ExecMainCode=1
ExecMainStatus=3
LoadState=loaded
ActiveState=activating
SubState=auto-restart
"""
# it was started again (and is running, or exited again)
RESTARTED_RUNNING = """NRestarts=1
ExecMainCode=1
ExecMainStatus=3
LoadState=loaded
ActiveState=active
SubState=running
"""
KILLED = """NRestarts=0
ExecMainCode=2
ExecMainStatus=9
LoadState=loaded
ActiveState=activating
SubState=auto-restart
"""
STOPPED = """NRestarts=0
ExecMainCode=0
ExecMainStatus=0
LoadState=loaded
ActiveState=inactive
SubState=dead
"""
MISSING = """NRestarts=0
ExecMainCode=0
ExecMainStatus=0
LoadState=not-found
ActiveState=inactive
SubState=dead
"""


class Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now

    def sleep(self, seconds):
        self.now += seconds


def run(answers, states, timeout=30, delay=2):
    """wait() over scripted answers of /health and states of the unit (the last repeats)."""
    clock = Clock()
    answers, states = list(answers), [unit_ready.parse_show(s) for s in states]

    def probe():
        return answers.pop(0) if len(answers) > 1 else answers[0]

    def read_state():
        return states.pop(0) if len(states) > 1 else states[0]

    return unit_ready.wait(UNIT, URL, probe, read_state, timeout, delay, clock, clock.sleep,
                           "raise llama_server_health_timeout_base"), clock


def test_the_recorded_output_parses():
    state = unit_ready.parse_show(EXITED_WAITING)
    assert state["SubState"] == "auto-restart" and state["ExecMainStatus"] == "3"


def test_a_unit_that_answers_after_loading_passes():
    result, clock = run([None, 503, 503, 200], [RUNNING])
    assert result == {"status": 200, "waited": 6.0, "polls": 4}


def test_a_process_that_exits_while_loading_fails_at_the_first_poll_after():
    with pytest.raises(unit_ready.UnitStopped) as err:
        run([None, 503, None], [RUNNING, RUNNING, EXITED_WAITING], timeout=600)
    message = str(err.value)
    assert message.startswith("llama-server@0.service exited with status 3 (ActiveState=activating, "
                              "SubState=auto-restart)")
    assert "after 2 s" in message and "journalctl -u llama-server@0.service" in message


def test_a_restart_between_two_polls_is_seen_by_the_count():
    """systemd restarted it between two polls: it runs again, but it is not the process the gate started."""
    with pytest.raises(unit_ready.UnitStopped) as err:
        run([503], [RUNNING, RUNNING, RESTARTED_RUNNING], timeout=600)
    assert "restarted 1 time(s) by systemd since the wait began" in str(err.value)


def test_restarts_before_the_wait_do_not_count():
    result, _ = run([503, 200], [RESTARTED_RUNNING])
    assert result["status"] == 200


@pytest.mark.parametrize("state, words", [
    (KILLED, "was killed by SIGKILL"),
    (STOPPED, "stopped (ActiveState=inactive, SubState=dead)"),
    (MISSING, "llama-server@0.service is not installed"),
])
def test_how_the_unit_ended_is_named(state, words):
    with pytest.raises(unit_ready.UnitStopped) as err:
        run([None], [state])
    assert words in str(err.value)


def test_a_unit_still_loading_at_the_deadline_times_out_naming_the_variable():
    with pytest.raises(unit_ready.NotReady) as err:
        run([503], [RUNNING], timeout=10)
    assert str(err.value) == (
        "http://127.0.0.1:8080/health did not answer 200 within 10 s (the last answer was 503); "
        "llama-server@0.service still runs: raise llama_server_health_timeout_base")


def test_nothing_answering_is_said_so():
    with pytest.raises(unit_ready.NotReady) as err:
        run([None], [RUNNING], timeout=4)
    assert "(nothing answered)" in str(err.value)


# --- the module: a real HTTP server, systemctl replaying the recordings above -------------

@pytest.fixture
def health_server():
    """/health answers 503 twice (loading), then 200; the answers are counted."""
    asked = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 - the name http.server calls
            asked.append(self.path)
            self.send_response(503 if len(asked) <= 2 else 200)
            self.end_headers()

        def log_message(self, *args):
            pass

    server = http.server.HTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield "http://127.0.0.1:%d/health" % server.server_port, asked
    server.shutdown()


def fake_systemctl(tmp_path, output):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (tmp_path / "show.txt").write_text(output)
    script = bin_dir / "systemctl"
    script.write_text('#!/bin/sh\n[ "$1" = show ] || exit 1\ncat %s\n' % (tmp_path / "show.txt"))
    script.chmod(0o755)
    return dict(os.environ, PATH="%s:%s" % (bin_dir, os.environ["PATH"]))


def test_the_module_waits_through_503_for_the_200(tmp_path, health_server):
    url, asked = health_server
    result = run_module("unit_ready", {"url": url, "unit": UNIT, "timeout": 20, "delay": 1},
                        env=fake_systemctl(tmp_path, RUNNING))
    assert not result.get("failed"), result
    assert (result["status"], result["polls"], len(asked)) == (200, 3, 3)


def test_the_module_fails_at_once_for_a_process_that_exited(tmp_path, health_server):
    url, asked = health_server
    result = run_module("unit_ready", {"url": url, "unit": UNIT, "timeout": 600, "delay": 1},
                        env=fake_systemctl(tmp_path, EXITED_WAITING))
    assert result["failed"] and result["msg"].startswith("llama-server@0.service exited with status 3")
    assert len(asked) == 1
