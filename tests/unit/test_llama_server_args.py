"""How a plan becomes llama-server's command line (roles/llama_server/filter_plugins)."""
import importlib.util

import pytest

from conftest import ROOT

import paths

_spec = importlib.util.spec_from_file_location(
    "llama_server_filters", ROOT / "roles" / "llama_server" / "filter_plugins" / "llama_server.py")
filters = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(filters)

PLAN = {"gpu_index": 1, "gpu_uuid": "GPU-x", "model_path": "/m/q4.gguf", "quant": "Q4_K_M", "ctx_size": 32768,
        "parallel": 4, "n_gpu_layers": 65, "cache_type_k": "f16", "cache_type_v": "f16", "flash_attn": True,
        "batch_size": 2048, "ubatch_size": 512, "threads": 20}
OPTIONS = {"host": "127.0.0.1", "port": 8081, "alias": "Q4_K_M", "threads": 8, "metrics": True,
           "api_key_file": "", "lock_memory": True, "llama_fit": False, "extra_args": []}
NEW_BUILD = ["--model", "--alias", "--host", "--port", "--ctx-size", "--parallel", "--n-gpu-layers",
             "--cache-type-k", "--cache-type-v", "--flash-attn", "--batch-size", "--ubatch-size", "--threads",
             "--threads-batch", "--metrics", "--api-key-file", "--load-mode", "--fit"]


def test_a_plan_renders_every_planned_value():
    args = filters.llama_server_args(PLAN, OPTIONS, NEW_BUILD)["args"]
    assert args == ["--model", "/m/q4.gguf", "--alias", "Q4_K_M", "--host", "127.0.0.1", "--port", "8081",
                    "--ctx-size", "32768", "--parallel", "4", "--n-gpu-layers", "65", "--cache-type-k", "f16",
                    "--cache-type-v", "f16", "--flash-attn", "on", "--batch-size", "2048", "--ubatch-size", "512",
                    "--threads", "8", "--threads-batch", "8", "--metrics", "--load-mode", "mlock", "--fit", "off"]


def test_an_older_build_gets_mlock_and_loses_flags_it_lacks():
    old = [f for f in NEW_BUILD if f not in ("--load-mode", "--fit")] + ["--mlock"]
    result = filters.llama_server_args(PLAN, OPTIONS, old)
    assert "--mlock" in result["args"] and "--load-mode" not in result["args"]
    assert result["dropped"] == ["--fit"]


def test_a_build_without_an_essential_flag_cannot_run_the_plan():
    with pytest.raises(ValueError, match="no --ctx-size flag"):
        filters.llama_server_args(PLAN, OPTIONS, [f for f in NEW_BUILD if f != "--ctx-size"])


def test_unknown_extra_args_are_refused():
    with pytest.raises(ValueError, match="--no-such-flag"):
        filters.llama_server_args(PLAN, dict(OPTIONS, extra_args=["--no-such-flag"]), NEW_BUILD)


def test_the_api_key_file_is_passed_when_a_key_is_set():
    args = filters.llama_server_args(PLAN, dict(OPTIONS, api_key_file="/etc/k"), NEW_BUILD)["args"]
    assert args[args.index("--api-key-file") + 1] == "/etc/k"


def test_an_api_key_the_build_cannot_enforce_stops_the_role():
    """Fail closed: without --api-key-file the server would listen unauthenticated."""
    build = [f for f in NEW_BUILD if f != "--api-key-file"]
    with pytest.raises(ValueError, match="no --api-key-file flag"):
        filters.llama_server_args(PLAN, dict(OPTIONS, api_key_file="/etc/k"), build)
    assert "--api-key-file" not in filters.llama_server_args(PLAN, OPTIONS, build)["args"]


@pytest.mark.parametrize("extra", ["--host", "--host=0.0.0.0", "-c", "--ctx-size", "-ngl", "--api-key", "-t", "--port"])
def test_extra_args_may_not_repeat_a_flag_the_role_sets(extra):
    with pytest.raises(ValueError, match="sets itself"):
        filters.llama_server_args(PLAN, dict(OPTIONS, extra_args=[extra, "1"]), NEW_BUILD + ["--api-key", "-c"])


def test_other_extra_args_pass_through():
    args = filters.llama_server_args(PLAN, dict(OPTIONS, extra_args=["--no-webui"]), NEW_BUILD + ["--no-webui"])["args"]
    assert args[-1] == "--no-webui"


def test_backend_sampling_renders_as_a_switch_and_an_older_build_drops_it():
    plan = dict(PLAN, backend_sampling=True)
    result = filters.llama_server_args(plan, OPTIONS, NEW_BUILD + ["--backend-sampling"])
    args = result["args"]
    assert args[args.index("--ubatch-size") + 2] == "--backend-sampling"
    assert args[args.index("--backend-sampling") + 1] == "--threads" and result["dropped"] == []
    assert filters.llama_server_args(plan, OPTIONS, NEW_BUILD)["dropped"] == ["--backend-sampling"]


def _rollback_filters():
    return paths.load_file("llama_server_rollback", "roles/llama_server/filter_plugins/llama_server_rollback.py")


def test_several_models_name_their_instances_and_ports_apart():
    """Issue 35: the first model keeps the one-model instance and port; the others get
    <gpu>-<name> and base + rank x step; a record written before has its GPU's index."""
    first = {"gpu_index": 1, "gpu_uuid": "GPU-b", "instance": "1", "model_name": "chat", "model_rank": 0}
    second = {"gpu_index": 1, "gpu_uuid": "GPU-b", "instance": "1-code", "model_name": "code", "model_rank": 1}
    old = {"gpu_index": 1, "gpu_uuid": "GPU-b"}
    assert [filters.llama_server_instance_id(p) for p in (first, second, old)] == ["1", "1-code", "1"]
    assert [filters.llama_server_port(p, 8080, 100) for p in (first, second, old)] == [8081, 8181, 8081]
    records = [filters.llama_server_instance(p, 8080, "k", {"1": "f-chat", "1-code": "f-code"}, 100)
               for p in (first, second)]
    assert [(r["unit"], r["port"], r["fingerprint"], r["model_name"]) for r in records] == [
        ("llama-server@1.service", 8081, "f-chat", "chat"), ("llama-server@1-code.service", 8181, "f-code", "code")]
    # a rollback of one model's instance leaves the other model's on the same GPU alone
    fact = _rollback_filters().llama_server_record_rollback(
        {"summary": "2 instances", "instances": [dict(r, build_key="slow") for r in records]},
        [{"gpu_index": 1, "instance": "1-code", "model_name": "code", "model_rank": 1, "build_key": "fast"}],
        {"1-code": "f-back"})
    assert [(i["build_key"], i["fingerprint"]) for i in fact["instances"]] == [("slow", "f-chat"), ("fast", "f-back")]
    assert fact["summary"].endswith("GPU 1 (code) switched back to build fast (the rollout's speed gate refused the "
                                    "change)")
