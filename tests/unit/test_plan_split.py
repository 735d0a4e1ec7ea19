"""module_utils/plan_split.py and the planner's choice between one instance per
GPU and one instance over the GPUs of a host (issue 18).

GPU facts come from the real nvidia_gpu_facts module over the mock NVML profiles;
models from synthetic GGUF headers (gguf_fixtures)."""
import pytest

from test_llama_plan import declared, dense_meta, gpus, models  # noqa: F401 (fixtures)

from ansible.module_utils import llama_plan as lp, plan_split, plan_memory, plan_model  # noqa: E402


def models_of(candidates):
    return [plan_model.model_from_metadata(c["quant"], c["metadata"], c["size_bytes"]) for c in candidates]


def test_layer_owners_follow_llama_cpp():
    # 64 layers + the output over two equal cards: il / 65 < 0.5 for il <= 32
    owners = plan_split.layer_owners(64, [0.5, 0.5])
    assert owners.count(0) == 33 and owners.count(1) == 32 and owners[-1] == 1
    assert plan_split.layer_owners(4, [3, 1]) == [0, 0, 0, 0, 1]


def test_nvlink_pair_is_joined_and_a_single_card_host_is_not_split(gpus):
    pair = gpus("2x-v100-sxm2-16gb-nvlink")
    assert plan_split.nvlink_joined(pair)
    unlinked = [dict(g, nvlink_peers=[]) for g in pair]
    assert not plan_split.nvlink_joined(unlinked)
    with pytest.raises(plan_memory.PlanError, match="at least two GPUs"):
        plan_split.split_group(pair[:1], "tensor")


@pytest.mark.parametrize("mode", ["layer", "tensor"])
def test_split_budget_places_every_byte_on_a_card(gpus, dense_meta, mode):
    pair = gpus("2x-v100-sxm2-16gb-nvlink")
    model = models_of(declared(dense_meta, ("Q4_K_M",)))[0]
    policy = lp.normalize_policy({})
    group = plan_split.split_group(pair, mode)
    memory = plan_split.budget(model, group, policy, 8192, 2, "f16")
    single = plan_split.budget(model, pair[0], policy, 8192, 2, "f16")
    per = memory["per_gpu"]
    assert [g["gpu_index"] for g in per] == [0, 1]
    # the weights and the KV are spread, not copied (tensor: rounding of each share)
    assert abs(sum(g["weights_bytes"] for g in per) - single["weights_bytes"]) <= 2
    assert abs(sum(g["kv_bytes"] for g in per) - single["kv_bytes"]) <= 2
    # every card pays its own CUDA context, reservation and headroom
    assert all(g["overhead_bytes"] == single["overhead_bytes"] for g in per)
    for g in per:
        assert g["total_bytes"] == sum(g[k] for k in ("weights_bytes", "kv_bytes", "compute_bytes",
                                                        "overhead_bytes", "headroom_bytes"))
        assert g["gpu_total_bytes"] == pair[0]["memory_total_bytes"]
    assert memory["total_bytes"] == sum(g["total_bytes"] for g in per)
    if mode == "layer":  # the last card holds the output layer and the logits
        assert per[1]["compute_bytes"] > per[0]["compute_bytes"]
    else:
        assert abs(per[0]["weights_bytes"] - per[1]["weights_bytes"]) <= 1


def test_fits_checks_each_card_not_the_sum(gpus, dense_meta):
    pair = gpus("2x-v100-sxm2-16gb-nvlink")
    model = models_of(declared(dense_meta, ("Q8_0",)))[0]
    policy = lp.normalize_policy({})
    memory = plan_split.budget(model, plan_split.split_group(pair, "layer"), policy, 4096, 1, "f16")
    lopsided = dict(memory, per_gpu=[dict(memory["per_gpu"][0], total_bytes=memory["per_gpu"][0]["gpu_total_bytes"] + 1),
                                     dict(memory["per_gpu"][1], total_bytes=0)])
    assert not plan_memory.fits(lopsided)


def test_tensor_split_is_faster_than_one_card_and_layer_split_is_not(gpus, dense_meta):
    pair = gpus("2x-v100-sxm2-16gb-nvlink")
    model = models_of(declared(dense_meta, ("Q4_K_M",)))[0]
    policy = lp.normalize_policy({})
    one = plan_split.ceiling_for(model, pair[0], policy, 4096, "f16")
    layer = plan_split.ceiling_for(model, plan_split.split_group(pair, "layer"), policy, 4096, "f16")
    tensor_group = plan_split.split_group(pair, "tensor")
    tensor = plan_split.ceiling_for(model, tensor_group, policy, 4096, "f16")
    assert layer == pytest.approx(one, rel=0.01)      # the cards take turns
    assert tensor == pytest.approx(2 * one, rel=0.01)  # both read at once
    # the expected speed pays the exchange: 64-layer-ish model over NVLink
    expected = lp.expected_for(model, tensor_group, tensor, 0.64, "f16")
    sync = model["n_layer"] * plan_split.TENSOR_SYNC_S_PER_LAYER["nvlink"]
    assert 1 / expected == pytest.approx(1 / (tensor * 0.64) + sync)
    pcie = dict(tensor_group, split=dict(tensor_group["split"], nvlink=False))
    assert lp.expected_for(model, pcie, tensor, 0.64, "f16") < expected


def test_sync_calibration_reproduces_the_h200_pair():
    # issue 18's table: 87 tok/s on one H200, 110.5 split by tensor over NV18, 64 layers
    group = {"split": {"mode": "tensor", "nvlink": True}}
    assert plan_split.with_sync(2 * 87.0, {"n_layer": 64}, group) == pytest.approx(110.5, rel=0.01)


def test_two_16gb_cards_split_for_a_better_quant(gpus, dense_meta):
    # a tensor split only where the policy lists it (EXPERIMENTAL at the pinned llama.cpp)
    facts = gpus("2x-v100-sxm2-16gb-nvlink")
    result = lp.plan_host(facts, models_of(declared(dense_meta)), {"split_modes": ["tensor", "layer"]})
    (p,) = result["plans"]
    assert p["split_mode"] == "tensor" and p["gpu_indices"] == [0, 1]
    assert p["gpu_uuids"] == [g["uuid"] for g in facts] and p["tensor_split"] == [0.5, 0.5]
    assert p["quant"] != "Q3_K_S" and p["expected_decode_tps"] >= 25
    assert [g["gpu_index"] for g in p["memory"]["per_gpu"]] == [0, 1]
    assert all(g["total_bytes"] <= g["gpu_total_bytes"] for g in p["memory"]["per_gpu"])
    assert "-sm" in p["server_args"] and "-ts" in p["server_args"]
    assert "better quant" in p["reason"] and "Q3_K_S" in p["reason"]
    assert "EXPERIMENTAL" in " ".join(result["warnings"])
    assert p["numa_node"] is None  # the profile puts the cards on nodes 0 and 1


def test_no_split_when_not_allowed_or_when_one_card_serves_as_well(gpus, dense_meta):
    facts = gpus("2x-v100-sxm2-16gb-nvlink")
    apart = lp.plan_host(facts, models_of(declared(dense_meta)), {"allow_split": False})
    assert [p["split_mode"] for p in apart["plans"]] == ["none", "none"]
    assert [p["gpu_indices"] for p in apart["plans"]] == [[0], [1]]
    # the same quant either way: two instances (twice the aggregate), and the reason says so
    small = lp.plan_host(facts, models_of(declared(dense_meta, ("Q3_K_S",))), {"min_decode_tps": 10})
    assert [p["split_mode"] for p in small["plans"]] == ["none", "none"]
    assert "one instance per GPU" in small["split"]
    assert any(line.startswith("host: one instance per GPU") for line in small["table"])


def test_prefer_split_takes_one_instance_for_the_same_quant(gpus, dense_meta):
    facts = gpus("2x-v100-sxm2-16gb-nvlink")
    result = lp.plan_host(facts, models_of(declared(dense_meta, ("Q3_K_S",))),
                          {"min_decode_tps": 10, "prefer_split": True, "split_modes": ["layer"]})
    (p,) = result["plans"]
    assert p["split_mode"] == "layer" and p["quant"] == "Q3_K_S" and "policy.prefer_split" in p["reason"]
    # the cards' memory together: more context than one card gives
    alone = lp.plan_host(facts, models_of(declared(dense_meta, ("Q3_K_S",))),
                         {"min_decode_tps": 10, "allow_split": False, "target_ctx": 131072, "target_parallel": 1})
    split = lp.plan_host(facts, models_of(declared(dense_meta, ("Q3_K_S",))),
                         {"min_decode_tps": 10, "prefer_split": True, "split_modes": ["layer"],
                          "target_ctx": 131072, "target_parallel": 1})
    assert split["plans"][0]["ctx_size"] > alone["plans"][0]["ctx_size"]


def test_a_model_only_two_cards_hold_is_split_and_layer_mode_when_asked(gpus, dense_meta):
    facts = gpus("2x-v100-sxm2-16gb-nvlink")
    big = models_of(declared(dense_meta, ("Q5_K_M",)))
    with pytest.raises(plan_memory.PlanError):
        lp.plan_host(facts, big, {"allow_split": False})
    result = lp.plan_host(facts, big, {"split_modes": ["layer"]})
    (p,) = result["plans"]
    assert p["split_mode"] == "layer" and p["quant"] == "Q5_K_M"
    assert "No candidate fits one GPU alone" in p["reason"]


def test_split_modes_are_checked():
    with pytest.raises(plan_memory.PlanError, match="split_modes"):
        lp.normalize_policy({"split_modes": ["row"]})
    assert lp.normalize_policy({"split_modes": "layer"})["split_modes"] == ["layer"]



def test_by_default_two_v100s_split_by_layer_with_a_wider_margin_and_say_it_is_unmeasured(gpus, dense_meta):
    # the tensor split is EXPERIMENTAL at the pinned llama.cpp: not planned unless listed
    facts = gpus("2x-v100-sxm2-16gb-nvlink")
    (p,) = lp.plan_host(facts, models_of(declared(dense_meta)), {})["plans"]
    assert p["split_mode"] == "layer" and p["quant"] == "Q4_K_M" and p["expected_decode_tps"] >= 25
    # every card keeps the split's extra margin above the single-card headroom
    for card in p["memory"]["per_gpu"]:
        assert card["headroom_bytes"] == lp.DEFAULT_POLICY["headroom_bytes"] + plan_split.SPLIT_CARD_MARGIN_BYTES
        assert card["total_bytes"] <= card["gpu_total_bytes"]
        assert card["predicted_used_bytes"] == card["total_bytes"] - card["headroom_bytes"]
    assert any("a layer split is unmeasured on volta cards" in w for w in p["warnings"])
    assert not any("EXPERIMENTAL" in w for w in p["warnings"])
