"""Hostile inputs to model_fetch (issue 31): a FIFO behind a file:// URL, a lock
held by another run, secrets holding a line break, numbers out of range, URLs that
do not parse, a progress file that is a directory. Each gives a clear error that
names the option (never a secret's value), at once, and leaves no stray file; the
URL and header checks are also driven by hypothesis."""
import json
import os
import socket
import threading
import time

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from conftest import ROOT, run_module

import ansible.module_utils
if str(ROOT / "module_utils") not in ansible.module_utils.__path__:
    ansible.module_utils.__path__.append(str(ROOT / "module_utils"))
from ansible.module_utils import model_download as md  # noqa: E402

SHA = "a" * 64
PROPERTY = settings(derandomize=True, max_examples=150, deadline=2000,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])


def within(seconds, call):
    """call() in a thread: its result or exception, failing the test if it blocks."""
    box = {}

    def run():
        try:
            box["result"] = call()
        except BaseException as err:  # noqa: B902 - handed back to the test
            box["error"] = err
    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(seconds)
    assert not thread.is_alive(), "blocked for more than %ss" % seconds
    return box


def fetch(dest, files, **args):
    return run_module("model_fetch", dict(args, dest=str(dest), files=files))


# --- non-regular files -----------------------------------------------------------

def test_a_fifo_behind_a_file_url_is_refused_without_blocking(tmp_path):
    fifo = tmp_path / "model.gguf"
    os.mkfifo(str(fifo))
    dest = tmp_path / "dest"
    dest.mkdir()
    box = within(5, lambda: md.fetch_all([{"url": "file://%s" % fifo, "sha256": SHA}], str(dest)))
    assert isinstance(box.get("error"), md.FetchError)
    assert "FIFO" in str(box["error"]) and "files[0].url" in str(box["error"])
    assert os.listdir(str(dest)) == []


@pytest.mark.parametrize("make", ["fifo", "dir", "devnull"])
def test_a_non_regular_source_is_refused_by_open_regular(tmp_path, make):
    path = str(tmp_path / "x")
    if make == "fifo":
        os.mkfifo(path)
    elif make == "dir":
        os.mkdir(path)
    else:
        path = "/dev/null"
    box = within(5, lambda: md.open_regular(path, "the mirror's file"))
    assert isinstance(box.get("error"), md.FetchError) and "not a regular file" in str(box["error"])


def test_a_fifo_as_a_pre_staged_file_is_refused(tmp_path):
    fifo = tmp_path / "staged.gguf"
    os.mkfifo(str(fifo))
    box = within(5, lambda: md.fetch_all([{"path": str(fifo), "sha256": SHA}], str(tmp_path)))
    assert isinstance(box.get("error"), md.FetchError) and "FIFO" in str(box["error"])


def test_a_fifo_in_place_of_the_destination_file_is_refused(tmp_path):
    src = tmp_path / "src.gguf"
    src.write_bytes(b"x")
    dest = tmp_path / "dest"
    dest.mkdir()
    os.mkfifo(str(dest / "src.gguf"))
    box = within(5, lambda: md.fetch_all([{"url": "file://%s" % src, "sha256": SHA}], str(dest)))
    assert isinstance(box.get("error"), md.FetchError) and "in the way" in str(box["error"])


# --- the directory lock --------------------------------------------------------------

def test_a_held_lock_times_out_and_names_its_holder(tmp_path):
    src = tmp_path / "src.gguf"
    src.write_bytes(b"model")
    dest = tmp_path / "dest"
    dest.mkdir()
    with md.DirectoryLock(str(dest), timeout=0):
        assert json.loads((dest / md.LOCK_RECORD).read_text())["pid"] == os.getpid()
        started = time.time()
        box = within(10, lambda: md.fetch_all([{"url": "file://%s" % src, "sha256": SHA}], str(dest),
                                              lock_timeout=1))
        assert time.time() - started < 5
    message = str(box.get("error"))
    assert isinstance(box.get("error"), md.FetchError), box
    assert "pid %d" % os.getpid() in message and socket.gethostname() in message and "lock_timeout" in message
    # the holder's record goes with the lock; nothing else is left
    assert os.listdir(str(dest)) == []


def test_a_lock_without_a_record_says_so(tmp_path):
    fd = os.open(str(tmp_path), os.O_RDONLY)
    import fcntl
    fcntl.flock(fd, fcntl.LOCK_EX)
    try:
        with pytest.raises(md.FetchError, match="recorded no pid"):
            with md.DirectoryLock(str(tmp_path), timeout=0):
                pass
    finally:
        os.close(fd)


# --- secrets, numbers, URLs, the progress file ----------------------------------------

@pytest.mark.parametrize("headers, token, named", [
    ({"X-Key": "abc\r\nX-Evil: 1"}, None, "headers[X-Key]"),
    ({"X-Key": "abc\n"}, None, "headers[X-Key]"),
    ({"X-Key": "a\x00b"}, None, "headers[X-Key]"),
    ({}, "hf_abc\n", "hf_token"),
    ({}, "hf_a\rbc", "hf_token"),
    ({}, "hf_a bc", "hf_token"),
    ({"Bad Name": "x"}, None, "headers has the name"),
    ({"X-Key": {"nested": "v"}}, None, "headers[X-Key]"),
    ({"X-Key": None}, None, "headers[X-Key]"),
    ({"X-Key": True}, None, "headers[X-Key]"),
])
def test_a_bad_header_or_token_is_named_without_its_value(headers, token, named):
    with pytest.raises(md.FetchError) as caught:
        md.check_headers(headers, token)
    message = str(caught.value)
    assert named in message
    for value in list(headers.values()) + [token]:
        if isinstance(value, str) and value.strip():
            assert value.strip() not in message and repr(value)[1:-1] not in message


@pytest.mark.parametrize("args, named", [
    ({"retry_delay": -1}, "retry_delay is -1"),
    ({"retry_delay": 61}, "retry_delay"),
    ({"timeout": 10 ** 12}, "timeout is 1000000000000: give a whole number from 1 to 86400"),
    ({"timeout": 0}, "timeout is 0"),
    ({"retries": -1}, "retries is -1"),
    ({"retries": 10 ** 6}, "retries"),
    ({"min_free_bytes": -5}, "min_free_bytes is -5"),
    ({"lock_timeout": -1}, "lock_timeout is -1"),
])
def test_numbers_out_of_range_are_named_and_leave_nothing(tmp_path, args, named):
    src = tmp_path / "src.gguf"
    src.write_bytes(b"model")
    dest = tmp_path / "dest"
    dest.mkdir()
    result = fetch(dest, [{"url": "file://%s" % src, "sha256": SHA}], **args)
    assert result["failed"] and named in result["msg"], result["msg"]
    assert os.listdir(str(dest)) == []


@pytest.mark.parametrize("value", [float("nan"), float("inf"), "1x", None, True, 2.5])
def test_check_options_refuses_what_is_not_a_number_in_range(value):
    with pytest.raises(md.FetchError, match="timeout is"):
        md.check_options(timeout=value)


@pytest.mark.parametrize("url, words", [
    ("http://[::1/x", "not a valid URL"),
    ("http://host:99999/x", "not a valid URL"),
    ("http://host:0/x", "port 0"),
    ("http:///x.gguf", "has no host"),
    ("ftp://host/x.gguf", "only http://"),
    ("file://otherhost/x.gguf", "names a host"),
    ("http://host/a b.gguf", "space or a control character"),
    ("http://host/a\nb.gguf", "space or a control character"),
    ("https://user:hunter2pass@[::1/x", "not a valid URL"),
])
def test_a_malformed_url_is_named(tmp_path, url, words):
    with pytest.raises(md.FetchError) as caught:
        md.normalize_specs([{"url": url, "sha256": SHA}])
    assert "files[0].url" in str(caught.value) and words in str(caught.value)
    assert "hunter2pass" not in str(caught.value)


def test_a_malformed_url_fails_the_module_cleanly(tmp_path):
    result = fetch(tmp_path, [{"url": "http://[::1/x", "sha256": SHA}])
    assert result["failed"] and "files[0].url" in result["msg"] and "Traceback" not in json.dumps(result)


def test_a_progress_file_that_is_a_directory_is_named(tmp_path):
    src = tmp_path / "src.gguf"
    src.write_bytes(b"model")
    dest = tmp_path / "dest"
    dest.mkdir()
    progress = tmp_path / "progress"
    progress.mkdir()
    result = fetch(dest, [{"url": "file://%s" % src, "sha256": SHA}], progress_file=str(progress))
    assert result["failed"] and "progress_file %s is a directory" % progress in result["msg"]
    assert os.listdir(str(progress)) == [] and os.listdir(str(dest)) == []
    assert sorted(os.listdir(str(tmp_path))) == ["dest", "progress", "src.gguf"]


def test_a_progress_file_in_a_missing_directory_is_named(tmp_path):
    with pytest.raises(md.FetchError, match="does not exist"):
        md.ProgressFile(str(tmp_path / "nowhere" / "p.json"))


# --- properties: any URL, any header --------------------------------------------------

_URL_TEXT = st.one_of(
    st.text(max_size=40),
    st.builds(lambda scheme, host, port, path: "%s://%s%s/%s" % (scheme, host, port, path),
              st.sampled_from(["http", "https", "file", "ftp", "HTTP", ""]),
              st.one_of(st.text(max_size=12), st.sampled_from(["[::1", "::1]", "[::1]", "h@x", "a:b@h", "host"])),
              st.one_of(st.just(""), st.integers(-5, 70000).map(lambda p: ":%d" % p), st.text(max_size=4)),
              st.text(max_size=12)))


@PROPERTY
@given(_URL_TEXT)
def test_any_url_is_accepted_or_named(url):
    try:
        parts = md.check_url(url, "files[0].url")
    except md.FetchError as err:
        assert "files[0].url" in str(err)
        return
    assert parts.scheme.lower() in ("http", "https", "file")
    if parts.scheme.lower() != "file":
        assert parts.hostname and 0 < (parts.port or 80) < 65536


_SECRET = st.text(min_size=6, max_size=30).filter(lambda s: len(s.strip()) >= 6)


@PROPERTY
@given(st.dictionaries(st.text(max_size=12), st.one_of(_SECRET, st.integers(), st.none(), st.lists(st.text())),
                       max_size=3),
       st.one_of(st.none(), _SECRET))
def test_any_headers_are_accepted_or_named_without_their_values(headers, token):
    try:
        checked = md.check_headers(headers, token)
    except md.FetchError as err:
        message = str(err)
        assert "headers" in message or "hf_token" in message
        for value in list(headers.values()) + [token]:
            if isinstance(value, str):
                assert value.strip() not in message
        return
    for key, value in checked.items():
        assert "\r" not in value and "\n" not in value and md._HEADER_NAME.match(key)
