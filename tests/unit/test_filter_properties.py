"""Bad input as a class (issue 31), the filters: every filter the project defines (each
plugin's FilterModule().filters()) is called with hostile arguments built from its
signature and a realistic input (the facts of a real GPU host run,
benchmarks/results/gpu-host-2026-12-01e, and the unit tests' fixtures): None, booleans,
huge and negative numbers, NaN and infinities, text with newlines and control
characters, nested and empty containers, wrong types, and that realistic input
mutated at any depth. Each call returns, or raises Ansible's own error with a message,
within 5 s: never a TypeError, KeyError, ... traceback, never a hang. Fixed seeds
(derandomize) and bounded example counts keep the cost to seconds; what the search
found is kept as plain tests at the end."""
import copy
import inspect
import json
import time

import pytest
from ansible.errors import AnsibleError
from hypothesis import HealthCheck, given, settings, strategies as st

import paths

RESULTS = paths.ROOT / "benchmarks" / "results" / "gpu-host-2026-12-01e"
PLUGINS = ["filter_plugins/calibration.py", "filter_plugins/fleet_summary.py", "filter_plugins/gpu_health.py",
           "filter_plugins/listen_address.py", "filter_plugins/rollout.py", "filter_plugins/stage_contract.py",
           "filter_plugins/systemd_unit.py", "roles/llama_cpp/filter_plugins/llama_cpp.py",
           "roles/llama_server/filter_plugins/llama_server.py",
           "roles/llama_server/filter_plugins/llama_server_rollback.py",
           "roles/llm_model/filter_plugins/llm_model.py", "roles/prometheus/filter_plugins/scrape_targets.py",
           "roles/verify/filter_plugins/verify_bench.py", "roles/verify/filter_plugins/verify_render.py",
           "roles/verify/filter_plugins/verify_report.py",
           "roles/verify/filter_plugins/verify_speed_gate.py"]
FILTERS = {}
for _path in PLUGINS:
    _module = paths.load_file("properties_" + _path.replace("/", "_")[:-3], _path)
    FILTERS.update(_module.FilterModule().filters())

PROPERTY = settings(derandomize=True, max_examples=100, deadline=None, database=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
BOUND_S = 5.0
GIB = 1 << 30


def _fact(name):
    return json.loads((RESULTS / name).read_text())


# --- a realistic input for each filter ---------------------------------------------------------
MODEL = _fact("llm_fleet_model.fact")
LLAMA_CPP = _fact("llm_fleet_llama_cpp.fact")
VERIFY = _fact("llm_fleet_verify.fact")
CALIBRATION = _fact("decode-calibration.json")
HELP = (RESULTS / "llama-server-help.txt").read_text()
VERSION = (RESULTS / "llama-server-version.txt").read_text()
CUBINS = (RESULTS / "cuobjdump-list-elf.txt").read_text()
PLAN = dict(MODEL["plans"][0], candidate=dict(MODEL["plans"][0]["candidate"], catalogue_index=0))
UUID = PLAN["gpu_uuid"]
FLAGS = FILTERS["llama_cpp_help_flags"](HELP)
HEALTH = {"ecc_enabled": True, "ecc_errors": {"corrected_volatile": 0, "corrected_aggregate": 0,
                                              "uncorrected_volatile": 2, "uncorrected_aggregate": 2},
          "retired_pages": {"single_bit": 0, "double_bit": 1, "pending": False}, "remapped_rows": None,
          "processes": [{"pid": 7, "name": "sleep", "used_bytes": 14 * GIB}], "xid_events": [{"time": 1.5, "xid": 48}]}
GPU = {"index": 0, "uuid": UUID, "name": "NVIDIA H200", "memory_total_bytes": 140 * GIB,
       "memory_used_bytes": 27 * GIB, "memory_free_bytes": 110 * GIB, "memory_bandwidth_bytes_per_s": 4.8e12,
       "compute_capability": "9.0", "numa_node": 0, "cpu_affinity": "0-15", "health": HEALTH}
INSTANCE = {"gpu_index": 0, "gpu_uuid": UUID, "port": 8080, "unit": "llama-server@0.service",
            "model_path": PLAN["model_path"], "quant": PLAN["quant"], "ctx_size": PLAN["ctx_size"],
            "parallel": PLAN["parallel"], "cache_type_k": "f16", "cache_type_v": "f16"}
SHA = "ab" * 32
CATALOGUE = [{"quant": "Q4_K_M", "hf_repo": "o/r", "hf_file": "q4.gguf", "sha256": SHA, "size_bytes": 100,
              "metadata": {"architecture": "qwen2", "block_count": 64}},
             {"quant": "Q8_0", "files": [{"url": "https://m/q8-00001-of-00002.gguf", "sha256": SHA, "size_bytes": 9},
                                         {"path": "/srv/q8-00002-of-00002.gguf", "sha256": SHA}]}]
ENTRIES = FILTERS["llm_model_entries"](CATALOGUE, "/srv/models")
FETCHED = {"files": [{"path": ENTRIES[0]["model_path"], "action": "present"}]}
SERVED_MODELS = FILTERS["llm_model_served"]([{"name": "chat", "catalogue": CATALOGUE},
                                              {"name": "embed", "catalogue": CATALOGUE[:1]}], [], "", {}, "/srv/models")
FIT = {"results": [{"item": {"gpu_index": 0}, "rc": 0, "stdout": "CUDA0 100 200 300\nHost 5 0 0\n"}]}


def _level(c, per):
    return {"concurrency": c, "streams_ok": c, "errors": [], "wall_s": 7.0, "tokens": 128 * c, "aggregate_tps": per * c,
            "aggregate_decode_tps": per * c, "per_stream_tps_mean": per, "per_stream_tps_min": per,
            "server_predicted_tps_mean": per, "ttft_s_mean": 0.2, "ttft_s_max": 0.3}


LOADTEST = {"version": 1, "ok": True, "total_slots": 4, "n_predict": 128, "levels": [_level(1, 60.0), _level(4, 40.0)],
            "skipped": []}
BENCH = {"rc": 0, "stdout": json.dumps([{"n_prompt": 512, "n_gen": 0, "avg_ts": 3000.0, "stddev_ts": 1.0},
                                        {"n_prompt": 0, "n_gen": 128, "avg_ts": 70.0, "stddev_ts": 0.5}])}
REPORT = FILTERS["verify_fleet_report"]([VERIFY], "2026-12-01T18:00:00Z", {"min_ceiling_fraction": 0.25})
SERVED = [{"gpu_index": 0, "fingerprint": "new"}]
GATE = FILTERS["verify_speed_gate"](VERIFY, SERVED, {"0": "old"}, CALIBRATION, 0.9, True)
LOCAL = {"llm_fleet_model": MODEL, "llm_fleet_llama_cpp": LLAMA_CPP, "llm_fleet_verify": VERIFY,
         "llm_fleet_gpu_tuning": {"settings": [{"index": 0, "locked_graphics_clock_mhz": 1980, "power_limit_w": 700}]},
         "llm_fleet_llama_server": {"held": [{"gpu_index": 1, "problems": [{"check": "xid"}]}]}}
OPTIONS = {"host": "127.0.0.1", "port": 8080, "alias": "Q4_K_M", "threads": 8, "metrics": True,
           "api_key_file": "/etc/llm-fleet/key", "lock_memory": True, "llama_fit": False, "extra_args": ["--no-webui"]}

REALISTIC = {
    "llm_fleet_calibration": (json.dumps(CALIBRATION), "/srv/calibration.json"),
    "llm_fleet_calibration_merge": (CALIBRATION, VERIFY["calibration"]),
    "llm_fleet_calibration_line": (CALIBRATION["records"][0],),
    "llm_fleet_baselines_merge": (CALIBRATION, [{"host": "gpu-host", "gate": GATE}], "2026-12-01T18:00:00Z"),
    "llm_fleet_decisions": (["gpu-host", "gone"], {"gpu-host": {"ansible_facts": {"ansible_local": LOCAL}}}),
    "llm_fleet_gpu_gate": ([PLAN], [GPU], "refuse", [], {"readmitted": [], "held": []}, "1764640000", 3600, False),
    "llm_fleet_local_address": ("127.0.0.1", "llama_server_host"),
    "llm_fleet_port": (8080, "llama_server_base_port"),
    "llm_fleet_local_url": ("::1", 8080, "http", "llama_server_host"),
    "llm_fleet_canary_hosts": (["h%d" % n for n in range(10)], "10%"),
    "llm_fleet_fact_path": ("model",),
    "llm_fleet_fact": ({"plans": [], "summary": "x"}, "model"),
    "llm_fleet_stage_fact": ({"llm_fleet_model": MODEL}, "model"),
    "systemd_exec_args": (["--model", "/srv/m.gguf", "-c", 8192], "llama_server_extra_args"),
    "systemd_exec_path": ("/opt/llama.cpp/bin/llama-server", "llama_server_install_dir"),
    "systemd_env": ("CUDA_MODULE_LOADING", "LAZY", "llama_server_environment"),
    "systemd_path": ("/var/lib/llm-fleet/models", "llm_model_dir"),
    "systemd_line": ("gpu01 GPU 0", "a description"),
    "systemd_user": ("llama", "llama_server_user", False),
    "llama_cpp_ninja_progress": ("[1/980] cc a.c\n[412/980] cc b.c\n",),
    "llama_cpp_build_key": ({"cmake": ["-DGGML_CUDA=ON"], "patches": []}, "0c1e57098", "cuda", ["70", "90"]),
    "llama_cpp_build_plan": ([{"host": "a", "key": "k1", "spec": {"x": 1}, "installed": False},
                              {"host": "b", "key": "k1", "spec": {"x": 1}, "installed": True}], ""),
    "llama_cpp_cmake_flags": ({"GGML_CUDA": "ON", "CMAKE_CUDA_ARCHITECTURES": "70;90"},),
    "llama_cpp_cubin_archs": (CUBINS,),
    "llama_cpp_missing_archs": (["70", "90"], CUBINS),
    "llama_cpp_help_flags": (HELP,),
    "llama_cpp_version_info": (VERSION,),
    "llama_server_args": (PLAN, OPTIONS, FLAGS),
    "llama_server_instance": (PLAN, 8080, "0c1e57098-cuda", {"0": "f1"}),
    "llama_server_instance_id": (dict(PLAN, instance="0-embed", model_rank=1),),
    "llama_server_port": (dict(PLAN, model_rank=1), 8080, 100),
    "llama_server_router_preset": ([dict(PLAN, model_name="code", load="on_demand")], OPTIONS,
                                   FLAGS + ["--models-preset", "--models-max"]),
    "llama_server_router_args": ({"gpu_index": 0, "models": ["code"], "models_max": 1},
                                 {"host": "127.0.0.1", "port": 8180, "preset": "/etc/p.ini"},
                                 FLAGS + ["--models-preset", "--models-max"]),
    "llama_server_on_demand_instance": (dict(PLAN, model_name="code", model_rank=1, load="on_demand"),
                                        {"gpu_index": 0, "models": ["code"], "models_max": 1, "model_rank": 1},
                                        8080, "0c1e57098-cuda", {"0-router": "f1"}),
    "llama_server_health_retries": (18 * GIB, 30, 10, 5),
    "llama_server_environment": (LLAMA_CPP, "auto"),
    "llama_server_cpu_list": ("0-19,40-59", "Cpus_allowed_list:\t0-79\n"),
    "llama_server_systemd_version": ("systemd 245 (245.4-4ubuntu3.23)\n+PAM",),
    "llama_server_dropin_build": ("# GPU 0\n# build cuda-70-abc\n[Service]\n",),
    "llama_server_record_rollback": ({"summary": "1 instance", "instances": [{"gpu_index": 0, "build_key": "slow"}]},
                                     [{"gpu_index": 0, "build_key": "fast"}], {"0": "o"}),
    "llm_model_entries": (CATALOGUE, "/srv/models"),
    "llm_model_candidates": (ENTRIES, [PLAN]),
    "llm_model_fetch_files": (ENTRIES, [PLAN]),
    "llm_model_gpus": ([GPU], "plan_around"),
    "llm_model_plan_lines": ({"plans": [PLAN], "summary": "GPU 0: Q4_K_M", "table": ["a b c"]},),
    "llm_model_fit_argv": (PLAN, "/opt/llama.cpp/bin/llama-fit-params"),
    "llm_model_fit_estimate": (FIT["results"][0], PLAN, "llama-fit-params"),
    "llm_model_record": ([PLAN], ENTRIES, FETCHED, FIT, "llama-fit-params", "qwen", "/srv/models", {"objective": "x"},
                         {"plans": [PLAN]}, [{"item": {"key": "other"}, "plans": [PLAN]}]),
    "llm_model_served": ([{"name": "chat", "catalogue": CATALOGUE, "policy": {"min_ctx": 4096}},
                          {"name": "embed", "catalogue": CATALOGUE[:1], "gpus": 1}], [], "", {}, "/srv/models"),
    "llm_model_plan_models": (SERVED_MODELS, [dict(PLAN, model_name="chat")]),
    "llm_model_draft_candidate": (ENTRIES[0],),
    "llm_model_fetch_all": (SERVED_MODELS, [dict(PLAN, model_name="chat"), dict(PLAN, model_name="embed")]),
    "llm_model_records": ([dict(PLAN, model_name="chat"), dict(PLAN, model_name="embed")], SERVED_MODELS, FETCHED,
                          FIT, "llama-fit-params", "/srv/models", {"plans": [dict(PLAN, model_name="chat")],
                                                                  "placement": {"0": ["chat", "embed"]}}, []),
    "llm_model_preview_lines": ([{"item": {"key": "other"}, "plans": [PLAN]}],),
    "llm_model_progress_line": (json.dumps({"file": "q4.gguf", "done_bytes": 5 * GIB, "total_bytes": 18 * GIB,
                                            "rate_bytes_per_s": 1e8, "eta_s": 130.5}),),
    "llm_fleet_reachable_targets": ([{"targets": ["127.0.0.1:9400", "[::1]:9100", "gpu01:9100"],
                                      "labels": {"host": "gpu01", "job": "node"}}], "mon"),
    "llm_fleet_front_groups": ([{"targets": ["gpu01:8443"], "labels": {"host": "gpu01", "job": "llm-fleet-frontend"}}],
                               {"gpu01": "k"}, ""),
    "llm_fleet_fact_targets": ([{"host": "gpu01", "read": True, "why": "", "certificate": "",
                                 "gpu": [{"targets": ["gpu01:9400"], "labels": {"host": "gpu01", "job": "llm-fleet-gpu"}}],
                                 "fronts": [{"targets": ["gpu01:8443"],
                                             "labels": {"host": "gpu01", "job": "llm-fleet-frontend"}}]},
                                {"host": "gpu02", "read": False, "why": "no route"}],
                               [{"targets": ["gpu02:9400"], "labels": {"host": "gpu02", "job": "llm-fleet-gpu"}}], ""),
    "verify_bench_decision": (PLAN, GPU, LLAMA_CPP, True, False),
    "verify_bench_argv": (INSTANCE, PLAN, "/opt/llama.cpp/bin", 512, 128, 3, 600),
    "verify_host_record": ("gpu-host", [INSTANCE], [PLAN], [GPU], [{"rc": 0, "stdout": json.dumps(LOADTEST)}], [BENCH],
                           LLAMA_CPP, 0.25, "2026-12-01T18:00:00Z"),
    "verify_progress_line": (VERIFY,),
    "verify_fleet_report": ([VERIFY], "2026-12-01T18:00:00Z", {"min_ceiling_fraction": 0.25}),
    "verify_fleet_markdown": (REPORT, ["gpu02"]),
    "verify_fleet_svg": (REPORT, 720),
    "verify_fleet_vram_svg": (REPORT, 720),
    "verify_llama_bench_figures": (BENCH,),
    "verify_speed_gate": (VERIFY, SERVED, {"0": "old"}, CALIBRATION, 0.9, True),
}


# --- hostile values ------------------------------------------------------------------------------
_TEXT = st.one_of(st.text(max_size=12), st.sampled_from([
    "", " ", "\n", "a\nb", "\r\n", "\x00", "\x1b[31m", "-1", "0", "nan", "inf", "1e400", "-0", "0-99999999999",
    "0-3,x", "%s%d", "{}", "[]", "{\"file\": 1}", "\u2603", "9" * 5000, "x" * 100000]))
_SCALAR = st.one_of(st.none(), st.booleans(), st.integers(),
                    st.sampled_from([-1, 0, 1, 2 ** 31, 2 ** 63, -2 ** 63, 10 ** 30, 10 ** 400]),
                    st.floats(), st.sampled_from([float("nan"), float("inf"), -float("inf"), -0.0, 1e308]),
                    _TEXT, st.binary(max_size=4))
HOSTILE = st.one_of(st.sampled_from([[], {}, (), "", [None], {"": None}, [[[]]], {"a": {"b": {}}}]),
                    st.recursive(_SCALAR, lambda inner: st.one_of(
                        st.lists(inner, max_size=3), st.dictionaries(st.one_of(st.text(max_size=4), st.integers()),
                                                                     inner, max_size=3)), max_leaves=6))


@st.composite
def mutated(draw, value):
    """value with one place (any depth) replaced by a hostile value, removed, or emptied."""
    if isinstance(value, dict) and value and draw(st.integers(0, 9)) < 8:
        key = draw(st.sampled_from(sorted(value, key=repr)))
        out = dict(value)
        if draw(st.integers(0, 5)) == 0:
            del out[key]
        else:
            out[key] = draw(mutated(value[key]))
        return out
    if isinstance(value, (list, tuple)) and value and draw(st.integers(0, 9)) < 8:
        index = draw(st.integers(0, len(value) - 1))
        out = list(value)
        out[index] = draw(mutated(value[index]))
        return out
    return draw(HOSTILE)


@st.composite
def hostile_args(draw, name):
    """The filter's realistic arguments with one replaced by a hostile value, or mutated inside
    (one to three places), or every one hostile."""
    args = list(copy.deepcopy(REALISTIC[name]))
    how = draw(st.integers(0, 9))
    if how < 4:
        args[draw(st.integers(0, len(args) - 1))] = draw(HOSTILE)
    elif how < 9:
        for _ in range(draw(st.integers(1, 3))):
            position = draw(st.integers(0, len(args) - 1))
            args[position] = draw(mutated(args[position]))
    else:
        args = [draw(HOSTILE) for _ in args]
    return args


def call(name, args):
    """The filter's answer, or its error's message; a traceback or a hang fails the test."""
    start = time.monotonic()
    try:
        return FILTERS[name](*args), None
    except AnsibleError as err:
        assert str(err).strip(), "%s raised %r without a message" % (name, err)
        return None, str(err)
    finally:
        assert time.monotonic() - start < BOUND_S, "%s took %.1f s" % (name, time.monotonic() - start)


def test_every_filter_of_the_project_has_a_realistic_input():
    assert sorted(FILTERS) == sorted(REALISTIC)
    for name, args in REALISTIC.items():
        signature = inspect.signature(FILTERS[name])
        signature.bind(*args)  # as many arguments as the filter takes


@pytest.mark.parametrize("name", sorted(REALISTIC))
def test_the_realistic_input_gives_a_result(name):
    result, err = call(name, copy.deepcopy(REALISTIC[name]))
    assert err is None, err


@pytest.mark.parametrize("name", sorted(REALISTIC))
@PROPERTY
@given(data=st.data())
def test_hostile_arguments_give_a_result_or_a_named_error_never_a_traceback(name, data):
    call(name, data.draw(hostile_args(name)))


# --- what the search found, kept as plain tests ----------------------------------------------------
# (filter, arguments, what the message names): the smallest failing input the search found for
# each filter before its boundary was checked, and deeper ones it found or the sweep named.
_DEEP_PLAN = dict(PLAN, memory=dict(PLAN["memory"], weights_bytes="18 GB"))
FOUND = [
    ("llama_cpp_build_key", [{"cmake": []}, "0c1e57098", "cuda", 70], "archs must be a list"),
    ("llama_cpp_build_plan", [[None], ""], "builds must be a list of mappings"),
    ("llama_cpp_build_plan", [[{"host": "a"}], ""], "llama_cpp_build_plan: a value inside"),
    ("llama_cpp_cmake_flags", [[None]], "definitions must be a mapping"),
    ("llama_cpp_cubin_archs", [[None]], "listing must be text"),
    ("llama_cpp_help_flags", [[None]], "text must be text"),
    ("llama_cpp_missing_archs", [True, CUBINS], "archs must be a list"),
    ("llama_cpp_version_info", [[None]], "text must be text"),
    ("llama_cpp_ninja_progress", ["[1/%s]" % ("9" * 5000)], "llama_cpp_ninja_progress"),
    ("llama_server_args", [[], OPTIONS, FLAGS], "plan must be a mapping"),
    ("llama_server_args", [PLAN, dict(OPTIONS, host=None, port=None, threads=None), []], "no --model flag"),
    ("llama_server_args", [PLAN, {"alias": "x"}, FLAGS], "llama_server_args: a value inside"),
    ("llama_server_cpu_list", [[None], "0-79"], "llama_server_cpu_list"),
    ("llama_server_cpu_list", ["0-99999999999", None], "not a CPU list"),
    ("llama_server_cpu_list", [[0, 10 ** 12], None], "outside 0-65535"),
    ("llama_server_environment", [[None], "auto"], "llama_cpp_fact must be a mapping"),
    ("llama_server_health_retries", [18 * GIB, [], 10, 5], "llama_server_health_retries"),
    ("llama_server_health_retries", [18 * GIB, 30, 10, 0], "ZeroDivisionError"),
    ("llama_server_health_retries", [float("inf"), 30, 10, 5], "llama_server_health_retries"),
    ("llama_server_instance", [[], 8080, "k", {}], "plan must be a mapping"),
    ("llama_server_instance", [{"gpu_index": "x"}, 8080, "k", {}], "llama_server_instance: a value inside"),
    ("llama_server_record_rollback", [[None], [{"gpu_index": 0, "build_key": "fast"}], {}], "fact must be a mapping"),
    ("llama_server_record_rollback", [{}, [{"gpu_index": None}], {}], "llama_server_record_rollback"),
    ("llm_fleet_baselines_merge", [[None], [], None], "calibration must be a mapping"),
    ("llm_fleet_calibration_line", [[]], "record must be a mapping"),
    ("llm_fleet_calibration_merge", [CALIBRATION, [[[]]]], "records must be a list of mappings"),
    ("llm_fleet_canary_hosts", [True, "10%"], "hosts must be a list"),
    ("llm_fleet_decisions", [["gpu-host"], None], "hostvars must be a mapping"),
    ("llm_fleet_decisions", [["gpu-host"], {"gpu-host": {"ansible_facts": {"ansible_local": {
        "llm_fleet_model": {"plans": [dict(PLAN, ctx_size="big")]}}}}}], "llm_fleet_decisions: a value inside"),
    ("llm_fleet_fact", [[], "model"], "content must be a mapping"),
    ("llm_fleet_fact_path", [{}], "stage must be text"),
    ("llm_fleet_stage_fact", [{"llm_fleet_model": MODEL}, []], "stage must be text"),
    ("llm_fleet_gpu_gate", [[None], [GPU], "refuse", [], {}, None, None, False], "plans must be a list of mappings"),
    ("llm_fleet_gpu_gate", [[PLAN], [GPU], "refuse", [], {}, "never", 3600, False], "llm_fleet_gpu_gate"),
    ("llm_fleet_local_url", ["::1", 8080, "http", ()], "what must be text"),
    ("llm_fleet_reachable_targets", [[None], "mon"], "groups must be a list of mappings"),
    ("llm_fleet_front_groups", [[{}], ["gpu01"], ""], "keys must be a mapping"),
    ("llm_fleet_fact_targets", [["gpu01"]], "hosts must be a list of mappings"),
    ("llm_model_candidates", [[None], [PLAN]], "entries must be a list of mappings"),
    ("llm_model_fetch_files", [[None], [PLAN]], "entries must be a list of mappings"),
    ("llm_model_fit_argv", [[], "llama-fit-params"], "plan must be a mapping"),
    ("llm_model_fit_estimate", [FIT["results"][0], [], "llama-fit-params"], "plan must be a mapping"),
    ("llm_model_fit_estimate", [FIT["results"][0], _DEEP_PLAN, "llama-fit-params"], "llm_model_fit_estimate"),
    ("llm_model_gpus", [[None], "plan_around"], "gpus must be a list of mappings"),
    ("llm_model_plan_lines", [[]], "result must be a mapping"),
    ("llm_model_preview_lines", [[None]], "results must be a list of mappings"),
    ("llm_model_progress_line", [[None]], "llm_model_progress_line"),
    ("llm_model_progress_line", ['{"file": "x", "eta_s": NaN}'], "llm_model_progress_line"),
    ("llm_model_record", [[dict(PLAN, candidate={"catalogue_index": 7})], ENTRIES, FETCHED, FIT, "t", "m", "/m", {},
                          {}, []], "llm_model_record: a value inside"),
    ("systemd_exec_args", [["--model", "/srv/m.gguf"], ()], "what must be text"),
    ("verify_bench_argv", [[], PLAN, "/bin", 512, 128, 3, 600], "instance must be a mapping"),
    ("verify_bench_decision", [[None], GPU, LLAMA_CPP, True, False], "plan must be a mapping"),
    ("verify_bench_decision", [_DEEP_PLAN, GPU, LLAMA_CPP, True, False], "verify_bench_decision"),
    ("verify_fleet_markdown", [[], ["gpu02"]], "report must be a mapping"),
    ("verify_fleet_report", [True, None, None], "records must be a list"),
    ("verify_fleet_svg", [[], 720], "report must be a mapping"),
    ("verify_fleet_vram_svg", [[], 720], "report must be a mapping"),
    ("verify_host_record", ["gpu-host", [None], [PLAN], [GPU], [], [], LLAMA_CPP, 0.25, None],
     "instances must be a list of mappings"),
    ("verify_host_record", ["gpu-host", [INSTANCE], [PLAN], [GPU], [{"rc": 0, "stdout": json.dumps(LOADTEST)}], [],
                            LLAMA_CPP, "a quarter", None],
     "verify_host_record"),
    ("verify_llama_bench_figures", [[None]], "result must be a mapping"),
    ("verify_progress_line", [[]], "record must be a mapping"),
    ("verify_speed_gate", [[None], SERVED, {}, CALIBRATION, 0.9, True], "record must be a mapping"),
]


@pytest.mark.parametrize("name, args, expected", FOUND, ids=["%s-%d" % (f[0], n) for n, f in enumerate(FOUND)])
def test_found_inputs_are_refused_by_name(name, args, expected):
    result, err = call(name, args)
    assert err is not None and expected in err, (result, err)


def test_a_lazy_list_from_jinja_is_read_as_a_list():
    hosts = (name for name in ["h1", "h2", "h3"])
    assert FILTERS["llm_fleet_canary_hosts"](hosts, 2) == ["h1", "h2"]


def test_an_error_names_the_filter_the_argument_the_value_and_what_is_expected():
    result, err = call("verify_fleet_svg", [["x" * 500], 720])
    assert err.startswith("verify_fleet_svg: report must be a mapping, got ['xxx") and len(err) < 120, err
