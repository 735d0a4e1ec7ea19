"""A draft model for speculative decoding (issue 35), on the 16 GB host: the policy asks for
draft-simple with the harness' second tiny model as the draft (the same vocabulary as the
served one; scripts/setup.sh writes both into the model mirror). The model stage budgets the
draft's weights, KV and compute on the card and fetches it; converge measured this
configuration without speculation, so the plan tries it: llama-server runs with
--model-draft and the draft's layers and KV type; verify compares it with the baseline and,
asked for a gain no random-weight pair can show, records no_gain; the next plan turns it
off, keeps its memory free (the configuration stays the same) and the process runs
without it."""
import json
import os

import pytest

from hostprobe import node, only_in_scenario, run_playbook, stage_fact
from test_llama_server import cmdline
from test_speculation import forget_verdicts, reports

pytestmark = [only_in_scenario("fleet"), pytest.mark.day_two]

HOST = "fleet-sxm2-16gb"
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
MODELS = os.path.join(REPO, ".cache", "harness", "models")
DRAFT_PATH = "/var/lib/llm-fleet/models/tiny-second-f32.gguf"


def draft_entry():
    with open(os.path.join(MODELS, "tiny-second-f32.gguf.sha256")) as handle:
        return {"quant": "F32", "url": "file:///srv/models/tiny-second-f32.gguf", "sha256": handle.read().strip()}


def deploy(tmp_path, **extra):
    tmp_path.mkdir(parents=True, exist_ok=True)
    playbook = tmp_path / "stages.yml"
    playbook.write_text("".join("- import_playbook: %s/playbooks/%s.yml\n" % (REPO, s)
                                for s in ("model", "llama_server", "verify")))
    policy = {"min_ctx": 512, "target_ctx": 2048, "target_parallel": 2, "speculative": "draft-simple"}
    result = run_playbook(str(playbook), [HOST], tmp_path=tmp_path, extra_vars=dict({
        # the request length converge measured the baseline with (molecule/fleet/converge.yml)
        "verify_loadtest_n_predict": 16, "llm_model_draft": draft_entry(),
        "llm_model_policy": policy, "verify_speculation_min_gain": 10, "verify_report_dir": reports(""),
        "fleet_common_calibration_file": reports("decode-calibration.json")}, **extra))
    assert result.returncode == 0, result.stdout[-3000:]
    return result


def running_args(host):
    return cmdline(host, int(host.check_output("systemctl show -P MainPID llama-server@0.service")))


def test_a_draft_model_is_budgeted_tried_measured_and_turned_off(tmp_path):
    host = node(HOST)
    forget_verdicts(HOST)
    deploy(tmp_path / "trial")
    plan, = stage_fact(host, "model")["plans"]
    memory, draft = plan["memory"], plan["draft"]
    # the draft file on the host, the same bytes as the mirror's, and its budget in the plan
    assert host.file(DRAFT_PATH).sha256sum == draft_entry()["sha256"]
    assert draft["path"] == DRAFT_PATH and draft["total_bytes"] == memory["draft_bytes"] > 0
    assert memory["draft_bytes"] == memory["draft_weights_bytes"] + memory["draft_kv_bytes"] + \
        memory["draft_compute_bytes"] and memory["draft_kv_bytes"] > 0
    assert plan["spec_type"] == "draft-simple" and memory["draft_loaded"] is True, plan["reason"]
    assert "with the draft model" in plan["reason"] and "a trial" in plan["reason"]
    args = running_args(host)
    assert args[args.index("--spec-type") + 1] == "draft-simple"
    assert args[args.index("--model-draft") + 1] == DRAFT_PATH
    assert args[args.index("--cache-type-k-draft") + 1] == plan["cache_type_k"]

    verify = stage_fact(host, "verify")
    verdict, = verify["speed_gate"]["speculation"]
    assert verdict["verdict"] == "no_gain" and verdict["spec_type"] == "draft-simple", verdict
    assert verdict["figures"]["single_stream_tps"] > 0
    with open(reports("decode-calibration.json")) as handle:
        kept = [v for v in json.load(handle)["speculation"] if v["host"] == HOST]
    assert [v["verdict"] for v in kept] == ["no_gain"]

    # the next run follows the measurement: no draft on the command line, its memory kept
    # free so the configuration is the one measured
    deploy(tmp_path / "after", verify_speed_gate=False)
    after, = stage_fact(host, "model")["plans"]
    assert after["spec_type"] == "none" and "measured no gain on %s" % HOST in after["reason"]
    assert (after["ctx_size"], after["parallel"]) == (plan["ctx_size"], plan["parallel"])
    assert after["memory"]["draft_loaded"] is False and after["memory"]["draft_reserved_bytes"] == memory["draft_bytes"]
    args = running_args(host)
    assert "--model-draft" not in args and "--spec-type" not in args


def test_the_speculation_test_leaves_the_host_as_converge_did(tmp_path):
    # what the other tests expect of this host: no draft, no speculation
    deploy(tmp_path, llm_model_draft={}, llm_model_policy={"min_ctx": 512, "target_ctx": 2048, "target_parallel": 2},
           verify_speed_gate=False)
    plan, = stage_fact(node(HOST), "model")["plans"]
    assert "draft" not in plan and plan["spec_type"] == "none"
