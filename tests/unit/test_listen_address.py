"""Where the gate and verify probe an instance (filter_plugins/listen_address.py):
an instance bound to ::1 or one address of the host never answers on 127.0.0.1."""
import importlib.util
import urllib.parse

import pytest
from hypothesis import given, settings, strategies as st
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


# --- strict parsing (issue 31) ---------------------------------------------------

@pytest.mark.parametrize("host, words", [
    ("0.0.0.0:80", "holds a port"), ("127.0.0.1:8080", "holds a port"), ("[::1", "brackets"), ("::1]", "brackets"),
    ("[fe80::zz]", "brackets"), ("evil.example/x?", "path"), ("127.0.0.1@evil.example", "user info"),
    ("host?x", "query"), ("host#x", "fragment"), ("a b", "neither an IP address nor a host name"),
    ("-bad.example", "neither"), ("a..b", "neither"), ("x" * 64 + ".example", "neither"),
    ("999.1.1.1", "not a valid one"), ("1.2.3", "not a valid one"), ("ho\nst", "neither"),
    (True, "bool"), (8080, "int"), (["127.0.0.1"], "list"),
])
def test_a_host_that_is_not_an_address_is_refused_by_name(host, words):
    with pytest.raises(AnsibleFilterError) as caught:
        listen.llm_fleet_local_url(host, 8080, "http", "llama_server_host")
    assert "llama_server_host is" in str(caught.value) and words in str(caught.value)


@pytest.mark.parametrize("host, url", [
    ("fe80::1%eth0", "http://[fe80::1%eth0]:80"), ("gpu-1.example.com.", "http://gpu-1.example.com.:80"),
    ("gpu_host_1", "http://gpu_host_1:80"), ("[2001:db8::5]", "http://[2001:db8::5]:80"), ("*", "http://127.0.0.1:80"),
    ("[::]", "http://[::1]:80"), (None, "http://127.0.0.1:80"),
])
def test_addresses_and_names_that_are_fine(host, url):
    assert listen.llm_fleet_local_url(host, "80") == url


@pytest.mark.parametrize("port", [8080.7, 8080.0, True, False, "80x", "", " ", "-1", "65536", "1e3", [80], {"p": 80}])
def test_a_port_that_is_not_a_whole_number_in_range_is_refused(port):
    with pytest.raises(AnsibleFilterError, match="not a TCP port: give a whole number from 1 to 65535"):
        listen.llm_fleet_local_url("127.0.0.1", port, "http", "verify_server_host")


def test_a_scheme_other_than_http_is_refused():
    with pytest.raises(AnsibleFilterError, match="scheme"):
        listen.llm_fleet_local_url("127.0.0.1", 80, "ftp")


_HOSTS = st.one_of(
    st.text(max_size=30),
    st.text(alphabet="0123456789abcdef.:[]@/?#%-_ ", max_size=30),
    st.ip_addresses().map(str),
    st.ip_addresses(v=6).map(lambda a: "[%s]" % a),
    st.none(), st.integers(), st.booleans(), st.floats(allow_nan=True))
_PORTS = st.one_of(st.integers(-10, 70000), st.text(max_size=6), st.floats(allow_nan=True), st.booleans(), st.none())


@settings(derandomize=True, max_examples=300, deadline=1000)
@given(_HOSTS, _PORTS)
def test_any_host_and_port_give_a_url_or_a_named_error(host, port):
    try:
        url = listen.llm_fleet_local_url(host, port, "http", "the_listen_var")
    except AnsibleFilterError as err:
        assert "the_listen_var" in str(err)
        return
    parts = urllib.parse.urlsplit(url)
    assert parts.scheme == "http" and parts.hostname and 0 < parts.port < 65536
    assert not parts.path and not parts.query and not parts.username
    # what is accepted round-trips: the probe goes to the host that was given (or its loopback)
    if isinstance(host, str) and host.strip() not in ("", "0.0.0.0", "*", "::", "[::]"):
        assert parts.hostname.lower() == host.strip().strip("[]").lower().split("%")[0] or "%" in host
