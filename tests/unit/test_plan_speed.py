"""module_utils/plan_speed.py: the expected speed, its efficiency table and the
fleet's calibration loop (verify records, the planner reads), and the filters
that carry it between the stages."""
import json

import pytest

import paths
from conftest import ROOT

import ansible.module_utils
if str(ROOT / "module_utils") not in ansible.module_utils.__path__:
    ansible.module_utils.__path__.append(str(ROOT / "module_utils"))
from ansible.errors import AnsibleFilterError  # noqa: E402
from ansible.module_utils import plan_speed as ps  # noqa: E402

V100 = {"name": "Tesla V100-SXM2-32GB", "compute_capability": "7.0"}
H200 = {"name": "NVIDIA H200", "compute_capability": "9.0"}
DENSE = {"quant": "Q4_K_M", "layers": [{"kind": "full"}] * 4}
HYBRID = {"quant": "Q4_K_M", "layers": [{"kind": "full"}, {"kind": "recurrent"}, {"kind": "recurrent"}]}


def record(efficiency, gpu_name="Tesla V100-SXM2-32GB", family="volta", quant="Q4_K_M", arch="dense", host="h1",
           uuid="GPU-1", build="b1", exponent=None, parallel=4):
    return {"host": host, "gpu_uuid": uuid, "gpu_name": gpu_name, "gpu_family": family, "quant": quant,
            "quant_family": ps.quant_family(quant), "arch": arch, "efficiency": efficiency,
            "aggregate_exponent": exponent, "build": build, "parallel": parallel}


@pytest.mark.parametrize("cc,family", [("7.0", "volta"), ("9.0", "hopper"), ("8.6", "ampere"), ("7.5", "turing"),
                                       ("9.1", "hopper"), ("", "unknown"), ("x", "unknown")])
def test_gpu_family_follows_the_compute_capability(cc, family):
    assert ps.gpu_family({"compute_capability": cc}) == family


@pytest.mark.parametrize("quant,family", [("Q4_K_M", "Q4_K"), ("q4_k_s", "Q4_K"), ("Q3_K_S", "Q3_K"),
                                          ("Q3_K_L", "Q3_K"), ("Q8_0", "Q8_0"), ("IQ4_XS", "IQ4_XS"),
                                          ("F16", "F16"), ("Q2_K", "Q2_K"), (None, "unknown")])
def test_quant_family_groups_the_kernels(quant, family):
    assert ps.quant_family(quant) == family


def test_arch_kind():
    assert ps.arch_kind(DENSE) == "dense"
    assert ps.arch_kind(HYBRID) == "hybrid"
    assert ps.arch_kind({"layers": [{"kind": "full"}, {"kind": "swa"}]}) == "hybrid"


def test_table_default_and_their_sources():
    e = ps.efficiency_for(H200, {"quant": "Q3_K_M", "layers": DENSE["layers"]})
    assert e["from"] == "table" and e["value"] == 0.197 and "quant sweep" in e["source"]
    # a weight type the table lacks on a family it has: that family's Q4_K figure, said to be assumed
    e = ps.efficiency_for(V100, {"quant": "IQ4_XS", "layers": DENSE["layers"]})
    assert e["from"] == "table" and e["value"] == ps.EFFICIENCY_TABLE[("volta", "Q4_K", "*")][0]
    assert e["source"].startswith("assumed: the volta Q4_K figure (no measurement of IQ4_XS on volta cards")
    e = ps.efficiency_for(H200, {"quant": "IQ2_XS", "layers": HYBRID["layers"]})
    assert e["value"] == ps.EFFICIENCY_TABLE[("hopper", "Q4_K", "hybrid")][0]
    # a family the table lacks: the stated default
    e = ps.efficiency_for({"name": "NVIDIA A100-SXM4-80GB", "compute_capability": "8.0"}, DENSE)
    assert e["from"] == "default" and e["value"] == ps.DEFAULT_EFFICIENCY[0] and e["source"].startswith("assumed")
    # every table entry names where it comes from
    assert all(source for _, source in ps.EFFICIENCY_TABLE.values())


def test_the_fleet_figure_wins_over_the_table_and_says_so():
    cal = {"version": 1, "records": [record(0.40, uuid="a"), record(0.50, uuid="b"), record(0.45, uuid="c"),
                                     record(0.9, quant="Q8_0", uuid="d"), record(0.2, arch="hybrid", uuid="e")]}
    e = ps.efficiency_for(V100, DENSE, cal)
    assert e["from"] == "calibration" and e["value"] == 0.45  # the median of the three dense Q4_K figures
    assert "median of 3 measurement(s) on Tesla V100-SXM2-32GB" in e["source"]
    # another card of the same family borrows the family's figures
    e = ps.efficiency_for({"name": "Tesla V100-PCIE-16GB", "compute_capability": "7.0"}, DENSE, cal)
    assert e["from"] == "calibration" and "volta cards" in e["source"]
    # the hybrid figure only for a hybrid model
    assert ps.efficiency_for(V100, HYBRID, cal)["value"] == 0.2
    # another family does not borrow Volta's figures
    assert ps.efficiency_for(H200, DENSE, cal)["from"] == "table"


# The H100 run gpu-host-2026-12-06-models-b: two models of one 32B shape (64 and 6
# layers, Q4_K) served side by side through the roles, their weights, and what verify measured.
H100 = {"name": "NVIDIA H100 80GB HBM3", "compute_capability": "9.0", "memory_bandwidth_bytes_per_s": 3.35e12}
CHAT = dict(DENSE, gpu_weight_bytes=17995583488, params=32.8e9)
SMALL = dict(DENSE, gpu_weight_bytes=2083991552, params=3.8e9)
CHAT_CEILING, SMALL_CEILING, CHAT_TPS, SMALL_TPS = 175.8, 1534.5, 79.25, 533.07


def test_the_size_term_moves_a_figure_to_another_models_size():
    big_s, small_s = ps.weight_read_seconds(H100, CHAT), ps.weight_read_seconds(H100, SMALL)
    assert big_s == pytest.approx(17995583488 / 3.35e12)
    # the same size: unchanged; smaller: a lower share; back again: the figure it started from
    assert ps.at_size(0.45, big_s, big_s) == pytest.approx(0.45)
    down = ps.at_size(0.45, big_s, small_s)
    assert down < 0.45 and ps.at_size(down, small_s, big_s) == pytest.approx(0.45)
    # unknown sizes leave it as it is
    assert ps.at_size(0.45, None, small_s) == 0.45 and ps.at_size(0.45, big_s, None) == 0.45
    assert ps.weight_read_seconds({"name": "x"}, CHAT) is None


def test_a_calibration_of_one_size_predicts_another_closer_than_the_plain_median():
    # each model's record predicts the other one's speed: with the size term within 12%,
    # the plain ratio (what the planner used before) 23-30% off
    def rec(model, ceiling, tps):
        eff = ps.efficiency_for(H100, model)
        return dict(record(round(tps / ceiling, 3), gpu_name=H100["name"], family="hopper", uuid=str(tps)),
                    weight_read_s=eff["weight_read_s"], decode_ceiling_tps=ceiling)
    for known, other, ceiling, measured in ((rec(CHAT, CHAT_CEILING, CHAT_TPS), SMALL, SMALL_CEILING, SMALL_TPS),
                                            (rec(SMALL, SMALL_CEILING, SMALL_TPS), CHAT, CHAT_CEILING, CHAT_TPS)):
        e = ps.efficiency_for(H100, other, {"records": [known]})
        assert e["from"] == "calibration" and "at this model's size" in e["source"]
        assert abs(e["value"] * ceiling / measured - 1) < 0.12
        assert abs(known["efficiency"] * ceiling / measured - 1) > 0.23
    # an older record without weight_read_s moves by its ceiling's time
    old = dict(record(round(CHAT_TPS / CHAT_CEILING, 3), gpu_name=H100["name"], family="hopper"),
               decode_ceiling_tps=CHAT_CEILING)
    assert ps.efficiency_for(H100, SMALL, {"records": [old]})["value"] < old["efficiency"]


def test_a_table_figure_moves_from_the_size_it_was_measured_at():
    # Volta's Q4_0 figure was measured on a 7B (0.55): a 32B reaches a larger share; the
    # Q4_K figure (a 27B) barely moves for a 27B and falls for a 9B
    v100 = dict(V100, memory_bandwidth_bytes_per_s=9e11)
    q4_0 = ps.efficiency_for(v100, dict(DENSE, quant="Q4_0", params=32e9, gpu_weight_bytes=18e9))
    assert q4_0["value"] > 0.55 and "figure is for 6.74B" in q4_0["source"]
    assert ps.efficiency_for(v100, dict(DENSE, params=27e9, gpu_weight_bytes=16e9))["value"] == 0.60
    assert ps.efficiency_for(v100, dict(DENSE, params=9e9, gpu_weight_bytes=5.5e9))["value"] < 0.59


def test_implausible_records_are_ignored():
    cal = {"version": 1, "records": [record(0.0001), record("garbage"), record(7.0)]}
    assert ps.efficiency_for(V100, DENSE, cal)["from"] != "calibration"


def test_expected_speeds():
    assert ps.expected_decode(100.0, 0.4) == pytest.approx(40.0)
    assert ps.expected_decode(100.0, 0.4, "q8_0") == pytest.approx(37.6)
    assert ps.expected_aggregate(40.0, 1) == 40.0
    assert ps.expected_aggregate(40.0, 4, 0.5) == pytest.approx(80.0)
    cal = {"version": 1, "records": [record(0.4, exponent=0.7), record(0.4, exponent=0.5, uuid="b")]}
    # the fleet's figures at the slot count they were measured at (record(): 4 slots)
    assert ps.aggregate_exponent(V100, cal, "dense", 4) == 0.6
    assert ps.aggregate_exponent(V100, cal, "dense", 8) == ps.curve_exponent("dense", 8)
    assert ps.aggregate_exponent(H200, cal, "dense", 4) == ps.curve_exponent("dense", 4)
    # a hybrid batches worse: its own curve, and the fleet's dense figures do not count for it
    assert ps.aggregate_exponent(V100, cal, "hybrid", 4) == ps.curve_exponent("hybrid", 4) < 0.6


def test_the_aggregate_curve_goes_through_its_measured_points():
    """8 streams batch worst (the last slot count of llama.cpp's mat-vec kernel)."""
    for arch, points in ps.AGGREGATE_RATIO_BY_ARCH.items():
        for n, ratio in points[1:]:
            assert n ** ps.curve_exponent(arch, n) == pytest.approx(ratio, rel=0.005), (arch, n)
        assert ps.curve_exponent(arch, 8) < ps.curve_exponent(arch, 4)
    # between two points: log-log; past the last: its exponent
    assert 2.30 < 6 ** ps.curve_exponent("dense", 6) < 2.70
    assert ps.curve_exponent("dense", 32) == ps.curve_exponent("dense", 16)
    assert ps.curve_exponent("dense", 1) == ps.curve_exponent("dense", 2)


def test_every_hopper_weight_type_has_a_measured_hybrid_figure_below_the_dense_one():
    for quant in ("Q3_K", "Q4_K", "Q5_K", "Q6_K", "Q8_0"):
        hybrid = ps.EFFICIENCY_TABLE[("hopper", quant, "hybrid")][0]
        assert hybrid < ps.EFFICIENCY_TABLE[("hopper", quant, "*")][0], quant


def test_a_hybrid_has_its_own_efficiency_where_measured():
    e = ps.efficiency_for(H200, HYBRID)
    assert (e["value"], e["arch"], e["from"]) == (0.245, "hybrid", "table") and "hybrid" in e["source"]
    assert ps.efficiency_for(H200, DENSE)["value"] == 0.322


PLAN = {"gpu_name": "Tesla V100-SXM2-32GB", "quant": "Q4_K_M", "cache_type_k": "q8_0", "decode_ceiling_tps": 45.0,
        "partial_offload": False, "decode_efficiency": {"gpu_family": "volta", "quant_family": "Q4_K", "arch": "dense"}}
INSTANCE = {"gpu_index": 0, "gpu_uuid": "GPU-1", "gpu_name": "Tesla V100-SXM2-32GB", "ceiling_ratio": 0.376,
            "single_stream_tps": 16.9, "aggregate_slots_tps": 30.0, "parallel": 4,
            "levels": [{"concurrency": 1, "aggregate_decode_tps": 16.9}, {"concurrency": 4, "aggregate_decode_tps": 38.0}]}


def test_calibration_record_from_a_verify_measurement():
    rec, why = ps.calibration_record(INSTANCE, PLAN, "gpu01", "2026-12-01T00:00:00Z", "key")
    assert why is None
    # the q8_0 KV's cost is the KV's, not the GPU's: 0.376 / 0.94
    assert rec["efficiency"] == 0.4 and rec["quant_family"] == "Q4_K" and rec["arch"] == "dense"
    # from the decode aggregate (38), not all tokens over the wall time (30)
    assert rec["aggregate_exponent"] == pytest.approx(0.5844, abs=0.001)  # log(38 / 16.9) / log(4)
    assert rec["host"] == "gpu01" and rec["build"] == "key"


@pytest.mark.parametrize("instance,plan,why", [
    (dict(INSTANCE, ceiling_ratio=None, ceiling_note="not applicable: llama.cpp backend is cpu"), PLAN, "backend is cpu"),
    (INSTANCE, dict(PLAN, partial_offload=True), "partial offload"),
    (INSTANCE, dict(PLAN, decode_efficiency=None), "older llm-fleet"),
    (dict(INSTANCE, ceiling_ratio=0.0), PLAN, "a failed measurement"),
])
def test_no_calibration_record_without_a_gpu_figure(instance, plan, why):
    rec, reason = ps.calibration_record(instance, plan, "gpu01")
    assert rec is None and why in reason


def test_merge_replaces_per_card_and_keeps_a_close_figure():
    old = {"version": 1, "records": [dict(record(0.40), measured_at="t0"), dict(record(0.30, uuid="GPU-2"), measured_at="t0")]}
    # GPU-1 measured within 5%: the record stays as it was (measured_at too)
    merged = ps.merge_calibration(old, [dict(record(0.41), measured_at="t1")])
    assert merged == ps.merge_calibration(merged, [dict(record(0.41), measured_at="t2")])
    assert [r["measured_at"] for r in merged["records"]] == ["t0", "t0"]
    # a real change replaces it; the other card's record stays
    merged = ps.merge_calibration(old, [dict(record(0.50), measured_at="t1")])
    assert sorted((r["gpu_uuid"], r["efficiency"]) for r in merged["records"]) == [("GPU-1", 0.5), ("GPU-2", 0.3)]
    # another build of the same card is another record
    merged = ps.merge_calibration(old, [record(0.41, build="b2")])
    assert len(merged["records"]) == 3


def test_calibration_filters(tmp_path):
    calibration = paths.load_file("calibration_filters", "filter_plugins/calibration.py").FilterModule().filters()
    read, merge = calibration["llm_fleet_calibration"], calibration["llm_fleet_calibration_merge"]
    assert read("", "f") == {} and read(None, "f") == {}
    content = merge({}, [record(0.4)])
    assert read(json.dumps(content), "f") == content
    with pytest.raises(AnsibleFilterError, match="/x/cal.json is not JSON"):
        read("{not json", "/x/cal.json")
    with pytest.raises(AnsibleFilterError, match="not a calibration file of version 1"):
        read('{"records": {}}', "/x/cal.json")


def test_the_prompt_speed_scales_with_the_parameters_and_is_none_where_unknown():
    model = {"params": 32_000_000_000}
    volta = ps.expected_prefill(V100, model, 4096)
    assert volta["prompt_tps"] == pytest.approx(ps.PREFILL_RATE_TABLE["volta"][0] / 32, abs=0.1)
    assert volta["ttft_s"] == pytest.approx(4096 / volta["prompt_tps"], abs=0.01)
    half = ps.expected_prefill(V100, {"params": 16_000_000_000}, 4096)
    assert half["prompt_tps"] == pytest.approx(2 * volta["prompt_tps"], abs=0.2)
    ampere = ps.expected_prefill({"name": "NVIDIA A100-SXM4-80GB", "compute_capability": "8.0"}, model, 4096)
    assert ampere["prompt_tps"] is None and ampere["source"] == "no prompt-speed figure for ampere cards"
    assert ps.expected_prefill(V100, {"params": 0}, 4096)["source"] == "the model's parameter count is unknown"


def test_the_calibration_learns_the_prompt_speed_and_the_next_plan_uses_it():
    # verify's first-token prompt: 4096 tokens at 700 tok/s of a 27B model (the plan keeps its parameter count)
    plan = dict(PLAN, first_token={"prompt_tokens": 4096, "prompt_tps": 760.0, "params": 27_000_000_000})
    instance = dict(INSTANCE, first_token={"prompt_tokens": 4096, "prompt_tps": 700.0, "ttft_s": 5.9})
    rec, _ = ps.calibration_record(instance, plan, "gpu01")
    assert rec["prefill_rate"] == 18900.0 and rec["prefill_prompt_tokens"] == 4096  # 700 x 27
    # the next plan of a 13.5B model on a card of that name: twice the prompt speed, from the measurement
    model = {"params": 13_500_000_000}
    learned = ps.expected_prefill(V100, model, 4096, {"records": [rec]})
    assert learned["prompt_tps"] == 1400.0 and learned["ttft_s"] == pytest.approx(4096 / 1400.0, abs=0.01)
    assert "verify measured on Tesla V100-SXM2-32GB" in learned["source"] and "median of 1" in learned["source"]
    # another card's name keeps the table's figure; so does a record without a prompt figure
    assert ps.expected_prefill(dict(V100, name="Tesla V100-PCIE-16GB"), model, 4096, {"records": [rec]})[
        "source"] == ps.PREFILL_RATE_TABLE["volta"][1]
    without, _ = ps.calibration_record(INSTANCE, plan, "gpu01")
    assert without["prefill_rate"] is None
    assert ps.expected_prefill(V100, model, 4096, {"records": [without]})["source"] == ps.PREFILL_RATE_TABLE["volta"][1]
    # a family without a table figure is planned once it was measured
    a100 = {"name": "NVIDIA A100-SXM4-80GB", "compute_capability": "8.0"}
    rec_a100 = dict(rec, gpu_name=a100["name"])
    assert ps.expected_prefill(a100, model, 4096, {"records": [rec_a100]})["prompt_tps"] == 1400.0
    # a split's prompt speed is not one card's: no record from it
    split, _ = ps.calibration_record(instance, dict(plan, split_mode="layer"), "gpu01")
    assert split["prefill_rate"] is None


def test_a_changed_prompt_speed_replaces_the_record_and_a_close_one_keeps_it():
    old = dict(record(0.40), prefill_rate=18900.0, measured_at="t0")
    assert ps.merge_calibration({"records": [old]}, [dict(old, prefill_rate=19300.0, measured_at="t1")])[
        "records"][0]["measured_at"] == "t0"
    assert ps.merge_calibration({"records": [old]}, [dict(old, prefill_rate=23000.0, measured_at="t1")])[
        "records"][0]["measured_at"] == "t1"


def test_a_record_of_a_model_far_in_size_is_not_moved_to_this_one():
    # SmolLM2-135M (98 MB) served 598 tok/s on the H100 (0.034 of its ceiling with its KV): 0.03 ms of
    # weights in a 1.7 ms token. Moved by the size term it would plan the 32B at a seventh of its speed
    tiny_s = 98362432 / 3.35e12
    tiny = dict(record(0.034, gpu_name=H100["name"], family="hopper"), weight_read_s=tiny_s)
    assert ps.at_size(0.034, tiny_s, ps.weight_read_seconds(H100, CHAT)) < 0.07
    e = ps.efficiency_for(H100, CHAT, {"records": [tiny]})
    assert e["from"] == "table" and "1 record(s) of models more than 10x larger or smaller left out" in e["source"]
    # a model near its size uses it; so does the 6-layer model 8.7x smaller than the 32B
    near = ps.efficiency_for(H100, dict(DENSE, gpu_weight_bytes=150e6, params=0.2e9), {"records": [tiny]})
    assert near["from"] == "calibration" and "left out" not in near["source"]
    small = dict(record(round(SMALL_TPS / SMALL_CEILING, 3), gpu_name=H100["name"], family="hopper"),
                 weight_read_s=ps.weight_read_seconds(H100, SMALL))
    assert ps.efficiency_for(H100, CHAT, {"records": [small, tiny]})["from"] == "calibration"
    # the prompt rate too: a tiny model's is not a 32B's
    tiny_rate = dict(tiny, prefill_rate=3100.0)
    assert ps.expected_prefill(H100, CHAT, 4096, {"records": [tiny_rate]})["source"] == \
        ps.PREFILL_RATE_TABLE["hopper"][1]


def test_no_calibration_record_from_an_instance_serving_speculation():
    # a trial's speed and memory are the speculation's: the plan without it must not learn them
    rec, why = ps.calibration_record(dict(INSTANCE, spec_type="draft-simple"), dict(PLAN, spec_type="draft-simple"), "h")
    assert rec is None and "speculative decoding (draft-simple) served" in why
    assert ps.calibration_record(dict(INSTANCE, spec_type="none"), PLAN, "h")[0] is not None
