"""Hostile values through the unit templates (filter_plugins/systemd_unit.py).

A newline in a model name, a quant label, a path or an extra argument used to
become a directive of its own (`ExecStartPre=+...` runs as root); `%i` and `$HOME`
were expanded by systemd. Every value is now refused or escaped. `split_exec`
below reads an ExecStart= line as systemd.service(5) "Command lines" says systemd
does (specifiers, then words with C escapes and quotes, then $$); the molecule
fleet scenario checks the same against a real systemd (`systemctl show`)."""
import re

import pytest
from ansible.errors import AnsibleFilterError
from hypothesis import given, settings as hypothesis_settings, strategies as st

from test_llama_server_units import PLAN, ROOT, _vars, render, settings, unit_filters

DROPIN = ROOT / "roles" / "llama_server" / "templates" / "plan.conf.j2"
UNIT = ROOT / "roles" / "llama_server" / "templates" / "llama-server@.service.j2"
TUNING = ROOT / "roles" / "gpu_tuning" / "templates" / "gpu-tuning.service.j2"


def split_exec(line):
    """argv of an ExecStart= value, read the way systemd reads it."""
    line = re.sub(r"%(.)", lambda m: "%" if m.group(1) == "%" else "<specifier %s>" % m.group(1), line)
    words, word, quote, i, started = [], "", None, 0, False
    while i < len(line):
        char = line[i]
        if char == "\\" and i + 1 < len(line):
            word += line[i + 1]
            i += 2
            started = True
            continue
        if quote:
            if char == quote:
                quote = None
            else:
                word += char
        elif char in "\"'":
            quote, started = char, True
        elif char.isspace():
            if started:
                words.append(word)
            word, started = "", False
        else:
            word += char
            started = True
        i += 1
    assert quote is None, "unterminated quote in %r" % line
    if started:
        words.append(word)
    out = []
    for word in words:
        assert not re.search(r"(?<!\$)\$(?!\$)[A-Za-z{]", word.replace("$$", "")), "unescaped $VAR in %r" % word
        out.append(word.replace("$$", "$"))
    return out


HOSTILE_ARGS = ["--alias", 'q4 "50%" $HOME %i \\ \'x\'', "--model", "/m/a b$c%d.gguf", "--ctx-size", "8192", ""]


def test_every_argument_comes_back_exactly_as_given():
    text = render(DROPIN, _vars(252, llama_server_args=HOSTILE_ARGS))
    exec_lines = [value for _, key, value in settings(text) if key == "ExecStart" and value]
    assert split_exec(exec_lines[0]) == ["/opt/llm-fleet/llama.cpp/abc123/bin/llama-server"] + HOSTILE_ARGS


def test_plain_arguments_are_written_bare():
    """An upgrade must not rewrite (and restart) a unit whose arguments need no quoting."""
    assert unit_filters.systemd_exec_args(["--model", "/var/lib/m/Q4_K_M.gguf", "-c", "8192"]) == \
        "--model /var/lib/m/Q4_K_M.gguf -c 8192"


@pytest.mark.parametrize("where, over", [
    ("an argument", {"llama_server_args": ["--alias", "x\nExecStartPre=+/bin/sh -c id"]}),
    ("an argument", {"llama_server_args": ["--model", "/m/x.gguf\r"]}),
    ("the plan's quant", {"llama_server_plan": dict(PLAN, quant="Q4\nExecStartPre=+/bin/true")}),
    ("cache_type_k", {"llama_server_plan": dict(PLAN, cache_type_k="f16\n[Service]")}),
    ("the GPU uuid", {"llama_server_plan": dict(PLAN, gpu_uuid="GPU-1\nUser=root")}),
    ("the build key", {"llama_server_build_key": "abc\nExecStopPost=+/bin/true"}),
    ("llama_server environment", {"llama_server_extra_env": {"A": "1\nUser=root"}}),
    ("llama_server environment", {"llama_server_extra_env": {"A B": "1"}}),
    ("llama_server_install_dir", {"llama_server_install_dir": "/opt/x y"}),
    ("llama_server_install_dir", {"llama_server_install_dir": "relative/dir"}),
    ("the model's sha256", {"llama_server_plan": dict(PLAN, model_sha256=["ab\ncd"])}),
])
def test_a_control_character_or_a_bad_name_in_the_dropin_is_refused_by_name(where, over):
    with pytest.raises(AnsibleFilterError, match=re.escape(where)):
        render(DROPIN, _vars(252, **over))


@pytest.mark.parametrize("where, over", [
    ("llama_server_state_dir", {"llama_server_state_dir": "/var/lib/x\nExecStartPre=+/bin/true"}),
    ("llama_server_state_dir", {"llama_server_state_dir": "/var/lib/with space"}),
    ("llama_server_config_dir", {"llama_server_config_dir": "/etc/x\n[Install]"}),
    ("llama_server_user", {"llama_server_user": "root\nUser=root"}),
    ("llama_server_user", {"llama_server_user": "Llama Server"}),
])
def test_a_bad_path_or_user_in_the_unit_is_refused_by_name(where, over):
    with pytest.raises(AnsibleFilterError, match=re.escape(where)):
        render(UNIT, _vars(252, **over))


def test_percent_in_a_path_is_not_a_specifier():
    text = render(UNIT, _vars(252, llama_server_state_dir="/srv/100%/llm"))
    assert "ReadWritePaths=/srv/100%%/llm/%i" in text.splitlines()


def test_the_gpu_tuning_unit_quotes_its_command_line():
    text = render(TUNING, _vars(252, gpu_tuning_tool="/opt/llm-fleet/bin/gpu tuning"))
    exec_line = [value for _, key, value in settings(text) if key == "ExecStart"][0]
    assert split_exec(exec_line)[1] == "/opt/llm-fleet/bin/gpu tuning"
    with pytest.raises(AnsibleFilterError, match="gpu_tuning_config_path"):
        render(TUNING, _vars(252, gpu_tuning_config_path="/etc/x\nExecStartPre=+/bin/true"))


@pytest.mark.parametrize("value", ["a\nb", "a\rb", "a\x00b", "a\tb", "a\x7fb", "a\x1bb"])
def test_every_control_character_is_refused(value):
    for call in (lambda: unit_filters.systemd_exec_args([value]), lambda: unit_filters.systemd_line(value),
                 lambda: unit_filters.systemd_path("/x/" + value), lambda: unit_filters.systemd_env("N", value)):
        with pytest.raises(AnsibleFilterError, match="control character"):
            call()


def test_exec_args_wants_a_list():
    with pytest.raises(AnsibleFilterError, match="list"):
        unit_filters.systemd_exec_args("--model x")


def test_a_model_replaced_under_the_same_name_changes_the_dropin():
    """Same path, same plan figures, another file: only its sha256 tells, so the drop-in carries it
    and the role restarts and gates the instance onto the new file."""
    old = render(DROPIN, _vars(252, llama_server_plan=dict(PLAN, model_sha256=["a" * 64])))
    new = render(DROPIN, _vars(252, llama_server_plan=dict(PLAN, model_sha256=["b" * 64])))
    assert "# model sha256 " + "a" * 64 in old.splitlines()
    assert old != new
    # a hand-written plan without checksums still renders
    assert "# model sha256 -" in render(DROPIN, _vars(252)).splitlines()


# --- types, lengths, $ and root (issue 31) ---------------------------------------

@pytest.mark.parametrize("value, words", [
    (None, "null (None)"), (["a", "b"], "a list"), ({"k": "v"}, "a dict"), (b"x", "a bytes"), (True, "a boolean"),
    (float("nan"), "finite"), (object(), "not a string or a number"),
])
def test_a_value_that_is_not_a_string_or_number_is_refused_by_name(value, words):
    for call in (lambda: unit_filters.systemd_exec_args(["--x", value], "llama_server_extra_args"),
                 lambda: unit_filters.systemd_env("N", value, "llama_server_extra_args"),
                 lambda: unit_filters.systemd_path(value, "llama_server_extra_args"),
                 lambda: unit_filters.systemd_user(value, "llama_server_extra_args")):
        with pytest.raises(AnsibleFilterError) as caught:
            call()
        assert "llama_server_extra_args" in str(caught.value) and words in str(caught.value)


def test_numbers_are_still_arguments():
    assert unit_filters.systemd_exec_args(["-c", 8192, "--temp", 0.5]) == "-c 8192 --temp 0.5"


@pytest.mark.parametrize("call", [
    lambda big: unit_filters.systemd_exec_args(["--alias", big], "llama_server_extra_args"),
    lambda big: unit_filters.systemd_exec_args(["x" * 600000, "y" * 600000], "llama_server_extra_args"),
    lambda big: unit_filters.systemd_env("N", big, "llama_server_extra_args"),
    lambda big: unit_filters.systemd_line(big, "llama_server_extra_args"),
    lambda big: unit_filters.systemd_path("/" + big, "llama_server_extra_args"),
])
def test_a_value_longer_than_systemds_line_limit_is_refused(call):
    with pytest.raises(AnsibleFilterError, match=r"llama_server_extra_args.*LONG_LINE_MAX"):
        call("a" * (2 << 20))


def test_the_line_limit_is_systemds():
    assert unit_filters.LONG_LINE_MAX == 1 << 20
    assert len(unit_filters.systemd_exec_args(["a" * (unit_filters.VALUE_MAX - 10)])) < unit_filters.LONG_LINE_MAX


@pytest.mark.parametrize("path", ["/opt/$HOME/bin/llama-server", "/opt/x$/bin", "/opt/${X}/bin"])
def test_a_dollar_in_the_executable_is_refused(path):
    with pytest.raises(AnsibleFilterError, match=r"llama_server_install_dir .*\$"):
        unit_filters.systemd_exec_path(path, "llama_server_install_dir")


def test_root_is_refused_unless_allowed():
    with pytest.raises(AnsibleFilterError, match="llama_server_user is root.*allow_root"):
        unit_filters.systemd_user("root", "llama_server_user")
    with pytest.raises(AnsibleFilterError, match="llama_server_user is root"):
        render(UNIT, _vars(252, llama_server_user="root"))
    assert unit_filters.systemd_user("root", "gpu_tuning", allow_root=True) == "root"
    assert unit_filters.systemd_user("llama", "llama_server_user") == "llama"


_SCALARS = st.one_of(st.text(max_size=20), st.integers(), st.floats(), st.booleans(), st.none(), st.binary(max_size=4),
                     st.lists(st.text(max_size=3), max_size=2), st.dictionaries(st.text(max_size=3), st.integers(),
                                                                               max_size=2))
_FILTERS = [
    lambda v: unit_filters.systemd_exec_args(v if isinstance(v, list) else [v], "the_var"),
    lambda v: unit_filters.systemd_exec_path(v, "the_var"),
    lambda v: unit_filters.systemd_env("NAME", v, "the_var"),
    lambda v: unit_filters.systemd_env(v, "x", "the_var"),
    lambda v: unit_filters.systemd_path(v, "the_var"),
    lambda v: unit_filters.systemd_line(v, "the_var"),
    lambda v: unit_filters.systemd_user(v, "the_var"),
]


@hypothesis_settings(derandomize=True, max_examples=200, deadline=1000)
@given(st.sampled_from(range(len(_FILTERS))), st.one_of(_SCALARS, st.lists(_SCALARS, max_size=3)))
def test_every_filter_gives_one_line_or_a_named_error(which, value):
    try:
        text = _FILTERS[which](value)
    except AnsibleFilterError as err:
        assert "the_var" in str(err)
        return
    assert isinstance(text, str) and not re.search(r"[\x00-\x1f\x7f]", text) and len(text) < unit_filters.LONG_LINE_MAX
    assert "None" not in text or "None" in str(value)
    if which == 0:
        words = split_exec("/bin/x " + text)[1:]
        assert words == [str(v) for v in (value if isinstance(value, list) else [value])]
