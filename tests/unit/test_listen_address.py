"""Where the gate and verify probe an instance (filter_plugins/listen_address.py):
an instance bound to ::1 or one address of the host never answers on 127.0.0.1."""
import importlib.util

import pytest
from ansible.errors import AnsibleFilterError

from conftest import ROOT

_spec = importlib.util.spec_from_file_location("listen_address", ROOT / "filter_plugins" / "listen_address.py")
listen = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(listen)


@pytest.mark.parametrize("host, url", [
    ("127.0.0.1", "http://127.0.0.1:8080"), ("0.0.0.0", "http://127.0.0.1:8080"), ("", "http://127.0.0.1:8080"),
    ("::1", "http://[::1]:8080"), ("::", "http://[::1]:8080"), ("[::1]", "http://[::1]:8080"),
    ("10.1.2.3", "http://10.1.2.3:8080"), ("fe80::1", "http://[fe80::1]:8080"), ("localhost", "http://localhost:8080"),
])
def test_probe_url(host, url):
    assert listen.llm_fleet_local_url(host, 8080) == url


@pytest.mark.parametrize("port", [0, 70000, "http", None])
def test_a_bad_port_is_refused(port):
    with pytest.raises(AnsibleFilterError, match="not a TCP port"):
        listen.llm_fleet_local_url("127.0.0.1", port)
