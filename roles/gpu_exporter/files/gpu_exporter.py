# -*- coding: utf-8 -*-
"""The fleet's GPU exporter: NVML's figures of every GPU as Prometheus metrics under
NVIDIA dcgm-exporter's names and labels (so its dashboards work unchanged), the GPU
health verdict of module_utils/gpu_health.py, and what gpu_tuning asked for next to
what the card applies. Served by prometheus_client, one NVML read per scrape.

A program on the host (roles/gpu_exporter installs it), run with the project venv's
Python, which has the host library (gpu_health, from module_utils; fleet_common installs
it) on its path:
    /opt/llm-fleet/venv/bin/python gpu_exporter.py --listen 127.0.0.1:9400 [--allow 10.0.0.0/24 ...]

Names: dcgm-exporter's (etc/default-counters.csv), all typed gauge: prometheus_client
would append `_total` to a counter's name, and the names must stay exactly NVIDIA's
(PromQL's rate() works the same on them). Units as DCGM's: MiB, MHz, W, C, %.
Python 3.8-compatible (Ubuntu 20.04 hosts run it)."""
from __future__ import absolute_import, division, print_function

__metaclass__ = type

import json
import os
import socket
import sys
import time

from gpu_health import (FOREIGN_POLICIES, LOST_ERRORS, XID_JOURNAL, assess, read_health, read_readmitted,
                        read_xid_journal)

MIB = 1048576
LABELS = ("gpu", "UUID", "pci_bus_id", "device", "modelName", "Hostname")
# nvmlNvLinkErrorCounter_t -> dcgm-exporter's field
NVLINK_ERRORS = (
    (0, "DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL", "NVLink retries."),
    (1, "DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL", "NVLink recovery errors."),
    (2, "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL", "NVLink flow-control CRC errors."),
    (3, "DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL", "NVLink data CRC errors."),
)
NVLINK_MAX_LINKS = 18
_CLOCK_GRAPHICS, _CLOCK_SM, _CLOCK_MEM = 0, 1, 2
_TEMPERATURE_GPU = 0


def _call(nvml, func, *args):
    try:
        return func(*args)
    except nvml.NVMLError:
        return None


def _text(value):
    return value.decode() if isinstance(value, bytes) else value


def read_requested(path):
    """{uuid: gpu_tuning's settings entry} from the stage's local fact ({} without one)."""
    try:
        with open(path) as f:
            settings = json.load(f).get("settings") or []
    except (IOError, OSError, ValueError):
        return {}
    return dict((s.get("uuid"), s) for s in settings if s.get("uuid"))


def read_model_record(path):
    """The model stage's record (its local fact, the same as /etc/llm-fleet/plan.json):
    {"plans": [...], "model_dir": ...}; {} without one."""
    try:
        with open(path) as f:
            record = json.load(f)
    except (IOError, OSError, ValueError):
        return {}
    return record if isinstance(record, dict) else {}


def collect_model(record, hostname):
    """What the model stage planned, as metric families (collect's tuples): each instance's
    expected decode speed per stream (1 stream, and every slot busy), for the alert that
    compares it with llama-server's own figures, and the space left on the model
    directory's filesystem. Independent of NVML."""
    families = []
    expected = []
    for plan in record.get("plans") or []:
        if plan.get("gpu_index") is None or plan.get("expected_decode_tps") is None:
            continue
        labels = {"gpu": str(plan["gpu_index"]), "Hostname": hostname}
        expected.append((dict(labels, streams="1"), float(plan["expected_decode_tps"])))
        parallel = int(plan.get("parallel") or 1)
        if parallel > 1 and plan.get("expected_aggregate_tps") is not None:
            expected.append((dict(labels, streams=str(parallel)), float(plan["expected_aggregate_tps"]) / parallel))
    if expected:
        families.append(("llm_fleet_plan_decode_tokens_per_second",
                         "Decode speed of each stream the plan expects with `streams` streams decoding (in tok/s).",
                         expected))
    model_dir = record.get("model_dir")
    if model_dir:
        try:
            fs = os.statvfs(model_dir)
        except OSError:
            fs = None
        if fs is not None:
            labels = {"path": model_dir, "Hostname": hostname}
            families.append(("llm_fleet_model_filesystem_avail_bytes",
                             "Bytes free for the model files on the model directory's filesystem.",
                             [(labels, fs.f_bavail * fs.f_frsize)]))
            families.append(("llm_fleet_model_filesystem_size_bytes",
                             "Size of the model directory's filesystem (in bytes).",
                             [(labels, fs.f_blocks * fs.f_frsize)]))
    return families


def sample_gpu(nvml, index, xid_events=None):
    """One GPU's figures: {field: value}; a figure the card does not report is left out."""
    handle = nvml.nvmlDeviceGetHandleByIndex(index)
    minor = _call(nvml, nvml.nvmlDeviceGetMinorNumber, handle)
    # v2 reports the driver's reservation apart (R510+), as nvidia-smi's memory.used and DCGM's
    # FB_USED leave it out: on an H200 with llama-server, v1 said 26769 MiB, nvidia-smi 26155
    # (benchmarks/results/gpu-host-2026-12-02b). v1 only where the driver has no v2.
    memory = _call(nvml, nvml.nvmlDeviceGetMemoryInfo, handle, nvml.nvmlMemory_v2) \
        if getattr(nvml, "nvmlMemory_v2", None) else None
    memory = memory or nvml.nvmlDeviceGetMemoryInfo(handle)
    util = _call(nvml, nvml.nvmlDeviceGetUtilizationRates, handle)
    power = _call(nvml, nvml.nvmlDeviceGetPowerUsage, handle)
    limit = _call(nvml, nvml.nvmlDeviceGetEnforcedPowerLimit, handle)
    reasons = _call(nvml, nvml.nvmlDeviceGetCurrentClocksThrottleReasons, handle)
    values = {
        "DCGM_FI_DEV_FB_USED": int(memory.used) // MIB,
        "DCGM_FI_DEV_FB_FREE": int(memory.free) // MIB,
        "DCGM_FI_DEV_FB_RESERVED": int(memory.reserved) // MIB if hasattr(memory, "reserved") else None,
        "DCGM_FI_DEV_SM_CLOCK": _call(nvml, nvml.nvmlDeviceGetClockInfo, handle, _CLOCK_SM),
        "DCGM_FI_DEV_MEM_CLOCK": _call(nvml, nvml.nvmlDeviceGetClockInfo, handle, _CLOCK_MEM),
        "DCGM_FI_DEV_GPU_TEMP": _call(nvml, nvml.nvmlDeviceGetTemperature, handle, _TEMPERATURE_GPU),
        "DCGM_FI_DEV_POWER_USAGE": power / 1000.0 if power is not None else None,
        "DCGM_FI_DEV_POWER_MGMT_LIMIT": limit / 1000.0 if limit is not None else None,
        "DCGM_FI_DEV_GPU_UTIL": util.gpu if util is not None else None,
        "DCGM_FI_DEV_MEM_COPY_UTIL": util.memory if util is not None else None,
        "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS": reasons,
    }
    health = read_health(nvml, handle, xid_events=xid_events)
    ecc = health["ecc_errors"]
    values.update({
        "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL": ecc["corrected_volatile"],
        "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL": ecc["uncorrected_volatile"],
        "DCGM_FI_DEV_ECC_SBE_AGG_TOTAL": ecc["corrected_aggregate"],
        "DCGM_FI_DEV_ECC_DBE_AGG_TOTAL": ecc["uncorrected_aggregate"],
    })
    pages = health["retired_pages"]
    if pages:
        values.update({"DCGM_FI_DEV_RETIRED_SBE": pages["single_bit"], "DCGM_FI_DEV_RETIRED_DBE": pages["double_bit"],
                       "DCGM_FI_DEV_RETIRED_PENDING": int(bool(pages["pending"]))})
    rows = health["remapped_rows"]
    if rows:
        values.update({"DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS": rows["correctable"],
                       "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS": rows["uncorrectable"],
                       "DCGM_FI_DEV_ROW_REMAP_PENDING": int(rows["pending"]),
                       "DCGM_FI_DEV_ROW_REMAP_FAILURE": int(rows["failure"])})
    for counter, field, _ in NVLINK_ERRORS:
        total, seen = 0, False
        for link in range(NVLINK_MAX_LINKS):
            if not _call(nvml, nvml.nvmlDeviceGetNvLinkState, handle, link):
                continue
            value = _call(nvml, nvml.nvmlDeviceGetNvLinkErrorCounter, handle, link, counter)
            if value is not None:
                total, seen = total + int(value), True
        values[field] = total if seen else None
    if health["xid_events"] is not None:  # dcgm-exporter's: the last Xid (since boot here), 0 for none
        values["DCGM_FI_DEV_XID_ERRORS"] = health["xid_events"][-1]["xid"] if health["xid_events"] else 0
    return {
        "labels": {
            "gpu": str(index),
            "UUID": _text(nvml.nvmlDeviceGetUUID(handle)),
            "pci_bus_id": _text(nvml.nvmlDeviceGetPciInfo(handle).busId),
            "device": "nvidia%d" % minor if minor is not None else "nvidia%d" % index,
            "modelName": _text(nvml.nvmlDeviceGetName(handle)),
        },
        "values": dict((k, v) for k, v in values.items() if v is not None),
        "health": health,
    }


HELP = {
    "DCGM_FI_DEV_FB_USED": "Framebuffer memory used (in MiB).",
    "DCGM_FI_DEV_FB_FREE": "Framebuffer memory free (in MiB).",
    "DCGM_FI_DEV_FB_RESERVED": "Framebuffer memory the driver reserves (in MiB).",
    "DCGM_FI_DEV_SM_CLOCK": "SM clock frequency (in MHz).",
    "DCGM_FI_DEV_MEM_CLOCK": "Memory clock frequency (in MHz).",
    "DCGM_FI_DEV_GPU_TEMP": "GPU temperature (in C).",
    "DCGM_FI_DEV_POWER_USAGE": "Power draw (in W).",
    "DCGM_FI_DEV_POWER_MGMT_LIMIT": "Power limit the card enforces (in W).",
    "DCGM_FI_DEV_GPU_UTIL": "GPU utilization (in %).",
    "DCGM_FI_DEV_MEM_COPY_UTIL": "Memory utilization (in %).",
    "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS": "Why the clocks are held down (NVML's bit mask).",
    "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL": "Single-bit (corrected) ECC errors since boot.",
    "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL": "Double-bit (uncorrectable) ECC errors since boot.",
    "DCGM_FI_DEV_ECC_SBE_AGG_TOTAL": "Single-bit ECC errors over the card's life.",
    "DCGM_FI_DEV_ECC_DBE_AGG_TOTAL": "Double-bit ECC errors over the card's life.",
    "DCGM_FI_DEV_RETIRED_SBE": "Pages retired for repeated single-bit errors.",
    "DCGM_FI_DEV_RETIRED_DBE": "Pages retired for double-bit errors.",
    "DCGM_FI_DEV_RETIRED_PENDING": "1 when a page waits for retirement (at the next reset).",
    "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS": "Rows remapped for correctable errors.",
    "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS": "Rows remapped for uncorrectable errors.",
    "DCGM_FI_DEV_ROW_REMAP_PENDING": "1 when a row remapping waits for the next reset.",
    "DCGM_FI_DEV_ROW_REMAP_FAILURE": "1 when a row remapping failed.",
    "DCGM_FI_DEV_XID_ERRORS": "Value of the last XID error encountered (since boot; 0: none).",
}
HELP.update((field, help_) for _, field, help_ in NVLINK_ERRORS)


def collect(nvml, hostname, requested=None, foreign_policy="refuse", xid_events=None, readmitted=None):
    """Every metric family of one scrape, as (name, help, [(labels, value)]) tuples
    (NVML already initialised; xid_events: the Xid journal read back; readmitted: the cards
    the llama_server stage re-admitted, read_readmitted's answer, judged against the counts
    they were accepted with). Raises nvml.NVMLError when NVML stops answering."""
    requested = requested or {}
    families = {}

    def add(name, help_, labels, value):
        families.setdefault(name, (help_, []))[1].append((labels, value))

    for index in range(nvml.nvmlDeviceGetCount()):
        try:
            gpu = sample_gpu(nvml, index, xid_events)
        except nvml.NVMLError as err:
            if getattr(err, "value", None) not in LOST_ERRORS:
                raise
            # a card NVML counts but cannot reach (fell off the bus): only its index is known
            add("llm_fleet_gpu_lost", "1 when NVML counts the GPU but cannot reach it (GPU is lost, Xid 79).",
                {"gpu": str(index), "Hostname": hostname}, 1)
            continue
        add("llm_fleet_gpu_lost", "1 when NVML counts the GPU but cannot reach it (GPU is lost, Xid 79).",
            {"gpu": str(index), "Hostname": hostname}, 0)
        labels = dict(gpu["labels"], Hostname=hostname)
        for field, value in sorted(gpu["values"].items()):
            add(field, HELP[field], labels, value)
        problems = assess(gpu["health"], foreign_policy, readmitted=(readmitted or {}).get(labels["UUID"]))
        add("llm_fleet_gpu_healthy", "1 when the GPU passes the fleet's health check (module_utils/gpu_health.py).",
            labels, 0 if any(p["severity"] == "fail" for p in problems) else 1)
        for problem in problems:
            add("llm_fleet_gpu_health_problem", "A problem the GPU health check found (check, severity).",
                dict(labels, check=problem["check"], severity=problem["severity"]), 1)
        for proc in gpu["health"]["processes"]:
            if proc.get("used_bytes") is not None:
                add("llm_fleet_gpu_process_memory_bytes", "GPU memory a compute process holds.",
                    dict(labels, pid=str(proc["pid"]), process=proc.get("name") or ""), proc["used_bytes"])
        wanted = requested.get(labels["UUID"]) or {}
        if wanted.get("power_limit_w") is not None:
            add("llm_fleet_gpu_power_limit_requested_watts", "The power limit the gpu_tuning stage set (in W).",
                labels, float(wanted["power_limit_w"]))
        if wanted.get("locked_graphics_clock_mhz") is not None:
            add("llm_fleet_gpu_clock_lock_requested_mhz", "The graphics clock the gpu_tuning stage locked (in MHz).",
                labels, float(wanted["locked_graphics_clock_mhz"]))
    return [(name, help_, samples) for name, (help_, samples) in sorted(families.items())]


class NvmlCollector(object):
    """A prometheus_client collector: NVML initialised once, again after it failed
    (a driver upgrade without reboot answers LIB_RM_VERSION_MISMATCH until the reboot)."""

    def __init__(self, nvml, hostname, requested_path, foreign_policy="refuse", xid_journal=None, xid_status=None,
                 expected_gpus=None, model_record_path=None):
        self.nvml, self.hostname, self.requested_path = nvml, hostname, requested_path
        self.foreign_policy, self.xid_journal = foreign_policy, xid_journal
        self.xid_status = xid_status if xid_status is not None else {}
        self.expected_gpus, self.model_record_path = expected_gpus, model_record_path
        self.ready = False

    def collect(self):
        from prometheus_client.core import GaugeMetricFamily
        error = None
        families = []
        try:
            if not self.ready:
                self.nvml.nvmlInit()
                self.ready = True
            xids = read_xid_journal(self.xid_journal) if self.xid_journal else None
            if xids is None and self.xid_status.get("listening"):
                xids = {}  # listening, no Xid yet
            families = collect(self.nvml, self.hostname, read_requested(self.requested_path), self.foreign_policy,
                               xids, read_readmitted())
        except self.nvml.NVMLError as err:
            error = str(err)
            if self.ready:
                try:
                    self.nvml.nvmlShutdown()
                except self.nvml.NVMLError:
                    pass
            self.ready = False
        up = GaugeMetricFamily("llm_fleet_gpu_exporter_nvml_up", "1 when NVML answered this scrape.",
                               labels=["Hostname", "error"])
        up.add_metric([self.hostname, error or ""], 0 if error else 1)
        yield up
        listening = GaugeMetricFamily("llm_fleet_gpu_exporter_xid_listening",
                                      "1 when the exporter hears the GPUs' Xid events (NVML's event API).",
                                      labels=["Hostname"])
        listening.add_metric([self.hostname], 1 if self.xid_status.get("listening") else 0)
        yield listening
        if self.expected_gpus is not None:  # said even when NVML is down: the alert compares the cards seen
            expected = GaugeMetricFamily("llm_fleet_gpu_expected_count",
                                         "GPUs the host should show (the inventory's llm_fleet_expected_gpu_count).",
                                         labels=["Hostname"])
            expected.add_metric([self.hostname], self.expected_gpus)
            yield expected
        if self.model_record_path:
            families += collect_model(read_model_record(self.model_record_path), self.hostname)
        for name, help_, samples in families:
            family = GaugeMetricFamily(name, help_, labels=sorted(samples[0][0]))
            for labels, value in samples:
                family.add_metric([labels[k] for k in sorted(labels)], value)
            yield family


XID_CRITICAL = 0x8  # nvmlEventTypeXidCriticalError


def _address(handle):
    """An NVML device handle (a ctypes pointer) as a comparable key."""
    import ctypes
    return ctypes.cast(handle, ctypes.c_void_p).value


def record_xid(path, uuid, xid, when=None):
    """Append one Xid to the journal the health gate reads (one JSON line, flushed)."""
    line = json.dumps({"time": when if when is not None else time.time(), "uuid": uuid, "xid": int(xid)})
    with open(path, "a") as f:
        f.write(line + "\n")
        f.flush()
        os.fsync(f.fileno())


def listen_for_xids(nvml, journal, stop=None, wait_ms=5000, retry_s=10.0, log=None, status=None):
    """NVML's event API, as dcgm-exporter's XID field: every critical Xid of every GPU is
    appended to the journal as it happens (NVML keeps none for later). Runs until stop
    (a threading.Event) is set; when NVML fails (a driver reload), starts over after
    retry_s. A GPU that cannot report events is named once and skipped. status["listening"]
    says whether it is registered now (the exporter reports it)."""
    log = log or (lambda message: print(message, file=sys.stderr, flush=True))
    status = status if status is not None else {}
    while stop is None or not stop.is_set():
        event_set = None
        try:
            nvml.nvmlInit()
            try:
                event_set = nvml.nvmlEventSetCreate()
                # UUIDs read now: a card that raised Xid 79 may answer nothing afterwards
                uuids = {}
                for index in range(nvml.nvmlDeviceGetCount()):
                    try:  # (a lost card has no handle: the others are still heard)
                        handle = nvml.nvmlDeviceGetHandleByIndex(index)
                        uuid = _text(nvml.nvmlDeviceGetUUID(handle))
                        nvml.nvmlDeviceRegisterEvents(handle, XID_CRITICAL, event_set)
                        uuids[_address(handle)] = uuid
                    except nvml.NVMLError as err:
                        log("GPU %d cannot report Xid events (%s): its Xids are not seen here" % (index, err))
                log("listening for Xid events on %d GPU(s); journal %s" % (len(uuids), journal))
                status["listening"] = len(uuids) > 0
                while stop is None or not stop.is_set():
                    try:
                        data = nvml.nvmlEventSetWait_v2(event_set, wait_ms)
                    except nvml.NVMLError as err:
                        if getattr(err, "value", None) == getattr(nvml, "NVML_ERROR_TIMEOUT", 10):
                            continue
                        raise
                    uuid = uuids.get(_address(data.device), "unknown")
                    record_xid(journal, uuid, data.eventData)
                    log("Xid %d on GPU %s" % (data.eventData, uuid))
            finally:
                status["listening"] = False
                if event_set is not None:
                    try:
                        nvml.nvmlEventSetFree(event_set)
                    except nvml.NVMLError:
                        pass
                nvml.nvmlShutdown()
        except nvml.NVMLError as err:
            log("Xid listener: NVML failed (%s); again in %.0f s" % (err, retry_s))
            if stop is not None:
                stop.wait(retry_s)
            else:
                time.sleep(retry_s)


def allow_list_app(app, networks):
    """WSGI middleware: 403 to a client outside the allowed networks (ipaddress objects)."""
    import ipaddress

    def guarded(environ, start_response):
        try:
            client = ipaddress.ip_address(environ.get("REMOTE_ADDR", "").split("%")[0])
        except ValueError:
            client = None
        if client is not None and client.version == 6 and client.ipv4_mapped:
            client = client.ipv4_mapped
        if client is None or not any(client in net for net in networks):
            start_response("403 Forbidden", [("Content-Type", "text/plain")])
            return [b"not in the exporter's allow-list\n"]
        return app(environ, start_response)
    return guarded


def parse_listen(text):
    """'127.0.0.1:9400' or '[::1]:9400' -> (host, port)."""
    host, _, port = text.rpartition(":")
    if not host or not port.isdigit():
        raise ValueError("--listen %r: use ADDRESS:PORT, e.g. 127.0.0.1:9400 or [::1]:9400" % text)
    return host.strip("[]"), int(port)


def main(argv=None):
    import argparse
    import ipaddress
    from socketserver import ThreadingMixIn
    from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

    import pynvml
    from prometheus_client import make_wsgi_app
    from prometheus_client.core import REGISTRY

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--listen", default="127.0.0.1:9400")
    parser.add_argument("--allow", action="append", default=[],
                        help="a client network allowed besides loopback (repeat); none: loopback only")
    parser.add_argument("--hostname", default=socket.gethostname())
    parser.add_argument("--requested", default="/etc/ansible/facts.d/llm_fleet_gpu_tuning.fact")
    parser.add_argument("--foreign-processes", default="refuse", choices=FOREIGN_POLICIES)
    parser.add_argument("--expected-gpus", type=int, default=None,
                        help="how many GPUs the host should show (exported for the GPU-missing alert)")
    parser.add_argument("--model-record", default="/etc/ansible/facts.d/llm_fleet_model.fact",
                        help="the model stage's record: each instance's expected decode speed and the model "
                             "directory, whose filesystem's free space is exported; '' for none")
    parser.add_argument("--xid-journal", default=XID_JOURNAL,
                        help="where heard Xids are appended (the health gate reads it; keep it on a tmpfs "
                             "so that a reboot clears it); '' to not listen")
    args = parser.parse_args(argv)
    host, port = parse_listen(args.listen)
    networks = [ipaddress.ip_network(n, strict=False) for n in ["127.0.0.0/8", "::1/128"] + args.allow]

    xid_status = {}
    REGISTRY.register(NvmlCollector(pynvml, args.hostname, args.requested, args.foreign_processes,
                                    args.xid_journal or None, xid_status, args.expected_gpus,
                                    args.model_record or None))
    if args.xid_journal:
        import threading
        threading.Thread(target=listen_for_xids, args=(pynvml, args.xid_journal), kwargs={"status": xid_status},
                         name="xid", daemon=True).start()

    class Server(ThreadingMixIn, WSGIServer):
        daemon_threads = True
        address_family = socket.AF_INET6 if ":" in host else socket.AF_INET

    class QuietHandler(WSGIRequestHandler):
        def log_message(self, *args):  # one line per scrape would flood the journal
            pass

    httpd = make_server(host, port, allow_list_app(make_wsgi_app(), networks), Server, QuietHandler)
    print("gpu exporter on %s:%d (allowed: %s)" % (host, port, ", ".join(str(n) for n in networks)), flush=True)
    httpd.serve_forever()


if __name__ == "__main__":
    main()
