"""roles/prometheus on the fleet's monitoring host (the two-GPU host): a real Prometheus
from Debian's packages scrapes that host's GPU exporter and each of its llama-server
instances through the front (/metrics/gpu<N>, TLS checked against the certificate the
front serves, the key from a file only Prometheus reads), and what it stored equals what
the mock NVML reports. The other hosts' exporters listen on their own loopback: left out
and said. Every target comes from the hosts' stage facts, the fleet front's HAProxy too.
(The sick card as Prometheus sees it: test_split.py's first test.)"""
import json
import shlex
import time
import urllib.parse

from hostprobe import node, nvml_probe, only_in_scenario, stage_fact
from test_fleet_front import FRONT
from test_frontend import front, servers
from test_llama_server import ONE_GPU, TWO_GPUS

pytestmark = only_in_scenario("fleet")
MIB = 1 << 20


def api(host, path):
    """Prometheus's HTTP API, as a client on its host asks it."""
    out = host.check_output("python3 -c %s" % shlex.quote(
        "import urllib.request as u;print(u.urlopen('http://127.0.0.1:9090%s', timeout=10).read().decode())" % path))
    return json.loads(out)["data"]


def query(host, promql):
    """An instant query: {frozenset(labels.items()): value}."""
    result = api(host, "/api/v1/query?query=" + urllib.parse.quote(promql))["result"]
    return dict((frozenset(r["metric"].items()), float(r["value"][1])) for r in result)


def wait_for(what, check, timeout=60):
    """Until check() returns something true (Prometheus scrapes every 2 s here)."""
    deadline = time.time() + timeout
    while True:
        value = check()
        if value or time.time() > deadline:
            assert value, "%s: not within %d s" % (what, timeout)
            return value
        time.sleep(1)


def one(host, promql):
    """The value of a query that has exactly one series (None while it has none)."""
    values = list(query(host, promql).values())
    assert len(values) <= 1, (promql, values)
    return values[0] if values else None


def own_targets(host):
    return [t for t in api(host, "/api/v1/targets?state=active")["activeTargets"]
            if t["labels"].get("host", TWO_GPUS) == TWO_GPUS]


def test_prometheus_scrapes_its_host_s_gpus_and_instances_through_the_front():
    host = node(TWO_GPUS)
    assert host.service("prometheus").is_running and host.service("prometheus").is_enabled
    targets = wait_for("every target of the monitoring host up",
                       lambda: (lambda ts: ts if ts and all(t["health"] == "up" for t in ts) else None)(own_targets(host)))
    assert sorted((t["labels"]["job"], t["labels"].get("gpu", ""), t["scrapeUrl"]) for t in targets) == [
        ("llm-fleet-frontend", "", "https://%s:8443/metrics/haproxy" % TWO_GPUS),
        ("llm-fleet-gpu", "", "http://127.0.0.1:9400/metrics"),
        ("llm-fleet-llama-server", "0", "https://%s:8443/metrics/gpu0" % TWO_GPUS),
        ("llm-fleet-llama-server", "1", "https://%s:8443/metrics/gpu1" % TWO_GPUS),
        ("prometheus", "", "http://127.0.0.1:9090/metrics"),
    ]
    # Prometheus listens on loopback only (no login of its own)
    assert host.socket("tcp://127.0.0.1:9090").is_listening and not host.socket("tcp://0.0.0.0:9090").is_listening
    key = host.file("/etc/prometheus/llm-fleet/api-key")
    assert not key.exists or (key.mode == 0o640 and key.group == "prometheus")
    # the other hosts' exporters are on their own loopback: left out, and the fact says which
    fact = stage_fact(host, "prometheus")
    assert sorted((u["host"], u["job"]) for u in fact["unreachable"]) == [
        ("fleet-sxm2-16gb", "llm-fleet-gpu"), ("fleet-sxm2-32gb", "llm-fleet-gpu")]
    # a front is listed where its HAProxy has the built-in exporter (Debian 12's 2.6 has it)
    with_exporter = [h for h in (ONE_GPU, TWO_GPUS, "fleet-sxm2-16gb", FRONT)
                     if "prometheus-exporter" in node(h).check_output("haproxy -vv")]
    assert fact["jobs"] == {"llm-fleet-gpu": 1, "llm-fleet-llama-server": 4, "llm-fleet-frontend": len(with_exporter)}
    assert TWO_GPUS in with_exporter


def test_the_front_s_own_figures_need_the_key_and_are_stored():
    host = node(TWO_GPUS)
    # HAProxy's exporter answers on the front's /metrics/haproxy, with the key only
    assert front(host, "/metrics/haproxy", key=None)[0] == 403
    status, text = front(host, "/metrics/haproxy")
    assert status == 200 and "haproxy_process_uptime_seconds" in text
    # what Prometheus stored is HAProxy's own view: the instances the front sees up
    up = sum(1 for row in servers(host).values() if row["status"] == "UP")
    stored = wait_for("the front's backend figures", lambda: one(
        host, 'haproxy_backend_active_servers{host="%s",proxy="llama_server"}' % TWO_GPUS))
    assert stored == up == 2


def test_the_fleet_front_s_own_figures_are_scraped_from_its_fact():
    """The fleet front is no GPU host: its frontend fact names only HAProxy's figures, which
    Prometheus scrapes over TLS it verifies against the certificate that fact carries."""
    host = node(TWO_GPUS)
    fact = stage_fact(node(FRONT), "frontend")
    assert [g["labels"]["job"] for g in fact["prometheus_targets"]] == ["llm-fleet-frontend"]
    assert "BEGIN CERTIFICATE" in fact["certificate_pem"]
    targets = wait_for("the fleet front's target up", lambda: [
        t for t in api(host, "/api/v1/targets?state=active")["activeTargets"]
        if t["labels"].get("host") == FRONT and t["health"] == "up"])
    assert [(t["labels"]["job"], urllib.parse.urlsplit(t["scrapeUrl"]).path) for t in targets] == [
        ("llm-fleet-frontend", "/metrics/haproxy")]
    # what it stored is the fleet front's own view: the GPU hosts it sees up
    up = sum(1 for row in servers(node(FRONT)).values() if row["status"] == "UP")
    stored = wait_for("the fleet front's backend figures", lambda: one(
        host, 'haproxy_backend_active_servers{host="%s",proxy="llama_server"}' % FRONT))
    assert stored == up == 3


def test_what_prometheus_stored_equals_the_mock_nvml():
    host = node(TWO_GPUS)
    nvml = nvml_probe(host)
    for gpu in nvml["gpus"]:
        where = '{Hostname="%s",gpu="%d"}' % (TWO_GPUS, gpu["index"])
        stored = wait_for("GPU %d's samples" % gpu["index"], lambda: one(host, "DCGM_FI_DEV_FB_USED" + where) is not None)
        assert stored
        assert one(host, "DCGM_FI_DEV_FB_USED" + where) == gpu["memory_used_v2_bytes"] // MIB
        assert one(host, "DCGM_FI_DEV_SM_CLOCK" + where) == gpu["sm_clock_mhz"]
        assert one(host, "DCGM_FI_DEV_POWER_USAGE" + where) == gpu["power_usage_mw"] / 1000
        assert one(host, "DCGM_FI_DEV_POWER_MGMT_LIMIT" + where) == gpu["power_limit_mw"] / 1000
        assert one(host, "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL" + where) == gpu["ecc_uncorrected_volatile"] == 0
        assert one(host, "llm_fleet_gpu_healthy" + where) == 1
    # each instance's own figures, labelled with its GPU by the target
    decoded = query(host, 'llamacpp:n_decode_total{host="%s"}' % TWO_GPUS)
    assert sorted(dict(labels)["gpu"] for labels in decoded) == ["0", "1"]
