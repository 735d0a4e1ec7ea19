"""The fleet's alert rules (roles/prometheus, docs/prometheus.md) on the monitoring host (the
two-GPU host): installed next to the targets, loaded with the scenario's short durations
(converge.yml: evaluated every 2 s, `for: 2s`), and firing for real faults of that host, read
from Prometheus's own API: a sick second card (an uncorrectable ECC error in the mock NVML's
volatile state and an Xid 48 the driver raises, as test_split.py makes them) and its first
instance stopped. Everything is put back and the alerts resolve before the test ends."""
import shlex

from hostprobe import node, only_in_scenario, stage_fact
from test_frontend import wait_until_up
from test_llama_server import TWO_GPUS
from test_prometheus import api, wait_for
from test_split import XID_JOURNAL, drop_gpu_state, set_gpu_state
from test_split import wait_for as wait_on_host

pytestmark = only_in_scenario("fleet")
RULES = "/etc/prometheus/llm-fleet/alerts.yml"


def firing(monitor, name, **labels):
    """The alerts called `name` that fire now on the monitoring host with (at least)
    these labels (`host` among them: the first argument is not called so)."""
    return [alert for alert in api(monitor, "/api/v1/alerts")["alerts"]
            if alert["labels"].get("alertname") == name and alert["state"] == "firing"
            and all(alert["labels"].get(key) == value for key, value in labels.items())]


def serving(host, port):
    """llama-server on the port answers /health with 200 (not refused, not 503 while loading)."""
    script = "import urllib.request as u; u.urlopen('http://127.0.0.1:%d/health', timeout=5)" % port
    return host.run("python3 -c %s" % shlex.quote(script)).rc == 0


def test_the_rules_are_installed_and_loaded_with_the_scenario_s_durations():
    host = node(TWO_GPUS)
    rules = host.file(RULES)
    assert rules.user == "root" and rules.group == "prometheus" and rules.mode == 0o640
    assert RULES in host.file("/etc/prometheus/prometheus.yml").content_string
    loaded = dict((rule["name"], rule) for group in api(host, "/api/v1/rules")["groups"]
                  for rule in group["rules"] if group["file"] == RULES)
    assert len(loaded) == 12 and all(rule["type"] == "alerting" for rule in loaded.values())
    assert loaded["LlmFleetGpuEccUncorrectable"]["duration"] == 2 and loaded["LlmFleetInstanceDown"]["duration"] == 2
    assert loaded["LlmFleetGpuThermalSlowdown"]["duration"] == 15 * 60  # the role's default


def test_a_sick_card_and_a_stopped_instance_fire_their_alerts():
    host = node(TWO_GPUS)
    plans = sorted(stage_fact(host, "model")["plans"], key=lambda p: p["gpu_index"])
    sick = plans[1]["gpu_uuid"]
    assert not firing(host, "LlmFleetGpuEccUncorrectable", Hostname=TWO_GPUS)
    assert not firing(host, "LlmFleetInstanceDown", host=TWO_GPUS, gpu="0")
    try:
        set_gpu_state(host, ["%s.ecc_uncorrected_volatile=1" % sick])
        host.run_expect([0], "echo '%s 48' >> /run/mock-nvml/xid_events" % sick)
        wait_on_host(host, "grep -q '\"xid\": 48' %s" % XID_JOURNAL, "the exporter journals the Xid")
        host.run_expect([0], "systemctl stop llama-server@0.service")

        ecc, = wait_for("the ECC alert fires", lambda: firing(
            host, "LlmFleetGpuEccUncorrectable", Hostname=TWO_GPUS, gpu="1"), timeout=30)
        assert ecc["labels"]["severity"] == "critical" and ecc["labels"]["UUID"] == sick
        assert float(ecc["value"]) == 1
        assert ecc["annotations"]["summary"] == "%s GPU 1: 1 uncorrectable ECC error(s) since boot" % TWO_GPUS
        assert "`nvidia-smi -r -i 1`" in ecc["annotations"]["description"]
        xid, = wait_for("the Xid alert fires", lambda: firing(host, "LlmFleetGpuXid", Hostname=TWO_GPUS, gpu="1"),
                        timeout=30)
        assert xid["labels"]["severity"] == "critical" and float(xid["value"]) == 48
        assert xid["annotations"]["summary"] == "%s GPU 1: Xid 48, the card failed" % TWO_GPUS
        down, = wait_for("the instance-down alert fires", lambda: firing(
            host, "LlmFleetInstanceDown", host=TWO_GPUS, gpu="0"), timeout=30)
        assert down["labels"]["severity"] == "critical" and down["labels"]["job"] == "llm-fleet-llama-server"
        assert down["annotations"]["summary"] == "%s GPU 0: llama-server@0 does not answer" % TWO_GPUS
        assert "`systemctl status llama-server@0`" in down["annotations"]["description"]
        # only what is wrong: the sound card, the other instance and the front (one server still up) are quiet
        assert not firing(host, "LlmFleetGpuEccUncorrectable", Hostname=TWO_GPUS, gpu="0")
        assert not firing(host, "LlmFleetGpuXid", Hostname=TWO_GPUS, gpu="0")
        assert not firing(host, "LlmFleetInstanceDown", host=TWO_GPUS, gpu="1")
        assert not firing(host, "LlmFleetFrontendNoServer", host=TWO_GPUS)
    finally:
        host.run("systemctl start llama-server@0.service")
        # what a GPU reset does: the volatile count cleared, the card's Xid lines deleted as the alert says
        drop_gpu_state(host, sick, ["ecc_uncorrected_volatile"])
        host.run("sed -i '/%s/d' %s" % (sick, XID_JOURNAL))
    wait_for("llama-server@0 serves again", lambda: serving(host, 8080), timeout=60)
    wait_until_up(host)
    wait_for("the alerts resolve", lambda: not (
        firing(host, "LlmFleetGpuEccUncorrectable", Hostname=TWO_GPUS)
        or firing(host, "LlmFleetGpuXid", Hostname=TWO_GPUS)
        or firing(host, "LlmFleetInstanceDown", host=TWO_GPUS, gpu="0")), timeout=30)
