"""Two models on one card (issue 35), deployed by the stages' own playbooks as an operator
would: llm_model_models names the harness' tiny model and a second, smaller one
(scripts/setup.sh writes both into the model mirror), on the 32 GB host's one card. The
model stage places both on GPU 0, each planned in what the other leaves it; the
llama_server stage runs llama-server@0 (the first model, on the one-model port) and
llama-server@0-second (base port + 100); the front sends a request to the model its body
or its X-LLM-Model header names (each instance's own token counter says which served it);
verify measures both. Then the one-model inventory again: the second model's instance, its
drop-in and its backend are gone."""
import json
import os

import pytest

from hostprobe import node, only_in_scenario, run_playbook, stage_fact
from test_frontend import CHAT, front, tokens_predicted
from test_llama_server import ONE_GPU, cmdline, flag

pytestmark = [only_in_scenario("fleet"), pytest.mark.day_two]

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
MODELS = os.path.join(REPO, ".cache", "harness", "models")
STAGES = ("playbooks/model.yml", "playbooks/llama_server.yml", "playbooks/frontend.yml", "playbooks/verify.yml")
SECOND_DROPIN = "/etc/systemd/system/llama-server@0-second.service.d"


def _entry(name):
    with open(os.path.join(MODELS, name + ".sha256")) as handle:
        return {"quant": "F32", "url": "file:///srv/models/" + name, "sha256": handle.read().strip()}


TWO_MODELS = {
    "llm_model_catalogue": [],
    "llm_model_models": [
        {"name": "tiny-test", "catalogue": [_entry("tiny-f32.gguf")],
         "policy": {"min_ctx": 512, "target_ctx": 2048, "target_parallel": 2}},
        {"name": "second", "catalogue": [_entry("tiny-second-f32.gguf")],
         "policy": {"min_ctx": 512, "target_ctx": 1024, "target_parallel": 1}},
    ],
}


def deploy(tmp_path, extra_vars=None):
    tmp_path.mkdir(parents=True, exist_ok=True)
    playbook = tmp_path / "stages.yml"
    playbook.write_text("".join("- import_playbook: %s/%s\n" % (REPO, stage) for stage in STAGES))
    result = run_playbook(str(playbook), [ONE_GPU], tmp_path=tmp_path, extra_vars=extra_vars)
    assert result.returncode == 0, result.stdout[-3000:]
    return result


def main_pid(host, instance):
    return int(host.check_output("systemctl show -P MainPID llama-server@%s.service" % instance))


def served_by(host, body=None, headers=None):
    """Which instance's own counter moved for one request through the front (8080 or 8180)."""
    before = dict((port, tokens_predicted(host, port)) for port in (8080, 8180))
    status, answer = front(host, "/v1/chat/completions", dict(CHAT, **(body or {})), headers=headers)
    assert status == 200, answer
    moved = [port for port in (8080, 8180) if tokens_predicted(host, port) > before[port]]
    assert len(moved) == 1, "counters before %s, moved on %s" % (before, moved)
    return moved[0]


def test_two_models_share_one_card_and_the_front_routes_by_model(tmp_path):
    host = node(ONE_GPU)
    try:
        deploy(tmp_path / "two", TWO_MODELS)

        model = stage_fact(host, "model")
        plans = dict((p["model_name"], p) for p in model["plans"])
        assert sorted(plans) == ["second", "tiny-test"], model["summary"]
        assert model["placement"] == {"0": ["tiny-test", "second"]}
        for name, other in (("tiny-test", "second"), ("second", "tiny-test")):
            plan = plans[name]
            assert plan["gpu_index"] == 0
            # the other model's instance is counted on the card, and the reason says so
            assert plan["memory"]["other_models_bytes"] > 0, plan["memory"]
            assert "Shares GPU 0 with %s" % other in plan["reason"]
        assert plans["tiny-test"]["instance"] == "0" and plans["second"]["instance"] == "0-second"
        assert plans["second"]["ctx_size"] <= 1024 < plans["tiny-test"]["ctx_size"]

        # two processes, each with its own model, port, name and slots
        for instance, port, gguf, parallel in (("0", 8080, "tiny-f32.gguf", 2), ("0-second", 8180,
                                                                                 "tiny-second-f32.gguf", 1)):
            assert host.service("llama-server@%s" % instance).is_running
            assert host.service("llama-server@%s" % instance).is_enabled
            args = cmdline(host, main_pid(host, instance))
            assert os.path.basename(flag(args, "--model")) == gguf
            assert int(flag(args, "--port")) == port
            assert int(flag(args, "--parallel")) == parallel
        assert flag(cmdline(host, main_pid(host, "0-second")), "--alias") == "second"
        assert flag(cmdline(host, main_pid(host, "0")), "--alias") == "tiny-test"
        assert main_pid(host, "0") != main_pid(host, "0-second")

        # the front: the body's model, the header, and no model (the first model's)
        assert served_by(host, {"model": "second"}) == 8180
        assert served_by(host, {"model": "tiny-test"}) == 8080
        assert served_by(host) == 8080
        assert served_by(host, {"model": "not-served-here"}) == 8080
        assert served_by(host, headers={"X-LLM-Model": "second"}) == 8180
        status, listed = front(host, "/v1/models")
        assert status == 200

        # the front's fact names each server's backend (the runtime API drains through it)
        frontend = stage_fact(host, "frontend")
        assert frontend["server_backends"] == {"gpu0": "llama_server", "gpu0-second": "llama_server_second"}
        assert [m["name"] for m in frontend["models"]] == ["tiny-test", "second"]

        # verify measured both, a row per model and card
        verify = stage_fact(host, "verify")
        measured = dict((i["model_name"], i) for i in verify["instances"])
        assert sorted(measured) == ["second", "tiny-test"], verify["summary"]
        assert measured["second"]["port"] == 8180 and measured["second"]["single_stream_tps"] > 0
        assert "GPU 0 second :8180" in verify["summary"]
    finally:
        # the one-model inventory again: the second model's instance is retired
        deploy(tmp_path / "one")
    assert not host.service("llama-server@0-second").is_running
    assert not host.file(SECOND_DROPIN).exists
    assert not host.socket("tcp://127.0.0.1:8180").is_listening
    assert "llama_server_second" not in host.file("/etc/haproxy/haproxy.cfg").content_string
    model = stage_fact(host, "model")
    assert [p["instance"] for p in model["plans"]] == ["0"]
    assert "other_models_bytes" not in model["plans"][0]["memory"]
    assert json.dumps(stage_fact(host, "llama_server")["instances"]).count("llama-server@") == 1
