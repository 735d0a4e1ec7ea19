"""Every host after site.yml (check mode ran first on the new hosts: the scenario's
check step, which used to be the default scenario's)."""


def test_host_is_up_with_no_failed_units(host):
    assert host.process.get(pid=1).comm == "systemd"
    failed = host.run("systemctl --failed --no-legend --plain").stdout.strip()
    assert failed == "", failed
