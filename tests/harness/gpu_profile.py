"""Read a mock NVML hardware profile (tests/harness/mock_nvml/profiles/*.profile).

The profile is the simulated hardware; tests read it here, independently of the
mock library, and compare it with what the real pynvml reports on a host.
"""
import os

PROFILE_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "mock_nvml", "profiles")


def parse_cpu_list(text):
    """'0-3,8' -> [0, 1, 2, 3, 8]"""
    cpus = []
    for part in filter(None, (p.strip() for p in text.split(","))):
        lo, _, hi = part.partition("-")
        cpus.extend(range(int(lo), int(hi or lo) + 1))
    return cpus


def load_profile(name):
    """Return {'gpu_count': N, 'gpus': [ {key: value-as-string}, ... ]}."""
    path = name if os.path.sep in name else os.path.join(PROFILE_DIR, name + ".profile")
    raw = {}
    with open(path) as handle:
        for line in handle:
            line = line.strip()
            if line and not line.startswith("#"):
                key, _, value = line.partition("=")
                raw[key.strip()] = value.strip()
    count = int(raw["gpu_count"])
    shared = {k[len("gpu."):]: v for k, v in raw.items() if k.startswith("gpu.")}
    gpus = []
    for index in range(count):
        prefix = "gpu%d." % index
        gpu = dict(shared)
        gpu.update({k[len(prefix):]: v for k, v in raw.items() if k.startswith(prefix)})
        gpus.append(gpu)
    return {"gpu_count": count, "gpus": gpus}


def int_list(text):
    return [int(v) for v in text.split(",") if v.strip()]
