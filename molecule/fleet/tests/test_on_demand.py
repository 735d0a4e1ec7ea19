"""A model loaded on demand (issue 35), deployed by the stages' own playbooks as an
operator would: llm_model_models names the harness' tiny model (resident) and the second
one with load: on_demand, on the 32 GB host's one card. The model stage plans the second
for the card's router in what the first leaves; the llama_server stage runs
llama-server@0 as before and llama-server@0-router, whose preset holds the second's
section, on the port the second's own instance would have had (base port + 100); no
llama-server@0-second. The front sends a request naming the second to the router, which
starts a child for it; verify measures it through the router, by the child's PID. Then
the one-model inventory again: the router, its preset and its backend are gone."""
import os
import re
import sys

import pytest

from hostprobe import node, only_in_scenario, run_playbook, stage_fact
from test_frontend import CHAT, front, tokens_predicted
from test_llama_server import ONE_GPU, cmdline, flag
from test_models import _entry, deploy, main_pid

pytestmark = [only_in_scenario("fleet"), pytest.mark.day_two]

ROUTER_DROPIN = "/etc/systemd/system/llama-server@0-router.service.d"
PRESET = "/etc/llm-fleet/llama-server/0-router.ini"
GPU_HOST = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))),
                        "benchmarks", "gpu-host")

ON_DEMAND = {
    "llm_model_catalogue": [],
    "llm_model_models": [
        {"name": "tiny-test", "catalogue": [_entry("tiny-f32.gguf")],
         "policy": {"min_ctx": 512, "target_ctx": 2048, "target_parallel": 2}},
        {"name": "second", "catalogue": [_entry("tiny-second-f32.gguf")], "load": "on_demand",
         "policy": {"min_ctx": 512, "target_ctx": 1024, "target_parallel": 1}},
    ],
}


def children(host, router_pid):
    """{alias: (pid, argv)} of the router's children."""
    found = {}
    for line in host.check_output("pgrep -P %d || true" % router_pid).split():
        args = cmdline(host, int(line))
        if "--alias" in args:
            found[flag(args, "--alias")] = (int(line), args)
    return found


def test_a_model_loaded_on_demand_is_served_by_its_card_s_router(tmp_path):
    host = node(ONE_GPU)
    try:
        # First as the GPU machine's harness runs it (benchmarks/gpu-host/run.sh, no systemd there):
        # the model stage, then llama_server --check --diff, whose diff unit_from_diff.py reads
        # into the router's command line and the preset it starts from. Check mode writes nothing.
        for step in ("plan", "check"):
            (tmp_path / step).mkdir()
        plan = run_playbook("playbooks/model.yml", [ONE_GPU], tmp_path=tmp_path / "plan", extra_vars=ON_DEMAND)
        assert plan.returncode == 0, plan.stdout[-3000:]
        check = run_playbook("playbooks/llama_server.yml", [ONE_GPU], tmp_path=tmp_path / "check",
                             extra_vars=ON_DEMAND, check=True, diff=True)
        assert check.returncode == 0, check.stdout[-3000:]
        sys.path.insert(0, GPU_HOST)
        import unit_from_diff
        rendered = unit_from_diff.units(check.stdout)["0-router"]
        assert flag(rendered["argv"], "--models-preset") == PRESET and flag(rendered["argv"], "--models-max") == "1"
        assert "[second]" in rendered["preset_text"] and "tiny-second-f32.gguf" in rendered["preset_text"]
        planned = dict((p["model_name"], p) for p in stage_fact(host, "model")["plans"])
        assert rendered["environment"]["CUDA_VISIBLE_DEVICES"] == planned["second"]["gpu_uuid"]
        assert not host.file(PRESET).exists and not host.file(ROUTER_DROPIN).exists

        deploy(tmp_path / "on-demand", ON_DEMAND)

        model = stage_fact(host, "model")
        plans = dict((p["model_name"], p) for p in model["plans"])
        assert plans["second"]["load"] == "on_demand" and "load" not in plans["tiny-test"]
        assert model["placement"] == {"0": ["tiny-test"]}
        (router,) = model["routers"]
        assert (router["gpu_index"], router["models"], router["instance"]) == (0, ["second"], "0-router")
        assert router["models_max"] == 1 and "on-demand model(s) fit together" in router["reason"]
        assert "Loaded on demand on GPU 0 by its router" in plans["second"]["reason"]
        assert "the largest model loaded on demand kept at least" in plans["tiny-test"]["reason"]

        # the resident instance as before; the router instead of an instance of the second
        assert host.service("llama-server@0").is_running
        assert host.service("llama-server@0-router").is_running and host.service("llama-server@0-router").is_enabled
        assert not host.file("/etc/systemd/system/llama-server@0-second.service.d").exists
        router_pid = main_pid(host, "0-router")
        args = cmdline(host, router_pid)
        assert flag(args, "--port") == "8180" and flag(args, "--models-max") == "1"
        assert flag(args, "--models-preset") == PRESET and "--model" not in args
        preset = host.file(PRESET)
        assert preset.mode == 0o640 and preset.user == "root"
        assert "[second]" in preset.content_string and "tiny-second-f32.gguf" in preset.content_string

        # verify loaded it through the router and measured it, by its child's PID
        verify = stage_fact(host, "verify")
        measured = dict((i["model_name"], i) for i in verify["instances"])
        assert sorted(measured) == ["second", "tiny-test"], verify["summary"]
        assert measured["second"]["port"] == 8180 and measured["second"]["single_stream_tps"] > 0
        assert "loaded on demand through the router 0-router" in str(measured["second"]["llama_bench"])
        running = children(host, router_pid)
        assert list(running) == ["second"]
        child_pid, child_args = running["second"]
        assert str(measured["second"]["vram"].get("pid") or child_pid) == str(child_pid)
        assert os.path.basename(flag(child_args, "--model")) == "tiny-second-f32.gguf"
        assert flag(child_args, "--parallel") == "1" and flag(child_args, "--host") == "127.0.0.1"

        # the front: a request naming the second reaches the router's child, the rest the resident
        child_port = int(flag(child_args, "--port"))
        before = (tokens_predicted(host, 8080), tokens_predicted(host, child_port))
        status, answer = front(host, "/v1/chat/completions", dict(CHAT, model="second"))
        assert status == 200, answer
        assert tokens_predicted(host, 8080) == before[0] and tokens_predicted(host, child_port) > before[1]
        status, answer = front(host, "/v1/chat/completions", CHAT)
        assert status == 200 and tokens_predicted(host, 8080) > before[0]
        # a GET that names it only in the header: the front adds ?model= the router reads
        # (without it the router answers for itself, "role": "router")
        status, answer = front(host, "/props", headers={"X-LLM-Model": "second"})
        assert status == 200 and answer.get("model_alias") == "second" and "role" not in answer, answer
        status, answer = front(host, "/props?autoload=false", headers={"X-LLM-Model": "second"})
        assert status == 200 and answer.get("model_alias") == "second", answer
        frontend = stage_fact(host, "frontend")
        assert frontend["server_backends"] == {"gpu0": "llama_server", "gpu0-second": "llama_server_second"}
        # Prometheus does not scrape a model loaded on demand (a scrape naming it would load it)
        assert all(t["labels"]["__metrics_path__"] != "/metrics/gpu0-second" for t in frontend["prometheus_targets"])

        # a preset the router refuses (an option llama-server does not know): the router fails its
        # gate, goes back to the drop-in and preset that last worked, and serves the model again
        (tmp_path / "bad").mkdir()
        bad = run_playbook("playbooks/llama_server.yml", [ONE_GPU], tmp_path=tmp_path / "bad", extra_vars=dict(
            ON_DEMAND, llama_server_router_preset_text="[second]\nno-such-option = 1"))
        assert bad.returncode != 0
        said = " ".join(bad.stdout.split())
        assert "rolled back to the drop-in and preset that last worked" in said, bad.stdout[-3000:]
        # the router exits on the option, and its gate says so at once instead of waiting out /health
        assert re.search(r"llama-server@0-router\.service exited with status [1-9]", said), bad.stdout[-3000:]
        assert "no-such-option" not in host.file(PRESET).content_string
        assert "tiny-second-f32.gguf" in host.file(PRESET).content_string
        assert host.service("llama-server@0-router").is_running
        status, answer = front(host, "/v1/chat/completions", dict(CHAT, model="second"))
        assert status == 200, answer
    finally:
        deploy(tmp_path / "one")
    assert not host.service("llama-server@0-router").is_running
    assert not host.file(ROUTER_DROPIN).exists and not host.file(PRESET).exists
    assert not host.socket("tcp://127.0.0.1:8180").is_listening
    assert "llama_server_second" not in host.file("/etc/haproxy/haproxy.cfg").content_string
    assert "routers" not in stage_fact(host, "model")
