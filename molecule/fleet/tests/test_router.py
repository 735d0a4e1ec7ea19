"""llama-server's router with the preset module_utils/llama_flags.py writes (issue 35,
models loaded on demand): what the planner relies on, checked against the real binary
the fleet built. On the 32 GB host, beside its running instance (left untouched), a
router is started by hand on a spare port with two sections made from that instance's
own command line: the tiny model and the second one of the model mirror. It lists both
unloaded and holds no child; a request naming one starts a child with every flag of its
section and answers; with --models-max 1, a request naming the other stops the first
child (the least recently used) before answering. The router and its children are
stopped at the end (a transient systemd unit holds them)."""
import base64
import os
import re
import sys
import time

import pytest

from hostprobe import node, only_in_scenario
from test_llama_server import ONE_GPU, cmdline, http, main_pid

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
sys.path.insert(0, REPO)
from module_utils.llama_flags import ROUTER_OWNED, preset_options, router_preset  # noqa: E402

pytestmark = only_in_scenario("fleet")

PORT = 18990
PRESET = "/var/lib/llm-fleet-router-test.ini"
UNIT = "llm-fleet-router-test"
SECOND = "/srv/models/tiny-second-f32.gguf"
NAMES = ("tiny-a", "tiny-b")


def _with(args, name, value):
    args = list(args)
    args[args.index(name) + 1] = value
    return args


def children(host):
    """{model name: pid} of the router's running children (each is given --alias <name>)."""
    found = {}
    for line in host.check_output("pgrep -a -f -- '--alias tiny-[ab]' || true").splitlines():
        match = re.search(r"--alias (tiny-[ab])", line)
        if match and "--models-preset" not in line:
            found[match.group(1)] = int(line.split()[0])
    return found


def statuses(host):
    status, body = http(host, PORT, "/models")
    assert status == 200, body
    return dict((m["id"], m["status"]["value"]) for m in body["data"] if m["id"] in NAMES)


def log(host):
    return host.run("journalctl -u %s -n 40 --no-pager -o cat" % UNIT).stdout


def ask(host, name):
    status, body = http(host, PORT, "/v1/chat/completions", {
        "model": name, "max_tokens": 4, "messages": [{"role": "user", "content": "Say hi."}]})
    assert status == 200, (name, status, body, log(host))
    return body


@pytest.fixture(scope="module")
def router():
    host = node(ONE_GPU)
    argv = cmdline(host, main_pid(host, 0))
    binary, args = argv[0], argv[1:]
    sections = [(NAMES[0], args), (NAMES[1], _with(_with(args, "--model", SECOND), "--parallel", "1"))]
    text = router_preset(sections, comment="llm-fleet test: two models on demand, --models-max 1")
    host.check_output("echo %s | base64 -d > %s" % (base64.b64encode(text.encode()).decode(), PRESET))
    # a transient unit: its cgroup holds the router and every child it starts, and stopping it stops them all
    host.check_output("chmod 0644 %s && systemd-run --unit %s --collect %s --host 127.0.0.1 --port %d "
                      "--models-preset %s --models-max 1" % (PRESET, UNIT, binary, PORT, PRESET))
    try:
        for _ in range(60):
            if host.run("python3 -c 'import urllib.request as u; u.urlopen(\"http://127.0.0.1:%d/health\", timeout=5)'"
                        % PORT).rc == 0:
                break
            time.sleep(1)
        else:
            pytest.fail("the router did not answer /health: %s" % log(host))
        yield host, dict(sections)
    finally:
        host.run("systemctl stop %s; rm -f %s" % (UNIT, PRESET))


def test_the_router_reads_the_preset_and_loads_nothing_first(router):
    host, _ = router
    assert statuses(host) == {"tiny-a": "unloaded", "tiny-b": "unloaded"}
    assert children(host) == {}


def test_a_request_starts_its_model_with_every_flag_of_its_section(router):
    host, sections = router
    ask(host, "tiny-a")
    running = children(host)
    assert list(running) == ["tiny-a"] and statuses(host)["tiny-a"] == "loaded"
    child = cmdline(host, running["tiny-a"])
    owned = set(f.lstrip("-") for f in ROUTER_OWNED)
    got = dict((k, v) for k, v in preset_options(child[1:]) if k not in owned)
    assert got == dict(preset_options(sections["tiny-a"]))
    # the router set the child's address and name itself
    assert child[child.index("--host") + 1] == "127.0.0.1" and child[child.index("--alias") + 1] == "tiny-a"


def test_past_models_max_the_least_recently_used_child_stops(router):
    host, _ = router
    ask(host, "tiny-a")
    first = children(host)["tiny-a"]
    ask(host, "tiny-b")
    deadline = time.time() + 30
    while time.time() < deadline and "tiny-a" in children(host):
        time.sleep(1)
    assert list(children(host)) == ["tiny-b"], log(host)
    assert host.run("test -d /proc/%d" % first).rc != 0
    assert statuses(host) == {"tiny-a": "unloaded", "tiny-b": "loaded"}
