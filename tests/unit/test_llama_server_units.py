"""The systemd units the roles write hold only options the host's systemd has.

Ubuntu 20.04 ships systemd 245, Debian 11 247, Ubuntu 22.04 249, Debian 12 252
(FACTS.md). systemd logs "Unknown key name ... ignoring" for a key it does not
know and, worse, refuses a value it cannot parse (CPUAffinity=numa before 248
fails the drop-in's line). Every unit template of every role is rendered here for
each of these versions, and every key (and the values that came later than their
key) is checked against the version that added it.

Where the versions come from: systemd.exec(5)/systemd.unit(5) "Added in version N"
notes (as transcribed in systemd-js/systemd packages/conf/src/exec.ts); NUMAPolicy=,
NUMAMask= and CPUAffinity=numa from FACTS.md; the system call groups from systemd
v239's src/shared/seccomp-util.c (@system-service, @memlock, @privileged,
@obsolete are all there). 0 = older than the man pages' version notes (pre-183).
A template that gains a key missing here fails the test: look its version up.
"""
import importlib.util
import re
import shlex

import jinja2
import pytest
import yaml

from conftest import ROOT

_spec = importlib.util.spec_from_file_location(
    "llama_server_filters", ROOT / "roles" / "llama_server" / "filter_plugins" / "llama_server.py")
filters = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(filters)
_unit_spec = importlib.util.spec_from_file_location("systemd_unit_filters", ROOT / "filter_plugins" / "systemd_unit.py")
unit_filters = importlib.util.module_from_spec(_unit_spec)
_unit_spec.loader.exec_module(unit_filters)

SYSTEMD_SINCE = {
    # [Unit] / [Install]
    "Description": 0, "Documentation": 0, "After": 0, "Before": 0, "Wants": 0, "WantedBy": 0,
    # [Service]
    "Type": 0, "RemainAfterExit": 0, "ExecStart": 0, "User": 0, "Group": 0, "WorkingDirectory": 0,
    "Restart": 0, "RestartSec": 0, "TimeoutStartSec": 0, "TimeoutStopSec": 0, "LimitMEMLOCK": 0,
    "LimitNOFILE": 0, "Environment": 0, "UMask": 0, "PrivateTmp": 0, "CapabilityBoundingSet": 0,
    "CPUAffinity": 0, "DeviceAllow": 208, "DevicePolicy": 208,
    "NoNewPrivileges": 187, "SystemCallFilter": 187, "SystemCallArchitectures": 209, "SystemCallErrorNumber": 209,
    "RestrictAddressFamilies": 211, "ProtectSystem": 214, "ProtectHome": 214, "PrivateMounts": 239, "AmbientCapabilities": 229,
    "RestrictRealtime": 231, "ReadWritePaths": 231, "ProtectKernelTunables": 232, "ProtectKernelModules": 232,
    "ProtectControlGroups": 232, "RemoveIPC": 232, "RestrictNamespaces": 233, "LockPersonality": 235,
    "ProtectHostname": 242, "RestrictSUIDSGID": 242, "NUMAPolicy": 243, "NUMAMask": 243,
    "RuntimeDirectory": 211, "RuntimeDirectoryPreserve": 235, "ProtectKernelLogs": 244, "ProtectClock": 245, "ProtectProc": 247,
}
# Values newer than their key.
VALUE_SINCE = {
    ("CPUAffinity", "numa"): 248,
    ("ProtectSystem", "strict"): 232,
    ("TimeoutStartSec", "infinity"): 229,
}
SYSCALL_GROUPS_V239 = {"@system-service", "@memlock", "@privileged", "@obsolete", "@resources", "@mount",
                       "@clock", "@debug", "@module", "@raw-io", "@reboot", "@swap", "@cpu-emulation"}
VERSIONS = [245, 247, 249, 252]

PLAN = {"gpu_index": 1, "gpu_uuid": "GPU-1111", "quant": "Q4_K_M", "ctx_size": 32768, "parallel": 4,
        "cache_type_k": "f16", "cache_type_v": "f16"}
AFFINITY = list(range(0, 20)) + list(range(40, 60))


def _vars(version, **over):
    base = {
        "ansible_managed": "Ansible managed",
        # llama_server
        "llama_server_config_dir": "/etc/llm-fleet/llama-server", "llama_server_user": "llama",
        "llama_server_state_dir": "/var/lib/llm-fleet/llama-server", "llama_server_systemd_version": version,
        "llama_server_plan": PLAN, "llama_server_build_key": "abc123",
        "llama_server_extra_env": filters.llama_server_environment({"backend": "cuda", "cuda_version": "11.8"}),
        "llama_server_install_dir": "/opt/llm-fleet/llama.cpp/abc123",
        "llama_server_args": ["--model", "/m/q 4.gguf", "--ctx-size", "32768"],
        "llama_server_gpu_minors": [1], "llama_server_numa_node": 1,
        "llama_server_cpu_affinity": filters.llama_server_cpu_list(AFFINITY),
        # a card's router for its models loaded on demand
        "llama_server_router": {"gpu_index": 1, "models": ["code", "embed"], "models_max": 1},
        "llama_server_router_preset_path": "/etc/llm-fleet/llama-server/1-router.ini",
        "llama_server_router_uuid": "GPU-1111",
        "llama_server_router_argv": ["--host", "127.0.0.1", "--port", "8181", "--models-preset",
                                     "/etc/llm-fleet/llama-server/1-router.ini", "--models-max", "1"],
        # gpu_tuning
        "llm_fleet_gpu_target": "llm-fleet-gpu.target", "gpu_tuning_config_path": "/etc/llm-fleet/gpu-tuning.json",
        "gpu_tuning_tool": "/opt/llm-fleet/bin/gpu-tuning-apply", "gpu_tuning_nvml_wait_seconds": 60,
        "llm_fleet_python": "/opt/llm-fleet/venv/bin/python",
        # gpu_exporter
        "gpu_exporter_listen": "0.0.0.0:9400", "gpu_exporter_allow": ["10.0.0.5/32", "fd00::/64"],
        "gpu_exporter_dir": "/opt/llm-fleet/gpu-exporter", "gpu_exporter_user": "llm-gpu-exporter",
        "gpu_exporter_foreign_gpu_processes": "refuse", "gpu_exporter_expected_gpus": 2, "inventory_hostname": "gpu-a01",
        "ansible_facts": {"nvidia_gpus": [{"minor_number": 0}, {"minor_number": 3}]},
    }
    base.update(over)
    return base


def _env():
    # as Ansible's template module: trim_blocks, undefined variables are errors
    env = jinja2.Environment(trim_blocks=True, undefined=jinja2.StrictUndefined, keep_trailing_newline=True)
    env.filters["quote"] = lambda s: shlex.quote(str(s))
    env.filters.update(filters.FilterModule().filters())
    env.filters.update(unit_filters.FilterModule().filters())
    return env


def unit_templates():
    """Every template of every role that writes a systemd unit or drop-in."""
    found = []
    for path in sorted((ROOT / "roles").glob("*/templates/*.j2")):
        if re.search(r"^\[(Unit|Service|Install)\]", path.read_text(), re.M):
            found.append(path)
    return found


def render(path, variables):
    return _env().from_string(path.read_text()).render(**variables)


def settings(text):
    """(section, key, value) of every assignment in a unit file."""
    section, out = None, []
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("["):
            section = line.strip("[]")
            continue
        key, sep, value = line.partition("=")
        assert sep, "not a key=value line: %r" % line
        out.append((section, key.strip(), value.strip()))
    return out


def test_the_unit_templates_are_found():
    names = {p.name for p in unit_templates()}
    assert {"llama-server@.service.j2", "plan.conf.j2", "gpu-tuning.service.j2", "llm-fleet-gpu.target.j2"} <= names


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("path", unit_templates(), ids=lambda p: p.parent.parent.name + "/" + p.name)
def test_no_unit_option_newer_than_the_hosts_systemd(path, version):
    text = render(path, _vars(version))
    for section, key, value in settings(text):
        assert section in ("Unit", "Service", "Install"), "%s: key %s outside a known section" % (path.name, key)
        assert key in SYSTEMD_SINCE, (
            "%s writes %s=, which this test does not know: look up the systemd version that added it "
            "(systemd.exec(5) 'Added in version') and add it to SYSTEMD_SINCE" % (path.name, key))
        assert SYSTEMD_SINCE[key] <= version, "%s writes %s= (systemd %d) for a host with systemd %d" % (
            path.name, key, SYSTEMD_SINCE[key], version)
        for word in value.split():
            since = VALUE_SINCE.get((key, word.lstrip("~")), 0)
            assert since <= version, "%s writes %s=%s (systemd %d) for systemd %d" % (
                path.name, key, word, since, version)
            if key == "SystemCallFilter":
                assert word.lstrip("~") in SYSCALL_GROUPS_V239, "unknown system call group %s" % word


def test_protect_proc_only_where_systemd_has_it():
    unit = ROOT / "roles" / "llama_server" / "templates" / "llama-server@.service.j2"
    old = render(unit, _vars(245))
    new = render(unit, _vars(252))
    assert "ProtectProc=invisible" in new.splitlines()
    assert not any(line.startswith("ProtectProc") for line in old.splitlines())
    assert "needs systemd 247" in old
    # everything else is the same on both
    strip = [line for line in new.splitlines() if not line.startswith("ProtectProc")]
    assert strip == [line for line in old.splitlines() if "ProtectProc" not in line]


def test_an_unknown_systemd_version_gets_the_oldest_supported_unit():
    unit = ROOT / "roles" / "llama_server" / "templates" / "llama-server@.service.j2"
    version = filters.llama_server_systemd_version("")
    assert version == 245
    assert "ProtectProc=invisible" not in render(unit, _vars(version)).splitlines()


def test_the_dropin_binds_to_the_gpus_cpus_explicitly():
    dropin = ROOT / "roles" / "llama_server" / "templates" / "plan.conf.j2"
    lines = render(dropin, _vars(245)).splitlines()
    assert "CPUAffinity=0-19 40-59" in lines
    assert "NUMAPolicy=bind" in lines and "NUMAMask=1" in lines
    assert "CPUAffinity=numa" not in lines
    assert 'Environment="CUDA_MODULE_LOADING=LAZY"' in lines
    assert lines.index('Environment="CUDA_VISIBLE_DEVICES=GPU-1111"') < lines.index('Environment="CUDA_MODULE_LOADING=LAZY"')
    assert 'ExecStart=/opt/llm-fleet/llama.cpp/abc123/bin/llama-server --model "/m/q 4.gguf" --ctx-size 32768' in lines


def test_the_dropin_leaves_out_what_the_host_lacks():
    dropin = ROOT / "roles" / "llama_server" / "templates" / "plan.conf.j2"
    text = render(dropin, _vars(245, llama_server_cpu_affinity=filters.llama_server_cpu_list([]),
                                llama_server_numa_node=None, llama_server_gpu_minors=[],
                                llama_server_extra_env=filters.llama_server_environment({"backend": "cpu"})))
    assert "CPUAffinity" not in text and "NUMA" not in text and "DeviceAllow" not in text
    assert "CUDA_MODULE_LOADING" not in text


def test_a_split_instance_sees_and_may_open_every_gpu_it_uses():
    dropin = ROOT / "roles" / "llama_server" / "templates" / "plan.conf.j2"
    split = dict(PLAN, gpu_index=0, gpu_uuid="GPU-0000", gpu_indices=[0, 1], gpu_uuids=["GPU-0000", "GPU-1111"],
                 split_mode="tensor", tensor_split=[0.5, 0.5])
    lines = render(dropin, _vars(245, llama_server_plan=split, llama_server_gpu_minors=[0, 1],
                                 llama_server_numa_node=None,
                                 llama_server_cpu_affinity=filters.llama_server_cpu_list([]))).splitlines()
    assert 'Environment="CUDA_VISIBLE_DEVICES=GPU-0000,GPU-1111"' in lines
    assert "DeviceAllow=/dev/nvidia0 rw" in lines and "DeviceAllow=/dev/nvidia1 rw" in lines
    assert "# One model over GPUs 0, 1 (tensor split)" in lines
    assert not [line for line in lines if line.startswith(("NUMA", "CPUAffinity"))]  # cards on two nodes


# --- the filters ----------------------------------------------------------------------

@pytest.mark.parametrize("cpus, usable, want", [
    (AFFINITY, None, "0-19 40-59"),
    ([3, 1, 2, 7, 9, 10], None, "1-3 7 9-10"),
    ([5], None, "5"),
    ([], None, ""),
    (None, None, ""),
    ("0-3,8,10-11", None, "0-3 8 10-11"),
    (AFFINITY, "0-7", "0-7"),                                     # a container with 8 CPUs
    (AFFINITY, "Name:\tpython3\nCpus_allowed_list:\t16-47\n", "16-19 40-47"),  # /proc/self/status
    (list(range(20, 40)), "0-15", ""),                            # none usable: the line is left out
    (AFFINITY, "", "0-19 40-59"),                                 # unread: NVML's list as it is
    (AFFINITY, "Name:\tpython3\nState:\tR\n", "0-19 40-59"),       # no Cpus_allowed_list: the same
    ("Name:\tx\nCpus_allowed_list:\t0-3,8\n", None, "0-3 8"),      # what validate.yml keeps of the status
])
def test_cpu_list(cpus, usable, want):
    assert filters.llama_server_cpu_list(cpus, usable) == want


@pytest.mark.parametrize("fact, choice, want", [
    ({"backend": "cuda", "cuda_version": "11.8"}, "auto", {"CUDA_MODULE_LOADING": "LAZY"}),
    ({"backend": "cuda", "cuda_version": "11.7"}, "auto", {"CUDA_MODULE_LOADING": "LAZY"}),
    ({"backend": "cuda", "cuda_version": "11.6"}, "auto", {}),    # LAZY is not honoured before 11.7
    ({"backend": "cuda", "cuda_version": "10.2"}, "auto", {}),
    ({"backend": "cuda", "cuda_version": "12.1"}, "auto", {"CUDA_MODULE_LOADING": "LAZY"}),
    ({"backend": "cuda", "cuda_version": "12.2.140"}, "auto", {"CUDA_MODULE_LOADING": "LAZY"}),
    ({"backend": "cuda", "cuda_version": "13.0"}, "auto", {"CUDA_MODULE_LOADING": "LAZY"}),
    ({"backend": "cuda", "cuda_version": 13}, "auto", {"CUDA_MODULE_LOADING": "LAZY"}),
    ({"backend": "cuda", "cuda_version": None}, "auto", {}),      # unknown version: CUDA's default
    ({"backend": "cuda", "cuda_version": ""}, "auto", {}),
    ({"backend": "cpu", "cuda_version": None}, "auto", {}),
    ({}, "auto", {}),
    (None, "auto", {}),
    ({"backend": "cuda", "cuda_version": "11.8"}, "EAGER", {"CUDA_MODULE_LOADING": "EAGER"}),
    ({"backend": "cuda", "cuda_version": "11.6"}, "lazy", {"CUDA_MODULE_LOADING": "LAZY"}),
    ({"backend": "cuda", "cuda_version": "11.8"}, "", {}),
    ({"backend": "cpu", "cuda_version": None}, "LAZY", {}),
])
def test_cuda_environment(fact, choice, want):
    assert filters.llama_server_environment(fact, choice) == want


def test_cuda_module_loading_rejects_other_values():
    with pytest.raises(ValueError, match="auto, LAZY, EAGER"):
        filters.llama_server_environment({"backend": "cuda", "cuda_version": "11.8"}, "lazyish")


@pytest.mark.parametrize("text, want", [
    ("systemd 245 (245.4-4ubuntu3.23)\n+PAM +AUDIT +SELINUX", 245),
    ("systemd 249 (249.11-0ubuntu3.12)\n+PAM", 249),
    ("systemd 252 (252.33-1~deb12u1)\n+PAM", 252),
    ("252", 252),
    (247, 247),
    ("", 245),
    (None, 245),
    ("bash: systemctl: command not found", 245),
])
def test_systemd_version(text, want):
    assert filters.llama_server_systemd_version(text) == want


# --- the stages use the decision ---------------------------------------------------------

def _tasks(path):
    def walk(items):
        for item in items or []:
            yield item
            for key in ("block", "rescue", "always"):
                yield from walk(item.get(key))
    return list(walk(yaml.safe_load((ROOT / path).read_text())))


def test_the_server_records_its_environment_and_llama_bench_runs_with_it():
    record = [t for t in _tasks("roles/llama_server/tasks/record.yml") if "ansible.builtin.copy" in t]
    assert "llama_server_extra_env" in record[0]["vars"]["llama_server_record"]["environment"]
    bench = [t for t in _tasks("roles/verify/tasks/instance.yml") if "llama-bench" in t.get("name", "")
             and "ansible.builtin.command" in t]
    assert len(bench) == 1 and "verify_server_environment" in bench[0]["environment"]
    defaults = yaml.safe_load((ROOT / "roles" / "verify" / "defaults" / "main.yml").read_text())
    assert "llm_fleet_stage_fact('llama_server')).environment" in defaults["verify_server_environment"]
