"""module_utils/llama_flags.py's router preset: an on-demand model's llama-server
command line as the section of a --models-preset INI file that llama-server's router
starts its child from (issue 35). The INI is read back by a reader that follows
common/preset.cpp's grammar at the pinned commit (a key is [a-zA-Z_][a-zA-Z0-9_.-]*, a
value runs to ';', '#' or the line's end, spaces trimmed), and the child's flags are
compared with the resident instance's own command line."""
import importlib.util
import re

import pytest
from hypothesis import given, strategies as st

from conftest import ROOT

import ansible.module_utils
if str(ROOT / "module_utils") not in ansible.module_utils.__path__:
    ansible.module_utils.__path__.append(str(ROOT / "module_utils"))
from ansible.module_utils.llama_flags import ROUTER_OWNED, preset_options, router_preset  # noqa: E402

from test_llama_server_args import NEW_BUILD, OPTIONS, PLAN  # noqa: E402

_spec = importlib.util.spec_from_file_location(
    "llama_server_filters", ROOT / "roles" / "llama_server" / "filter_plugins" / "llama_server.py")
filters = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(filters)

_HEADER = re.compile(r"^[ \t]*\[[ \t]*([^]]+?)[ \t]*\][ \t]*(?:[;#].*)?$")
_KV = re.compile(r"^([a-zA-Z_][a-zA-Z0-9_.-]*)[ \t]*=[ \t]*(.*?)[ \t]*(?:[;#].*)?$")
_SKIP = re.compile(r"^[ \t]*(?:[;#].*)?$")


def read_ini(text):
    """{section: {key: value}} as common/preset.cpp's parse_ini_from_file reads it;
    a line it would not parse fails the test (the router would refuse the file)."""
    sections, current = {}, ""
    for line in text.split("\n"):
        header, pair = _HEADER.match(line), _KV.match(line)
        if header:
            current = header.group(1)
            sections.setdefault(current, {})
        elif pair:
            sections.setdefault(current, {})[pair.group(1)] = pair.group(2)
        else:
            assert _SKIP.match(line), "llama.cpp's INI grammar rejects %r" % line
    return sections


def child_argv(options):
    """The flags a child gets from a section (common_preset::to_args): a switch's key
    "true" becomes the bare flag."""
    argv = []
    for key, value in options.items():
        if key in ("version",):
            continue
        argv.append("--" + key)
        if value != "true":
            argv.append(value)
    return argv


def test_an_instance_s_command_line_becomes_its_child_s_section():
    """Every flag of the resident instance's own command line reaches the child but the
    ones the router owns (host, port, alias, the API key); switches become true."""
    args = filters.llama_server_args(PLAN, dict(OPTIONS, api_key_file="/etc/k"), NEW_BUILD)["args"]
    text = router_preset([("coder", args)], comment="llm-fleet: GPU 1's models loaded on demand")
    ini = read_ini(text)
    assert ini[""] == {"version": "1"}
    section = ini["coder"]
    assert section["model"] == "/m/q4.gguf" and section["ctx-size"] == "32768" and section["parallel"] == "4"
    assert section["metrics"] == "true" and section["load-mode"] == "mlock" and section["fit"] == "off"
    assert not set(section) & set(f.lstrip("-") for f in ROUTER_OWNED)
    owned = set(ROUTER_OWNED)
    kept = []
    for index, token in enumerate(args):
        if token in owned or (index and args[index - 1] in owned):
            continue
        kept.append(token)
    assert child_argv(section) == kept


@pytest.mark.parametrize("argv, words", [
    (["--model", "/m/a;b.gguf"], "cannot be written to the router's preset"),
    (["--model", "/m/a #b.gguf"], "cannot be written"),
    (["--ctx-size", "1", "--ctx-size", "2"], "given twice"),
    (["stray"], "is no flag"),
])
def test_what_the_ini_cannot_hold_is_refused_by_name(argv, words):
    with pytest.raises(ValueError, match=words):
        preset_options(argv)


def test_a_section_name_must_be_one_the_ini_can_hold():
    with pytest.raises(ValueError, match="cannot name a router preset section"):
        router_preset([("a]b", ["--model", "/m"])])


_key = st.from_regex(r"[a-z][a-z0-9-]{0,12}", fullmatch=True)
_value = st.text(alphabet=st.characters(min_codepoint=33, max_codepoint=126, blacklist_characters=";#"),
                 min_size=1, max_size=20).filter(lambda v: not re.match(r"^-+[A-Za-z]", v))


@given(pairs=st.dictionaries(_key, st.one_of(st.none(), _value), min_size=1, max_size=8),
       name=st.from_regex(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,20}", fullmatch=True))
def test_any_flags_survive_the_round_trip(pairs, name):
    """Whatever flags and values the command line has, the section read back gives the
    child the same ones (a switch: true)."""
    pairs = dict((k, v) for k, v in pairs.items() if "--" + k not in ROUTER_OWNED)
    argv = []
    for key, value in pairs.items():
        argv.extend(["--" + key] + ([value] if value is not None else []))
    section = read_ini(router_preset([(name, argv)]))[name]
    assert section == dict((k, "true" if v is None else v) for k, v in pairs.items())


# --- the llama_server role's filters for a card's router ------------------------------------

ROUTER_BUILD = NEW_BUILD + ["--models-preset", "--models-max"]


def test_a_card_s_on_demand_plans_become_its_router_s_preset():
    """One section per plan, named by its model, with the flags the role renders for a
    resident instance of that plan (threads capped by the host's CPUs); the router's
    own host, port and the models' aliases stay out."""
    code = dict(PLAN, model_name="code", model_path="/m/code.gguf", threads=20, load="on_demand")
    embed = dict(PLAN, model_name="embed", model_path="/m/embed.gguf", threads=4, parallel=1, load="on_demand")
    text = filters.llama_server_router_preset([code, embed], dict(OPTIONS, threads=8), ROUTER_BUILD)
    ini = read_ini(text)
    assert set(ini) == {"", "code", "embed"}
    assert ini["code"]["model"] == "/m/code.gguf" and ini["code"]["threads"] == "8"
    assert ini["embed"]["model"] == "/m/embed.gguf" and ini["embed"]["threads"] == "4"
    assert ini["embed"]["parallel"] == "1"
    assert not any(k in section for section in ini.values() for k in ("host", "port", "alias"))


def test_the_router_s_command_line_and_what_it_needs():
    router = {"gpu_index": 1, "models": ["code"], "models_max": 2}
    args = filters.llama_server_router_args(router, {"host": "0.0.0.0", "port": 8181, "preset": "/etc/p.ini",
                                                     "api_key_file": "/etc/k"}, ROUTER_BUILD)
    assert args == ["--host", "0.0.0.0", "--port", "8181", "--models-preset", "/etc/p.ini", "--models-max", "2",
                    "--api-key-file", "/etc/k"]
    with pytest.raises(filters.FilterInputError, match="no --models-preset flag.*load: resident"):
        filters.llama_server_router_args(router, {"host": "h", "port": 1, "preset": "p"}, NEW_BUILD)


def test_a_model_loaded_on_demand_is_recorded_at_its_router():
    """Its record is a resident instance's, reached at the router's port and unit."""
    plan = dict(PLAN, model_name="code", model_rank=2, instance="1-code", load="on_demand")
    router = {"gpu_index": 1, "models": ["code"], "models_max": 1, "model_rank": 2, "instance": "1-router"}
    entry = filters.llama_server_on_demand_instance(plan, router, 8080, "build", {"1-router": "f", "1-code": "x"})
    assert (entry["instance"], entry["port"], entry["unit"]) == ("1-code", 8281, "llama-server@1-router.service")
    assert (entry["load"], entry["router"], entry["fingerprint"]) == ("on_demand", "1-router", "f")
    assert entry["model_name"] == "code" and entry["parallel"] == PLAN["parallel"]
