# -*- coding: utf-8 -*-
"""Draw the fleet report (verify_report.py's verify_fleet_report) for people: the
Markdown table with its notes, and two SVG bar charts (tok/s against the decode
ceiling; GPU memory measured against predicted) drawn by one chart helper.

Plain functions over plain dicts, so tests/unit/test_verify_report.py can call
them without Ansible; the FilterModule at the end exposes them as filters.
Runs on the controller."""
from __future__ import absolute_import, division, print_function

__metaclass__ = type

import os

import ansible.module_utils

# Ansible ships module_utils/ to modules only; the controller maps the
# repository's copy, so a plugin and a module share one definition.
_MODULE_UTILS = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..",
                                              "module_utils"))
if _MODULE_UTILS not in ansible.module_utils.__path__:
    ansible.module_utils.__path__.append(_MODULE_UTILS)

from ansible.module_utils.filter_input import guard_filters  # noqa: E402

GIB = float(1 << 30)
# The charts' geometry: label column, bar height, gap between rows, title band.
_LABEL_W, _BAR_H, _GAP, _TOP = 200, 10, 8, 30


def _cell(value, spec="%.1f"):
    if value is None:
        return "-"
    if isinstance(value, float):
        return spec % value
    return str(value)


def verify_fleet_markdown(report, missing_hosts=None):
    """The fleet report as Markdown."""
    lines = ["# Fleet verification", ""]
    lines.append("Generated %s: %d host(s), %d llama-server instance(s). Decode ceiling = the card's memory "
                 "bandwidth / bytes read per token (the model stage's plan); a host is flagged below %s of it."
                 % (report.get("generated_at") or "-", report["hosts"], report["instances"],
                    _cell((report.get("settings") or {}).get("min_ceiling_fraction"), "%.2f")))
    if report.get("flagged_hosts"):
        lines += ["", "**Flagged (below the ceiling fraction):** %s" % ", ".join(report["flagged_hosts"])]
    if report.get("error_hosts"):
        lines += ["", "**Errors:** %s" % ", ".join(report["error_hosts"])]
    skipped = (report.get("settings") or {}).get("skipped_hosts") or []
    if skipped:
        lines += ["", "**Nothing to verify (no llama-server instance recorded):** %s" % ", ".join(skipped)]
    if missing_hosts:
        lines += ["", "**No result (unreachable or failed before measuring):** %s" % ", ".join(missing_hosts)]
    held = (report.get("settings") or {}).get("held_gpus") or []
    if held:
        lines += ["", "**GPUs failing their health check (no instance is started on them):**", ""]
        lines += ["- %s" % line for line in held]
    lines += ["", "| host | GPU | quant | -c / -np | KV | 1 stream tok/s | TTFT s | 4 streams tok/s | all slots tok/s "
              "| expected 1 / all slots tok/s | ceiling tok/s | 1 stream / ceiling | VRAM used / predicted GiB "
              "| llama-bench pp / tg tok/s | status |",
              "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for record in sorted(report.get("records", []), key=lambda r: r["host"]):
        for i in record.get("instances", []):
            vram = i.get("vram") or {}
            cpu_served = i.get("served_by") == "cpu" and (record["llama_cpp"].get("backend") or "cpu") != "cpu"
            if vram.get("note"):
                vram_text = "n/a (%s)" % ("CPU-served" if cpu_served else record["llama_cpp"].get("backend") or "?")
            elif vram.get("measured_used_bytes") is not None and vram.get("predicted_used_bytes"):
                vram_text = "%.2f / %.2f (%+.1f%%)" % (vram["measured_used_bytes"] / GIB,
                                                       vram["predicted_used_bytes"] / GIB,
                                                       (vram["measured_over_predicted"] - 1) * 100)
            else:
                vram_text = "-"
            bench = i.get("llama_bench") or {}
            if bench.get("status") == "ok":
                bench_text = "%s / %s" % (_cell(bench.get("prompt_tps")), _cell(bench.get("decode_tps")))
            else:
                bench_text = bench.get("status", "-")
            if i["ceiling_ratio"] is not None:
                ratio_text = "%.0f%%" % (i["ceiling_ratio"] * 100)
            else:
                ratio_text = "n/a"
            status = "CPU-served" if cpu_served else "FLAGGED" if i["flagged"] else ("ok" if i["ok"] else "error")
            if i.get("expected_decode_tps") is not None:
                expected_text = "%s / %s" % (_cell(i["expected_decode_tps"]), _cell(i.get("expected_aggregate_tps")))
            else:
                expected_text = "n/a"
            lines.append("| %s | %s %s | %s | %s / %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |" % (
                record["host"], i["gpu_index"], i.get("gpu_name") or "", i.get("quant") or "-", i.get("ctx_size"),
                i.get("parallel"), i.get("cache_type_k"), _cell(i["single_stream_tps"]), _cell(i["ttft_s"], "%.3f"),
                _cell(i["aggregate_4_tps"]), _cell(i["aggregate_slots_tps"]), expected_text,
                _cell(i["decode_ceiling_tps"]), ratio_text, vram_text, bench_text, status))
    notes = []
    for record in sorted(report.get("records", []), key=lambda r: r["host"]):
        for i in record.get("instances", []):
            for problem in i.get("problems", []):
                notes.append("- %s GPU %s: %s" % (record["host"], i["gpu_index"], problem))
            if i["ceiling_ratio"] is None and i.get("ceiling_note"):
                notes.append("- %s GPU %s: ceiling ratio %s" % (record["host"], i["gpu_index"], i["ceiling_note"]))
    if notes:
        lines += ["", "## Notes", ""] + notes
    gate = _speed_gate_lines(report)
    if gate:
        lines += ["", "## Speed gate and speculative decoding", ""] + gate
    lines += ["", "Totals: %s tok/s single-stream, %s tok/s with every slot busy; ceiling ratio min %s, mean %s." % (
        _cell(report.get("single_stream_tps_total")), _cell(report.get("aggregate_slots_tps_total")),
        _cell(report.get("ceiling_ratio_min"), "%.2f"), _cell(report.get("ceiling_ratio_mean"), "%.2f"))]
    return "\n".join(lines) + "\n"


def _speed_gate_lines(report):
    """What the rollout's speed gate judged (a changed instance, or a baseline recorded) and the
    speculation verdicts the next plan follows, a line each (module_utils/speed_gate.py)."""
    out = []
    for record in sorted(report.get("records", []), key=lambda r: r["host"]):
        gate = record.get("speed_gate") or {}
        for v in gate.get("verdicts") or []:
            if v.get("gated") or v.get("verdict") == "no_baseline":
                out.append("- %s %s: %s" % (record["host"], v.get("verdict"), v.get("message")))
        for v in gate.get("speculation") or []:
            out.append("- %s speculation %s: %s" % (record["host"], v.get("verdict"), v.get("message")))
    return out


def _esc(text):
    return str(text).replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;").replace('"', "&quot;")


def _bar_chart(title, rows, scale_max, unit, width, right):
    """A horizontal bar chart, one row per instance. Each row: its label (red when
    flagged), bars drawn one under the other (value, colour, the value's label or
    None), an optional label after the longest bar, and an optional marker (a
    vertical line at a value, named at the right edge when the value is off scale)."""
    height = _TOP + len(rows) * (2 * _BAR_H + _GAP) + 30
    plot_w = width - _LABEL_W - right

    def x(value):
        return _LABEL_W + plot_w * float(value) / scale_max

    out = ['<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" font-family="sans-serif" font-size="11">'
           % (width, height), '<text x="10" y="18" font-size="13">%s</text>' % title]
    y = _TOP
    for row in rows:
        out.append('<text x="10" y="%d"%s>%s</text>' % (y + _BAR_H + 3, ' fill="#c00"' if row.get("flagged") else "",
                                                       _esc(row["label"])))
        for n, (value, colour, text) in enumerate(row["bars"]):
            out.append('<rect x="%d" y="%d" width="%.1f" height="%d" fill="%s"/>'
                       % (_LABEL_W, y + n * _BAR_H, x(value) - _LABEL_W, _BAR_H, colour))
            if text is not None:
                out.append('<text x="%.1f" y="%d">%s</text>' % (x(value) + 3, y + (n + 1) * _BAR_H - 1, text))
        if row.get("after"):
            out.append('<text x="%.1f" y="%d">%s</text>' % (max(x(v) for v, _, _ in row["bars"]) + 3,
                                                              y + 2 * _BAR_H - 1, row["after"]))
        marker, colour, name = row.get("marker") or (None, None, None)
        if marker and marker <= scale_max:
            out.append('<line x1="%.1f" y1="%d" x2="%.1f" y2="%d" stroke="%s" stroke-width="2"/>'
                       % (x(marker), y - 2, x(marker), y + 2 * _BAR_H + 2, colour))
        elif marker:
            out.append('<text x="%d" y="%d" text-anchor="end" fill="%s">%s %.0f, off scale</text>'
                       % (width - 4, y + 2 * _BAR_H - 1, colour, name, marker))
        y += 2 * _BAR_H + _GAP
    out.append('<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="#444"/>' % (_LABEL_W, _TOP - 4, _LABEL_W, y))
    out.append('<text x="%d" y="%d">0</text><text x="%d" y="%d" text-anchor="end">%.0f %s</text>'
               % (_LABEL_W, y + 14, _LABEL_W + plot_w, y + 14, scale_max, unit))
    out.append("</svg>")
    return "\n".join(out) + "\n"


def _instances(report):
    for record in sorted(report.get("records", []), key=lambda r: r["host"]):
        for i in record.get("instances", []):
            yield "%s GPU %s" % (record["host"], i["gpu_index"]), i


def verify_fleet_svg(report, width=720):
    """Per instance, 1-stream and all-slots tok/s against the decode ceiling."""
    rows = []
    for label, i in _instances(report):
        single, full = i.get("single_stream_tps") or 0, i.get("aggregate_slots_tps") or 0
        ceiling = i.get("decode_ceiling_tps") if i.get("ceiling_ratio") is not None else None
        rows.append({"label": label, "flagged": i.get("flagged"),
                     "bars": [(single, "#2b5d8a", "%.1f" % single), (full, "#8fb8de", "%.1f" % full)],
                     "marker": (ceiling, "#c00", "ceiling")})
    # a ceiling far above every measured figure (a tiny model served by a CPU) is
    # named, not drawn: it would flatten the bars
    measured_max = max([max(r["bars"][0][0], r["bars"][1][0]) for r in rows] + [1.0])
    drawn = [r["marker"][0] for r in rows if r["marker"][0] and r["marker"][0] <= 3 * measured_max]
    return _bar_chart("tok/s per instance: 1 stream (dark), all slots (light), decode ceiling (red line)",
                      rows, max([measured_max] + drawn), "tok/s", width, right=80)


def verify_fleet_vram_svg(report, width=720):
    """Per instance on a GPU build: VRAM measured (dark) against the plan's prediction
    (light), as a share of the card; empty string when no instance has both."""
    rows, scale_max = [], 1.0
    for label, i in _instances(report):
        vram = i.get("vram") or {}
        if vram.get("note") or not vram.get("measured_used_bytes") or not vram.get("predicted_used_bytes"):
            continue
        measured, predicted = vram["measured_used_bytes"] / GIB, vram["predicted_used_bytes"] / GIB
        card = (vram.get("total_bytes") or 0) / GIB
        scale_max = max(scale_max, measured, predicted, card)
        rows.append({"label": label, "bars": [(measured, "#2b5d8a", None), (predicted, "#8fb8de", None)],
                     "after": "%.2f / %.2f (%+.1f%%)" % (measured, predicted, (measured / predicted - 1) * 100),
                     "marker": (card, "#888", "card")})
    if not rows:
        return ""
    return _bar_chart("GPU memory per instance, GiB: measured (dark), predicted (light), the card (grey line)",
                      rows, scale_max, "GiB", width, right=150)


_KINDS = {
    "verify_fleet_markdown": {"report": "dict", "missing_hosts": "list?"},
    "verify_fleet_svg": {"report": "dict"},
    "verify_fleet_vram_svg": {"report": "dict"},
}


class FilterModule(object):
    def filters(self):
        return guard_filters({
            "verify_fleet_markdown": verify_fleet_markdown,
            "verify_fleet_svg": verify_fleet_svg,
            "verify_fleet_vram_svg": verify_fleet_vram_svg,
        }, _KINDS)
