"""The fleet's one endpoint (issue 32): HAProxy on the host of the group fleet_fronts over
every GPU host's own front, deployed by site.yml (playbooks/fleet_front.yml). Checked from
outside the role: a client on the front host talks TLS to it (verified against the fleet's
CA); the front reaches each GPU host over the scenario's network and verifies its
certificate (HAProxy's own health check, and OpenSSL against the CA and a wrong bundle);
a conversation stays on one host (read from the hosts' own llama-server figures), moves
only while that host is down, and comes back; a host its stage drains is drained here too."""
import json
import shlex
import time

import pytest
import yaml

from hostprobe import harness_group_vars, node, only_in_scenario, run_playbook, stage_fact
from test_frontend import BACKEND, FLEET_CA, runtime, servers, wait_until_up
from test_llama_server import ONE_GPU, TWO_GPUS

pytestmark = only_in_scenario("fleet")

FRONT = "fleet-front"
GPU_HOSTS = sorted([ONE_GPU, "fleet-sxm2-16gb", TWO_GPUS])
KEY = harness_group_vars()["llm_fleet_api_key"]


def wait_for_states(front, want, timeout=60):
    """Wait until the fleet front's servers show these states ({host: 'UP'|'DOWN'|'DRAIN'})."""
    deadline = time.time() + timeout
    states = {}
    while time.time() < deadline:
        states = {name: row["status"] for name, row in servers(front).items()}
        if all(states.get(name) == state for name, state in want.items()):
            return states
        time.sleep(0.5)
    pytest.fail("the fleet front's servers are %s, not %s" % (states, want))


def admin_drained(front, name):
    """Whether the fleet front holds this server in drain from its runtime API (the admin
    state's forced-drain bit, 0x08, of `show servers state`): its status reads DRAIN, or
    DOWN once the host's own front, every instance drained, fails the health check."""
    for line in runtime(front, "show servers state %s" % BACKEND).splitlines():
        fields = line.split()
        if len(fields) > 6 and fields[3] == name:
            return bool(int(fields[6]) & 0x08)
    pytest.fail("the fleet front has no server %s" % name)


def ask(front, body=None, path="/v1/chat/completions", key=KEY, headers=None, cafile=FLEET_CA):
    """A client on the front host: (status, JSON or text, response headers by lower-case
    name: HAProxy sends them so), TLS verified."""
    script = (
        "import http.client,json,ssl,sys\n"
        "ctx=ssl.create_default_context(cafile=sys.argv[4])\n"
        "c=http.client.HTTPSConnection('127.0.0.1',8443,context=ctx,timeout=120)\n"
        "h=dict({'Content-Type':'application/json'},**json.loads(sys.argv[5]))\n"
        "if sys.argv[3]: h['Authorization']='Bearer '+sys.argv[3]\n"
        "c.request('POST' if sys.argv[2] else 'GET',sys.argv[1],body=sys.argv[2] or None,headers=h)\n"
        "r=c.getresponse();text=r.read().decode()\n"
        "try: text=json.loads(text)\n"
        "except ValueError: pass\n"
        "print(json.dumps([r.status,text,dict((k.lower(),v) for k,v in r.getheaders())]))\n")
    out = front.check_output("python3 -c %s %s %s %s %s %s" % (
        shlex.quote(script), shlex.quote(path), shlex.quote(json.dumps(body) if body else ""), shlex.quote(key or ""),
        shlex.quote(cafile), shlex.quote(json.dumps(headers or {}))))
    return json.loads(out)


PORTS = {}


def generated():
    """{GPU host: tokens its instances generated}, from each instance's own /metrics
    (llamacpp:tokens_predicted_total, summed over the host's instances; one call a host)."""
    counts = {}
    for name in GPU_HOSTS:
        host = node(name)
        if name not in PORTS:
            PORTS[name] = [i["port"] for i in stage_fact(host, "llama_server")["instances"]]
        script = ("import sys,urllib.request as u\nt=0.0\nfor p in sys.argv[1:]:\n"
                  "    for l in u.urlopen('http://127.0.0.1:%s/metrics' % p).read().decode().splitlines():\n"
                  "        t+=float(l.split()[-1]) if l.startswith('llamacpp:tokens_predicted_total') else 0\nprint(t)")
        counts[name] = float(host.check_output("python3 -c %s %s" % (shlex.quote(script),
                                                                     " ".join(str(p) for p in PORTS[name]))))
    return counts


def served_by(front, body, headers=None):
    """The GPU host whose instances generated the answer (the only one whose count grew)."""
    before = generated()
    status, text, _ = ask(front, body, headers=headers)
    assert status == 200, text
    after = generated()
    grew = [name for name in GPU_HOSTS if after[name] > before[name]]
    assert len(grew) == 1, "tokens generated on %s" % grew
    return grew[0], text


def test_the_fleet_front_serves_every_host_over_verified_tls():
    front = node(FRONT)
    assert front.service("haproxy").is_running and front.service("haproxy").is_enabled
    assert front.socket("tcp://0.0.0.0:8443").is_listening
    fact = stage_fact(front, "frontend")
    assert fact["fleet_front"] and fact["servers"] == GPU_HOSTS and fact["balance"] == "affinity"
    # HAProxy checks each host with `ssl verify required` against the fleet's CA: UP means verified
    assert wait_for_states(front, {name: "UP" for name in GPU_HOSTS}) == {name: "UP" for name in GPU_HOSTS}
    for name in GPU_HOSTS:
        verified = front.run("openssl s_client -connect %s:8443 -servername %s -CAfile %s -verify_return_error "
                             "-verify_hostname %s </dev/null" % (name, name, FLEET_CA, name))
        assert verified.rc == 0 and "Verify return code: 0 (ok)" in verified.stdout, verified.stdout[-600:]
        # the same handshake against the system's CAs fails: nothing but the fleet's CA vouches for the hosts
        other = front.run("openssl s_client -connect %s:8443 -servername %s -CAfile /etc/ssl/certs/ca-certificates.crt "
                          "-verify_return_error </dev/null" % (name, name))
        assert other.rc != 0, other.stdout[-600:]
    # a client: TLS verified against the fleet's CA, HSTS, the key on every path, /slots held back
    status, text, headers = ask(front, {"messages": [{"role": "user", "content": "Say hello."}], "max_tokens": 4})
    assert status == 200 and text["choices"][0]["message"]["content"], text
    assert headers.get("strict-transport-security") == "max-age=31536000", headers
    for key in (None, "wrong-key"):
        assert ask(front, None, path="/health", key=key)[0] == 403
    assert ask(front, None, path="/health")[0] == 200
    assert ask(front, None, path="/slots")[0] == 404


def test_a_conversation_stays_on_its_host_and_moves_only_while_it_is_down():
    front = node(FRONT)
    wait_for_states(front, {name: "UP" for name in GPU_HOSTS})
    messages = [{"role": "system", "content": "You answer questions about the whole fleet. " * 12},
                {"role": "user", "content": "Which host is the fastest?"}]
    homes = []
    for _ in range(3):
        home, text = served_by(front, {"messages": messages, "max_tokens": 4})
        homes.append(home)
        messages += [{"role": "assistant", "content": text["choices"][0]["message"]["content"]},
                     {"role": "user", "content": "And then?"}]
    assert len(set(homes)) == 1, "the turns went to %s" % homes
    home = node(homes[0])
    home.check_output("systemctl stop haproxy")
    try:
        # the next turn is served by another host, at once (HAProxy retries a refused connection elsewhere)
        moved, text = served_by(front, {"messages": messages, "max_tokens": 4})
        assert moved != homes[0]
    finally:
        home.check_output("systemctl start haproxy")
    wait_until_up(home, timeout=60)
    wait_for_states(front, {homes[0]: "UP"})
    messages += [{"role": "assistant", "content": text["choices"][0]["message"]["content"]},
                 {"role": "user", "content": "Thanks."}]
    assert served_by(front, {"messages": messages, "max_tokens": 4})[0] == homes[0]
    # a client's session header keeps a conversation together whatever the body
    for session in ("alpha", "beta"):
        turns = [served_by(front, {"messages": [{"role": "user", "content": "turn %d" % n}], "max_tokens": 4},
                           headers={"X-Session-Id": session})[0] for n in range(3)]
        assert len(set(turns)) == 1, "session %s went to %s" % (session, turns)


def test_a_host_its_stage_drains_is_drained_at_the_fleet_front(tmp_path):
    """The stages drain a host's front before a restart that leaves it no server (a
    reboot, a one-instance host's restart): the fleet fronts take the whole host out
    first, and put it back after (roles/fleet_common/tasks/frontend_server.yml)."""
    front = node(FRONT)
    wait_for_states(front, {name: "UP" for name in GPU_HOSTS})
    playbook = tmp_path / "drain.yml"

    def stage(action):
        playbook.write_text(yaml.safe_dump([{
            "name": "Drain or put back every instance of the host, as a stage does",
            "hosts": "gpu_servers",
            "tasks": [{"name": "Drain or put back", "ansible.builtin.include_role": {
                "name": "fleet_common", "tasks_from": "frontend_server.yml"},
                "vars": {"fleet_common_frontend_action": action}}]}]))
        result = run_playbook(str(playbook), [ONE_GPU], tmp_path=tmp_path, groups={"fleet_fronts": [FRONT]})
        assert result.returncode == 0, result.stdout[-3000:]

    stage("drain")
    try:
        assert admin_drained(front, ONE_GPU)
        before = generated()[ONE_GPU]
        for n in range(4):
            assert ask(front, {"messages": [{"role": "user", "content": "drained %d" % n}], "max_tokens": 4})[0] == 200
        assert generated()[ONE_GPU] == before, "the drained host generated tokens"
    finally:
        stage("ready")
    assert not admin_drained(front, ONE_GPU)
    wait_for_states(front, {ONE_GPU: "UP"})
