"""roles/gpu_exporter/files/gpu_exporter.py run as the service runs it (its own process, the real
pynvml over the mock NVML, prometheus_client's HTTP server), scraped over HTTP and
parsed with prometheus_client's own parser: dcgm-exporter's names and labels, values
equal to what NVML reports, the health verdict, the allow-list."""
import json
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

from conftest import PROFILE_DIR, ROOT

DUAL = "2x-v100-sxm2-16gb-nvlink"
GIB = 1 << 30


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def exporter(gpu_host, tmp_path):
    """Start the exporter from a copy of the three files the role installs; yields
    (scrape(), env, extra) where extra() restarts it with other arguments."""
    app = tmp_path / "app"
    app.mkdir()
    shutil.copy(ROOT / "roles" / "gpu_exporter" / "files" / "gpu_exporter.py", app)
    shutil.copy(ROOT / "module_utils" / "gpu_health.py", app)  # the host library, on the path as the .pth puts it
    env = gpu_host(DUAL)
    procs = []

    def start(*args):
        port = free_port()
        proc = subprocess.Popen([sys.executable, str(app / "gpu_exporter.py"), "--listen", "127.0.0.1:%d" % port,
                                 "--hostname", "gpu-test", "--requested", str(tmp_path / "tuning.fact"),
                                 "--xid-journal", str(tmp_path / "xid-events.jsonl"),
                                 "--model-record", str(tmp_path / "model.fact")] + list(args),
                                env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        procs.append(proc)
        url = "http://127.0.0.1:%d/metrics" % port
        for _ in range(100):
            try:
                urllib.request.urlopen(url, timeout=2).read()
                break
            except OSError:
                assert proc.poll() is None, proc.stdout.read()
                time.sleep(0.1)
        return url

    def scrape(url):
        text = urllib.request.urlopen(url, timeout=10).read().decode()
        out = {}
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                out.setdefault(sample.name, []).append((sample.labels, sample.value))
        return out

    yield start, scrape, env, tmp_path
    for proc in procs:
        proc.kill()
        proc.wait()


def by_gpu(samples):
    return dict((labels["gpu"], (labels, value)) for labels, value in samples)


def test_dcgm_names_labels_and_values_equal_nvml(exporter):
    start, scrape, env, tmp_path = exporter
    (tmp_path / "tuning.fact").write_text(json.dumps({"settings": [
        {"uuid": "GPU-e07d35a9-6c21-4b8e-93f4-a5b10e6c2d98", "power_limit_w": 250, "locked_graphics_clock_mhz": 1380}]}))
    url = start()
    metrics = scrape(url)
    out = subprocess.run([sys.executable, "-c", (
        "import json,pynvml as n\nn.nvmlInit()\nr=[]\n"
        "for i in range(n.nvmlDeviceGetCount()):\n"
        " h=n.nvmlDeviceGetHandleByIndex(i);m=n.nvmlDeviceGetMemoryInfo(h,n.nvmlMemory_v2)\n"
        " r.append([n.nvmlDeviceGetUUID(h),n.nvmlDeviceGetName(h),n.nvmlDeviceGetPciInfo(h).busId,m.used//1048576,"
        "n.nvmlDeviceGetClockInfo(h,1),n.nvmlDeviceGetPowerUsage(h)/1000,n.nvmlDeviceGetEnforcedPowerLimit(h)/1000,"
        "n.nvmlDeviceGetTemperature(h,0)])\n"
        "print(json.dumps(r))")], env=env, capture_output=True, text=True, check=True).stdout
    nvml = json.loads(out)
    assert metrics["llm_fleet_gpu_exporter_nvml_up"][0][1] == 1
    used = by_gpu(metrics["DCGM_FI_DEV_FB_USED"])
    assert sorted(used) == ["0", "1"]
    for index, (uuid, name, bus, fb_used, sm, power, limit, temp) in enumerate(nvml):
        labels, value = used[str(index)]
        assert labels == {"gpu": str(index), "UUID": uuid, "pci_bus_id": bus, "device": "nvidia%d" % index,
                          "modelName": name, "Hostname": "gpu-test"}
        assert value == fb_used
        assert by_gpu(metrics["DCGM_FI_DEV_SM_CLOCK"])[str(index)][1] == sm
        assert by_gpu(metrics["DCGM_FI_DEV_POWER_USAGE"])[str(index)][1] == power
        assert by_gpu(metrics["DCGM_FI_DEV_POWER_MGMT_LIMIT"])[str(index)][1] == limit
        assert by_gpu(metrics["DCGM_FI_DEV_GPU_TEMP"])[str(index)][1] == temp
    # Volta: retired pages, no row remapping; two NVLink-paired cards: link error counters
    # the driver's reservation apart, as nvidia-smi and DCGM report it
    assert {v for _, v in metrics["DCGM_FI_DEV_FB_RESERVED"]} == {309}  # the profile's 324009984 bytes
    assert {v for _, v in metrics["DCGM_FI_DEV_RETIRED_DBE"]} == {0}
    assert "DCGM_FI_DEV_ROW_REMAP_FAILURE" not in metrics and "DCGM_FI_DEV_ROW_REMAP_PENDING" not in metrics
    assert {v for _, v in metrics["DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL"]} == {0}
    assert {v for _, v in metrics["DCGM_FI_DEV_CLOCK_THROTTLE_REASONS"]} == {1}  # idle
    assert {v for _, v in metrics["llm_fleet_gpu_healthy"]} == {1}
    assert [(l["gpu"], v) for l, v in metrics["llm_fleet_gpu_power_limit_requested_watts"]] == [("1", 250)]
    assert [(l["gpu"], v) for l, v in metrics["llm_fleet_gpu_clock_lock_requested_mhz"]] == [("1", 1380)]
    # no expected count asked, no plan recorded yet: none of their figures
    assert not {"llm_fleet_gpu_expected_count", "llm_fleet_plan_decode_tokens_per_second",
                "llm_fleet_model_filesystem_avail_bytes"} & set(metrics)


def test_what_the_inventory_and_the_plan_expect(exporter):
    """The GPU count the inventory expects, each instance's expected decode speed per
    stream (one stream, and every slot busy) and the model directory's free space: what
    the alerts compare with what the host shows (roles/prometheus)."""
    start, scrape, env, tmp_path = exporter
    models = tmp_path / "models"
    models.mkdir()
    (tmp_path / "model.fact").write_text(json.dumps({"model_dir": str(models), "plans": [
        {"gpu_index": 0, "parallel": 4, "expected_decode_tps": 80.0, "expected_aggregate_tps": 200.0},
        {"gpu_index": 1, "parallel": 1, "expected_decode_tps": 70.5, "expected_aggregate_tps": 70.5}]}))
    metrics = scrape(start("--expected-gpus", "2"))
    assert metrics["llm_fleet_gpu_expected_count"] == [({"Hostname": "gpu-test"}, 2)]
    assert sorted((l["gpu"], l["streams"], v) for l, v in metrics["llm_fleet_plan_decode_tokens_per_second"]) == [
        ("0", "1", 80.0), ("0", "4", 50.0), ("1", "1", 70.5)]
    fs = os.statvfs(str(models))
    [(labels, size)] = metrics["llm_fleet_model_filesystem_size_bytes"]
    assert labels == {"path": str(models), "Hostname": "gpu-test"} and size == fs.f_blocks * fs.f_frsize
    [(labels, avail)] = metrics["llm_fleet_model_filesystem_avail_bytes"]
    assert labels["path"] == str(models) and abs(avail - fs.f_bavail * fs.f_frsize) < 256 * (1 << 20)


def test_a_sick_card_shows_its_counters_and_its_verdict(exporter):
    start, scrape, env, tmp_path = exporter
    url = start()
    uuid = by_gpu(scrape(url)["DCGM_FI_DEV_FB_USED"])["1"][0]["UUID"]
    squatter = subprocess.Popen(["sleep", "60"])
    try:
        state = tmp_path / "run-mock-nvml"
        state.mkdir(exist_ok=True)
        (state / "state").write_text("%s.ecc_uncorrected_volatile=3\n%s.processes=%d:%d\n%s.nvlink_errors=0,0,7,0\n"
                                     % (uuid, uuid, squatter.pid, 2 * GIB, uuid))
        metrics = scrape(url)  # read again at every scrape: no restart
    finally:
        squatter.kill()
        squatter.wait()
    gpu1 = lambda name: by_gpu(metrics[name])["1"][1]  # noqa: E731
    assert gpu1("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL") == 3 and gpu1("DCGM_FI_DEV_ECC_DBE_AGG_TOTAL") == 3
    assert gpu1("DCGM_FI_DEV_FB_USED") == 2048  # what the process holds
    assert gpu1("DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL") == 7 * 6  # six links to its peer, summed
    assert gpu1("llm_fleet_gpu_healthy") == 0 and by_gpu(metrics["llm_fleet_gpu_healthy"])["0"][1] == 1
    assert sorted((l["check"], l["severity"]) for l, _ in metrics["llm_fleet_gpu_health_problem"]) == \
        [("ecc_uncorrectable", "fail"), ("foreign_process", "fail")]
    [(labels, value)] = metrics["llm_fleet_gpu_process_memory_bytes"]
    assert (labels["pid"], labels["process"], value) == (str(squatter.pid), "sleep", 2 * GIB)
    assert gpu1("DCGM_FI_DEV_CLOCK_THROTTLE_REASONS") == 0  # a process holds it: not idle


def test_xids_are_heard_through_nvml_events_journaled_and_gate_the_card(exporter):
    """The driver raises Xids (the mock's event source, as the kernel driver would): the
    exporter hears those raised after it listens (NVML keeps none for later), appends them
    to its journal and reports the last one per GPU under dcgm-exporter's name."""
    start, scrape, env, tmp_path = exporter
    state = tmp_path / "run-mock-nvml"
    state.mkdir(exist_ok=True)
    events = state / "xid_events"
    journal = tmp_path / "xid-events.jsonl"
    uuid = "GPU-e07d35a9-6c21-4b8e-93f4-a5b10e6c2d98"  # the profile's second card
    events.write_text("%s 79\n" % uuid)  # raised before anyone listened: lost, as with real NVML
    url = start()
    for _ in range(100):
        if scrape(url)["llm_fleet_gpu_exporter_xid_listening"][0][1] == 1:
            break
        time.sleep(0.1)
    assert by_gpu(scrape(url)["DCGM_FI_DEV_FB_USED"])["1"][0]["UUID"] == uuid
    with events.open("a") as f:
        f.write("%s 48\n%s 13\n" % (uuid, uuid))
    for _ in range(100):
        if journal.exists() and len(journal.read_text().splitlines()) == 2:
            break
        time.sleep(0.1)
    heard = [json.loads(line) for line in journal.read_text().splitlines()]
    assert [(e["uuid"], e["xid"]) for e in heard] == [(uuid, 48), (uuid, 13)]
    assert all(abs(e["time"] - time.time()) < 60 for e in heard)
    metrics = scrape(url)
    assert by_gpu(metrics["DCGM_FI_DEV_XID_ERRORS"])["1"][1] == 13  # the last one, as dcgm-exporter
    assert by_gpu(metrics["DCGM_FI_DEV_XID_ERRORS"])["0"][1] == 0
    assert by_gpu(metrics["llm_fleet_gpu_healthy"])["1"][1] == 0
    assert sorted((l["check"], l["severity"]) for l, _ in metrics["llm_fleet_gpu_health_problem"]) == \
        [("xid", "fail"), ("xid_other", "warn")]


def test_nvml_down_is_reported_not_a_crash(exporter, tmp_path):
    start, scrape, env, _ = exporter
    env["MOCK_NVML_PROFILE"] = str(tmp_path / "no-driver.profile")
    metrics = scrape(start())
    [(labels, value)] = metrics["llm_fleet_gpu_exporter_nvml_up"]
    assert value == 0 and "Driver Not Loaded" in labels["error"]
    assert "DCGM_FI_DEV_FB_USED" not in metrics
    # the cards expected are still said: none seen is what the GPU-missing alert needs
    assert [v for _, v in scrape(start("--expected-gpus", "2"))["llm_fleet_gpu_expected_count"]] == [2]


def test_clients_outside_the_allow_list_are_refused():
    import ipaddress
    sys.path[:0] = [str(ROOT / "roles" / "gpu_exporter" / "files"), str(ROOT / "module_utils")]
    import gpu_exporter

    def app(environ, start_response):
        start_response("200 OK", [])
        return [b"ok"]
    guarded = gpu_exporter.allow_list_app(app, [ipaddress.ip_network("127.0.0.0/8"),
                                                ipaddress.ip_network("10.1.0.0/16")])
    seen = []
    for addr in ("127.0.0.1", "10.1.2.3", "::ffff:10.1.2.3", "10.2.0.1", "::1", ""):
        guarded({"REMOTE_ADDR": addr}, lambda status, headers: seen.append((addr, status[:3])))
    assert seen == [("127.0.0.1", "200"), ("10.1.2.3", "200"), ("::ffff:10.1.2.3", "200"), ("10.2.0.1", "403"),
                    ("::1", "403"), ("", "403")]
    with pytest.raises(ValueError, match="ADDRESS:PORT"):
        gpu_exporter.parse_listen("9400")
    assert gpu_exporter.parse_listen("[::1]:9400") == ("::1", 9400)


def test_a_lost_card_does_not_blind_the_exporter_to_the_other(exporter):
    start, scrape, env, tmp_path = exporter
    state = tmp_path / "run-mock-nvml"
    state.mkdir(exist_ok=True)
    (state / "state").write_text("GPU-e07d35a9-6c21-4b8e-93f4-a5b10e6c2d98.lost=1\n")
    metrics = scrape(start())
    assert metrics["llm_fleet_gpu_exporter_nvml_up"][0][1] == 1
    assert sorted((l["gpu"], v) for l, v in metrics["llm_fleet_gpu_lost"]) == [("0", 0), ("1", 1)]
    assert sorted(by_gpu(metrics["DCGM_FI_DEV_FB_USED"])) == ["0"]


def test_an_ampere_card_reports_its_row_remapper(exporter):
    start, scrape, env, tmp_path = exporter
    profile = tmp_path / "ampere.profile"
    text = (PROFILE_DIR / (DUAL + ".profile")).read_text().replace("gpu.architecture=5", "gpu.architecture=7")
    profile.write_text(text + "\ngpu1.remapped_rows_pending=1\ngpu1.remapped_rows_uncorrectable=2\n")
    env["MOCK_NVML_PROFILE"] = str(profile)
    metrics = scrape(start())
    assert "DCGM_FI_DEV_RETIRED_PENDING" not in metrics
    assert sorted((l["gpu"], v) for l, v in metrics["DCGM_FI_DEV_ROW_REMAP_PENDING"]) == [("0", 0), ("1", 1)]
    assert sorted((l["gpu"], v) for l, v in metrics["DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS"]) == [("0", 0), ("1", 2)]
    assert {v for _, v in metrics["DCGM_FI_DEV_ROW_REMAP_FAILURE"]} == {0}
