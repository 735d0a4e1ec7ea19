"""Print what the real pynvml reports on this host, as JSON.

Tests run this inside a simulated host (python -c) to read the GPUs from the
outside, the way an operator's script would; it never imports project code.
"""
import json
import sys

import pynvml


def text(value):
    return value.decode() if isinstance(value, bytes) else value


def maybe(func, *args):
    """A reading the card may not support (ECC off): None."""
    try:
        return func(*args)
    except pynvml.NVMLError:
        return None


def probe():
    pynvml.nvmlInit()
    try:
        gpus = []
        for index in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            mem = pynvml.nvmlDeviceGetMemoryInfo(handle)
            major, minor = pynvml.nvmlDeviceGetCudaComputeCapability(handle)
            pmin, pmax = pynvml.nvmlDeviceGetPowerManagementLimitConstraints(handle)
            mem_clock = pynvml.nvmlDeviceGetMaxClockInfo(handle, pynvml.NVML_CLOCK_MEM)
            words = pynvml.nvmlDeviceGetCpuAffinity(handle, 4)
            cpus = [w * 64 + b for w, word in enumerate(words) for b in range(64) if word >> b & 1]
            peers = []
            for link in range(pynvml.NVML_NVLINK_MAX_LINKS):
                try:
                    if pynvml.nvmlDeviceGetNvLinkState(handle, link):
                        peer = pynvml.nvmlDeviceGetNvLinkRemotePciInfo(handle, link)
                        peers.append(text(peer.busId))
                except pynvml.NVMLError:
                    break
            gpus.append({
                "index": index,
                "name": text(pynvml.nvmlDeviceGetName(handle)),
                "uuid": text(pynvml.nvmlDeviceGetUUID(handle)),
                "pci_bus_id": text(pynvml.nvmlDeviceGetPciInfo(handle).busId),
                "memory_total_bytes": mem.total,
                "memory_used_bytes": mem.used,
                # without the driver's reservation (R510+), as nvidia-smi shows it
                "memory_used_v2_bytes": pynvml.nvmlDeviceGetMemoryInfo(handle, pynvml.nvmlMemory_v2).used,
                "compute_capability": "%d.%d" % (major, minor),
                "memory_bus_width_bits": pynvml.nvmlDeviceGetMemoryBusWidth(handle),
                "max_mem_clock_mhz": mem_clock,
                "max_gfx_clock_mhz": pynvml.nvmlDeviceGetMaxClockInfo(handle, pynvml.NVML_CLOCK_GRAPHICS),
                "gfx_clock_mhz": pynvml.nvmlDeviceGetClockInfo(handle, pynvml.NVML_CLOCK_GRAPHICS),
                "sm_clock_mhz": pynvml.nvmlDeviceGetClockInfo(handle, pynvml.NVML_CLOCK_SM),
                "power_usage_mw": pynvml.nvmlDeviceGetPowerUsage(handle),
                "ecc_uncorrected_volatile": maybe(pynvml.nvmlDeviceGetTotalEccErrors, handle,
                                                  pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, pynvml.NVML_VOLATILE_ECC),
                "supported_gfx_clocks_mhz": list(pynvml.nvmlDeviceGetSupportedGraphicsClocks(handle, mem_clock)),
                "power_min_mw": pmin,
                "power_max_mw": pmax,
                "power_default_mw": pynvml.nvmlDeviceGetPowerManagementDefaultLimit(handle),
                "power_limit_mw": pynvml.nvmlDeviceGetPowerManagementLimit(handle),
                "persistence_mode": pynvml.nvmlDeviceGetPersistenceMode(handle),
                "numa_node": pynvml.nvmlDeviceGetNumaNodeId(handle),
                "cpu_affinity": cpus,
                "nvlink_peers": sorted(set(peers)),
            })
        return {"driver_version": text(pynvml.nvmlSystemGetDriverVersion()), "gpus": gpus}
    finally:
        pynvml.nvmlShutdown()


if __name__ == "__main__":
    try:
        json.dump(probe(), sys.stdout)
    except pynvml.NVMLError as err:
        json.dump({"error": str(err), "error_class": type(err).__name__}, sys.stdout)
