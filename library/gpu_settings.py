#!/usr/bin/python
# -*- coding: utf-8 -*-
from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
---
module: gpu_settings
short_description: Resolve GPU clock and power wishes per card, and show what does not hold yet
description:
  - Reads every GPU through NVML (pynvml), resolves the requested locked graphics clock, power limit
    and memory clock against that card's supported clocks and power constraints, and says why for
    each value. Reports, per GPU, which resolved settings the card does not hold right now (C(drift)).
  - Only reads; applying is the job of the gpu-tuning-apply tool the gpu_tuning role installs.
options:
  persistence:
    description: Persistence mode wanted (kept by nvidia-persistenced).
    type: bool
    default: true
  locked_graphics_clock_mhz:
    description: Graphics clock to lock; the nearest supported clock not above it is used.
    type: int
  power_limit_w:
    description: Power limit in watts; clamped to the card's constraints.
    type: float
  power_limit_fraction:
    description: Power limit as a fraction of the card's default limit (instead of I(power_limit_w)).
    type: float
  memory_clock_mhz:
    description: Memory clock; must be one the card supports.
    type: int
  strict:
    description: Fail, naming the card, the request and the valid range, instead of clamping.
    type: bool
    default: false
requirements:
  - nvidia-ml-py (pynvml)
notes:
  - Supports check mode; it only reads.
author: llm-fleet
"""

EXAMPLES = r"""
- name: Resolve the seeds' 1410 MHz / 300 W for each card
  gpu_settings:
    locked_graphics_clock_mhz: 1410
    power_limit_w: 300
  vars:
    ansible_python_interpreter: /opt/llm-fleet/venv/bin/python
  register: tuning
"""

RETURN = r"""
settings:
  description: One entry per GPU with the resolved values and the reasons.
  returned: success
  type: list
  elements: dict
  sample:
    - index: 0
      uuid: GPU-4f6a1c2e-8b3d-4e55-9a71-2c0d93b5e7a4
      name: Tesla V100-PCIE-16GB
      persistence: true
      locked_graphics_clock_mhz: 1380
      power_limit_w: 250.0
      memory_clock_mhz: null
      reasons:
        - "graphics clock: requested 1410 MHz is above this card's maximum, clamped to 1380 MHz"
        - "power limit: requested 300 W is above this card's maximum, clamped to 250 W"
      warnings:
        - "GPU 0 (Tesla V100-PCIE-16GB) graphics clock: requested 1410 MHz is above this card's maximum, clamped to 1380 MHz"
        - "GPU 0 (Tesla V100-PCIE-16GB) power limit: requested 300 W is above this card's maximum, clamped to 250 W"
drift:
  description: Per GPU uuid, the resolved settings the card does not hold now.
  returned: success
  type: dict
current:
  description: Per GPU uuid, what the card holds now (persistence, graphics clock, power limit).
  returned: success
  type: dict
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

from ansible.module_utils.gpu_tuning import TuningError, current_state, drift, resolve
from ansible.module_utils.nvidia_gpu import read_gpu


def main():
    module = AnsibleModule(
        argument_spec=dict(
            persistence=dict(type="bool", default=True),
            locked_graphics_clock_mhz=dict(type="int"),
            power_limit_w=dict(type="float"),
            power_limit_fraction=dict(type="float"),
            memory_clock_mhz=dict(type="int"),
            strict=dict(type="bool", default=False),
        ),
        mutually_exclusive=[("power_limit_w", "power_limit_fraction")],
        supports_check_mode=True,
    )
    if pynvml is None:
        fail(module, missing_required_lib("nvidia-ml-py", reason="to read the GPUs through NVML"),
             exception=PYNVML_IMPORT_ERROR)
    request = {key: module.params[key] for key in
               ("persistence", "locked_graphics_clock_mhz", "power_limit_w", "power_limit_fraction",
                "memory_clock_mhz")}
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as err:
        fail(module, "NVML does not answer (%s): run the nvidia_stack stage first, or reboot "
                     "if the driver was just upgraded." % err)
    try:
        gpus = [read_gpu(pynvml, index) for index in range(pynvml.nvmlDeviceGetCount())]
        settings = resolve(gpus, request, strict=module.params["strict"])
        current = {}
        for entry in settings:
            current[entry["uuid"]] = current_state(pynvml, pynvml.nvmlDeviceGetHandleByIndex(entry["index"]))
    except TuningError as err:
        fail(module, str(err))
    except pynvml.NVMLError as err:
        fail(module, "NVML failed while reading the GPUs: %s" % err)
    finally:
        pynvml.nvmlShutdown()
    for entry in settings:
        for warning in entry["warnings"]:
            module.warn(warning)
    module.exit_json(
        changed=False,
        settings=settings,
        current=current,
        drift={entry["uuid"]: drift(entry, current[entry["uuid"]]) for entry in settings},
    )


if __name__ == "__main__":
    main()
