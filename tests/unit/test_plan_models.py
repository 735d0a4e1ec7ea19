"""module_utils/plan_models.py: several models on one host's GPUs, every resident
model's memory counted on its card (issue 35, the planner's part). GPU facts from the
real nvidia_gpu_facts module over the mock NVML profiles; models from synthetic GGUF
headers: the 32B dense shape and an 8B one derived from it."""
import pytest

from conftest import ROOT, run_module

import gguf_fixtures

import ansible.module_utils
if str(ROOT / "module_utils") not in ansible.module_utils.__path__:
    ansible.module_utils.__path__.append(str(ROOT / "module_utils"))
from ansible.module_utils import gguf_model, llama_plan as lp  # noqa: E402
from ansible.module_utils.plan_memory import PlanError, card_room_bytes  # noqa: E402
from ansible.module_utils.plan_model import model_from_metadata, quant_bpw  # noqa: E402
from ansible.module_utils.plan_models import minimum_process_bytes, place_models  # noqa: E402

GIB = 1 << 30
BPW = {"Q3_K_S": 3.64, "Q4_K_M": 4.89, "Q5_K_M": 5.70, "Q6_K": 6.56, "Q8_0": 8.50}


@pytest.fixture(scope="module")
def dense_meta(tmp_path_factory):
    return gguf_model.read_model(str(gguf_fixtures.write_all(tmp_path_factory.mktemp("gguf"))["dense_q4km"]))


@pytest.fixture(scope="module")
def small_meta(dense_meta):
    """An 8B-shaped dense model (llama 3 8B's layer count, widths and GQA)."""
    meta = dict(dense_meta, name="dense-8B-synthetic", block_count=32, embedding_length=4096,
                feed_forward_length=14336, head_count=32, head_count_kv=8, parameter_count=8030261248,
                token_embd_bytes=288358400, output_bytes=420478976, weight_bytes=4920000000,
                file_size_bytes=4920100000, vocab_size=128256,
                layers=dict(dense_meta["layers"], full_attention=list(range(32))), full_attention_layer_count=32,
                kv_bytes_per_token={"f16": 131072, "q4_0": 36864, "q8_0": 69632})
    return meta


def candidates(meta, quants=("Q3_K_S", "Q4_K_M", "Q5_K_M", "Q6_K", "Q8_0")):
    return [model_from_metadata(q, meta, size_bytes=int(meta["parameter_count"] * BPW[q] / 8)) for q in quants]


@pytest.fixture
def gpus(gpu_host):
    def read(profile):
        return run_module("nvidia_gpu_facts", env=gpu_host(profile))["ansible_facts"]["nvidia_gpus"]
    return read


def processes(result, index):
    return [p for p in result["plans"] if p["gpu_index"] == index]


def test_one_model_is_today_s_plan(gpus, dense_meta):
    """A host of one model plans exactly what plan_host plans for it, card by card."""
    cards = gpus("2x-v100-sxm2-16gb-nvlink")
    alone = lp.plan_host(cards, candidates(dense_meta), {"allow_split": False})
    placed = place_models(cards, [{"name": "chat", "models": candidates(dense_meta), "policy": {"allow_split": False}}])
    strip = lambda p: dict((k, v) for k, v in p.items() if k != "model_name")  # noqa: E731
    assert [strip(p) for p in placed["plans"]] == alone["plans"]
    assert placed["placement"] == {0: ["chat"], 1: ["chat"]}


def test_two_models_on_one_card_share_it_and_the_first_gives_way(gpus, dense_meta, small_meta):
    """Beside an 8B, the 32B on a 32 GB V100 gets less than alone (a lower quantization or
    less context): the second model's memory is counted before the first picks, and both
    fit together."""
    card = gpus("v100-sxm2-32gb")
    alone = lp.plan_host(card, candidates(dense_meta), {"target_ctx": 65536})["plans"][0]
    result = place_models(card, [{"name": "chat", "models": candidates(dense_meta), "policy": {"target_ctx": 65536}},
                                 {"name": "coder", "models": candidates(small_meta),
                                  "policy": {"target_ctx": 8192, "target_parallel": 1}}])
    chat, coder = processes(result, 0)
    assert (chat["model_name"], coder["model_name"]) == ("chat", "coder")
    assert (quant_bpw(chat["quant"]), chat["ctx_size"]) < (quant_bpw(alone["quant"]), alone["ctx_size"])
    assert coder["parallel"] == 1 and 4096 <= coder["ctx_size"] <= 8192
    # every process of the card, its reservation and one headroom, within its memory
    used = chat["memory"]["predicted_process_bytes"] + coder["memory"]["predicted_process_bytes"]
    assert used <= card_room_bytes(card[0], lp.normalize_policy({}))
    assert coder["memory"]["total_bytes"] <= coder["memory"]["gpu_total_bytes"]
    assert coder["memory"]["other_models_bytes"] == chat["memory"]["predicted_process_bytes"]
    assert coder["memory"]["foreign_bytes"] == 0
    assert not any("planned around" in w for p in (chat, coder) for w in p["warnings"])
    parts = ("weights_bytes", "kv_bytes", "compute_bytes", "overhead_bytes", "headroom_bytes", "foreign_bytes",
             "other_models_bytes")
    assert all(p["memory"]["total_bytes"] == sum(p["memory"][k] for k in parts) for p in (chat, coder))
    assert "Shares GPU 0 with coder" in chat["reason"] and "Shares GPU 0 with chat" in coder["reason"]
    assert any(line.startswith("GPU 0: chat %s" % chat["quant"]) for line in result["table"])


def test_a_model_that_fits_nowhere_is_refused_by_name_with_the_figures(gpus, dense_meta, small_meta):
    card = gpus("v100-sxm2-16gb")
    with pytest.raises(PlanError) as err:
        place_models(card, [{"name": "chat", "models": candidates(dense_meta)},
                            {"name": "second-32b", "models": candidates(dense_meta)}])
    text = str(err.value)
    assert "model second-32b fits on no GPU" in text
    assert "GPU 0" in text and "chat >=" in text and "needs at least" in text and "GiB" in text


def test_a_counted_model_goes_to_the_card_with_the_most_room(gpus, small_meta):
    """Two 16 GB cards, an 8B on both; one instance of a second model: on the card with
    more room (another program holds 2 GiB of GPU 0), and only there."""
    cards = gpus("2x-v100-sxm2-16gb-nvlink")
    cards[0] = dict(cards[0], memory_foreign_bytes=2 * GIB)
    small = {"allow_split": False, "target_ctx": 4096, "target_parallel": 1}
    result = place_models(cards, [{"name": "chat", "models": candidates(small_meta), "policy": small},
                                  {"name": "second", "models": candidates(small_meta), "policy": small, "gpus": 1}])
    assert result["placement"] == {0: ["chat"], 1: ["chat", "second"]}
    assert [p["model_name"] for p in processes(result, 1)] == ["chat", "second"]
    # GPU 0's other program is said as such; the models beside each other are not
    assert any("that other processes hold" in w for w in processes(result, 0)[0]["warnings"])
    assert not any("planned around" in w for p in processes(result, 1) for w in p["warnings"])


def test_minimum_is_the_smallest_candidate_in_the_most_compact_cache(gpus, small_meta):
    card = gpus("v100-sxm2-32gb")[0]
    policy = lp.normalize_policy({"cache_types": ["f16", "q8_0"]})
    need, quant, cache = minimum_process_bytes(candidates(small_meta), card, policy)
    assert (quant, cache) == ("Q3_K_S", "q8_0")
    assert 3 * GIB < need < 6 * GIB


@pytest.mark.parametrize("entries, words", [
    ([], "non-empty list"),
    ([{"name": "a", "models": [1], "extra": 1}], "unknown key(s) extra"),
    ([{"name": "", "models": [1]}], "name must be a non-empty text"),
    ([{"name": "a", "models": [1]}, {"name": "a", "models": [1]}], "used twice"),
    ([{"name": "a", "models": []}], "no candidate"),
    ([{"name": "a", "models": [1], "gpus": 0}], "gpus must be"),
    ([{"name": "a", "models": [1], "gpus": True}], "gpus must be"),
])
def test_bad_entries_are_named(gpus, entries, words):
    with pytest.raises(PlanError, match=words.replace("(", r"\(").replace(")", r"\)")):
        place_models(gpus("v100-sxm2-32gb"), entries)


def test_the_module_plans_several_models_and_refuses_by_name(gpus, dense_meta, small_meta):
    """library/llama_plan.py's models option: the same placement through the module, the
    candidates declared as an inventory declares them."""
    def declared(meta, quants):
        return [{"quant": q, "size_bytes": int(meta["parameter_count"] * BPW[q] / 8), "metadata": meta}
                for q in quants]
    card = gpus("v100-sxm2-32gb")
    result = run_module("llama_plan", {"gpus": card, "models": [
        {"name": "chat", "candidates": declared(dense_meta, ("Q4_K_M", "Q5_K_M")), "policy": {"target_ctx": 65536}},
        {"name": "coder", "candidates": declared(small_meta, ("Q3_K_S", "Q6_K")),
         "policy": {"target_ctx": 8192, "target_parallel": 1}}]})
    assert not result.get("failed"), result.get("msg")
    assert {str(k): v for k, v in result["placement"].items()} == {"0": ["chat", "coder"]}
    assert [p["model_name"] for p in result["plans"]] == ["chat", "coder"]
    assert result["summary"].startswith("chat: ")
    failed = run_module("llama_plan", {"gpus": gpus("v100-sxm2-16gb"), "models": [
        {"name": "chat", "candidates": declared(dense_meta, ("Q3_K_S",))},
        {"name": "again", "candidates": declared(dense_meta, ("Q3_K_S",))}]})
    assert failed.get("failed") and "model again fits on no GPU" in failed["msg"]
    both = run_module("llama_plan", {"gpus": card, "candidates": declared(dense_meta, ("Q4_K_M",)),
                                     "models": [{"name": "chat", "candidates": declared(dense_meta, ("Q4_K_M",))}]})
    assert both.get("failed") and "mutually exclusive" in both["msg"]


def test_a_measured_cuda_context_replaces_the_table_s_figure(gpus, dense_meta, small_meta):
    """The CUDA context verify measured on cards of this name (the calibration's
    cuda_overhead_bytes) is what the next plan budgets per process, for one model and
    for several, and the reason says so; a policy's own overhead_bytes wins; a
    figure outside 64 MiB-4 GiB is a failed measurement and ignored."""
    card = gpus("v100-sxm2-32gb")
    name = card[0]["name"]
    measured = {"version": 1, "records": [
        {"gpu_name": name, "efficiency": 0.6, "cuda_overhead_bytes": 500 << 20},
        {"gpu_name": name, "efficiency": 0.6, "cuda_overhead_bytes": 510 << 20},
        {"gpu_name": name, "efficiency": 0.6, "cuda_overhead_bytes": 10 << 30},
        {"gpu_name": "another card", "efficiency": 0.6, "cuda_overhead_bytes": 100 << 20}]}
    table = lp.plan_host(card, candidates(dense_meta), {})["plans"][0]
    learned = lp.plan_host(card, candidates(dense_meta), {}, measured)["plans"][0]
    assert table["memory"]["overhead_cuda_bytes"] == 576 << 20
    assert learned["memory"]["overhead_cuda_bytes"] == 505 << 20
    # the same plan, 71 MiB less per process (or more context where the room allowed it)
    assert (learned["quant"], learned["parallel"]) == (table["quant"], table["parallel"])
    assert learned["ctx_size"] >= table["ctx_size"]
    assert "the CUDA context verify measured on %s: 505 MiB, the median of 2 process(es)" % name in learned["reason"]
    own = lp.plan_host(card, candidates(dense_meta), {"overhead_bytes": 600 << 20}, measured)["plans"][0]
    assert own["memory"]["overhead_cuda_bytes"] == 600 << 20 and "CUDA context verify" not in own["reason"]
    several = place_models(card, [{"name": "chat", "models": candidates(dense_meta)},
                                  {"name": "coder", "models": candidates(small_meta, ("Q3_K_S",)),
                                   "policy": {"target_ctx": 8192, "target_parallel": 1}}], measured)
    assert [p["memory"]["overhead_cuda_bytes"] for p in several["plans"]] == [505 << 20, 505 << 20]
