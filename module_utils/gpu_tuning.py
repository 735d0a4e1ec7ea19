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


# Outside a card's range, a request is clamped only when it is close to the range
# (within this fraction of the bound it passes): the seeds' SXM2 settings (1410 MHz,
# 300 W) set fleet-wide mean "the maximum" on a PCIe card (1380 MHz, 250 W: 20%
# over); 15300 MHz or 3000 W are typos. Farther off, a request is refused.
CLAMP_TOLERANCE = 0.25
# A graphics clock locked below this fraction of the card's maximum is refused:
# no one serves an LLM at 135 MHz on purpose (141 is a typo for 1410); the power
# limit is the knob for running cooler.
LOWEST_SENSIBLE_LOCK_FRACTION = 0.5
# A memory clock the card lacks is replaced by its nearest supported clock only
# within this fraction; otherwise (another card's clock left in group_vars) the
# card's memory clock is left alone, with a warning.
MEMORY_CLOCK_TOLERANCE = 0.10


def _nearest_not_above(supported, wanted):
    """The highest supported value <= wanted, or None when all are above."""
    below = [value for value in supported if value <= wanted]
    return max(below) if below else None


def _typo_hint(wanted, low, high):
    for factor in (10, 100):
        if low <= wanted * factor <= high:
            return " (did you mean %s?)" % (wanted * factor)
    return ""


def resolve_clock(gpu, wanted_mhz, strict):
    """Nearest supported graphics clock not above the request. A request a little
    above the card's maximum is clamped to it (refused in strict mode); one far
    above it, or below half of it, is refused with the range that works."""
    supported = sorted(gpu.get("supported_graphics_clocks_mhz") or [])
    if not supported:
        raise TuningError("GPU %s (%s) reports no supported graphics clocks; cannot lock clocks on it."
                          % (gpu["index"], gpu["name"]))
    low, high = supported[0], supported[-1]
    sensible = max(low, _nearest_not_above(supported, int(high * LOWEST_SENSIBLE_LOCK_FRACTION)) or low)
    clamp_up_to = int(high * (1 + CLAMP_TOLERANCE))
    if wanted_mhz < sensible:
        raise TuningError(
            "gpu_tuning_locked_graphics_clock_mhz is %s MHz: GPU %s (%s) would serve at a fraction of its speed%s. "
            "Lock it between %s and %s MHz (its supported range is %s-%s MHz; lower the power limit to run cooler), "
            "or leave the variable unset." % (wanted_mhz, gpu["index"], gpu["name"], _typo_hint(wanted_mhz, sensible, high),
                                              sensible, high, low, high))
    if wanted_mhz > high and (strict or wanted_mhz > clamp_up_to):
        raise TuningError(
            "GPU %s (%s) cannot lock its graphics clock at %s MHz: its supported range is %s-%s MHz%s. "
            "Request a clock in that range%s." % (
                gpu["index"], gpu["name"], wanted_mhz, low, high,
                "" if strict else " and only requests up to %s MHz are clamped to the maximum" % clamp_up_to,
                ", or set gpu_tuning_strict: false to clamp" if strict and wanted_mhz <= clamp_up_to else ""))
    if wanted_mhz > high:
        return high, "requested %s MHz is above this card's maximum, clamped to %s MHz" % (wanted_mhz, high)
    chosen = _nearest_not_above(supported, wanted_mhz)
    if chosen == wanted_mhz:
        return chosen, "requested %s MHz is a supported clock" % wanted_mhz
    return chosen, "requested %s MHz is not a supported step; nearest supported clock below it is %s MHz" % (
        wanted_mhz, chosen)


def resolve_power(gpu, watts, fraction, strict):
    """A power limit in watts (or a fraction of the card's default). Within
    CLAMP_TOLERANCE of the card's range it is clamped (refused in strict mode);
    farther off it is refused with the range."""
    low, high = gpu["power_limit_min_w"], gpu["power_limit_max_w"]
    default = gpu["power_limit_default_w"]
    if watts is None:
        wanted = round(default * fraction, 1)
        origin = "%s of the default %s W = %s W" % (fraction, _w(default), _w(wanted))
    else:
        wanted = float(watts)
        origin = "requested %s W" % _w(wanted)
    inside = low <= wanted <= high
    near = low * (1 - CLAMP_TOLERANCE) <= wanted <= high * (1 + CLAMP_TOLERANCE)
    if not inside and (strict or not near):
        raise TuningError(
            "GPU %s (%s) cannot take a power limit of %s W (%s): its allowed range is %s-%s W%s. "
            "Request a limit in that range%s." % (
                gpu["index"], gpu["name"], _w(wanted), origin, _w(low), _w(high),
                "" if strict else " and only limits within %d%% of it are clamped" % (CLAMP_TOLERANCE * 100),
                ", or set gpu_tuning_strict: false to clamp" if strict and near else ""))
    if wanted > high:
        return high, "%s is above this card's maximum, clamped to %s W" % (origin, _w(high))
    if wanted < low:
        return low, "%s is below this card's minimum, clamped to %s W" % (origin, _w(low))
    return wanted, "%s is within this card's %s-%s W" % (origin, _w(low), _w(high))


def resolve_memory_clock(gpu, wanted_mhz, strict):
    """The requested memory clock, or the card's nearest within
    MEMORY_CLOCK_TOLERANCE; None (left alone) when the card has nothing close,
    which is the case of another card's clock left in group_vars."""
    supported = sorted(gpu.get("supported_memory_clocks_mhz") or [])
    if not supported:
        raise TuningError("GPU %s (%s) reports no supported memory clocks." % (gpu["index"], gpu["name"]))
    if wanted_mhz in supported:
        return wanted_mhz, "requested memory clock %s MHz is supported" % wanted_mhz
    listed = ", ".join(str(c) for c in supported)
    if strict:
        raise TuningError(
            "GPU %s (%s) cannot run its memory at %s MHz: supported memory clocks are %s MHz."
            % (gpu["index"], gpu["name"], wanted_mhz, listed))
    nearest = min(supported, key=lambda clock: (abs(clock - wanted_mhz), clock))
    if abs(nearest - wanted_mhz) <= wanted_mhz * MEMORY_CLOCK_TOLERANCE:
        return nearest, "requested memory clock %s MHz is not supported; using the nearest, %s MHz" % (
            wanted_mhz, nearest)
    return None, ("NOT APPLIED: requested memory clock %s MHz is far from every clock this card supports (%s MHz); "
                  "its memory clock is left as it is. Set gpu_tuning_memory_clock_mhz per card model (group_vars "
                  "of that group) or unset it." % (wanted_mhz, listed))


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
        # What the operator should read even when the run succeeds: a request
        # changed (clamped, another step) or not applied.
        entry["warnings"] = ["GPU %s (%s) %s" % (gpu["index"], gpu["name"], reason) for reason in entry["reasons"]
                             if "clamped" in reason or "NOT APPLIED" in reason or "not supported; using" in reason]
        settings.append(entry)
    return settings


# --- Applying settings through NVML (the boot-time tool) -----------------------

_CONFIG_FIX = "run the gpu_tuning stage again (playbooks/gpu_tuning.yml) to rewrite it"


def parse_config(text, path):
    """The boot tool's config (gpu-tuning.json, written by the role) from its
    text; a TuningError naming the file and what is wrong when it is empty,
    truncated or not the role's shape (a disk that filled up, a hand edit)."""
    import json
    try:
        config = json.loads(text)
    except ValueError as err:
        raise TuningError("%s is not valid JSON (%s%s): %s."
                          % (path, "empty" if not text.strip() else "truncated or edited",
                             ", %s" % err if text.strip() else "", _CONFIG_FIX))
    gpus = config.get("gpus") if isinstance(config, dict) else None
    if not isinstance(gpus, list):
        raise TuningError("%s has no list of gpus: %s." % (path, _CONFIG_FIX))
    for position, gpu in enumerate(gpus):
        if not isinstance(gpu, dict) or not isinstance(gpu.get("uuid"), str) or "index" not in gpu:
            raise TuningError("%s: gpus[%d] lacks its uuid or index (%r): %s." % (path, position, gpu, _CONFIG_FIX))
        for key in ("locked_graphics_clock_mhz", "power_limit_w", "memory_clock_mhz"):
            value = gpu.get(key)
            if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))
                                      or not math.isfinite(value) or value <= 0):
                raise TuningError("%s: gpus[%d].%s is %r, not a positive number: %s."
                                  % (path, position, key, value, _CONFIG_FIX))
    return config


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
