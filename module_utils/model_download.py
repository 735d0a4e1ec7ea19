# -*- coding: utf-8 -*-
# Put model files on a host: download them over HTTP(S) (resumable), copy them
# from a file:// mirror, or verify a pre-staged file in place. Every file is
# checked against its sha256 before it is used; a download goes to a temporary
# name in the destination directory and is renamed into place only once verified,
# so a failed or wrong download never replaces a good file.
#
# The logic of the model_fetch module, kept free of Ansible so the unit tests call
# it directly. Standard library only (urllib), Python 3.8-compatible: Ubuntu 20.04
# hosts run it with their system Python.
from __future__ import absolute_import, division, print_function

__metaclass__ = type

import errno
import fcntl
import glob
import hashlib
import json
import os
import re
import socket
import stat
import time

try:  # Python 3
    import http.client as http_client
    from urllib import error as urllib_error
    from urllib import parse as urllib_parse
    from urllib import request as urllib_request
except ImportError:  # pragma: no cover - Python 2 is not supported, but keep imports safe for sanity tests
    http_client = urllib_error = urllib_parse = urllib_request = None

from ansible.module_utils.fleet_errors import header_secrets, scrub

CHUNK_BYTES = 1 << 20
GIB = 1 << 30
DEFAULT_TIMEOUT = 60
DEFAULT_MIN_FREE_BYTES = GIB
USER_AGENT = "llm-fleet-model-fetch/1"
# The Hugging Face token is sent to these hosts only (and their subdomains).
HF_HOSTS = ("huggingface.co", "hf.co")
# Longest pause between two attempts of one download.
MAX_RETRY_DELAY = 60.0
# Bounds of the module's numbers: a stall of more than a day is a hung server, not
# a slow one (and a socket's timeout overflows past about 9*10^9 s); more attempts than this
# only hide a broken URL.
MAX_TIMEOUT = 86400
MAX_RETRIES = 100
DEFAULT_LOCK_TIMEOUT = 600
MAX_LOCK_TIMEOUT = 86400
# Who holds the download directory's lock (pid, host, since), next to the files.
LOCK_RECORD = ".model_fetch.lock"
# RFC 7230 token: what an HTTP header's name may hold.
_HEADER_NAME = re.compile(r"^[!#$%&'*+.^_`|~0-9A-Za-z-]+$")
# A header value or token may not hold control characters (tab aside in a header).
_HEADER_VALUE_BAD = re.compile(r"[\x00-\x08\x0a-\x1f\x7f]")
_LINE_BREAK = re.compile(r"[\r\n]")
_URL_BAD = re.compile(r"[\x00-\x20\x7f]")
_SHA256 = re.compile(r"^[0-9a-f]{64}$")
_CONTENT_RANGE = re.compile(r"^\s*bytes\s+(\d+)-(\d+)/(\d+|\*)\s*$", re.I)
_UNSATISFIED_RANGE = re.compile(r"^\s*bytes\s+\*/(\d+)\s*$", re.I)


class FetchError(Exception):
    """A download or check that failed for good; the message says what to do."""


class TransientError(Exception):
    """A failure worth another attempt (connection cut, timeout, 5xx, 429)."""


# --- small helpers -------------------------------------------------------------

def human_bytes(n):
    if n is None:
        return "an unknown size"
    if n >= GIB:
        return "%.2f GiB" % (n / GIB)
    if n >= 1 << 20:
        return "%.1f MiB" % (n / (1 << 20))
    return "%d bytes" % n


def normalize_sha256(value, what="sha256"):
    """A sha256 as 64 lowercase hex digits (a leading 'sha256:' is accepted)."""
    text = str(value or "").strip().lower()
    if text.startswith("sha256:"):
        text = text[len("sha256:"):]
    if not _SHA256.match(text):
        raise FetchError("%s must be 64 hexadecimal digits (the file's sha256), got %r" % (what, value))
    return text


def partial_path(directory, name, sha256):
    """The temporary file a download of `name` grows in. It carries the expected
    checksum, so a partial file of another version is never resumed."""
    return os.path.join(directory, ".%s.%s.part" % (name, sha256[:16]))


def sidecar_path(directory, name):
    """Where the verified checksum of `name` is cached."""
    return os.path.join(directory, ".%s.sha256" % name)


def sha256_of(path, hasher=None, limit=None):
    """Hash a file (or its first `limit` bytes) into `hasher` (new if None)."""
    hasher = hasher or hashlib.sha256()
    remaining = limit
    with open_regular(path, "the file") as handle:
        while remaining is None or remaining > 0:
            block = handle.read(CHUNK_BYTES if remaining is None else min(CHUNK_BYTES, remaining))
            if not block:
                break
            hasher.update(block)
            if remaining is not None:
                remaining -= len(block)
    return hasher


def _stat_key(st):
    return {"size": st.st_size, "mtime_ns": st.st_mtime_ns, "inode": st.st_ino}


def read_sidecar(sidecar, path, st):
    """The cached sha256 of `path` if the sidecar was written for this very file
    (same path, size, modification time and inode), else None."""
    try:
        with open(sidecar) as handle:
            data = json.load(handle)
    except (OSError, IOError, ValueError):
        return None
    if not isinstance(data, dict) or data.get("path") != path:
        return None
    for key, value in _stat_key(st).items():
        if data.get(key) != value:
            return None
    digest = str(data.get("sha256") or "")
    return digest if _SHA256.match(digest) else None


def write_sidecar(sidecar, path, st, digest):
    """Cache a verified sha256 (best effort: a read-only mirror just rehashes)."""
    record = dict(_stat_key(st), path=path, sha256=digest)
    tmp = sidecar + ".tmp"
    try:
        with open(tmp, "w") as handle:
            json.dump(record, handle, sort_keys=True)
            handle.write("\n")
        os.chmod(tmp, 0o644)
        os.rename(tmp, sidecar)
        return True
    except (OSError, IOError):
        try:
            os.unlink(tmp)
        except OSError:
            pass
        return False


def file_sha256(path, sidecar, use_cache=True, write_cache=True):
    """(sha256, 'cache' | 'computed') of an existing file. The cache avoids
    rehashing a 20 GB file at every run: it is trusted while the file's size,
    modification time and inode are those recorded with it."""
    st = os.stat(path)
    if use_cache:
        cached = read_sidecar(sidecar, path, st)
        if cached:
            return cached, "cache"
    digest = sha256_of(path).hexdigest()
    if write_cache:
        after = os.stat(path)
        if _stat_key(after) == _stat_key(st):
            write_sidecar(sidecar, path, st, digest)
    return digest, "computed"


def existing_dir(path):
    """`path` or its nearest existing parent (for statvfs before the directory exists)."""
    path = os.path.abspath(path)
    while not os.path.isdir(path):
        parent = os.path.dirname(path)
        if parent == path:
            break
        path = parent
    return path


def free_bytes(directory):
    """Bytes an unprivileged process may still write on `directory`'s filesystem."""
    st = os.statvfs(existing_dir(directory))
    return st.f_bavail * st.f_frsize


def check_space(directory, needed, min_free_bytes, what, free=None):
    """Refuse before writing when the download would leave less than
    min_free_bytes free."""
    free = free_bytes(directory) if free is None else free
    if needed + min_free_bytes > free:
        raise FetchError(
            "Not enough free space in %s for %s: need %s (%d bytes to download + %s to keep free), "
            "only %s (%d bytes) free. Free space there, or put the models on a larger filesystem "
            "(llm_model_dir)." % (directory, what, human_bytes(needed + min_free_bytes), needed,
                                  human_bytes(min_free_bytes), human_bytes(free), free))
    return free


def _remove(path):
    try:
        os.unlink(path)
        return True
    except OSError:
        return False


def _fsync_dir(directory):
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def redact_url(url):
    """The URL without user:password and without its query string (signed URLs);
    one that cannot be parsed is cut at its query and scrubbed as text."""
    try:
        parts = urllib_parse.urlsplit(str(url))
        netloc = parts.netloc.rsplit("@", 1)[-1]
        return urllib_parse.urlunsplit((parts.scheme, netloc, parts.path, "", ""))
    except ValueError:
        return scrub(re.split(r"[?#]", str(url), 1)[0])


def check_url(url, what):
    """Refuse a URL that cannot be fetched, naming `what` (e.g. files[0].url) and
    what to fix; returns its urlsplit() parts."""
    if not isinstance(url, str) or not url:
        raise FetchError("%s must be a URL (http://, https:// or file://), got %s" % (what, type(url).__name__))
    if _URL_BAD.search(url):
        raise FetchError("%s %r holds a space or a control character: percent-encode it (%%20, ...)."
                         % (what, redact_url(url)))
    try:
        parts = urllib_parse.urlsplit(url)
        port = parts.port
    except ValueError as err:
        raise FetchError("%s %r is not a valid URL (%s): check the brackets of an IPv6 address "
                         "(http://[::1]:8000/x) and that the port is a number from 1 to 65535."
                         % (what, redact_url(url), err))
    scheme = parts.scheme.lower()
    if scheme not in ("http", "https", "file"):
        raise FetchError("%s %s: only http://, https:// and file:// are supported" % (what, redact_url(url)))
    if scheme == "file":
        if parts.netloc not in ("", "localhost"):
            raise FetchError("%s %r names a host (%s): a file:// URL is a path on this host, file:///path/to/model.gguf."
                             % (what, redact_url(url), parts.netloc.rsplit("@", 1)[-1]))
        if not parts.path.startswith("/"):
            raise FetchError("%s %r: a file:// URL needs an absolute path, file:///path/to/model.gguf."
                             % (what, redact_url(url)))
    else:
        if not parts.hostname:
            raise FetchError("%s %r has no host: write it as %s://host[:port]/path." % (what, redact_url(url), scheme))
        if port == 0:
            raise FetchError("%s %r: port 0 is not a port; give one from 1 to 65535." % (what, redact_url(url)))
    return parts


def _refuse_line_break(value, what):
    """A header value or token holding CR or LF would end the header and start
    another one: refused, naming `what` and never the value."""
    if _HEADER_VALUE_BAD.search(value):
        kind = "a line break (CR or LF)" if _LINE_BREAK.search(value) else "a control character"
        raise FetchError("%s holds %s; it would end the HTTP header and start another. The value is not shown: "
                         "remove the character (a copied token often ends in a newline: strip it)." % (what, kind))


def check_headers(headers, hf_token=None):
    """The request headers and the Hugging Face token, checked: a dict of str to str;
    raises FetchError naming the header (never its value)."""
    if headers is None:
        headers = {}
    if not isinstance(headers, dict):
        raise FetchError("headers must be a mapping of header name to value, got %s" % type(headers).__name__)
    checked = {}
    for key, value in headers.items():
        name = str(key)
        if not _HEADER_NAME.match(name):
            raise FetchError("headers has the name %r: a header name is letters, digits and !#$%%&'*+-.^_`|~, without "
                             "spaces, colons or control characters." % scrub(name))
        if isinstance(value, bool) or not isinstance(value, (str, int, float)):
            raise FetchError("headers[%s] must be a string, got %s (the value is not shown)"
                             % (name, "a boolean" if isinstance(value, bool) else type(value).__name__))
        value = str(value)
        _refuse_line_break(value, "headers[%s]" % name)
        checked[name] = value
    if hf_token is not None:
        if not isinstance(hf_token, str):
            raise FetchError("hf_token must be a string, got %s (the value is not shown)" % type(hf_token).__name__)
        _refuse_line_break(hf_token, "hf_token")
        if re.search(r"\s", hf_token.strip()) or hf_token != hf_token.strip():
            raise FetchError("hf_token holds spaces; a Hugging Face token is one word (hf_...). The value is not "
                             "shown: copy the token again.")
    return checked


def _number(value, what, low, high, fix, integer=True):
    """`value` as an int (or float) in [low, high], else FetchError naming `what`."""
    try:
        if isinstance(value, bool):
            raise TypeError
        number = int(value) if integer else float(value)
        if integer and float(value) != number:
            raise ValueError
    except (TypeError, ValueError, OverflowError):
        number = None
    if number is None or number != number or not low <= number <= high:
        raise FetchError("%s is %r: give %s from %s to %s (%s)." % (what, value, "a whole number" if integer
                                                                    else "a number", low, high, fix))
    return number


def check_options(timeout=DEFAULT_TIMEOUT, retries=3, retry_delay=2.0, min_free_bytes=DEFAULT_MIN_FREE_BYTES,
                  lock_timeout=DEFAULT_LOCK_TIMEOUT):
    """The module's numbers, checked against their bounds: a dict of the values;
    raises FetchError naming the option, its value and the range."""
    return {
        "timeout": _number(timeout, "timeout", 1, MAX_TIMEOUT,
                           "seconds a connection or read may stall; llm_model_download_timeout"),
        "retries": _number(retries, "retries", 0, MAX_RETRIES, "further attempts; llm_model_download_retries"),
        "retry_delay": _number(retry_delay, "retry_delay", 0, MAX_RETRY_DELAY,
                               "seconds before the first retry, doubled at each one up to %d" % MAX_RETRY_DELAY,
                               integer=False),
        "min_free_bytes": _number(min_free_bytes, "min_free_bytes", 0, 1 << 60,
                                  "bytes to keep free; llm_model_min_free_bytes"),
        "lock_timeout": _number(lock_timeout, "lock_timeout", 0, MAX_LOCK_TIMEOUT,
                                "seconds to wait for another run's download into the same directory"),
    }


def check_progress_path(path):
    """A progress file must be a file in an existing directory (it is replaced
    atomically: a temporary file beside it, then a rename)."""
    if path is None:
        return None
    path = str(path)
    if os.path.isdir(path):
        raise FetchError("progress_file %s is a directory: give the path of a file in it, e.g. %s "
                         "(llm_model_progress_file)." % (path, os.path.join(path, "model-fetch-progress.json")))
    if os.path.lexists(path) and not os.path.isfile(path):
        raise FetchError("progress_file %s exists and is not a regular file: give another path "
                         "(llm_model_progress_file)." % path)
    parent = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(parent):
        raise FetchError("progress_file %s: the directory %s does not exist; create it or give another path "
                         "(llm_model_progress_file)." % (path, parent))
    return path


def is_hf_host(url):
    host = (urllib_parse.urlsplit(url).hostname or "").lower()
    return any(host == h or host.endswith("." + h) for h in HF_HOSTS)


# --- sources: HTTP(S) and file:// -----------------------------------------------

def _kind(mode):
    for test, name in ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO (named pipe)"),
                       (stat.S_ISSOCK, "a socket"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device")):
        if test(mode):
            return name
    return "not a regular file"


def open_regular(path, what):
    """`path` opened for reading, only if it is a regular file: a FIFO would block
    open() (and a read) until someone writes to it, a device never ends. Opened
    with O_NONBLOCK (which does nothing to a regular file) and checked again with
    fstat, so a file swapped for a FIFO between the two checks is refused too."""
    try:
        st = os.stat(path)
        if not stat.S_ISREG(st.st_mode):
            raise FetchError("%s %s is %s, not a regular file: point the url at the model file itself."
                             % (what, path, _kind(st.st_mode)))
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOCTTY", 0))
    except (OSError, IOError) as err:
        raise FetchError("Cannot read %s %s: %s. Check the path, or that the mirror is mounted."
                         % (what, path, err.strerror or err))
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise FetchError("%s %s is %s, not a regular file: point the url at the model file itself."
                             % (what, path, _kind(st.st_mode)))
        if hasattr(os, "O_NONBLOCK") and hasattr(fcntl, "F_GETFL"):
            fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) & ~os.O_NONBLOCK)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


class Source(object):
    """One response: `status` 200 (whole file), 206 (from `start`) or 416 (the
    requested offset is at or past the end); `total` the whole file's size when
    known; read(n) returns the next bytes."""

    def __init__(self, stream, status, start, total, validator=None):
        self.stream = stream
        self.status = status
        self.start = start
        self.total = total
        self.validator = validator

    def read(self, n):
        return self.stream.read(n)

    def close(self):
        if self.stream is not None:
            try:
                self.stream.close()
            except (OSError, IOError, http_client.HTTPException):
                pass


class _SecretHeaderRedirects(urllib_request.HTTPRedirectHandler):
    """Follow redirects (Hugging Face sends downloads to its CDN), but send the
    secret headers (a token) only to the host they were meant for."""

    def redirect_request(self, req, fp, code, msg, headers, newurl):
        new = urllib_request.HTTPRedirectHandler.redirect_request(self, req, fp, code, msg, headers, newurl)
        secrets = getattr(req, "llm_fleet_secret_headers", {})
        if new is not None and secrets:
            if urllib_parse.urlsplit(newurl).netloc.lower() == urllib_parse.urlsplit(req.full_url).netloc.lower():
                for key, value in secrets.items():
                    new.add_unredirected_header(key, value)
                new.llm_fleet_secret_headers = secrets
        return new


def _http_error_message(code, url, reason):
    shown = redact_url(url)
    if code in (401, 403):
        hint = ("the file needs credentials: for a gated or private Hugging Face repository set llm_model_hf_token "
                "(and accept the model's licence on its page); for a mirror, llm_model_download_headers")
    elif code == 404:
        hint = "no such file: check the catalogue's url (or hf_repo, hf_file and hf_revision)"
    else:
        hint = "the server refused the download"
    return "HTTP %d (%s) from %s: %s." % (code, reason, shown, hint)


def open_source(url, offset=0, headers=None, hf_token=None, timeout=DEFAULT_TIMEOUT, validator=None):
    """Open `url` from byte `offset`: a Source, or raises FetchError /
    TransientError."""
    parts = check_url(url, "the url")
    if parts.scheme.lower() == "file":
        handle = open_regular(urllib_request.url2pathname(parts.path), "the mirror's file")
        total = os.fstat(handle.fileno()).st_size
        if offset >= total:
            handle.close()
            return Source(None, 416, offset, total)
        handle.seek(offset)
        return Source(handle, 206 if offset else 200, offset, total)
    if parts.scheme not in ("http", "https"):
        raise FetchError("Cannot download %s: only http://, https:// and file:// URLs are supported." % redact_url(url))

    request = urllib_request.Request(url)
    request.add_header("User-Agent", USER_AGENT)
    # No transparent compression: byte offsets must be those of the file.
    request.add_header("Accept-Encoding", "identity")
    if offset:
        request.add_header("Range", "bytes=%d-" % offset)
        if validator:
            request.add_header("If-Range", validator)
    secrets = check_headers(headers, hf_token)
    if hf_token and is_hf_host(url):
        secrets["Authorization"] = "Bearer %s" % hf_token
    for key, value in secrets.items():
        request.add_unredirected_header(key, value)
    request.llm_fleet_secret_headers = secrets
    opener = urllib_request.build_opener(_SecretHeaderRedirects())
    try:
        response = opener.open(request, timeout=timeout)
    except urllib_error.HTTPError as err:
        try:
            if err.code == 416:
                match = _UNSATISFIED_RANGE.match(err.headers.get("Content-Range", "") or "")
                return Source(None, 416, offset, int(match.group(1)) if match else None)
            if err.code in (408, 429) or 500 <= err.code < 600:
                raise TransientError("HTTP %d (%s) from %s" % (err.code, err.reason, redact_url(url)))
            raise FetchError(_http_error_message(err.code, url, err.reason))
        finally:
            err.close()
    except urllib_error.URLError as err:
        raise TransientError("cannot reach %s: %s" % (redact_url(url), err.reason))
    except (OSError, http_client.HTTPException) as err:
        raise TransientError("cannot reach %s: %s" % (redact_url(url), err))

    status = response.getcode()
    validator = response.headers.get("ETag") or response.headers.get("Last-Modified")
    length = response.headers.get("Content-Length")
    length = int(length) if length and length.isdigit() else None
    if status == 206:
        match = _CONTENT_RANGE.match(response.headers.get("Content-Range", "") or "")
        if not match:
            response.close()
            raise FetchError("%s answered a range request with a Content-Range header that cannot be read (%r)."
                             % (redact_url(url), response.headers.get("Content-Range")))
        total = None if match.group(3) == "*" else int(match.group(3))
        return Source(response, 206, int(match.group(1)), total, validator)
    if status == 200:
        return Source(response, 200, 0, length, validator)
    response.close()
    raise FetchError("%s answered HTTP %s to a download request." % (redact_url(url), status))


# --- one file -----------------------------------------------------------------

def describe(spec, directory, use_cache=True, write_cache=True):
    """What needs doing for one file, reading only: a dict with `action`
    (present or download) and what was found on disk; a pre-staged file that is
    missing or wrong raises FetchError.

    spec: {name, url | path, sha256, size_bytes (optional)}. A `path` is a file
    that is only verified in place (a pre-staged copy); a `url` is fetched into
    `directory`/name."""
    sha = spec["sha256"]
    size = spec.get("size_bytes")
    state = {"name": spec["name"], "url": redact_url(spec["url"]) if spec.get("url") else None,
             "sha256": sha, "size_bytes": size, "bytes_downloaded": 0, "resumed_from": 0, "elapsed": 0.0,
             "checksum_source": None, "partial_bytes": 0}
    if spec.get("path"):
        path = spec["path"]
        state.update(path=path, source="path")
        if os.path.exists(path) and not os.path.isfile(path):
            raise FetchError("The pre-staged file %s is %s, not a regular file: give the path of the model file "
                             "itself." % (path, _kind(os.stat(path).st_mode)))
        if not os.path.isfile(path):
            raise FetchError("The pre-staged file %s does not exist: copy it there, or give the catalogue entry a url "
                             "to download it from." % path)
        actual_size = os.path.getsize(path)
        if size is not None and actual_size != size:
            raise FetchError("The pre-staged file %s has %d bytes, the catalogue says %d: replace the file, or fix "
                             "size_bytes in the catalogue." % (path, actual_size, size))
        digest, how = file_sha256(path, sidecar_path(directory, spec["name"]), use_cache, write_cache)
        if digest != sha:
            raise FetchError("The pre-staged file %s has sha256 %s, the catalogue says %s: replace the file with the "
                             "right one, or fix the catalogue's sha256." % (path, digest, sha))
        state.update(action="present", checksum_source=how, size_bytes=actual_size)
        return state

    path = os.path.join(directory, spec["name"])
    state.update(path=path, source="url")
    if os.path.lexists(path) and not os.path.isfile(path):
        raise FetchError("%s is in the way of the download: it is %s, not a regular file. Move it away, or give the "
                         "file another name." % (path, _kind(os.lstat(path).st_mode) if not os.path.exists(path)
                                                 else _kind(os.stat(path).st_mode)))
    if os.path.isfile(path):
        actual_size = os.path.getsize(path)
        if size is None or actual_size == size:
            digest, how = file_sha256(path, sidecar_path(directory, spec["name"]), use_cache, write_cache)
            state["checksum_source"] = how
            if digest == sha:
                state.update(action="present", size_bytes=actual_size)
                return state
            state["replaces_sha256"] = digest
        else:
            state["replaces_size_bytes"] = actual_size
        state["replaces"] = True
    part = partial_path(directory, spec["name"], sha)
    if os.path.isfile(part):
        state["partial_bytes"] = os.path.getsize(part)
        if size is not None and state["partial_bytes"] > size:
            state["partial_bytes"] = 0
    state["action"] = "download"
    return state


def _prefix_hasher(part, offset):
    return sha256_of(part, limit=offset) if offset else hashlib.sha256()


def download(spec, directory, headers=None, hf_token=None, timeout=DEFAULT_TIMEOUT, retries=3, retry_delay=2.0,
             min_free_bytes=DEFAULT_MIN_FREE_BYTES, sleep=time.sleep, progress=None):
    """Fetch one file into `directory`/name: resume a partial download of the same
    version, verify the sha256, rename into place. Returns the file's record."""
    name, sha, size = spec["name"], spec["sha256"], spec.get("size_bytes")
    url = spec["url"]
    shown = redact_url(url)
    final = os.path.join(directory, name)
    part = partial_path(directory, name, sha)
    # Partial files of other versions of this file can never be resumed.
    for stale in glob.glob(os.path.join(glob.escape(directory), ".%s.*.part" % glob.escape(name))):
        if stale != part:
            _remove(stale)

    offset = os.path.getsize(part) if os.path.isfile(part) else 0
    if size is not None and offset > size:
        offset = 0
        open(part, "wb").close()
    hasher = _prefix_hasher(part, offset)
    resumed_from = offset
    started = time.time()
    downloaded = 0
    attempts = []
    validator = None
    attempt = 0
    while True:
        attempt += 1
        attempt_start = offset
        try:
            if size is not None and offset == size:
                break  # the partial file already holds every byte
            source = open_source(url, offset, headers, hf_token, timeout, validator)
            try:
                if source.status == 416:
                    if source.total is not None and offset == source.total:
                        break
                    # The partial file is longer than the file: start again.
                    offset = resumed_from = 0
                    open(part, "wb").close()
                    hasher = hashlib.sha256()
                    raise TransientError("the server has %s, less than the %d bytes already downloaded"
                                         % (human_bytes(source.total), attempt_start))
                if source.start != offset:
                    if source.start != 0:
                        raise FetchError("%s sent bytes from %d when asked for bytes from %d." % (shown, source.start, offset))
                    # The server ignored the range (or the file changed): from the start.
                    offset = resumed_from = 0
                    open(part, "wb").close()
                    hasher = hashlib.sha256()
                validator = source.validator or validator
                total = source.total
                if size is not None and total is not None and total != size:
                    raise FetchError("%s has %d bytes, the catalogue says %d: fix size_bytes (and sha256) in the "
                                     "catalogue, or the url." % (shown, total, size))
                expected = size if size is not None else total
                if size is None and total is not None:
                    check_space(directory, total - offset, min_free_bytes, name)
                with open(part, "ab") as out:
                    while True:
                        try:
                            block = source.read(CHUNK_BYTES)
                        except (OSError, http_client.HTTPException) as err:
                            raise TransientError("the transfer from %s broke at byte %d: %s" % (shown, offset, err))
                        if not block:
                            break
                        try:
                            out.write(block)
                        except (OSError, IOError) as err:
                            if err.errno in (errno.ENOSPC, errno.EDQUOT):
                                # A full disk helps no one: give the space back and say how much is needed.
                                out.close()
                                _remove(part)
                                raise FetchError(
                                    "The disk holding %s filled up at byte %d of %s; the partial file was removed. "
                                    "%s needs %s free there (plus llm_model_min_free_bytes): free space, or put the "
                                    "models on a larger filesystem (llm_model_dir)."
                                    % (directory, offset + len(block), "%d" % expected if expected else "?", name,
                                       human_bytes(expected) if expected else "more than %s" % human_bytes(offset)))
                            raise FetchError("Cannot write %s: %s" % (part, err))
                        hasher.update(block)
                        offset += len(block)
                        downloaded += len(block)
                        if progress is not None:
                            progress.update(name, offset, expected, started, resumed_from)
                        if expected is not None and offset > expected:
                            raise FetchError("%s sent more than the %d bytes expected: fix size_bytes in the "
                                             "catalogue, or the url." % (shown, expected))
                    out.flush()
                    os.fsync(out.fileno())
                if expected is not None and offset < expected:
                    raise TransientError("the connection to %s closed at byte %d of %d" % (shown, offset, expected))
            finally:
                source.close()
            attempts.append({"from": attempt_start, "bytes": offset - attempt_start, "error": None})
            break
        except TransientError as err:
            attempts.append({"from": attempt_start, "bytes": offset - attempt_start, "error": str(err)})
            if attempt > retries:
                raise FetchError(
                    "Download of %s stopped at byte %d of %s after %d attempt(s): %s. The partial file %s is kept: "
                    "the next run resumes from byte %d." % (shown, offset, "%d" % size if size is not None else "?",
                                                            attempt, err, part, offset))
            sleep(min(MAX_RETRY_DELAY, retry_delay * (2 ** (attempt - 1))))

    digest = hasher.hexdigest()
    if digest != sha:
        _remove(part)
        kept = ("the file already there, %s, is kept as it was" % final) if os.path.exists(final) \
            else "nothing was installed"
        raise FetchError(
            "Checksum mismatch for %s: the downloaded file's sha256 is %s, the catalogue says %s. The download was "
            "deleted and %s. Fix the catalogue's sha256 (or url), or the mirror's copy."
            % (shown, digest, sha, kept))
    os.chmod(part, 0o644)
    os.rename(part, final)
    _fsync_dir(directory)
    st = os.stat(final)
    write_sidecar(sidecar_path(directory, name), final, st, digest)
    return {
        "name": name, "path": final, "url": shown, "source": "url",
        "action": "resumed" if resumed_from else "downloaded",
        "sha256": digest, "size_bytes": st.st_size, "bytes_downloaded": downloaded, "resumed_from": resumed_from,
        "elapsed": round(time.time() - started, 3), "attempts": attempts, "checksum_source": "download",
    }


# --- progress, for the role to report while the module runs (async) ----------------

class ProgressFile(object):
    """The download's progress as JSON in `path`, replaced atomically at most
    every `interval` seconds: {file, done_bytes, total_bytes, rate_bytes_per_s,
    eta_s, finished}. The llm_model role polls it while the module runs in the
    background and prints it (a 20 GB download is otherwise one silent task)."""

    def __init__(self, path, interval=2.0, clock=time.time, secrets=()):
        self.path, self.interval, self.clock = check_progress_path(path), interval, clock
        self.secrets = list(secrets or [])
        self.written_at = None

    def _write(self, record):
        tmp = "%s.%d.tmp" % (self.path, os.getpid())
        try:
            with open(tmp, "w") as handle:
                json.dump(record, handle, sort_keys=True)
            os.rename(tmp, self.path)
        except (OSError, IOError) as err:
            _remove(tmp)
            raise FetchError("Cannot write the progress file %s: %s. Give progress_file a path in a writable "
                             "directory (llm_model_progress_file)." % (self.path, err.strerror or err))

    def update(self, name, done, total, started, resumed_from, force=False):
        now = self.clock()
        if not force and self.written_at is not None and now - self.written_at < self.interval:
            return
        self.written_at = now
        elapsed = max(now - started, 1e-6)
        rate = (done - resumed_from) / elapsed
        eta = (total - done) / rate if total is not None and rate > 0 else None
        self._write({"file": name, "done_bytes": done, "total_bytes": total, "rate_bytes_per_s": round(rate),
                     "eta_s": None if eta is None else round(eta), "finished": False})

    def finish(self, error=None):
        """The last record: finished, with the error scrubbed of every secret."""
        self._write({"finished": True, "error": None if error is None else scrub(error, self.secrets)})


# --- one download at a time per directory ------------------------------------------

def _lock_holder(directory):
    """What the lock record says of the run holding the lock, as words."""
    try:
        with open(os.path.join(directory, LOCK_RECORD)) as handle:
            record = json.load(handle)
    except (OSError, IOError, ValueError):
        return "another model_fetch run (it recorded no pid)"
    if not isinstance(record, dict):
        return "another model_fetch run (its record cannot be read)"
    since = record.get("since")
    try:
        since = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(float(since)))
    except (TypeError, ValueError, OverflowError):
        since = "an unknown time"
    return "pid %s on %s (since %s)" % (scrub(str(record.get("pid"))[:20]), scrub(str(record.get("host"))[:100]), since)


class DirectoryLock(object):
    """flock() on the download directory, waited for at most `timeout` seconds;
    the holder writes its pid and host to LOCK_RECORD (removed on release) so a
    run that gives up can say who holds the lock."""

    def __init__(self, directory, timeout=DEFAULT_LOCK_TIMEOUT, sleep=time.sleep, clock=time.time, poll=0.5):
        self.directory, self.timeout, self.sleep, self.clock, self.poll = directory, timeout, sleep, clock, poll
        self.fd = None

    def __enter__(self):
        fd = os.open(self.directory, os.O_RDONLY)
        deadline = self.clock() + self.timeout
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except (OSError, IOError) as err:
                if err.errno not in (errno.EAGAIN, errno.EACCES, errno.EWOULDBLOCK):
                    os.close(fd)
                    raise
            if self.clock() >= deadline:
                os.close(fd)
                raise FetchError(
                    "Another download into %s holds its lock: %s. Waited %ss (lock_timeout) for it. Let that run "
                    "finish (or stop it), then run again; a lock whose process is gone is freed by itself."
                    % (self.directory, _lock_holder(self.directory), self.timeout))
            self.sleep(min(self.poll, max(deadline - self.clock(), 0.01)))
        self.fd = fd
        record = os.path.join(self.directory, LOCK_RECORD)
        try:
            tmp = "%s.%d.tmp" % (record, os.getpid())
            with open(tmp, "w") as handle:
                json.dump({"pid": os.getpid(), "host": socket.gethostname(), "since": time.time()}, handle)
            os.rename(tmp, record)
        except (OSError, IOError):
            _remove(tmp)
        return self

    def __exit__(self, *exc):
        _remove(os.path.join(self.directory, LOCK_RECORD))
        try:
            fcntl.flock(self.fd, fcntl.LOCK_UN)
        finally:
            os.close(self.fd)
            self.fd = None
        return False


# --- the whole request ------------------------------------------------------------

def normalize_specs(files):
    """Check the module's `files` and fill in each name; raises FetchError."""
    if not isinstance(files, (list, tuple)):
        raise FetchError("files must be a list of {url or path, sha256, ...}, got %s" % type(files).__name__)
    specs, names = [], set()
    for index, item in enumerate(files):
        what = "files[%d]" % index
        if not isinstance(item, dict):
            raise FetchError("%s must be a mapping {url or path, sha256, ...}, got %s" % (what, type(item).__name__))
        url, path = item.get("url"), item.get("path")
        if path is not None and not isinstance(path, str):
            raise FetchError("%s.path must be a string, got %s" % (what, type(path).__name__))
        if bool(url) == bool(path):
            raise FetchError("%s needs exactly one of url (to download) or path (a pre-staged file to verify), got %s"
                             % (what, "both" if url else "neither"))
        spec = {"url": url, "path": path, "sha256": normalize_sha256(item.get("sha256"), what + ".sha256")}
        size = item.get("size_bytes")
        if size is not None:
            try:
                size = int(size)
            except (TypeError, ValueError):
                size = -1
            if size < 0:
                raise FetchError("%s.size_bytes must be a whole number of bytes, got %r" % (what, item.get("size_bytes")))
        spec["size_bytes"] = size
        if url:
            parts = check_url(url, what + ".url")
            default = os.path.basename(urllib_parse.unquote(parts.path))
        else:
            default = os.path.basename(path)
        name = item.get("name") or default
        if not name or "/" in name or name.startswith(".") or re.search(r"[\x00-\x1f\x7f]", name):
            raise FetchError("%s: cannot name the file %r (from %r); give it a name without '/' or control "
                             "characters, not starting with '.'" % (what, name, redact_url(url) if url else path))
        if name in names:
            raise FetchError("%s: two files would be written as %s; give them different names" % (what, name))
        names.add(name)
        spec["name"] = name
        specs.append(spec)
    return specs


def fetch_all(files, directory, check_mode=False, headers=None, hf_token=None, timeout=DEFAULT_TIMEOUT, retries=3,
              retry_delay=2.0, min_free_bytes=DEFAULT_MIN_FREE_BYTES, checksum_cache=True, sleep=time.sleep,
              progress=None, lock_timeout=DEFAULT_LOCK_TIMEOUT):
    """Put every file of `files` in place (or, in check mode, say what would be
    done). Returns {changed, files, bytes_downloaded, elapsed}; raises FetchError."""
    options = check_options(timeout, retries, retry_delay, min_free_bytes, lock_timeout)
    timeout, retries, retry_delay = options["timeout"], options["retries"], options["retry_delay"]
    min_free_bytes = options["min_free_bytes"]
    headers = check_headers(headers, hf_token)
    specs = normalize_specs(files)
    for index, spec in enumerate(specs):
        if spec["url"] and urllib_parse.urlsplit(spec["url"]).scheme.lower() == "file":
            # A FIFO or a directory is refused here, before the lock, not in open() under it.
            open_regular(urllib_request.url2pathname(urllib_parse.urlsplit(spec["url"]).path),
                         "files[%d].url's file" % index).close()
    started = time.time()
    write_cache = checksum_cache and not check_mode
    states = [describe(spec, directory, checksum_cache, write_cache) for spec in specs]
    pending = [(spec, state) for spec, state in zip(specs, states) if state["action"] == "download"]

    # Space for what is left to download, all files together, before any byte moves.
    needed = sum(spec["size_bytes"] - state["partial_bytes"] for spec, state in pending if spec["size_bytes"] is not None)
    if pending:
        check_space(directory, needed, min_free_bytes,
                    ", ".join(spec["name"] for spec, _ in pending))

    if check_mode:
        for spec, state in pending:
            state["action"] = "would_resume" if state["partial_bytes"] else "would_download"
            state["resumed_from"] = state["partial_bytes"]
            state["bytes_to_download"] = (spec["size_bytes"] - state["partial_bytes"]) \
                if spec["size_bytes"] is not None else None
        return {"changed": bool(pending), "files": states, "bytes_downloaded": 0,
                "elapsed": round(time.time() - started, 3)}

    results = list(states)
    if pending:
        if not os.path.isdir(directory):
            raise FetchError("The directory %s does not exist: create it first." % directory)
        # One download at a time per directory (two runs must not grow one partial file).
        with DirectoryLock(directory, options["lock_timeout"]):
            for index, spec in enumerate(specs):
                state = states[index]
                if state["action"] != "download":
                    continue
                # Another run may have finished it while this one waited for the lock.
                again = describe(spec, directory, checksum_cache, write_cache)
                if again["action"] == "present":
                    results[index] = again
                    continue
                result = download(spec, directory, headers=headers, hf_token=hf_token, timeout=timeout,
                                  retries=retries, retry_delay=retry_delay, min_free_bytes=min_free_bytes, sleep=sleep,
                                  progress=progress)
                for key in ("replaces", "replaces_sha256", "replaces_size_bytes"):
                    if key in state:
                        result[key] = state[key]
                results[index] = result
    # Leftover partial files of files that are now in place.
    for state in results:
        if state["source"] == "url" and state["action"] == "present":
            for stale in glob.glob(os.path.join(glob.escape(directory), ".%s.*.part" % glob.escape(state["name"]))):
                _remove(stale)
    return {
        "changed": bool(pending),
        "files": results,
        "bytes_downloaded": sum(r["bytes_downloaded"] for r in results),
        "elapsed": round(time.time() - started, 3),
    }
