"""roles/prometheus's llm_fleet_reachable_targets: the stages' file_sd targets as the
monitoring host can scrape them (another host's loopback is out of reach)."""
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
