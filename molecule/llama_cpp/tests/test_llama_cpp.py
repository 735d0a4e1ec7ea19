"""The llama.cpp build stage, read from the hosts: two simulated V100 hosts
that converge compiled llama.cpp for once (CUDA backend for the compute
capability NVML reports, with the simulated CUDA 11.8 toolkit, from the source
archive on the controller), then a rerun, a changed source, a broken source, a
rollback, pruning, a build without the GPUs' architecture and a CPU build, each
driven through playbooks/llama_cpp.yml like an operator would.

The tests run in file order: each later one starts from the state the one
before left (the build that is current, the builds kept).
"""
import difflib
import json
import os
import re
import subprocess
import tarfile
import time

import pytest
import testinfra
import yaml

from hostprobe import harness_group_vars, recap, run_playbook

HOSTS = ["lcpp-1-sxm2-32gb", "lcpp-2-pcie-16gb"]
BUILDER = HOSTS[0]  # the first host of the play compiles
PLAYBOOK = "playbooks/llama_cpp.yml"
PREFIX = "/opt/llm-fleet/llama.cpp"
FACT = "/etc/ansible/facts.d/llm_fleet_llama_cpp.fact"
BUILD_LOG = "/var/cache/llm-fleet/llama.cpp-build/work/build.log"
SCENARIO_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
REPO = os.path.dirname(os.path.dirname(SCENARIO_DIR))
PATCHED_FILE = "tools/quantize/quantize.cpp"
PATCH_MARK = "llm-fleet test patch: changed source"
BROKEN_MARK = "llm-fleet test: deliberately broken source"

with open(os.path.join(SCENARIO_DIR, "vars", "scenario.yml")) as _handle:
    SCENARIO_VARS = yaml.safe_load(_handle)
with open(os.path.join(REPO, ".cache", "harness", "llama.cpp-source.json")) as _handle:
    SOURCE = json.load(_handle)
COMMIT = SOURCE["commit"]


# Real tool outputs of this commit's CUDA build (benchmarks/gpu-host on an H200).
RECORDED = os.path.join(REPO, "tests", "harness", "cuda", "recorded")
with open(os.path.join(RECORDED, "cuobjdump-list-elf.txt")) as _handle:
    RECORDED_CUBINS = _handle.read()
with open(os.path.join(RECORDED, "ldd-libggml-cuda.txt")) as _handle:
    RECORDED_LDD = _handle.read()
CUDA_FAMILIES = {"libcudart", "libcublas", "libcublasLt", "libcuda", "libnccl", "libggml-base", "libstdc++"}


def library_families(ldd):
    """{'libcudart', 'libcublas', ...}: the resolved libraries of ldd's output,
    without their versions (CUDA 13 on the H200, 11.8 here); fails on 'not found'."""
    assert "not found" not in ldd, ldd
    return {re.sub(r"\.so[.0-9]*$", "", name) for name in re.findall(r"^\s*(\S+) => /", ldd, re.M)}


def node(name):
    return testinfra.get_host("docker://" + name)


def fact(name):
    return json.loads(node(name).file(FACT).content_string)


def current(name):
    return node(name).check_output("readlink %s/current", PREFIX)


def builds(name):
    out = node(name).check_output("find %s -mindepth 1 -maxdepth 1 -type d -not -name '.*' -printf '%%f\\n'", PREFIX)
    return sorted(out.split())


def converge(tmp_path, check=False, hosts=HOSTS, **extra):
    """Run the stage on the hosts with the scenario's settings; prints its time."""
    start = time.time()
    result = run_playbook(PLAYBOOK, hosts, extra_vars=dict(SCENARIO_VARS, **extra), check=check, tmp_path=tmp_path)
    elapsed = time.time() - start
    print("\n== %s%s: rc %d in %.0f s" % (PLAYBOOK, " --check" if check else "", result.returncode, elapsed))
    for line in result.stdout.splitlines():
        if re.search(r"^\s+- (source|configure|compile|ccache|package|total|built)\s", line) or "Playbook run took" in line:
            print("  " + line.strip())
    return result, elapsed


def make_patch(tmp_path, name, edit):
    """A patch (-p1) of one file of the source archive, written on the controller."""
    top = SOURCE["top_directory"]
    archive = os.path.join(REPO, ".cache", "harness", SOURCE["archive"])
    with tarfile.open(archive) as tar:
        original = tar.extractfile("%s/%s" % (top, PATCHED_FILE)).read().decode().splitlines(keepends=True)
    diff = difflib.unified_diff(original, edit(list(original)), "a/" + PATCHED_FILE, "b/" + PATCHED_FILE)
    path = tmp_path / name
    path.write_text("".join(diff))
    return str(path)


def changed_usage(lines):
    at = next(i for i, line in enumerate(lines) if line.startswith("static void usage(const char * executable) {"))
    return lines[:at + 1] + ['    printf("%s\\n");\n' % PATCH_MARK] + lines[at + 1:]


def broken(lines):
    return ['#error "%s"\n' % BROKEN_MARK] + lines


@pytest.fixture(scope="module")
def first_build():
    """The build converge installed (the tests below change what is current)."""
    return fact(BUILDER)


def test_binaries_run_on_every_host():
    for name in HOSTS:
        host = node(name)
        version = host.run("%s/current/bin/llama-server --version", PREFIX)
        assert version.rc == 0, version.stderr
        assert "commit %s" % COMMIT[:9] in version.stdout + version.stderr
        for tool in ("llama-server", "llama-bench", "llama-fit-params"):
            host.run_expect([0], "%s/current/bin/%s --help", PREFIX, tool)
        # llama-quantize prints its usage and exits 1.
        assert "usage:" in host.run("%s/current/bin/llama-quantize --help", PREFIX).stdout


def test_compiled_once_on_the_first_host(first_build):
    print("\n== converge's build on %s:" % BUILDER)
    print(node(BUILDER).check_output("grep '^== ' %s", BUILD_LOG))
    sums = set()
    for name in HOSTS:
        host = node(name)
        assert fact(name)["built_on"] == BUILDER
        sums.add(host.check_output("sha256sum %s/current/bin/llama-server | cut -d' ' -f1", PREFIX))
        if name != BUILDER:
            # Nothing was compiled there: no compiler, no build tools, no build directory.
            for tool in ("cc", "c++", "cmake", "ninja", "ccache"):
                assert not host.exists(tool), "%s has %s: it should only install the build" % (name, tool)
            assert not host.file("/var/cache/llm-fleet").exists
    assert len(sums) == 1, "the hosts run different binaries"
    assert node(BUILDER).exists("ccache")


def test_installed_versioned_behind_current(first_build):
    for name in HOSTS:
        key = first_build["build_key"]
        assert current(name) == key
        assert builds(name) == [key]
        host = node(name)
        assert host.file("%s/%s/bin/llama-server" % (PREFIX, key)).mode == 0o755
        # The binaries find their libraries inside the build ($ORIGIN/../lib), not elsewhere.
        libs = dict(re.findall(r"^\s*(\S+) => (\S+)", host.check_output("ldd %s/current/bin/llama-server", PREFIX), re.M))
        own = {name: path for name, path in libs.items() if re.match(r"lib(llama|ggml|mtmd)", name)}
        assert "libllama.so.0" in own and "libggml-cpu.so.0" in own and "libggml-cuda.so.0" in own
        assert all(path.startswith(PREFIX + "/current/bin/../lib/") for path in own.values()), own
        assert "not" not in libs.values()
        # The CUDA backend finds the CUDA 11.8 runtime and cuBLAS the NVIDIA stage installed.
        cuda = dict(re.findall(r"^\s*(\S+) => (\S+)", host.check_output("ldd %s/current/lib/libggml-cuda.so", PREFIX),
                               re.M))
        for lib in ("libcudart.so.11.0", "libcublas.so.11"):
            assert cuda.get(lib, "").startswith("/usr/local/cuda"), (lib, cuda)
        # ... and holds device code for the V100's sm_70: cuobjdump lists what it
        # listed for the real build of this commit on an H200, with the arch substituted.
        cubins = host.check_output("/usr/local/cuda-11.8/bin/cuobjdump --list-elf %s/current/lib/libggml-cuda.so", PREFIX)
        assert cubins.splitlines() == RECORDED_CUBINS.replace(".sm_90.", ".sm_70.").splitlines()
        # The same libraries as the real build's (their CUDA 11 sonames), every one resolved.
        assert library_families(host.check_output("ldd %s/current/lib/libggml-cuda.so", PREFIX)) \
            >= library_families(RECORDED_LDD) & CUDA_FAMILIES


def test_local_fact_records_the_build(first_build):
    record = first_build
    assert record["commit"] == COMMIT
    assert record["source"] == "archive sha256:" + SOURCE["sha256"]
    assert record["backend"] == "cuda"
    assert record["cuda_version"] == "11.8" and record["cuda_architectures"] == ["70"]
    assert record["build_key"].startswith(COMMIT[:9] + "-cuda-sm70-")
    assert record["version_commit"] == COMMIT[:9]
    assert "built with GNU" in record["version"]
    assert record["targets"] == ["llama-server", "llama-bench", "llama-quantize", "llama-fit-params"]
    for flag in ("-DGGML_CUDA=ON", "-DCMAKE_CUDA_ARCHITECTURES=70", "-DLLAMA_USE_PREBUILT_UI=OFF", "-DLLAMA_OPENSSL=OFF", "-DGGML_NATIVE=OFF",
                 "-DLLAMA_BUILD_COMMIT=%s" % COMMIT[:9]):
        assert flag in record["cmake_flags"]
    # The flags the server role may render, read from this binary's --help: this
    # commit has -lm/--load-mode and -fit, and no longer --mlock / --no-mmap.
    flags = set(record["server_flags"])
    assert {"--port", "--host", "-ngl", "-c", "-np", "-fa", "-ctk", "-ctv", "-kvu", "--metrics",
            "--api-key-file", "-lm", "--load-mode", "-fit", "--fit-target"} <= flags
    assert "--mlock" not in flags and "--no-mmap" not in flags
    assert record["build_key"] in record["summary"]


def test_a_rerun_compiles_nothing_and_changes_nothing(tmp_path):
    log_before = node(BUILDER).file(BUILD_LOG).mtime
    result, _ = converge(tmp_path)
    assert result.returncode == 0, result.stdout[-3000:]
    for name in HOSTS:
        assert recap(result.stdout, name).get("changed", 0) == 0, result.stdout[-3000:]
    assert "Compile (log in" not in result.stdout
    assert node(BUILDER).file(BUILD_LOG).mtime == log_before


def test_check_mode_reports_a_new_source_and_changes_nothing(tmp_path, first_build):
    patch = make_patch(tmp_path, "changed-usage.patch", changed_usage)
    result, _ = converge(tmp_path, check=True, llama_cpp_patches=[patch])
    assert result.returncode == 0, result.stdout[-3000:]
    assert recap(result.stdout, BUILDER).get("changed", 0) > 0
    assert "would compile llama.cpp build" in result.stdout
    for name in HOSTS:
        assert current(name) == first_build["build_key"]
        assert builds(name) == [first_build["build_key"]]


def test_a_changed_source_builds_once_and_switches_every_host(tmp_path, first_build):
    patch = make_patch(tmp_path, "changed-usage.patch", changed_usage)
    result, _ = converge(tmp_path, llama_cpp_patches=[patch])
    assert result.returncode == 0, result.stdout[-3000:]
    new = fact(BUILDER)
    old_key, new_key = first_build["build_key"], new["build_key"]
    assert new_key != old_key and new_key.startswith(COMMIT[:9] + "-cuda-sm70-")
    # ccache: only the patched file (and nothing else) was compiled again.
    stats = re.search(r"ccache\s+(\d+) hits, (\d+) compiled", result.stdout)
    assert stats and int(stats.group(2)) <= 2 and int(stats.group(1)) > 100, stats and stats.group(0)
    # The switch notifies the topic other roles listen on.
    assert "Report the new llama.cpp build" in result.stdout
    for name in HOSTS:
        record = fact(name)
        assert record["build_key"] == new_key and record["built_on"] == BUILDER
        assert len(record["patches"]) == 1
        assert current(name) == new_key
        assert node(name).check_output("readlink %s/previous", PREFIX) == old_key
        assert builds(name) == sorted([old_key, new_key])
        assert PATCH_MARK in node(name).run("%s/current/bin/llama-quantize --help", PREFIX).stdout
        if name != BUILDER:
            assert not node(name).exists("cmake")


def test_a_build_host_with_too_old_a_cmake_gets_the_wheel_in_a_build_venv(tmp_path, first_build):
    """The Ubuntu 20.04 path (cmake 3.16 < the 3.18 the pinned llama.cpp needs),
    walked by asking for it (llama_cpp_cmake_from_pip: always): the role's tool
    step puts the cmake wheel of the fleet's wheelhouse into the build venv and
    chooses it. (Compiling with it would only repeat the build: the H200 run
    compiled with a CMake outside /usr, benchmarks/results/gpu-host-2026-12-01.)"""
    assert first_build["build_tools"]["cmake"]["path"] == "/usr/bin/cmake"
    playbook = tmp_path / "tools.yml"
    playbook.write_text(yaml.safe_dump([{
        "name": "The llama_cpp role's build-tool step", "hosts": "gpu_servers",
        "tasks": [{"name": "Find or install the build tools",
                   "ansible.builtin.include_role": {"name": "llama_cpp", "tasks_from": "tools.yml"}}]}]))
    result = run_playbook(str(playbook), [BUILDER], extra_vars=dict(SCENARIO_VARS, llama_cpp_cmake_from_pip="always"),
                          tmp_path=tmp_path)
    assert result.returncode == 0, result.stdout[-3000:]
    venv = "/var/cache/llm-fleet/build-venv"
    version = node(BUILDER).check_output("%s/bin/cmake --version", venv).split()[2]
    # (YAML results fold long messages: compare with the whitespace joined)
    assert "CMake %s (%s/bin/cmake, venv)" % (version, venv) in " ".join(result.stdout.split()), result.stdout[-2000:]


def test_a_broken_source_fails_and_leaves_the_running_build(tmp_path):
    running = current(BUILDER)
    patch = make_patch(tmp_path, "broken.patch", broken)
    result, _ = converge(tmp_path, llama_cpp_patches=[patch])
    assert result.returncode != 0
    # The build host fails with the compiler's error from the build log ...
    assert BROKEN_MARK in result.stdout
    assert "failed on %s" % BUILDER in result.stdout
    assert "Nothing was installed" in result.stdout
    # ... the other hosts say why they did not move ...
    assert "is not available for %s" % HOSTS[1] in result.stdout
    for name in HOSTS:
        assert recap(result.stdout, name).get("failed", 0) == 1
        # ... and every host still runs the build it ran.
        assert current(name) == running
        assert node(name).run("%s/current/bin/llama-server --version", PREFIX).rc == 0
        assert not node(name).file("%s/.staging-" % PREFIX).exists
    assert len(builds(BUILDER)) == 2


def test_going_back_to_the_previous_source_is_a_switch_without_a_compile(tmp_path, first_build):
    log_before = node(BUILDER).file(BUILD_LOG).mtime
    result, elapsed = converge(tmp_path)
    assert result.returncode == 0, result.stdout[-3000:]
    assert "Compile (log in" not in result.stdout
    assert node(BUILDER).file(BUILD_LOG).mtime == log_before
    for name in HOSTS:
        assert current(name) == first_build["build_key"]
        assert fact(name)["build_key"] == first_build["build_key"]
        assert PATCH_MARK not in node(name).run("%s/current/bin/llama-quantize --help", PREFIX).stdout


def make_git_repository(tmp_path):
    """A bare git repository of the archive's tree, one commit with fixed author
    and dates (so its hash, and the build key, are the same on every run)."""
    work, bare = tmp_path / "llama.cpp", tmp_path / "llama.cpp.git"
    work.mkdir()
    archive = os.path.join(REPO, ".cache", "harness", SOURCE["archive"])
    subprocess.run(["tar", "-xzf", archive, "-C", str(work), "--strip-components=1"], check=True)
    env = dict(os.environ, GIT_AUTHOR_NAME="llm-fleet test", GIT_AUTHOR_EMAIL="test@llm-fleet.invalid",
               GIT_COMMITTER_NAME="llm-fleet test", GIT_COMMITTER_EMAIL="test@llm-fleet.invalid",
               GIT_AUTHOR_DATE="2026-10-01T05:44:09Z", GIT_COMMITTER_DATE="2026-10-01T05:44:09Z")
    for argv in (["git", "init", "-q", "-b", "master"], ["git", "add", "-A"],
                 ["git", "commit", "-q", "-m", "llama.cpp %s, as a repository" % COMMIT[:9]]):
        subprocess.run(argv, cwd=str(work), env=env, check=True)
    commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=str(work), capture_output=True, text=True,
                            check=True).stdout.strip()
    subprocess.run(["git", "clone", "-q", "--bare", str(work), str(bare)], check=True)
    return str(bare), commit


@pytest.mark.day_two
def test_a_git_source_at_a_new_commit_builds_once_and_switches(tmp_path, first_build):
    """The connected-fleet path: the build host fetches the pinned commit from a
    repository (here one the build host can reach: a copy of the tree, committed)."""
    bare, commit = make_git_repository(tmp_path)
    subprocess.run(["docker", "cp", bare, "%s:/srv/llama.cpp.git" % BUILDER], check=True)
    result, _ = converge(tmp_path, llama_cpp_source_archive="", llama_cpp_commit=commit,
                         llama_cpp_git_repo="file:///srv/llama.cpp.git")
    assert result.returncode == 0, result.stdout[-3000:]
    stats = re.search(r"ccache\s+(\d+) hits, (\d+) compiled", result.stdout)
    assert stats and int(stats.group(1)) > 100, stats and stats.group(0)
    for name in HOSTS:
        record = fact(name)
        assert record["source"] == "git" and record["commit"] == commit
        assert record["version_commit"] == commit[:9] and record["built_on"] == BUILDER
        assert current(name) == record["build_key"] and record["build_key"].startswith(commit[:9] + "-cuda-sm70-")
        assert node(name).check_output("readlink %s/previous", PREFIX) == first_build["build_key"]
        assert len(builds(name)) == 2
        if name != BUILDER:
            assert not node(name).exists("git")


def test_builds_beyond_the_kept_count_are_pruned(tmp_path, first_build):
    result, _ = converge(tmp_path, llama_cpp_keep_builds=1)
    assert result.returncode == 0, result.stdout[-3000:]
    for name in HOSTS:
        assert builds(name) == [first_build["build_key"]]
        assert current(name) == first_build["build_key"]
        assert not node(name).file("%s/previous" % PREFIX).exists


@pytest.mark.day_two
def test_a_build_without_the_gpus_architecture_is_refused_and_the_running_build_stays(tmp_path):
    """The negative case of the CUDA check: a build whose CMake options override
    the architectures (sm_75 for V100s that need sm_70) compiles, fails the
    cuobjdump check on every host, is removed, and every host keeps its build."""
    running = {name: current(name) for name in HOSTS}
    options = dict(harness_group_vars().get("llama_cpp_cmake_options", {}), CMAKE_CUDA_ARCHITECTURES="75")
    result, _ = converge(tmp_path, llama_cpp_cmake_options=options)
    assert result.returncode != 0
    assert "has no code for sm_70" in result.stdout and "cubins are for sm_75" in result.stdout
    assert "it was not installed" in result.stdout
    for name in HOSTS:
        assert recap(result.stdout, name).get("failed", 0) == 1
        assert current(name) == running[name]
        assert fact(name)["build_key"] == running[name]
        assert node(name).run("find %s -maxdepth 1 -name '.staging-*'" % PREFIX).stdout.strip() == ""


def test_the_cpu_backend_is_its_own_build(tmp_path):
    """Last: the CPU-only build (llama_cpp_backend: cpu), an operator's choice for
    hosts without a usable GPU, predicted in check mode (compiling it would only
    repeat the C++ half of the CUDA build, minutes of CI on 2 cores): its own
    build key, and nothing changed on the host."""
    name = HOSTS[-1]
    running = current(name)
    result, _ = converge(tmp_path, check=True, hosts=[name], llama_cpp_backend="cpu")
    assert result.returncode == 0, result.stdout[-3000:]
    key = re.search(r"would compile llama.cpp build\(s\) (\S+)", result.stdout).group(1)
    assert key.startswith(COMMIT[:9] + "-cpu-"), key
    assert current(name) == running
