"""Tests for the simulated NVIDIA apt repository (tests/harness/apt_repo/build-repo.sh).

The repository is built once per session into a temporary directory and examined with the real
apt and dpkg tools. apt runs with a private configuration (APT_CONFIG, see AptRoot) so this
machine's own sources, preferences, package state and hooks are neither read nor touched.
"""

import hashlib
import os
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
APT_REPO_DIR = REPO_ROOT / "tests" / "harness" / "apt_repo"
BUILD_SCRIPT = APT_REPO_DIR / "build-repo.sh"
# Honoured as build-repo.sh honours it, so the tests can run against a stand-in mock.
MOCK_NVML_DIR = Path(os.environ.get("MOCK_NVML_DIR", REPO_ROOT / "tests" / "harness" / "mock_nvml"))
V100_PROFILE = MOCK_NVML_DIR / "profiles" / "v100-sxm2-32gb.profile"

ARCH = subprocess.run(["dpkg", "--print-architecture"], check=True, capture_output=True,
                      text=True).stdout.strip()
LIBDIR = "/usr/lib/x86_64-linux-gnu"

PINNED_NCCL = "2.15.5-1+cuda11.8"
NEWER_NCCL = "2.18.3-1+cuda12.2"
DRIVER_525 = "525.147.05-0ubuntu1"
DRIVER_535 = "535.129.03-0ubuntu1"
DRIVER_PACKAGES = ["nvidia-driver", "nvidia-utils", "libnvidia-compute", "nvidia-compute-utils",
                   "nvidia-dkms", "nvidia-kernel-common"]

# Every (package, version) the repository must hold, and nothing else.
# What cuda-toolkit-X-Y pulls in: compiler, cuobjdump, runtime, dev files, cuBLAS.
CUDA_COMPONENTS = ("cuda-nvcc", "cuda-cuobjdump", "cuda-cudart", "cuda-cudart-dev", "cuda-driver-dev",
                   "libcublas", "libcublas-dev")
EXPECTED_PACKAGES = {
    ("cuda-keyring", "1.1-1"),
    *((f"{name}-525", DRIVER_525) for name in DRIVER_PACKAGES),
    ("cuda-drivers-525", "525.147.05-1"),
    *((f"{name}-535", DRIVER_535) for name in DRIVER_PACKAGES),
    ("cuda-drivers-535", "535.129.03-1"),
    ("cuda-drivers", "535.129.03-1"),
    ("cuda-toolkit-11-8", "11.8.0-1"),
    *((f"{name}-11-8", "11.8.89-1") for name in CUDA_COMPONENTS),
    ("cuda-toolkit-11-8-config-common", "11.8.89-1"),
    ("cuda-toolkit-config-common", "11.8.89-1"),
    ("cuda-toolkit-12-2", "12.2.2-1"),
    *((f"{name}-12-2", "12.2.140-1") for name in CUDA_COMPONENTS),
    ("cuda-toolkit-12-2-config-common", "12.2.140-1"),
    ("cuda-toolkit-config-common", "12.2.140-1"),
    ("cuda-toolkit", "12.2.2-1"),
    ("libnccl2", PINNED_NCCL),
    ("libnccl-dev", PINNED_NCCL),
    ("libnccl2", NEWER_NCCL),
    ("libnccl-dev", NEWER_NCCL),
}
ARCH_ALL = {"cuda-keyring", "cuda-toolkit-config-common", "cuda-toolkit-11-8-config-common",
            "cuda-toolkit-12-2-config-common"}
# The oldest glibc of the supported hosts (Ubuntu 20.04 and Debian 11: 2.31). NVIDIA's libraries
# load there; the stand-ins are compiled on this machine and must not need a newer glibc.
OLDEST_HOST_GLIBC = (2, 31)

pytestmark = [
    pytest.mark.skipif(ARCH != "amd64", reason="the simulated NVIDIA packages are built for amd64"),
    pytest.mark.skipif(shutil.which("apt-get") is None or shutil.which("dpkg-scanpackages") is None,
                       reason="needs apt and dpkg-dev"),
]


# ------------------------------------------------------------------------------------------------
# Helpers


def run_build(output_dir, script=BUILD_SCRIPT, env=None):
    return subprocess.run(["bash", str(script), str(output_dir)], check=True, capture_output=True,
                          text=True, env=env)


def parse_deb822(text):
    """Stanzas of a Packages/status file as dicts (continuation lines joined with newlines)."""
    stanzas = []
    for block in re.split(r"\n\s*\n", text.strip()):
        fields, key = {}, None
        for line in block.splitlines():
            if line[:1] in (" ", "\t") and key:
                fields[key] += "\n" + line[1:]
            else:
                key, _, value = line.partition(":")
                fields[key] = value.strip()
        stanzas.append(fields)
    return stanzas


def deb_path(repo, name, version):
    arch = "all" if name in ARCH_ALL else ARCH
    path = repo / f"{name}_{version}_{arch}.deb"
    assert path.is_file(), path
    return path


def deb_contents(deb):
    """{path: symlink target or None} of a .deb's data archive."""
    listing = subprocess.run(["dpkg-deb", "--contents", str(deb)], check=True,
                             capture_output=True, text=True).stdout
    entries = {}
    for line in listing.splitlines():
        name = line.split(None, 5)[5]
        path, _, target = name.partition(" -> ")
        entries[path[1:].rstrip("/") or "/"] = target or None
    return entries


def extract(deb, dest):
    subprocess.run(["dpkg-deb", "--extract", str(deb), str(dest)], check=True)
    return dest


class AptRoot:
    """apt confined to a temporary directory: its own sources, preferences, dpkg status and cache.

    APT_CONFIG is read before anything else, and it points Dir::Etc::parts and Dir::Etc::main away
    from /etc/apt, so none of this machine's apt configuration (or hooks) applies.
    """

    def __init__(self, root, repo, preferences="", status=""):
        self.root = root
        for sub in ("apt.conf.d", "sources.list.d", "preferences.d", "state/lists/partial",
                    "cache/archives/partial", "log"):
            (root / sub).mkdir(parents=True, exist_ok=True)
        (root / "sources.list").write_text(f"deb [trusted=yes] file://{repo} ./\n")
        (root / "preferences").write_text(preferences)
        (root / "status").write_text(status)
        (root / "apt.conf").write_text(textwrap.dedent(f"""\
            Dir::Etc::main "/dev/null";
            Dir::Etc::parts "{root}/apt.conf.d";
            Dir::Etc::sourcelist "{root}/sources.list";
            Dir::Etc::sourceparts "{root}/sources.list.d";
            Dir::Etc::preferences "{root}/preferences";
            Dir::Etc::preferencesparts "{root}/preferences.d";
            Dir::State "{root}/state";
            Dir::State::status "{root}/status";
            Dir::Cache "{root}/cache";
            Dir::Log "{root}/log";
            APT::Sandbox::User "root";
            Acquire::Languages "none";
            Debug::NoLocking "true";
            """))
        self.env = {**os.environ, "APT_CONFIG": str(root / "apt.conf"), "LC_ALL": "C"}
        self.run("apt-get", "update")

    def run(self, *args, check=True):
        return subprocess.run(args, check=check, capture_output=True, text=True, env=self.env)

    def candidate(self, package):
        policy = self.run("apt-cache", "policy", package).stdout
        return re.search(r"Candidate: (\S+)", policy).group(1)

    def simulate_install(self, *packages, check=True):
        """{'Inst': {name: version}, 'Remv': {name: version}} of `apt-get -s install`."""
        result = self.run("apt-get", "--simulate", "--yes", "install", *packages, check=check)
        actions = {"Inst": {}, "Remv": {}}
        for match in re.finditer(r"^(Inst|Remv) (\S+) (?:\[(\S+)\] )?(?:\((\S+))?", result.stdout,
                                 re.MULTILINE):
            verb, name, old, new = match.groups()
            actions[verb][name] = new if verb == "Inst" else old
        return actions, result


def status_file_for(stanzas):
    """A dpkg status file in which the given Packages stanzas are installed."""
    keep = ("Package", "Version", "Architecture", "Maintainer", "Installed-Size", "Depends",
            "Provides", "Conflicts", "Replaces", "Section", "Priority", "Description")
    blocks = []
    for stanza in stanzas:
        lines = [f"Package: {stanza['Package']}", "Status: install ok installed"]
        for key in keep[1:]:
            if key in stanza:
                value = stanza[key].replace("\n", "\n ")
                lines.append(f"{key}: {value}")
        blocks.append("\n".join(lines))
    return "\n\n".join(blocks) + "\n"


# ------------------------------------------------------------------------------------------------
# Fixtures


@pytest.fixture(scope="session")
def built(tmp_path_factory):
    """(repository directory, build output) of one build for the whole session."""
    if not (MOCK_NVML_DIR / "Makefile").is_file():
        pytest.skip(f"mock NVML sources not present in {MOCK_NVML_DIR}")
    repo = tmp_path_factory.mktemp("apt-repo") / "nvidia-apt"
    result = run_build(repo)
    return repo, result.stdout


@pytest.fixture(scope="session")
def repo(built):
    return built[0]


@pytest.fixture(scope="session")
def packages(repo):
    return parse_deb822((repo / "Packages").read_text())


@pytest.fixture(scope="session")
def by_name_version(packages):
    return {(p["Package"], p["Version"]): p for p in packages}


@pytest.fixture
def apt_root(tmp_path, repo):
    """Factory of isolated apt roots over the built repository."""
    count = 0

    def make(preferences="", status=""):
        nonlocal count
        count += 1
        return AptRoot(tmp_path / f"apt{count}", repo, preferences, status)

    return make


# ------------------------------------------------------------------------------------------------
# The index


def test_index_lists_exactly_the_expected_packages(packages):
    assert {(p["Package"], p["Version"]) for p in packages} == EXPECTED_PACKAGES


def test_every_package_carries_the_harness_control_fields(packages):
    for p in packages:
        name = p["Package"]
        assert p["Maintainer"] == "Project test harness <harness@invalid>", name
        assert "simulated" in p["Description"].lower(), name
        assert p["Section"] and p["Priority"] == "optional", name
        assert int(p["Installed-Size"]) > 0, name
        assert p["Architecture"] == ("all" if name in ARCH_ALL else ARCH), name


@pytest.mark.parametrize("package, version, depends", [
    ("nvidia-driver-525", DRIVER_525,
     [f"{name}-525 (= {DRIVER_525})" for name in DRIVER_PACKAGES[1:]]),
    ("cuda-drivers-525", "525.147.05-1", ["nvidia-driver-525 (>= 525.147.05)"]),
    ("cuda-drivers-535", "535.129.03-1", ["nvidia-driver-535 (>= 535.129.03)"]),
    ("cuda-drivers", "535.129.03-1", ["cuda-drivers-535 (= 535.129.03-1)"]),
    ("cuda-toolkit-11-8", "11.8.0-1",
     ["cuda-nvcc-11-8 (>= 11.8.89)", "cuda-cuobjdump-11-8 (>= 11.8.89)", "cuda-cudart-11-8 (>= 11.8.89)",
      "cuda-cudart-dev-11-8 (>= 11.8.89)", "cuda-driver-dev-11-8 (>= 11.8.89)", "libcublas-dev-11-8 (>= 11.8.89)",
      "cuda-toolkit-11-8-config-common (>= 11.8.89)", "cuda-toolkit-config-common (>= 11.8.89)"]),
    ("cuda-toolkit", "12.2.2-1", ["cuda-toolkit-12-2 (>= 12.2.2)"]),
    ("libnccl-dev", PINNED_NCCL, [f"libnccl2 (= {PINNED_NCCL})"]),
    ("libnccl-dev", NEWER_NCCL, [f"libnccl2 (= {NEWER_NCCL})"]),
])
def test_dependency_structure(by_name_version, package, version, depends):
    assert by_name_version[(package, version)]["Depends"].split(", ") == depends


@pytest.mark.parametrize("branch, version", [("525", DRIVER_525), ("535", DRIVER_535)])
def test_driver_branches_are_mutually_exclusive_by_virtual_name(by_name_version, branch, version):
    for name in DRIVER_PACKAGES:
        stanza = by_name_version[(f"{name}-{branch}", version)]
        assert stanza["Provides"] == stanza["Conflicts"] == stanza["Replaces"], name


def test_release_file_hashes_match_the_indexes(repo):
    release = (repo / "Release").read_text()
    assert "Origin: NVIDIA" in release
    for name in ("Packages", "Packages.gz"):
        data = (repo / name).read_bytes()
        assert f" {hashlib.sha256(data).hexdigest()} {len(data)} {name}\n" in release


# ------------------------------------------------------------------------------------------------
# What apt does with it


def test_unpinned_nccl_candidate_is_the_newer_release(apt_root):
    assert apt_root().candidate("libnccl2") == NEWER_NCCL


def test_version_pin_holds_nccl_back(apt_root):
    apt = apt_root(preferences=textwrap.dedent(f"""\
        Package: libnccl2 libnccl-dev
        Pin: version {PINNED_NCCL}
        Pin-Priority: 1001
        """))
    assert apt.candidate("libnccl2") == PINNED_NCCL
    assert apt.candidate("libnccl-dev") == PINNED_NCCL


def test_unpinned_cuda_drivers_would_pull_branch_535(apt_root):
    actions, _ = apt_root().simulate_install("cuda-drivers")
    assert actions["Inst"]["nvidia-driver-535"] == DRIVER_535
    assert not any(name.endswith("-525") for name in actions["Inst"])


def test_cuda_drivers_525_installs_only_branch_525(apt_root):
    actions, _ = apt_root().simulate_install("cuda-drivers-525")
    assert set(actions["Inst"]) == {f"{name}-525" for name in DRIVER_PACKAGES} | {"cuda-drivers-525"}
    assert set(actions["Inst"].values()) == {DRIVER_525, "525.147.05-1"}


def test_toolkit_11_8_pulls_no_cuda_12_toolkit(apt_root):
    actions, _ = apt_root().simulate_install("cuda-toolkit-11-8")
    assert actions["Inst"]["cuda-nvcc-11-8"] == "11.8.89-1"
    assert not [name for name in actions["Inst"] if "12-2" in name or name == "cuda-toolkit"]


def test_two_driver_branches_cannot_be_installed_together(apt_root):
    _, result = apt_root().simulate_install("nvidia-driver-525", "nvidia-driver-535", check=False)
    assert result.returncode != 0


def test_installing_branch_535_replaces_an_installed_525(apt_root, packages):
    installed = [p for p in packages if p["Package"].endswith("-525")]
    apt = apt_root(status=status_file_for(installed))
    actions, _ = apt.simulate_install("cuda-drivers-535")
    assert set(actions["Remv"]) == {p["Package"] for p in installed}
    assert actions["Inst"]["nvidia-driver-535"] == DRIVER_535
    assert actions["Inst"]["cuda-drivers-535"] == "535.129.03-1"


# ------------------------------------------------------------------------------------------------
# Package contents


@pytest.mark.parametrize("package, version, expected", [
    ("cuda-keyring", "1.1-1", {"/usr/share/keyrings/cuda-archive-keyring.gpg": None}),
    ("libnvidia-compute-525", DRIVER_525, {
        f"{LIBDIR}/libnvidia-ml.so.525.147.05": None,
        f"{LIBDIR}/libnvidia-ml.so.1": "libnvidia-ml.so.525.147.05"}),
    ("libnvidia-compute-535", DRIVER_535, {
        f"{LIBDIR}/libnvidia-ml.so.535.129.03": None,
        f"{LIBDIR}/libnvidia-ml.so.1": "libnvidia-ml.so.535.129.03"}),
    ("nvidia-utils-525", DRIVER_525, {"/usr/bin/nvidia-smi": None}),
    ("nvidia-compute-utils-525", DRIVER_525, {
        "/usr/bin/nvidia-persistenced": None,
        "/lib/systemd/system/nvidia-persistenced.service": None}),
    ("nvidia-dkms-525", DRIVER_525, {"/usr/src/nvidia-525.147.05/dkms.conf": None}),
    ("cuda-nvcc-11-8", "11.8.89-1", {
        "/usr/local/cuda-11.8/bin/nvcc": None, "/usr/local/cuda-11.8/version.json": None}),
    ("cuda-cudart-11-8", "11.8.89-1", {
        "/usr/local/cuda-11.8/targets/x86_64-linux/lib/libcudart.so.11.8.89": None,
        "/usr/local/cuda-11.8/targets/x86_64-linux/lib/libcudart.so.11.0": "libcudart.so.11.8.89"}),
    ("cuda-cudart-12-2", "12.2.140-1", {
        "/usr/local/cuda-12.2/targets/x86_64-linux/lib/libcudart.so.12": "libcudart.so.12.2.140"}),
    ("libnccl2", PINNED_NCCL, {
        f"{LIBDIR}/libnccl.so.2.15.5": None, f"{LIBDIR}/libnccl.so.2": "libnccl.so.2.15.5"}),
    ("libnccl-dev", PINNED_NCCL, {"/usr/include/nccl.h": None, f"{LIBDIR}/libnccl.so": "libnccl.so.2"}),
])
def test_files_sit_where_nvidia_puts_them(repo, package, version, expected):
    contents = deb_contents(deb_path(repo, package, version))
    for path, target in expected.items():
        assert path in contents, path
        assert contents[path] == target, path


def test_maintainer_scripts_parse_and_never_start_services(repo, tmp_path):
    for deb in sorted(repo.glob("*.deb")):
        control = tmp_path / deb.stem
        subprocess.run(["dpkg-deb", "--control", str(deb), str(control)], check=True)
        for script in ("preinst", "postinst", "prerm", "postrm"):
            path = control / script
            if path.exists():
                subprocess.run(["sh", "-n", str(path)], check=True)
                text = path.read_text()
                assert "systemctl" not in text and "deb-systemd" not in text, deb.name


@pytest.mark.parametrize("version, driver, cuda", [(DRIVER_525, "525.147.05", 12000),
                                                    (DRIVER_535, "535.129.03", 12020)])
def test_packaged_nvml_reports_its_driver_version(repo, tmp_path, version, driver, cuda):
    if not V100_PROFILE.is_file():
        pytest.skip(f"mock NVML profile {V100_PROFILE} not present")
    branch = driver.split(".")[0]
    root = extract(deb_path(repo, f"libnvidia-compute-{branch}", version), tmp_path / "root")
    state = tmp_path / "state"
    state.mkdir()
    # A child process: the two branches' libraries share a soname, and the mock reads its
    # environment when it initialises.
    probe = textwrap.dedent("""\
        import ctypes, sys
        lib = ctypes.CDLL(sys.argv[1])
        assert lib.nvmlInit_v2() == 0, "nvmlInit_v2 failed"
        buf = ctypes.create_string_buffer(96)
        assert lib.nvmlSystemGetDriverVersion(buf, 96) == 0, "nvmlSystemGetDriverVersion failed"
        cuda = ctypes.c_int(-1)
        if hasattr(lib, "nvmlSystemGetCudaDriverVersion"):
            lib.nvmlSystemGetCudaDriverVersion(ctypes.byref(cuda))
        lib.nvmlShutdown()
        print(buf.value.decode(), cuda.value)
        """)
    env = {**os.environ, "MOCK_NVML_PROFILE": str(V100_PROFILE), "MOCK_NVML_STATE_DIR": str(state)}
    out = subprocess.run([sys.executable, "-c", probe, str(root / LIBDIR[1:] / "libnvidia-ml.so.1")],
                         check=True, capture_output=True, text=True, env=env).stdout.split()
    assert out[0] == driver
    if out[1] != "-1":
        assert int(out[1]) == cuda


@pytest.mark.parametrize("cuda, version, release", [("11.8", "11.8.89-1", "V11.8.89"),
                                                     ("12.2", "12.2.140-1", "V12.2.140")])
def test_nvcc_reports_its_version(repo, tmp_path, cuda, version, release):
    root = extract(deb_path(repo, f"cuda-nvcc-{cuda.replace('.', '-')}", version), tmp_path)
    nvcc = root / f"usr/local/cuda-{cuda}/bin/nvcc"
    out = subprocess.run([str(nvcc), "--version"], check=True, capture_output=True, text=True).stdout
    assert f"Cuda compilation tools, release {cuda}, {release}" in out
    assert f'"version" : "{cuda}.' in (root / f"usr/local/cuda-{cuda}/version.json").read_text()


RECORDED = Path(__file__).resolve().parents[1] / "harness" / "apt_repo" / "cuda" / "recorded"


@pytest.mark.skipif(shutil.which("g++") is None, reason="the simulated nvcc compiles host code with g++")
def test_simulated_toolchain_builds_a_library_cuobjdump_lists_like_the_real_one(repo, tmp_path):
    """Two device-code sources compiled for sm_70 and linked into a shared library:
    cuobjdump --list-elf prints what the real cuobjdump 11.8 printed for the same
    two sources (recorded/cuobjdump-11.8-list-elf.txt), the library needs the CUDA
    runtime like a real one, and a file without device code gets the real answer."""
    root = tmp_path / "root"
    for name in CUDA_COMPONENTS:
        extract(deb_path(repo, f"{name}-11-8", "11.8.89-1"), root)
    bin_dir = root / "usr/local/cuda-11.8/bin"
    lib_dir = root / "usr/local/cuda-11.8/targets/x86_64-linux/lib"
    work = tmp_path / "work"
    work.mkdir()
    objects = []
    for name, body in (("a", "x[threadIdx.x] *= 2"), ("b", "x[threadIdx.x] += 1")):
        (work / f"{name}.cu").write_text("__global__ void k%s(float *x) { %s; }\n" % (name, body))
        subprocess.run([str(bin_dir / "nvcc"), "--generate-code=arch=compute_70,code=[compute_70,sm_70]",
                        "-Xcompiler=-fPIC", "-MD", "-MT", f"{name}.o", "-MF", f"{name}.o.d", "-x", "cu", "-c",
                        f"{name}.cu", "-o", f"{name}.o"], cwd=work, check=True)
        assert (work / f"{name}.o.d").read_text().startswith(f"{name}.o : ")
        objects.append(f"{name}.o")
    subprocess.run(["g++", "-shared", "-o", "libggml-cuda.so", *objects, f"-L{lib_dir}", "-lcudart"], cwd=work,
                   check=True)
    listing = subprocess.run([str(bin_dir / "cuobjdump"), "--list-elf", "libggml-cuda.so"], cwd=work,
                             check=True, capture_output=True, text=True).stdout
    assert listing == (RECORDED / "cuobjdump-11.8-list-elf.txt").read_text()
    needed = subprocess.run(["readelf", "-d", str(work / "libggml-cuda.so")], capture_output=True, text=True).stdout
    assert "[libcudart.so.11.0]" in needed
    plain = subprocess.run([str(bin_dir / "cuobjdump"), "--list-elf", "/bin/sh"], capture_output=True, text=True)
    assert plain.returncode == 255
    assert plain.stderr == "cuobjdump info    : File '/bin/sh' does not contain device code\n"


@pytest.mark.parametrize("version, numbers", [(PINNED_NCCL, (2, 15, 5)), (NEWER_NCCL, (2, 18, 3))])
def test_nccl_header_and_library_agree_on_the_version(repo, tmp_path, version, numbers):
    extract(deb_path(repo, "libnccl2", version), tmp_path)
    extract(deb_path(repo, "libnccl-dev", version), tmp_path)
    header = (tmp_path / "usr/include/nccl.h").read_text()
    for macro, value in zip(("NCCL_MAJOR", "NCCL_MINOR", "NCCL_PATCH"), numbers):
        assert re.search(rf"^#define {macro} {value}$", header, re.MULTILINE), macro
    code = numbers[0] * 10000 + numbers[1] * 100 + numbers[2]
    assert f"#define NCCL_VERSION_CODE {code}" in header
    probe = ("import ctypes, sys; v = ctypes.c_int(); "
             "ctypes.CDLL(sys.argv[1]).ncclGetVersion(ctypes.byref(v)); print(v.value)")
    out = subprocess.run([sys.executable, "-c", probe, str(tmp_path / LIBDIR[1:] / "libnccl.so")],
                         check=True, capture_output=True, text=True).stdout
    assert int(out) == code


def glibc_references(path):
    """{symbol: glibc version tuple} of what an ELF file takes from glibc (its undefined symbols)."""
    table = subprocess.run(["objdump", "-T", str(path)], check=True, capture_output=True,
                           text=True).stdout
    refs = {}
    for line in table.splitlines():
        match = re.search(r"\bGLIBC_([0-9.]+)\)?\s+(\S+)$", line)
        if match and "*UND*" in line:
            refs[match.group(2)] = tuple(int(part) for part in match.group(1).split("."))
    return refs


@pytest.mark.skipif(shutil.which("objdump") is None, reason="needs objdump (binutils)")
def test_every_shared_object_loads_with_the_oldest_hosts_glibc(repo, tmp_path):
    """NVIDIA's libnvidia-ml.so loads on every supported host, so the mock must too.

    Built on a machine with glibc >= 2.33, a call to stat() binds to stat@GLIBC_2.33: on Debian
    11 and Ubuntu 20.04 (glibc 2.31) dlopen then fails and pynvml answers LIBRARY_NOT_FOUND
    (issue 29). The library is only loaded on such a host in the fleet_debian11 scenario, so
    the symbol versions are read here.
    """
    root = tmp_path / "root"
    for deb in sorted(repo.glob("*.deb")):
        extract(deb, root)
    checked, too_new = [], {}
    for path in sorted(p for p in root.rglob("*") if p.is_file() and not p.is_symlink()):
        with path.open("rb") as f:
            if f.read(4) != b"\x7fELF":
                continue
        checked.append(path.name)
        for symbol, version in glibc_references(path).items():
            if version > OLDEST_HOST_GLIBC:
                too_new[f"/{path.relative_to(root)}"] = f"{symbol}@GLIBC_{'.'.join(map(str, version))}"
    assert "libnvidia-ml.so.525.147.05" in checked and "libnvidia-ml.so.535.129.03" in checked
    assert too_new == {}


def build_host_glibc():
    name, _, version = os.confstr("CS_GNU_LIBC_VERSION").partition(" ")
    return tuple(int(part) for part in version.split(".")) if name == "glibc" else (0,)


@pytest.mark.skipif(build_host_glibc() < (2, 33),
                    reason="stat() binds to a glibc 2.33 symbol only when built with glibc >= 2.33")
@pytest.mark.skipif(shutil.which("objdump") is None, reason="needs objdump (binutils)")
def test_build_refuses_a_library_the_oldest_hosts_cannot_load(tmp_path):
    mock = tmp_path / "mock_nvml"
    shutil.copytree(MOCK_NVML_DIR, mock, ignore=shutil.ignore_patterns("build", "__pycache__"))
    with (mock / "mock_nvml.c").open("a") as source:
        source.write(textwrap.dedent("""
            __attribute__((visibility("default"))) long mock_size_by_stat(const char *path)
            {
                struct stat sb;
                return stat(path, &sb) == 0 ? (long)sb.st_size : -1;
            }
            """))
    result = subprocess.run(["bash", str(BUILD_SCRIPT), str(tmp_path / "out")], capture_output=True,
                            text=True, env={**os.environ, "MOCK_NVML_DIR": str(mock)})
    assert result.returncode != 0
    assert ("libnvidia-compute-525: /usr/lib/x86_64-linux-gnu/libnvidia-ml.so.525.147.05 needs a glibc "
            "newer than 2.31") in result.stderr
    assert "stat@GLIBC_2.33" in result.stderr
    assert not (tmp_path / "out" / "Packages").exists()


# ------------------------------------------------------------------------------------------------
# The build itself


def test_first_build_reports_what_it_built(built):
    _, output = built
    assert f"built {len(EXPECTED_PACKAGES)} packages" in output


def test_rerun_with_unchanged_inputs_rebuilds_nothing(repo):
    before = {p.name: p.stat().st_mtime_ns for p in repo.iterdir()}
    result = run_build(repo)
    assert "up to date" in result.stdout and "nothing rebuilt" in result.stdout
    assert {p.name: p.stat().st_mtime_ns for p in repo.iterdir()} == before


def test_changed_input_rebuilds_and_builds_are_reproducible(repo, tmp_path):
    # A copy of the harness directory, so its spec can change; the copy cannot find the mock NVML
    # sources relative to itself, hence MOCK_NVML_DIR.
    harness = tmp_path / "apt_repo"
    shutil.copytree(APT_REPO_DIR, harness)
    env = {**os.environ, "MOCK_NVML_DIR": str(MOCK_NVML_DIR)}
    out = tmp_path / "out"
    run_build(out, harness / "build-repo.sh", env)
    # Same inputs in another place and time: byte-identical index, so identical .debs.
    assert (out / "Packages").read_bytes() == (repo / "Packages").read_bytes()
    assert "nothing rebuilt" in run_build(out, harness / "build-repo.sh", env).stdout

    with (harness / "packages.spec").open("a") as spec:
        spec.write("# a comment changes the inputs\n")
    result = run_build(out, harness / "build-repo.sh", env)
    assert f"built {len(EXPECTED_PACKAGES)} packages" in result.stdout
    assert (out / "Packages").read_bytes() == (repo / "Packages").read_bytes()


def test_refuses_to_empty_a_directory_it_did_not_build(repo, tmp_path):
    (tmp_path / "precious.txt").write_text("keep me")
    result = subprocess.run(["bash", str(BUILD_SCRIPT), str(tmp_path)], capture_output=True,
                            text=True)
    assert result.returncode != 0
    assert "refusing" in result.stderr
    assert (tmp_path / "precious.txt").read_text() == "keep me"


# ------------------------------------------------------------------------------------------------
# A real install, in a throwaway copy of this machine

# Runs inside the chroot. Prints "key=value" facts for the test to assert on.
INSTALL_SCRIPT = textwrap.dedent(f"""\
    #!/bin/bash
    set -euo pipefail
    export DEBIAN_FRONTEND=noninteractive LC_ALL=C APT_CONFIG=/tmp/apt/apt.conf
    mkdir -p /tmp/apt/empty
    echo 'deb [trusted=yes] file:///srv/nvidia-apt ./' >/tmp/apt/sources.list
    printf 'Package: libnccl2 libnccl-dev\\nPin: version {PINNED_NCCL}\\nPin-Priority: 1001\\n' \\
        >/tmp/apt/preferences
    # Only the test repository and none of the machine's apt hooks; dpkg state is the chroot's own.
    cat >/tmp/apt/apt.conf <<'EOF'
    Dir::Etc::main "/dev/null";
    Dir::Etc::parts "/tmp/apt/empty";
    Dir::Etc::sourcelist "/tmp/apt/sources.list";
    Dir::Etc::sourceparts "/tmp/apt/empty";
    Dir::Etc::preferences "/tmp/apt/preferences";
    Dir::Etc::preferencesparts "/tmp/apt/empty";
    APT::Sandbox::User "root";
    Acquire::Languages "none";
    EOF
    version() {{ dpkg-query -W -f '${{db:Status-Abbrev}}${{Version}}' "$1" 2>/dev/null || true; }}
    apt-get -q update >/dev/null
    apt-get -q install -y --no-install-recommends cuda-drivers-525 cuda-toolkit-11-8 \\
        libnccl2 libnccl-dev >/tmp/install.log
    echo "nccl=$(version libnccl2)"
    echo "driver=$(version nvidia-driver-525)"
    echo "cuda_link=$(readlink -f /usr/local/cuda)"
    echo "nvcc=$(/usr/local/cuda/bin/nvcc --version | tail -2 | head -1)"
    echo "nvml_in_cache=$(ldconfig -p | grep -c 'libnvidia-ml.so.1 ')"
    echo "persistenced_user=$(getent passwd nvidia-persistenced | cut -d: -f1)"
    echo "persistenced_enabled=$(ls /etc/systemd/system/*.wants 2>/dev/null | grep -c nvidia-persistenced || true)"
    apt-get -q install -y cuda-drivers-535 >>/tmp/install.log
    echo "driver525_after_switch=$(version nvidia-driver-525)"
    echo "driver535_after_switch=$(version nvidia-driver-535)"
    echo "nvml_after_switch=$(readlink -f /usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1)"
    apt-get -q purge -y cuda-toolkit-11-8 cuda-nvcc-11-8 cuda-cudart-11-8 \\
        cuda-toolkit-11-8-config-common >>/tmp/install.log 2>&1
    echo "cuda_alternatives_after_purge=$(update-alternatives --list cuda 2>/dev/null | tr '\\n' ' ')"
    """)


def test_real_install_branch_switch_and_purge_in_a_throwaway_root(repo, tmp_path):
    """Installs with real apt and dpkg in an overlay of this machine's root that is thrown away.

    The overlay lives in a private mount namespace (unshare -m), so nothing outside tmp_path
    changes; it proves the maintainer scripts run, the pin holds, the branch switch replaces 525
    and purging the toolkit removes its alternative.
    """
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        pytest.skip("needs root and unshare")
    upper, work, target = (tmp_path / "probe" / sub for sub in ("upper", "work", "merged"))
    for path in (upper, work, target):
        path.mkdir(parents=True)
    probe = subprocess.run(
        ["unshare", "-m", "--propagation", "private", "mount", "-t", "overlay", "overlay", "-o",
         f"lowerdir=/,upperdir={upper},workdir={work}", str(target)],
        capture_output=True, text=True)
    if probe.returncode != 0:
        pytest.skip(f"no overlay mount in a private namespace here: {probe.stderr.strip()}")

    for sub in ("upper", "work", "merged"):
        (tmp_path / sub).mkdir()
    (tmp_path / "install.sh").write_text(INSTALL_SCRIPT)
    merged = tmp_path / "merged"
    # set -e: every step must succeed before chroot, so a failed mount never lets apt run on /.
    setup = f"""
        set -e
        mount -t overlay overlay -o lowerdir=/,upperdir={tmp_path}/upper,workdir={tmp_path}/work {merged}
        mount --bind /proc {merged}/proc
        mount --bind /dev {merged}/dev
        mount -t tmpfs tmpfs {merged}/tmp
        mkdir -p {merged}/srv/nvidia-apt
        mount --bind {repo} {merged}/srv/nvidia-apt
        install -m 0755 {tmp_path}/install.sh {merged}/tmp/install.sh
        exec chroot {merged} /tmp/install.sh
        """
    result = subprocess.run(["unshare", "-m", "--propagation", "private", "bash", "-c", setup],
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
    facts = dict(line.split("=", 1) for line in result.stdout.splitlines() if "=" in line)

    assert facts["nccl"] == f"ii {PINNED_NCCL}"
    assert facts["driver"] == f"ii {DRIVER_525}"
    assert facts["cuda_link"] == "/usr/local/cuda-11.8"
    assert facts["nvcc"] == "Cuda compilation tools, release 11.8, V11.8.89"
    assert facts["nvml_in_cache"] == "1"
    assert facts["persistenced_user"] == "nvidia-persistenced"
    assert facts["persistenced_enabled"] == "0"
    assert not facts["driver525_after_switch"].startswith("ii")
    assert facts["driver535_after_switch"] == f"ii {DRIVER_535}"
    assert facts["nvml_after_switch"] == f"{LIBDIR}/libnvidia-ml.so.535.129.03"
    assert "/usr/local/cuda-11.8" not in facts["cuda_alternatives_after_purge"]
