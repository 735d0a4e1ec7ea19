# -*- coding: utf-8 -*-
"""The rollout's speed gate: a change of build, model file or server flags serves
only when it is not slower than what the same configuration served before.

The verify stage measures every instance; an instance whose running
configuration changed since the last measurement it accepted (its serving
fingerprint, from the llama_server fact) is *gated*: its single-stream decode,
its decode with every slot busy and its prompt speed must each reach min_ratio
of the fleet's baseline for the same card and configuration (the median of what
every card of that name last accepted, kept beside the decode calibration on the
controller). Below it the host switches back to what it served before. An
instance that did not change is measured and reported, never gated: noise on an
unchanged service must not roll anything back. Where the fleet has no figure of
its configuration as verify measures now (a new load-test prompt, a lost file),
that measurement becomes the baseline, so the next change is judged.

Pure functions (no Ansible), imported by the verify stage's filters and the tests.
"""
from __future__ import absolute_import, division, print_function

__metaclass__ = type

# The figures compared, in the order they are reported, with what they read
# from a verify instance record (roles/verify/filter_plugins/verify_report.py).
FIGURES = (
    ("single_stream_tps", "single-stream decode"),
    ("all_slots_decode_tps", "decode with every slot busy"),
    ("prompt_tps", "prompt processing"),
)
DEFAULT_MIN_RATIO = 0.9


def _all_slots_decode(record):
    """The streams' own decode rates summed with every slot busy (the load test's level
    at the slot count), not all tokens over the wall time, which counts the prompts too."""
    slots = record.get("parallel")
    for level in record.get("levels") or []:
        if slots and level.get("concurrency") == int(slots) and level.get("aggregate_decode_tps"):
            return level["aggregate_decode_tps"]
    return record.get("aggregate_slots_tps")


def _figure(record, name):
    if name == "prompt_tps":
        value = (record.get("llama_bench") or {}).get("prompt_tps")
    elif name == "all_slots_decode_tps":
        value = _all_slots_decode(record)
    else:
        value = record.get(name)
    try:
        value = float(value)
    except (TypeError, ValueError):
        return None
    return value if value > 0 else None


def config_key(record):
    """What must be equal for two measurements to be compared: the card, the
    weight type and the shape of the service (slots, context, KV type, split),
    and how long each measured request was."""
    key = {
        "gpu_name": record.get("gpu_name"),
        "quant": record.get("quant"),
        "ctx_size": record.get("ctx_size"),
        "parallel": record.get("parallel"),
        "cache_type_k": record.get("cache_type_k"),
        "split_mode": record.get("split_mode") or "none",
        "n_predict": record.get("n_predict"),
    }
    # speculative decoding is another configuration (module_utils/speculation.py); without
    # it the key is what it has always been, so earlier baselines still compare
    if record.get("spec_type") not in (None, "none"):
        key["spec_type"] = record["spec_type"]
    # a prompt of the operator's own (verify_loadtest_prompt) is another measurement than the
    # load test's own; the default keeps the key what it has always been
    if record.get("prompt_id") not in (None, "default"):
        key["prompt_id"] = record["prompt_id"]
    # a model loaded on demand is measured through its router (each streamed token one more
    # hop, no llama-bench): another configuration than the same plan served alone
    if record.get("load") == "on_demand":
        key["load"] = "on_demand"
    # the model's file: two models of one quant and shape (a chat and a coder model, one card
    # or two groups of hosts) are two baselines
    if model_file(record):
        key["model_file"] = model_file(record)
    return key


def model_file(record):
    """The model's file name (a verify record's model_file, or a plan's model_path: the
    plan before the download names the mirror's copy, so only the name is compared)."""
    path = (record or {}).get("model_file") or (record or {}).get("model_path")
    return str(path).rstrip("/").rsplit("/", 1)[-1] if path else None


def _median(values):
    values = sorted(values)
    n = len(values)
    return values[n // 2] if n % 2 else (values[n // 2 - 1] + values[n // 2]) / 2.0


def baseline_for(record, baselines, names=None):
    """{figure: (median, count)} of the accepted measurements with the same
    configuration key, from every card of that name in the fleet (names: the
    figures, default the gated ones)."""
    key = config_key(record)
    same = [b for b in baselines or [] if isinstance(b, dict) and b.get("config") == key]
    if not same and "model_file" in key:
        # recorded before baselines named the model: they still judge it until its own exist
        legacy = dict((k, v) for k, v in key.items() if k != "model_file")
        same = [b for b in baselines or [] if isinstance(b, dict) and b.get("config") == legacy]
    out = {}
    for name in names or [n for n, _ in FIGURES]:
        values = [float(b["figures"][name]) for b in same
                  if isinstance(b.get("figures"), dict) and isinstance(b["figures"].get(name), (int, float))
                  and b["figures"][name] > 0]
        if values:
            out[name] = (_median(values), len(values))
    return out


def check_min_ratio(value):
    """min_ratio as a float in (0, 1]; ValueError naming the value otherwise."""
    try:
        ratio = float(value)
    except (TypeError, ValueError):
        raise ValueError("the speed gate's min_ratio is %r: give a number above 0 and at most 1 "
                         "(0.9: a change may cost at most 10%% of the baseline)" % (value,))
    if not 0 < ratio <= 1:
        raise ValueError("the speed gate's min_ratio is %r: give a number above 0 and at most 1 "
                         "(0.9: a change may cost at most 10%% of the baseline)" % (value,))
    return ratio


def judge(record, baselines, min_ratio=DEFAULT_MIN_RATIO, gated=True, build=None):
    """The verdict of one measured instance.

    Returns {gpu_index, gated, verdict, checks, message, config, figures}:
    verdict 'not_gated' (nothing changed), 'no_baseline' (a configuration the
    fleet never measured: accepted, becomes the baseline, gated or not), 'pass'
    or 'refuse' (some figure below min_ratio of its baseline, or the measurement
    failed)."""
    ratio_floor = check_min_ratio(min_ratio)
    figures = dict((name, _figure(record, name)) for name, _ in FIGURES)
    # kept with the baseline, not gated: what speculative decoding is judged against
    figures["ttft_at_slots_s"] = _figure(record, "ttft_at_slots_s")
    out = {"gpu_index": record.get("gpu_index"), "gpu_uuid": record.get("gpu_uuid"), "gated": bool(gated),
           "config": config_key(record), "figures": figures, "build": build, "checks": []}
    label = "GPU %s" % record.get("gpu_index")
    base = baseline_for(record, baselines)
    if not gated:
        if base or record.get("errors") or not any(figures[name] for name, _ in FIGURES):
            out.update(verdict="not_gated", message="%s: unchanged since its last accepted measurement, not gated"
                       % label)
            return out
        # unchanged, but the fleet has no figure of its configuration (a new load-test prompt or
        # request length, a lost calibration file): without one the next change would pass unjudged
        out.update(verdict="no_baseline", message="%s: unchanged, not gated; the fleet had no measurement of %s %s "
                   "with %s slot(s) x %s tokens as verify measures now: recorded as the baseline the next change is "
                   "judged against" % (label, record.get("gpu_name"), record.get("quant"), record.get("parallel"),
                                       record.get("ctx_size")))
        return out
    if record.get("errors"):
        out.update(verdict="refuse", message="%s: the measurement failed (%s), so the change is not accepted"
                   % (label, "; ".join(record["errors"])[:300]))
        return out
    if not base:
        out.update(verdict="no_baseline", message="%s: no earlier measurement of %s %s with %s slot(s) x %s tokens: "
                   "accepted, and recorded as the baseline" % (label, record.get("gpu_name"), record.get("quant"),
                                                               record.get("parallel"), record.get("ctx_size")))
        return out
    below = []
    for name, text in FIGURES:
        if name not in base:
            continue
        reference, count = base[name]
        measured = figures[name]
        ratio = round(measured / reference, 3) if measured is not None else None
        ok = ratio is not None and ratio >= ratio_floor
        out["checks"].append({"figure": name, "what": text, "measured": measured, "baseline": round(reference, 2),
                              "baseline_count": count, "ratio": ratio, "ok": ok})
        if not ok:
            below.append("%s %s tok/s vs %.1f (%s)" % (
                text, "%.1f" % measured if measured is not None else "not measured", reference,
                "x%.2f" % ratio if ratio is not None else "no figure"))
    parts = ["%s %s of %.1f" % (c["what"], "%.1f" % c["measured"] if c["measured"] is not None else "?", c["baseline"])
             for c in out["checks"]]
    if below:
        out.update(verdict="refuse", message="%s%s: below %.2f of the fleet's baseline: %s" % (
            label, " (build %s)" % build if build else "", ratio_floor, "; ".join(below)))
    else:
        out.update(verdict="pass", message="%s%s: at least %.2f of the fleet's baseline (%s tok/s)" % (
            label, " (build %s)" % build if build else "", ratio_floor, "; ".join(parts)))
    return out


def accepted(verdicts):
    """The verdicts whose measurement becomes (part of) the baseline."""
    return [v for v in verdicts or [] if v.get("verdict") in ("pass", "no_baseline")]


def merge_baselines(existing, host, verdicts, measured_at=None):
    """The baselines list with this host's accepted measurements replacing its
    older entries for the same card and configuration."""
    fresh = []
    for v in accepted(verdicts):
        # tok/s to 2 decimals; seconds (a first token of 0.024 s) to 4, or 2 would make it 0.02
        # and speculation's first-token ratio against it 20% off
        figures = dict((k, round(x, 4 if k.endswith("_s") else 2)) for k, x in (v.get("figures") or {}).items()
                       if x is not None)
        if not figures:
            continue
        fresh.append({"host": host, "gpu_uuid": v.get("gpu_uuid"), "config": v.get("config"), "figures": figures,
                      "build": v.get("build"), "measured_at": measured_at})
    same = lambda a, b: (a.get("host"), a.get("gpu_uuid"), a.get("config")) == (  # noqa: E731
        b.get("host"), b.get("gpu_uuid"), b.get("config"))
    kept = [b for b in existing or [] if isinstance(b, dict) and not any(same(b, f) for f in fresh)]
    return sorted(kept + fresh, key=lambda b: (str(b.get("host")), str(b.get("gpu_uuid")),
                                               str(sorted((b.get("config") or {}).items()))))


def canary_hosts(hosts, spec):
    """The first hosts of a rollout (inventory order): spec is a count (1) or a
    percentage of the hosts ("10%", rounded up, at least one host when above 0);
    0 sends the change to every host at once. ValueError names a bad spec."""
    hosts = list(hosts or [])
    text = str(spec).strip() if spec is not None else ""
    try:
        if text.endswith("%"):
            percent = float(text[:-1])
            if not 0 <= percent <= 100:
                raise ValueError
            count = 0 if percent == 0 else max(1, -(-int(round(percent * len(hosts))) // 100))
        else:
            if isinstance(spec, bool) or float(text) != int(float(text)):
                raise ValueError
            count = int(float(text))
            if count < 0:
                raise ValueError
    except ValueError:
        raise ValueError("llm_fleet_canary is %r: give a number of hosts (1: one canary; 0: every host at once) or a "
                         "percentage of them such as '10%%'" % (spec,))
    return hosts[:count]
