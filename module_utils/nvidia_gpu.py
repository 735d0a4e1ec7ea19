# -*- coding: utf-8 -*-
# Read NVIDIA GPUs through NVML (the pynvml / nvidia-ml-py package).
#
# Shared by the nvidia_gpu_facts module and the GPU tuning tool. Kept free of
# Ansible imports but its sibling gpu_health, so it is unit-testable on its own; Python 3.8-compatible
# because Ubuntu 20.04 hosts run it.
from __future__ import absolute_import, division, print_function

__metaclass__ = type

from ansible.module_utils.gpu_health import LOST_ERRORS, read_health, read_xid_journal

# NVML enum values used below (stable across NVML versions).
NVML_CLOCK_GRAPHICS = 0
NVML_CLOCK_SM = 1
NVML_CLOCK_MEM = 2
NVML_NVLINK_MAX_LINKS = 18

# Error codes the deployment reacts to, by name, so callers need not import pynvml.
NVML_ERROR_NAMES = {
    9: "DRIVER_NOT_LOADED",
    12: "LIBRARY_NOT_FOUND",
    13: "FUNCTION_NOT_FOUND",
    15: "GPU_IS_LOST",
    16: "RESET_REQUIRED",
    18: "LIB_RM_VERSION_MISMATCH",
}


class NvmlUnavailable(Exception):
    """NVML cannot answer: no driver, no library, a version mismatch, ..."""

    def __init__(self, code, message):
        super(NvmlUnavailable, self).__init__(message)
        self.code = code
        self.message = message


def _text(value):
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else value


def error_name(code):
    return NVML_ERROR_NAMES.get(code, "NVML_ERROR_%s" % code)


def cpu_list_from_mask(words, word_bits=64):
    """NVML CPU affinity words (64-bit on Linux) -> sorted CPU ids."""
    cpus = []
    for word_index, word in enumerate(words):
        for bit in range(word_bits):
            if (word >> bit) & 1:
                cpus.append(word_index * word_bits + bit)
    return cpus


def memory_bandwidth_bytes_per_s(bus_width_bits, max_mem_clock_mhz):
    """Peak memory bandwidth: the bus moves data on both clock edges (DDR),
    so bytes/s = width/8 * clock * 2. V100: 4096 bit, 877 MHz -> 898 GB/s."""
    return int(bus_width_bits // 8 * max_mem_clock_mhz * 1000000 * 2)


def _optional(nvml, func, *args):
    """Call an NVML getter a card or driver may not support; None when it cannot."""
    try:
        return func(*args)
    except nvml.NVMLError:
        return None


def _nvlink_peers(nvml, handle):
    peers = []
    for link in range(NVML_NVLINK_MAX_LINKS):
        try:
            active = nvml.nvmlDeviceGetNvLinkState(handle, link)
        except nvml.NVMLError:
            break  # no more links on this card (or no NVLink at all)
        if active:
            remote = _optional(nvml, nvml.nvmlDeviceGetNvLinkRemotePciInfo, handle, link)
            if remote is not None:
                peers.append(_text(remote.busId))
    return sorted(set(peers))


def read_gpu(nvml, index, cpu_words=4, xid_events=None):
    """One GPU as a plain dict of JSON-friendly values (xid_events: the exporter's
    journal, gpu_health.read_xid_journal)."""
    handle = nvml.nvmlDeviceGetHandleByIndex(index)
    memory = nvml.nvmlDeviceGetMemoryInfo(handle)
    # The v2 call reports the driver's reservation apart (R510+); older drivers lack it.
    memory_v2 = _optional(nvml, nvml.nvmlDeviceGetMemoryInfo, handle, getattr(nvml, "nvmlMemory_v2", 0)) \
        if getattr(nvml, "nvmlMemory_v2", None) else None
    major, minor = nvml.nvmlDeviceGetCudaComputeCapability(handle)
    bus_width = nvml.nvmlDeviceGetMemoryBusWidth(handle)
    max_mem_clock = nvml.nvmlDeviceGetMaxClockInfo(handle, NVML_CLOCK_MEM)
    power_min, power_max = nvml.nvmlDeviceGetPowerManagementLimitConstraints(handle)
    supported_mem = sorted(_optional(nvml, nvml.nvmlDeviceGetSupportedMemoryClocks, handle) or [], reverse=True)
    supported_gfx = sorted(
        _optional(nvml, nvml.nvmlDeviceGetSupportedGraphicsClocks, handle, max_mem_clock) or [], reverse=True)
    affinity = _optional(nvml, nvml.nvmlDeviceGetCpuAffinity, handle, cpu_words) or []
    numa_node = _optional(nvml, nvml.nvmlDeviceGetNumaNodeId, handle)
    return {
        "index": index,
        "name": _text(nvml.nvmlDeviceGetName(handle)),
        "uuid": _text(nvml.nvmlDeviceGetUUID(handle)),
        "serial": _text(_optional(nvml, nvml.nvmlDeviceGetSerial, handle)),
        "pci_bus_id": _text(nvml.nvmlDeviceGetPciInfo(handle).busId),
        # /dev/nvidia<minor> is this GPU's device node.
        "minor_number": _optional(nvml, nvml.nvmlDeviceGetMinorNumber, handle),
        "memory_total_bytes": int(memory.total),
        "memory_free_bytes": int(memory.free),
        "memory_used_bytes": int(memory.used),
        "memory_reserved_bytes": int(memory_v2.reserved) if memory_v2 is not None else None,
        "compute_capability": "%d.%d" % (major, minor),
        "cuda_arch": "%d%d" % (major, minor),
        "memory_bus_width_bits": int(bus_width),
        "max_memory_clock_mhz": int(max_mem_clock),
        "memory_bandwidth_bytes_per_s": memory_bandwidth_bytes_per_s(bus_width, max_mem_clock),
        "max_graphics_clock_mhz": int(nvml.nvmlDeviceGetMaxClockInfo(handle, NVML_CLOCK_GRAPHICS)),
        "graphics_clock_mhz": _optional(nvml, nvml.nvmlDeviceGetClockInfo, handle, NVML_CLOCK_GRAPHICS),
        "supported_memory_clocks_mhz": [int(c) for c in supported_mem],
        "supported_graphics_clocks_mhz": [int(c) for c in supported_gfx],
        "power_limit_min_w": power_min / 1000.0,
        "power_limit_max_w": power_max / 1000.0,
        "power_limit_default_w": nvml.nvmlDeviceGetPowerManagementDefaultLimit(handle) / 1000.0,
        "power_limit_w": nvml.nvmlDeviceGetPowerManagementLimit(handle) / 1000.0,
        "persistence_mode": bool(_optional(nvml, nvml.nvmlDeviceGetPersistenceMode, handle)),
        "numa_node": numa_node if numa_node is not None and numa_node >= 0 else None,
        "cpu_affinity": cpu_list_from_mask(affinity),
        "nvlink_peers": _nvlink_peers(nvml, handle),
        # ECC, retired pages / remapped rows, compute processes, Xids (gpu_health.assess judges them)
        "health": read_health(nvml, handle, xid_events=xid_events),
    }


def read_host(nvml, xid_journal=None):
    """All GPUs and the driver of this host. Raises NvmlUnavailable when NVML
    cannot answer, with NVML's own reason. xid_journal: where the GPU exporter keeps
    the Xids it heard (gpu_health.XID_JOURNAL; None: not read)."""
    try:
        nvml.nvmlInit()
    except nvml.NVMLError as err:
        raise NvmlUnavailable(getattr(err, "value", None), "NVML could not start: %s" % err)
    xid_events = read_xid_journal(xid_journal) if xid_journal else None
    try:
        cuda = _optional(nvml, nvml.nvmlSystemGetCudaDriverVersion)
        host = {
            "driver_version": _text(nvml.nvmlSystemGetDriverVersion()),
            "cuda_driver_version": "%d.%d" % (cuda // 1000, cuda % 1000 // 10) if cuda else None,
        }
        host["gpus"], host["lost_gpus"] = [], []
        for index in range(nvml.nvmlDeviceGetCount()):
            try:
                host["gpus"].append(read_gpu(nvml, index, xid_events=xid_events))
            except nvml.NVMLError as err:
                # One card that fell off the bus must not blind the host to the others.
                if getattr(err, "value", None) not in LOST_ERRORS:
                    raise
                host["lost_gpus"].append({"index": index, "error": str(err), "error_code": error_name(err.value)})
    except nvml.NVMLError as err:
        raise NvmlUnavailable(getattr(err, "value", None), "NVML failed while reading the GPUs: %s" % err)
    finally:
        try:
            nvml.nvmlShutdown()
        except nvml.NVMLError:
            pass
    return host
