"""module_utils/plan_models.py: several models on one host's GPUs, every resident
model's memory counted on its card (issue 35, the planner's part). GPU facts from the
real nvidia_gpu_facts module over the mock NVML profiles; models from synthetic GGUF
headers: the 32B dense shape and an 8B one derived from it."""
import pytest
from hypothesis import given, strategies as st

from conftest import ROOT, run_module

import gguf_fixtures

import ansible.module_utils
if str(ROOT / "module_utils") not in ansible.module_utils.__path__:
    ansible.module_utils.__path__.append(str(ROOT / "module_utils"))
from ansible.module_utils import gguf_model, llama_plan as lp  # noqa: E402
from ansible.module_utils.plan_memory import PlanError, card_room_bytes  # noqa: E402
from ansible.module_utils.plan_model import model_from_metadata, quant_bpw  # noqa: E402
from ansible.module_utils.plan_models import minimum_process_bytes, models_max, place_models  # noqa: E402

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
    assert result["summary"].startswith("chat: ") and result["routers"] == []
    lazy = run_module("llama_plan", {"gpus": card, "models": [
        {"name": "chat", "candidates": declared(dense_meta, ("Q4_K_M",)), "policy": {"target_ctx": 32768}},
        {"name": "coder", "candidates": declared(small_meta, ("Q3_K_S",)), "load": "on_demand",
         "policy": {"target_ctx": 8192, "target_parallel": 1}}]})
    assert not lazy.get("failed"), lazy.get("msg")
    assert [(r["gpu_index"], r["models"], r["models_max"]) for r in lazy["routers"]] == [(0, ["coder"], 1)]
    assert lazy["plans"][1]["load"] == "on_demand"
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


# --- models loaded on demand (llama-server's router, --models-max) ---------------------------

def _small(ctx=8192):
    return {"target_ctx": ctx, "target_parallel": 1}


def test_on_demand_models_share_what_the_resident_ones_leave(gpus, dense_meta, small_meta):
    """A 32B resident beside two 8Bs loaded on demand on a 32 GB V100: the resident keeps
    the larger on-demand minimum free, each on-demand model is planned alone in what the
    resident took, --models-max is how many of them fit that together, and the table and
    reasons say so."""
    card = gpus("v100-sxm2-32gb")
    room = card_room_bytes(card[0], lp.normalize_policy({}))
    result = place_models(card, [
        {"name": "chat", "models": candidates(dense_meta), "policy": {"target_ctx": 32768}},
        {"name": "coder", "models": candidates(small_meta), "policy": _small(), "load": "on_demand"},
        {"name": "embed", "models": candidates(small_meta, ("Q3_K_S", "Q4_K_M")), "policy": _small(4096),
         "load": "on_demand"}])
    chat, coder, embed = processes(result, 0)
    assert "load" not in chat and (coder["load"], embed["load"]) == ("on_demand", "on_demand")
    assert result["placement"] == {0: ["chat"]}
    (router,) = result["routers"]
    assert (router["gpu_index"], router["models"]) == (0, ["coder", "embed"])
    resident = chat["memory"]["predicted_process_bytes"]
    assert router["room_bytes"] == room - resident
    lazy = [coder["memory"]["predicted_process_bytes"], embed["memory"]["predicted_process_bytes"]]
    # each alone fits beside the resident, and the router's limit holds the largest ones together
    assert all(size <= room - resident for size in lazy)
    # here the 8B takes Q6_K (7.55 GiB) of the 7.84 GiB left: one child at a time
    assert sum(lazy) > room - resident and router["models_max"] == 1
    assert "Loaded on demand on GPU 0 by its router" in coder["reason"] and "chat" in coder["reason"]
    assert "the largest model loaded on demand kept at least" in chat["reason"]
    assert any("on demand: coder" in line and "--models-max %d" % router["models_max"] in line
               for line in result["table"])


def test_the_resident_model_gives_way_to_the_on_demand_minimum(gpus, dense_meta, small_meta):
    """Without on-demand models the 32B takes the card; with one it plans less, so that
    the 8B still loads when asked for."""
    card = gpus("v100-sxm2-32gb")
    policy = {"target_ctx": 131072}
    alone = place_models(card, [{"name": "chat", "models": candidates(dense_meta), "policy": policy}])["plans"][0]
    both = place_models(card, [{"name": "chat", "models": candidates(dense_meta), "policy": policy},
                               {"name": "coder", "models": candidates(small_meta), "policy": _small(),
                                "load": "on_demand"}])
    chat = both["plans"][0]
    assert chat["memory"]["predicted_process_bytes"] < alone["memory"]["predicted_process_bytes"]
    assert both["routers"][0]["models_max"] == 1


def test_an_on_demand_model_needs_room_beside_the_residents_only(gpus, small_meta):
    """Three 8Bs on demand on a 16 GB card with no resident model: each fits alone, not
    all three together; the router holds as many as fit (the LRU unloads the others)."""
    card = gpus("v100-sxm2-16gb")
    lazy = {"target_ctx": 4096, "target_parallel": 1}
    result = place_models(card, [{"name": n, "models": candidates(small_meta, ("Q3_K_S", "Q4_K_M")),
                                  "policy": lazy, "load": "on_demand"} for n in ("a", "b", "c")])
    (router,) = result["routers"]
    assert router["models"] == ["a", "b", "c"] and result["placement"] == {0: []}
    sizes = [p["memory"]["predicted_process_bytes"] for p in result["plans"]]
    assert sum(sizes) > router["room_bytes"]
    assert 1 <= router["models_max"] < 3
    assert sum(sorted(sizes, reverse=True)[:router["models_max"]]) <= router["room_bytes"]
    assert "loading another unloads the least recently used" in router["reason"]
    # the host's RAM holds the prompt caches of the children that run at once, not of all three
    assert "x %d instance(s)" % router["models_max"] in result["table"][-1]


def test_an_on_demand_model_that_does_not_fit_beside_the_residents_is_refused_by_name(gpus, dense_meta):
    card = gpus("v100-sxm2-16gb")
    with pytest.raises(PlanError) as err:
        place_models(card, [{"name": "chat", "models": candidates(dense_meta)},
                            {"name": "big", "models": candidates(dense_meta), "load": "on_demand"}])
    text = str(err.value)
    assert "model big (loaded on demand: beside the resident models only) fits on no GPU" in text
    assert "chat >=" in text and "needs at least" in text


def test_a_resident_after_an_on_demand_model_keeps_its_room(gpus, dense_meta, small_meta):
    """The list's order is the priority: an on-demand 8B listed first keeps its minimum
    when a 32B resident comes after it, on a card where both fit only that way."""
    card = gpus("v100-sxm2-16gb")
    with pytest.raises(PlanError, match="model chat fits on no GPU"):
        place_models(card, [{"name": "coder", "models": candidates(small_meta), "policy": _small(),
                             "load": "on_demand"},
                            {"name": "chat", "models": candidates(dense_meta)}])


def test_a_bad_load_is_named(gpus):
    with pytest.raises(PlanError, match="load must be resident .* or on_demand"):
        place_models(gpus("v100-sxm2-32gb"), [{"name": "a", "models": [1], "load": "lazy"}])


@given(sizes=st.lists(st.integers(1, 40 << 30), min_size=1, max_size=8), room=st.integers(1, 80 << 30))
def test_models_max_holds_the_largest_that_fit_together(sizes, room):
    """Whatever k models the router keeps, they fit: the k largest do; one more of the
    largest would not (unless all are counted); never below one."""
    most = models_max(sizes, room)
    ranked = sorted(sizes, reverse=True)
    assert 1 <= most <= len(sizes)
    if sum(ranked[:most]) > room:
        assert most == 1
    if most < len(sizes):
        assert sum(ranked[:most + 1]) > room


def test_on_demand_models_spread_over_the_cards(gpus, small_meta):
    """Two 16 GB cards, an 8B resident on both, two 8Bs on demand on one GPU each: they go
    to different cards (each router then holds its model beside the resident one without
    unloading), not both to the first."""
    cards = gpus("2x-v100-sxm2-16gb-nvlink")
    small = {"allow_split": False, "target_ctx": 4096, "target_parallel": 1}
    result = place_models(cards, [{"name": "chat", "models": candidates(small_meta), "policy": small},
                                  {"name": "a", "models": candidates(small_meta), "policy": small,
                                   "load": "on_demand"},
                                  {"name": "b", "models": candidates(small_meta), "policy": small,
                                   "load": "on_demand"}])
    assert [(r["gpu_index"], r["models"]) for r in result["routers"]] == [(0, ["a"]), (1, ["b"])]
    assert result["placement"] == {0: ["chat"], 1: ["chat"]}
