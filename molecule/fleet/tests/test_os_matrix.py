"""The whole site.yml on hosts of different OS releases: each host serves with a
llama.cpp build made for its own release (the build key holds the platform), and
what the roles wrote works with that release's systemd and Python."""
import json
import re

FACT_DIR = "/etc/ansible/facts.d"


def fact(host, stage):
    return json.loads(host.file("%s/llm_fleet_%s.fact" % (FACT_DIR, stage)).content_string)


def os_release(host):
    return dict(re.findall(r'^(\w+)="?([^"\n]*)"?$', host.file("/etc/os-release").content_string, re.M))


def test_the_host_runs_the_release_its_group_says(host):
    release = os_release(host)
    # molecule.yml: the Debian 11 host's name ends in -deb11 (group debian11).
    want = "bullseye" if host.backend.get_hostname().endswith("-deb11") else "bookworm"
    assert release["VERSION_CODENAME"] == want
    python = host.check_output("/usr/bin/python3 -c 'import sys; print(\"%d.%d\" % sys.version_info[:2])'")
    assert python == {"bullseye": "3.9", "bookworm": "3.11"}[want]


def test_the_build_was_made_for_this_release(host):
    build = fact(host, "llama_cpp")
    codename = os_release(host)["VERSION_CODENAME"]
    assert build["backend"] == "cuda" and build["cuda_architectures"] == ["70"]
    record = json.loads(host.file("/opt/llm-fleet/llama.cpp/current/BUILD.json").content_string)
    assert record["platform"] == "Debian %s x86_64" % codename
    # The binary runs here: its libraries (glibc, libstdc++) are this release's.
    version = host.run("/opt/llm-fleet/llama.cpp/current/bin/llama-server --version")
    assert version.rc == 0, version.stderr
    assert "commit %s" % build["commit"][:9] in version.stdout + version.stderr


def test_every_planned_instance_serves(host):
    served = fact(host, "llama_server")["instances"]
    assert served
    for instance in served:
        unit = host.service(instance["unit"])
        assert unit.is_running, instance["unit"]
        health = host.run("python3 -c 'import sys, urllib.request; "
                          "print(urllib.request.urlopen(sys.argv[1], timeout=10).read().decode())' "
                          "http://127.0.0.1:%d/health" % instance["port"])
        assert health.rc == 0 and '"ok"' in health.stdout, health.stdout + health.stderr


def test_the_units_carry_no_option_newer_than_the_hosts_systemd(host):
    """systemd logs unknown options and ignores them: a unit written for a newer
    systemd silently loses its hardening or NUMA binding. None may be left."""
    for instance in fact(host, "llama_server")["instances"]:
        verify = host.run("systemd-analyze verify %s 2>&1" % instance["unit"])
        assert "Unknown key name" not in verify.stdout + verify.stderr, verify.stdout + verify.stderr
        assert "Unknown lvalue" not in verify.stdout + verify.stderr, verify.stdout + verify.stderr
