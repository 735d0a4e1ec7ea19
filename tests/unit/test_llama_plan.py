"""library/llama_plan.py and module_utils/llama_plan.py.

GPU facts come from the real nvidia_gpu_facts module over the mock NVML profiles;
models from synthetic GGUF headers (gguf_fixtures). Expected figures are worked out
by hand in each test from the shapes and from docs/planning.md's constants."""
import copy

import pytest

from conftest import ROOT, run_module

import gguf_fixtures

import ansible.module_utils
if str(ROOT / "module_utils") not in ansible.module_utils.__path__:
    ansible.module_utils.__path__.append(str(ROOT / "module_utils"))
from ansible.module_utils import gguf_model, llama_plan as lp, plan_memory, plan_model, plan_speed, plan_split  # noqa: E402

MIB, GIB = 1 << 20, 1 << 30
V100_BW = 4096 // 8 * 877 * 2 * 10 ** 6          # 898.048 GB/s
FACTS_BPW = {"Q3_K_S": 3.64, "Q4_K_M": 4.89, "Q5_K_M": 5.70, "Q6_K": 6.56, "Q8_0": 8.50}
# The 5 keys whose sum is total_bytes.
PARTS = ("weights_bytes", "kv_bytes", "compute_bytes", "overhead_bytes", "headroom_bytes", "foreign_bytes")


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    return gguf_fixtures.write_all(tmp_path_factory.mktemp("gguf"))


@pytest.fixture(scope="module")
def dense_meta(models):
    return gguf_model.read_model(str(models["dense_q4km"]))


@pytest.fixture(scope="module")
def hybrid_meta(models):
    return gguf_model.read_model(str(models["hybrid_q4km"]))


@pytest.fixture(scope="module")
def gemma_meta(models):
    return gguf_model.read_model(str(models["gemma3_q4km"]))


@pytest.fixture
def gpus(gpu_host):
    def read(profile):
        result = run_module("nvidia_gpu_facts", env=gpu_host(profile))
        return result["ansible_facts"]["nvidia_gpus"]
    return read


def declared(meta, quants=("Q3_K_S", "Q4_K_M", "Q5_K_M", "Q6_K", "Q8_0")):
    """Candidates declared before download: size = parameters x FACTS bits per weight / 8."""
    return [{"quant": q, "size_bytes": int(meta["parameter_count"] * FACTS_BPW[q] / 8), "metadata": meta}
            for q in quants]


def plan(gpus, candidates, policy=None):
    result = run_module("llama_plan", {"gpus": gpus, "candidates": candidates, "policy": policy or {}})
    assert not result.get("failed"), result.get("msg")
    assert result["changed"] is False
    return result


def check_plan(p, meta, policy=None):
    """Invariants every plan keeps."""
    pol = dict(lp.DEFAULT_POLICY, **(policy or {}))
    m = p["memory"]
    assert m["total_bytes"] == sum(m[k] for k in PARTS)
    assert m["total_bytes"] <= m["gpu_total_bytes"]
    assert m["kv_bytes"] == m["kv_full_attention_bytes"] + m["kv_sliding_window_bytes"] + m["recurrent_state_bytes"]
    assert m["overhead_bytes"] == m["overhead_cuda_bytes"] + m["overhead_driver_reserved_bytes"]
    assert m["predicted_used_bytes"] == m["total_bytes"] - m["headroom_bytes"]
    assert p["ctx_size"] % p["parallel"] == 0 and p["ctx_size"] // p["parallel"] == p["ctx_per_slot"]
    assert p["ctx_per_slot"] % 256 == 0
    assert pol["min_ctx"] <= p["ctx_per_slot"] <= meta["context_length"]
    assert p["ctx_size"] <= pol["target_ctx"]
    assert pol["min_parallel"] <= p["parallel"] <= pol["target_parallel"]
    assert p["cache_type_k"] == p["cache_type_v"] in pol["cache_types"]
    # the full-attention KV is exactly the formula for the whole -c
    assert m["kv_full_attention_bytes"] == p["ctx_size"] * meta["kv_bytes_per_token"][p["cache_type_k"]]
    assert p["reason"] and isinstance(p["reason"], str)
    assert p["server_args"][p["server_args"].index("-c") + 1] == str(p["ctx_size"])


# --- the mock profiles --------------------------------------------------------------

def test_v100_32gb_lands_on_q4_k_m(gpus, dense_meta):
    result = plan(gpus("v100-sxm2-32gb"), declared(dense_meta))
    p, = result["plans"]
    check_plan(p, dense_meta)
    assert p["quant"] == "Q4_K_M"
    assert (p["ctx_size"], p["parallel"], p["cache_type_k"]) == (32768, 4, "f16")
    assert p["n_gpu_layers"] == 65 and p["partial_offload"] is False
    assert p["flash_attn"] is True and p["threads"] == 20 and p["numa_node"] == 0
    assert p["gpu_uuid"] == "GPU-4f6a1c2e-8b3d-4e55-9a71-2c0d93b5e7a4" and p["gpu_index"] == 0
    assert p["candidate_index"] == 1
    # Q5_K_M fits but is expected below the floor (it reads too much per token); Q8_0 does not fit.
    verdicts = dict((c["quant"], c["verdict"]) for c in p["candidates"])
    assert "below the 25 tok/s floor" in verdicts["Q5_K_M"] and "below" in verdicts["Q6_K"]
    assert "more than the card" in verdicts["Q8_0"]
    assert "expected 18.9 tok/s (ceiling 59.5) below the 25 tok/s floor" == verdicts["Q3_K_S"]
    assert "Q5_K_M (expected" in p["reason"] and "f16 KV reaches it" in p["reason"]
    assert 40 <= p["decode_ceiling_tps"] < 50
    # expected = ceiling x Volta's Q4_K efficiency (the table: public V100 figures)
    eff = p["decode_efficiency"]
    assert (eff["gpu_family"], eff["quant_family"], eff["arch"], eff["from"]) == ("volta", "Q4_K", "dense", "table")
    assert p["expected_decode_tps"] == pytest.approx(p["decode_ceiling_tps"] * 0.60, abs=0.1)
    assert p["expected_aggregate_tps"] == pytest.approx(p["expected_decode_tps"] * 2.30, abs=0.2)  # the curve at 4
    assert "expected %.1f tok/s single-stream (efficiency 0.60 for volta Q4_K dense" % p["expected_decode_tps"] \
        in p["reason"]
    assert any("plan: Q4_K_M -c 32768 -np 4" in line for line in result["table"])


def test_memory_another_program_holds_is_planned_around(gpus, dense_meta):
    """Foreign-process policy plan_around (llm_model_gpus sets memory_foreign_bytes): the
    32 GB card with 8 GiB taken plans in what is left and says so; the process's own
    figure leaves the other program's memory out, the card's used memory counts it."""
    card = dict(gpus("v100-sxm2-32gb")[0], memory_foreign_bytes=8 << 30)
    whole, = plan(gpus("v100-sxm2-32gb"), declared(dense_meta))["plans"]
    p, = plan([card], declared(dense_meta))["plans"]
    check_plan(p, dense_meta)
    m = p["memory"]
    assert m["foreign_bytes"] == 8 << 30 and whole["memory"]["foreign_bytes"] == 0
    assert m["total_bytes"] <= m["gpu_total_bytes"]
    assert m["predicted_process_bytes"] == m["predicted_used_bytes"] - m["overhead_driver_reserved_bytes"] - (8 << 30)
    # less room: a smaller plan (quant, context or KV type) than the whole card's
    assert (p["quant"], p["ctx_size"], p["cache_type_k"]) != (whole["quant"], whole["ctx_size"], whole["cache_type_k"])
    assert any("GPU 0: planned around 8.00 GiB that other processes hold" in w for w in p["warnings"])


@pytest.mark.parametrize("profile, numa", [("v100-sxm2-16gb", 0), ("v100-pcie-16gb", 1)])
def test_v100_16gb_lands_on_q3_k_s(gpus, dense_meta, profile, numa):
    p, = plan(gpus(profile), declared(dense_meta))["plans"]
    check_plan(p, dense_meta)
    assert p["quant"] == "Q3_K_S"
    assert p["numa_node"] == numa and p["threads"] == 20
    # f16 cannot hold even one slot of 4096 tokens next to 13.5 GiB of weights: q8_0
    assert p["cache_type_k"] == "q8_0"
    assert p["parallel"] == 1 and 4096 <= p["ctx_size"] < 8192
    assert "Q4_K_M (needs" in p["reason"]


def test_v100_16gb_with_the_real_q3_k_s_file_gets_two_slots(gpus, models, dense_meta):
    """The real Q3_K_S file (14.39 GB, 3.51 bits/weight for this shape) leaves room for two slots."""
    cands = [{"path": str(models["dense_q3ks"])}] + declared(dense_meta, ("Q4_K_M",))
    p, = plan(gpus("v100-sxm2-16gb"), cands)["plans"]
    check_plan(p, dense_meta)
    assert p["quant"] == "Q3_K_S" and p["model_path"] == str(models["dense_q3ks"])
    assert p["parallel"] == 2 and p["cache_type_k"] == "q8_0"
    weights = gguf_model.read_model(str(models["dense_q3ks"]))
    assert p["memory"]["weights_bytes"] == weights["weight_bytes"] - weights["token_embd_bytes"]


def test_two_16gb_gpus_with_nvlink_get_a_plan_each(gpus, dense_meta):
    # (by default this pair splits a better quant over both cards: test_plan_split.py)
    facts = gpus("2x-v100-sxm2-16gb-nvlink")
    result = plan(facts, declared(dense_meta), {"allow_split": False})
    assert [p["gpu_index"] for p in result["plans"]] == [0, 1]
    assert [p["gpu_uuid"] for p in result["plans"]] == [g["uuid"] for g in facts]
    assert [p["numa_node"] for p in result["plans"]] == [0, 1]
    for p in result["plans"]:
        check_plan(p, dense_meta)
        assert p["quant"] == "Q3_K_S" and p["threads"] == 20
    assert len(result["summary"].splitlines()) == 2
    assert sum(1 for line in result["table"] if line.startswith("GPU ")) == 2


def test_t4_fails_with_the_budget_table(gpus, dense_meta):
    result = run_module("llama_plan", {"gpus": gpus("t4"), "candidates": declared(dense_meta)})
    assert result["failed"]
    msg = result["msg"]
    assert "No candidate fits GPU 0 (Tesla T4" in msg
    assert "The smallest, Q3_K_S" in msg
    assert "quant" in msg and "headroom" in msg and "smallest candidate" in msg  # the table
    assert "allow_partial_offload" in msg and "smaller quantization" in msg


def test_partial_offload_only_when_allowed(gpus, dense_meta):
    result = plan(gpus("t4"), declared(dense_meta), {"allow_partial_offload": True})
    p, = result["plans"]
    assert p["partial_offload"] is True
    assert 0 < p["n_gpu_layers"] <= 64
    assert p["memory"]["total_bytes"] <= p["memory"]["gpu_total_bytes"]
    assert p["flash_attn"] is True  # Turing, 7.5
    assert any("host memory" in w for w in result["plan_warnings"])
    # a card the model fits never gets a partial plan, allowed or not
    full, = plan(gpus("v100-sxm2-32gb"), declared(dense_meta), {"allow_partial_offload": True})["plans"]
    assert full["partial_offload"] is False and full["n_gpu_layers"] == 65


def test_hybrid_model_affords_a_better_quant_and_more_context(gpus, dense_meta, hybrid_meta):
    big, = plan(gpus("v100-sxm2-32gb"), declared(hybrid_meta))["plans"]
    check_plan(big, hybrid_meta)
    assert plan_model.QUANT_BPW[big["quant"]] > plan_model.QUANT_BPW["Q4_K_M"]
    assert big["quant"] == "Q6_K"
    small, = plan(gpus("v100-sxm2-16gb"), declared(hybrid_meta))["plans"]
    dense_small, = plan(gpus("v100-sxm2-16gb"), declared(dense_meta))["plans"]
    check_plan(small, hybrid_meta)
    assert small["ctx_size"] > dense_small["ctx_size"] and small["parallel"] > dense_small["parallel"]
    assert (small["ctx_size"], small["parallel"], small["cache_type_k"]) == (32768, 4, "f16")
    # the 48 linear-attention layers cost a fixed state per slot, counted in kv_bytes
    assert small["memory"]["recurrent_state_bytes"] == 4 * 156893184


def test_gemma3_sliding_window_cache_is_per_slot(gpus, gemma_meta):
    p, = plan(gpus("v100-sxm2-32gb"), declared(gemma_meta))["plans"]
    check_plan(p, gemma_meta)
    cells = min(p["ctx_per_slot"], 1024 + 512)  # window + ubatch, padded to 256: 1536
    assert p["memory"]["kv_sliding_window_bytes"] == \
        p["parallel"] * cells * gemma_meta["swa_kv_bytes_per_token"][p["cache_type_k"]]
    # tied embeddings: the output layer's copy stays on the GPU, so all weights count
    assert p["memory"]["weights_bytes"] == int(gemma_meta["parameter_count"] * FACTS_BPW[p["quant"]] / 8)


def test_local_files_use_their_real_sizes(gpus, models, dense_meta):
    cands = [{"path": str(models["dense_q3ks"])}, {"quant": "Q4_K_M", "path": str(models["dense_q4km"])}]
    p, = plan(gpus("v100-sxm2-32gb"), cands)["plans"]
    check_plan(p, dense_meta)
    assert p["quant"] == "Q4_K_M" and p["model_path"] == str(models["dense_q4km"])
    assert p["memory"]["weights_bytes"] == dense_meta["weight_bytes"] - 437944320
    assert p["server_args"][:2] == ["-m", str(models["dense_q4km"])]


def test_a_split_model_is_one_candidate(gpus, models, dense_meta):
    p, = plan(gpus("v100-sxm2-32gb"), [{"path": str(models["split_files"][1])}])["plans"]
    check_plan(p, dense_meta)
    assert p["model_path"] == str(models["split_files"][0]) and p["quant"] == "Q4_K_M"
    assert p["memory"]["weights_bytes"] == dense_meta["weight_bytes"] - 437944320


def test_a_path_candidate_uses_its_file_even_if_mislabelled(gpus, models, dense_meta):
    result = plan(gpus("v100-sxm2-32gb"), [{"quant": "Q5_K_M", "path": str(models["dense_q4km"])}])
    p, = result["plans"]
    assert p["memory"]["weights_bytes"] == dense_meta["weight_bytes"] - 437944320
    assert any("says Q4_K_M" in w for w in result["plan_warnings"])


def test_odd_minimums_are_rounded_to_whole_cells(gpus, dense_meta):
    p, = plan(gpus("v100-sxm2-32gb"), declared(dense_meta), {"min_ctx": 4000, "target_ctx": 4000,
                                                              "target_parallel": 1})["plans"]
    assert (p["parallel"], p["ctx_size"]) == (1, 4096)


def test_a_declared_candidate_whose_file_is_absent_keeps_its_path(gpus, dense_meta, tmp_path):
    target = str(tmp_path / "later-Q4_K_M.gguf")
    cand = dict(declared(dense_meta, ("Q4_K_M",))[0], path=target, url="https://example.invalid/q4.gguf")
    p, = plan(gpus("v100-sxm2-32gb"), [cand])["plans"]
    assert p["model_path"] == target and p["candidate"]["url"].endswith("q4.gguf")
    assert "metadata" not in p["candidate"]


def test_check_mode(gpus, dense_meta):
    args = {"gpus": gpus("v100-sxm2-32gb"), "candidates": declared(dense_meta), "_ansible_check_mode": True}
    result = run_module("llama_plan", args)
    assert not result.get("failed") and result["plans"][0]["quant"] == "Q4_K_M"


@pytest.mark.parametrize("policy, words", [
    ({"target_paralel": 2}, ["unknown policy key", "target_paralel"]),
    ({"cache_types": ["q5_1"]}, ["cache_types", "q5_1"]),
    ({"min_parallel": 3, "target_parallel": 2}, ["target_parallel (2)", "min_parallel (3)"]),
    ({"min_ctx": 16384, "target_ctx": 8192}, ["target_ctx (8192"]),
])
def test_bad_policy_is_named(gpus, dense_meta, policy, words):
    result = run_module("llama_plan", {"gpus": gpus("v100-sxm2-32gb"), "candidates": declared(dense_meta),
                                       "policy": policy})
    assert result["failed"]
    for word in words:
        assert word in result["msg"]


def test_bad_candidates_are_named(gpus, tmp_path):
    g = gpus("v100-sxm2-32gb")
    r = run_module("llama_plan", {"gpus": g, "candidates": [{"path": str(tmp_path / "nope.gguf")}]})
    assert r["failed"] and "nope.gguf does not exist" in r["msg"]
    r = run_module("llama_plan", {"gpus": g, "candidates": [{"quant": "Q4_K_M"}]})
    assert r["failed"] and "candidates[0] (Q4_K_M) has neither path nor metadata" in r["msg"]
    r = run_module("llama_plan", {"gpus": [], "candidates": [{"quant": "Q4_K_M"}]})
    assert r["failed"]


# --- policy knobs ------------------------------------------------------------------

def test_targets_and_cache_preference(gpus, dense_meta):
    g = gpus("v100-sxm2-32gb")
    # f16 cannot hold 4 x 16384 next to Q4_K_M; q8_0 can: the context needs q8_0
    p, = plan(g, declared(dense_meta), {"target_ctx": 65536})["plans"]
    check_plan(p, dense_meta, {"target_ctx": 65536})
    assert p["quant"] == "Q4_K_M" and p["parallel"] == 4
    assert p["cache_type_k"] == "q8_0" and p["ctx_size"] == 65536
    # f16 only: as much as f16 allows, short of the target
    p, = plan(g, declared(dense_meta), {"target_ctx": 65536, "cache_types": ["f16"]})["plans"]
    assert p["cache_type_k"] == "f16" and 32768 < p["ctx_size"] < 65536
    assert "short of the 65536-token target" in p["reason"]
    # one slot: -c is all one slot's, capped at the trained context (32768)
    p, = plan(g, declared(dense_meta), {"target_ctx": 131072, "target_parallel": 1})["plans"]
    assert (p["parallel"], p["ctx_size"]) == (1, 32768)
    assert "trained context" in p["reason"]


def test_types_volta_has_no_figure_for_plan_at_its_own_q4_k_figure(gpus, dense_meta):
    # Q4_0, IQ4_XS and IQ3_M files of a 32B model on a 32 GB V100: IQ types take Volta's
    # Q4_K figure (assumed, and said so), Q4_0 its own; the best quality that meets the
    # floor is served, not IQ3_M (which the H200's figure for every unknown type chose).
    # Each figure moved to this 32B's size: Q4_0's was measured on a 7B, Q4_K's on a 27B.
    candidates = [{"quant": q, "size_bytes": int(dense_meta["parameter_count"] * plan_model.quant_bpw(q) / 8),
                   "metadata": dense_meta} for q in ("Q4_0", "IQ4_XS", "IQ3_M")]
    p, = plan(gpus("v100-sxm2-32gb"), candidates)["plans"]
    efficiency = dict((c["quant"], c["decode_efficiency"]) for c in p["candidates"])
    assert efficiency == {"Q4_0": 0.573, "IQ4_XS": 0.602, "IQ3_M": 0.602}
    assert p["quant"] == "Q4_0" and p["expected_decode_tps"] >= 25


def test_floor_nobody_meets_picks_the_fastest_expected(gpus, dense_meta):
    result = plan(gpus("v100-sxm2-32gb"), declared(dense_meta), {"min_decode_tps": 500})
    p, = result["plans"]
    # Q3_K_S has the highest ceiling (fewest bytes), but Volta decodes Q3_K at about 0.32
    # of its ceiling and Q4_K at 0.60: Q4_K_M is the fastest expected
    by_quant = dict((c["quant"], c) for c in p["candidates"])
    assert by_quant["Q3_K_S"]["decode_ceiling_tps"] > by_quant["Q4_K_M"]["decode_ceiling_tps"]
    assert by_quant["Q3_K_S"]["expected_decode_tps"] < by_quant["Q4_K_M"]["expected_decode_tps"]
    assert p["quant"] == "Q4_K_M"
    assert any("500 tok/s" in w and "expected" in w for w in p["warnings"])


def test_the_fleet_calibration_changes_the_choice_and_says_so(gpus, dense_meta):
    # this fleet measured its 32 GB V100s decoding Q5_K at 0.70 of the ceiling:
    # Q5_K_M is then expected above the floor and, better quality, chosen
    record = {"host": "gpu07", "gpu_uuid": "GPU-x", "gpu_name": "Tesla V100-SXM2-32GB", "gpu_family": "volta",
              "quant": "Q5_K_M", "quant_family": "Q5_K", "arch": "dense", "efficiency": 0.70, "build": "b"}
    result = run_module("llama_plan", {"gpus": gpus("v100-sxm2-32gb"), "candidates": declared(dense_meta),
                                       "calibration": {"version": 1, "records": [record]}})
    p, = result["plans"]
    assert p["quant"] == "Q5_K_M"
    assert p["decode_efficiency"]["from"] == "calibration" and p["decode_efficiency"]["value"] == 0.7
    assert "fleet calibration: median of 1 measurement(s) on Tesla V100-SXM2-32GB" in p["reason"]


def test_cards_without_flash_attention_plan_f16_only(dense_meta):
    pascal = {"index": 0, "name": "Tesla P100-PCIE-16GB", "uuid": "GPU-p100", "memory_total_bytes": 16 * GIB,
              "memory_bandwidth_bytes_per_s": 732 * 10 ** 9, "compute_capability": "6.0", "numa_node": 0,
              "cpu_affinity": list(range(8))}
    models = [plan_model.model_from_metadata(c["quant"], c["metadata"], c["size_bytes"]) for c in declared(dense_meta)]
    with pytest.raises(plan_memory.PlanError) as err:
        lp.plan_host([pascal], models, {})
    assert "No candidate fits" in str(err.value)
    result = lp.plan_host([pascal], models, {"min_ctx": 1024, "target_ctx": 4096, "min_decode_tps": 10})
    p, = result["plans"]
    assert p["flash_attn"] is False and p["cache_type_k"] == "f16"
    assert any("without flash attention" in w for w in result["warnings"])


# --- the arithmetic helpers, against hand figures ---------------------------------------

@pytest.fixture(scope="module")
def dense(dense_meta):
    return plan_model.model_from_metadata("Q4_K_M", dense_meta)


def test_kv_cache_bytes(dense):
    # FACTS: f16, 32768 tokens of the 32B shape = 8192 MiB
    assert plan_memory.cache_bytes(dense, 32768, 4, "f16", 512) == {"full": 8192 * MIB, "swa": 0, "recurrent": 0,
                                                          "total": 8192 * MIB}
    assert plan_memory.cache_bytes(dense, 16384, 1, "q8_0", 512)["total"] == 16384 * 139264
    assert plan_memory.kv_bytes_per_token(dense, "q4_0") == (73728, 0)


def test_compute_buffer_is_calibrated_on_the_32b_shape(dense):
    # 512 x 4 bytes x (152064 vocab + 5120 embedding) = 307 MiB, the H200 measurement
    assert plan_memory.compute_bytes(dense, 512, 4096) == 512 * 4 * (152064 + 5120) == 307 * MIB
    assert plan_memory.compute_bytes(dense, 256, 4096) == 256 * 4 * (152064 + 5120)
    # without flash attention the scores of a long slot dominate: 2 x 512 x 32768 x 40 heads x 4 + f32 mask
    assert plan_memory.compute_bytes(dense, 512, 32768, flash_attn=False) == 2 * 512 * 32768 * 40 * 4 + 512 * 32768 * 4
    # FFN-heavy shape with a small vocabulary: 512 x 4 x (3 x 28672 + 2 x 8192) + the f16 mask of flash attention
    llama70 = dict(dense, n_vocab=32000, n_embd=8192, n_ff=28672)
    assert plan_memory.compute_bytes(llama70, 512, 4096) == 512 * 4 * (3 * 28672 + 2 * 8192) + 512 * 4096 * 2


# llama-fit-params' CUDA0 "compute" MiB on an H200, the pinned llama.cpp, -fa on -b 2048 -ub 512
# (benchmarks/results/h200-expected-2026-12-01 and h200-hybrid-2026-12-01, bench-h200*.json):
# (-c, -np, KV type, kv_unified, MiB). The fit-params runs pass -np (one KV stream per slot); the
# dense "defaults" row is llama-server's own default (-np auto: unified), the same 307 MiB either way.
H200_COMPUTE_DENSE = [
    (32768, 4, "f16", True, 307),     # defaults
    (4096, 1, "q8_0", False, 307),    # seed003
    (32768, 8, "q8_0", False, 307),   # seed000
    (32768, 4, "f16", False, 307),    # plan
    (131072, 8, "q8_0", False, 568),  # long_q8: + f16 copies of one layer's q8_0 K and V, 2 x 256 MiB
    (65536, 16, "q4_0", False, 307),  # many_q4: the copies (2 x 128 MiB) stay under the logits
    (262144, 8, "f16", False, 307),   # big_f16: an f16 cache is read as it is
]
H200_COMPUTE_HYBRID = [
    (262144, 4, "f16", False, 579),   # defaults (fit-params with -np 4)
    (32768, 4, "f16", False, 513),    # plan
    (131072, 8, "q8_0", False, 608),  # long_q8
    (65536, 16, "f16", False, 509),   # many
]


@pytest.mark.parametrize("ctx, parallel, cache_type, unified, mib", H200_COMPUTE_DENSE)
def test_compute_buffer_h200_dense(dense, ctx, parallel, cache_type, unified, mib):
    got = plan_memory.compute_bytes(dense, 512, ctx // parallel, True, cache_type, parallel, kv_unified=unified)
    assert abs(got / (mib * MIB) - 1) < 0.05


@pytest.mark.parametrize("ctx, parallel, cache_type, unified, mib", H200_COMPUTE_HYBRID)
def test_compute_buffer_h200_hybrid(hybrid_meta, ctx, parallel, cache_type, unified, mib):
    hybrid = plan_model.model_from_metadata("Q4_K_M", hybrid_meta)
    got = plan_memory.compute_bytes(hybrid, 512, ctx // parallel, True, cache_type, parallel, kv_unified=unified)
    assert abs(got / (mib * MIB) - 1) < 0.05


def test_compute_buffer_terms(dense, hybrid_meta):
    """Each term by hand (plan_memory.compute_bytes), 512-token ubatch, flash attention."""
    e = 512 * 4                                           # one f32 value per ubatch token
    # q8_0, 16384 cells a slot, 8 slots: mask 16384 x 512 x 2 + residual, norm hole, query, output
    # (2 x 5120 + 2 x 40 x 128) + f16 K and V of one layer over all 8 streams (2 x 2 x 1024 x 131072)
    assert plan_memory.compute_bytes(dense, 512, 16384, True, "q8_0", 8) == \
        16384 * 512 * 2 + e * (2 * 5120 + 2 * 5120) + 2 * 2 * 1024 * 131072 == 568 * MIB
    # the copies cover the whole -c, not the slot: one slot of 131072 costs the same
    assert plan_memory.compute_bytes(dense, 512, 131072, True, "q8_0", 1) == \
        131072 * 512 * 2 + e * 4 * 5120 + 2 * 2 * 1024 * 131072
    # an f16 cache is read in place: the logits stay the peak
    assert plan_memory.compute_bytes(dense, 512, 16384, True, "f16", 8) == 307 * MIB
    # unified: one stream, the mask spans every cell (8 x 16384)
    assert plan_memory.compute_bytes(dense, 512, 16384, True, "q8_0", 8, kv_unified=True) == \
        131072 * 512 * 2 + e * 4 * 5120 + 2 * 2 * 1024 * 131072
    hybrid = plan_model.model_from_metadata("Q4_K_M", hybrid_meta)
    assert hybrid["q_values"] == 24 * 256
    # hybrid: logits (248320) above the mask and two embedding-wide tensors
    assert plan_memory.compute_bytes(hybrid, 512, 8192, True, "f16", 4) == e * (248320 + 2 * 5120) + 8192 * 512 * 2
    # gated query: 2 x 5120 + 5 x 6144 live beside the attention; 4 KV heads x 256, K and V, whole -c
    assert plan_memory.compute_bytes(hybrid, 512, 16384, True, "q8_0", 8) == \
        16384 * 512 * 2 + e * (2 * 5120 + 5 * 6144) + 2 * 2 * 1024 * 131072 == 608 * MIB


def test_budget_passes_the_cache_type_to_the_compute_buffer(dense):
    h200 = {"memory_total_bytes": 143771 * MIB, "compute_capability": "9.0", "memory_reserved_bytes": 615 * MIB}
    policy = lp.normalize_policy({})
    assert plan_split.budget(dense, h200, policy, 131072, 8, "q8_0")["compute_bytes"] == 568 * MIB
    assert plan_split.budget(dense, h200, policy, 131072, 8, "f16")["compute_bytes"] == 307 * MIB


def test_weights_on_gpu_leave_the_embeddings_in_host_memory(dense, dense_meta):
    # FACTS: the GPU holds 17160 of 17578 MiB; here the same 417 MiB table stays behind
    assert dense["gpu_weight_bytes"] == dense_meta["weight_bytes"] - 152064 * 5120 // 256 * 144
    # declared at another quantization: the table is estimated at that quant's bits
    q8 = plan_model.model_from_metadata("Q8_0", dense_meta, size_bytes=34 * 10 ** 9)
    assert q8["token_embd_bytes"] == int(152064 * 5120 * 8.5 / 8)
    assert q8["gpu_weight_bytes"] == 34 * 10 ** 9 - int(152064 * 5120 * 8.5 / 8)


def test_decode_ceiling():
    # FACTS: 4181 GB/s over an 18.43 GB model: ~227 tok/s
    assert round(plan_memory.decode_ceiling(4181e9, 18.43e9)) == 227
    assert plan_memory.decode_ceiling(100.0, 50, 10, host_bandwidth=10) == 1 / (0.5 + 1.0)


def test_quant_choice_follows_the_ceiling(dense_meta):
    """The rule behind 32 GB -> Q4_K_M: 898 GB/s over weights on the GPU plus half of a
    4096-token slot of f16 KV; Q5_K_M falls under 40 tok/s, Q4_K_M does not."""
    def ceiling(q):
        size = dense_meta["parameter_count"] * FACTS_BPW[q] / 8
        on_gpu = size - 152064 * 5120 * FACTS_BPW[q] / 8
        return V100_BW / (on_gpu + 2048 * 262144)
    assert ceiling("Q5_K_M") < 40 < ceiling("Q4_K_M")
    m = plan_model.model_from_metadata("Q5_K_M", dense_meta, int(dense_meta["parameter_count"] * 5.70 / 8))
    gpu = {"memory_bandwidth_bytes_per_s": V100_BW}
    got = plan_split.ceiling_for(m, gpu, lp.normalize_policy({}), 4096, "f16")
    assert abs(got - ceiling("Q5_K_M")) < 0.01


def test_the_context_is_as_large_as_fits(gpus, dense_meta):
    g = gpus("v100-sxm2-16gb")[0]
    policy = lp.normalize_policy({})
    models = [plan_model.model_from_metadata(c["quant"], c["metadata"], c["size_bytes"]) for c in declared(dense_meta)]
    p = lp.plan_host([g], models, {})["plans"][0]
    model = models[0]
    assert model["quant"] == p["quant"] == "Q3_K_S"
    ct, par, seq = p["cache_type_k"], p["parallel"], p["ctx_per_slot"]
    assert plan_memory.fits(plan_split.budget(model, g, policy, seq * par, par, ct))
    assert not plan_memory.fits(plan_split.budget(model, g, policy, (seq + 256) * par, par, ct))       # one step more
    assert not plan_memory.fits(plan_split.budget(model, g, policy, 4096, 1, "f16"))                   # why not f16
    assert not plan_memory.fits(plan_split.budget(model, g, policy, 2 * 4096, 2, "q8_0"))              # why not 2 slots


def test_budget_by_hand(gpus, dense_meta):
    """Every term of the 32 GB plan, from the constants in docs/planning.md."""
    p, = plan(gpus("v100-sxm2-32gb"), declared(dense_meta))["plans"]
    m = p["memory"]
    size = int(dense_meta["parameter_count"] * 4.89 / 8)
    # the declared size, less the token embeddings of the Q4_K_M file the metadata came from
    assert m["weights_bytes"] == size - 152064 * 5120 // 256 * 144
    assert m["kv_bytes"] == 32768 * 262144
    assert m["compute_bytes"] == 307 * MIB
    assert m["overhead_bytes"] == 576 * MIB + 309 * MIB  # CUDA context + the driver's reservation
    assert m["headroom_bytes"] == 512 * MIB
    assert m["gpu_total_bytes"] == 32 * GIB


def test_driver_reservation():
    assert plan_memory.driver_reserved_bytes(16 * GIB) == 309 * MIB               # NVML reports the whole card
    assert plan_memory.driver_reserved_bytes(16160 * MIB) == (309 - 224) * MIB    # v1 total already lacks 224 MiB
    assert plan_memory.driver_reserved_bytes(143771 * MIB) == 0                   # H200: 613 MiB already missing


def test_physical_cores():
    assert lp.physical_cores(list(range(20)) + list(range(40, 60))) == 20
    assert lp.physical_cores(list(range(20, 40)) + list(range(60, 80))) == 20
    assert lp.physical_cores([0, 1, 2, 3]) == 4
    assert lp.physical_cores([0, 2, 4]) == 3
    assert lp.physical_cores([]) == 0


def test_gpus_sharing_cpus_split_the_threads(dense_meta):
    base = {"memory_total_bytes": 32 * GIB, "memory_bandwidth_bytes_per_s": V100_BW, "compute_capability": "7.0",
            "numa_node": 0, "cpu_affinity": list(range(16)) + list(range(32, 48)), "name": "Tesla V100-SXM2-32GB"}
    gpus = [dict(base, index=0, uuid="GPU-a"), dict(base, index=1, uuid="GPU-b")]
    models = [plan_model.model_from_metadata(c["quant"], c["metadata"], c["size_bytes"]) for c in declared(dense_meta)]
    result = lp.plan_host(gpus, models, {"allow_split": False})
    assert [p["threads"] for p in result["plans"]] == [8, 8]
    assert lp.plan_host(gpus, models, {"threads": 6, "allow_split": False})["plans"][0]["threads"] == 6
    # one instance over both: the cards' cores, not shared
    (split,) = lp.plan_host(gpus, models, {"split_modes": ["tensor", "layer"]})["plans"]
    assert split["split_mode"] == "tensor" and split["threads"] == 16


def test_swa_cells():
    model = {"window": 1024}
    assert plan_memory.swa_cells_per_slot(model, 8192, 512) == 1536
    assert plan_memory.swa_cells_per_slot(model, 1000, 512) == 1024   # min(1000, 1536) padded to 256
    assert plan_memory.swa_cells_per_slot({"window": 0}, 8192, 512) == 0


def test_quant_labels():
    assert plan_model.quant_bpw("q4_k_m") == 4.89
    assert plan_model.quant_bpw("Q3_K_S") == 3.64 and plan_model.quant_bpw("Q2_K") == 3.16 and plan_model.quant_bpw("IQ3_XXS") == 3.25
    assert plan_model.quant_bpw("Q4_K_S") == 4.67 and plan_model.quant_bpw("Q6_K") == 6.56 and plan_model.quant_bpw("Q8_0") == 8.5
    assert plan_model.quant_bpw("F16") == 16.0
    assert 3.64 < plan_model.quant_bpw("Q3_K_M") < 4.30
    assert plan_model.quant_bpw("mystery") is None


def test_metadata_with_only_the_structural_keys(gpus):
    """A hand-written metadata dict (no tensor table) plans like the file's own."""
    meta = {"architecture": "qwen2", "n_layer": 64, "n_embd": 5120, "n_head": 40, "n_head_kv": 8,
            "head_dim": 128, "vocab_size": 152064, "context_length": 32768, "feed_forward_length": 27648,
            "parameter_count": 32763876352}
    cands = [{"quant": q, "size_bytes": int(32763876352 * FACTS_BPW[q] / 8), "metadata": meta} for q in FACTS_BPW]
    assert plan(gpus("v100-sxm2-32gb"), cands)["plans"][0]["quant"] == "Q4_K_M"
    assert plan(gpus("v100-sxm2-16gb"), cands)["plans"][0]["quant"] == "Q3_K_S"


def test_h200_calibration(dense_meta):
    """FACTS: a 17578 MiB Q4_K 32B model, -c 16384 -np 4, f16 KV, used 22079 MiB of an H200
    (nvidia-smi, which leaves the driver's reservation out). The process prediction must
    land within 1%."""
    h200 = {"index": 0, "name": "NVIDIA H200", "uuid": "GPU-h200", "memory_total_bytes": 143771 * MIB,
            "memory_bandwidth_bytes_per_s": 4.8e12, "compute_capability": "9.0", "numa_node": 0,
            "cpu_affinity": list(range(16))}
    meta = dict(copy.deepcopy(dense_meta), file_type="Q4_K", weight_bytes=17578 * MIB, token_embd_bytes=417 * MIB)
    model = plan_model.model_from_metadata("Q4_K", meta)
    result = lp.plan_host([h200], [model], {"target_ctx": 16384, "target_parallel": 4})
    p, = result["plans"]
    assert (p["ctx_size"], p["parallel"], p["cache_type_k"]) == (16384, 4, "f16")
    m = p["memory"]
    assert m["weights_bytes"] == 17161 * MIB
    assert m["kv_bytes"] == 4096 * MIB and m["compute_bytes"] == 307 * MIB
    assert abs(m["predicted_process_bytes"] / (22079 * MIB) - 1) < 0.01


@pytest.mark.parametrize("key, value, words", [
    ("block_count", -4, "outside 1..512"), ("block_count", 1 << 40, "outside 1..512"), ("block_count", 0, None),
    ("context_length", -1024, "outside"), ("embedding_length", 5120.5, "not a whole number"),
    ("head_count_kv", "eight", "not a whole number"), ("feed_forward_length", [27648] * 63 + [-1], "outside"), ("feed_forward_length", [27648, 1], "2 entries for 64 layers"),
])
def test_metadata_a_plan_would_turn_into_nonsense_is_refused(key, value, words):
    """Negative, absurd or wrongly typed counts: a PlanError naming the key, never
    a plan with -c -1024 or -ngl -4, never a traceback."""
    meta = {"architecture": "qwen2", "block_count": 64, "context_length": 32768, "embedding_length": 5120,
            "head_count": 40, "head_count_kv": 8, "feed_forward_length": 27648, "vocab_size": 152064}
    meta[key] = value
    with pytest.raises(plan_memory.PlanError) as err:
        plan_model.model_from_metadata("Q4_K_M", meta, size_bytes=19 << 30)
    assert key in str(err.value) or (value == 0 and "block_count" in str(err.value))
    if words:
        assert words in str(err.value), str(err.value)


def test_a_negative_size_is_refused():
    meta = {"architecture": "qwen2", "block_count": 64, "embedding_length": 5120, "head_count": 40,
            "head_count_kv": 8}
    with pytest.raises(plan_memory.PlanError, match="size_bytes is -1"):
        plan_model.model_from_metadata("Q4_K_M", meta, size_bytes=-1)


def test_two_memory_figures_and_the_reserved_fallback_per_family(dense_meta):
    """predicted_used_bytes is the card's (NVML used, with the driver's reservation),
    predicted_process_bytes the process's own (nvidia-smi --query-compute-apps); where
    NVML gives no reservation, the family's figure (an H200: 615 MiB measured)."""
    h200 = {"index": 0, "name": "NVIDIA H200", "uuid": "GPU-h", "memory_total_bytes": 143771 * MIB,
            "memory_bandwidth_bytes_per_s": 4.8e12, "compute_capability": "9.0", "numa_node": 0,
            "cpu_affinity": list(range(16))}
    models = [plan_model.model_from_metadata(c["quant"], c["metadata"], c["size_bytes"]) for c in declared(dense_meta)]
    m = lp.plan_host([h200], models, {})["plans"][0]["memory"]
    assert m["overhead_driver_reserved_bytes"] == 615 * MIB  # 143771 MiB: the whole-GiB rule alone gave 0
    assert m["predicted_process_bytes"] == m["predicted_used_bytes"] - 615 * MIB
    m = lp.plan_host([dict(h200, memory_reserved_bytes=600 * MIB)], models, {})["plans"][0]["memory"]
    assert m["overhead_driver_reserved_bytes"] == 600 * MIB  # NVML's own figure wins


def test_throughput_objective_spends_the_card_on_slots(gpus, dense_meta):
    latency, = plan(gpus("v100-sxm2-32gb"), declared(dense_meta))["plans"]
    result = plan(gpus("v100-sxm2-32gb"), declared(dense_meta), {"objective": "throughput"})
    p, = result["plans"]
    check_plan(p, dense_meta, {"target_ctx": 1 << 30, "target_parallel": 16})
    # the same quantization (the usual rule), more slots of at least min_ctx each
    assert p["quant"] == latency["quant"] == "Q4_K_M" and p["objective"] == "throughput"
    assert p["parallel"] > latency["parallel"] and p["ctx_per_slot"] >= 4096
    assert p["expected_aggregate_tps"] > latency["expected_aggregate_tps"]
    # q8_0 KV holds twice the slots of f16 for ~6% of each stream's speed: it wins here
    assert p["cache_type_k"] == "q8_0"
    assert "Context (objective throughput): %d slot(s)" % p["parallel"] in p["reason"]
    assert "the other types: f16:" in p["reason"]
    # nothing is left idle: one more slot of min_ctx, or more context per slot, would not fit
    m = p["memory"]
    assert m["free_bytes"] < 2 * GIB


def test_throughput_objective_stops_at_max_parallel_and_checks_its_keys(dense_meta):
    h200 = {"index": 0, "name": "NVIDIA H200", "uuid": "GPU-h", "memory_total_bytes": 143771 * MIB,
            "memory_bandwidth_bytes_per_s": 4.8e12, "compute_capability": "9.0", "numa_node": 0,
            "cpu_affinity": list(range(16))}
    models = [plan_model.model_from_metadata(c["quant"], c["metadata"], c["size_bytes"]) for c in declared(dense_meta)]
    p = lp.plan_host([h200], models, {"objective": "throughput", "max_parallel": 12})["plans"][0]
    assert p["parallel"] == 12 and p["ctx_per_slot"] > 4096
    with pytest.raises(plan_memory.PlanError, match="policy.objective must be one of latency, throughput, got 'fast'"):
        lp.plan_host([h200], models, {"objective": "fast"})
    with pytest.raises(plan_memory.PlanError, match="policy.max_parallel"):
        lp.plan_host([h200], models, {"max_parallel": 0})


def test_the_throughput_objective_samples_on_the_gpu_unless_the_policy_says_otherwise(gpus, dense_meta):
    throughput, = plan(gpus("v100-sxm2-32gb"), declared(dense_meta), {"objective": "throughput"})["plans"]
    assert throughput["backend_sampling"] is True and "-bs" in throughput["server_args"]
    assert throughput["server_args"][-4:] == ["-t", str(throughput["threads"]), "-fit", "off"]
    assert "Sampling runs on the GPU (--backend-sampling, the throughput objective's default)" in throughput["reason"]
    latency, = plan(gpus("v100-sxm2-32gb"), declared(dense_meta))["plans"]
    assert latency["backend_sampling"] is False and "-bs" not in latency["server_args"]
    assert "Sampling runs on the GPU" not in latency["reason"]
    forced, = plan(gpus("v100-sxm2-32gb"), declared(dense_meta), {"backend_sampling": "yes"})["plans"]
    assert forced["backend_sampling"] is True and "(--backend-sampling, policy.backend_sampling)" in forced["reason"]
    off, = plan(gpus("v100-sxm2-32gb"), declared(dense_meta), {"objective": "throughput",
                                                              "backend_sampling": False})["plans"]
    assert off["backend_sampling"] is False and "-bs" not in off["server_args"]
    with pytest.raises(plan_memory.PlanError, match="policy.backend_sampling must be auto, true or false, got 'gpu'"):
        lp.normalize_policy({"backend_sampling": "gpu"})


def test_the_prompt_cache_is_planned_within_the_host_s_ram(gpus, dense_meta):
    """Each instance gets llama.cpp's 8 GiB prompt cache in host RAM (--cache-ram) unless
    all of the host's instances together would pass policy.prompt_cache_host_share of its
    RAM; the cost is in the reason and the table, and the flags follow the plan."""
    models = [plan_model.model_from_metadata(c["quant"], c["metadata"], c["size_bytes"]) for c in declared(dense_meta)]
    two = gpus("2x-v100-sxm2-16gb-nvlink")
    roomy = lp.plan_host(two, models, {"allow_split": False}, host_memory_bytes=384 << 30)
    assert [p["cache_ram_mib"] for p in roomy["plans"]] == [8192, 8192]
    assert all(p["slot_prompt_similarity"] == 0.1 for p in roomy["plans"])
    assert roomy["plans"][0]["server_args"][roomy["plans"][0]["server_args"].index("-cram") + 1] == "8192"
    assert roomy["plans"][0]["server_args"][roomy["plans"][0]["server_args"].index("-sps") + 1] == "0.1"
    assert "up to 8192 MiB of host RAM for this instance (--cache-ram)" in roomy["plans"][0]["reason"]
    assert "host: prompt cache 8192 MiB x 2 instance(s) = 16.0 GiB of the host's 384.0 GiB RAM" in roomy["table"][-1]
    # 32 GiB of RAM: a quarter over two instances is 4096 MiB each, and the reason says why
    small = lp.plan_host(two, models, {"allow_split": False}, host_memory_bytes=32 << 30)
    assert [p["cache_ram_mib"] for p in small["plans"]] == [4096, 4096]
    assert "policy.prompt_cache_mib 8192 bounded by 25% of the host's 32 GiB over 2 instance(s)" in small["plans"][0]["reason"]
    off = lp.plan_host(two, models, {"allow_split": False, "prompt_cache_mib": 0}, host_memory_bytes=32 << 30)
    assert [p["cache_ram_mib"] for p in off["plans"]] == [0, 0] and off["table"][-1] == "host: prompt cache off (policy.prompt_cache_mib 0)"
    assert "Prompt cache" not in off["plans"][0]["reason"]
    unknown = lp.plan_host(two, models, {"allow_split": False})
    assert [p["cache_ram_mib"] for p in unknown["plans"]] == [8192, 8192] and "not bounded" in unknown["table"][-1]
    for bad, match in (({"prompt_cache_host_share": 2}, "policy.prompt_cache_host_share"),
                       ({"slot_prompt_similarity": -0.5}, "policy.slot_prompt_similarity"),
                       ({"prompt_cache_mib": -1}, "policy.prompt_cache_mib")):
        with pytest.raises(plan_memory.PlanError, match=match):
            lp.normalize_policy(bad)


def test_a_plan_recorded_before_the_prompt_cache_runs_with_llama_cpp_s_default():
    from ansible.module_utils.llama_flags import SERVER, plan_argv
    base = {"model_path": "m.gguf", "ctx_size": 4096, "parallel": 1, "n_gpu_layers": 99, "cache_type_k": "f16",
            "cache_type_v": "f16", "batch_size": 2048, "ubatch_size": 512}
    assert "--cache-ram" not in plan_argv(base, SERVER)
    assert plan_argv(dict(base, cache_ram_mib=0, slot_prompt_similarity=0.25), SERVER)[-4:] == [
        "--cache-ram", "0", "--slot-prompt-similarity", "0.25"]


def test_plans_say_how_long_the_first_token_takes(gpus, dense_meta):
    # a prompt that fills a slot as far as the decode expectation assumes, at the
    # family's prompt rate over the model's parameters (docs/planning.md, "The first token")
    p, = plan(gpus("v100-sxm2-32gb"), declared(dense_meta))["plans"]
    first = p["first_token"]
    rate, source = plan_speed.PREFILL_RATE_TABLE["volta"]
    assert first["prompt_tokens"] == int(p["ctx_per_slot"] * lp.DEFAULT_POLICY["kv_fill"])
    assert first["prompt_tps"] == pytest.approx(rate * 1e9 / dense_meta["parameter_count"], abs=0.1)
    assert first["ttft_s"] == pytest.approx(first["prompt_tokens"] / first["prompt_tps"], abs=0.01)
    assert first["source"] == source and "discussion #15013" in source
    assert "First token: a prompt of %d tokens (the planned fill) takes about %.1f s" % (
        first["prompt_tokens"], first["ttft_s"]) in p["reason"]
    # a family with no prompt figure says so instead of guessing
    t4, = plan(gpus("t4"), declared(dense_meta, ("Q3_K_S",)), {"allow_partial_offload": True})["plans"]
    assert t4["first_token"]["prompt_tps"] is None and t4["first_token"]["ttft_s"] is None
    assert t4["first_token"]["source"] == "not modelled for a partial offload (the layers in host memory bound the prompt)"
    assert "First token" not in t4["reason"]


# --- a draft model for speculative decoding (policy.speculative: draft-simple) --------

def draft_meta(meta):
    """A 0.5B-class draft of the same family: the target's vocabulary, 24 layers of 896."""
    return dict(meta, block_count=24, embedding_length=896, feed_forward_length=4864, head_count=14,
                head_count_kv=2, parameter_count=494000000)


def draft_entry(meta, path=None):
    return {"quant": "Q8_0", "size_bytes": int(494000000 * 8.5 / 8), "metadata": draft_meta(meta),
            "path": path or "/var/lib/llm-fleet/models/draft-0.5b-q8_0.gguf"}


def plan_with_draft(gpus, candidates, draft, policy=None, calibration=None):
    return run_module("llama_plan", {"gpus": gpus, "candidates": candidates, "draft": draft,
                                     "policy": dict({"speculative": "draft-simple"}, **(policy or {})),
                                     "calibration": calibration or {}})


def test_a_draft_models_memory_is_budgeted_before_the_context(gpus, dense_meta):
    card = gpus("v100-sxm2-32gb")
    alone, = plan(card, declared(dense_meta, ("Q4_K_M",)))["plans"]
    result = plan_with_draft(card, declared(dense_meta, ("Q4_K_M",)), draft_entry(dense_meta))
    assert not result.get("failed"), result.get("msg")
    p, = result["plans"]
    m, draft = p["memory"], p["draft"]
    # its weights, a KV cache of the target's context, slots and type, and its compute buffer
    dm = plan_model.model_from_metadata("Q8_0", draft_meta(dense_meta), size_bytes=int(494000000 * 8.5 / 8))
    kv = plan_memory.cache_bytes(dm, p["ctx_size"], p["parallel"], p["cache_type_k"], p["ubatch_size"])["total"]
    assert draft["weights_bytes"] == dm["gpu_weight_bytes"] and draft["kv_bytes"] == kv
    assert draft["total_bytes"] == m["draft_bytes"] == draft["weights_bytes"] + kv + draft["compute_bytes"]
    assert m["total_bytes"] == sum(m[k] for k in PARTS) + m["draft_bytes"] <= m["gpu_total_bytes"]
    # the card gives the target less context than alone
    assert p["ctx_size"] * p["parallel"] <= alone["ctx_size"] * alone["parallel"]
    # no baseline without it yet: the draft does not serve, but its memory stays reserved
    # (the configuration is the same when it is tried), and the process is predicted without it
    assert p["spec_type"] == "none" and m["draft_loaded"] is False and m["draft_reserved_bytes"] == m["draft_bytes"]
    assert m["predicted_used_bytes"] == m["total_bytes"] - m["headroom_bytes"] - m["draft_bytes"]
    assert "-md" not in p["server_args"] and "measured first" not in p["reason"]
    assert "no measurement of this configuration without it yet" in p["reason"]


def test_a_draft_on_trial_is_on_the_command_line_with_the_targets_kv_type(gpus, dense_meta):
    card = gpus("v100-sxm2-32gb")
    first, = plan_with_draft(card, declared(dense_meta, ("Q4_K_M",)), draft_entry(dense_meta))["plans"]
    key = {k: first[k] for k in ("gpu_name", "quant", "ctx_size", "parallel", "cache_type_k")}
    baseline = {"config": dict(key, split_mode="none", spec_type="none"), "figures": {"single_stream_tps": 25.0}}
    p, = plan_with_draft(card, declared(dense_meta, ("Q4_K_M",)), draft_entry(dense_meta),
                         calibration={"baselines": [baseline]})["plans"]
    assert (p["ctx_size"], p["parallel"]) == (first["ctx_size"], first["parallel"])
    assert p["spec_type"] == "draft-simple" and p["memory"]["draft_loaded"] is True
    args = p["server_args"]
    assert args[args.index("--spec-type") + 1] == "draft-simple"
    assert args[args.index("-md") + 1] == "/var/lib/llm-fleet/models/draft-0.5b-q8_0.gguf"
    assert args[args.index("-ngld") + 1] == "25"
    assert args[args.index("-ctkd") + 1] == args[args.index("-ctk") + 1] == p["cache_type_k"]
    assert p["memory"]["predicted_used_bytes"] == p["memory"]["total_bytes"] - p["memory"]["headroom_bytes"]
    assert "with the draft model" in p["reason"] and "a trial" in p["reason"]


@pytest.mark.parametrize("policy,draft,message", [
    ({"speculative": "draft-simple"}, None, "no draft model is given"),
    ({"speculative": "ngram-mod"}, "draft", "set it to draft-simple"),
    ({}, "draft", "set it to draft-simple"),
    ({"speculative": "draft-simple"}, "other vocabulary", "differs by more than 128"),
])
def test_a_draft_and_the_policy_must_agree(gpus, dense_meta, policy, draft, message):
    entry = None if draft is None else draft_entry(dense_meta)
    if draft == "other vocabulary":
        entry["metadata"] = dict(entry["metadata"], vocab_size=32000)
    result = run_module("llama_plan", dict({"gpus": gpus("v100-sxm2-32gb"), "candidates": declared(dense_meta),
                                            "policy": policy}, **({"draft": entry} if entry else {})))
    assert result.get("failed") and message in result["msg"]


def test_a_draft_is_planned_on_one_card_not_split(gpus, dense_meta):
    # two 16 GB cards: the 32B needs a split alone; with a draft it is refused by name
    result = plan_with_draft(gpus("2x-v100-sxm2-16gb-nvlink"), declared(dense_meta, ("Q4_K_M",)), draft_entry(dense_meta))
    assert result.get("failed") and "a draft model is planned on one card only" in result["msg"]


def test_a_verdict_on_one_draft_does_not_decide_for_another(gpus, dense_meta):
    card = gpus("v100-sxm2-32gb")
    first, = plan_with_draft(card, declared(dense_meta, ("Q4_K_M",)), draft_entry(dense_meta))["plans"]
    key = dict({k: first[k] for k in ("gpu_name", "quant", "ctx_size", "parallel", "cache_type_k")}, split_mode="none")
    baseline = {"config": dict(key, spec_type="none"), "figures": {"single_stream_tps": 25.0}}
    no_gain = {"spec_type": "draft-simple", "verdict": "no_gain", "host": "h1", "message": "x0.41",
               "config": dict(key, spec_type="draft-simple"), "draft": "/var/lib/llm-fleet/models/draft-0.5b-q8_0.gguf"}
    cal = {"baselines": [baseline], "speculation": [no_gain]}
    # the draft measured: off; the same file read where the mirror has it (before the download): off too
    for path in (None, "/srv/models/draft-0.5b-q8_0.gguf"):
        p, = plan_with_draft(card, declared(dense_meta, ("Q4_K_M",)), draft_entry(dense_meta, path), calibration=cal)[
            "plans"]
        assert p["spec_type"] == "none" and "measured no gain on h1" in p["reason"]
    # another draft: tried
    other, = plan_with_draft(card, declared(dense_meta, ("Q4_K_M",)),
                             draft_entry(dense_meta, "/var/lib/llm-fleet/models/other-draft.gguf"), calibration=cal)["plans"]
    assert other["spec_type"] == "draft-simple" and "a trial" in other["reason"]


def test_a_drafts_compute_buffer_holds_one_output_per_slot(gpus, dense_meta):
    # common_base_params_to_speculative sets the draft's n_outputs_max to the slots: its logits
    # are 4 x n_vocab, not 512 x n_vocab (measured on an H100: the draft took 744 MiB where the
    # budget with a ubatch of logits said 990, gpu-host-2026-12-06-draft)
    dm = plan_model.model_from_metadata("Q8_0", draft_meta(dense_meta), size_bytes=int(494000000 * 8.5 / 8))
    policy = dict(lp.DEFAULT_POLICY)
    budget = plan_memory.draft_budget(dm, policy, 32768, 4, "f16")
    full = plan_memory.compute_bytes(dm, policy["ubatch_size"], 8192, True, "f16", 4)
    assert full >= policy["ubatch_size"] * 4 * dm["n_vocab"] > 5 * budget["compute"] > 0
