"""Speculative decoding kept only where verify measured that it pays (issue 35), on the
16 GB host: the policy asks for ngram-mod (no extra weights). Converge measured this
configuration without it (the speed baseline in the scenario's calibration file), so the
model stage plans it as a trial; llama-server runs with --spec-type ngram-mod; verify
compares it with the baseline and, asked for a gain no random-weight model can show
(verify_speculation_min_gain: 10, +1000%), records no_gain in the calibration file; the next
plan turns it off and says why, and the process runs without it."""
import json
import os

import pytest

from hostprobe import node, only_in_scenario, run_playbook, stage_fact
from test_llama_server import cmdline

# the trial and its refusal run in CI (about 2 minutes); the prompt walk (about 8) is day two
pytestmark = only_in_scenario("fleet")

HOST = "fleet-sxm2-16gb"
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))


def reports(name):
    return os.path.join(os.environ["MOLECULE_EPHEMERAL_DIRECTORY"], "reports", name)


def deploy(tmp_path, stages, **extra):
    tmp_path.mkdir(parents=True, exist_ok=True)
    playbook = tmp_path / "stages.yml"
    playbook.write_text("".join("- import_playbook: %s/playbooks/%s.yml\n" % (REPO, s) for s in stages))
    policy = {"min_ctx": 512, "target_ctx": 2048, "target_parallel": 2, "speculative": "ngram-mod"}
    result = run_playbook(str(playbook), [HOST], tmp_path=tmp_path, extra_vars=dict({
        # the request length converge measured the baseline with (molecule/fleet/converge.yml)
        "verify_loadtest_n_predict": 16,
        "llm_model_policy": policy, "verify_speculation_min_gain": 10, "verify_report_dir": reports(""),
        "fleet_common_calibration_file": reports("decode-calibration.json")}, **extra))
    assert result.returncode == 0, result.stdout[-3000:]
    return result


def running_args(host):
    pid = int(host.check_output("systemctl show -P MainPID llama-server@0.service"))
    return cmdline(host, pid)


def forget_verdicts(host_name):
    """What an operator does to try speculation again: drop the host's verdicts from the file."""
    with open(reports("decode-calibration.json")) as handle:
        content = json.load(handle)
    content["speculation"] = [v for v in content.get("speculation") or [] if v.get("host") != host_name]
    with open(reports("decode-calibration.json"), "w") as handle:
        json.dump(content, handle, indent=1)


def test_speculation_is_tried_measured_and_turned_off_where_it_does_not_pay(tmp_path):
    host = node(HOST)
    forget_verdicts(HOST)
    deploy(tmp_path / "trial", ["model", "llama_server", "verify"])
    plan, = stage_fact(host, "model")["plans"]
    assert plan["spec_type"] == "ngram-mod", plan["reason"]
    assert "ngram-mod" in plan["reason"] and "a trial" in plan["reason"]
    args = running_args(host)
    assert args[args.index("--spec-type") + 1] == "ngram-mod"

    verify = stage_fact(host, "verify")
    verdict, = verify["speed_gate"]["speculation"]
    assert verdict["verdict"] == "no_gain" and verdict["spec_type"] == "ngram-mod", verdict
    assert verdict["figures"]["single_stream_tps"] > 0 and verdict["baseline"]["single_stream_tps"] > 0
    with open(reports("decode-calibration.json")) as handle:
        kept = [v for v in json.load(handle)["speculation"] if v["host"] == HOST]
    assert [v["verdict"] for v in kept] == ["no_gain"]

    # the next run follows the measurement and says so (its verify accepts what serves then
    # without gating it: the CPU's figures on this shared machine are not what is tested here)
    deploy(tmp_path / "after", ["model", "llama_server", "verify"], verify_speed_gate=False)
    plan, = stage_fact(host, "model")["plans"]
    assert plan["spec_type"] == "none"
    assert "measured no gain on %s" % HOST in plan["reason"]
    assert "--spec-type" not in running_args(host)
    assert stage_fact(host, "verify")["speed_gate"]["speculation"] == []


@pytest.mark.day_two
def test_a_new_load_test_prompt_is_measured_without_it_before_a_trial_is_judged(tmp_path):
    """verify_loadtest_prompt set to a prompt of the operator's own: the trial finds no baseline
    measured with it, so it is recorded 'unmeasured' (not judged against the default prompt's
    figures); the next plan serves without it and verify records that prompt's baseline; the
    plan after that is a trial judged against it. Then another prompt while it serves without
    it: verify records its baseline and marks the verdict outdated, and it is tried again."""
    host = node(HOST)
    forget_verdicts(HOST)
    prompt = {"verify_loadtest_prompt": "Repeat this line exactly: the quick brown fox jumps over the lazy dog."}
    deploy(tmp_path / "trial", ["model", "llama_server", "verify"], **prompt)
    plan, = stage_fact(host, "model")["plans"]
    assert plan["spec_type"] == "ngram-mod", plan["reason"]
    verdict, = stage_fact(host, "verify")["speed_gate"]["speculation"]
    assert verdict["verdict"] == "unmeasured" and len(verdict["config"]["prompt_id"]) == 12, verdict

    deploy(tmp_path / "measure", ["model", "llama_server", "verify"], **prompt)
    plan, = stage_fact(host, "model")["plans"]
    assert plan["spec_type"] == "none" and "load-test prompt has no measurement without it" in plan["reason"]
    assert "--spec-type" not in running_args(host)
    with open(reports("decode-calibration.json")) as handle:
        baselines = json.load(handle)["baselines"]
    assert any(b["host"] == HOST and b["config"].get("prompt_id") == verdict["config"]["prompt_id"]
               and "spec_type" not in b["config"] for b in baselines)

    deploy(tmp_path / "again", ["model", "llama_server", "verify"], **prompt)
    plan, = stage_fact(host, "model")["plans"]
    assert plan["spec_type"] == "ngram-mod" and "compares the two now" in plan["reason"]
    verdict, = stage_fact(host, "verify")["speed_gate"]["speculation"]
    assert verdict["verdict"] == "no_gain" and verdict["baseline"]["single_stream_tps"] > 0, verdict

    # the verdict followed: served without it, measured with the same prompt, nothing new
    deploy(tmp_path / "off", ["model", "llama_server", "verify"], verify_speed_gate=False, **prompt)
    assert "--spec-type" not in running_args(host)
    assert stage_fact(host, "verify")["speed_gate"]["speculation"] == []

    # another prompt while it serves without it: the instance is unchanged (not gated), yet
    # the fleet has no figure with that prompt, so verify records it as the baseline, and marks
    # the verdict of the old prompt outdated; the next plan tries it again against that baseline
    other = {"verify_loadtest_prompt": "Copy this list: one, two, three, four, five, six, seven, eight."}
    deploy(tmp_path / "other", ["model", "llama_server", "verify"], **other)
    assert stage_fact(host, "model")["plans"][0]["spec_type"] == "none"
    gate = stage_fact(host, "verify")["speed_gate"]
    assert gate["gated"] == [] and gate["verdicts"][0]["verdict"] == "no_baseline", gate
    outdated, = gate["speculation"]
    assert outdated["verdict"] == "outdated" and "the load-test prompt changed (was %s, now %s)" % (
        verdict["config"]["prompt_id"], outdated["config"]["prompt_id"]) in outdated["message"], outdated
    deploy(tmp_path / "retry", ["model", "llama_server", "verify"], **other)
    plan, = stage_fact(host, "model")["plans"]
    assert plan["spec_type"] == "ngram-mod" and "a trial again" in plan["reason"], plan["reason"]
    retried, = stage_fact(host, "verify")["speed_gate"]["speculation"]
    assert retried["verdict"] == "no_gain" and retried["config"]["prompt_id"] == outdated["config"]["prompt_id"]

    # back to the default prompt, without speculation (its no_gain verdict), for the tests after
    deploy(tmp_path / "back", ["model", "llama_server", "verify"], verify_speed_gate=False)
    assert "--spec-type" not in running_args(host)
