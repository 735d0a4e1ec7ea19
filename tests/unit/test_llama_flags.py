"""One flag table for every llama.cpp command line built from a plan
(module_utils/llama_flags.py), and the filters that render through it."""
import paths
import pytest

paths.use_module_utils()
from ansible.module_utils import llama_flags  # noqa: E402

bench = paths.load_file("verify_bench", "roles/verify/filter_plugins/verify_bench.py")
server = paths.load_file("llama_server_filters", "roles/llama_server/filter_plugins/llama_server.py")
MIB, GIB = 1 << 20, 1 << 30

PLAN = {"model_path": "/m/q4.gguf", "ctx_size": 32768, "parallel": 4, "n_gpu_layers": 65, "cache_type_k": "q8_0",
        "cache_type_v": "q8_0", "flash_attn": True, "batch_size": 2048, "ubatch_size": 512,
        "memory": {"weights_bytes": 16 * GIB, "compute_bytes": 300 * MIB, "overhead_cuda_bytes": 576 * MIB}}
INSTANCE = {"model_path": "/m/q4.gguf", "cache_type_k": "q8_0", "cache_type_v": "q8_0", "gpu_index": 0}
CUDA = {"backend": "cuda", "cuda_version": "11.8", "targets": ["llama-server", "llama-bench"]}


def test_each_program_gets_only_the_flags_it_takes():
    assert llama_flags.plan_argv(PLAN, "llama-fit-params", short=True) == [
        "-m", "/m/q4.gguf", "-c", "32768", "-ngl", "65", "-ctk", "q8_0", "-ctv", "q8_0", "-fa", "on",
        "-b", "2048", "-ub", "512"]
    assert llama_flags.plan_argv(PLAN, "llama-bench", short=True) == [
        "-m", "/m/q4.gguf", "-ngl", "65", "-ctk", "q8_0", "-ctv", "q8_0", "-fa", "1"]
    assert "--parallel" in llama_flags.plan_argv(PLAN, "llama-server")


def test_split_flags_only_for_a_plan_over_several_gpus():
    assert "-sm" not in llama_flags.plan_argv(dict(PLAN, split_mode="none", tensor_split=[1.0]), "llama-server",
                                              short=True)
    split = dict(PLAN, split_mode="tensor", tensor_split=[0.5, 0.5])
    assert llama_flags.plan_argv(split, "llama-server")[-4:] == ["--split-mode", "tensor", "--tensor-split", "0.5,0.5"]
    assert llama_flags.plan_argv(split, "llama-fit-params", short=True)[-4:] == ["-sm", "tensor", "-ts", "0.5,0.5"]
    # llama-bench lists test values with ',': its proportions take '/'
    assert llama_flags.plan_argv(dict(split, tensor_split=[0.6, 0.4]), "llama-bench", short=True)[-4:] == [
        "-sm", "tensor", "-ts", "0.6/0.4"]


def test_a_missing_plan_key_or_an_unknown_program_is_named():
    with pytest.raises(KeyError, match="ctx_size"):
        llama_flags.plan_argv({"model_path": "/m"}, "llama-server")
    with pytest.raises(ValueError, match="llama-cli"):
        llama_flags.plan_argv(PLAN, "llama-cli")


def test_flash_attention_is_on_off_for_the_server_and_1_0_for_the_bench():
    assert llama_flags.flash_attn_value(False, "llama-server") == "off"
    assert llama_flags.flash_attn_value("auto", "llama-server") == "auto"
    assert llama_flags.flash_attn_value(False, "llama-bench") == "0"


def test_the_bench_runs_beside_the_server_when_a_second_copy_fits():
    needs = bench.verify_bench_needs_bytes(PLAN, CUDA)
    assert needs == 16 * GIB + 300 * MIB + 576 * MIB + 256 * MIB
    assert bench.verify_bench_decision(PLAN, {"memory_free_bytes": needs}, CUDA) == {"skip": "", "stops_server": False}


def test_the_bench_is_skipped_or_stops_the_server_when_it_does_not_fit():
    gpu = {"memory_free_bytes": 8 * GIB}
    skipped = bench.verify_bench_decision(PLAN, gpu, CUDA)
    assert "needs 17.1 GiB" in skipped["skip"] and "8.0 GiB free" in skipped["skip"]
    assert bench.verify_bench_decision(PLAN, gpu, CUDA, stop_server=True) == {"skip": "", "stops_server": True}
    # A CPU build uses no GPU memory: it always runs beside the server.
    assert bench.verify_bench_decision(PLAN, gpu, dict(CUDA, backend="cpu"))["skip"] == ""
    assert "no llama-bench" in bench.verify_bench_decision(PLAN, gpu, dict(CUDA, targets=["llama-server"]))["skip"]
    assert bench.verify_bench_decision(PLAN, gpu, CUDA, enabled=False)["skip"].startswith("disabled")


def test_a_plan_without_its_cuda_figure_gets_the_planners():
    plan = {"memory": {"weights_bytes": GIB, "compute_bytes": 0}}
    assert bench.verify_bench_needs_bytes(plan, CUDA) == GIB + 576 * MIB + 256 * MIB


def test_the_bench_command_line():
    argv = bench.verify_bench_argv(INSTANCE, {"n_gpu_layers": 40, "flash_attn": False}, "/opt/b", 512, 128, 3, 900)
    assert argv == ["timeout", "900", "/opt/b/llama-bench", "-m", "/m/q4.gguf", "-ngl", "40", "-ctk", "q8_0",
                    "-ctv", "q8_0", "-fa", "0", "-p", "512", "-n", "128", "-r", "3", "-o", "json"]
    assert bench.verify_bench_argv(INSTANCE, {}, "/b", 1, 1, 1, 1)[4:9] == ["/m/q4.gguf", "-ngl", "999", "-ctk", "q8_0"]


def test_the_health_wait_grows_with_the_model():
    assert server.llama_server_health_retries(0, 60, 15, 2) == 30
    assert server.llama_server_health_retries(int(16.5 * GIB), 60, 15, 2) == 154


def test_the_flags_that_are_no_plan_key_come_from_the_table_too():
    assert llama_flags.run_flag("threads", 8) == ("--threads", "8")
    assert llama_flags.run_flag("threads_batch", 8, short=True) == ("-tb", "8")
    assert llama_flags.run_flag("fit", "off", short=True) == ("-fit", "off")
    with pytest.raises(ValueError, match="no llama-server flag is known for 'thread'"):
        llama_flags.run_flag("thread", 8)


def test_backend_sampling_is_a_switch_only_the_server_takes():
    on = dict(PLAN, backend_sampling=True)
    assert llama_flags.plan_argv(on, "llama-server", short=True) == llama_flags.plan_argv(
        PLAN, "llama-server", short=True) + ["-bs"]
    assert llama_flags.plan_argv(on, "llama-server")[-1] == "--backend-sampling"
    # off, or a plan recorded before the key existed: no flag, the command line as it was
    assert llama_flags.plan_argv(dict(PLAN, backend_sampling=False), "llama-server") == llama_flags.plan_argv(
        PLAN, "llama-server")
    assert "-bs" not in llama_flags.plan_argv(on, "llama-fit-params", short=True)
    assert "-bs" not in llama_flags.plan_argv(on, "llama-bench", short=True)
