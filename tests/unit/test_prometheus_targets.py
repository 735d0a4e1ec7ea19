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
