"""Speculative decoding kept only where verify measured that it pays (issue 35,
module_utils/speculation.py): the planner's three cases (no baseline: off and measured
first; a baseline: a trial; a verdict: followed), verify's verdict against the same
configuration without it, the calibration file keeping it, and the flag."""
import pytest

import paths

paths.use_module_utils()
from ansible.errors import AnsibleFilterError  # noqa: E402
from ansible.module_utils import speculation as sp  # noqa: E402
from ansible.module_utils import speed_gate as sg  # noqa: E402
from ansible.module_utils.llama_flags import SERVER, plan_argv  # noqa: E402
from ansible.module_utils.llama_plan import PlanError, normalize_policy  # noqa: E402

from test_speed_gate import SERVED, baseline, calibration, gate_filters, host_record, record  # noqa: E402

PLAN = {"gpu_name": "Tesla V100-SXM2-32GB", "quant": "F32", "ctx_size": 2048, "parallel": 2, "cache_type_k": "f16",
        "split_mode": "none"}


def plain_baseline(single=600.0, slots=900.0, ttft=0.4):
    b = baseline(single=single, slots=slots)
    b["figures"]["ttft_at_slots_s"] = ttft
    return b


def test_without_a_baseline_it_is_planned_off_and_measured_first():
    kind, why = sp.plan_speculation(PLAN, "ngram-mod", {})
    assert kind == "none" and "no measurement of this configuration without it yet" in why
    assert sp.plan_speculation(PLAN, "none", {"baselines": [plain_baseline()]}) == ("none", "")


def test_with_a_baseline_it_is_tried_and_the_verdict_then_decides():
    trial = sp.plan_speculation(PLAN, "ngram-mod", {"baselines": [plain_baseline()]})
    assert trial[0] == "ngram-mod" and "a trial" in trial[1]
    # a baseline of another configuration (more slots) is not this plan's
    assert sp.plan_speculation(dict(PLAN, parallel=4), "ngram-mod", {"baselines": [plain_baseline()]})[0] == "none"
    lost = {"verdict": "no_gain", "spec_type": "ngram-mod", "config": sg.config_key(record()), "host": "gpu01",
            "measured_at": "2026-12-06T04:00:00Z", "message": "GPU 0 with ngram-mod: single-stream decode x0.97"}
    kind, why = sp.plan_speculation(PLAN, "ngram-mod", {"baselines": [plain_baseline()], "speculation": [lost]})
    assert kind == "none" and "measured no gain on gpu01" in why and "x0.97" in why
    # the latest verdict wins
    paid = dict(lost, verdict="pays", measured_at="2026-12-06T05:00:00Z", message="x1.31")
    assert sp.plan_speculation(PLAN, "ngram-mod", {"speculation": [lost, paid]})[0] == "ngram-mod"


@pytest.mark.parametrize("single,slots,ttft,verdict", [
    (660, 900, 0.4, "pays"),        # +10% one stream, nothing lost with every slot busy
    (620, 900, 0.4, "no_gain"),     # +3%: below the 5% asked
    (700, 800, 0.4, "no_gain"),     # one stream gains, every slot busy loses 11%
    (700, 900, 0.5, "no_gain"),     # the first token waits 25% longer with every slot busy
])
def test_the_verdict_needs_a_gain_alone_and_no_loss_with_every_slot_busy(single, slots, ttft, verdict):
    inst = dict(record(single=single, slots=slots), spec_type="ngram-mod", ttft_at_slots_s=ttft,
                all_slots_decode_tps=slots)
    out = sp.speculation_verdict(inst, {"single_stream_tps": 600, "all_slots_decode_tps": 900,
                                        "ttft_at_slots_s": 0.4}, 0.05, "GPU 0")
    assert out["verdict"] == verdict, out["message"]
    assert sp.speculation_verdict(dict(inst, spec_type="none"), {}, 0.05) is None
    assert sp.speculation_verdict(inst, {}, 0.05)["verdict"] == "unmeasured"


@pytest.mark.parametrize("single,slots,ttft,verdict", [
    (583, 1188, 0.4, "pays"),       # the H100's free-text trial: x0.97 alone, x1.32 with every slot busy
    (560, 1188, 0.4, "no_gain"),    # one stream loses 7%: more than the 5% allowed
    (700, 920, 0.4, "no_gain"),     # +2% with every slot busy: below the 5% asked
    (600, 1000, 0.5, "no_gain"),    # the first token waits 25% longer with every slot busy
])
def test_a_throughput_plan_must_gain_with_every_slot_busy(single, slots, ttft, verdict):
    inst = dict(record(single=single, slots=slots), spec_type="ngram-mod", ttft_at_slots_s=ttft,
                all_slots_decode_tps=slots, objective="throughput")
    out = sp.speculation_verdict(inst, {"single_stream_tps": 600, "all_slots_decode_tps": 900,
                                        "ttft_at_slots_s": 0.4}, 0.05, "GPU 0")
    assert out["verdict"] == verdict and out["objective"] == "throughput", out["message"]
    if verdict == "no_gain":
        assert "the throughput objective needs x1.05 with every slot busy" in out["message"]
    # the same figures for a latency plan: one stream must gain
    assert sp.speculation_verdict(dict(inst, objective="latency"), out["baseline"], 0.05)["verdict"] == (
        "pays" if single >= 630 and slots >= 855 and ttft <= 0.42 else "no_gain")


@pytest.mark.parametrize("bad", ["x", -0.1, 11, None])
def test_a_bad_min_gain_is_named(bad):
    with pytest.raises(ValueError, match="min_gain"):
        sp.check_min_gain(bad)
    with pytest.raises(AnsibleFilterError, match="verify_speculation_min_gain"):
        gate_filters.verify_speed_gate(host_record(), [], {}, {}, 0.9, True, bad)


def test_verify_judges_it_against_the_baseline_without_it_and_the_file_keeps_the_verdict():
    """Through the verify stage's filter and the calibration merge, as report.yml runs them."""
    spec = dict(record(single=580.0), spec_type="ngram-mod", ttft_at_slots_s=0.41)
    gate = gate_filters.verify_speed_gate(host_record(spec), SERVED, {}, {"baselines": [plain_baseline()]})
    # its own configuration: never measured with speculation, so accepted as that baseline
    assert gate["verdicts"][0]["verdict"] == "no_baseline"
    assert gate["verdicts"][0]["config"]["spec_type"] == "ngram-mod"
    verdict, = gate["speculation"]
    assert verdict["verdict"] == "no_gain" and verdict["config"] == sg.config_key(record())
    assert any("with ngram-mod: single-stream decode x0.97" in m for m in gate["messages"])
    content = calibration.llm_fleet_baselines_merge({"version": 1, "records": [], "baselines": [plain_baseline()]},
                                                    [{"host": "gpu01", "gate": gate}], "2026-12-06T04:00:00Z")
    assert [v["verdict"] for v in content["speculation"]] == ["no_gain"]
    assert len(content["baselines"]) == 2  # with and without speculation, side by side
    # the decode calibration's own merge (report.yml runs it first) keeps the verdicts
    content = calibration.llm_fleet_baselines_merge(calibration.llm_fleet_calibration_merge(content, []),
                                                    [{"host": "gpu01", "gate": {"verdicts": [], "speculation": []}}])
    assert [v["verdict"] for v in content["speculation"]] == ["no_gain"]
    # the next plan follows it
    kind, why = sp.plan_speculation(PLAN, "ngram-mod", content)
    assert kind == "none" and "measured no gain on gpu01" in why
    # a later run where it paid replaces that card's verdict
    again = sp.merge_verdicts(content["speculation"], "gpu01", [dict(verdict, verdict="pays")], "later")
    assert [v["verdict"] for v in again] == ["pays"]


def test_the_flag_and_the_policy():
    base = {"model_path": "/m.gguf", "ctx_size": 2048, "parallel": 2, "n_gpu_layers": 3, "cache_type_k": "f16",
            "cache_type_v": "f16", "flash_attn": True, "batch_size": 2048, "ubatch_size": 512}
    assert "--spec-type" not in plan_argv(dict(base, spec_type="none"), SERVER)
    assert "--spec-type" not in plan_argv(base, SERVER)
    argv = plan_argv(dict(base, spec_type="ngram-mod"), SERVER)
    assert argv[argv.index("--spec-type") + 1] == "ngram-mod"
    assert normalize_policy({})["speculative"] == "none"
    with pytest.raises(PlanError, match="must be one of none, ngram-mod, draft-simple"):
        normalize_policy({"speculative": "draft"})
    # a draft model's flags, only where the plan serves it
    argv = plan_argv(dict(base, spec_type="draft-simple", draft_model_path="/d.gguf", draft_n_gpu_layers=25,
                          draft_cache_type_k="q8_0", draft_cache_type_v="q8_0"), SERVER)
    assert argv[argv.index("--model-draft") + 1] == "/d.gguf" and argv[argv.index("--gpu-layers-draft") + 1] == "25"
    assert argv[argv.index("--cache-type-k-draft") + 1] == argv[argv.index("--cache-type-v-draft") + 1] == "q8_0"
    assert "--model-draft" not in plan_argv(dict(base, spec_type="none"), SERVER)
    # without speculation the speed gate's configuration key is what it always was
    assert "spec_type" not in sg.config_key(record()) and "spec_type" not in sg.config_key(
        dict(record(), spec_type="none"))


def test_a_trial_measured_with_another_request_length_still_gets_a_verdict():
    """The planner starts a trial on a baseline of any request length; verify prefers one
    of the same length and otherwise compares with the planner's, so the trial ends."""
    spec = dict(record(single=580.0), spec_type="ngram-mod", ttft_at_slots_s=0.41, n_predict=128)
    gate = gate_filters.verify_speed_gate(host_record(spec), SERVED, {}, {"baselines": [plain_baseline()]})
    verdict, = gate["speculation"]
    assert verdict["verdict"] == "no_gain" and verdict["baseline"]["single_stream_tps"] == 600


def test_a_draft_verdict_names_its_draft_and_merges_per_draft():
    spec = dict(record(single=240.0), spec_type="draft-simple", draft_model="/m/draft-a.gguf", ttft_at_slots_s=0.3)
    gate = gate_filters.verify_speed_gate(host_record(spec), SERVED, {}, {"baselines": [plain_baseline()]})
    verdict, = gate["speculation"]
    assert verdict["verdict"] == "no_gain" and verdict["draft"] == "/m/draft-a.gguf"
    merged = sp.merge_verdicts([], "gpu01", [verdict], "t0")
    # another draft's verdict sits beside it; the same draft's replaces it
    merged = sp.merge_verdicts(merged, "gpu01", [dict(verdict, draft="/m/draft-b.gguf", verdict="pays")], "t1")
    assert sorted((v["draft"], v["verdict"]) for v in merged) == [("/m/draft-a.gguf", "no_gain"),
                                                                   ("/m/draft-b.gguf", "pays")]
    assert len(sp.merge_verdicts(merged, "gpu01", [dict(verdict, verdict="pays")], "t2")) == 2
    # each draft's plan follows its own verdict
    draft = lambda path: {"path": path, "quant": "Q4_K"}  # noqa: E731
    assert sp.plan_speculation(PLAN, "draft-simple", {"speculation": merged}, draft("/x/draft-a.gguf"))[0] == "none"
    assert sp.plan_speculation(PLAN, "draft-simple", {"speculation": merged}, draft("/m/draft-b.gguf"))[0] == \
        "draft-simple"


def test_a_new_load_test_prompt_is_measured_without_it_before_a_trial_is_judged():
    """verify_loadtest_prompt changed (on an H200, ngram-mod was x0.93 on free text and x2.49 on
    a prompt its answer copies): a trial is never judged against another prompt's baseline.
    The cycle through verify's filter, the file and the planner: 'unmeasured' recorded, off,
    the baseline with the new prompt measured, a trial, a verdict."""
    own = "abc123def456"  # the prompt's id, as the load test reports it
    old_file = {"version": 1, "records": [], "baselines": [plain_baseline()]}  # the default prompt's
    # 1. the planner tries it (it matches baselines of any prompt); verify has none with this prompt
    assert sp.plan_speculation(PLAN, "ngram-mod", old_file)[0] == "ngram-mod"
    spec = dict(record(single=900.0), spec_type="ngram-mod", ttft_at_slots_s=0.41, prompt_id=own)
    gate = gate_filters.verify_speed_gate(host_record(spec), SERVED, {}, old_file)
    verdict, = gate["speculation"]
    assert verdict["verdict"] == "unmeasured" and "measured with this load-test prompt" in verdict["message"]
    assert verdict["config"]["prompt_id"] == own
    content = calibration.llm_fleet_baselines_merge(old_file, [{"host": "gpu01", "gate": gate}], "2026-12-07T01:00:00Z")
    # 2. the next plan serves without it, so verify measures the baseline with the new prompt
    kind, why = sp.plan_speculation(PLAN, "ngram-mod", content)
    assert kind == "none" and "load-test prompt has no measurement without it" in why
    plain = dict(record(single=600.0), ttft_at_slots_s=0.4, prompt_id=own)
    gate = gate_filters.verify_speed_gate(host_record(plain), SERVED, {}, content)
    assert gate["verdicts"][0]["verdict"] == "no_baseline" and gate["verdicts"][0]["config"]["prompt_id"] == own
    content = calibration.llm_fleet_baselines_merge(content, [{"host": "gpu01", "gate": gate}], "2026-12-07T02:00:00Z")
    # 3. a trial against it, and a verdict the next plan follows
    assert sp.plan_speculation(PLAN, "ngram-mod", content)[0] == "ngram-mod"
    gate = gate_filters.verify_speed_gate(host_record(spec), SERVED, {}, content)
    verdict, = gate["speculation"]
    assert verdict["verdict"] == "pays" and verdict["baseline"]["single_stream_tps"] == 600
    content = calibration.llm_fleet_baselines_merge(content, [{"host": "gpu01", "gate": gate}], "2026-12-07T03:00:00Z")
    assert [v["verdict"] for v in content["speculation"]] == ["pays"]
    assert sp.plan_speculation(PLAN, "ngram-mod", content)[0] == "ngram-mod"


def test_the_speed_gate_compares_only_measurements_of_the_same_prompt():
    assert "prompt_id" not in sg.config_key(dict(record(), prompt_id="default"))
    assert sg.config_key(dict(record(), prompt_id="abc123def456"))["prompt_id"] == "abc123def456"
    verdict = sg.judge(dict(record(single=100.0), prompt_id="abc123def456"), [baseline()])
    assert verdict["verdict"] == "no_baseline"


def verify_run(content, inst, accepted, at, build="b2"):
    """One verify run of gpu01 through the stage's filter and the calibration merge."""
    gate = gate_filters.verify_speed_gate({"host": "gpu01", "llama_cpp": {"build_key": build}, "instances": [inst]},
                                          SERVED, accepted, content)
    return gate, calibration.llm_fleet_baselines_merge(content, [{"host": "gpu01", "gate": gate}], at)


def test_a_verdict_is_tried_again_when_verify_measures_with_another_prompt():
    """A no_gain under the default prompt, then verify_loadtest_prompt set to the service's own
    traffic (where ngram-mod can pay x2.49): the card serves without it, unchanged, so verify
    records the new prompt's baseline and marks the verdict outdated; the next plan tries it
    again against that baseline. Back to the default prompt, the same."""
    own = "abc123def456"
    lost = {"verdict": "no_gain", "spec_type": "ngram-mod", "config": sg.config_key(record()), "host": "gpu01",
            "gpu_uuid": record()["gpu_uuid"], "build": "b2", "measured_at": "2026-12-07T01:00:00Z",
            "message": "x0.93"}
    content = {"version": 1, "records": [], "baselines": [plain_baseline()], "speculation": [lost]}
    assert sp.plan_speculation(PLAN, "ngram-mod", content)[0] == "none"
    # a card of another host keeps its verdict: only verify on gpu01 knows gpu01's prompt
    other = dict(lost, host="gpu02")
    gate, _ = verify_run(dict(content, speculation=[other]), dict(record(), prompt_id=own), {"0": "new"}, "t")
    assert gate["speculation"] == []
    plain = dict(record(single=600.0), ttft_at_slots_s=0.4, prompt_id=own)
    gate, content = verify_run(content, plain, {"0": "new"}, "2026-12-07T02:00:00Z")  # unchanged
    assert gate["gated"] == [] and gate["verdicts"][0]["verdict"] == "no_baseline"
    outdated, = gate["speculation"]
    assert outdated["verdict"] == "outdated" and outdated["config"]["prompt_id"] == own
    assert "the load-test prompt changed (was default, now %s) since its no_gain verdict (x0.93)" % own \
        in outdated["message"]
    assert [v["verdict"] for v in content["speculation"]] == ["outdated"]
    kind, why = sp.plan_speculation(PLAN, "ngram-mod", content)
    assert kind == "ngram-mod" and "a trial again (verify on gpu01: GPU 0: the load-test prompt changed" in why
    # the trial, judged against the new prompt's baseline
    spec = dict(record(single=580.0), spec_type="ngram-mod", ttft_at_slots_s=0.4, prompt_id=own)
    gate, content = verify_run(content, spec, {"0": "new"}, "2026-12-07T03:00:00Z")
    verdict, = gate["speculation"]
    assert verdict["verdict"] == "no_gain" and verdict["baseline"]["single_stream_tps"] == 600
    assert sp.plan_speculation(PLAN, "ngram-mod", content)[0] == "none"
    # served without it and measured with the same prompt again: nothing new
    gate, content = verify_run(content, plain, {"0": "new"}, "2026-12-07T04:00:00Z")
    assert gate["speculation"] == [] and sp.plan_speculation(PLAN, "ngram-mod", content)[0] == "none"
    # back to the default prompt, whose baseline the file has: outdated again, tried again
    gate, content = verify_run(content, dict(plain, prompt_id="default"), {"0": "new"}, "2026-12-07T05:00:00Z")
    assert gate["verdicts"][0]["verdict"] == "not_gated"
    assert "(was %s, now default)" % own in gate["speculation"][0]["message"]
    assert "prompt_id" not in gate["speculation"][0]["config"]
    assert sp.plan_speculation(PLAN, "ngram-mod", content)[0] == "ngram-mod"


def test_a_verdict_is_tried_again_after_llama_cpp_is_upgraded():
    """The upgrade's measurement without speculation marks the verdict of the old build
    outdated; the trial's verdict carries the new build, so the plan after it follows it."""
    lost = {"verdict": "no_gain", "spec_type": "ngram-mod", "config": sg.config_key(record()), "host": "gpu01",
            "gpu_uuid": record()["gpu_uuid"], "build": "b1", "measured_at": "2026-12-07T01:00:00Z",
            "message": "x0.93"}
    content = {"version": 1, "records": [], "baselines": [plain_baseline()], "speculation": [lost]}
    gate, _ = verify_run(content, dict(record(), ttft_at_slots_s=0.4), {"0": "new"}, "t", build="b1")
    assert gate["speculation"] == []  # the same build: the verdict stands
    gate, content = verify_run(content, dict(record(), ttft_at_slots_s=0.4), {"0": "old"}, "2026-12-07T03:00:00Z")
    assert gate["verdicts"][0]["verdict"] == "pass" and gate["build"] == "b2"
    assert "llama.cpp was upgraded (build b1, now b2)" in gate["speculation"][0]["message"]
    kind, why = sp.plan_speculation(PLAN, "ngram-mod", content)
    assert kind == "ngram-mod" and "llama.cpp was upgraded (build b1, now b2)" in why
    spec = dict(record(single=580.0), spec_type="ngram-mod", ttft_at_slots_s=0.41)
    gate, content = verify_run(content, spec, {"0": "old"}, "2026-12-07T04:00:00Z")
    verdict, = gate["speculation"]
    assert verdict["verdict"] == "no_gain" and verdict["build"] == "b2"
    kind, why = sp.plan_speculation(PLAN, "ngram-mod", content)
    assert kind == "none" and "measured no gain on gpu01" in why
    gate, content = verify_run(content, dict(record(), ttft_at_slots_s=0.4), {"0": "new"}, "2026-12-07T05:00:00Z")
    assert gate["speculation"] == []


def test_a_verdict_is_its_model_s():
    """Two models of one shape: the chat model's verdict does not decide the coder model's plan;
    a verdict recorded before configurations named the model still decides either."""
    lost = {"verdict": "no_gain", "spec_type": "ngram-mod", "host": "gpu01", "measured_at": "2026-12-07T01:00:00Z",
            "config": sg.config_key(record(model_file="chat-32b-q4_k.gguf")), "message": "x0.93"}
    base = dict(plain_baseline(), config=sg.config_key(record(model_file="coder-7b-q4_k.gguf")))
    coder = dict(PLAN, model_path="/var/lib/llm-fleet/models/coder-7b-q4_k.gguf")
    chat = dict(PLAN, model_path="https://mirror/models/chat-32b-q4_k.gguf")  # the plan before the download
    content = {"baselines": [base], "speculation": [lost]}
    assert sp.plan_speculation(coder, "ngram-mod", content)[0] == "ngram-mod"  # a trial: its own baseline
    assert sp.plan_speculation(chat, "ngram-mod", content)[0] == "none"
    legacy = dict(lost, config=sg.config_key(record()))
    assert sp.plan_speculation(coder, "ngram-mod", {"baselines": [base], "speculation": [legacy]})[0] == "none"
