"""library/model_fetch.py, module_utils/model_download.py and the llm_model role's
catalogue filters.

Downloads go over real HTTP to a server thread started by the tests (Range
requests, and on demand: cutting a transfer mid-way, ignoring ranges, errors,
redirects); the module runs as Ansible runs it (run_module: a fresh Python
process), so the bytes cross a real socket."""
import hashlib
import importlib.util
import json
import os
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from conftest import ROOT, run_module

import gguf_fixtures

import ansible.module_utils
if str(ROOT / "module_utils") not in ansible.module_utils.__path__:
    ansible.module_utils.__path__.append(str(ROOT / "module_utils"))
from ansible.module_utils import model_download as md  # noqa: E402

MIB = 1 << 20


def sha(data):
    return hashlib.sha256(data).hexdigest()


# --- the test server ------------------------------------------------------------

class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def do_GET(self):
        state = self.server.state
        path = self.path.split("?")[0]
        state["requests"].append({"path": path, "range": self.headers.get("Range"),
                                  "authorization": self.headers.get("Authorization"),
                                  "x_mirror_key": self.headers.get("X-Mirror-Key")})
        if path in state["redirects"]:
            self.send_response(302)
            self.send_header("Location", state["redirects"][path])
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        if path in state["status"]:
            self.send_response(state["status"][path])
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        data = state["files"].get(path)
        if data is None:
            self.send_response(404)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        start = 0
        wanted = self.headers.get("Range")
        if wanted and not state["ignore_range"]:
            start = int(wanted.split("=")[1].split("-")[0])
            if start >= len(data):
                self.send_response(416)
                self.send_header("Content-Range", "bytes */%d" % len(data))
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            self.send_response(206)
            self.send_header("Content-Range", "bytes %d-%d/%d" % (start, len(data) - 1, len(data)))
        else:
            self.send_response(200)
        body = data[start:]
        self.send_header("Content-Length", str(len(body)))
        self.send_header("ETag", '"%s"' % sha(data)[:16])
        self.end_headers()
        cut = state["cut_after"].pop(path, None)
        if cut is not None:
            # An interrupted transfer: part of the body, then the connection drops.
            self.wfile.write(body[:cut])
            self.wfile.flush()
            self.close_connection = True
            return
        self.wfile.write(body)


@pytest.fixture
def server():
    state = {"files": {}, "requests": [], "cut_after": {}, "ignore_range": False, "redirects": {}, "status": {}}
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    httpd.state = state
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    state["url"] = "http://127.0.0.1:%d" % httpd.server_address[1]
    state["port"] = httpd.server_address[1]
    yield state
    httpd.shutdown()
    httpd.server_close()


@pytest.fixture(scope="module")
def payload():
    """A generated file: 3 MiB of pseudo-random bytes."""
    return hashlib.sha256(b"seed").digest() * (3 * MIB // 32)


def fetch(dest, files, **args):
    return run_module("model_fetch", dict(args, dest=str(dest), files=files, retry_delay=0))


def one(server, payload, name="model-Q4_K_M.gguf", **extra):
    server["files"]["/" + name] = payload
    return dict({"url": server["url"] + "/" + name, "sha256": sha(payload), "size_bytes": len(payload)}, **extra)


def leftovers(dest):
    return sorted(p.name for p in Path(dest).iterdir() if p.name.endswith(".part"))


# --- downloads ------------------------------------------------------------------

def test_fresh_download(server, payload, tmp_path):
    result = fetch(tmp_path, [one(server, payload)])
    assert not result.get("failed"), result.get("msg")
    assert result["changed"] is True
    entry = result["files"][0]
    assert entry["action"] == "downloaded"
    assert entry["bytes_downloaded"] == len(payload) == result["bytes_downloaded"]
    assert entry["resumed_from"] == 0
    assert entry["sha256"] == sha(payload)
    assert entry["elapsed"] >= 0
    target = tmp_path / "model-Q4_K_M.gguf"
    assert target.read_bytes() == payload
    assert oct(target.stat().st_mode & 0o777) == "0o644"
    assert result["paths"] == [str(target)]
    assert leftovers(tmp_path) == []
    assert server["requests"][0]["range"] is None
    # the verified checksum is cached beside it
    cache = json.loads((tmp_path / ".model-Q4_K_M.gguf.sha256").read_text())
    assert cache["sha256"] == sha(payload) and cache["size"] == len(payload)


def test_a_synthetic_gguf_downloads_byte_for_byte(server, tmp_path):
    (tmp_path / "src").mkdir()
    (tmp_path / "dest").mkdir()
    data = Path(gguf_fixtures.tiny(tmp_path / "src" / "tiny.gguf")[0]).read_bytes()
    result = fetch(tmp_path / "dest", [one(server, data, name="tiny-Q8_0.gguf")])
    assert not result.get("failed"), result.get("msg")
    assert (tmp_path / "dest" / "tiny-Q8_0.gguf").read_bytes() == data


def test_resume_after_an_interrupted_transfer(server, payload, tmp_path):
    spec = one(server, payload)
    server["cut_after"]["/model-Q4_K_M.gguf"] = 1234567
    first = fetch(tmp_path, [spec], retries=0)
    assert first["failed"]
    assert "stopped at byte 1234567 of %d" % len(payload) in first["msg"]
    assert "the next run resumes from byte 1234567" in first["msg"]
    assert not (tmp_path / "model-Q4_K_M.gguf").exists()
    assert len(leftovers(tmp_path)) == 1
    partial = tmp_path / leftovers(tmp_path)[0]
    assert partial.stat().st_size == 1234567

    second = fetch(tmp_path, [spec], retries=0)
    assert not second.get("failed"), second.get("msg")
    entry = second["files"][0]
    assert entry["action"] == "resumed"
    assert entry["resumed_from"] == 1234567 > 0
    assert entry["bytes_downloaded"] == len(payload) - 1234567
    assert server["requests"][-1]["range"] == "bytes=1234567-"
    assert (tmp_path / "model-Q4_K_M.gguf").read_bytes() == payload
    assert leftovers(tmp_path) == []


def test_a_broken_transfer_is_resumed_within_the_run(server, payload, tmp_path):
    spec = one(server, payload)
    server["cut_after"]["/model-Q4_K_M.gguf"] = MIB
    result = fetch(tmp_path, [spec], retries=2)
    assert not result.get("failed"), result.get("msg")
    entry = result["files"][0]
    assert [a["from"] for a in entry["attempts"]] == [0, MIB]
    assert "closed at byte %d" % MIB in entry["attempts"][0]["error"]
    assert entry["attempts"][1]["error"] is None
    assert entry["bytes_downloaded"] == len(payload)
    assert (tmp_path / "model-Q4_K_M.gguf").read_bytes() == payload


def test_a_server_without_ranges_restarts_from_zero(server, payload, tmp_path):
    spec = one(server, payload)
    part = Path(md.partial_path(str(tmp_path), "model-Q4_K_M.gguf", sha(payload)))
    part.write_bytes(b"x" * 1000)  # not even the right bytes: the restart must not keep them
    server["ignore_range"] = True
    result = fetch(tmp_path, [spec])
    assert not result.get("failed"), result.get("msg")
    entry = result["files"][0]
    assert entry["resumed_from"] == 0 and entry["action"] == "downloaded"
    assert server["requests"][0]["range"] == "bytes=1000-"
    assert (tmp_path / "model-Q4_K_M.gguf").read_bytes() == payload


def test_a_partial_file_of_another_version_is_not_resumed(server, payload, tmp_path):
    old = Path(md.partial_path(str(tmp_path), "model-Q4_K_M.gguf", sha(b"older version")))
    old.write_bytes(payload[:5000])
    result = fetch(tmp_path, [one(server, payload)])
    assert not result.get("failed"), result.get("msg")
    assert result["files"][0]["resumed_from"] == 0
    assert server["requests"][0]["range"] is None
    assert not old.exists()


def test_wrong_checksum_keeps_the_previous_good_file(server, payload, tmp_path):
    good = fetch(tmp_path, [one(server, payload)])
    assert not good.get("failed"), good.get("msg")
    target = tmp_path / "model-Q4_K_M.gguf"
    before = target.stat()
    # The catalogue moves to a new version, but the server hands out something else.
    newer = payload[::-1]
    server["files"]["/model-Q4_K_M.gguf"] = newer[:-7] + b"corrupt"
    spec = {"url": server["url"] + "/model-Q4_K_M.gguf", "sha256": sha(newer), "size_bytes": len(newer)}
    bad = fetch(tmp_path, [spec])
    assert bad["failed"]
    assert "Checksum mismatch" in bad["msg"]
    assert sha(newer) in bad["msg"] and sha(newer[:-7] + b"corrupt") in bad["msg"]
    assert "%s, is kept as it was" % target in bad["msg"]
    assert target.read_bytes() == payload
    assert target.stat().st_mtime_ns == before.st_mtime_ns
    assert leftovers(tmp_path) == []


def test_wrong_checksum_on_a_fresh_host_installs_nothing(server, payload, tmp_path):
    spec = dict(one(server, payload), sha256=sha(b"something else"))
    bad = fetch(tmp_path, [spec])
    assert bad["failed"] and "nothing was installed" in bad["msg"]
    assert sorted(p.name for p in tmp_path.iterdir()) == []


def test_a_verified_file_is_not_fetched_again(server, payload, tmp_path):
    spec = one(server, payload)
    assert not fetch(tmp_path, [spec]).get("failed")
    server["requests"].clear()
    again = fetch(tmp_path, [spec])
    assert again["changed"] is False
    assert again["files"][0]["action"] == "present"
    assert again["files"][0]["checksum_source"] == "cache"
    assert again["bytes_downloaded"] == 0
    assert server["requests"] == []
    # Touched (new mtime): hashed again, still not fetched.
    target = tmp_path / "model-Q4_K_M.gguf"
    os.utime(target, ns=(target.stat().st_atime_ns, target.stat().st_mtime_ns + 10 ** 9))
    touched = fetch(tmp_path, [spec])
    assert touched["changed"] is False and touched["files"][0]["checksum_source"] == "computed"
    assert server["requests"] == []
    # Changed on disk (same size): no longer the catalogue's file, fetched again.
    with open(target, "r+b") as handle:
        handle.write(b"\0\0\0\0")
    repaired = fetch(tmp_path, [spec])
    assert repaired["changed"] is True and repaired["files"][0]["action"] == "downloaded"
    assert repaired["files"][0]["replaces"] is True
    assert target.read_bytes() == payload


def test_not_enough_disk_space_is_refused_before_downloading(server, payload, tmp_path):
    spec = dict(one(server, payload), size_bytes=1 << 50)
    result = fetch(tmp_path, [spec])
    assert result["failed"]
    assert "Not enough free space in %s" % tmp_path in result["msg"]
    assert "1125899906842624 bytes to download" in result["msg"]
    assert "free" in result["msg"] and "llm_model_dir" in result["msg"]
    assert server["requests"] == []
    assert list(tmp_path.iterdir()) == []
    # The same with a file that fits but a margin that does not.
    margin = fetch(tmp_path, [one(server, payload)], min_free_bytes=1 << 55)
    assert margin["failed"] and "to keep free" in margin["msg"]
    assert server["requests"] == []


def test_a_disk_that_fills_up_gets_its_space_back(server, payload, tmp_path):
    """When the catalogue gives no size and the server none either, the free-space check cannot run
    first: a download that fills the disk must not leave its partial file holding the disk at 100%."""
    entry = one(server, payload)
    del entry["size_bytes"]
    # The partial file is written through a link to /dev/full, which answers every write with ENOSPC.
    os.symlink("/dev/full", md.partial_path(str(tmp_path), "model-Q4_K_M.gguf", sha(payload)))
    result = fetch(tmp_path, [entry])
    assert result["failed"]
    assert "filled up" in result["msg"] and "partial file was removed" in result["msg"], result["msg"]
    assert "llm_model_dir" in result["msg"]
    assert leftovers(tmp_path) == [] and not (tmp_path / "model-Q4_K_M.gguf").exists()


def test_check_space_names_needed_and_free():
    with pytest.raises(md.FetchError) as err:
        md.check_space("/models", 20 * (1 << 30), 1 << 30, "Q4_K_M.gguf", free=12 * (1 << 30))
    assert "need 21.00 GiB" in str(err.value) and "only 12.00 GiB" in str(err.value)
    assert md.check_space("/models", 10, 10, "x", free=20) == 20


def test_check_mode_fetches_nothing(server, payload, tmp_path):
    spec = one(server, payload)
    dest = tmp_path / "models"  # not created yet
    result = run_module("model_fetch", {"dest": str(dest), "files": [spec], "_ansible_check_mode": True})
    assert not result.get("failed"), result.get("msg")
    assert result["changed"] is True
    assert result["files"][0]["action"] == "would_download"
    assert result["files"][0]["bytes_to_download"] == len(payload)
    assert not dest.exists() and server["requests"] == []

    dest.mkdir()
    Path(md.partial_path(str(dest), "model-Q4_K_M.gguf", sha(payload))).write_bytes(payload[:4096])
    partial = run_module("model_fetch", {"dest": str(dest), "files": [spec], "_ansible_check_mode": True})
    assert partial["files"][0]["action"] == "would_resume"
    assert partial["files"][0]["resumed_from"] == 4096
    assert partial["files"][0]["bytes_to_download"] == len(payload) - 4096
    assert server["requests"] == []

    assert not fetch(dest, [spec]).get("failed")
    present = run_module("model_fetch", {"dest": str(dest), "files": [spec], "_ansible_check_mode": True})
    assert present["changed"] is False and present["files"][0]["action"] == "present"


def test_a_file_mirror_is_copied_and_resumed(payload, tmp_path):
    mirror = tmp_path / "mirror"
    mirror.mkdir()
    (mirror / "m-Q4_K_M.gguf").write_bytes(payload)
    dest = tmp_path / "models"
    dest.mkdir()
    Path(md.partial_path(str(dest), "m-Q4_K_M.gguf", sha(payload))).write_bytes(payload[:10000])
    spec = {"url": (mirror / "m-Q4_K_M.gguf").as_uri(), "sha256": sha(payload), "size_bytes": len(payload)}
    result = fetch(dest, [spec])
    assert not result.get("failed"), result.get("msg")
    assert result["files"][0]["action"] == "resumed" and result["files"][0]["resumed_from"] == 10000
    assert (dest / "m-Q4_K_M.gguf").read_bytes() == payload


def test_a_pre_staged_file_is_only_verified(payload, tmp_path):
    staged = tmp_path / "nfs" / "m-Q4_K_M.gguf"
    staged.parent.mkdir()
    staged.write_bytes(payload)
    dest = tmp_path / "models"
    dest.mkdir()
    result = fetch(dest, [{"path": str(staged), "sha256": sha(payload)}])
    assert not result.get("failed"), result.get("msg")
    assert result["changed"] is False
    assert result["paths"] == [str(staged)] and result["files"][0]["action"] == "present"
    assert not (dest / "m-Q4_K_M.gguf").exists()
    bad = fetch(dest, [{"path": str(staged), "sha256": sha(b"other")}])
    assert bad["failed"]
    assert "pre-staged file %s has sha256 %s, the catalogue says %s" % (staged, sha(payload), sha(b"other")) in bad["msg"]
    missing = fetch(dest, [{"path": str(tmp_path / "nope.gguf"), "sha256": sha(payload)}])
    assert missing["failed"] and "does not exist" in missing["msg"]


def test_split_model_shards_are_fetched_in_order(server, tmp_path):
    shards = [b"first shard" * 1000, b"second shard" * 1000]
    files = [one(server, data, name="m-Q8_0-%05d-of-00002.gguf" % (i + 1)) for i, data in enumerate(shards)]
    result = fetch(tmp_path, files)
    assert not result.get("failed"), result.get("msg")
    assert result["paths"] == [str(tmp_path / "m-Q8_0-00001-of-00002.gguf"), str(tmp_path / "m-Q8_0-00002-of-00002.gguf")]
    assert result["bytes_downloaded"] == sum(len(s) for s in shards)


def test_a_size_the_server_contradicts_fails_before_downloading(server, payload, tmp_path):
    spec = dict(one(server, payload), size_bytes=len(payload) + 1)
    result = fetch(tmp_path, [spec])
    assert result["failed"]
    assert "has %d bytes, the catalogue says %d" % (len(payload), len(payload) + 1) in result["msg"]
    assert list(tmp_path.iterdir()) == []


def test_http_errors_say_what_to_fix(server, tmp_path):
    missing = fetch(tmp_path, [{"url": server["url"] + "/nope.gguf", "sha256": sha(b"x")}])
    assert missing["failed"] and "HTTP 404" in missing["msg"] and "hf_file" in missing["msg"]
    server["status"]["/gated.gguf"] = 401
    gated = fetch(tmp_path, [{"url": server["url"] + "/gated.gguf", "sha256": sha(b"x")}])
    assert gated["failed"] and "HTTP 401" in gated["msg"] and "llm_model_hf_token" in gated["msg"]
    server["status"]["/busy.gguf"] = 503
    busy = fetch(tmp_path, [{"url": server["url"] + "/busy.gguf", "sha256": sha(b"x")}], retries=1)
    assert busy["failed"] and "after 2 attempt(s): HTTP 503" in busy["msg"]
    refused = fetch(tmp_path, [{"url": "http://127.0.0.1:9/x.gguf", "sha256": sha(b"x")}], retries=0)
    assert refused["failed"] and "cannot reach http://127.0.0.1:9/x.gguf" in refused["msg"]


def test_headers_go_to_the_server_and_not_across_hosts(server, payload, tmp_path):
    spec = one(server, payload)
    # Same host (127.0.0.1) behind a redirect: the header follows. Another host name
    # for the same server (localhost): it does not.
    server["redirects"]["/same"] = server["url"] + "/model-Q4_K_M.gguf"
    server["redirects"]["/other"] = "http://localhost:%d/model-Q4_K_M.gguf" % server["port"]
    for path, dest in (("/same", "a"), ("/other", "b")):
        (tmp_path / dest).mkdir()
        result = fetch(tmp_path / dest, [dict(spec, url=server["url"] + path, name="m.gguf")],
                       headers={"X-Mirror-Key": "s3cret"})
        assert not result.get("failed"), result.get("msg")
        assert "s3cret" not in json.dumps(result)
    keys = [r["x_mirror_key"] for r in server["requests"]]
    assert keys == ["s3cret", "s3cret", "s3cret", None]


def test_the_hugging_face_token_goes_to_hugging_face_only(server, payload, tmp_path):
    result = fetch(tmp_path, [one(server, payload)], hf_token="hf_secret")
    assert not result.get("failed"), result.get("msg")
    assert server["requests"][0]["authorization"] is None
    assert "hf_secret" not in json.dumps(result)
    assert md.is_hf_host("https://huggingface.co/Qwen/x/resolve/main/a.gguf")
    assert md.is_hf_host("https://cdn-lfs.hf.co/x")
    assert not md.is_hf_host("https://evil-huggingface.co.example/x")
    assert not md.is_hf_host("http://mirror.internal/a.gguf")


@pytest.mark.parametrize("files, words", [
    ([{"url": "http://x/a.gguf", "sha256": "abc"}], "files[0].sha256 must be 64 hexadecimal digits"),
    ([{"url": "ftp://x/a.gguf", "sha256": "a" * 64}], "only http://, https:// and file://"),
    ([{"url": "http://x/", "sha256": "a" * 64}], "cannot name the file"),
    ([{"url": "http://x/a.gguf", "sha256": "a" * 64}, {"url": "http://y/a.gguf", "sha256": "b" * 64}],
     "two files would be written as a.gguf"),
    ([{"url": "http://x/a.gguf", "path": "/a.gguf", "sha256": "a" * 64}], "mutually exclusive"),
    # a name lands in a systemd unit and a log line: no newline, no escape sequence
    ([{"url": "http://x/a%0AExecStartPre=+id.gguf", "sha256": "a" * 64}], "without '/' or control characters"),
    ([{"url": "http://x/a.gguf", "name": "a\x1b[2J.gguf", "sha256": "a" * 64}], "control characters"),
])
def test_bad_arguments_are_named(tmp_path, files, words):
    result = fetch(tmp_path, files)
    assert result["failed"] and words in result["msg"], result["msg"]


def test_sha256_forms():
    assert md.normalize_sha256("SHA256:" + "A" * 64) == "a" * 64
    assert md.redact_url("https://user:pw@host/x.gguf?sig=1") == "https://host/x.gguf"


# --- the role's catalogue filters ---------------------------------------------------

def load_filters():
    spec = importlib.util.spec_from_file_location(
        "llm_model_filters", str(ROOT / "roles" / "llm_model" / "filter_plugins" / "llm_model.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


F = load_filters()
SHA = "ab" * 32
META = {"architecture": "qwen2", "block_count": 64, "file_type": "Q4_K_M"}


def test_catalogue_entries_resolve_every_source():
    entries = F.llm_model_entries([
        {"quant": "Q4_K_M", "hf_repo": "Qwen/Qwen2.5-32B-Instruct-GGUF", "hf_file": "q4_k_m.gguf", "sha256": SHA,
         "size_bytes": 100, "metadata": META},
        {"quant": "Q3_K_S", "url": "file:///mnt/mirror/q3%20k.gguf", "sha256": "sha256:" + SHA.upper()},
        {"quant": "Q5_K_M", "path": "/srv/staged/q5.gguf", "sha256": SHA},
        {"quant": "Q8_0", "size_bytes": 300, "metadata": META, "files": [
            {"hf_repo": "o/r", "hf_file": "sub/q8-00001-of-00002.gguf", "hf_revision": "v1", "sha256": SHA,
             "size_bytes": 150},
            {"url": "https://mirror/q8-00002-of-00002.gguf", "sha256": SHA, "size_bytes": 150}]},
    ], "/var/lib/llm-fleet/models/")
    q4, q3, q5, q8 = entries
    assert q4["files"][0]["url"] == "https://huggingface.co/Qwen/Qwen2.5-32B-Instruct-GGUF/resolve/main/q4_k_m.gguf"
    assert q4["model_path"] == "/var/lib/llm-fleet/models/q4_k_m.gguf" and q4["size_bytes"] == 100
    assert q3["files"][0]["name"] == "q3 k.gguf" and q3["files"][0]["sha256"] == SHA
    assert q5["model_path"] == "/srv/staged/q5.gguf" and q5["files"][0]["url"] is None
    assert q8["files"][0]["url"] == "https://huggingface.co/o/r/resolve/v1/sub/q8-00001-of-00002.gguf"
    assert q8["model_files"] == ["/var/lib/llm-fleet/models/q8-00001-of-00002.gguf",
                                 "/var/lib/llm-fleet/models/q8-00002-of-00002.gguf"]
    assert [e["warnings"] for e in entries] == [[], [], [], []]

    # Before the download: declared figures where there is metadata, the file otherwise.
    cands = F.llm_model_candidates(entries)
    assert cands[0] == {"quant": "Q4_K_M", "catalogue_index": 0, "metadata": META, "size_bytes": 100}
    # (a file:// mirror is read in place, before it is copied; so is a pre-staged path)
    assert cands[1] == {"quant": "Q3_K_S", "catalogue_index": 1, "path": "/mnt/mirror/q3 k.gguf"}
    assert cands[2] == {"quant": "Q5_K_M", "catalogue_index": 2, "path": "/srv/staged/q5.gguf"}
    # After: only the chosen ones, with their paths.
    plans = [{"gpu_index": 0, "candidate": {"catalogue_index": 3}}, {"gpu_index": 1, "candidate": {"catalogue_index": 3}}]
    after = F.llm_model_candidates(entries, plans)
    assert [c["quant"] for c in after] == ["Q8_0"] and after[0]["path"].endswith("q8-00001-of-00002.gguf")
    files = F.llm_model_fetch_files(entries, plans)
    assert [f["url"] for f in files] == [q8["files"][0]["url"], q8["files"][1]["url"]]
    # The mirror's file, planned in place, is planned from its copy once fetched.
    mirror = F.llm_model_candidates(entries, [{"gpu_index": 0, "candidate": {"catalogue_index": 1}}])
    assert mirror == [{"quant": "Q3_K_S", "catalogue_index": 1, "path": "/var/lib/llm-fleet/models/q3 k.gguf"}]
    assert F.llm_model_fetch_files(entries, [{"gpu_index": 0, "candidate": {"catalogue_index": 1}}]) == [
        {"name": "q3 k.gguf", "sha256": SHA, "url": "file:///mnt/mirror/q3%20k.gguf"}]


def test_a_size_that_disagrees_with_the_files_is_reported():
    entries = F.llm_model_entries([{"quant": "Q4_K_M", "size_bytes": 19845402112, "metadata": META, "files": [
        {"url": "http://m/q4.gguf", "sha256": SHA, "size_bytes": 8 << 20}]}], "/m")
    assert "size_bytes is 19845402112 but its files add up to 8388608 bytes" in entries[0]["warnings"][0]


@pytest.mark.parametrize("catalogue, words", [
    ([], "llm_model_catalogue must list"),
    ([{"url": "http://m/a.gguf", "sha256": SHA}], "has no quant"),
    ([{"quant": "Q4_K_M", "sha256": SHA}], "needs exactly one source"),
    ([{"quant": "Q4_K_M", "url": "http://m/a.gguf", "path": "/a.gguf", "sha256": SHA}], "got url, path"),
    ([{"quant": "Q4_K_M", "hf_repo": "Qwen", "hf_file": "a.gguf", "sha256": SHA}], "OWNER/NAME"),
    ([{"quant": "Q4_K_M", "hf_repo": "o/r", "sha256": SHA}], "hf_repo and hf_file go together"),
    ([{"quant": "Q4_K_M", "url": "http://m/a.gguf", "sha256": "nope"}], "sha256 must be the file's sha256"),
    ([{"quant": "Q4_K_M", "url": "http://m/a.gguf", "sha256": SHA, "size_bytes": "20GB"}], "size_bytes must be"),
    ([{"quant": "Q4_K_M", "url": "s3://m/a.gguf", "sha256": SHA}], "http://, https:// or file://"),
    ([{"quant": "Q4_K_M", "url": "http://m/a.gguf", "sha256": SHA, "sha": 1}], "unknown key(s) sha"),
    ([{"quant": "Q4_K_M", "url": "http://m/a.gguf", "sha256": SHA},
      {"quant": "q4_k_m", "url": "http://m/b.gguf", "sha256": SHA}], "already llm_model_catalogue[0]"),
    ([{"quant": "Q4_K_M", "url": "http://m/a.gguf", "sha256": SHA},
      {"quant": "Q5_K_M", "url": "http://n/a.gguf", "sha256": "cd" * 32}], "another sha256"),
    ([{"quant": "Q8_0", "url": "http://m/a-00001-of-00002.gguf", "sha256": SHA}], "list every shard"),
    ([{"quant": "Q8_0", "files": [{"url": "http://m/a-00002-of-00002.gguf", "sha256": SHA},
                                  {"url": "http://m/a-00001-of-00002.gguf", "sha256": SHA}]}], "in order"),
    ([{"quant": "Q8_0", "url": "http://m/a.gguf", "sha256": SHA, "files": []}], "has files and also"),
    ([{"quant": "Q8_0", "url": "http://m/a.gguf", "sha256": SHA, "metadata": "qwen"}], "metadata must be a dict"),
    ([{"quant": "Q8_0", "path": "models/a.gguf", "sha256": SHA}], "absolute path"),
])
def test_bad_catalogues_are_named(catalogue, words):
    with pytest.raises(F.AnsibleFilterError) as err:
        F.llm_model_entries(catalogue, "/m")
    assert words in str(err.value)


def test_gpu_facts_that_change_at_runtime_are_left_out():
    gpu = {"index": 0, "name": "Tesla V100-SXM2-32GB", "uuid": "GPU-1", "memory_total_bytes": 1,
           "memory_used_bytes": 2, "memory_free_bytes": 3, "power_limit_w": 300, "cpu_affinity": [0, 1]}
    assert F.llm_model_gpus([gpu]) == [{"index": 0, "name": "Tesla V100-SXM2-32GB", "uuid": "GPU-1",
                                        "memory_total_bytes": 1, "cpu_affinity": [0, 1]}]


def test_plan_around_budgets_only_other_programs_memory():
    gpu = {"index": 0, "uuid": "GPU-1", "memory_total_bytes": 1,
           "health": {"processes": [{"pid": 1, "name": "llama-server", "used_bytes": 5 << 30},
                                    {"pid": 2, "name": "python3", "used_bytes": 3 << 30},
                                    {"pid": 3, "name": None, "used_bytes": 1 << 30}]}}
    assert F.llm_model_gpus([gpu], "plan_around")[0]["memory_foreign_bytes"] == 4 << 30
    assert "memory_foreign_bytes" not in F.llm_model_gpus([gpu], "warn")[0]
    with pytest.raises(F.AnsibleFilterError, match="use one of refuse, warn, plan_around, ignore"):
        F.llm_model_gpus([gpu], "around")


PLAN = {"gpu_index": 0, "quant": "Q4_K_M", "model_path": "/m/q4.gguf", "ctx_size": 16384, "parallel": 4,
        "reason": "Q4_K_M: the best quality that fits",
        "cache_type_k": "f16", "cache_type_v": "f16", "n_gpu_layers": 65, "flash_attn": True, "batch_size": 2048,
        "ubatch_size": 512, "decode_ceiling_tps": 45.04, "partial_offload": False,
        "candidate": {"catalogue_index": 0},
        "memory": {"weights_bytes": 18000 * MIB, "kv_bytes": 4096 * MIB, "compute_bytes": 307 * MIB,
                   "predicted_used_bytes": int(23.2 * (1 << 30)), "gpu_total_bytes": 32 << 30}}


def test_llama_fit_params_estimate_is_recorded_beside_ours():
    tool = "/opt/llm-fleet/llama.cpp/current/bin/llama-fit-params"
    argv = F.llm_model_fit_argv(PLAN, tool)
    assert argv == [tool, "-m", "/m/q4.gguf", "-c", "16384", "-ngl", "65", "-ctk", "f16", "-ctv", "f16", "-fa", "on",
                    "-b", "2048", "-ub", "512", "-fitp", "on"]
    # What common_fit_print() prints (device, model, context, compute MiB).
    out = {"rc": 0, "stdout": "CUDA0 17160 4096 307 \nHost 417 0 12 \n", "stderr": "llama_model_loader: ..."}
    est = F.llm_model_fit_estimate(out, PLAN, tool)
    assert est["status"] == "ok"
    assert est["llama_cpp"] == {"device": "CUDA0", "model_mib": 17160, "context_mib": 4096, "compute_mib": 307,
                                "total_mib": 21563}
    assert est["ours"] == {"weights_mib": 18000, "kv_mib": 4096, "compute_mib": 307, "total_mib": 22403}
    assert est["difference_mib"] == -840 and est["host_model_mib"] == 417
    assert F.llm_model_fit_estimate({"skipped": True}, PLAN, tool)["status"] == "not run"
    failed = F.llm_model_fit_estimate({"rc": 1, "stdout": "", "stderr": "x\nerror: unknown argument\n"}, PLAN, tool)
    assert failed == {"status": "failed", "rc": 1, "error": "error: unknown argument"}


def test_the_record_is_what_a_rerun_reproduces():
    entries = F.llm_model_entries([{"quant": "Q4_K_M", "url": "http://m/q4.gguf", "sha256": SHA, "metadata": META}],
                                  "/m")
    fetched = {"files": [{"path": "/m/q4.gguf", "action": "downloaded", "elapsed": 3.2, "bytes_downloaded": 5}]}
    record = F.llm_model_record([PLAN], entries, fetched, {"results": [{"skipped": True, "item": PLAN}]},
                                "/x/llama-fit-params", "Qwen2.5-32B", "/m", {"target_ctx": 16384})
    # The planner's one summary format (plan_explain.plan_summary).
    assert record["summary"] == ("GPU 0: Q4_K_M, -c 16384 -np 4 (4096 tokens/slot), f16 KV, 23.2 GiB used + 0.0 GiB "
                                 "headroom of 32.0 GiB, ceiling 45.0 tok/s")
    plan = record["plans"][0]
    assert plan["planned_from"] == "file" and plan["model_sha256"] == [SHA]
    assert plan["llama_fit_params"]["status"] == "not run"
    assert "elapsed" not in json.dumps(record) and "bytes_downloaded" not in json.dumps(record)
    rerun = F.llm_model_record([PLAN], entries, {"files": [dict(fetched["files"][0], action="present")]},
                               {"results": [{"skipped": True, "item": PLAN}]}, "/x/llama-fit-params", "Qwen2.5-32B",
                               "/m", {"target_ctx": 16384})
    assert rerun == record
    assert record["previews"] == []


def test_a_preview_model_is_recorded_and_shown_not_served():
    entries = F.llm_model_entries([{"quant": "F32", "url": "http://m/tiny.gguf", "sha256": SHA, "metadata": META}],
                                  "/m")
    served = dict(PLAN, quant="F32")
    preview = dict(PLAN, reason="Q4_K_M: the best quality ...", expected_decode_tps=28.1)
    results = [{"item": {"key": "Qwen2.5-32B", "value": {}}, "plans": [preview]}]
    record = F.llm_model_record([served], entries, {"files": []}, None, "", "tiny", "/m", {}, None, results)
    p, = record["previews"]
    assert p["name"] == "Qwen2.5-32B" and p["plans"][0]["quant"] == "Q4_K_M"
    assert p["plans"][0]["summary"].endswith("expected 28.1 tok/s (ceiling 45.0)")
    assert record["summary"].startswith("GPU 0: F32,")
    assert " | preview, not served, Qwen2.5-32B: GPU 0: Q4_K_M," in record["summary"]
    lines = F.llm_model_preview_lines(results)
    assert lines[0] == "Preview, not served: Qwen2.5-32B" and lines[2] == "    why: Q4_K_M: the best quality ..."


# --- progress while the module runs in the background ------------------------------

def test_the_progress_file_says_how_far_and_then_finished(server, payload, tmp_path):
    progress = tmp_path / "progress.json"
    (tmp_path / "models").mkdir()
    result = fetch(tmp_path / "models", [one(server, payload)], progress_file=str(progress))
    assert not result.get("failed"), result.get("msg")
    assert json.loads(progress.read_text()) == {"finished": True, "error": None}


def test_a_failed_download_finishes_its_progress_file_with_the_error(server, payload, tmp_path):
    progress = tmp_path / "progress.json"
    (tmp_path / "models").mkdir()
    entry = dict(one(server, payload), sha256="0" * 64)
    result = fetch(tmp_path / "models", [entry], progress_file=str(progress))
    assert result["failed"]
    record = json.loads(progress.read_text())
    assert record["finished"] is True and "Checksum mismatch" in record["error"]


def test_progress_is_written_at_most_every_interval(tmp_path):
    now = [100.0]
    progress = md.ProgressFile(str(tmp_path / "p.json"), interval=2.0, clock=lambda: now[0])
    progress.update("m.gguf", 1 * MIB, 10 * MIB, started=99.0, resumed_from=0)
    first = json.loads((tmp_path / "p.json").read_text())
    assert first == {"file": "m.gguf", "done_bytes": MIB, "total_bytes": 10 * MIB, "rate_bytes_per_s": MIB,
                     "eta_s": 9, "finished": False}
    now[0] = 101.0
    progress.update("m.gguf", 2 * MIB, 10 * MIB, started=99.0, resumed_from=0)
    assert json.loads((tmp_path / "p.json").read_text()) == first       # within the interval: not rewritten
    now[0] = 103.0
    progress.update("m.gguf", 8 * MIB, 10 * MIB, started=99.0, resumed_from=4 * MIB)
    assert json.loads((tmp_path / "p.json").read_text())["rate_bytes_per_s"] == MIB   # resumed bytes not counted
    assert [p.name for p in tmp_path.iterdir()] == ["p.json"]            # no temporary file left


def test_the_role_prints_one_line_of_progress():
    spec = importlib.util.spec_from_file_location("llm_model_filters",
                                                  ROOT / "roles/llm_model/filter_plugins/llm_model.py")
    filters = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(filters)
    line = filters.llm_model_progress_line(json.dumps({
        "file": "gemma-Q4_K_M.gguf", "done_bytes": 4 << 30, "total_bytes": 16 << 30,
        "rate_bytes_per_s": 85 << 20, "eta_s": 145, "finished": False}))
    assert line == "gemma-Q4_K_M.gguf: 4.0 GiB of 16.0 GiB (25%), 85.0 MiB/s, about 2 min 25 s left"
    assert "no download under way" in filters.llm_model_progress_line("")
    assert "no download under way" in filters.llm_model_progress_line("{trunc")
    assert filters.llm_model_progress_line(json.dumps({"file": "a.gguf", "done_bytes": 10, "total_bytes": None,
                                                       "rate_bytes_per_s": 0, "eta_s": None})) == "a.gguf: 10 B, 0 B/s"


def test_bit_rot_the_cache_cannot_see_is_found_by_a_full_check(server, payload, tmp_path):
    """A flipped byte keeps size, mtime and inode: the cache trusts it; checksum_cache=false
    (llm_model_verify_checksums) rehashes, finds it and fetches the file again."""
    spec = one(server, payload)
    assert not fetch(tmp_path, [spec]).get("failed")
    target = tmp_path / "model-Q4_K_M.gguf"
    before = target.stat()
    with open(target, "r+b") as handle:
        handle.seek(1000)
        handle.write(bytes([payload[1000] ^ 0x01]))
    os.utime(target, ns=(before.st_atime_ns, before.st_mtime_ns))
    assert fetch(tmp_path, [spec])["files"][0]["checksum_source"] == "cache"   # what bit rot looks like
    checked = fetch(tmp_path, [spec], checksum_cache=False)
    assert checked["changed"] is True and checked["files"][0]["action"] == "downloaded"
    assert target.read_bytes() == payload


# --- several models (llm_model_models, issue 35) ------------------------------------

def _catalogue(name):
    return [{"quant": "Q4_K_M", "url": "http://m/%s.gguf" % name, "sha256": SHA, "metadata": META}]


def test_one_model_form_is_the_only_entry_when_no_models_are_named():
    served = F.llm_model_served([], _catalogue("q4"), "Qwen", {"target_ctx": 8192}, "/m")
    assert [(m["name"], m["rank"], m["gpus"], m["policy"]) for m in served] == [
        ("Qwen", 0, "every", {"target_ctx": 8192})]


@pytest.mark.parametrize("models,catalogue,words", [
    ([{"name": "chat", "catalogue": _catalogue("a")}], _catalogue("b"), "both set"),
    ([{"name": "chat/1", "catalogue": _catalogue("a")}], [], "names its instances"),
    ([{"name": "chat", "catalogue": _catalogue("a")}, {"name": "Chat", "catalogue": _catalogue("b")}], [],
     "used twice"),
    ([{"name": "chat", "catalogue": _catalogue("a"), "load": "lazy"}], [], "load is 'lazy'; use resident"),
    ([{"name": "chat", "catalogue": _catalogue("a")}, {"name": "Router", "catalogue": _catalogue("b")}], [],
     "may not be named Router"),
    ([{"name": "chat", "catalogue": _catalogue("a"), "gpus": 0}], [], "whole number >= 1"),
    ([{"name": "chat", "catalogue": _catalogue("a"), "policy": []}], [], "policy must be a dict"),
    ([{"name": "chat", "catalogue": _catalogue("a"), "ram": 1}], [], "unknown key(s) ram"),
    ([{"name": "chat", "catalogue": []}], [], "llm_model_models[0].catalogue must list"),
    ([{"name": "chat", "catalogue": _catalogue("a")},
      {"name": "code", "catalogue": [dict(_catalogue("a")[0], sha256="cd" * 32)]}], [], "another sha256"),
])
def test_several_models_are_refused_by_name(models, catalogue, words):
    with pytest.raises(F.AnsibleFilterError) as err:
        F.llm_model_served(models, catalogue, "", {}, "/m")
    assert words in str(err.value)
    assert "llm_model_" in str(err.value)


def test_several_models_are_planned_fetched_and_recorded_per_model():
    served = F.llm_model_served([{"name": "chat", "catalogue": _catalogue("chat"), "policy": {"target_ctx": 8192}},
                                 {"name": "code", "catalogue": _catalogue("code"), "gpus": 1}], [], "", {}, "/m")
    assert [(m["name"], m["rank"], m["gpus"]) for m in served] == [("chat", 0, "every"), ("code", 1, 1)]
    asked = F.llm_model_plan_models(served)
    assert [(m["name"], m["gpus"], m["policy"]) for m in asked] == [("chat", "every", {"target_ctx": 8192}),
                                                                    ("code", 1, {})]
    assert asked[1]["candidates"][0]["quant"] == "Q4_K_M" and "path" not in asked[1]["candidates"][0]
    plans = [dict(PLAN, model_name="chat", model_path="/m/chat.gguf"),
             dict(PLAN, model_name="code", model_path="/m/code.gguf",
                  memory=dict(PLAN["memory"], other_models_bytes=5 << 30))]
    # after the download: each model's chosen file, by path
    assert [m["candidates"][0]["path"] for m in F.llm_model_plan_models(served, plans)] == ["/m/chat.gguf",
                                                                                          "/m/code.gguf"]
    assert [f["name"] for f in F.llm_model_fetch_all(served, plans)] == ["chat.gguf", "code.gguf"]
    fetched = {"files": [{"path": "/m/chat.gguf", "action": "present"}, {"path": "/m/code.gguf", "action": "present"}]}
    fit = {"results": [{"item": plans[0], "rc": 0, "stdout": "CUDA0 100 200 300\nHost 5 0 0\n"},
                       {"item": plans[1], "rc": 0, "stdout": "CUDA0 50 20 30\nHost 5 0 0\n"}]}
    record = F.llm_model_records(plans, served, fetched, fit, "/x/llama-fit-params", "/m",
                                 {"plans": plans, "placement": {0: ["chat", "code"]}}, [])
    assert [(p["model_name"], p["model_rank"], p["instance"]) for p in record["plans"]] == [
        ("chat", 0, "0"), ("code", 1, "0-code")]
    # each plan's own llama-fit-params figure, not the other model's on the same GPU
    assert [p["llama_fit_params"]["llama_cpp"]["model_mib"] for p in record["plans"]] == [100, 50]
    assert [m["name"] for m in record["models"]] == ["chat", "code"]
    assert record["summary"].startswith("chat: GPU 0: Q4_K_M") and " || code: GPU 0: Q4_K_M" in record["summary"]
    assert record["model"] == "chat" and record["placement"] == {0: ["chat", "code"]}


def test_models_loaded_on_demand_are_planned_and_recorded_with_their_router():
    """load: on_demand reaches the planner; the record keeps each card's router (its
    instance and the rank whose port it takes) and says so in the summary."""
    served = F.llm_model_served([{"name": "chat", "catalogue": _catalogue("chat")},
                                 {"name": "code", "catalogue": _catalogue("code"), "load": "on_demand"},
                                 {"name": "embed", "catalogue": _catalogue("embed"), "load": "on_demand"}],
                                [], "", {}, "/m")
    assert [m["load"] for m in served] == ["resident", "on_demand", "on_demand"]
    assert [m["load"] for m in F.llm_model_plan_models(served)] == ["resident", "on_demand", "on_demand"]
    plans = [dict(PLAN, model_name="chat", model_path="/m/chat.gguf"),
             dict(PLAN, model_name="code", model_path="/m/code.gguf", load="on_demand"),
             dict(PLAN, model_name="embed", model_path="/m/embed.gguf", load="on_demand")]
    fetched = {"files": [{"path": "/m/%s.gguf" % n, "action": "present"} for n in ("chat", "code", "embed")]}
    routers = [{"gpu_index": 0, "models": ["code", "embed"], "models_max": 1, "room_bytes": 1 << 30, "reason": "r"}]
    record = F.llm_model_records(plans, served, fetched, None, "/x", "/m",
                                 {"plans": plans, "placement": {0: ["chat"]}, "routers": routers}, [])
    assert [(r["instance"], r["model_rank"], r["models_max"]) for r in record["routers"]] == [("0-router", 1, 1)]
    assert [p.get("load") for p in record["plans"]] == [None, "on_demand", "on_demand"]
    assert [m.get("load") for m in record["models"]] == [None, "on_demand", "on_demand"]
    assert record["summary"].endswith(" || GPU 0 router: code, embed on demand, --models-max 1")
    # without models loaded on demand the record has no routers key (a fact unchanged on upgrade)
    two = F.llm_model_records(plans[:1], served[:1], fetched, None, "/x", "/m", {"plans": plans[:1]}, [])
    assert "routers" not in two


def test_one_model_record_is_unchanged_but_names_its_instance():
    served = F.llm_model_served([], _catalogue("q4"), "Qwen2.5-32B", {"target_ctx": 16384}, "/m")
    fetched = {"files": [{"path": "/m/q4.gguf", "action": "present"}]}
    one = F.llm_model_record([PLAN], served[0]["entries"], fetched, None, "/x", "Qwen2.5-32B", "/m",
                             {"target_ctx": 16384}, {"plans": [PLAN]})
    record = F.llm_model_records([PLAN], served, fetched, None, "/x", "/m",
                                 {"plans": [PLAN], "policy": {"target_ctx": 16384}}, [])
    assert [(p["model_name"], p["model_rank"], p["instance"]) for p in record["plans"]] == [("Qwen2.5-32B", 0, "0")]
    for plan in record["plans"]:
        for key in ("model_name", "model_rank", "instance"):
            plan.pop(key)
    assert dict(record, models=None) == dict(one, models=None)
    assert "placement" not in record


def test_a_draft_model_is_checked_handed_to_the_planner_and_fetched():
    draft = _catalogue("draft")[0]
    served = F.llm_model_served([], _catalogue("q4"), "Qwen", {"speculative": "draft-simple"}, "/m", draft)
    entry = served[0]["draft"]
    assert entry["model_path"] == "/m/draft.gguf"
    cand = F.llm_model_draft_candidate(entry)
    assert cand["quant"] == draft["quant"] and cand["path"] == "/m/draft.gguf"
    assert F.llm_model_draft_candidate(None) is None
    # a draft on a file:// mirror is read there before the download, and served from the model directory
    mirrored = {"quant": "F32", "url": "file:///srv/models/draft.gguf", "sha256": SHA}
    entry = F.llm_model_served([], _catalogue("q4"), "Qwen", {}, "/m", mirrored)[0]["draft"]
    assert F.llm_model_draft_candidate(entry)["path"] == "/srv/models/draft.gguf"
    assert F.llm_model_draft_candidate(entry, True)["path"] == "/m/draft.gguf"
    several = F.llm_model_served([{"name": "chat", "catalogue": _catalogue("chat"), "draft": mirrored}], [], "", {}, "/m")
    assert F.llm_model_plan_models(several)[0]["draft"]["path"] == "/srv/models/draft.gguf"
    assert F.llm_model_plan_models(several, [dict(PLAN, model_name="chat")])[0]["draft"]["path"] == "/m/draft.gguf"
    # fetched with the chosen file, whether or not it serves yet
    plans = [dict(PLAN, model_path="/m/q4.gguf")]
    assert [f["name"] for f in F.llm_model_fetch_all(served, plans)] == ["q4.gguf", "draft.gguf"]
    # several models: each its own draft
    several = F.llm_model_served([{"name": "chat", "catalogue": _catalogue("chat"), "draft": draft}], [], "", {}, "/m")
    assert F.llm_model_plan_models(several)[0]["draft"]["path"] == "/m/draft.gguf"
    assert "draft" not in F.llm_model_plan_models(F.llm_model_served([], _catalogue("q4"), "", {}, "/m"))[0]


@pytest.mark.parametrize("models,draft,words", [
    ([], ["not", "a", "dict"], "llm_model_draft must be one catalogue entry"),
    ([], {"quant": "Q8_0"}, "llm_model_draft[0] (Q8_0)"),
    ([{"name": "chat", "catalogue": _catalogue("a")}], {"quant": "Q8_0"}, "give each model its own draft"),
])
def test_a_bad_draft_is_refused_by_name(models, draft, words):
    with pytest.raises(F.AnsibleFilterError) as err:
        F.llm_model_served(models, [] if models else _catalogue("q4"), "", {}, "/m", draft)
    assert words in str(err.value)
