"""Filters of the llm_model role.

The inventory describes the model once, as a catalogue of quantizations; these
filters turn it into what the modules take and what the stage records:

- `llm_model_entries` checks the catalogue and resolves every file's URL and
  destination (Hugging Face `hf_repo`/`hf_file`, plain URLs, `file://` mirrors,
  pre-staged paths; split GGUF shards);
- `llm_model_candidates` builds `llama_plan`'s candidates (before the download
  from the declared metadata and sizes; after it, the chosen files on disk);
- `llm_model_fetch_files` lists the files the plans picked, for `model_fetch`;
- `llm_model_gpus` keeps the GPU facts a plan depends on (never what is in use,
  so a rerun while llama-server runs plans the same; other processes' memory only
  under the foreign-process policy plan_around);
- `llm_model_plan_lines`, `llm_model_fit_argv`, `llm_model_fit_estimate` and
  `llm_model_record` show the plans, run llama-fit-params and write the record.

Plain functions over plain dicts, so the unit tests load this file directly.
"""
import json
import os
import re
from urllib.parse import quote, unquote, urlsplit
from urllib.request import url2pathname

import ansible.module_utils
from ansible.errors import AnsibleFilterError

# Ansible ships module_utils/ to modules only; the controller maps the
# repository's copy, so a plugin and a module share one definition.
_MODULE_UTILS = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..",
                                              "module_utils"))
if _MODULE_UTILS not in ansible.module_utils.__path__:
    ansible.module_utils.__path__.append(_MODULE_UTILS)

from ansible.module_utils.gpu_health import FOREIGN_POLICIES, foreign_processes  # noqa: E402
from ansible.module_utils.llama_flags import FIT_PARAMS, plan_argv  # noqa: E402
from ansible.module_utils.plan_explain import plan_summary  # noqa: E402
from ansible.module_utils.filter_input import guard_filters  # noqa: E402
from ansible.module_utils.fleet_instances import ROUTER_SUFFIX, instance_id, router_id  # noqa: E402

GIB = 1 << 30
MIB = 1 << 20
HF_BASE = "https://huggingface.co"
_SHA256 = re.compile(r"^[0-9a-f]{64}$")
_SHARD = re.compile(r"-(\d{5})-of-(\d{5})\.gguf$")
_FILE_KEYS = ("url", "hf_repo", "hf_file", "hf_revision", "path", "name", "sha256", "size_bytes")
_ENTRY_KEYS = ("quant", "metadata", "files") + _FILE_KEYS
# The GPU facts a plan depends on (see llama_plan's documentation).
_GPU_KEYS = ("index", "name", "uuid", "memory_total_bytes", "memory_reserved_bytes", "memory_bandwidth_bytes_per_s",
             "compute_capability", "numa_node", "cpu_affinity", "pci_bus_id", "nvlink_peers")
# llama-fit-params -fitp on prints "<device> <model> <context> <compute>" in MiB, one line per device, then Host.
_FIT_LINE = re.compile(r"^(\S+) (\d+) (\d+) (\d+)\s*$")


def _fail(msg):
    raise AnsibleFilterError(msg)


def _size(value, where):
    if value is None:
        return None
    if isinstance(value, bool) or not str(value).strip().isdigit() or int(value) <= 0:
        _fail("%s.size_bytes must be the file size in bytes (a positive whole number), got %r" % (where, value))
    return int(value)


def _sha256(value, where):
    text = str(value or "").strip().lower()
    if text.startswith("sha256:"):
        text = text[len("sha256:"):]
    if not _SHA256.match(text):
        _fail("%s.sha256 must be the file's sha256 (64 hexadecimal digits), got %r. Hugging Face shows it on the "
              "file's page (\"SHA256\"); or run sha256sum on a trusted copy." % (where, value))
    return text


def _file(item, where, model_dir):
    """One file of a catalogue entry: {name, url, path, sha256, size_bytes, dest}."""
    if not isinstance(item, dict):
        _fail("%s must be a dict with url (or hf_repo and hf_file, or path) and sha256, got %r" % (where, item))
    unknown = sorted(set(item) - set(_FILE_KEYS))
    if unknown:
        _fail("%s has unknown key(s) %s; a file takes %s" % (where, ", ".join(unknown), ", ".join(_FILE_KEYS)))
    if item.get("hf_repo") and not item.get("hf_file") or item.get("hf_file") and not item.get("hf_repo"):
        _fail("%s: hf_repo and hf_file go together (https://huggingface.co/<hf_repo>/resolve/<hf_revision>/<hf_file>)"
              % where)
    sources = [k for k in ("url", "hf_file", "path") if item.get(k)]
    if len(sources) != 1:
        _fail("%s needs exactly one source: url, hf_repo + hf_file, or path (a pre-staged file, only verified); "
              "got %s" % (where, ", ".join(sources) or "none"))
    url = path = None
    if item.get("hf_file"):
        repo = str(item["hf_repo"]).strip("/")
        if repo.count("/") != 1:
            _fail("%s.hf_repo must be OWNER/NAME (e.g. Qwen/Qwen2.5-32B-Instruct-GGUF), got %r" % (where, item["hf_repo"]))
        revision = str(item.get("hf_revision") or "main")
        url = "%s/%s/resolve/%s/%s" % (HF_BASE, repo, quote(revision, safe=""), quote(str(item["hf_file"]).lstrip("/")))
        default_name = os.path.basename(str(item["hf_file"]))
    elif item.get("url"):
        url = str(item["url"])
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https", "file"):
            _fail("%s.url must be http://, https:// or file:// (a mirror mounted on the hosts), got %r" % (where, url))
        default_name = os.path.basename(unquote(parts.path))
    else:
        path = str(item["path"])
        if not os.path.isabs(path):
            _fail("%s.path must be an absolute path on the hosts, got %r" % (where, path))
        default_name = os.path.basename(path)
    name = str(item.get("name") or default_name)
    if not name or "/" in name or name.startswith("."):
        _fail("%s: cannot name the file from %r; set name (no '/', not starting with '.')" % (where, url or path))
    return {
        "name": name,
        "url": url,
        "path": path,
        "sha256": _sha256(item.get("sha256"), where),
        "size_bytes": _size(item.get("size_bytes"), where),
        "dest": path or os.path.join(model_dir, name),
        # Where the hosts can read the file before it is fetched: a pre-staged
        # path, or a mirror mounted on them (file://).
        "source_path": path or (url2pathname(urlsplit(url).path) if url.startswith("file:") else None),
    }


def _check_shards(files, where):
    names = [f["name"] for f in files]
    matches = [_SHARD.search(n) for n in names]
    if len(files) == 1:
        if matches[0] and matches[0].group(2) != "00001":
            _fail("%s: %s is one shard of a %d-file model: list every shard under files, in order"
                  % (where, names[0], int(matches[0].group(2))))
        return
    expected = ["%05d" % (i + 1) for i in range(len(files))]
    if not all(matches) or [m.group(1) for m in matches] != expected or \
            any(int(m.group(2)) != len(files) for m in matches):
        _fail("%s: a model in several files must list every shard, in order, with llama.cpp's split names "
              "NAME-00001-of-%05d.gguf ... NAME-%05d-of-%05d.gguf; got %s"
              % (where, len(files), len(files), len(files), ", ".join(names)))


def llm_model_entries(catalogue, model_dir, name="llm_model_catalogue"):
    """Check the catalogue; return one entry per quantization:
    {index, quant, size_bytes (what the plan budgets), metadata, files, model_path,
    model_files, warnings}. `name` is what errors call the catalogue."""
    if not isinstance(catalogue, list) or not catalogue:
        _fail("%s must list the model's quantization files (quant, url or hf_repo + hf_file, "
              "sha256, size_bytes, metadata); it is %r" % (name, catalogue))
    model_dir = str(model_dir).rstrip("/") or "/"
    entries, quants, dests = [], {}, {}
    for index, raw in enumerate(catalogue):
        where = "%s[%d]" % (name, index)
        if not isinstance(raw, dict):
            _fail("%s must be a dict (quant, url or hf_repo + hf_file, sha256, size_bytes, metadata), got %r"
                  % (where, raw))
        unknown = sorted(set(raw) - set(_ENTRY_KEYS))
        if unknown:
            _fail("%s has unknown key(s) %s; known: %s" % (where, ", ".join(unknown), ", ".join(_ENTRY_KEYS)))
        quant = str(raw.get("quant") or "").strip()
        if not quant:
            _fail("%s has no quant: name its quantization (Q4_K_M, Q3_K_S, ...)" % where)
        where = "%s (%s)" % (where, quant)
        if quant.upper() in quants:
            _fail("%s: quant %s is already %s[%d]; each quantization once"
                  % (where, quant, name, quants[quant.upper()]))
        quants[quant.upper()] = index
        if raw.get("files") is not None:
            own = [k for k in _FILE_KEYS if k != "size_bytes" and raw.get(k)]
            if own:
                _fail("%s has files and also %s: put url/sha256/... in each item of files" % (where, ", ".join(own)))
            if not isinstance(raw["files"], list) or not raw["files"]:
                _fail("%s.files must list the model's files (every shard of a split model)" % where)
            files = [_file(item, "%s.files[%d]" % (where, i), model_dir) for i, item in enumerate(raw["files"])]
            size = _size(raw.get("size_bytes"), where)
        else:
            files = [_file(dict((k, v) for k, v in raw.items() if k in _FILE_KEYS), where, model_dir)]
            size = files[0]["size_bytes"]
        _check_shards(files, where)
        for f in files:
            if f["dest"] in dests and dests[f["dest"]] != f["sha256"]:
                _fail("%s: %s is also another catalogue file with another sha256; give one of them another name"
                      % (where, f["dest"]))
            dests[f["dest"]] = f["sha256"]
        metadata = raw.get("metadata")
        if metadata is not None and not isinstance(metadata, dict):
            _fail("%s.metadata must be a dict (what gguf_info returns for any quantization of the model), got %r"
                  % (where, type(metadata).__name__))
        file_total = sum(f["size_bytes"] for f in files) if all(f["size_bytes"] for f in files) else None
        warnings = []
        if size is None:
            size = file_total
        elif file_total is not None and abs(size - file_total) > max(MIB, size // 100):
            warnings.append("%s: size_bytes is %d but its files add up to %d bytes; the plan budgets %d"
                            % (where, size, file_total, size))
        entries.append({
            "index": index,
            "quant": quant,
            "size_bytes": size,
            "metadata": metadata or None,
            "files": files,
            "model_path": files[0]["dest"],
            "model_files": [f["dest"] for f in files],
            "source_path": files[0]["source_path"],
            "warnings": warnings,
        })
    return entries


def _chosen_indexes(plans):
    seen = []
    for plan in plans or []:
        index = (plan.get("candidate") or {}).get("catalogue_index")
        if index is None:
            _fail("plan of GPU %s has no candidate.catalogue_index: plans must come from llama_plan with "
                  "llm_model_candidates" % plan.get("gpu_index"))
        if index not in seen:
            seen.append(index)
    return sorted(seen)


def llm_model_candidates(entries, plans=None):
    """llama_plan candidates. Without plans (before the download): every entry,
    from its declared metadata and size when it has metadata (so the choice never
    depends on what happens to be on disk), else from its file: read where it is
    (a pre-staged path or a file:// mirror), or in the model directory, where it
    must then be already. With the first plans (after the download): the chosen
    entries, with their paths, so the files on disk are read when they are there."""
    chosen = None if plans is None else _chosen_indexes(plans)
    candidates = []
    for entry in entries:
        if chosen is not None and entry["index"] not in chosen:
            continue
        cand = {"quant": entry["quant"], "catalogue_index": entry["index"]}
        if entry["metadata"]:
            cand["metadata"] = entry["metadata"]
            if entry["size_bytes"]:
                cand["size_bytes"] = entry["size_bytes"]
            if chosen is not None:
                cand["path"] = entry["model_path"]
        elif chosen is None:
            cand["path"] = entry["source_path"] or entry["model_path"]
        else:
            cand["path"] = entry["model_path"]
        candidates.append(cand)
    return candidates


def llm_model_fetch_files(entries, plans):
    """model_fetch's files for the entries the plans chose, in catalogue order."""
    chosen = _chosen_indexes(plans)
    files = []
    for entry in entries:
        if entry["index"] in chosen:
            for f in entry["files"]:
                item = {"name": f["name"], "sha256": f["sha256"]}
                if f["path"]:
                    item["path"] = f["path"]
                else:
                    item["url"] = f["url"]
                if f["size_bytes"]:
                    item["size_bytes"] = f["size_bytes"]
                files.append(item)
    return files


def llm_model_gpus(gpus, foreign_policy="refuse"):
    """The GPU facts a plan depends on, without what changes while the server runs.
    With the foreign-process policy plan_around, what other processes hold on a card
    (never a llama-server's) is budgeted as taken: memory_foreign_bytes."""
    if foreign_policy not in FOREIGN_POLICIES:
        _fail("llm_fleet_foreign_gpu_processes is %r; use one of %s" % (foreign_policy, ", ".join(FOREIGN_POLICIES)))
    out = []
    for gpu in gpus or []:
        kept = dict((k, gpu.get(k)) for k in _GPU_KEYS if k in gpu)
        if foreign_policy == "plan_around":
            kept["memory_foreign_bytes"] = sum(int(p.get("used_bytes") or 0)
                                               for p in foreign_processes(gpu.get("health")))
        out.append(kept)
    return out


def llm_model_plan_lines(result):
    """llama_plan's result as lines to read: each GPU's plan, why, then the budget table."""
    lines = []
    for plan, summary in zip(result.get("plans") or [], (result.get("summary") or "").splitlines()):
        lines.append(summary)
        lines.append("  why: %s" % plan.get("reason", ""))
        for warning in plan.get("warnings") or []:
            lines.append("  warning: %s" % warning)
    lines.append("budget:")
    lines.extend("  %s" % line for line in result.get("table") or [])
    return lines


def llm_model_fit_argv(plan, tool):
    """llama-fit-params' arguments for a plan: the plan's settings, and -fitp on to
    print llama.cpp's own estimate (model, context, compute MiB per device). It has
    no -np: it is a server-only flag, and -c is the total the slots share anyway."""
    return [tool] + plan_argv(plan, FIT_PARAMS, short=True) + ["-fitp", "on"]


def llm_model_fit_estimate(result, plan, tool):
    """llama-fit-params' estimate for one plan, beside the plan's own figures."""
    if not result or result.get("skipped"):
        return {"status": "not run", "reason": "%s is not installed (the llama_cpp stage builds it) or the model "
                                               "is not on disk yet" % tool}
    if result.get("rc") != 0:
        err = [line for line in (result.get("stderr") or "").splitlines() if line.strip()]
        return {"status": "failed", "rc": result.get("rc"), "error": err[-1] if err else ""}
    devices = []
    for line in (result.get("stdout") or "").splitlines():
        match = _FIT_LINE.match(line.strip())
        if match:
            devices.append({"device": match.group(1), "model_mib": int(match.group(2)),
                            "context_mib": int(match.group(3)), "compute_mib": int(match.group(4))})
    gpu = [d for d in devices if d["device"] != "Host"]
    host = [d for d in devices if d["device"] == "Host"]
    if not gpu:
        return {"status": "failed", "rc": 0, "error": "no device line in llama-fit-params' output"}
    # a split plan has a line per card: the instance's figure is their sum
    theirs = dict(gpu[0], device="+".join(d["device"] for d in gpu)) if len(gpu) > 1 else gpu[0]
    for key in ("model_mib", "context_mib", "compute_mib"):
        theirs[key] = sum(d[key] for d in gpu)
    theirs["total_mib"] = theirs["model_mib"] + theirs["context_mib"] + theirs["compute_mib"]
    m = plan["memory"]
    ours = {"weights_mib": m["weights_bytes"] // MIB, "kv_mib": m["kv_bytes"] // MIB,
            "compute_mib": m["compute_bytes"] // MIB}
    ours["total_mib"] = ours["weights_mib"] + ours["kv_mib"] + ours["compute_mib"]
    record = {"status": "ok", "args": " ".join(llm_model_fit_argv(plan, tool)[1:]), "llama_cpp": theirs,
              "ours": ours, "difference_mib": theirs["total_mib"] - ours["total_mib"]}
    if host:
        record["host_model_mib"] = host[0]["model_mib"]
    return record


def _bytes(n):
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size:
            return "%.1f %s" % (n / float(size), unit)
    return "%d B" % n


def llm_model_progress_line(text):
    """One line from model_fetch's progress file: file, bytes, share, rate, time left."""
    try:
        record = json.loads(text) if str(text or "").strip() else {}
    except ValueError:
        record = {}
    if not record.get("file"):
        return "checking the files already there (no download under way yet)"
    done, total, rate = record.get("done_bytes") or 0, record.get("total_bytes"), record.get("rate_bytes_per_s") or 0
    line = "%s: %s" % (record["file"], _bytes(done))
    if total:
        line += " of %s (%d%%)" % (_bytes(total), 100 * done // max(total, 1))
    line += ", %s/s" % _bytes(rate)
    eta = record.get("eta_s")
    if eta is not None:
        minutes, seconds = divmod(int(eta), 60)
        line += ", about %s left" % ("%d min %d s" % (minutes, seconds) if minutes else "%d s" % seconds)
    return line


def llm_model_preview_records(results):
    """The preview models' plans (llama_plan results of a loop over
    llm_model_previews), one entry per model: its name and, per GPU, the plan's
    one-line summary, why, and its warnings."""
    out = []
    for result in results or []:
        name = (result.get("item") or {}).get("key")
        plans = result.get("plans") or []
        out.append({"name": name, "summary": "; ".join(plan_summary(p) for p in plans),
                    "plans": [{"gpu_index": p.get("gpu_index"), "gpu_indices": p.get("gpu_indices"),
                               "split_mode": p.get("split_mode"), "quant": p.get("quant"), "ctx_size": p.get("ctx_size"),
                               "parallel": p.get("parallel"), "cache_type_k": p.get("cache_type_k"),
                               "expected_decode_tps": p.get("expected_decode_tps"),
                               "decode_ceiling_tps": p.get("decode_ceiling_tps"), "summary": plan_summary(p),
                               "reason": p.get("reason"), "warnings": p.get("warnings") or []} for p in plans]})
    return out


def llm_model_preview_lines(results):
    """What each preview model would get, to read (it is not served)."""
    lines = []
    for preview in llm_model_preview_records(results):
        lines.append("Preview, not served: %s" % preview["name"])
        for plan in preview["plans"]:
            lines.append("  %s" % plan["summary"])
            lines.append("    why: %s" % plan["reason"])
    return lines


def llm_model_record(plans, entries, fetched, fit_results=None, fit_tool="", model_name="", model_dir="",
                     policy=None, choice=None, previews=None):
    """What the stage records (plan.json and the local fact): the plans, each with
    its files, checksums, where its figures came from, why its quantization was
    chosen (`choice`: llama_plan's result from the declared figures) and
    llama-fit-params' estimate, and a one-line summary. Only what a rerun
    reproduces: no times, no byte counts of this run, no memory in use."""
    by_index = dict((e["index"], e) for e in entries)
    chosen = dict((p.get("gpu_index"), p) for p in (choice or {}).get("plans") or [])
    on_disk = set(f["path"] for f in (fetched or {}).get("files") or []
                  if f.get("action") in ("present", "downloaded", "resumed"))
    fits = {}
    for result in (fit_results or {}).get("results") or []:
        fits[(result.get("item") or {}).get("gpu_index")] = result
    records = []
    for plan in plans:
        entry = by_index[plan["candidate"]["catalogue_index"]]
        record = dict(plan)
        record["model_path"] = entry["model_path"]
        record["model_files"] = entry["model_files"]
        record["model_sha256"] = [f["sha256"] for f in entry["files"]]
        record["catalogue_index"] = entry["index"]
        record["planned_from"] = "file" if all(p in on_disk for p in entry["model_files"]) else "declared"
        record["llama_fit_params"] = llm_model_fit_estimate(fits.get(plan["gpu_index"]), record, fit_tool)
        first = chosen.get(plan["gpu_index"])
        if first:
            record["choice"] = {"quant": first["quant"], "reason": first["reason"], "summary": plan_summary(first)}
        records.append(record)
    preview_records = llm_model_preview_records(previews)
    summary = "; ".join(plan_summary(p) for p in records)
    for preview in preview_records:
        summary += " | preview, not served, %s: %s" % (preview["name"], preview["summary"])
    return {
        "model": model_name or os.path.basename(records[0]["model_path"]) if records else model_name,
        "model_dir": model_dir,
        "policy": policy or {},
        "plans": records,
        "previews": preview_records,
        "summary": summary,
    }


# A model's name names its systemd instances (llama-server@<gpu>-<name>), its front
# backend and its /metrics path: what all three take.
_MODEL_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,39}$")
_MODELS_KEYS = ("name", "catalogue", "policy", "gpus", "load", "draft")


def _draft_entry(draft, model_dir, where):
    """A model's draft model (speculative decoding, policy.speculative draft-simple): one
    catalogue entry, checked as the catalogue's are; None without one."""
    if draft in (None, "", {}):
        return None
    if not isinstance(draft, dict):
        _fail("%s must be one catalogue entry (quant, url or hf_repo + hf_file or path, sha256, size_bytes, "
              "metadata), got %r" % (where, draft))
    return llm_model_entries([draft], model_dir, where)[0]


def llm_model_served(models, catalogue, name, policy, model_dir, draft=None):
    """The models this host serves, in priority order: [{name, rank, entries, policy,
    gpus, draft}]. `models` is llm_model_models (several models); empty, the one-model
    form (llm_model_catalogue, llm_model_name, llm_model_policy, llm_model_draft) is the
    only entry."""
    if models in (None, "", []):
        return [{"name": name or "", "rank": 0, "entries": llm_model_entries(catalogue, model_dir),
                 "policy": policy or {}, "gpus": "every", "draft": _draft_entry(draft, model_dir, "llm_model_draft")}]
    if draft not in (None, "", {}):
        _fail("llm_model_draft is set with llm_model_models: give each model its own draft in llm_model_models")
    if not isinstance(models, list):
        _fail("llm_model_models must be a list of {name, catalogue, policy, gpus, load}, got %r" % (models,))
    if catalogue:
        _fail("llm_model_catalogue and llm_model_models are both set: with several models each has its own "
              "catalogue in llm_model_models; empty llm_model_catalogue")
    served, names, dests = [], set(), {}
    for rank, raw in enumerate(models):
        where = "llm_model_models[%d]" % rank
        if not isinstance(raw, dict):
            _fail("%s must be a dict {name, catalogue, policy, gpus, load}, got %r" % (where, raw))
        unknown = sorted(set(raw) - set(_MODELS_KEYS))
        if unknown:
            _fail("%s has unknown key(s) %s; known: %s" % (where, ", ".join(unknown), ", ".join(_MODELS_KEYS)))
        model = str(raw.get("name") or "")
        if not _MODEL_NAME.match(model):
            _fail("%s.name is %r: a model's name names its instances, front backend and metrics path; use up to "
                  "40 letters, digits, '_', '-' or '.', starting with a letter or digit (chat, embed, qwen2.5-coder)"
                  % (where, raw.get("name")))
        if model.lower() in names:
            _fail("%s.name %s is used twice: each model needs its own name" % (where, model))
        names.add(model.lower())
        load = raw.get("load", "resident")
        if load not in ("resident", "on_demand"):
            _fail("%s (%s): load is %r; use resident (always loaded, its own instance) or on_demand (loaded by "
                  "its card's llama-server router when a request names it)" % (where, model, load))
        if model.lower() == ROUTER_SUFFIX:
            _fail("%s: a model may not be named %s: its card's router for models loaded on demand is "
                  "llama-server@<gpu>-%s" % (where, model, ROUTER_SUFFIX))
        gpus = raw.get("gpus", "every" if rank == 0 else 1)
        if gpus != "every" and (isinstance(gpus, bool) or not isinstance(gpus, int) or gpus < 1):
            _fail("%s (%s): gpus is %r; use every (an instance on each GPU) or a whole number >= 1" % (where, model,
                                                                                                      gpus))
        policy_m = raw.get("policy")
        policy_m = {} if policy_m is None else policy_m
        if not isinstance(policy_m, dict):
            _fail("%s (%s): policy must be a dict (llama_plan's policy), got %r" % (where, model, policy_m))
        entries = llm_model_entries(raw.get("catalogue"), model_dir, "%s.catalogue" % where)
        for entry in entries:
            for f in entry["files"]:
                seen = dests.setdefault(f["dest"], (model, f["sha256"]))
                if seen[0] != model and seen[1] != f["sha256"]:
                    _fail("%s (%s): file %s is also model %s's file, with another sha256: give one of them another "
                          "name" % (where, model, f["dest"], seen[0]))
        served.append({"name": model, "rank": rank, "entries": entries, "policy": policy_m, "gpus": gpus,
                       "load": load, "draft": _draft_entry(raw.get("draft"), model_dir, "%s.draft" % where)})
    return served


def llm_model_draft_candidate(entry, downloaded=False):
    """llama_plan's draft option for a served model's draft entry (None: omit it), as
    llm_model_candidates gives a model's: before the download its declared figures, or
    its file where that can be read (a pre-staged path or a file:// mirror); after it,
    the path it has in the model directory, which the server is given."""
    if not entry:
        return None
    cand = {"quant": entry["quant"], "path": entry["model_path"] if downloaded else (
        entry["source_path"] or entry["model_path"])}
    if entry["metadata"]:
        cand.update(metadata=entry["metadata"], path=entry["model_path"])
        if entry["size_bytes"]:
            cand["size_bytes"] = entry["size_bytes"]
    return cand


def _of_model(plans, name):
    return [p for p in plans or [] if p.get("model_name", name) == name]


def llm_model_plan_models(served, plans=None):
    """llama_plan's models option for the served models (their candidates as
    llm_model_candidates gives them: before the download every entry, after it the
    ones the first plans chose)."""
    out = []
    for m in served:
        out.append({"name": m["name"], "policy": m["policy"], "gpus": m["gpus"], "load": m.get("load", "resident"),
                    "candidates": llm_model_candidates(m["entries"], None if plans is None
                                                       else _of_model(plans, m["name"]))})
        if m.get("draft"):
            out[-1]["draft"] = llm_model_draft_candidate(m["draft"], plans is not None)
    return out


def llm_model_fetch_all(served, plans):
    """model_fetch's files for every served model's chosen entries (a file two models
    share is fetched once)."""
    files, seen = [], set()
    for model in served:
        items = llm_model_fetch_files(model["entries"], _of_model(plans, model["name"]))
        if model.get("draft"):
            # on disk before it is tried, so the trial's restart waits on no download
            items += llm_model_fetch_files([model["draft"]], [{"candidate": {"catalogue_index": 0}}])
        for item in items:
            if item["name"] not in seen:
                seen.add(item["name"])
                files.append(item)
    return files


def llm_model_records(plans, served, fetched, fit_results=None, fit_tool="", model_dir="", choice=None,
                      previews=None):
    """llm_model_record for each served model, joined: the plans of every model, each
    with model_name, model_rank and instance; `models` one line per model."""
    fits = (fit_results or {}).get("results") or []
    records = []
    # a model loaded on demand has a router to record, even alone
    several = len(served) > 1 or any(m.get("load") == "on_demand" for m in served)
    for model in served:
        name = model["name"]
        mine = _of_model(plans, name)
        record = llm_model_record(
            mine, model["entries"], fetched,
            {"results": [r for r in fits if (r.get("item") or {}).get("model_name", name) == name]},
            fit_tool, name, model_dir, model["policy"] if several else (choice or {}).get("policy") or model["policy"],
            {"plans": _of_model((choice or {}).get("plans"), name)}, previews if model["rank"] == 0 else None)
        for plan in record["plans"]:
            plan["model_name"] = record["model"]
            plan["model_rank"] = model["rank"]
            plan["instance"] = instance_id(plan, record["model"], model["rank"])
        records.append(record)
    first = records[0]
    if not several:
        first["models"] = [{"name": first["model"], "rank": 0, "summary": first["summary"]}]
        return first
    ranks = dict((m["name"], m["rank"]) for m in served)
    routers = [dict(router, instance=router_id(router["gpu_index"]),
                    # the router listens where its first model's instance would (a port no instance uses)
                    model_rank=min(ranks[n] for n in router["models"]))
               for router in (choice or {}).get("routers") or []]
    return dict(first, plans=[p for r in records for p in r["plans"]],
                models=[dict({"name": r["model"], "rank": i, "policy": r["policy"], "summary": r["summary"]},
                             **({"load": "on_demand"} if served[i].get("load") == "on_demand" else {}))
                        for i, r in enumerate(records)],
                summary=" || ".join("%s: %s" % (r["model"], r["summary"]) for r in records)
                + "".join(" || GPU %s router: %s on demand, --models-max %d" % (
                    r["gpu_index"], ", ".join(r["models"]), r["models_max"]) for r in routers),
                placement=(choice or {}).get("placement") or {}, **({"routers": routers} if routers else {}))


_KINDS = {
    "llm_model_candidates": {"entries": "dicts", "plans": "dicts?"},
    "llm_model_fetch_files": {"entries": "dicts", "plans": "dicts?"},
    "llm_model_gpus": {"gpus": "dicts?"},
    "llm_model_plan_lines": {"result": "dict"},
    "llm_model_fit_argv": {"plan": "dict"},
    "llm_model_fit_estimate": {"result": "dict?", "plan": "dict"},
    "llm_model_record": {
        "plans": "dicts", "entries": "dicts", "fetched": "dict?", "fit_results": "dict?", "policy": "dict?",
        "choice": "dict?", "previews": "dicts?"},
    "llm_model_preview_lines": {"results": "dicts?"},
    "llm_model_served": {"models": "dicts?", "catalogue": "dicts?", "policy": "dict?"},
    "llm_model_plan_models": {"served": "dicts", "plans": "dicts?"},
    "llm_model_fetch_all": {"served": "dicts", "plans": "dicts"},
    "llm_model_records": {"plans": "dicts", "served": "dicts", "fetched": "dict?", "fit_results": "dict?",
                          "choice": "dict?", "previews": "dicts?"},
}


class FilterModule(object):
    def filters(self):
        return guard_filters({
            "llm_model_entries": llm_model_entries,
            "llm_model_candidates": llm_model_candidates,
            "llm_model_fetch_files": llm_model_fetch_files,
            "llm_model_gpus": llm_model_gpus,
            "llm_model_plan_lines": llm_model_plan_lines,
            "llm_model_fit_argv": llm_model_fit_argv,
            "llm_model_fit_estimate": llm_model_fit_estimate,
            "llm_model_record": llm_model_record,
            "llm_model_served": llm_model_served,
            "llm_model_draft_candidate": llm_model_draft_candidate,
            "llm_model_plan_models": llm_model_plan_models,
            "llm_model_fetch_all": llm_model_fetch_all,
            "llm_model_records": llm_model_records,
            "llm_model_preview_lines": llm_model_preview_lines,
            "llm_model_progress_line": llm_model_progress_line,
        }, _KINDS)
