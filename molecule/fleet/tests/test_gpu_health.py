"""The GPU exporter on the two-GPU host: what it serves is what NVML reports. (The
health gate's test, a sick second card, is the first of test_split.py: the split
deploy there is the run after the card is healthy again.)"""
import os
import shlex

from prometheus_client.parser import text_string_to_metric_families

from hostprobe import nvml_probe, node, only_in_scenario, stage_fact
from test_llama_server import TWO_GPUS

pytestmark = only_in_scenario("fleet")

def scrape(host):
    """The GPU exporter's metrics as a client on the host reads them: {name: {gpu: (labels, value)}}."""
    text = host.check_output("python3 -c %s" % shlex.quote(
        "import urllib.request as u;print(u.urlopen('http://127.0.0.1:9400/metrics').read().decode())"))
    out = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out.setdefault(sample.name, {})[sample.labels.get("gpu")] = (sample.labels, sample.value)
    return out


def test_the_gpu_exporter_reports_what_nvml_reports():
    host = node(TWO_GPUS)
    metrics, nvml = scrape(host), nvml_probe(host)
    assert metrics["llm_fleet_gpu_exporter_nvml_up"][None][1] == 1
    # it listens for Xids (NVML's event API) under its hardened unit, and heard none
    assert metrics["llm_fleet_gpu_exporter_xid_listening"][None][1] == 1
    assert [metrics["DCGM_FI_DEV_XID_ERRORS"][str(g["index"])][1] for g in nvml["gpus"]] == [0] * len(nvml["gpus"])
    assert sorted(metrics["DCGM_FI_DEV_FB_USED"]) == [str(g["index"]) for g in nvml["gpus"]]
    for gpu in nvml["gpus"]:
        labels, used = metrics["DCGM_FI_DEV_FB_USED"][str(gpu["index"])]
        assert labels == {"gpu": str(gpu["index"]), "UUID": gpu["uuid"], "pci_bus_id": gpu["pci_bus_id"],
                          "device": "nvidia%d" % gpu["index"], "modelName": gpu["name"], "Hostname": TWO_GPUS}
        assert used == gpu["memory_used_v2_bytes"] // (1 << 20)
        assert metrics["DCGM_FI_DEV_POWER_MGMT_LIMIT"][str(gpu["index"])][1] == gpu["power_limit_mw"] / 1000
        assert metrics["DCGM_FI_DEV_ECC_DBE_VOL_TOTAL"][str(gpu["index"])][1] == 0
        assert metrics["llm_fleet_gpu_healthy"][str(gpu["index"])][1] == 1
    # the exporter runs as its own unprivileged user, on loopback only
    assert host.check_output("systemctl show -P User llm-fleet-gpu-exporter.service") == "llm-gpu-exporter"
    assert host.socket("tcp://127.0.0.1:9400").is_listening and not host.socket("tcp://0.0.0.0:9400").is_listening


def test_every_gpu_host_s_fact_names_its_exporter_for_prometheus():
    """The prometheus stage reads these from the hosts' facts (no file on the controller)."""
    targets = []
    for name in ("fleet-sxm2-32gb", "fleet-sxm2-16gb", TWO_GPUS):
        fact = stage_fact(node(name), "gpu_exporter")
        assert [g["labels"]["host"] for g in fact["prometheus_targets"]] == [name]
        targets += fact["prometheus_targets"]
    # loopback exporters (the default): a target only a Prometheus on that host reaches
    assert all(t["targets"] == ["127.0.0.1:9400"] and t["labels"]["job"] == "llm-fleet-gpu" for t in targets)
    assert not os.path.exists(os.path.join(os.environ["MOLECULE_EPHEMERAL_DIRECTORY"], "reports", "prometheus"))
