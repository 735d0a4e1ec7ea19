"""One error formatter for every module (module_utils/fleet_errors.py): each
failure of a module in library/ goes through `fail(module, msg)`, which scrubs
the secrets (no_log values in every form a message carries them, URL passwords,
Authorization-like values) out of the message and of everything returned with
it; the async job file Ansible writes is that result."""
import ast
import json

import pytest

from conftest import ROOT, run_module

import ansible.module_utils
if str(ROOT / "module_utils") not in ansible.module_utils.__path__:
    ansible.module_utils.__path__.append(str(ROOT / "module_utils"))
from ansible.module_utils import fleet_errors  # noqa: E402

MODULES = sorted((ROOT / "library").glob("*.py"))
TOKEN = "hf_SeCrEtToKeN1234567890"


def _calls(tree):
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            yield node


@pytest.mark.parametrize("path", MODULES, ids=lambda p: p.name)
def test_every_module_fails_only_through_the_formatter(path):
    tree = ast.parse(path.read_text())
    direct = [node.lineno for node in _calls(tree)
              if isinstance(node.func, ast.Attribute) and node.func.attr == "fail_json"]
    assert not direct, "%s calls fail_json directly at line(s) %s: use fleet_errors.fail(module, msg)" \
        % (path.name, direct)
    imports = [node for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)
               and node.module == "ansible.module_utils.fleet_errors"
               and any(alias.name == "fail" for alias in node.names)]
    uses = [node for node in _calls(tree) if isinstance(node.func, ast.Name) and node.func.id == "fail"]
    assert imports and uses, "%s never fails through fleet_errors.fail" % path.name


def test_no_module_util_but_the_formatter_calls_fail_json():
    for path in sorted((ROOT / "module_utils").glob("*.py")):
        if path.name == "fleet_errors.py":
            continue
        tree = ast.parse(path.read_text())
        assert not [node for node in _calls(tree) if isinstance(node.func, ast.Attribute)
                    and node.func.attr == "fail_json"], path.name


class _Module(object):
    def __init__(self, no_log_values=()):
        self.no_log_values = set(no_log_values)
        self.failed = None

    def fail_json(self, msg, **kwargs):
        self.failed = dict(kwargs, msg=msg)
        raise SystemExit(1)


@pytest.mark.parametrize("secret", [TOKEN, "abc\ndef-secret", "tok\r\nen-x", "t\u00e9\u00f1-\u2603"])
def test_a_no_log_value_is_scrubbed_in_every_form(secret):
    module = _Module([secret])
    try:
        raise ValueError("bad %r and %s and %s" % (secret, json.dumps(secret), secret))
    except ValueError as err:
        with pytest.raises(SystemExit):
            fleet_errors.fail(module, str(err), detail=[{"x": secret}])
    shown = json.dumps(module.failed)
    for form in fleet_errors.secret_forms([secret]):
        assert form not in shown and form not in module.failed["msg"]
    assert fleet_errors.REDACTED in module.failed["msg"]
    # the pending exception's traceback carried the message: it comes back scrubbed
    assert "ValueError" in module.failed["exception"] and secret not in module.failed["exception"]


@pytest.mark.parametrize("text, hidden", [
    ("cannot reach https://user:pa55w0rd@mirror.example/m.gguf", "pa55w0rd"),
    ("sent Authorization: Bearer abcdef123456", "abcdef123456"),
    ("header {'Authorization': 'Basic dXNlcjpwYXNz'}", "dXNlcjpwYXNz"),
    ("https://cdn.example/x?X-Amz-Signature=deadbeef99&X-Amz-Credential=AKIA123&ok=1", "deadbeef99"),
    ("https://cdn.example/x?X-Amz-Signature=deadbeef99&X-Amz-Credential=AKIA123&ok=1", "AKIA123"),
    ("x-api-key=topsecret1 was refused", "topsecret1"),
])
def test_secrets_are_scrubbed_without_being_named(text, hidden):
    assert hidden not in fleet_errors.scrub(text)


def test_plain_messages_are_left_as_they_are():
    text = "timeout is 0: give a number of seconds from 1 to 86400 (model_fetch's timeout)."
    assert fleet_errors.scrub(text, ["ab", ""]) == text


def test_a_header_named_like_a_credential_is_a_secret():
    assert fleet_errors.header_secrets({"Authorization": "Bearer x1", "X-Mirror-Key": "k1", "Accept": "a/b"}) == \
        ["Bearer x1", "k1"]


# --- the modules themselves, as Ansible runs them --------------------------------

@pytest.mark.parametrize("args, named", [
    ({"hf_token": TOKEN[:6] + "\r\n" + TOKEN[6:]}, "hf_token"),
    ({"headers": {"X-Mirror-Key": TOKEN + "\nX-Injected: 1"}}, "X-Mirror-Key"),
    ({"headers": {"Authorization": "Bearer " + TOKEN + "\r"}}, "Authorization"),
])
def test_model_fetch_refuses_a_secret_with_a_newline_without_showing_it(tmp_path, args, named):
    progress = tmp_path / "progress.json"
    files = [{"url": "https://huggingface.co/o/r/resolve/main/m.gguf", "sha256": "a" * 64}]
    result = run_module("model_fetch", dict(args, dest=str(tmp_path), files=files, progress_file=str(progress)))
    assert result["failed"] and named in result["msg"]
    shown = json.dumps(result) + (progress.read_text() if progress.exists() else "")
    assert TOKEN not in shown and TOKEN[6:] not in shown and TOKEN[:6] + "\\r" not in shown


def test_a_token_in_a_url_never_reaches_the_message(tmp_path):
    url = "https://user:%s@127.0.0.1:9/m.gguf" % TOKEN
    progress = tmp_path / "progress.json"
    result = run_module("model_fetch", {"dest": str(tmp_path), "files": [{"url": url, "sha256": "a" * 64}],
                                        "retries": 0, "timeout": 2, "progress_file": str(progress)})
    assert result["failed"]
    assert TOKEN not in json.dumps(result) and TOKEN not in progress.read_text()
