# -*- coding: utf-8 -*-
# GPU tuning: resolve an operator's wishes (locked graphics clock, power limit,
# memory clock) against what each card supports, and apply them through NVML.
#
# One implementation serves two callers: the gpu_settings module (at deploy time,
# to resolve and report) and the gpu-tuning-apply tool the role installs on the
# host (at every boot, to apply). Python 3.8-compatible, no Ansible imports.
from __future__ import absolute_import, division, print_function

__metaclass__ = type

import math


class TuningError(Exception):
    """A request the card cannot honour (strict mode) or an NVML failure."""


def _nearest_not_above(supported, wanted):
    """The highest supported value <= wanted, or None when all are above."""
    below = [value for value in supported if value <= wanted]
    return max(below) if below else None


def resolve_clock(gpu, wanted_mhz, strict):
    """Nearest supported graphics clock not above the request; requests outside
    the card's range are clamped to it (or refused in strict mode)."""
    supported = sorted(gpu.get("supported_graphics_clocks_mhz") or [])
    if not supported:
        raise TuningError("GPU %s (%s) reports no supported graphics clocks; cannot lock clocks on it."
                          % (gpu["index"], gpu["name"]))
    low, high = supported[0], supported[-1]
    if strict and not low <= wanted_mhz <= high:
        raise TuningError(
            "GPU %s (%s) cannot lock its graphics clock at %s MHz: its supported range is %s-%s MHz. "
            "Request a clock in that range, or set gpu_tuning_strict: false to clamp."
            % (gpu["index"], gpu["name"], wanted_mhz, low, high))
    if wanted_mhz > high:
        return high, "requested %s MHz is above this card's maximum, clamped to %s MHz" % (wanted_mhz, high)
    if wanted_mhz < low:
        return low, "requested %s MHz is below this card's minimum, clamped to %s MHz" % (wanted_mhz, low)
    chosen = _nearest_not_above(supported, wanted_mhz)
    if chosen == wanted_mhz:
        return chosen, "requested %s MHz is a supported clock" % wanted_mhz
    return chosen, "requested %s MHz is not a supported step; nearest supported clock below it is %s MHz" % (
        wanted_mhz, chosen)


def resolve_power(gpu, watts, fraction, strict):
    """A power limit in watts (or a fraction of the card's default), clamped to
    the card's constraints (or refused in strict mode)."""
    low, high = gpu["power_limit_min_w"], gpu["power_limit_max_w"]
    default = gpu["power_limit_default_w"]
    if watts is None:
        wanted = round(default * fraction, 1)
        origin = "%s of the default %s W = %s W" % (fraction, _w(default), _w(wanted))
    else:
        wanted = float(watts)
        origin = "requested %s W" % _w(wanted)
    if strict and not low <= wanted <= high:
        raise TuningError(
            "GPU %s (%s) cannot take a power limit of %s W: its allowed range is %s-%s W. "
            "Request a limit in that range, or set gpu_tuning_strict: false to clamp."
            % (gpu["index"], gpu["name"], _w(wanted), _w(low), _w(high)))
    if wanted > high:
        return high, "%s is above this card's maximum, clamped to %s W" % (origin, _w(high))
    if wanted < low:
        return low, "%s is below this card's minimum, clamped to %s W" % (origin, _w(low))
    return wanted, "%s is within this card's %s-%s W" % (origin, _w(low), _w(high))


def resolve_memory_clock(gpu, wanted_mhz, strict):
    supported = sorted(gpu.get("supported_memory_clocks_mhz") or [])
    if not supported:
        raise TuningError("GPU %s (%s) reports no supported memory clocks." % (gpu["index"], gpu["name"]))
    if wanted_mhz in supported:
        return wanted_mhz, "requested memory clock %s MHz is supported" % wanted_mhz
    if strict:
        raise TuningError(
            "GPU %s (%s) cannot run its memory at %s MHz: supported memory clocks are %s MHz."
            % (gpu["index"], gpu["name"], wanted_mhz, ", ".join(str(c) for c in supported)))
    chosen = _nearest_not_above(supported, wanted_mhz) or supported[0]
    return chosen, "requested memory clock %s MHz is not supported; using %s MHz" % (wanted_mhz, chosen)


def _w(value):
    return ("%.1f" % value).rstrip("0").rstrip(".")


def _number(request, key, integer):
    """request[key] as a positive, finite number (int when integer), or None when
    unset; a TuningError naming the variable and the value otherwise (nan, inf, a
    word, zero or less would otherwise pass a range check or end in a traceback)."""
    value = request.get(key)
    if value is None:
        return None
    try:
        number = float(value)
    except (TypeError, ValueError):
        number = float("nan")
    if isinstance(value, bool) or not math.isfinite(number) or number <= 0 or (integer and number != int(number)):
        raise TuningError("gpu_tuning_%s must be a positive %s, got %r." % (key, "whole number" if integer else "number",
                                                                         value))
    return int(number) if integer else number


def resolve(gpus, request, strict=False):
    """Per GPU, the settings to apply and why.

    request: dict with optional keys persistence (bool), locked_graphics_clock_mhz,
    power_limit_w, power_limit_fraction, memory_clock_mhz. Returns a list of dicts
    keyed by the GPU's uuid, each with the resolved values and a list of reasons.
    """
    if request.get("power_limit_w") is not None and request.get("power_limit_fraction") is not None:
        raise TuningError("Set either gpu_tuning_power_limit_w or gpu_tuning_power_limit_fraction, not both.")
    clock = _number(request, "locked_graphics_clock_mhz", integer=True)
    watts = _number(request, "power_limit_w", integer=False)
    memory_clock = _number(request, "memory_clock_mhz", integer=True)
    fraction = _number(request, "power_limit_fraction", integer=False)
    if fraction is not None and not 0 < fraction <= 1.5:
        raise TuningError("gpu_tuning_power_limit_fraction must be a fraction of the default limit "
                          "between 0 and 1.5 (got %s)." % fraction)
    settings = []
    for gpu in gpus:
        entry = {
            "index": gpu["index"],
            "uuid": gpu["uuid"],
            "name": gpu["name"],
            "persistence": bool(request.get("persistence", True)),
            "locked_graphics_clock_mhz": None,
            "power_limit_w": None,
            "memory_clock_mhz": None,
            "reasons": [],
        }
        if clock is not None:
            entry["locked_graphics_clock_mhz"], why = resolve_clock(gpu, clock, strict)
            entry["reasons"].append("graphics clock: " + why)
        if watts is not None or fraction is not None:
            entry["power_limit_w"], why = resolve_power(gpu, watts, fraction, strict)
            entry["reasons"].append("power limit: " + why)
        if memory_clock is not None:
            entry["memory_clock_mhz"], why = resolve_memory_clock(gpu, memory_clock, strict)
            entry["reasons"].append("memory clock: " + why)
        settings.append(entry)
    return settings


# --- Applying settings through NVML (the boot-time tool) -----------------------

NVML_CLOCK_GRAPHICS = 0
NVML_CLOCK_MEM = 2


def current_state(nvml, handle):
    """What the card holds now. Locked clocks are not readable through NVML on
    every driver, so the current graphics clock stands in for them: under a lock
    an idle card sits at the locked clock."""
    return {
        "persistence": bool(nvml.nvmlDeviceGetPersistenceMode(handle)),
        "graphics_clock_mhz": nvml.nvmlDeviceGetClockInfo(handle, NVML_CLOCK_GRAPHICS),
        "memory_clock_mhz": nvml.nvmlDeviceGetClockInfo(handle, NVML_CLOCK_MEM),
        "power_limit_w": nvml.nvmlDeviceGetPowerManagementLimit(handle) / 1000.0,
        "default_power_limit_w": nvml.nvmlDeviceGetPowerManagementDefaultLimit(handle) / 1000.0,
    }


def drift(wanted, current):
    """The settings of `wanted` (one resolved entry) that `current` does not hold."""
    out = []
    if wanted.get("persistence") and not current["persistence"]:
        out.append("persistence")
    if wanted.get("locked_graphics_clock_mhz") is not None and \
            current["graphics_clock_mhz"] != wanted["locked_graphics_clock_mhz"]:
        out.append("locked_graphics_clock_mhz")
    if wanted.get("power_limit_w") is not None and abs(current["power_limit_w"] - wanted["power_limit_w"]) > 0.5:
        out.append("power_limit_w")
    if wanted.get("memory_clock_mhz") is not None and current["memory_clock_mhz"] != wanted["memory_clock_mhz"]:
        out.append("memory_clock_mhz")
    return out


def apply(nvml, wanted, handle):
    """Apply one GPU's resolved settings that do not hold yet. Returns the list of
    settings changed. Persistence is left to nvidia-persistenced (NVIDIA's
    supported way); it is only reported here."""
    changed = []
    current = current_state(nvml, handle)
    for name in drift(wanted, current):
        if name == "locked_graphics_clock_mhz":
            clock = wanted["locked_graphics_clock_mhz"]
            nvml.nvmlDeviceSetGpuLockedClocks(handle, clock, clock)
            changed.append(name)
        elif name == "power_limit_w":
            nvml.nvmlDeviceSetPowerManagementLimit(handle, int(round(wanted["power_limit_w"] * 1000)))
            changed.append(name)
        elif name == "memory_clock_mhz":
            clock = wanted["memory_clock_mhz"]
            try:
                nvml.nvmlDeviceSetMemoryLockedClocks(handle, clock, clock)
            except nvml.NVMLError_NotSupported:
                # Volta cannot lock memory clocks; application clocks carry the memory clock.
                graphics = wanted.get("locked_graphics_clock_mhz") or \
                    nvml.nvmlDeviceGetDefaultApplicationsClock(handle, NVML_CLOCK_GRAPHICS)
                nvml.nvmlDeviceSetApplicationsClocks(handle, clock, graphics)
            changed.append(name)
    return changed


def reset(nvml, handle):
    """Back to the card's defaults: no locked clocks, default power limit."""
    nvml.nvmlDeviceResetGpuLockedClocks(handle)
    try:
        nvml.nvmlDeviceResetMemoryLockedClocks(handle)
    except nvml.NVMLError_NotSupported:
        pass
    try:
        nvml.nvmlDeviceResetApplicationsClocks(handle)
    except nvml.NVMLError_NotSupported:
        pass
    nvml.nvmlDeviceSetPowerManagementLimit(handle, nvml.nvmlDeviceGetPowerManagementDefaultLimit(handle))
