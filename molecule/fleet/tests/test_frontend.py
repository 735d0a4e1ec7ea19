"""The front of each host (roles/frontend, issue 15), checked from outside the role:
HAProxy's own runtime API and the answers a client gets through the one port (TLS
against the served certificate, the API key, a drained instance, no instance up),
and a rolling restart of both instances of the two-GPU host under a load of
streaming requests, which must lose none. The simulated hosts have no network, so
the clients run on the host itself, on loopback, as a local client would."""
import csv
import io
import json
import os
import shlex
import subprocess
import time

import pytest

from hostprobe import HARNESS_DIR, harness_group_vars, host_name, node, only_in_scenario, run_playbook, stage_fact
from test_llama_server import ONE_GPU, TWO_GPUS, http, main_pid

pytestmark = only_in_scenario("fleet")

KEY = harness_group_vars()["llm_fleet_api_key"]
# the simulated fleets' fronts serve certificates of the fleet's CA (tests/harness/group_vars/all.yml)
FLEET_CA = "/etc/ssl/llm-fleet/fleet-ca.crt"
SOCKET = "/run/haproxy/admin.sock"
BACKEND = "llama_server"


def runtime(host, command):
    """HAProxy's answer to one runtime API command."""
    script = ("import socket,sys\ns=socket.socket(socket.AF_UNIX)\ns.connect(%r)\n"
              "s.sendall(sys.argv[1].encode()+b'\\n')\n"
              "print(b''.join(iter(lambda: s.recv(65536), b'')).decode())" % SOCKET)
    return host.check_output("python3 -c %s %s" % (shlex.quote(script), shlex.quote(command)))


def servers(host):
    """{server: row of `show stat`} of the llama_server backend."""
    rows = csv.DictReader(io.StringIO(runtime(host, "show stat").lstrip("# ")))
    return {row["svname"]: row for row in rows if row["pxname"] == BACKEND and row["svname"] not in ("BACKEND",)}


def wait_until_up(host, timeout=30):
    deadline = time.time() + timeout
    while time.time() < deadline:
        states = {name: row["status"] for name, row in servers(host).items()}
        if all(state == "UP" for state in states.values()):
            return states
        time.sleep(0.5)
    pytest.fail("%s: the front's servers are not all up: %s" % (host_name(host), states))


def front(host, path, body=None, key=KEY, tls=None, cafile=FLEET_CA, headers=None):
    """What a client on the host gets from the front: (status, JSON body or text), the
    certificate checked against cafile (the fleet's CA). tls: also return the handshake."""
    script = (
        "import hashlib,http.client,json,ssl,sys\n"
        "ctx=ssl.create_default_context(cafile=sys.argv[4])\n"
        "c=http.client.HTTPSConnection('127.0.0.1',8443,context=ctx,timeout=120)\n"
        "h=dict({'Content-Type':'application/json'},**json.loads(sys.argv[5]))\n"
        "if sys.argv[3]: h['Authorization']='Bearer '+sys.argv[3]\n"
        "c.request('POST' if sys.argv[2] else 'GET',sys.argv[1],body=sys.argv[2] or None,headers=h)\n"
        "s=c.sock\n"
        "tls={'version':s.version(),'cipher':s.cipher()[0],'sha256':hashlib.sha256(s.getpeercert(True)).hexdigest(),"
        "'names':[v for k,v in s.getpeercert()['subjectAltName']]}\n"
        "r=c.getresponse();text=r.read().decode();tls['hsts']=r.getheader('Strict-Transport-Security')\n"
        "try: text=json.loads(text)\n"
        "except ValueError: pass\n"
        "print(json.dumps([r.status,text,tls]))\n")
    out = host.check_output("python3 -c %s %s %s %s %s %s" % (shlex.quote(script), shlex.quote(path),
                                                                shlex.quote(json.dumps(body) if body else ""),
                                                                shlex.quote(key or ""), shlex.quote(cafile),
                                                                shlex.quote(json.dumps(headers or {}))))
    status, text, handshake = json.loads(out)
    return (status, text, handshake) if tls else (status, text)


def tokens_predicted(host, port):
    """llama-server's own count of tokens it generated (its /metrics)."""
    metrics = host.check_output("python3 -c %s" % shlex.quote(
        "import urllib.request as u;print(u.urlopen('http://127.0.0.1:%d/metrics').read().decode())" % port))
    for line in metrics.splitlines():
        if line.startswith("llamacpp:tokens_predicted_total"):
            return float(line.split()[-1])
    pytest.fail("no llamacpp:tokens_predicted_total in port %d's /metrics" % port)


CHAT = {"messages": [{"role": "user", "content": "Say hello."}], "max_tokens": 4}


@pytest.mark.parametrize("name", [ONE_GPU, TWO_GPUS])
def test_one_port_in_front_of_every_instance(name):
    host = node(name)
    assert host.service("haproxy").is_running and host.service("haproxy").is_enabled
    assert host.socket("tcp://0.0.0.0:8443").is_listening
    assert not host.socket("tcp://0.0.0.0:80").is_listening
    instances = stage_fact(host, "llama_server")["instances"]
    rows = servers(host)
    assert sorted(rows) == sorted("gpu%d" % instance["gpu_index"] for instance in instances)
    for instance in instances:
        # behind the front, the instances stay on loopback
        assert rows["gpu%d" % instance["gpu_index"]]["status"] == "UP"
        assert host.socket("tcp://127.0.0.1:%d" % instance["port"]).is_listening
        assert not host.socket("tcp://0.0.0.0:%d" % instance["port"]).is_listening
    assert stage_fact(host, "frontend")["servers"] == sorted(rows)
    # HAProxy's own figures: on loopback only, in Prometheus' format (bookworm's 2.6 has the exporter)
    assert not host.socket("tcp://0.0.0.0:8404").is_listening
    metrics = host.check_output("python3 -c %s" % shlex.quote(
        "import urllib.request as u;print(u.urlopen('http://127.0.0.1:8404/metrics').read().decode())"))
    up = [line for line in metrics.splitlines() if line.startswith("haproxy_server_status{")
          and 'proxy="%s"' % BACKEND in line and 'state="UP"' in line and line.endswith(" 1")]
    assert len(up) == len(instances), up


def test_tls_with_the_host_certificate_and_modern_ciphers_only():
    host = node(TWO_GPUS)
    status, _, handshake = front(host, "/health", tls=True)
    assert status == 200
    assert handshake["version"] in ("TLSv1.3", "TLSv1.2")
    assert "DNS:%s" % TWO_GPUS in ["DNS:" + n for n in handshake["names"]] and "127.0.0.1" in handshake["names"]
    fact = stage_fact(host, "frontend")
    assert fact["tls"] and fact["certificate"]["kind"] == "issued"
    # issued by the fleet's CA on the controller, for the host's own names
    assert host.run("openssl verify -CAfile %s /etc/haproxy/llm-fleet/fleet-ca.pem" % FLEET_CA).rc == 0
    assert fact["certificate"]["sha256"].replace(":", "").lower() == handshake["sha256"]
    # a client that offers only a cipher without forward secrecy (TLS 1.2, RSA key exchange) is refused
    refused = host.run("python3 -c %s" % shlex.quote(
        "import socket,ssl\nc=ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT);c.check_hostname=False;c.verify_mode=ssl.CERT_NONE\n"
        "c.maximum_version=ssl.TLSVersion.TLSv1_2;c.set_ciphers('AES128-SHA:@SECLEVEL=0')\n"
        "c.wrap_socket(socket.create_connection(('127.0.0.1',8443))).do_handshake()"))
    assert refused.rc != 0 and "SSL" in refused.stderr, refused.stderr


def test_clients_need_the_key_on_every_path():
    host = node(TWO_GPUS)
    for path, body in (("/v1/chat/completions", CHAT), ("/health", None), ("/metrics", None), ("/slots", None)):
        for key in (None, "wrong-key"):
            status, text = front(host, path, body, key=key)
            assert status == 403 and text["error"]["type"] == "authentication_error", (path, key, text)
    assert front(host, "/health")[0] == 200
    assert front(host, "/metrics")[0] == 200
    status, text = front(host, "/v1/chat/completions", CHAT)
    assert status == 200 and text["choices"][0]["message"]["content"], text


def test_slots_stay_behind_the_front_and_browsers_are_told_to_keep_tls():
    """/slots (every slot's prompt, other clients' too) answers 404 with the key and the
    reason; the instance itself still serves it on loopback. The TLS front's answers carry
    Strict-Transport-Security."""
    host = node(TWO_GPUS)
    for path in ("/slots", "/slots/0", "/slots?fail_on_no_slot=1"):
        status, text = front(host, path)
        assert status == 404 and "frontend_expose_slots" in text["error"]["message"], (path, text)
    port = stage_fact(host, "llama_server")["instances"][0]["port"]
    assert http(host, port, "/slots")[0] == 200
    status, _, handshake = front(host, "/health", tls=True)
    assert status == 200 and handshake["hsts"] == "max-age=31536000", handshake


@pytest.mark.day_two
def test_a_certificate_from_the_inventory_is_served_and_a_wrong_pair_changes_nothing(tmp_path):
    """An operator's certificate (issued by their CA, chain included) replaces the
    fleet CA's; a key of another certificate is refused before any change; without it in
    the inventory the fleet CA's certificate (kept, same fingerprint) serves again."""
    host = node(ONE_GPU)
    fleet_issued = front(host, "/health", tls=True)[2]["sha256"]
    ec = "-newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes"
    host.check_output(
        "set -e; rm -rf /root/ca && mkdir /root/ca && cd /root/ca\n"
        "openssl req -x509 %s -days 2 -subj /CN=test-ca -keyout ca.key -out ca.crt 2>/dev/null\n"
        "openssl req %s -subj /CN=%s -keyout host.key -out host.csr 2>/dev/null\n"
        "openssl req %s -subj /CN=other -keyout other.key -out other.csr 2>/dev/null\n"
        "printf 'subjectAltName=DNS:localhost,IP:127.0.0.1\\n' > ext\n"
        "openssl x509 -req -in host.csr -CA ca.crt -CAkey ca.key -CAcreateserial -days 2 -extfile ext -out host.crt "
        "2>/dev/null" % (ec, ec, ONE_GPU, ec))
    read = host.file
    chain = read("/root/ca/host.crt").content_string + read("/root/ca/ca.crt").content_string
    issued = host.check_output("openssl x509 -in /root/ca/host.crt -outform der | sha256sum | cut -d' ' -f1")

    wrong = run_playbook("playbooks/frontend.yml", [ONE_GPU], tmp_path=tmp_path, extra_vars={
        "frontend_tls_certificate": chain, "frontend_tls_private_key": read("/root/ca/other.key").content_string})
    assert wrong.returncode != 0
    assert "are not a PEM certificate and the PEM private key of that certificate" in " ".join(wrong.stdout.split())
    assert "PRIVATE KEY" not in wrong.stdout
    assert front(host, "/health", tls=True)[2]["sha256"] == fleet_issued

    result = run_playbook("playbooks/frontend.yml", [ONE_GPU], tmp_path=tmp_path, extra_vars={
        "frontend_tls_certificate": chain, "frontend_tls_private_key": read("/root/ca/host.key").content_string})
    assert result.returncode == 0, result.stdout[-3000:]
    assert "PRIVATE KEY" not in result.stdout
    status, _, handshake = front(host, "/health", tls=True, cafile="/root/ca/ca.crt")
    assert status == 200 and handshake["sha256"] == issued
    fact = stage_fact(host, "frontend")
    assert fact["certificate"]["kind"] == "issued" and fact["certificate"]["sha256"].replace(":", "").lower() == issued

    back = run_playbook("playbooks/frontend.yml", [ONE_GPU], tmp_path=tmp_path)
    assert back.returncode == 0, back.stdout[-3000:]
    assert front(host, "/health", tls=True)[2]["sha256"] == fleet_issued
    assert not host.file("/etc/haproxy/llm-fleet/issued.pem").exists


@pytest.mark.parametrize("settings,message", [
    ({"frontend_api_key": ""}, "which other machines can reach, and no API key is set"),
    ({"frontend_api_key": 'key" with a quote'}, "has a character a bearer token cannot carry"),
    ({"frontend_tls": False}, "every prompt would cross the network in clear text"),
    ({"frontend_hsts_max_age_s": -1}, "frontend_hsts_max_age_s is -1"),
    ({"frontend_affinity_header": "X-Session-Id if TRUE"}, "use a header name"),
    ({"frontend_client_concurrent_requests": "lots"}, "frontend_client_concurrent_requests is lots"),
])
def test_bad_settings_stop_the_stage_before_any_change(settings, message, tmp_path):
    host = node(ONE_GPU)
    config = host.file("/etc/haproxy/haproxy.cfg").content_string
    result = run_playbook("playbooks/frontend.yml", [ONE_GPU], tmp_path=tmp_path, extra_vars=settings)
    assert result.returncode != 0 and message in " ".join(result.stdout.split()), result.stdout[-3000:]
    assert 'key" with a quote' not in result.stdout
    assert host.file("/etc/haproxy/haproxy.cfg").content_string == config


@pytest.mark.day_two
def test_the_front_passes_on_the_key_the_instances_want_from_the_llama_server_fact(tmp_path):
    """Instances with their own key (llama_server_api_key): the llama_server stage publishes
    where the key file is (api_key_file, never the key), the front reads it there and puts it
    on what it passes on; a front whose clients would not be asked for a key is refused.
    Then back to the scenario's keyless instances."""
    host = node(ONE_GPU)
    secret = "instances-key-7c2d"
    try:
        result = run_playbook("playbooks/llama_server.yml", [ONE_GPU], tmp_path=tmp_path,
                              extra_vars={"llama_server_api_key": secret})
        assert result.returncode == 0 and secret not in result.stdout, result.stdout[-3000:]
        fact = stage_fact(host, "llama_server")
        assert fact["api_key_file"] == "/etc/llm-fleet/llama-server/api-key" and secret not in json.dumps(fact)
        assert http(host, 8080, "/v1/chat/completions", CHAT)[0] == 401
        config = host.file("/etc/haproxy/haproxy.cfg").content_string
        refused = run_playbook("playbooks/frontend.yml", [ONE_GPU], tmp_path=tmp_path,
                               extra_vars={"frontend_address": "127.0.0.1", "frontend_api_key": ""})
        assert refused.returncode != 0 and "The instances want an API key" in " ".join(refused.stdout.split())
        assert host.file("/etc/haproxy/haproxy.cfg").content_string == config
        result = run_playbook("playbooks/frontend.yml", [ONE_GPU], tmp_path=tmp_path)
        assert result.returncode == 0 and secret not in result.stdout, result.stdout[-3000:]
        wait_until_up(host)
        assert front(host, "/v1/chat/completions", CHAT)[0] == 200
        assert front(host, "/v1/chat/completions", CHAT, key="wrong")[0] == 403
    finally:
        for playbook in ("playbooks/llama_server.yml", "playbooks/frontend.yml"):
            restored = run_playbook(playbook, [ONE_GPU], tmp_path=tmp_path)
            assert restored.returncode == 0, restored.stdout[-3000:]
    assert stage_fact(host, "llama_server")["api_key_file"] == ""
    assert http(host, 8080, "/v1/chat/completions", CHAT)[0] == 200


def served_by(host, body, headers=None, ports=None):
    """The port of the instance that generated the answer to one request through the front
    (the instance whose own token count grew; ports: those to read, default every one), and the answer."""
    ports = ports or [i["port"] for i in stage_fact(host, "llama_server")["instances"]]
    before = dict((port, tokens_predicted(host, port)) for port in ports)
    status, text = front(host, "/v1/chat/completions", body, headers=headers)
    assert status == 200, text
    grew = [port for port in ports if tokens_predicted(host, port) > before[port]]
    assert len(grew) == 1, "instances that generated: %s" % grew
    return grew[0], text


def test_a_conversation_stays_on_its_instance_and_moves_only_while_it_is_down():
    """The front hashes a conversation (its session header, else its first body bytes) to
    one instance, whose KV cache holds the history: every turn lands there; while that
    instance is down the turn is served by the other, and it comes back after."""
    host = node(TWO_GPUS)
    wait_until_up(host)
    assert stage_fact(host, "frontend")["balance"] == "affinity"
    instances = dict((i["port"], i) for i in stage_fact(host, "llama_server")["instances"])
    messages = [{"role": "system", "content": "You answer questions about the fleet. " * 12},
                {"role": "user", "content": "Which card is the fastest?"}]
    homes = []
    for _ in range(3):
        port, text = served_by(host, {"messages": messages, "max_tokens": 4})
        homes.append(port)
        messages += [{"role": "assistant", "content": text["choices"][0]["message"]["content"]},
                     {"role": "user", "content": "And then?"}]
    assert len(set(homes)) == 1, "the turns went to %s" % homes
    home = homes[0]
    other = [port for port in instances if port != home][0]
    unit = instances[home]["unit"]
    host.check_output("systemctl stop %s" % unit)
    try:
        # (the stopped one has no /metrics to read: the turn must have grown the other's count)
        port, text = served_by(host, {"messages": messages, "max_tokens": 4}, ports=[other])
        assert port == other
    finally:
        host.check_output("systemctl start %s" % unit)
    wait_until_up(host, timeout=90)
    messages += [{"role": "assistant", "content": text["choices"][0]["message"]["content"]},
                 {"role": "user", "content": "Thanks."}]
    assert served_by(host, {"messages": messages, "max_tokens": 4})[0] == home
    # a client's session header names the conversation: its turns stay together whatever the body
    for session in ("alpha", "beta", "gamma"):
        turns = [served_by(host, {"messages": [{"role": "user", "content": "turn %d" % n}], "max_tokens": 4},
                           headers={"X-Session-Id": session})[0] for n in range(3)]
        assert len(set(turns)) == 1, "session %s went to %s" % (session, turns)


def test_a_drained_instance_receives_nothing():
    host = node(TWO_GPUS)
    runtime(host, "set server %s/gpu1 state drain" % BACKEND)
    try:
        before = tokens_predicted(host, 8080), tokens_predicted(host, 8081)
        for _ in range(4):
            assert front(host, "/v1/chat/completions", CHAT)[0] == 200
        after = tokens_predicted(host, 8080), tokens_predicted(host, 8081)
        assert after[1] == before[1], "the drained instance generated %s tokens" % (after[1] - before[1])
        assert after[0] > before[0]
    finally:
        runtime(host, "set server %s/gpu1 state ready" % BACKEND)
    wait_until_up(host)


def test_a_host_with_no_instance_up_answers_503_with_a_reason():
    host = node(TWO_GPUS)
    for server in ("gpu0", "gpu1"):
        runtime(host, "set server %s/%s state maint" % (BACKEND, server))
    try:
        status, text = front(host, "/v1/chat/completions", CHAT)
    finally:
        for server in ("gpu0", "gpu1"):
            runtime(host, "set server %s/%s state ready" % (BACKEND, server))
    assert status == 503
    assert text["error"]["type"] == "unavailable_error" and TWO_GPUS in text["error"]["message"]
    wait_until_up(host)


def test_a_driver_reboot_drains_the_front_first_and_everything_comes_back(tmp_path):
    """The nvidia_stack stage reboots a host with a reboot pending: it drains every
    instance from the front first; after the reboot the instances start at boot and the
    front (a fresh HAProxy, every server ready) serves through TLS again."""
    host = node(TWO_GPUS)
    host.check_output("touch /var/run/reboot-required")
    # one boot: PID 1's start time (a simulated reboot restarts the container, not the kernel)
    boot = host.check_output("cut -d' ' -f22 /proc/1/stat")
    result = run_playbook("playbooks/nvidia_stack.yml", [TWO_GPUS], tmp_path=tmp_path)
    assert result.returncode == 0, result.stdout[-3000:]
    assert host.check_output("cut -d' ' -f22 /proc/1/stat") != boot, "the host did not reboot"
    drained = result.stdout.split("Take out of the front, or put back, servers all")[1].split("TASK [")[0]
    assert drained.count("changed: [%s] => (item=gpu" % TWO_GPUS) == 2, drained
    for plan in stage_fact(host, "model")["plans"]:
        assert host.service("llama-server@%d.service" % plan["gpu_index"]).is_enabled
    wait_until_up(host, timeout=90)
    assert front(host, "/v1/chat/completions", CHAT)[0] == 200


@pytest.mark.day_two
def test_a_rolling_restart_under_load_loses_no_request(tmp_path):
    """The llama_server stage restarts both instances of the two-GPU host, one after the
    other, while 4 clients stream completions through the front: every response must be
    whole. (The restart is forced by removing the records of what passed the gate, as a
    rollout interrupted after writing new plans leaves them: the stage then restarts and
    gates every instance exactly as for a new plan, and the plan stays what the later
    tests expect.)"""
    host = node(TWO_GPUS)
    subprocess.run(["docker", "cp", os.path.join(HARNESS_DIR, "frontend_loadgen.py"), TWO_GPUS + ":/root/loadgen.py"],
                   check=True)
    host.run("rm -f /tmp/loadgen.stop /tmp/loadgen.json")
    host.check_output("nohup python3 /root/loadgen.py https://127.0.0.1:8443 %s %s /tmp/loadgen.stop 4 48 1 "
                      "> /tmp/loadgen.json 2>/tmp/loadgen.err &" % (shlex.quote(KEY), FLEET_CA))
    before = main_pid(host, 0), main_pid(host, 1)
    try:
        time.sleep(3)
        host.check_output("rm /etc/llm-fleet/llama-server/0.serving /etc/llm-fleet/llama-server/1.serving")
        started = time.time()
        result = run_playbook("playbooks/llama_server.yml", [TWO_GPUS], tmp_path=tmp_path)
        assert result.returncode == 0, result.stdout[-3000:]
        print("\nthe llama_server stage's rollout took %.0f s" % (time.time() - started))
        time.sleep(2)
    finally:
        host.run("touch /tmp/loadgen.stop")
    after = main_pid(host, 0), main_pid(host, 1)
    deadline = time.time() + 150
    while time.time() < deadline and not host.file("/tmp/loadgen.json").content_string.strip():
        time.sleep(1)
    out = host.file("/tmp/loadgen.json").content_string
    assert out.strip(), host.file("/tmp/loadgen.err").content_string
    results = json.loads(out)
    print("\nrolling restart under load through the front of %s: %d requests, %d whole, %d failed"
          % (TWO_GPUS, results["requests"], results["whole"], len(results["failures"])))
    # both instances restarted, each drained first
    assert before[0] != after[0] and before[1] != after[1], (before, after)
    assert result.stdout.count("Drain from the front (requests in flight finish) the instance of GPU") == 2
    assert results["failures"] == []
    assert results["requests"] >= 20 and results["whole"] == results["requests"]
    wait_until_up(host)


# Two runs of the stage (~95 s): outside make test's CI budget, in make test DAY_TWO=1.
@pytest.mark.day_two
def test_a_client_past_its_request_rate_gets_429_with_retry_after(tmp_path):
    """Per client address, the front counts requests in 10 s (a stick table) and answers
    429 with Retry-After past the limit; each instance takes at most its slots at once."""
    host = node(ONE_GPU)
    config = host.file("/etc/haproxy/haproxy.cfg").content_string
    slots = [i["parallel"] for i in stage_fact(host, "llama_server")["instances"]]
    for parallel in slots:
        assert " maxconn %d" % parallel in config
    # the default: twice the host's slots in flight per client
    assert "sc_conn_cur(0) gt %d }" % (2 * sum(slots)) in config
    result = run_playbook("playbooks/frontend.yml", [ONE_GPU], tmp_path=tmp_path,
                          extra_vars={"frontend_client_requests_per_10s": 4})
    assert result.returncode == 0, result.stdout[-3000:]
    try:
        # the stage's own wait for the front counted too: two 10 s periods clear HAProxy's sliding window
        time.sleep(21)
        answers = [front(host, "/health") for _ in range(6)]
        assert [status for status, _ in answers[:4]] == [200] * 4, answers
        status, text = answers[-1]
        assert status == 429 and text["error"]["type"] == "rate_limit_error", answers
        assert "at most 4 in 10 s" in text["error"]["message"]
        assert "Retry-After: 10" in host.file("/etc/haproxy/llm-fleet/429.http").content_string
    finally:
        result = run_playbook("playbooks/frontend.yml", [ONE_GPU], tmp_path=tmp_path)
        assert result.returncode == 0, result.stdout[-3000:]
    assert host.file("/etc/haproxy/haproxy.cfg").content_string == config
