#!/usr/bin/python
# -*- coding: utf-8 -*-
from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
---
module: nvidia_gpu_facts
short_description: Read the host's NVIDIA GPUs through NVML
description:
  - Returns one entry per GPU (identity, memory, compute capability, memory bandwidth,
    NUMA placement, supported clocks, power limits, persistence, NVLink peers) and the
    driver and CUDA driver versions, read with the C(pynvml) package (nvidia-ml-py).
  - When NVML cannot answer (no GPU, no driver, a driver/library version mismatch),
    the module does not fail; it returns C(nvidia_gpus=[]) and the reason, so a role
    can decide what to do (install the driver, reboot).
  - Runs with the Python that has C(nvidia-ml-py); the roles use the project's host venv.
  - Each GPU's C(health) carries the Xids since boot that the GPU exporter heard (its
    journal, O(xid_journal)); C(xid_events=null) when no exporter listens.
options:
  xid_journal:
    description: Where the GPU exporter appends the Xid events it hears (cleared at reboot).
    type: path
    default: /run/llm-fleet-gpu-exporter/xid-events.jsonl
requirements:
  - nvidia-ml-py (pynvml)
notes:
  - Supports check mode; it only reads.
author: llm-fleet
"""

EXAMPLES = r"""
- name: Read the GPUs
  nvidia_gpu_facts:
  vars:
    ansible_python_interpreter: /opt/llm-fleet/venv/bin/python

- name: Show the first card
  ansible.builtin.debug:
    msg: "{{ ansible_facts.nvidia_gpus[0].name }} ({{ ansible_facts.nvidia_gpus[0].compute_capability }})"
"""

RETURN = r"""
ansible_facts:
  description: Facts added to the host.
  returned: always
  type: dict
  contains:
    nvidia_gpus:
      description: One entry per GPU, in NVML index order.
      type: list
      elements: dict
      sample:
        - index: 0
          name: Tesla V100-SXM2-32GB
          uuid: GPU-6f3d2a3c-8c51-4f0e-9a55-1b2d7c9e0a01
          pci_bus_id: "00000000:18:00.0"
          memory_total_bytes: 34359738368
          memory_bandwidth_bytes_per_s: 898048000000
          compute_capability: "7.0"
          numa_node: 0
          cpu_affinity: [0, 1, 2]
          supported_graphics_clocks_mhz: [1530, 1522]
          power_limit_min_w: 150.0
          power_limit_max_w: 300.0
          power_limit_default_w: 300.0
    nvidia_gpu_count:
      description: Number of GPUs NVML reads (0 when it cannot answer); a lost one is not counted.
      type: int
    nvidia_gpus_lost:
      description: >-
        GPUs NVML counts but cannot reach (C(GPU_IS_LOST): fallen off the bus, Xid 79; or
        C(RESET_REQUIRED)), each C(index), C(error), C(error_code). The other GPUs are read as usual.
      type: list
      elements: dict
      sample:
        - index: 1
          error: GPU is lost
          error_code: GPU_IS_LOST
    nvidia_driver_version:
      description: Driver version, e.g. C(525.147.05); null when NVML cannot answer.
      type: str
    nvidia_cuda_driver_version:
      description: Highest CUDA version the driver supports, e.g. C(12.0).
      type: str
    nvidia_nvml_error:
      description: Why NVML could not answer, in NVML's words; null when it answered.
      type: str
    nvidia_nvml_error_code:
      description: >-
        NVML's error as a name (C(LIB_RM_VERSION_MISMATCH), C(DRIVER_NOT_LOADED),
        C(LIBRARY_NOT_FOUND), ...); null when NVML answered.
      type: str
"""

import traceback

from ansible.module_utils.basic import AnsibleModule, missing_required_lib
from ansible.module_utils.fleet_errors import fail

try:
    import pynvml
except ImportError:
    pynvml = None
    PYNVML_IMPORT_ERROR = traceback.format_exc()
else:
    PYNVML_IMPORT_ERROR = None

from ansible.module_utils.gpu_health import XID_JOURNAL
from ansible.module_utils.nvidia_gpu import NvmlUnavailable, error_name, read_host


def main():
    module = AnsibleModule(argument_spec={"xid_journal": {"type": "path", "default": XID_JOURNAL}},
                           supports_check_mode=True)
    if pynvml is None:
        fail(module, missing_required_lib(
            "nvidia-ml-py", reason="to read the GPUs through NVML (install it into the Python this module runs with)"),
            exception=PYNVML_IMPORT_ERROR)
    facts = {
        "nvidia_gpus": [],
        "nvidia_gpus_lost": [],
        "nvidia_gpu_count": 0,
        "nvidia_driver_version": None,
        "nvidia_cuda_driver_version": None,
        "nvidia_nvml_error": None,
        "nvidia_nvml_error_code": None,
    }
    try:
        host = read_host(pynvml, module.params["xid_journal"])
    except NvmlUnavailable as err:
        facts["nvidia_nvml_error"] = err.message
        facts["nvidia_nvml_error_code"] = error_name(err.code)
    else:
        facts.update({
            "nvidia_gpus": host["gpus"],
            "nvidia_gpus_lost": host["lost_gpus"],
            "nvidia_gpu_count": len(host["gpus"]),
            "nvidia_driver_version": host["driver_version"],
            "nvidia_cuda_driver_version": host["cuda_driver_version"],
        })
    module.exit_json(changed=False, ansible_facts=facts)


if __name__ == "__main__":
    main()
