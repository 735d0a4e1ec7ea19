"""Tests of the mock NVML harness (tests/harness/mock_nvml).

The library is built with its Makefile, then driven by the real, unmodified nvidia-ml-py
(pynvml) in subprocesses, exactly as the project's code will drive it in test
containers.  Every figure pynvml reports is checked against the profile file, parsed
here independently of the C parser.
"""

import ast
import configparser
import ctypes
import json
import math
import os
import re
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import pynvml  # noqa: F401  (fail early if the harness's one Python dependency is missing)
import pytest

ROOT = Path(__file__).resolve().parents[2]
MOCK_DIR = ROOT / "tests" / "harness" / "mock_nvml"
PROFILE_DIR = MOCK_DIR / "profiles"
PROFILES = sorted(PROFILE_DIR.glob("*.profile"))
SMI = MOCK_DIR / "nvidia-smi"
PERSISTENCED = MOCK_DIR / "nvidia-persistenced"
V100_32 = PROFILE_DIR / "v100-sxm2-32gb.profile"
V100_PCIE = PROFILE_DIR / "v100-pcie-16gb.profile"
DUAL = PROFILE_DIR / "2x-v100-sxm2-16gb-nvlink.profile"
T4 = PROFILE_DIR / "t4.profile"
MIB = 1024 * 1024

DRIVER_525, CUDA_525 = "525.147.05", 12000
DRIVER_535, CUDA_535 = "535.129.03", 12020


# ---- helpers ------------------------------------------------------------------------

def build_library(dest, driver, cuda):
    result = subprocess.run(
        ["make", "-C", str(MOCK_DIR), "BUILD_DIR=%s" % dest, "DRIVER_VERSION=%s" % driver,
         "CUDA_DRIVER_VERSION=%d" % cuda],
        capture_output=True, text=True, timeout=120)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    assert "warning" not in output.lower(), output
    lib = Path(dest) / "libnvidia-ml.so.1"
    assert lib.is_file()
    return Path(dest)


@pytest.fixture(scope="session")
def lib525(tmp_path_factory):
    return build_library(tmp_path_factory.mktemp("nvml-525"), DRIVER_525, CUDA_525)


@pytest.fixture(scope="session")
def lib535(tmp_path_factory):
    return build_library(tmp_path_factory.mktemp("nvml-535"), DRIVER_535, CUDA_535)


@pytest.fixture
def state(tmp_path):
    """A fresh state directory: a freshly booted host."""
    return tmp_path / "run-mock-nvml"


def parse_profile(path):
    """Independent reading of a profile: per-GPU dicts, gpu<i>.key over gpu.key."""
    kv = {}
    for line in Path(path).read_text().splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        key, sep, value = line.partition("=")
        assert sep, "malformed profile line in %s: %r" % (path, line)
        kv[key.strip()] = value.strip()
    gpus = []
    for i in range(int(kv["gpu_count"])):
        gpu = {k[len("gpu."):]: v for k, v in kv.items() if k.startswith("gpu.")}
        prefix = "gpu%d." % i
        gpu.update({k[len(prefix):]: v for k, v in kv.items() if k.startswith(prefix)})
        gpus.append(gpu)
    return gpus


def ints(text):
    return [int(x) for x in text.split(",") if x.strip()]


def cpu_list(text):
    cpus = set()
    for part in text.split(","):
        lo, _, hi = part.partition("-")
        cpus.update(range(int(lo), int(hi or lo) + 1))
    return cpus


def env_for(lib_dir, profile, state_dir, **extra):
    env = dict(os.environ)
    env.update(LD_LIBRARY_PATH=str(lib_dir), MOCK_NVML_PROFILE=str(profile),
               MOCK_NVML_STATE_DIR=str(state_dir))
    env.update({k: str(v) for k, v in extra.items()})
    return env


def run_py(code, lib_dir, profile, state_dir, check=True):
    """Run Python code with pynvml against the mock; its stdout is parsed as JSON."""
    result = subprocess.run([sys.executable, "-c", textwrap.dedent(code)],
                            env=env_for(lib_dir, profile, state_dir),
                            capture_output=True, text=True, timeout=60)
    if check:
        assert result.returncode == 0, result.stdout + result.stderr
        return json.loads(result.stdout)
    return result


def smi(args, lib_dir, profile, state_dir, **extra):
    return subprocess.run([sys.executable, str(SMI)] + list(args),
                          env=env_for(lib_dir, profile, state_dir, **extra),
                          capture_output=True, text=True, timeout=60)


# Everything pynvml can tell about the GPUs, as JSON.
DUMP = """
import json, pynvml as n
n.nvmlInit()
def text(v):  # pynvml hands back some char arrays as bytes, some as str
    return v.decode() if isinstance(v, bytes) else v
def err(fn, *a):
    try:
        return fn(*a)
    except n.NVMLError as e:
        return type(e).__name__
out = {"driver": n.nvmlSystemGetDriverVersion(), "nvml": n.nvmlSystemGetNVMLVersion(),
       "cuda": n.nvmlSystemGetCudaDriverVersion(), "cuda_v2": n.nvmlSystemGetCudaDriverVersion_v2(),
       "gpus": []}
for i in range(n.nvmlDeviceGetCount()):
    h = n.nvmlDeviceGetHandleByIndex(i)
    pci = n.nvmlDeviceGetPciInfo(h)
    m1 = n.nvmlDeviceGetMemoryInfo(h)
    m2 = n.nvmlDeviceGetMemoryInfo(h, version=n.nvmlMemory_v2)
    bar1 = n.nvmlDeviceGetBAR1MemoryInfo(h)
    mem_clocks = n.nvmlDeviceGetSupportedMemoryClocks(h)
    links = []
    for link in range(6):
        state = err(n.nvmlDeviceGetNvLinkState, h, link)
        remote = None
        if state == 1:
            remote = text(n.nvmlDeviceGetNvLinkRemotePciInfo(h, link).busId)
        links.append([state, remote])
    g = {
        "index": n.nvmlDeviceGetIndex(h),
        "name": n.nvmlDeviceGetName(h),
        "uuid": n.nvmlDeviceGetUUID(h),
        "serial": n.nvmlDeviceGetSerial(h),
        "minor_number": n.nvmlDeviceGetMinorNumber(h),
        "brand": n.nvmlDeviceGetBrand(h),
        "architecture": n.nvmlDeviceGetArchitecture(h),
        "bus_id": text(pci.busId), "bus_id_legacy": text(pci.busIdLegacy),
        "pci": [pci.domain, pci.bus, pci.device, pci.pciDeviceId, pci.pciSubSystemId],
        "by_uuid": n.nvmlDeviceGetIndex(n.nvmlDeviceGetHandleByUUID(n.nvmlDeviceGetUUID(h))),
        "by_pci": n.nvmlDeviceGetIndex(n.nvmlDeviceGetHandleByPciBusId(text(pci.busId))),
        "mem_v1": [m1.total, m1.free, m1.used],
        "mem_v2": [m2.total, m2.reserved, m2.free, m2.used],
        "bar1": [bar1.bar1Total, bar1.bar1Free, bar1.bar1Used],
        "cc": list(n.nvmlDeviceGetCudaComputeCapability(h)),
        "bus_width": n.nvmlDeviceGetMemoryBusWidth(h),
        "max_clocks": [n.nvmlDeviceGetMaxClockInfo(h, t) for t in (0, 1, 2)],
        "clocks": [n.nvmlDeviceGetClockInfo(h, t) for t in (0, 1, 2)],
        "app_clocks": [n.nvmlDeviceGetApplicationsClock(h, t) for t in (0, 2)],
        "default_app_clocks": [n.nvmlDeviceGetDefaultApplicationsClock(h, t) for t in (0, 2)],
        "get_clock": [n.nvmlDeviceGetClock(h, 0, i) for i in (0, 1, 2, 3)],
        "mem_clocks": mem_clocks,
        "gfx_clocks": {str(m): n.nvmlDeviceGetSupportedGraphicsClocks(h, m) for m in mem_clocks},
        "gfx_clocks_bad_mem": err(n.nvmlDeviceGetSupportedGraphicsClocks, h, 1),
        "power_constraints": n.nvmlDeviceGetPowerManagementLimitConstraints(h),
        "power_default": n.nvmlDeviceGetPowerManagementDefaultLimit(h),
        "power_limit": n.nvmlDeviceGetPowerManagementLimit(h),
        "power_enforced": n.nvmlDeviceGetEnforcedPowerLimit(h),
        "power_usage": n.nvmlDeviceGetPowerUsage(h),
        "power_mode": n.nvmlDeviceGetPowerManagementMode(h),
        "temperature": n.nvmlDeviceGetTemperature(h, n.NVML_TEMPERATURE_GPU),
        "utilization": [n.nvmlDeviceGetUtilizationRates(h).gpu, n.nvmlDeviceGetUtilizationRates(h).memory],
        "persistence": n.nvmlDeviceGetPersistenceMode(h),
        "compute_mode": n.nvmlDeviceGetComputeMode(h),
        "pstate": n.nvmlDeviceGetPerformanceState(h),
        "processes": len(n.nvmlDeviceGetComputeRunningProcesses(h)),
        "numa_node": err(n.nvmlDeviceGetNumaNodeId, h),
        "cpu_affinity": list(n.nvmlDeviceGetCpuAffinity(h, 16)),
        "nvlinks": links,
        "nvlink_out_of_range": err(n.nvmlDeviceGetNvLinkState, h, 6),
    }
    out["gpus"].append(g)
n.nvmlShutdown()
print(json.dumps(out))
"""


def dump(lib_dir, profile, state_dir):
    return run_py(DUMP, lib_dir, profile, state_dir)


# ---- the profiles themselves ---------------------------------------------------------

def test_profiles_present():
    names = {p.name for p in PROFILES}
    assert names >= {"v100-sxm2-32gb.profile", "v100-sxm2-16gb.profile", "v100-pcie-16gb.profile",
                     "2x-v100-sxm2-16gb-nvlink.profile", "t4.profile"}


def test_profile_uuids_are_realistic_and_unique():
    seen = set()
    for path in PROFILES:
        for gpu in parse_profile(path):
            assert re.fullmatch(r"GPU-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}", gpu["uuid"])
            assert gpu["uuid"] not in seen, "%s reuses %s" % (path.name, gpu["uuid"])
            seen.add(gpu["uuid"])


def volta_clocks(top):
    # ~7.5 MHz steps down to 135 MHz, as real V100s list them.
    return [top - math.floor(k * 7.5 + 0.5) for k in range(int((top - 135) / 7.5) + 1)]


@pytest.mark.parametrize("profile,name,memory,top,app_gfx,power", [
    (V100_32, "Tesla V100-SXM2-32GB", 32 << 30, 1530, 1312, (150000, 300000, 300000)),
    (PROFILE_DIR / "v100-sxm2-16gb.profile", "Tesla V100-SXM2-16GB", 16 << 30, 1530, 1312,
     (150000, 300000, 300000)),
    (DUAL, "Tesla V100-SXM2-16GB", 16 << 30, 1530, 1312, (150000, 300000, 300000)),
    (V100_PCIE, "Tesla V100-PCIE-16GB", 16 << 30, 1380, 1245, (100000, 250000, 250000)),
])
def test_v100_profiles_carry_real_figures(profile, name, memory, top, app_gfx, power):
    for gpu in parse_profile(profile):
        assert gpu["name"] == name
        assert int(gpu["memory_total_bytes"]) == memory
        assert (gpu["cuda_cc_major"], gpu["cuda_cc_minor"], gpu["architecture"]) == ("7", "0", "5")
        clocks = ints(gpu["supported_gfx_clocks_mhz"])
        assert clocks == volta_clocks(top)
        assert clocks[0] == top and clocks[-1] == 135
        assert int(gpu["max_gfx_clock_mhz"]) == top
        assert (int(gpu["default_app_mem_clock_mhz"]), int(gpu["default_app_gfx_clock_mhz"])) == (877, app_gfx)
        assert (int(gpu["power_min_mw"]), int(gpu["power_max_mw"]), int(gpu["power_default_mw"])) == power
        # 4096-bit HBM2, double data rate at 877 MHz: ~898 GB/s.
        gbps = int(gpu["memory_bus_width_bits"]) / 8 * int(gpu["max_mem_clock_mhz"]) * 2 / 1000
        assert round(gbps) == 898
    if top == 1530:
        assert {1530, 1410, 1380, 135} <= set(volta_clocks(1530))


def test_t4_profile_carries_real_figures():
    (gpu,) = parse_profile(T4)
    assert gpu["name"] == "Tesla T4"
    assert int(gpu["memory_total_bytes"]) == 15360 * MIB
    assert (gpu["cuda_cc_major"], gpu["cuda_cc_minor"], gpu["architecture"]) == ("7", "5", "6")
    # 256 bit x 5001 MHz (as NVML reports it) x 2 / 8 = the datasheet's 320 GB/s.
    assert round(int(gpu["memory_bus_width_bits"]) / 8 * int(gpu["max_mem_clock_mhz"]) * 2 / 1000) == 320
    assert ints(gpu["supported_gfx_clocks_mhz"])[0] == 1590
    assert ints(gpu["supported_gfx_clocks_mhz"])[-1] == 300
    assert (int(gpu["power_min_mw"]), int(gpu["power_max_mw"]), int(gpu["power_default_mw"])) == (60000, 70000, 70000)


# ---- pynvml reads back every profile ------------------------------------------------

@pytest.mark.parametrize("profile", PROFILES, ids=[p.stem for p in PROFILES])
def test_pynvml_reports_profile(profile, lib525, state):
    expected = parse_profile(profile)
    got = dump(lib525, profile, state)
    assert got["driver"] == DRIVER_525
    assert got["nvml"] == "12." + DRIVER_525
    assert got["cuda"] == got["cuda_v2"] == CUDA_525
    assert len(got["gpus"]) == len(expected)
    bus_ids = [gpu["pci_bus_id"].upper() for gpu in expected]
    for i, (want, g) in enumerate(zip(expected, got["gpus"])):
        assert g["index"] == g["by_uuid"] == g["by_pci"] == i
        assert g["name"] == want["name"]
        assert g["uuid"] == want["uuid"]
        assert g["serial"] == want["serial"]
        assert g["minor_number"] == int(want["minor_number"])
        assert g["brand"] == 2  # NVML_BRAND_TESLA
        assert g["architecture"] == int(want["architecture"])
        assert g["bus_id"] == want["pci_bus_id"].upper()
        assert g["bus_id_legacy"] == want["pci_bus_id"].upper()[4:]
        assert g["pci"][3] == int(want["pci_device_id"], 0)
        total, reserved = int(want["memory_total_bytes"]), int(want["memory_reserved_bytes"])
        assert g["mem_v1"] == [total, total - reserved, reserved]
        assert g["mem_v2"] == [total, reserved, total - reserved, 0]
        assert g["bar1"][0] == int(want["bar1_total_bytes"])
        assert g["cc"] == [int(want["cuda_cc_major"]), int(want["cuda_cc_minor"])]
        assert g["bus_width"] == int(want["memory_bus_width_bits"])
        assert g["max_clocks"] == [int(want["max_gfx_clock_mhz"]), int(want["max_sm_clock_mhz"]),
                                   int(want["max_mem_clock_mhz"])]
        idle = int(want["idle_gfx_clock_mhz"])
        assert g["clocks"] == [idle, idle, int(want["max_mem_clock_mhz"])]
        app = [int(want["default_app_gfx_clock_mhz"]), int(want["default_app_mem_clock_mhz"])]
        assert g["app_clocks"] == g["default_app_clocks"] == app
        assert g["get_clock"] == [idle, app[0], app[0], int(want["max_gfx_clock_mhz"])]
        assert g["mem_clocks"] == ints(want["supported_mem_clocks_mhz"])
        for mem in g["mem_clocks"]:
            assert g["gfx_clocks"][str(mem)] == ints(want["supported_gfx_clocks_mhz"])
        assert g["gfx_clocks_bad_mem"] == "NVMLError_NotFound"
        assert g["power_constraints"] == [int(want["power_min_mw"]), int(want["power_max_mw"])]
        assert g["power_default"] == g["power_limit"] == g["power_enforced"] == int(want["power_default_mw"])
        assert 0 < g["power_usage"] <= g["power_limit"]
        assert g["power_mode"] == 1
        assert g["utilization"] == [0, 0]
        assert (g["persistence"], g["compute_mode"], g["pstate"], g["processes"]) == (0, 0, 0, 0)
        assert g["numa_node"] == int(want["numa_node"])
        affinity = {w * 64 + b for w, word in enumerate(g["cpu_affinity"]) for b in range(64) if word >> b & 1}
        assert affinity == cpu_list(want["cpu_affinity"])
        peers = [p.upper() for p in want.get("nvlink_peers", "").split(",") if p]
        links = int(want.get("nvlink_link_count", "0"))
        if links == 0:
            assert g["nvlinks"] == [["NVMLError_NotSupported", None]] * 6
            assert g["nvlink_out_of_range"] == "NVMLError_NotSupported"
        else:
            active = [remote for state_, remote in g["nvlinks"] if state_ == 1]
            inactive = [state_ for state_, _ in g["nvlinks"] if state_ != 1]
            assert inactive == [0] * len(inactive)
            assert len(active) == (links // len(peers)) * len(peers) if peers else not active
            assert set(active) == set(peers)
            for peer in peers:
                assert peer in bus_ids, "NVLink peer %s is not a GPU of this host" % peer
            assert g["nvlink_out_of_range"] == "NVMLError_InvalidArgument"


def test_dual_gpu_nvlink_pairs_each_other(lib525, state):
    got = dump(lib525, DUAL, state)["gpus"]
    assert got[0]["uuid"] != got[1]["uuid"] and got[0]["serial"] != got[1]["serial"]
    assert {remote for _, remote in got[0]["nvlinks"]} == {got[1]["bus_id"]}
    assert {remote for _, remote in got[1]["nvlinks"]} == {got[0]["bus_id"]}
    assert [s for s, _ in got[0]["nvlinks"]] == [1] * 6  # V100 SXM2: six NVLink 2.0 links


def test_ctypes_list_protocol_and_struct_versions(lib525, state):
    """The count/INSUFFICIENT_SIZE protocol and versioned structs, as seen on a real driver."""
    out = run_py("""
        import ctypes, json, pynvml as n
        n.nvmlInit()
        lib = n.nvmlLib
        h = n.nvmlDeviceGetHandleByIndex(0)
        res = {}
        c = ctypes.c_uint(0)
        res["probe"] = [lib.nvmlDeviceGetSupportedGraphicsClocks(h, 877, ctypes.byref(c), None), c.value]
        c = ctypes.c_uint(3); arr = (ctypes.c_uint * 3)()
        res["small"] = [lib.nvmlDeviceGetSupportedGraphicsClocks(h, 877, ctypes.byref(c), arr), c.value, list(arr)]
        c = ctypes.c_uint(0)
        res["procs"] = [lib.nvmlDeviceGetComputeRunningProcesses_v3(h, ctypes.byref(c), None), c.value]
        m = n.c_nvmlMemory_v2_t(); m.version = 0x01000028
        res["mem_bad_version"] = lib.nvmlDeviceGetMemoryInfo_v2(h, ctypes.byref(m))
        res["name_small"] = lib.nvmlDeviceGetName(h, ctypes.create_string_buffer(4), 4)
        res["null_handle"] = lib.nvmlDeviceGetPersistenceMode(None, ctypes.byref(c))
        res["null_out"] = lib.nvmlDeviceGetClockInfo(h, 0, None)
        res["bad_index"] = lib.nvmlDeviceGetHandleByIndex_v2(9, ctypes.byref(ctypes.c_void_p()))
        res["bad_uuid"] = lib.nvmlDeviceGetHandleByUUID(b"GPU-00000000-0000-0000-0000-000000000000",
                                                        ctypes.byref(ctypes.c_void_p()))
        res["short_pci"] = lib.nvmlDeviceGetHandleByPciBusId_v2(b"18:00.0", ctypes.byref(ctypes.c_void_p()))
        res["bad_sensor"] = lib.nvmlDeviceGetTemperature(h, 5, ctypes.byref(c))
        res["init_again"] = lib.nvmlInit_v2()
        res["shutdowns"] = [lib.nvmlShutdown(), lib.nvmlShutdown(), lib.nvmlShutdown()]
        res["after"] = lib.nvmlDeviceGetPersistenceMode(h, ctypes.byref(c))
        res["set_after"] = lib.nvmlDeviceSetPowerManagementLimit(h, 250000)
        print(json.dumps(res))
    """, lib525, V100_32, state)
    assert out["probe"] == [7, 187]  # NVML_ERROR_INSUFFICIENT_SIZE with the needed count
    assert out["small"] == [7, 187, [0, 0, 0]]
    assert out["procs"] == [0, 0]
    assert out["mem_bad_version"] == 25  # NVML_ERROR_ARGUMENT_VERSION_MISMATCH
    assert out["name_small"] == 7
    assert out["null_handle"] == out["null_out"] == out["bad_index"] == 2
    assert out["bad_uuid"] == 6 and out["short_pci"] == 0
    assert out["bad_sensor"] == 2
    assert out["init_again"] == 0
    assert out["shutdowns"] == [0, 0, 1]  # init nests; one shutdown too many is UNINITIALIZED
    assert out["after"] == out["set_after"] == 1


def test_calls_before_init_are_uninitialized(lib525):
    lib = ctypes.CDLL(str(lib525 / "libnvidia-ml.so.1"))
    count = ctypes.c_uint()
    assert lib.nvmlDeviceGetCount_v2(ctypes.byref(count)) == 1
    assert lib.nvmlDeviceSetPowerManagementLimit(None, 250000) == 1
    assert lib.nvmlDeviceSetPersistenceMode(None, 1) == 1
    assert lib.nvmlShutdown() == 1
    lib.nvmlErrorString.restype = ctypes.c_char_p
    assert lib.nvmlErrorString(18) == b"Driver/library version mismatch"
    assert lib.nvmlErrorString(9) == b"Driver Not Loaded"
    assert lib.nvmlErrorString(4) == b"Insufficient Permissions"
    assert lib.nvmlErrorString(2) == b"Invalid Argument"
    assert lib.nvmlErrorString(3) == b"Not Supported"
    assert lib.nvmlErrorString(12345) == b"Unknown Error"


# ---- state: setters, persistence across processes, reboot -----------------------------

SET_ALL = """
    import json, pynvml as n
    n.nvmlInit()
    h = n.nvmlDeviceGetHandleByIndex(0)
    n.nvmlDeviceSetPersistenceMode(h, 1)
    n.nvmlDeviceSetGpuLockedClocks(h, 1410, 1410)
    n.nvmlDeviceSetPowerManagementLimit(h, 250000)
    n.nvmlDeviceSetApplicationsClocks(h, 877, 1380)
    print(json.dumps("ok"))
"""

READ_STATE = """
    import json, pynvml as n
    n.nvmlInit()
    h = n.nvmlDeviceGetHandleByIndex(0)
    print(json.dumps({
        "pm": n.nvmlDeviceGetPersistenceMode(h),
        "gfx": n.nvmlDeviceGetClockInfo(h, n.NVML_CLOCK_GRAPHICS),
        "sm": n.nvmlDeviceGetClockInfo(h, n.NVML_CLOCK_SM),
        "mem": n.nvmlDeviceGetClockInfo(h, n.NVML_CLOCK_MEM),
        "pl": n.nvmlDeviceGetPowerManagementLimit(h),
        "enforced": n.nvmlDeviceGetEnforcedPowerLimit(h),
        "usage": n.nvmlDeviceGetPowerUsage(h),
        "app": [n.nvmlDeviceGetApplicationsClock(h, 0), n.nvmlDeviceGetApplicationsClock(h, 2)],
    }))
"""

DEFAULTS_32 = {"pm": 0, "gfx": 135, "sm": 135, "mem": 877, "pl": 300000, "enforced": 300000,
               "app": [1312, 877]}


def read_state(lib, profile, state_dir):
    got = run_py(READ_STATE, lib, profile, state_dir)
    got.pop("usage")
    return got


def test_setters_persist_across_processes_and_vanish_at_reboot(lib525, state):
    assert read_state(lib525, V100_32, state) == DEFAULTS_32
    run_py(SET_ALL, lib525, V100_32, state)
    assert read_state(lib525, V100_32, state) == {
        "pm": 1, "gfx": 1410, "sm": 1410, "mem": 877, "pl": 250000, "enforced": 250000, "app": [1380, 877]}

    # On disk: a 0755 directory and 0644 key=value file keyed by GPU UUID.
    assert stat.S_IMODE(state.stat().st_mode) == 0o755
    state_file = state / "state"
    assert stat.S_IMODE(state_file.stat().st_mode) == 0o644
    uuid = parse_profile(V100_32)[0]["uuid"]
    lines = [l for l in state_file.read_text().splitlines() if not l.startswith("#")]
    assert sorted(lines) == sorted([
        uuid + ".persistence_mode=1", uuid + ".locked_gfx_clocks=1410,1410",
        uuid + ".power_limit_mw=250000", uuid + ".app_clocks=877,1380"])
    assert not list(state.glob("*.tmp.*")), "temporary files left behind"

    # Simulated reboot: the tmpfs is empty again.
    shutil.rmtree(state)
    assert read_state(lib525, V100_32, state) == DEFAULTS_32


def test_locked_clock_reports_nearest_supported_not_above(lib525, state):
    out = run_py("""
        import json, pynvml as n
        n.nvmlInit()
        h = n.nvmlDeviceGetHandleByIndex(0)
        n.nvmlDeviceSetGpuLockedClocks(h, 1000, 1412)
        locked = n.nvmlDeviceGetClockInfo(h, 0)
        n.nvmlDeviceResetGpuLockedClocks(h)
        n.nvmlDeviceSetApplicationsClocks(h, 877, 1530)
        app = n.nvmlDeviceGetApplicationsClock(h, 0)
        n.nvmlDeviceResetApplicationsClocks(h)
        print(json.dumps([locked, n.nvmlDeviceGetClockInfo(h, 0), app, n.nvmlDeviceGetApplicationsClock(h, 0)]))
    """, lib525, V100_32, state)
    assert out == [1410, 135, 1530, 1312]


def test_setters_reject_out_of_range_values(lib525, state):
    out = run_py("""
        import json, pynvml as n
        n.nvmlInit()
        h = n.nvmlDeviceGetHandleByIndex(0)
        def attempt(fn, *a):
            try:
                fn(h, *a)
                return "ok"
            except n.NVMLError as e:
                return type(e).__name__
        print(json.dumps({
            "pl_low": attempt(n.nvmlDeviceSetPowerManagementLimit, 149999),
            "pl_high": attempt(n.nvmlDeviceSetPowerManagementLimit, 300001),
            "lgc_below_min": attempt(n.nvmlDeviceSetGpuLockedClocks, 100, 1530),
            "lgc_above_max": attempt(n.nvmlDeviceSetGpuLockedClocks, 1410, 1540),
            "lgc_min_gt_max": attempt(n.nvmlDeviceSetGpuLockedClocks, 1500, 1400),
            "ac_bad_gfx": attempt(n.nvmlDeviceSetApplicationsClocks, 877, 1381),
            "ac_bad_mem": attempt(n.nvmlDeviceSetApplicationsClocks, 900, 1380),
            "pm_bad": attempt(n.nvmlDeviceSetPersistenceMode, 2),
            "lmc_volta": attempt(n.nvmlDeviceSetMemoryLockedClocks, 877, 877),
            "rmc_volta": attempt(n.nvmlDeviceResetMemoryLockedClocks),
            "pl_edge": attempt(n.nvmlDeviceSetPowerManagementLimit, 150000),
            "lgc_edge": attempt(n.nvmlDeviceSetGpuLockedClocks, 135, 1530),
        }))
    """, lib525, V100_32, state)
    invalid = "NVMLError_InvalidArgument"
    assert out == {"pl_low": invalid, "pl_high": invalid, "lgc_below_min": invalid, "lgc_above_max": invalid,
                   "lgc_min_gt_max": invalid, "ac_bad_gfx": invalid, "ac_bad_mem": invalid, "pm_bad": invalid,
                   "lmc_volta": "NVMLError_NotSupported", "rmc_volta": "NVMLError_NotSupported",
                   "pl_edge": "ok", "lgc_edge": "ok"}


def test_pcie_and_t4_limits(lib525, tmp_path):
    code = """
        import json, pynvml as n
        n.nvmlInit()
        h = n.nvmlDeviceGetHandleByIndex(0)
        res = []
        for limit in (%s):
            try:
                n.nvmlDeviceSetPowerManagementLimit(h, limit)
                res.append("ok")
            except n.NVMLError as e:
                res.append(type(e).__name__)
        print(json.dumps(res))
    """
    # The seeds' 300 W is not valid on a 250 W PCIe card, nor is anything above 70 W on a T4.
    assert run_py(code % "300000, 250000, 200000, 99000", lib525, V100_PCIE, tmp_path / "a") == [
        "NVMLError_InvalidArgument", "ok", "ok", "NVMLError_InvalidArgument"]
    assert run_py(code % "300000, 70000, 60000", lib525, T4, tmp_path / "b") == [
        "NVMLError_InvalidArgument", "ok", "ok"]


def test_memory_locked_clocks_on_an_ampere_profile(lib525, tmp_path):
    """Memory clock locking exists from Ampere on; check the state path with a derived profile."""
    text = V100_32.read_text()
    text = text.replace("gpu.architecture=5", "gpu.architecture=7")
    text = text.replace("gpu.supported_mem_clocks_mhz=877", "gpu.supported_mem_clocks_mhz=877,810")
    profile = tmp_path / "ampere-like.profile"
    profile.write_text(text)
    out = run_py("""
        import json, pynvml as n
        n.nvmlInit()
        h = n.nvmlDeviceGetHandleByIndex(0)
        n.nvmlDeviceSetMemoryLockedClocks(h, 810, 850)
        locked = n.nvmlDeviceGetClockInfo(h, n.NVML_CLOCK_MEM)
        try:
            n.nvmlDeviceSetMemoryLockedClocks(h, 700, 810)
            bad = "ok"
        except n.NVMLError_InvalidArgument:
            bad = "invalid"
        n.nvmlDeviceResetMemoryLockedClocks(h)
        print(json.dumps([locked, bad, n.nvmlDeviceGetClockInfo(h, n.NVML_CLOCK_MEM)]))
    """, lib525, profile, tmp_path / "state")
    assert out == [810, "invalid", 877]


def test_state_is_per_gpu(lib525, state):
    run_py("""
        import json, pynvml as n
        n.nvmlInit()
        n.nvmlDeviceSetGpuLockedClocks(n.nvmlDeviceGetHandleByIndex(1), 1380, 1380)
        print(json.dumps(0))
    """, lib525, DUAL, state)
    got = dump(lib525, DUAL, state)["gpus"]
    assert got[0]["clocks"][0] == 135 and got[1]["clocks"][0] == 1380


def test_concurrent_writers_do_not_lose_updates(lib525, state):
    """nvidia-smi, nvidia-persistenced and modules may write at once: the flock must hold."""
    code = """
        import json, sys, pynvml as n
        n.nvmlInit()
        i, value = int(sys.argv[1]), int(sys.argv[2])
        h = n.nvmlDeviceGetHandleByIndex(i)
        for _ in range(20):
            if i == 0:
                n.nvmlDeviceSetPowerManagementLimit(h, value)
            else:
                n.nvmlDeviceSetGpuLockedClocks(h, value, value)
    """
    env = env_for(lib525, DUAL, state)
    procs = [subprocess.Popen([sys.executable, "-c", textwrap.dedent(code), str(i % 2),
                               str(200000 if i % 2 == 0 else 1410)], env=env) for i in range(8)]
    assert [p.wait(timeout=120) for p in procs] == [0] * 8
    got = dump(lib525, DUAL, state)["gpus"]
    assert got[0]["power_limit"] == 200000 and got[1]["clocks"][0] == 1410


# ---- non-root ------------------------------------------------------------------------

@pytest.fixture
def world_readable(lib525, tmp_path):
    """Library, profile and state where an unprivileged user can read them."""
    base = Path(tempfile.mkdtemp(prefix="mock-nvml-"))
    try:
        os.chmod(str(base), 0o755)
        shutil.copy(str(lib525 / "libnvidia-ml.so.1"), str(base / "libnvidia-ml.so.1"))
        shutil.copy(str(V100_32), str(base / "gpu.profile"))
        yield base
    finally:
        shutil.rmtree(str(base))


# Privileges are dropped inside the child after the interpreter and its modules are
# loaded (they live under /root here), the way a sudo-less user would still run them.
DROP = """
import ctypes, json, os, signal, sys, time
import pynvml as n
if os.geteuid() == 0:
    os.setgroups([])
    os.setgid(65534)
    os.setuid(65534)
"""


def test_setters_need_root(world_readable):
    base = world_readable
    state_dir = base / "state"
    run_py(SET_ALL, base, base / "gpu.profile", state_dir)  # as root: succeeds
    out = run_py(DROP + textwrap.dedent("""
        n.nvmlInit()
        h = n.nvmlDeviceGetHandleByIndex(0)
        res = {"euid": os.geteuid(), "pm": n.nvmlDeviceGetPersistenceMode(h),
               "gfx": n.nvmlDeviceGetClockInfo(h, 0)}
        for name, fn, args in [("pm", n.nvmlDeviceSetPersistenceMode, (0,)),
                               ("lgc", n.nvmlDeviceSetGpuLockedClocks, (1380, 1380)),
                               ("rgc", n.nvmlDeviceResetGpuLockedClocks, ()),
                               ("pl", n.nvmlDeviceSetPowerManagementLimit, (200000,)),
                               ("ac", n.nvmlDeviceSetApplicationsClocks, (877, 1312)),
                               ("rac", n.nvmlDeviceResetApplicationsClocks, ())]:
            try:
                fn(h, *args)
                res["set_" + name] = "ok"
            except n.NVMLError as e:
                res["set_" + name] = type(e).__name__
        print(json.dumps(res))
    """), base, base / "gpu.profile", state_dir)
    assert out.pop("euid") != 0
    assert out.pop("pm") == 1 and out.pop("gfx") == 1410  # reading needs no privileges
    assert set(out.values()) == {"NVMLError_NoPermission"}, out
    assert read_state(base, base / "gpu.profile", state_dir)["gfx"] == 1410  # unchanged


def test_nvidia_smi_as_non_root(world_readable):
    base = world_readable
    state_dir = base / "state"
    run_py(SET_ALL, base, base / "gpu.profile", state_dir)
    source = SMI.read_text()

    def smi_as_nobody(*args):
        # Read the script as root, then drop privileges and run it.
        code = DROP + "sys.argv = ['nvidia-smi'] + %r\n" % (list(args),) + \
            "exec(compile(%r, 'nvidia-smi', 'exec'), {'__name__': '__main__'})\n" % source
        return subprocess.run([sys.executable, "-c", code],
                              env=env_for(base, base / "gpu.profile", state_dir),
                              capture_output=True, text=True, timeout=60)

    r = smi_as_nobody("-pm", "1")  # already enabled: a no-op the real tool allows anyone
    assert r.returncode == 0 and "Persistence mode is already Enabled for GPU 00000000:18:00.0." in r.stdout
    r = smi_as_nobody("-pm", "0")
    assert r.returncode == 4, r.stdout + r.stderr
    assert "Unable to set persistence mode for GPU 00000000:18:00.0: Insufficient Permissions" in r.stdout
    r = smi_as_nobody("-lgc", "1380,1380")
    assert r.returncode == 4
    assert "The current user does not have permission to change clocks for GPU 00000000:18:00.0." in r.stdout
    r = smi_as_nobody("-pl", "200")
    assert r.returncode == 4
    assert "Failed to set power management limit for GPU 00000000:18:00.0: Insufficient Permissions" in r.stdout
    r = smi_as_nobody("--query-gpu=persistence_mode,clocks.gr", "--format=csv,noheader")
    assert r.returncode == 0 and r.stdout.strip() == "Enabled, 1410 MHz"


# ---- driver / kernel module ------------------------------------------------------------

def test_missing_profile_means_no_driver(lib525, state, tmp_path):
    r = run_py("""
        import pynvml as n
        try:
            n.nvmlInit()
        except n.NVMLError_DriverNotLoaded as e:
            print('"DriverNotLoaded"')
    """, lib525, tmp_path / "absent.profile", state)
    assert r == "DriverNotLoaded"
    assert not (state / "loaded_kernel_module_version").exists()
    r = smi([], lib525, tmp_path / "absent.profile", state)
    assert r.returncode == 9
    assert r.stdout.startswith("NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver.")


def test_malformed_profile_fails_init_loudly(lib525, state, tmp_path):
    profile = tmp_path / "broken.profile"
    profile.write_text(V100_32.read_text().replace("gpu.power_max_mw=300000\n", ""))
    r = run_py("""
        import pynvml as n
        try:
            n.nvmlInit()
        except n.NVMLError_Unknown:
            print('"unknown"')
    """, lib525, profile, state, check=False)
    assert r.stdout.strip() == '"unknown"'
    assert "gpu0: missing key 'power_max_mw'" in r.stderr


def test_driver_upgrade_without_reboot_is_a_version_mismatch(lib525, lib535, state):
    probe = """
        import json, pynvml as n
        try:
            n.nvmlInit()
            print(json.dumps([n.nvmlSystemGetDriverVersion(), n.nvmlSystemGetCudaDriverVersion()]))
        except n.NVMLError_LibRmVersionMismatch as e:
            print(json.dumps(["mismatch", n.nvmlErrorString(e.value)]))
    """
    assert run_py(probe, lib525, V100_32, state) == [DRIVER_525, CUDA_525]
    assert (state / "loaded_kernel_module_version").read_text() == DRIVER_525 + "\n"
    # The 535 package is installed but the 525 module is still loaded.
    assert run_py(probe, lib535, V100_32, state) == ["mismatch", "Driver/library version mismatch"]
    r = smi([], lib535, V100_32, state)
    assert r.returncode == 18
    assert r.stdout.splitlines() == ["Failed to initialize NVML: Driver/library version mismatch",
                                     "NVML library version: 535.129"]
    assert run_py(probe, lib525, V100_32, state) == [DRIVER_525, CUDA_525]
    shutil.rmtree(state)  # reboot
    assert run_py(probe, lib535, V100_32, state) == [DRIVER_535, CUDA_535]
    assert (state / "loaded_kernel_module_version").read_text() == DRIVER_535 + "\n"
    r = smi(["--query-gpu=driver_version", "--format=csv,noheader"], lib535, V100_32, state)
    assert r.stdout.strip() == DRIVER_535
    # A 525 library after the 535 module: R525's nvidia-smi prints no library version line.
    r = smi([], lib525, V100_32, state)
    assert (r.returncode, r.stdout.strip()) == (18, "Failed to initialize NVML: Driver/library version mismatch")


def test_makefile_rebuilds_when_the_version_changes(tmp_path):
    build_library(tmp_path, DRIVER_525, CUDA_525)
    assert DRIVER_525.encode() in (tmp_path / "libnvidia-ml.so.1").read_bytes()
    build_library(tmp_path, DRIVER_535, CUDA_535)
    data = (tmp_path / "libnvidia-ml.so.1").read_bytes()
    assert DRIVER_535.encode() in data and DRIVER_525.encode() not in data


# ---- nvidia-smi ---------------------------------------------------------------------------

QUERY = ("index,name,uuid,pci.bus_id,memory.total,memory.used,memory.free,persistence_mode,power.limit,"
         "power.default_limit,power.min_limit,power.max_limit,clocks.gr,clocks.sm,clocks.mem,clocks.max.gr,"
         "compute_cap,driver_version")


def watts(mw):
    return "%.2f W" % (int(mw) / 1000)


@pytest.mark.parametrize("profile", PROFILES, ids=[p.stem for p in PROFILES])
def test_nvidia_smi_query_gpu_csv(profile, lib525, state):
    r = smi(["--query-gpu=" + QUERY, "--format=csv"], lib525, profile, state)
    assert r.returncode == 0, r.stdout + r.stderr
    lines = r.stdout.splitlines()
    assert lines[0] == (
        "index, name, uuid, pci.bus_id, memory.total [MiB], memory.used [MiB], memory.free [MiB], "
        "persistence_mode, power.limit [W], power.default_limit [W], power.min_limit [W], power.max_limit [W], "
        "clocks.current.graphics [MHz], clocks.current.sm [MHz], clocks.current.memory [MHz], "
        "clocks.max.graphics [MHz], compute_cap, driver_version")
    expected = parse_profile(profile)
    assert len(lines) == 1 + len(expected)
    for i, (want, line) in enumerate(zip(expected, lines[1:])):
        total, reserved = int(want["memory_total_bytes"]), int(want["memory_reserved_bytes"])
        assert line.split(", ") == [
            str(i), want["name"], want["uuid"], want["pci_bus_id"].upper(),
            "%d MiB" % (total // MIB), "0 MiB", "%d MiB" % ((total - reserved) // MIB), "Disabled",
            watts(want["power_default_mw"]), watts(want["power_default_mw"]), watts(want["power_min_mw"]),
            watts(want["power_max_mw"]), "%s MHz" % want["idle_gfx_clock_mhz"], "%s MHz" % want["idle_gfx_clock_mhz"],
            "%s MHz" % want["max_mem_clock_mhz"], "%s MHz" % want["max_gfx_clock_mhz"],
            "%s.%s" % (want["cuda_cc_major"], want["cuda_cc_minor"]), DRIVER_525]
    r = smi(["--query-gpu=index,memory.total,power.limit,clocks.max.gr", "--format=csv,noheader,nounits"],
            lib525, profile, state)
    assert r.stdout.splitlines() == [
        "%d, %d, %.2f, %s" % (i, int(g["memory_total_bytes"]) // MIB, int(g["power_default_mw"]) / 1000,
                              g["max_gfx_clock_mhz"]) for i, g in enumerate(expected)]


def test_nvidia_smi_set_round_trip(lib525, state):
    def query():
        r = smi(["--query-gpu=persistence_mode,clocks.gr,clocks.sm,power.limit", "--format=csv,noheader"],
                lib525, V100_32, state)
        assert r.returncode == 0
        return r.stdout.strip()

    assert query() == "Disabled, 135 MHz, 135 MHz, 300.00 W"
    r = smi(["-pm", "1"], lib525, V100_32, state)
    assert (r.returncode, r.stdout) == (0, "Enabled Legacy persistence mode for GPU 00000000:18:00.0.\nAll done.\n")
    r = smi(["-lgc", "1410,1410"], lib525, V100_32, state)
    assert r.returncode == 0
    assert r.stdout == 'GPU clocks set to "(gpuClkMin 1410, gpuClkMax 1410)" for GPU 00000000:18:00.0\nAll done.\n'
    r = smi(["-pl", "250"], lib525, V100_32, state)
    assert r.returncode == 0
    assert r.stdout == "Power limit for GPU 00000000:18:00.0 was set to 250.00 W from 300.00 W.\nAll done.\n"
    assert query() == "Enabled, 1410 MHz, 1410 MHz, 250.00 W"
    # pynvml in another process sees what nvidia-smi set.
    assert read_state(lib525, V100_32, state)["pl"] == 250000

    # Out of range: the real tool rejects a power limit (exit 2) but only warns about clocks.
    r = smi(["-pl", "400"], lib525, V100_32, state)
    assert r.returncode == 2
    assert r.stdout.startswith("Provided power limit 400.00 W is not a valid power limit which should be "
                               "between 150.00 W and 300.00 W for GPU 00000000:18:00.0")
    r = smi(["-lgc", "1600,1600"], lib525, V100_32, state)
    assert r.returncode == 0 and "Treating as warning and moving on." in r.stdout
    r = smi(["-lgc", "abc"], lib525, V100_32, state)
    assert r.returncode == 2
    r = smi(["-lmc", "877"], lib525, V100_32, state)  # not on Volta: a warning too
    assert r.returncode == 0 and "Setting locked memory clocks is not supported" in r.stdout
    assert query() == "Enabled, 1410 MHz, 1410 MHz, 250.00 W"

    for args in (["-rgc"], ["-rmc"], ["-pm", "0"], ["-pl", "300"]):
        assert smi(args, lib525, V100_32, state).returncode == 0
    assert query() == "Disabled, 135 MHz, 135 MHz, 300.00 W"
    r = smi(["-pl", "250"], lib525, V100_32, state)
    assert r.stdout.startswith("Warning: persistence mode is disabled on device 00000000:18:00.0.")


def test_nvidia_smi_gpu_selection_and_listing(lib525, state):
    g0, g1 = parse_profile(DUAL)
    r = smi(["-L"], lib525, DUAL, state)
    assert r.stdout.splitlines() == ["GPU 0: %s (UUID: %s)" % (g0["name"], g0["uuid"]),
                                     "GPU 1: %s (UUID: %s)" % (g1["name"], g1["uuid"])]
    for ident in ("1", g1["uuid"], g1["pci_bus_id"], "86:00.0"):
        r = smi(["-i", ident, "--query-gpu=index", "--format=csv,noheader"], lib525, DUAL, state)
        assert r.stdout.strip() == "1", ident
    r = smi(["-i", "1", "-lgc", "1380"], lib525, DUAL, state)
    assert r.returncode == 0
    r = smi(["--query-gpu=clocks.gr", "--format=csv,noheader"], lib525, DUAL, state)
    assert r.stdout.splitlines() == ["135 MHz", "1380 MHz"]
    r = smi(["-i", "7", "--query-gpu=index", "--format=csv"], lib525, DUAL, state)
    assert (r.returncode, r.stdout.strip()) == (6, "No devices were found")
    r = smi(["--query-gpu=bogus", "--format=csv"], lib525, DUAL, state)
    assert (r.returncode, r.stdout.strip()) == (2, 'Field "bogus" is not a valid field to query.')


def test_nvidia_smi_summary_and_q(lib525, lib535, state, tmp_path):
    r = smi([], lib525, DUAL, state)
    assert r.returncode == 0
    assert "| NVIDIA-SMI 525.147.05   Driver Version: 525.147.05   CUDA Version: 12.0     |" in r.stdout
    assert r.stdout.count("Tesla V100-SXM2...  Off") == 2
    assert "| N/A   34C    P0    41W / 300W |      0MiB / 16384MiB |      0%      Default |" in r.stdout
    widths = {len(l) for l in r.stdout.splitlines()[1:] if l.startswith(("|", "+"))}
    assert widths == {79}
    r = smi([], lib535, V100_32, tmp_path / "other-boot")
    assert "| NVIDIA-SMI 535.129.03             Driver Version: 535.129.03     CUDA Version: 12.2     |" in r.stdout
    assert "|   0  Tesla V100-SXM2-32GB           Off |   00000000:18:00.0 Off |" in r.stdout
    widths = {len(l) for l in r.stdout.splitlines()[1:] if l.startswith(("|", "+"))}
    assert widths == {91}

    r = smi(["-q", "-d", "SUPPORTED_CLOCKS"], lib525, V100_32, state)
    assert r.returncode == 0
    listed = [int(m) for m in re.findall(r"^ {12}Graphics +: (\d+) MHz$", r.stdout, re.M)]
    assert listed == volta_clocks(1530)
    assert re.search(r"^ {8}Memory +: 877 MHz$", r.stdout, re.M)
    r = smi(["-q"], lib525, V100_32, state)
    assert re.search(r"^    Product Name +: Tesla V100-SXM2-32GB$", r.stdout, re.M)
    assert re.search(r"^    Product Architecture +: Volta$", r.stdout, re.M)
    assert re.search(r"^        Max Power Limit +: 300.00 W$", r.stdout, re.M)
    r = smi(["--version"], lib525, V100_32, state)
    assert "DRIVER version      : 525.147.05" in r.stdout


def test_nvidia_smi_without_library(state, tmp_path):
    # Probe in a clean process: this one may already hold the mock under that soname.
    env = {k: v for k, v in os.environ.items() if k != "LD_LIBRARY_PATH"}
    probe = subprocess.run([sys.executable, "-c", "import ctypes; ctypes.CDLL('libnvidia-ml.so.1')"],
                           env=env, capture_output=True)
    if probe.returncode == 0:
        pytest.skip("a libnvidia-ml.so.1 is installed system-wide")
    r = smi([], tmp_path, V100_32, state)
    assert r.returncode == 12 and "couldn't find libnvidia-ml.so library" in r.stdout


# ---- nvidia-persistenced ------------------------------------------------------------------

def pid_alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie would still count: the daemon's parent is init, which reaps it.
    return True


def wait_gone(pid, timeout=10):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if not pid_alive(pid):
            return True
        time.sleep(0.05)
    return False


@pytest.mark.parametrize("mode,expected_pm", [("--persistence-mode", 1), ("--no-persistence-mode", 0)])
def test_nvidia_persistenced(lib525, state, tmp_path, mode, expected_pm):
    run_dir = tmp_path / "run-persistenced"
    env = env_for(lib525, DUAL, state, MOCK_NVIDIA_PERSISTENCED_RUN_DIR=run_dir)
    r = subprocess.run([sys.executable, str(PERSISTENCED), "--user", "nvidia-persistenced", "--verbose", mode],
                       env=env, capture_output=True, text=True, timeout=30)
    assert r.returncode == 0, r.stdout + r.stderr
    pid = int((run_dir / "nvidia-persistenced.pid").read_text())
    try:
        assert pid_alive(pid)
        assert [g["persistence"] for g in dump(lib525, DUAL, state)["gpus"]] == [expected_pm] * 2
        # A second instance cannot take the PID file.
        r = subprocess.run([sys.executable, str(PERSISTENCED)], env=env, capture_output=True, text=True, timeout=30)
        assert r.returncode == 1
        assert "nvidia-persistenced failed to initialize. Check syslog for more details." in r.stderr
        os.kill(pid, signal.SIGTERM)
        assert wait_gone(pid)
    finally:
        if pid_alive(pid):
            os.kill(pid, signal.SIGKILL)
    assert not (run_dir / "nvidia-persistenced.pid").exists()
    assert [g["persistence"] for g in dump(lib525, DUAL, state)["gpus"]] == [0, 0]


def test_nvidia_persistenced_fails_without_driver(lib525, state, tmp_path):
    env = env_for(lib525, tmp_path / "absent.profile", state,
                  MOCK_NVIDIA_PERSISTENCED_RUN_DIR=tmp_path / "run-persistenced")
    r = subprocess.run([sys.executable, str(PERSISTENCED)], env=env, capture_output=True, text=True, timeout=30)
    assert r.returncode == 1
    assert not (tmp_path / "run-persistenced" / "nvidia-persistenced.pid").exists()


def test_persistenced_unit_file():
    unit = configparser.ConfigParser(strict=False, interpolation=None)
    unit.optionxform = str
    unit.read(str(MOCK_DIR / "nvidia-persistenced.service"))
    assert unit["Service"]["Type"] == "forking"
    assert unit["Service"]["PIDFile"] == "/run/nvidia-persistenced/nvidia-persistenced.pid"
    assert unit["Service"]["ExecStart"].startswith("/usr/bin/nvidia-persistenced ")
    assert unit["Install"]["WantedBy"] == "multi-user.target"


# ---- the scripts run on Ubuntu 20.04's Python 3.8 ----------------------------------------

@pytest.mark.parametrize("script", [SMI, PERSISTENCED], ids=["nvidia-smi", "nvidia-persistenced"])
def test_scripts_parse_as_python_38(script):
    source = script.read_text()
    ast.parse(source, filename=str(script), feature_version=(3, 8))
    assert source.startswith("#!/usr/bin/env python3\n")
    assert os.access(str(script), os.X_OK)
    # Names that only exist from Python 3.9 on.
    for newer in (".removeprefix(", ".removesuffix(", "functools.cache(", "zoneinfo", "graphlib"):
        assert newer not in source
