"""One V100-SXM2-32GB host after site.yml."""


def test_host_is_up_with_no_failed_units(host):
    assert host.process.get(pid=1).comm == "systemd"
    failed = host.run("systemctl --failed --no-legend --plain").stdout.strip()
    assert failed == "", failed
