#!/usr/bin/python
# -*- coding: utf-8 -*-
from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
---
module: model_fetch
short_description: Put model files on a host, sha256-verified, resuming interrupted downloads
description:
  - >-
    For each file: when the destination already holds it with the right sha256, nothing is
    fetched (the verified checksum is cached in a sidecar file C(.NAME.sha256) keyed by the
    file's size, modification time and inode, so a rerun does not rehash a 20 GB file).
  - >-
    Otherwise the file is downloaded (C(http://), C(https://)) or copied from a mirror
    (C(file://)) into a temporary file C(.NAME.<sha256 prefix>.part) in the destination
    directory. An interrupted transfer is resumed from that file with an HTTP C(Range)
    request, at once (C(retries)) or at the next run. The result is checked against the
    sha256 and only then renamed into place, atomically: a wrong download is deleted and
    the file that was there (if any) stays as it was.
  - >-
    A file given by C(path) (a pre-staged copy, e.g. on an air-gapped fleet's shared
    mirror) is only verified, never copied.
  - Free space is checked (statvfs) before any byte is transferred.
  - Standard library only (urllib); runs with any Python 3.8 or later.
options:
  dest:
    description: Directory the downloaded files go to (it must exist unless in check mode).
    type: path
    required: true
  files:
    description: The files, in order (for a split GGUF model, every shard).
    type: list
    elements: dict
    required: true
    suboptions:
      url:
        description:
          - Where to get the file (C(http://), C(https://) or C(file://)); one of I(url) or I(path).
          - A C(file://) URL must name a regular file (a FIFO, device or directory is refused, never opened).
        type: str
      path:
        description: A pre-staged file that is only verified in place; one of I(url) or I(path).
        type: path
      name:
        description: File name in I(dest); default the last part of the URL.
        type: str
      sha256:
        description: The file's sha256 (64 hex digits).
        type: str
        required: true
      size_bytes:
        description: The file's size; checked against the server's before downloading and used for the space check.
        type: int
  headers:
    description: HTTP headers sent with every request (e.g. a mirror's credentials); not sent across redirects to another host.
    type: dict
    default: {}
  hf_token:
    description:
      - A Hugging Face token, sent as C(Authorization) only to C(huggingface.co) and C(hf.co) URLs.
      - A token or header value holding a line break (CR, LF) or another control character is refused by name,
        without showing it; no message, result or progress file of the module carries a secret.
    type: str
  timeout:
    description: Seconds a connection or a read may stall before the attempt counts as failed (1 to 86400).
    type: int
    default: 60
  retries:
    description: Further attempts after an interrupted transfer, each resuming where the last one stopped (0 to 100).
    type: int
    default: 3
  retry_delay:
    description: Seconds before the first retry (0 to 60); doubled at each one (at most 60).
    type: float
    default: 2.0
  lock_timeout:
    description:
      - Seconds to wait for another run downloading into the same I(dest) (one download at a time per directory),
        0 to 86400; past it the module fails and names the run holding the lock (pid and host).
    type: int
    default: 600
  min_free_bytes:
    description: Bytes that must stay free on the destination's filesystem after the downloads.
    type: int
    default: 1073741824
  checksum_cache:
    description: Trust (and write) the sidecar checksum cache; false rehashes every file.
    type: bool
    default: true
  progress_file:
    description:
      - Where to write the download's progress as JSON (file, done_bytes, total_bytes, rate_bytes_per_s, eta_s,
        finished), every 2 seconds, for a role that runs the module in the background (async) to report it.
      - A file in an existing directory (not a directory).
    type: path
extends_documentation_fragment:
  - files
notes:
  - Supports check mode, reporting what would be downloaded (and from which offset) without any request.
  - I(mode), I(owner) and I(group) apply to the files in I(dest), not to pre-staged I(path) files.
author: llm-fleet
"""

EXAMPLES = r"""
- name: Download a quantization from Hugging Face
  model_fetch:
    dest: /var/lib/llm-fleet/models
    files:
      - url: https://huggingface.co/Qwen/Qwen2.5-32B-Instruct-GGUF/resolve/main/qwen2.5-32b-instruct-q4_k_m-00001-of-00005.gguf
        sha256: 3bd8a6b1c2f8a0b0f1e5a3b96d2f2c1a5d9c3a0e9e4f6a8b7c6d5e4f3a2b1c0d
        size_bytes: 3993201344
    hf_token: "{{ vault_hf_token }}"
    mode: "0644"
  register: fetched

- name: Verify a copy staged on the fleet's NFS mirror
  model_fetch:
    dest: /var/lib/llm-fleet/models
    files:
      - path: /mnt/models/Qwen2.5-32B-Instruct-Q4_K_M.gguf
        sha256: 3bd8a6b1c2f8a0b0f1e5a3b96d2f2c1a5d9c3a0e9e4f6a8b7c6d5e4f3a2b1c0d
"""

RETURN = r"""
files:
  description: One entry per file, in order.
  returned: success
  type: list
  elements: dict
  contains:
    name: {description: File name., type: str}
    path: {description: Where the file is (in I(dest), or the pre-staged path)., type: str}
    url: {description: The URL without credentials or query string; null for a I(path)., type: str}
    action:
      description: >-
        present (already there and verified), downloaded, resumed (completed from a partial file),
        would_download / would_resume (check mode).
      type: str
    sha256: {description: The verified sha256., type: str}
    size_bytes: {description: Size of the file., type: int}
    bytes_downloaded: {description: Bytes transferred by this run., type: int}
    resumed_from: {description: Offset this run started from (bytes of a partial download found on disk)., type: int}
    elapsed: {description: Seconds spent on this file., type: float}
    attempts: {description: "Each attempt: from (offset), bytes, error.", type: list, elements: dict}
    checksum_source: {description: "cache (sidecar), computed, or download (hashed while downloading).", type: str}
bytes_downloaded:
  description: Bytes transferred, all files together.
  returned: success
  type: int
elapsed:
  description: Seconds the module took.
  returned: success
  type: float
paths:
  description: Paths of the files, in order (the first is what llama-server's -m takes for a split model).
  returned: success
  type: list
  elements: str
"""

from ansible.module_utils.basic import AnsibleModule

from ansible.module_utils.fleet_errors import fail, header_secrets, scrub
from ansible.module_utils.model_download import (DEFAULT_LOCK_TIMEOUT, DEFAULT_MIN_FREE_BYTES, DEFAULT_TIMEOUT,
                                                 FetchError, ProgressFile, fetch_all)


def _finish(progress, error=None):
    """Best effort: a progress file that cannot be written must not hide the error."""
    if progress is not None:
        try:
            progress.finish(error)
        except (FetchError, OSError, IOError):
            pass


def _url_secrets(files):
    """The user:password of each URL (kept out of the result's invocation too)."""
    found = []
    for item in files or []:
        url = item.get("url") if isinstance(item, dict) else None
        if not isinstance(url, str) or "@" not in url:
            continue
        userinfo = url.partition("://")[2].split("/", 1)[0].rpartition("@")[0]
        found.extend(part for part in (userinfo, userinfo.partition(":")[2]) if len(part) >= 3)
    return found


def main():
    module = AnsibleModule(
        argument_spec=dict(
            dest=dict(type="path", required=True),
            files=dict(type="list", elements="dict", required=True, options=dict(
                url=dict(type="str"),
                path=dict(type="path"),
                name=dict(type="str"),
                sha256=dict(type="str", required=True),
                size_bytes=dict(type="int"),
            ), mutually_exclusive=[("url", "path")], required_one_of=[("url", "path")]),
            headers=dict(type="dict", default={}, no_log=True),
            hf_token=dict(type="str", no_log=True),
            timeout=dict(type="int", default=DEFAULT_TIMEOUT),
            retries=dict(type="int", default=3),
            retry_delay=dict(type="float", default=2.0),
            min_free_bytes=dict(type="int", default=DEFAULT_MIN_FREE_BYTES),
            checksum_cache=dict(type="bool", default=True),
            progress_file=dict(type="path"),
            lock_timeout=dict(type="int", default=DEFAULT_LOCK_TIMEOUT),
        ),
        add_file_common_args=True,
        supports_check_mode=True,
    )
    params = module.params
    secrets = _url_secrets(params["files"]) + header_secrets(params["headers"])
    module.no_log_values.update(secrets)
    secrets += list(module.no_log_values)
    progress = None
    try:
        if params["progress_file"] and not module.check_mode:
            progress = ProgressFile(params["progress_file"], secrets=secrets)
        result = fetch_all(
            params["files"], params["dest"], check_mode=module.check_mode, headers=params["headers"],
            hf_token=params["hf_token"], timeout=params["timeout"], retries=params["retries"],
            retry_delay=params["retry_delay"], min_free_bytes=params["min_free_bytes"],
            checksum_cache=params["checksum_cache"], progress=progress, lock_timeout=params["lock_timeout"])
    except FetchError as err:
        message = str(err)
    except (OSError, IOError) as err:
        message = "model_fetch failed on %s: %s" % (getattr(err, "filename", None) or params["dest"], err)
    else:
        message = None
    if message is not None:
        _finish(progress, scrub(message, secrets))
        fail(module, message, secrets)
    _finish(progress)

    changed = result["changed"]
    # Ownership and mode of the files in dest (pre-staged files are left alone).
    for entry in result["files"]:
        if entry.get("source") == "url" and entry["action"] in ("present", "downloaded", "resumed"):
            file_args = module.load_file_common_arguments(params, path=entry["path"])
            changed = module.set_fs_attributes_if_different(file_args, changed)
    module.exit_json(changed=changed, files=result["files"], bytes_downloaded=result["bytes_downloaded"],
                     elapsed=result["elapsed"], paths=[entry["path"] for entry in result["files"]])


if __name__ == "__main__":
    main()
