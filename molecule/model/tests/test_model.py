"""The model stage read from outside the role: the files on the hosts and their
checksums, the plan and the local fact, the mirror's own request log, and the
output of playbook runs an operator would make (rerun, check mode, a download
cut by the mirror going away, a wrong checksum).

The catalogue (create.yml, files/make_standins.py) declares the real
Qwen2.5-32B quantizations' sizes and metadata, so the choice of quantization per
card is the real one; the files the mirror serves are small stand-ins, so the
plan recorded after the download (made from the file on disk) is the stand-in's.
"""
import copy
import json
import os
import re
import subprocess
import threading
import time

import pytest
import testinfra
import yaml

from hostprobe import recap, run_playbook

SCENARIO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
REPO = os.path.dirname(os.path.dirname(SCENARIO))
MIRROR = "llm-model-mirror"
MODELS = "/var/lib/llm-fleet/models"
FACT = "/etc/ansible/facts.d/llm_fleet_model.fact"
PLAN = "/etc/llm-fleet/plan.json"
# The planner's summary line of a plan (module_utils/plan_explain.py, plan_summary), for a GPU and quant.
SUMMARY = (r"^GPU 0 %s: %s, -c \d+ -np \d+ \(\d+ tokens/slot\), (f16|q8_0) KV, \d+\.\d GiB used \+ \d+\.\d GiB "
           r"headroom of \d+\.\d GiB, expected \d+\.\d tok/s \(ceiling \d+\.\d\)"
           # the harness inventory also previews a 32B model (llm_model_previews)
           r"( \| preview, not served, .*)?$")
# The same catalogue, two cards: what each must get.
# On the 16 GB card only Q3_K_S fits, and it is expected below the speed floor: the
# fastest that fits, said so.
EXPECTED = {
    "model-sxm2-32gb": {"quant": "Q4_K_M", "gpu": "Tesla V100-SXM2-32GB", "gib": 32, "why": "the best quality"},
    "model-sxm2-16gb": {"quant": "Q3_K_S", "gpu": "Tesla V100-SXM2-16GB", "gib": 16,
                        "why": "no candidate that fits is expected to reach the 25 tok/s floor"},
}

with open(os.path.join(REPO, ".cache", "harness", "model-scenario", "catalogue.json")) as _handle:
    CATALOGUE = json.load(_handle)["llm_model_catalogue"]


def node(name):
    return testinfra.get_host("docker://" + name)


def standin(quant):
    """The catalogue's file for a quantization, with its name and path on the hosts."""
    entry = next(e for e in CATALOGUE if e["quant"] == quant)
    f = dict(entry["files"][0])
    f["name"] = f["url"].rsplit("/", 1)[1]
    f["path"] = "%s/%s" % (MODELS, f["name"])
    return f


def fact(name):
    return json.loads(node(name).file(FACT).content_string)


def listing(host):
    return host.check_output("ls -A %s" % MODELS).split()


def host_sha256(host, path):
    return host.check_output("sha256sum %s" % path).split()[0]


def flat(output):
    return " ".join(output.split())  # YAML output wraps long messages


def mirror_gets():
    logs = subprocess.run(["docker", "logs", MIRROR], capture_output=True, text=True, check=True)
    return (logs.stdout + logs.stderr).count('"GET ')


def play(tmp_path, hosts, check=False, **overrides):
    """playbooks/model.yml as an operator runs it, with the scenario's settings."""
    with open(os.path.join(SCENARIO, "vars", "scenario.yml")) as handle:
        settings = yaml.safe_load(handle)
    settings["llm_model_catalogue"] = copy.deepcopy(CATALOGUE)
    settings.update(overrides)
    tmp_path.mkdir(parents=True, exist_ok=True)
    return run_playbook("playbooks/model.yml", hosts, extra_vars=settings, check=check, tmp_path=tmp_path)


def wait_for_mirror(host, timeout=30):
    probe = ("python3 -c \"import urllib.request, urllib.error\ntry:\n urllib.request.urlopen('http://%s:8000/', "
             "timeout=2)\nexcept urllib.error.HTTPError:\n pass\"" % MIRROR)
    deadline = time.time() + timeout
    while time.time() < deadline:
        if host.run(probe).rc == 0:
            return
        time.sleep(0.5)
    pytest.fail("the mirror did not come back")


# --- after converge ------------------------------------------------------------

@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_each_card_gets_the_quantization_its_memory_allows(name):
    want = EXPECTED[name]
    plan = fact(name)["plans"][0]
    assert plan["gpu_name"] == want["gpu"]
    assert plan["quant"] == plan["choice"]["quant"] == want["quant"]
    # The choice, from the declared 32B figures, is a real 32B plan on that card.
    assert re.match(SUMMARY % (want["gpu"], want["quant"]), plan["choice"]["summary"]), plan["choice"]["summary"]
    used = float(re.search(r"(\d+\.\d) GiB used", plan["choice"]["summary"]).group(1))
    assert want["gib"] / 2 < used < want["gib"]


def test_the_16gb_card_is_told_why_not_q4_k_m():
    reason = fact("model-sxm2-16gb")["plans"][0]["choice"]["reason"]
    assert re.search(r"Q4_K_M \(needs [\d.]+ GiB, more than the card\)", reason), reason
    reason = fact("model-sxm2-32gb")["plans"][0]["choice"]["reason"]
    assert "Q8_0 (needs" in reason and "Q5_K_M (expected" in reason, reason


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_only_the_chosen_file_is_downloaded_and_it_is_the_right_one(name):
    host = node(name)
    f = standin(EXPECTED[name]["quant"])
    assert [n for n in listing(host) if not n.startswith(".")] == [f["name"]]
    assert not [n for n in listing(host) if n.endswith(".part")]
    assert host_sha256(host, f["path"]) == f["sha256"]
    assert host.file(f["path"]).size == f["size_bytes"]
    assert host.file(f["path"]).mode == 0o644 and host.file(f["path"]).user == "root"


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_the_plans_are_recorded_for_the_llama_server_stage(name):
    host = node(name)
    record = fact(name)
    assert json.loads(host.file(PLAN).content_string) == record
    assert host.file(FACT).mode == 0o644 and host.file(PLAN).mode == 0o644
    f = standin(EXPECTED[name]["quant"])
    plan = record["plans"][0]
    assert plan["planned_from"] == "file"
    assert plan["model_path"] == f["path"] and plan["model_files"] == [f["path"]]
    assert plan["model_sha256"] == [f["sha256"]]
    assert plan["server_args"][:2] == ["-m", f["path"]]
    for key in ("ctx_size", "parallel", "cache_type_k", "cache_type_v", "n_gpu_layers", "flash_attn", "batch_size",
                "ubatch_size", "threads", "numa_node", "decode_ceiling_tps", "reason", "memory", "warnings"):
        assert key in plan, key
    assert plan["llama_fit_params"]["status"] == "not run"
    assert re.match(SUMMARY % (EXPECTED[name]["gpu"], EXPECTED[name]["quant"]), record["summary"]), record["summary"]


# --- later runs -------------------------------------------------------------------

def test_a_rerun_shows_each_plan_and_downloads_nothing(tmp_path):
    gets = mirror_gets()
    result = play(tmp_path, sorted(EXPECTED))
    assert result.returncode == 0, result.stdout[-3000:]
    out = flat(result.stdout)
    for name, want in EXPECTED.items():
        assert recap(result.stdout, name)["changed"] == 0, name
        assert "GPU 0 %s: %s," % (want["gpu"], want["quant"]) in out
        assert "why: %s: %s" % (want["quant"], want["why"]) in out
        assert "%s: present (sha256 from the cache)" % standin(want["quant"])["name"] in out
    # The role says the served files are not the size the plan budgets.
    q4 = next(e for e in CATALOGUE if e["quant"] == "Q4_K_M")
    assert "size_bytes is %d but its files add up to %d bytes" % (q4["size_bytes"], q4["files"][0]["size_bytes"]) in out
    assert mirror_gets() == gets


def test_check_mode_reports_what_it_would_fetch_and_changes_nothing(tmp_path):
    name = "model-sxm2-32gb"
    host = node(name)
    before = host.file(PLAN).content_string
    gets = mirror_gets()
    # The fleet's own calibration (what verify measured on its 32 GB V100s: Q5_K
    # decoding at 0.70 of the ceiling, above the built-in 0.60) lets the 32 GB card
    # take Q5_K_M: its expected speed now meets the floor.
    calibration = tmp_path / "decode-calibration.json"
    calibration.write_text(json.dumps({"version": 1, "records": [{
        "host": "gpu07", "gpu_uuid": "GPU-x", "gpu_name": "Tesla V100-SXM2-32GB", "gpu_family": "volta",
        "quant": "Q5_K_M", "quant_family": "Q5_K", "arch": "dense", "efficiency": 0.70, "build": "b"}]}))
    result = play(tmp_path, [name], check=True, llm_model_policy={"target_ctx": 16384},
                  fleet_common_calibration_file=str(calibration))
    assert result.returncode == 0, result.stdout[-3000:]
    out = flat(result.stdout)
    q5 = standin("Q5_K_M")
    assert "GPU 0 Tesla V100-SXM2-32GB: Q5_K_M," in out
    assert "efficiency 0.70 for volta Q5_K dense: fleet calibration: median of 1 measurement(s) on " \
        "Tesla V100-SXM2-32GB" in out
    assert "%s: would download, %d bytes" % (q5["name"], q5["size_bytes"]) in out
    assert recap(result.stdout, name)["changed"] > 0
    assert q5["name"] not in listing(host)
    assert host.file(PLAN).content_string == before
    assert mirror_gets() == gets


def test_an_interrupted_download_resumes_where_it_stopped(tmp_path):
    """The mirror goes away in the middle of a transfer (docker kill); the run
    fails and keeps the partial file; the next run resumes from it."""
    name = "model-sxm2-32gb"
    host = node(name)
    f = standin("Q4_K_M")
    host.run_expect([0], "rm -f %s %s/.%s.sha256" % (f["path"], MODELS, f["name"]))
    runs = []
    first = threading.Thread(target=lambda: runs.append(play(tmp_path / "cut", [name], llm_model_download_retries=0)))
    first.start()
    partial = None
    try:
        deadline = time.time() + 180
        while time.time() < deadline and first.is_alive():
            seen = host.run("stat -c '%%n %%s' %s/.%s.*.part" % (MODELS, f["name"])).stdout.split()
            if len(seen) == 2 and int(seen[1]) >= 2 << 20:
                partial = seen[0]
                break
            time.sleep(0.1)
        subprocess.run(["docker", "kill", MIRROR], check=True, capture_output=True)
    finally:
        first.join(300)
        subprocess.run(["docker", "start", MIRROR], check=True, capture_output=True)
    assert partial, "the download never got under way: %s" % (runs and runs[0].stdout[-3000:])
    cut = runs[0]
    assert cut.returncode != 0
    kept = int(host.check_output("stat -c %%s %s" % partial))
    assert 0 < kept < f["size_bytes"]
    assert "The partial file %s is kept: the next run resumes from byte %d" % (partial, kept) in flat(cut.stdout)
    assert not host.file(f["path"]).exists

    wait_for_mirror(host)
    resumed = play(tmp_path / "resume", [name])
    assert resumed.returncode == 0, resumed.stdout[-3000:]
    assert "%s: resumed from byte %d, %d bytes in" % (f["name"], kept, f["size_bytes"] - kept) in flat(resumed.stdout)
    assert host_sha256(host, f["path"]) == f["sha256"]
    assert not [n for n in listing(host) if n.endswith(".part")]


def test_a_wrong_checksum_fails_and_keeps_the_previous_file(tmp_path):
    name = "model-sxm2-16gb"
    host = node(name)
    f = standin("Q3_K_S")
    before = host.check_output("stat -c '%%i %%Y %%s' %s" % f["path"])
    record = host.file(FACT).content_string
    wrong = standin("Q8_0")["sha256"]
    catalogue = copy.deepcopy(CATALOGUE)
    next(e for e in catalogue if e["quant"] == "Q3_K_S")["files"][0]["sha256"] = wrong
    result = play(tmp_path, [name], llm_model_catalogue=catalogue)
    assert result.returncode != 0
    out = flat(result.stdout)
    assert ("Checksum mismatch for http://%s:8000/%s: the downloaded file's sha256 is %s, the catalogue says %s"
            % (MIRROR, f["name"], f["sha256"], wrong)) in out
    assert "the file already there, %s, is kept as it was" % f["path"] in out
    assert host.check_output("stat -c '%%i %%Y %%s' %s" % f["path"]) == before
    assert host_sha256(host, f["path"]) == f["sha256"]
    assert not [n for n in listing(host) if n.endswith(".part")]
    assert host.file(FACT).content_string == record


def test_llama_fit_params_estimate_is_recorded_beside_the_plan(tmp_path):
    """Where llama-fit-params is installed it is asked for llama.cpp's estimate.
    The scenario has no llama.cpp build (the llama_cpp scenario tests that): a
    stand-in prints what the pinned commit's `llama-fit-params -fitp on` prints
    (common_fit_print: device, model, context, compute MiB)."""
    name = "model-sxm2-16gb"
    host = node(name)
    tool = "/opt/llm-fleet/llama.cpp/current/bin/llama-fit-params"
    stub = ("#!/bin/sh\necho \"$CUDA_VISIBLE_DEVICES $*\" > /tmp/fit-params-args\n"
            "echo 'llama_model_loader: loaded meta data' >&2\necho 'CUDA0 12345 678 90 '\necho 'Host 3 0 1 '\n")
    host.run_expect([0], "mkdir -p %s && printf '%%s' '%s' > %s && chmod 0755 %s"
                    % (os.path.dirname(tool), stub.replace("'", "'\\''"), tool, tool))
    try:
        result = play(tmp_path / "with", [name])
        assert result.returncode == 0, result.stdout[-3000:]
        plan = fact(name)["plans"][0]
        estimate = plan["llama_fit_params"]
        assert estimate["status"] == "ok", estimate
        assert estimate["llama_cpp"] == {"device": "CUDA0", "model_mib": 12345, "context_mib": 678,
                                         "compute_mib": 90, "total_mib": 13113}
        assert estimate["difference_mib"] == 13113 - estimate["ours"]["total_mib"]
        args = host.file("/tmp/fit-params-args").content_string.split()
        assert args[:5] == ["0", "-m", plan["model_path"], "-c", str(plan["ctx_size"])]
        assert args[-2:] == ["-fitp", "on"]
    finally:
        host.run("rm -rf /opt/llm-fleet/llama.cpp /tmp/fit-params-args")
    result = play(tmp_path / "without", [name])
    assert result.returncode == 0, result.stdout[-3000:]
    assert fact(name)["plans"][0]["llama_fit_params"]["status"] == "not run"
