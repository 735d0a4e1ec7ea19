"""The llama_cpp role's filters (roles/llama_cpp/filter_plugins/llama_cpp.py):
reading llama-server's --help and --version, and planning one compile per build."""
import importlib.util
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location(
    "llama_cpp_filters", ROOT / "roles" / "llama_cpp" / "filter_plugins" / "llama_cpp.py")
filters = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(filters)

# Excerpts of `llama-server --help` of llama.cpp 0c1e57098 (2026-10), verbatim.
HELP = """\
----- common params -----

-h,    --help, --usage                  print usage and exit
--version                               show version and build info
-t,    --threads N                      number of CPU threads to use during generation (default: -1)
                                        (env: LLAMA_ARG_THREADS)
-tb,   --threads-batch N                number of threads to use during batch and prompt processing (default:
                                        same as --threads)
--cpu-strict <0|1>                      use strict CPU placement (default: 0)
--prio N                                set process/thread priority : low(-1), normal(0), medium(1), high(2),
                                        realtime(3) (default: 0)
-kvo,  --kv-offload, -nkvo, --no-kv-offload
                                        whether to enable KV cache offloading (default: enabled)
-fit,  --fit [on|off]                   whether to adjust unset arguments to fit in device memory ('on' or
                                        'off', default: 'on')
-fitt, --fit-target MiB0,MiB1,MiB2,...
                                        target margin per device for --fit, comma-separated list of values,
-lm,   --load-mode MODE                 model loading mode (default: auto)
                                        - mmap: memory-map model (if mmap disabled, slower load but may reduce
                                        pageouts if not using mlock)
-hf,   -hfr, --hf-repo <user>/<model>[:quant]
                                        Hugging Face model repository; quant is optional, case-insensitive,
--spec-draft-type-k, -ctkd, --cache-type-k-draft TYPE
                                        KV cache data type for K for the draft model

----- example-specific params -----

--port PORT                             port to listen (default: 8080)
"""


def test_help_flags_lists_every_flag_and_nothing_from_the_help_text():
    flags = filters.llama_cpp_help_flags(HELP)
    assert flags == sorted([
        "-h", "--help", "--usage", "--version", "-t", "--threads", "-tb", "--threads-batch", "--cpu-strict",
        "--prio", "-kvo", "--kv-offload", "-nkvo", "--no-kv-offload", "-fit", "--fit", "-fitt", "--fit-target",
        "-lm", "--load-mode", "-hf", "-hfr", "--hf-repo", "--spec-draft-type-k", "-ctkd",
        "--cache-type-k-draft", "--port"])
    # Flags only mentioned in help text are not flags of that line ("same as --threads").
    assert "-1" not in flags and "--mmap" not in flags


def test_help_flags_of_nothing_is_empty():
    assert filters.llama_cpp_help_flags("") == []
    assert filters.llama_cpp_help_flags(None) == []


def test_version_info_reads_the_2026_format():
    info = filters.llama_cpp_version_info(
        "ggml_cuda_init: found 1 CUDA devices:\nversion: 0.5.0-dev (build 0, commit 0c1e57098)\n"
        "built with GNU 12.2.0 for Linux x86_64\n")
    assert info == {"version": "0.5.0-dev", "number": 0, "commit": "0c1e57098", "compiler": "GNU 12.2.0",
                    "target": "Linux x86_64",
                    "text": "version: 0.5.0-dev (build 0, commit 0c1e57098) built with GNU 12.2.0 for Linux x86_64"}


def test_version_info_reads_the_older_format():
    info = filters.llama_cpp_version_info("version: 6500 (4df29be4f)\nbuilt with cc (Ubuntu 11.4.0) for x86_64-linux-gnu")
    assert (info["number"], info["commit"], info["version"]) == (6500, "4df29be4f", None)
    assert info["compiler"] == "cc (Ubuntu 11.4.0)"


def test_version_info_of_garbage_is_empty():
    assert filters.llama_cpp_version_info("error while loading shared libraries")["commit"] is None


def _build(host, key, installed=False):
    return {"host": host, "key": key, "spec": {"key": key}, "installed": installed}


def test_plan_compiles_once_per_key_on_its_first_host():
    fleet = [_build("gpu-%02d" % i, "k-sm70") for i in range(50)] + [_build("gpu-t4", "k-sm75")]
    plan = filters.llama_cpp_build_plan(fleet)
    assert sorted(plan) == ["k-sm70", "k-sm75"]
    assert plan["k-sm70"]["builder"] == "gpu-00" and len(plan["k-sm70"]["needed_by"]) == 50
    assert plan["k-sm75"]["builder"] == "gpu-t4" and plan["k-sm75"]["needed_by"] == ["gpu-t4"]


def test_plan_uses_the_designated_build_host_and_skips_installed_hosts():
    plan = filters.llama_cpp_build_plan(
        [_build("a", "k", installed=True), _build("b", "k"), _build("c", "k", installed=True)], "c")
    assert plan["k"]["builder"] == "c"
    assert plan["k"]["needed_by"] == ["b"]
    assert plan["k"]["hosts"] == ["a", "b", "c"]


def test_plan_of_an_installed_fleet_needs_nothing():
    plan = filters.llama_cpp_build_plan([_build("a", "k", True), _build("b", "k", True)])
    assert plan["k"]["needed_by"] == []


# `cuobjdump --list-elf libggml-cuda.so` prints one line per cubin (first lines of
# a real listing; the H200 build listed 144 such lines).
LIST_ELF_SM90 = """\
ELF file    1: libggml-cuda.1.sm_90.cubin
ELF file    2: libggml-cuda.2.sm_90.cubin
ELF file  144: libggml-cuda.144.sm_90.cubin
"""


def test_cubin_archs_reads_cuobjdump_list_elf():
    assert filters.llama_cpp_cubin_archs(LIST_ELF_SM90) == ["90"]
    assert filters.llama_cpp_cubin_archs(LIST_ELF_SM90.replace("sm_90.", "sm_70.", 1)) == ["70", "90"]
    assert filters.llama_cpp_cubin_archs("") == []


def test_missing_archs_names_what_the_build_lacks():
    # The regression of the first real-GPU run: a build holding sm_90 code passes for ["90"].
    assert filters.llama_cpp_missing_archs(["90"], LIST_ELF_SM90) == []
    assert filters.llama_cpp_missing_archs([90], LIST_ELF_SM90) == []
    assert filters.llama_cpp_missing_archs(["70"], LIST_ELF_SM90) == ["70"]
    assert filters.llama_cpp_missing_archs(["70", "90"], LIST_ELF_SM90) == ["70"]
    # "sm_9" is not "sm_90"; an empty listing holds nothing.
    assert filters.llama_cpp_missing_archs(["9"], LIST_ELF_SM90) == ["9"]
    assert filters.llama_cpp_missing_archs(["70"], "") == ["70"]


def test_cmake_flags_do_not_depend_on_the_order_options_are_written_in():
    one = filters.llama_cpp_cmake_flags({"GGML_CUDA": "ON", "CMAKE_C_FLAGS_RELEASE": "-O0", "CMAKE_CXX_FLAGS_RELEASE": "-O0"})
    two = filters.llama_cpp_cmake_flags({"CMAKE_CXX_FLAGS_RELEASE": "-O0", "CMAKE_C_FLAGS_RELEASE": "-O0", "GGML_CUDA": "ON"})
    assert one == two == ["-DCMAKE_CXX_FLAGS_RELEASE=-O0", "-DCMAKE_C_FLAGS_RELEASE=-O0", "-DGGML_CUDA=ON"]


def test_the_build_key_names_commit_backend_archs_and_hashes_the_rest():
    material = {"commit": "0c1e57098bba", "cmake_flags": ["-DGGML_CUDA=ON"], "targets": ["llama-server"]}
    key = filters.llama_cpp_build_key(material, "0c1e57098", "cuda", ["70"])
    assert re.match(r"^0c1e57098-cuda-sm70-[0-9a-f]{10}$", key), key
    assert filters.llama_cpp_build_key(dict(reversed(list(material.items()))), "0c1e57098", "cuda", ["70"]) == key
    assert filters.llama_cpp_build_key(dict(material, targets=[]), "0c1e57098", "cuda", ["70"]) != key
    assert re.match(r"^0c1e57098-cpu-[0-9a-f]{10}$", filters.llama_cpp_build_key(material, "0c1e57098", "cpu", []))
    assert "-sm70-sm80-" in filters.llama_cpp_build_key(material, "0c1e57098", "cuda", ["70", "80"])


@pytest.mark.parametrize("text, said", [
    ("-- Configuring done\n-- Generating done\n", "configuring (ninja has not started a step yet)"),
    ("", "configuring (ninja has not started a step yet)"),
    (None, "configuring (ninja has not started a step yet)"),
    ("[1/980] Building C object ggml/src/CMakeFiles/ggml-base.dir/ggml.c.o\n"
     "[412/980] Building CUDA object ggml/src/ggml-cuda/CMakeFiles/ggml-cuda.dir/mmq.cu.o\n", "step 412 of 980 (42%)"),
    # a line cut by `tail -c` at the start, then nvcc's warnings between steps
    ("/980] Building CXX\n[97/980] Linking CXX shared library bin/libggml-base.so\nwarning: x\n",
     "step 97 of 980 (9%)"),
    ("[980/980] Linking CXX executable bin/llama-server\n", "step 980 of 980 (100%)"),
])
def test_ninja_progress(text, said):
    assert filters.llama_cpp_ninja_progress(text) == said
