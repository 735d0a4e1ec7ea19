"""roles/prometheus's filters: the targets the hosts' stage facts name (a host that does not
answer keeps its own), the ones the monitoring host can scrape (another host's loopback is
out of reach), and the fronts' split by key."""
import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location(
    "prometheus_filters", ROOT / "roles" / "prometheus" / "filter_plugins" / "scrape_targets.py")
filters = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(filters)
reachable = filters.llm_fleet_reachable_targets


def group(target, host, job="llm-fleet-gpu", **labels):
    return {"targets": [target], "labels": dict(labels, job=job, host=host)}


def test_another_host_s_loopback_is_left_out_and_named():
    groups = [group("127.0.0.1:9400", "mon"), group("127.0.0.1:9400", "gpu-a"), group("[::1]:9400", "gpu-b"),
              group("localhost:9400", "gpu-c"), group("127.0.1.1:9400", "gpu-d")]
    result = reachable(groups, "mon")
    assert result["targets"] == [group("127.0.0.1:9400", "mon")]
    assert [(u["host"], u["target"]) for u in result["unreachable"]] == [
        ("gpu-a", "127.0.0.1:9400"), ("gpu-b", "[::1]:9400"), ("gpu-c", "localhost:9400"), ("gpu-d", "127.0.1.1:9400")]


def test_names_and_network_addresses_are_kept_with_their_labels():
    front = group("gpu-a.example.internal:8443", "gpu-a", job="llm-fleet-llama-server", gpu="0",
                  __metrics_path__="/metrics/gpu0", __scheme__="https")
    groups = [group("10.0.0.7:9400", "gpu-a"), group("[fd00::7]:9400", "gpu-b"), front]
    result = reachable(groups, "mon")
    assert result == {"targets": groups, "unreachable": []}


def test_nothing_written_yet_is_nothing_to_scrape():
    assert reachable([], "mon") == {"targets": [], "unreachable": []}
    assert reachable(None, "mon") == {"targets": [], "unreachable": []}


def test_fronts_are_split_by_the_key_each_host_wants():
    """Prometheus sends one bearer token per scrape configuration: a host whose group sets
    another llm_fleet_api_key gets its own, the job labels stay; the GPU exporters are
    not fronts."""
    front_groups = filters.llm_fleet_front_groups
    groups = [group("b:8443", "gpu-b", job="llm-fleet-llama-server", gpu="0"),
              group("a:8443", "gpu-a", job="llm-fleet-llama-server", gpu="0"),
              group("a:8443", "gpu-a", job="llm-fleet-frontend"),
              group("c:8443", "gpu-c", job="llm-fleet-llama-server", gpu="1"),
              group("10.0.0.7:9400", "gpu-a")]
    split = front_groups(groups, {"gpu-a": "k1", "gpu-b": "k2"}, "k1")
    assert [(g["suffix"], g["key"]) for g in split] == [("", "k1"), ("-2", "k2")]
    assert [x["labels"]["host"] for x in split[0]["llama_servers"]] == ["gpu-a", "gpu-c"]  # gpu-c: the fallback
    assert [x["labels"]["host"] for x in split[0]["frontends"]] == ["gpu-a"]
    assert [x["labels"]["host"] for x in split[1]["llama_servers"]] == ["gpu-b"] and split[1]["frontends"] == []
    # one key for all (or no front): one configuration, as before
    assert [(g["suffix"], g["key"]) for g in front_groups(groups, {}, "k")] == [("", "k")]
    assert front_groups([], {}, "") == [{"suffix": "", "key": "", "llama_servers": [], "frontends": []}]


# ---- llm_fleet_fact_targets: the targets the hosts' stage facts name -------------------
fact_targets = filters.llm_fleet_fact_targets
PEM_A = "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----"
PEM_B = "-----BEGIN CERTIFICATE-----\nBBBB\n-----END CERTIFICATE-----"


def read(host, gpu_exporter=None, frontend=None):
    """One host as the role hands it over: what its stage facts name."""
    targets, pem = frontend or ([], "")
    return {"host": host, "read": True, "why": "", "gpu": gpu_exporter or [], "fronts": targets, "certificate": pem}


def down(host):
    return {"host": host, "read": False, "why": "Failed to connect to the host via ssh"}


def test_each_stage_s_fact_gives_its_own_targets_and_the_front_its_certificate():
    gpu_a = group("10.0.0.7:9400", "gpu-a")
    inst_a = group("10.0.0.7:8443", "gpu-a", job="llm-fleet-llama-server", gpu="0")
    front_a = group("10.0.0.7:8443", "gpu-a", job="llm-fleet-frontend")
    fleet = group("10.0.0.9:443", "front", job="llm-fleet-frontend")
    result = fact_targets([read("gpu-a", [gpu_a], ([inst_a, front_a], PEM_A + "\n")),
                           read("front", frontend=([fleet], PEM_B))])
    assert result == {"gpu": [gpu_a], "fronts": [inst_a, front_a, fleet], "certificates": [PEM_A, PEM_B],
                      "unread": [], "carried": []}


def test_a_host_that_does_not_answer_keeps_what_prometheus_had_for_it():
    """Dropping a down host's targets would hide it: up never goes to 0, no alert fires."""
    gpu_a, gpu_b = group("gpu-a:9400", "gpu-a"), group("gpu-b:9400", "gpu-b")
    inst_b = group("gpu-b:8443", "gpu-b", job="llm-fleet-llama-server", gpu="0")
    previous = [group("gpu-a:9400", "gpu-a", stale="yes"), gpu_b, inst_b]
    result = fact_targets([read("gpu-a", [gpu_a]), down("gpu-b")], previous, PEM_B)
    assert result["gpu"] == [gpu_a, gpu_b]  # gpu-a's from its fact now, not the stale copy
    assert result["fronts"] == [inst_b]
    assert result["certificates"] == [PEM_B]
    assert result["carried"] == ["gpu-b"]
    assert [u["host"] for u in result["unread"]] == ["gpu-b"]
    assert "ssh" in result["unread"][0]["why"]


def test_a_host_read_without_the_stage_s_fact_has_no_target_of_it():
    """Uninstalled (or never deployed): its old targets go, even though Prometheus had them."""
    previous = [group("gpu-a:9400", "gpu-a")]
    result = fact_targets([read("gpu-a")], previous, PEM_A)
    assert result == {"gpu": [], "fronts": [], "certificates": [], "unread": [], "carried": []}
