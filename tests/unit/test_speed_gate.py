"""The rollout's speed gate (module_utils/speed_gate.py) and its filters: which
instances are gated, the verdict against the fleet's baseline, the baselines the
calibration file keeps, the canary hosts, and the llama_server rollback helpers."""
import pytest
from hypothesis import assume, given, strategies as st

import paths

paths.use_module_utils()
from ansible.errors import AnsibleFilterError  # noqa: E402
from ansible.module_utils import speed_gate as sg  # noqa: E402

gate_filters = paths.load_file("verify_speed_gate", paths.ROOT / "roles/verify/filter_plugins/verify_speed_gate.py")
calibration = paths.load_file("calibration_filters", paths.ROOT / "filter_plugins/calibration.py")
rollout = paths.load_file("rollout_filters", paths.ROOT / "filter_plugins/rollout.py")
rollback = paths.load_file("llama_server_rollback",
                           paths.ROOT / "roles/llama_server/filter_plugins/llama_server_rollback.py")

UUID = "GPU-4f6a1c2e-8b3d-4e55-9a71-2c0d93b5e7a4"


def record(single=600.0, slots=900.0, prompt=2000.0, gpu_index=0, **extra):
    out = {"gpu_index": gpu_index, "gpu_uuid": UUID, "gpu_name": "Tesla V100-SXM2-32GB", "quant": "F32",
           "ctx_size": 2048, "parallel": 2, "cache_type_k": "f16", "split_mode": "none", "n_predict": 16,
           "single_stream_tps": single, "llama_bench": {"prompt_tps": prompt},
           "levels": [{"concurrency": 1, "aggregate_decode_tps": single},
                      {"concurrency": 2, "aggregate_decode_tps": slots, "aggregate_tps": slots / 3}],
           "errors": []}
    out.update(extra)
    return out


def baseline(host="gpu01", single=600.0, slots=900.0, prompt=2000.0, **config):
    rec = record(single, slots, prompt, **config)
    return {"host": host, "gpu_uuid": UUID, "config": sg.config_key(rec),
            "figures": {"single_stream_tps": single, "all_slots_decode_tps": slots, "prompt_tps": prompt}}


def test_an_unchanged_instance_is_reported_not_gated():
    verdict = sg.judge(record(single=10), [baseline()], gated=False)
    assert verdict["verdict"] == "not_gated" and verdict["checks"] == []


def test_an_unchanged_instance_the_fleet_never_measured_so_becomes_the_baseline():
    """A new load-test prompt or a lost calibration file: without this, the next change of an
    unchanged instance would pass unjudged ('no_baseline'), an upgrade that could be slower."""
    verdict = sg.judge(record(single=10), [baseline(quant="Q8_0")], gated=False)
    assert verdict["verdict"] == "no_baseline" and not verdict["gated"] and verdict["checks"] == []
    assert "unchanged, not gated" in verdict["message"] and sg.accepted([verdict]) == [verdict]
    # a failed measurement, or one with no figure, is never a baseline
    assert sg.judge(record(errors=["stream 1: timeout"]), [], gated=False)["verdict"] == "not_gated"
    empty = record(single=None, prompt=None, levels=[])
    assert sg.judge(empty, [], gated=False)["verdict"] == "not_gated"
    gate = gate_filters.verify_speed_gate(host_record(record()), SERVED, {"0": "new"}, {})
    assert gate["gated"] == [] and gate["refused"] == [] and gate["accepted"] == {"0": "new"}
    assert any("recorded as the baseline the next change is judged against" in m for m in gate["messages"])
    content = calibration.llm_fleet_baselines_merge({"version": 1, "records": []}, [{"host": "gpu01", "gate": gate}],
                                                    "t")
    assert [b["figures"]["single_stream_tps"] for b in content["baselines"]] == [600]
    # the next run is judged against it and records nothing new
    again = gate_filters.verify_speed_gate(host_record(record(single=10)), SERVED, {"0": "new"}, content)
    assert again["verdicts"][0]["verdict"] == "not_gated" and again["messages"] == []


def test_two_models_of_one_shape_have_a_baseline_each_and_older_baselines_still_judge():
    """A chat and a coder model, both Q4_K with the same slots and context on one card name:
    the small one's figures must not judge the large one. Baselines recorded before the key
    named the model (no model_file) still judge either until its own is recorded."""
    chat, coder = record(single=60, model_file="chat-32b-q4_k.gguf"), record(single=60, model_path="/m/coder-7b-q4_k.gguf")
    assert sg.config_key(coder)["model_file"] == "coder-7b-q4_k.gguf" and "model_file" not in sg.config_key(record())
    of_coder = baseline(single=200.0, model_file="coder-7b-q4_k.gguf")
    assert sg.judge(chat, [of_coder])["verdict"] == "no_baseline"
    assert sg.judge(coder, [of_coder])["verdict"] == "refuse"
    legacy = baseline(single=200.0)  # no model named
    assert sg.judge(chat, [legacy])["verdict"] == "refuse"
    of_chat = baseline(single=60.0, model_file="chat-32b-q4_k.gguf")
    assert sg.judge(chat, [legacy, of_chat])["verdict"] == "pass"


def test_a_changed_instance_as_fast_as_the_baseline_passes():
    verdict = sg.judge(record(single=590, slots=880, prompt=1950), [baseline()], build="b2")
    assert verdict["verdict"] == "pass"
    assert [c["figure"] for c in verdict["checks"]] == ["single_stream_tps", "all_slots_decode_tps", "prompt_tps"]
    assert all(c["ok"] for c in verdict["checks"])
    assert "GPU 0 (build b2): at least 0.90 of the fleet's baseline" in verdict["message"]


def test_a_model_loaded_on_demand_is_its_own_configuration():
    """Served through its router (one more hop per streamed token, no llama-bench), a
    model loaded on demand is not judged against the same plan served alone: it
    starts its own baseline, and later changes are judged against that one."""
    lazy = record(single=276, slots=276, prompt=None, load="on_demand", llama_bench={"skipped": "on demand"})
    first = sg.judge(lazy, [baseline(single=382, slots=382, prompt=9584)])
    assert first["verdict"] == "no_baseline" and first["config"]["load"] == "on_demand"
    assert "load" not in sg.config_key(record(load="resident"))
    again = sg.judge(dict(lazy, single_stream_tps=270), [baseline(single=382, slots=382, prompt=9584),
                                                         dict(baseline(single=276, slots=276, prompt=0),
                                                              config=first["config"])])
    assert again["verdict"] == "pass" and [c["figure"] for c in again["checks"]] == ["single_stream_tps",
                                                                                    "all_slots_decode_tps"]


def test_a_slower_build_is_refused_naming_the_figure_and_the_ratio():
    verdict = sg.judge(record(single=60, slots=880, prompt=1950), [baseline()], build="slow")
    assert verdict["verdict"] == "refuse"
    single = verdict["checks"][0]
    assert (single["measured"], single["baseline"], single["ratio"], single["ok"]) == (60, 600, 0.1, False)
    assert "single-stream decode 60.0 tok/s vs 600.0 (x0.10)" in verdict["message"]
    assert "build slow" in verdict["message"]


@pytest.mark.parametrize("figure", ["all_slots_decode_tps", "prompt_tps"])
def test_each_figure_can_refuse_on_its_own(figure):
    slow = {"single": 600, "slots": 900, "prompt": 2000}
    slow[{"all_slots_decode_tps": "slots", "prompt_tps": "prompt"}[figure]] *= 0.5
    verdict = sg.judge(record(**slow), [baseline()])
    assert verdict["verdict"] == "refuse"
    assert [c["figure"] for c in verdict["checks"] if not c["ok"]] == [figure]


def test_every_slot_busy_is_the_decode_rate_not_tokens_over_the_wall_time():
    rec = record(slots=900)
    assert sg.judge(rec, [])["figures"]["all_slots_decode_tps"] == 900
    del rec["levels"]
    rec["aggregate_slots_tps"] = 300  # an older record: the wall-time figure is all there is
    assert sg.judge(rec, [])["figures"]["all_slots_decode_tps"] == 300


def test_a_failed_measurement_is_refused():
    verdict = sg.judge(record(errors=["1 stream(s): 1 error(s)"]), [baseline()])
    assert verdict["verdict"] == "refuse" and "the measurement failed" in verdict["message"]


def test_a_missing_figure_of_a_gated_instance_is_refused():
    verdict = sg.judge(record(single=None), [baseline()])
    assert verdict["verdict"] == "refuse"
    assert "single-stream decode not measured" in verdict["message"]


def test_the_baseline_is_the_median_of_the_same_configuration_only():
    bases = [baseline("a", single=500), baseline("b", single=600), baseline("c", single=700),
             baseline("d", single=10, parallel=4), baseline("e", single=10, gpu_name="Tesla V100-SXM2-16GB")]
    assert sg.baseline_for(record(), bases)["single_stream_tps"] == (600, 3)


def test_a_configuration_never_measured_becomes_the_baseline():
    verdict = sg.judge(record(), [baseline(parallel=4)])
    assert verdict["verdict"] == "no_baseline" and "recorded as the baseline" in verdict["message"]
    merged = sg.merge_baselines([baseline("other")], "gpu01", [verdict], "t")
    assert [b["host"] for b in merged] == ["gpu01", "other"]


def test_a_refused_measurement_never_becomes_the_baseline():
    refused = sg.judge(record(single=60), [baseline()])
    assert sg.merge_baselines([baseline()], "gpu01", [refused]) == [baseline()]


def test_an_accepted_measurement_replaces_that_cards_entry():
    passed = sg.judge(record(single=610), [baseline()])
    merged = sg.merge_baselines([baseline()], "gpu01", [passed], "t")
    assert len(merged) == 1 and merged[0]["figures"]["single_stream_tps"] == 610


def test_a_first_token_of_milliseconds_keeps_its_digits_in_the_baseline():
    """Seen on an H200: 0.024 s stored as 0.02 made a trial's 0.04 s read as x2.00, not x1.67."""
    passed = sg.judge(record(single=610, ttft_at_slots_s=0.0244), [baseline()])
    figures = sg.merge_baselines([], "gpu01", [passed], "t")[0]["figures"]
    assert figures["ttft_at_slots_s"] == 0.0244 and figures["single_stream_tps"] == 610


@pytest.mark.parametrize("bad", [0, -1, 1.5, "fast", None, float("nan")])
def test_a_bad_min_ratio_is_named(bad):
    with pytest.raises(ValueError, match="min_ratio is"):
        sg.judge(record(), [], bad)


@given(st.floats(min_value=1, max_value=1e5), st.floats(min_value=0.01, max_value=3),
       st.floats(min_value=0.05, max_value=1))
def test_refused_exactly_when_some_figure_is_below_the_floor(reference, factor, floor):
    assume(abs(factor - floor) > 0.001)  # the ratio is rounded to 3 digits
    verdict = sg.judge(record(single=reference * factor), [baseline(single=reference)], floor)
    assert (verdict["verdict"] == "refuse") == (factor < floor)


# --- the verify filter: which instances are gated -------------------------------

SERVED = [{"gpu_index": 0, "fingerprint": "new"}, {"gpu_index": 1, "fingerprint": "same"}]


def host_record(*instances):
    return {"llama_cpp": {"build_key": "b2"}, "instances": list(instances)}


def test_only_changed_instances_are_gated_and_a_refused_one_keeps_its_old_acceptance():
    gate = gate_filters.verify_speed_gate(host_record(record(single=60), record(single=60, gpu_index=1)), SERVED,
                                          {"0": "old", "1": "same"}, {"baselines": [baseline()]})
    assert gate["gated"] == [0] and gate["refused"] == [0]
    assert gate["accepted"] == {"0": "old", "1": "same"}
    assert gate["build"] == "b2"


def test_a_passing_change_is_accepted():
    gate = gate_filters.verify_speed_gate(host_record(record()), SERVED, {"0": "old"}, {"baselines": [baseline()]})
    assert gate["refused"] == [] and gate["accepted"] == {"0": "new"}


def test_the_gate_switched_off_measures_and_accepts_without_judging():
    gate = gate_filters.verify_speed_gate(host_record(record(single=1)), SERVED, {}, {"baselines": [baseline()]},
                                          0.9, False)
    assert gate["gated"] == [] and gate["refused"] == [] and gate["accepted"] == {"0": "new"}


def test_a_bad_min_ratio_stops_the_filter():
    with pytest.raises(AnsibleFilterError, match="verify_speed_gate_min_ratio"):
        gate_filters.verify_speed_gate(host_record(), [], {}, {}, "0.9x")


def test_the_calibration_file_keeps_the_baselines_beside_the_records():
    passed = gate_filters.verify_speed_gate(host_record(record()), SERVED, {}, {})
    content = calibration.llm_fleet_baselines_merge(
        calibration.llm_fleet_calibration_merge({"version": 1, "records": []}, []),
        [{"host": "gpu01", "gate": passed}], "t")
    assert content["baselines"][0]["figures"] == {"single_stream_tps": 600, "all_slots_decode_tps": 900,
                                                  "prompt_tps": 2000}
    # the decode calibration's own merge keeps them
    again = calibration.llm_fleet_calibration_merge(content, [])
    assert again["baselines"] == content["baselines"]


# --- the canary hosts ----------------------------------------------------------------

HOSTS = ["h%d" % n for n in range(10)]


@pytest.mark.parametrize("spec,expected", [(1, ["h0"]), ("1", ["h0"]), (0, []), ("0%", []), ("10%", ["h0"]),
                                           ("15%", ["h0", "h1"]), ("100%", HOSTS), (25, HOSTS), ("1%", ["h0"])])
def test_the_canary_is_a_count_or_a_share_of_the_hosts(spec, expected):
    assert rollout.llm_fleet_canary_hosts(HOSTS, spec) == expected


@pytest.mark.parametrize("bad", [-1, "1.5", "ten", "120%", "-5%", True, None, ""])
def test_a_bad_canary_is_named(bad):
    with pytest.raises(AnsibleFilterError, match="llm_fleet_canary is"):
        rollout.llm_fleet_canary_hosts(HOSTS, bad)


# --- llama_server's rollback helpers ----------------------------------------------------

def test_the_build_of_a_dropin_is_its_build_line():
    text = "# GPU 0: F32\n# build cuda-70-0c1e57098-abc\n# model sha256 x\n[Service]\n"
    assert rollback.llama_server_dropin_build(text) == "cuda-70-0c1e57098-abc"
    with pytest.raises(AnsibleFilterError, match="names no build"):
        rollback.llama_server_dropin_build("[Service]\n")


def test_the_fact_after_a_rollback_names_the_build_of_before():
    fact = {"summary": "2 instance(s)", "instances": [{"gpu_index": 0, "build_key": "slow", "fingerprint": "n"},
                                                      {"gpu_index": 1, "build_key": "slow", "fingerprint": "m"}]}
    out = rollback.llama_server_record_rollback(fact, [{"gpu_index": 0, "build_key": "fast"}], {"0": "o"})
    assert out["instances"][0] == {"gpu_index": 0, "build_key": "fast", "fingerprint": "o", "rolled_back_from": "slow"}
    assert out["instances"][1] == fact["instances"][1]
    assert "GPU 0 switched back to build fast" in out["summary"]
