# -*- coding: utf-8 -*-
"""Speculative decoding, kept only where verify measured that it pays (issue 35).

The policy asks for it (policy.speculative: ngram-mod, llama-server's --spec-type
ngram-mod: drafts from n-grams of the context, no extra weights, so no memory to
budget). Whether it serves is decided from measurements on the same card name and
configuration, kept in the fleet's calibration file beside the speed baselines:

1. No measurement of the configuration without speculation yet: planned off, so
   this run's verify measures that baseline (the speed gate records it).
2. A baseline and no verdict: planned on, a trial; verify compares what the instance
   serves with the baseline and records the verdict (`speculation` in the file).
3. A verdict: on where it paid, off where it did not, the plan saying which and why.
   A verdict measured before verify's load-test prompt changed or llama.cpp was
   upgraded is marked 'outdated' by verify, and the next plan tries it again.

It pays when single-stream decode gains at least min_gain over the baseline and,
with every planned slot busy, decode loses no more than min_gain and the first
token waits no more than min_gain longer (speculation usually loses there: the
drafts take batch room from the other slots). A plan for the throughput objective
must gain with every slot busy instead, and lose no more than min_gain for one stream.

Pure functions, imported by the planner (a module) and verify's filters."""
from __future__ import absolute_import, division, print_function

__metaclass__ = type

from ansible.module_utils.speed_gate import model_file

SPEC_TYPES = ("none", "ngram-mod", "draft-simple")
DEFAULT_MIN_GAIN = 0.05
# what must be equal for the planner to read a measurement as this plan's (the speed
# gate's configuration key without the load test's request length, which the planner
# does not know)
PLAN_KEYS = ("gpu_name", "quant", "ctx_size", "parallel", "cache_type_k", "split_mode")


def spec_type(record):
    value = (record or {}).get("spec_type")
    return value if value in SPEC_TYPES else "none"


def _plan_config(config):
    out = dict((k, (config or {}).get(k) if k != "split_mode" else (config or {}).get(k) or "none")
               for k in PLAN_KEYS)
    out["model_file"] = model_file(config)
    return out


def _same(config, plan):
    """The same configuration; a measurement recorded before configurations named the model
    file (no model_file) matches any model, as it did then."""
    a, b = _plan_config(config), _plan_config(plan)
    if a["model_file"] is None or b["model_file"] is None:
        a["model_file"] = b["model_file"] = None
    return a == b


def check_min_gain(value):
    try:
        gain = float(value)
    except (TypeError, ValueError):
        raise ValueError("the speculation gate's min_gain is %r: give a number from 0 to 10 (0.05: speculation "
                         "must add 5%% to single-stream decode)" % (value,))
    if not 0 <= gain <= 10:
        raise ValueError("the speculation gate's min_gain is %r: give a number from 0 to 10 (0.05: speculation "
                         "must add 5%% to single-stream decode)" % (value,))
    return gain


def _prompt(config):
    """The load-test prompt a measurement used ('default': the load test's own)."""
    return (config or {}).get("prompt_id") or "default"


def _newer_baseline(calibration, plan, than):
    """A baseline without speculation of the plan's configuration measured after `than`."""
    return any(isinstance(b, dict) and spec_type(b.get("config")) == "none" and _same(b.get("config"), plan)
               and str(b.get("measured_at") or "") > str(than or "") for b in calibration.get("baselines") or [])


def outdated_verdicts(instance, verdicts, host, build=None):
    """The verdicts of this host's card and configuration that verify's measurement of
    an instance served without speculation shows to be out of date, each turned into an
    'outdated' entry the next plan tries again: measured with another load-test prompt
    (verify_loadtest_prompt changed, either way) or another llama.cpp build (an upgrade).
    Only verify knows both now; with no new verdict the card would serve without it for good."""
    if spec_type(instance) != "none":
        return []  # served with it: verify judges it anew this run
    prompt = _prompt(instance)
    latest = {}
    for v in verdicts or []:
        if isinstance(v, dict) and v.get("host") == host and v.get("gpu_uuid") == instance.get("gpu_uuid") \
                and v.get("verdict") in ("pays", "no_gain") and _same(v.get("config"), instance):
            key = (v.get("spec_type"), v.get("draft"))
            if str(v.get("measured_at") or "") >= str((latest.get(key) or {}).get("measured_at") or ""):
                latest[key] = v
    out = []
    for (kind, draft), v in sorted(latest.items(), key=lambda kv: str(kv[0])):
        if _prompt(v.get("config")) != prompt:
            why = "the load-test prompt changed (was %s, now %s)" % (_prompt(v.get("config")), prompt)
        elif build and v.get("build") and v["build"] != build:
            why = "llama.cpp was upgraded (build %s, now %s)" % (v["build"], build)
        else:
            continue
        config = dict((k, x) for k, x in (v.get("config") or {}).items() if k != "prompt_id")
        if prompt != "default":
            config["prompt_id"] = prompt
        entry = {"verdict": "outdated", "spec_type": kind, "gpu_uuid": v.get("gpu_uuid"), "build": build,
                 "config": config, "message": "GPU %s: %s since its %s verdict (%s)" % (
                     instance.get("gpu_index"), why, v.get("verdict"), v.get("message"))}
        if draft:
            entry["draft"] = draft
        out.append(entry)
    return out


def _file_name(path):
    return str(path).rstrip("/").rsplit("/", 1)[-1] if path else None


def _label(wanted, draft):
    if wanted != "draft-simple" or not draft:
        return "Speculative decoding (%s, no extra weights or memory)" % wanted
    return "Speculative decoding (%s with the draft model %s)" % (
        wanted, (draft.get("candidate") or {}).get("name") or draft.get("path") or draft["quant"])


def plan_speculation(plan, wanted, calibration=None, draft=None):
    """(spec_type, reason) for a plan whose policy asks for `wanted` (none, ngram-mod,
    draft-simple with the draft model `draft`)."""
    if wanted in (None, "none"):
        return "none", ""
    calibration = calibration or {}
    label = _label(wanted, draft)
    # a draft model's verdict is that draft's (by file name: the plan before the download
    # reads it where the mirror has it): another draft is measured again
    drafted = _file_name((draft or {}).get("path")) if wanted == "draft-simple" else None
    verdicts = [v for v in calibration.get("speculation") or [] if isinstance(v, dict)
                and v.get("spec_type") == wanted and _same(v.get("config"), plan) and _file_name(v.get("draft")) == drafted]
    if verdicts:
        latest = max(verdicts, key=lambda v: str(v.get("measured_at") or ""))
        if latest.get("verdict") == "unmeasured":
            # verify had no baseline measured with its prompt (verify_loadtest_prompt changed): off
            # until it measures one, then a trial against it
            if _newer_baseline(calibration, plan, latest.get("measured_at")):
                return wanted, "%s on, a trial: verify measured this configuration without it with its load-test " \
                    "prompt, and compares the two now." % label
            return "none", "%s off for now: verify's load-test prompt has no measurement without it on %s (%s); " \
                "this run's verify measures one, and the next plan tries it again." % (
                    label, latest.get("host"), latest.get("message"))
        if latest.get("verdict") == "outdated":
            return wanted, "%s on, a trial again (verify on %s: %s). The next plan keeps it only if it pays." % (
                label, latest.get("host"), latest.get("message"))
        if latest.get("verdict") == "pays":
            return wanted, "%s on: verify measured it pays on %s (%s)." % (label, latest.get("host"),
                                                                           latest.get("message"))
        return "none", "%s off: verify measured no gain on %s (%s); policy.speculative asks for it, the measurement " \
            "decides." % (label, latest.get("host"), latest.get("message"))
    baseline = [b for b in calibration.get("baselines") or [] if isinstance(b, dict)
                and spec_type(b.get("config")) == "none" and _same(b.get("config"), plan)]
    if not baseline:
        return "none", "%s off for now: no measurement of this configuration without it yet; this run's verify " \
            "measures it, and the next plan tries it." % label
    return wanted, "%s on, a trial: verify compares it with this configuration's baseline without it (%d card(s)) " \
        "and the next plan keeps it only if it pays." % (label, len(baseline))


def plan_baseline(record, baselines, names=("single_stream_tps", "all_slots_decode_tps", "ttft_at_slots_s")):
    """{figure: median} of the baselines without speculation of the record's configuration
    as the planner matches it (any request length): what verify compares with when no
    baseline was measured with the same request length, so a trial the planner started
    always gets a verdict."""
    same = [b.get("figures") or {} for b in baselines or [] if isinstance(b, dict)
            and spec_type(b.get("config")) == "none" and _same(b.get("config"), record)
            and _prompt(b.get("config")) == _prompt(record)]
    out = {}
    for name in names:
        values = sorted(float(f[name]) for f in same if isinstance(f.get(name), (int, float)) and f[name] > 0)
        if values:
            n = len(values)
            out[name] = values[n // 2] if n % 2 else (values[n // 2 - 1] + values[n // 2]) / 2.0
    return out


def _ratio(measured, reference):
    try:
        measured, reference = float(measured), float(reference)
    except (TypeError, ValueError):
        return None
    return round(measured / reference, 3) if reference > 0 and measured >= 0 else None


def speculation_verdict(record, baseline, min_gain=DEFAULT_MIN_GAIN, label="GPU ?"):
    """Whether the speculation a measured instance serves with pays, against the
    baseline figures of its configuration without it ({figure: value}: single_stream_tps,
    all_slots_decode_tps, ttft_at_slots_s). None when the instance serves without it."""
    kind = spec_type(record)
    if kind == "none":
        return None
    gain = check_min_gain(min_gain)
    figures = {"single_stream_tps": record.get("single_stream_tps"),
               "all_slots_decode_tps": record.get("all_slots_decode_tps"),
               "ttft_at_slots_s": record.get("ttft_at_slots_s")}
    out = {"spec_type": kind, "figures": figures, "baseline": dict(baseline or {}), "min_gain": gain}
    if record.get("errors"):
        out.update(verdict="no_gain", message="%s: the measurement with %s failed" % (label, kind))
        return out
    if not baseline or not baseline.get("single_stream_tps"):
        out.update(verdict="unmeasured", message="%s: no baseline without %s measured with this load-test prompt "
                   "to compare with; the next plan serves without it to measure one" % (label, kind))
        return out
    single = _ratio(figures["single_stream_tps"], baseline.get("single_stream_tps"))
    slots = _ratio(figures["all_slots_decode_tps"], baseline.get("all_slots_decode_tps"))
    wait = _ratio(figures["ttft_at_slots_s"], baseline.get("ttft_at_slots_s"))
    # a latency plan must gain where one request waits; a throughput plan with every slot
    # busy, which it was planned for (an H100 measured x0.97 alone and x1.32 with 4 slots)
    throughput = record.get("objective") == "throughput"
    checks = [("single-stream decode", single, single is not None and single >= (1 - gain if throughput else 1 + gain)),
              ("decode with every slot busy", slots,
               (slots is not None and slots >= 1 + gain) if throughput else (slots is None or slots >= 1 - gain)),
              ("first token with every slot busy", wait, wait is None or wait <= 1 + gain)]
    failed = [name for name, _, ok in checks if not ok]
    text = ", ".join("%s x%s" % (name, "%.2f" % r if r is not None else "?") for name, r, _ in checks)
    out["ratios"] = dict((name, r) for name, r, _ in checks)
    out["objective"] = "throughput" if throughput else "latency"
    needs = ("the throughput objective needs x%.2f with every slot busy and no loss for one stream" if throughput
             else "needs x%.2f single-stream and no loss with every slot busy") % (1 + gain)
    out.update(verdict="no_gain" if failed else "pays",
               message="%s with %s: %s against the baseline without it (%s)" % (
                   label, kind, text, needs if failed else "it pays"))
    return out


def merge_verdicts(existing, host, verdicts, measured_at=None):
    """The calibration file's `speculation` list with this host's verdicts (pays, no_gain,
    unmeasured, outdated) replacing its older ones for the same card, configuration and type."""
    fresh = [dict(v, host=host, measured_at=measured_at) for v in verdicts or []
             if isinstance(v, dict) and v.get("verdict") in ("pays", "no_gain", "unmeasured", "outdated")]
    same = lambda a, b: (a.get("host"), a.get("gpu_uuid"), a.get("spec_type"), a.get("draft"),  # noqa: E731
                         _plan_config(a.get("config"))) == (
        b.get("host"), b.get("gpu_uuid"), b.get("spec_type"), b.get("draft"), _plan_config(b.get("config")))
    kept = [v for v in existing or [] if isinstance(v, dict) and not any(same(v, f) for f in fresh)]
    return sorted(kept + fresh, key=lambda v: (str(v.get("host")), str(v.get("gpu_uuid")), str(v.get("spec_type"))))
