"""llama-server as a service after site.yml, checked from outside the role
(processes, systemd, HTTP) against the plan the model stage recorded; then the
stage's own playbook run again as an operator would (rerun, API key, a bad model,
a reboot). The simulated GPUs compute nothing: the CPU serves the tiny model."""
import json
import re
import shlex

import pytest

from hostprobe import node, only_in_scenario, run_playbook, stage_fact

ONE_GPU = "fleet-sxm2-32gb"
TWO_GPUS = "fleet-2x-sxm2-16gb"
# fleet_debian11 shares this directory.
pytestmark = only_in_scenario("fleet")


def http(host, port, path, body=None, key=None, address="127.0.0.1"):
    """(status, parsed JSON body) of a request made on the host itself."""
    script = (
        "import json,sys,urllib.request as u\n"
        "req=u.Request('http://%s:%d%s', data=%r, headers={'Content-Type':'application/json'})\n"
        "%s"
        "try:\n r=u.urlopen(req, timeout=120); print(json.dumps([r.status, json.load(r)]))\n"
        "except u.HTTPError as e:\n print(json.dumps([e.code, None]))\n"
        % (address, port, path, json.dumps(body).encode() if body is not None else None,
           "req.add_header('Authorization','Bearer %s')\n" % key if key else ""))
    out = host.check_output("python3 -c %s" % shlex.quote(script))
    return json.loads(out)


def main_pid(host, index):
    return int(host.check_output("systemctl show -P MainPID llama-server@%d.service" % index))


def cmdline(host, pid):
    return host.check_output("tr '\\0' '\\n' < /proc/%d/cmdline" % pid).splitlines()


def flag(args, name):
    return args[args.index(name) + 1]


@pytest.mark.parametrize("name,instances", [(ONE_GPU, 1), (TWO_GPUS, 2)])
def test_one_instance_per_gpu_runs_as_its_user(name, instances):
    host = node(name)
    plans = stage_fact(host, "model")["plans"]
    assert len(plans) == instances
    for plan in plans:
        unit = host.service("llama-server@%d.service" % plan["gpu_index"])
        assert unit.is_running and unit.is_enabled
        pid = main_pid(host, plan["gpu_index"])
        assert host.process.get(pid=pid).user == "llama"


@pytest.mark.parametrize("name", [ONE_GPU, TWO_GPUS])
def test_running_flags_match_the_plan(name):
    host = node(name)
    for plan in stage_fact(host, "model")["plans"]:
        pid = main_pid(host, plan["gpu_index"])
        args = cmdline(host, pid)
        assert flag(args, "--model") == plan["model_path"]
        assert int(flag(args, "--ctx-size")) == plan["ctx_size"]
        assert int(flag(args, "--parallel")) == plan["parallel"]
        assert flag(args, "--cache-type-k") == plan["cache_type_k"]
        assert flag(args, "--cache-type-v") == plan["cache_type_v"]
        assert int(flag(args, "--port")) == 8080 + plan["gpu_index"]
        assert flag(args, "--host") == "127.0.0.1"
        # The process's own environment needs CAP_SYS_PTRACE to read; systemd says what it set.
        environ = host.check_output("systemctl show -P Environment llama-server@%d.service" % plan["gpu_index"]).split()
        assert "CUDA_VISIBLE_DEVICES=%s" % plan["gpu_uuid"] in environ


@pytest.mark.parametrize("name", [ONE_GPU, TWO_GPUS])
def test_health_and_a_real_chat_completion(name):
    host = node(name)
    for plan in stage_fact(host, "model")["plans"]:
        port = 8080 + plan["gpu_index"]
        assert http(host, port, "/health") == [200, {"status": "ok"}]
        status, body = http(host, port, "/v1/chat/completions",
                            {"messages": [{"role": "user", "content": "Say hello"}], "max_tokens": 8})
        assert status == 200
        assert body["choices"][0]["message"]["content"] is not None
        assert body["usage"]["completion_tokens"] >= 1
        # check_output fails unless /metrics answers 200 (urlopen raises otherwise).
        metrics = host.check_output(
            "python3 -c \"import urllib.request as u; print(u.urlopen('http://127.0.0.1:%d/metrics').read().decode())\"" % port)
        assert "llamacpp:" in metrics


def test_unit_is_hardened_and_ordered_after_gpu_tuning():
    host = node(ONE_GPU)
    props = host.service("llama-server@0.service").systemd_properties
    assert props["NoNewPrivileges"] == "yes"
    assert props["ProtectSystem"] == "strict"
    assert props["PrivateTmp"] == "yes"
    assert host.check_output("systemctl show -P CapabilityBoundingSet llama-server@0.service") == ""
    assert props["DevicePolicy"] == "closed"
    assert "llm-fleet-gpu.target" in props["After"]
    exposure = float(stage_fact(host, "llama_server")["security_exposure"])
    assert exposure <= 3.0, "systemd-analyze security exposure %.1f" % exposure


def test_binding_beyond_loopback_needs_an_api_key(tmp_path):
    result = run_playbook("playbooks/llama_server.yml", [ONE_GPU], tmp_path=tmp_path,
                          extra_vars={"llama_server_host": "0.0.0.0"})
    assert result.returncode != 0
    assert "no llama_server_api_key is set" in " ".join(result.stdout.split())


def test_a_bad_model_fails_the_gate_at_once_and_the_previous_plan_serves_again(tmp_path):
    """A truncated model: llama-server exits, systemd would restart it forever, and the gate
    fails as soon as it sees the process end, not after the health timeout (an hour here)."""
    host = node(ONE_GPU)
    plans = stage_fact(host, "model")["plans"]
    host.run_expect([0], "head -c 100000 %s > /var/lib/llm-fleet/models/broken.gguf" % plans[0]["model_path"])
    bad = [dict(plans[0], model_path="/var/lib/llm-fleet/models/broken.gguf")]
    result = run_playbook("playbooks/llama_server.yml", [ONE_GPU], tmp_path=tmp_path,
                          extra_vars={"llama_server_plans": bad, "llama_server_health_timeout_base": 3600})
    out = " ".join(result.stdout.split())
    assert result.returncode != 0
    assert "rolled back to the last plan that worked" in out
    waited = re.search(r"llama-server@0\.service exited with status (\d+) .*? was awaited, after (\d+) s", out)
    assert waited and int(waited.group(1)) != 0 and int(waited.group(2)) < 60, out[-3000:]
    assert flag(cmdline(host, main_pid(host, 0)), "--model") == plans[0]["model_path"]
    assert http(host, 8080, "/health")[0] == 200


@pytest.mark.day_two
def test_an_api_key_and_an_interrupted_rollout_finished_by_the_next_run(tmp_path):
    """Plan A: listen on :: (every address, so the key is required) with an API key and an
    alias systemd would expand; the key is enforced and never logged. Then an interrupted
    rollout of plan B (the defaults: loopback, no key): a run killed between writing a
    drop-in and restarting used to leave the old process serving while the next run saw
    nothing to do (the drop-in already said the new plan). Reproduced exactly: plan B's
    drop-in in place without a restart; the next run of plan B must restart and gate."""
    host = node(ONE_GPU)
    dropin = "/etc/systemd/system/llama-server@0.service.d/plan.conf"
    saved = host.check_output("cat %s" % dropin)          # plan B: what the role renders by default
    alias = 'tiny "50%" $HOME %i \\ it\'s'
    secret = "test-key-5f1e"
    result = run_playbook("playbooks/llama_server.yml", [ONE_GPU], tmp_path=tmp_path,
                          extra_vars={"llama_server_host": "::", "llama_server_alias": alias,
                                      "llama_server_api_key": secret})
    assert result.returncode == 0, result.stdout[-3000:]
    assert secret not in result.stdout
    key_file = host.file("/etc/llm-fleet/llama-server/api-key")
    assert key_file.mode == 0o640 and key_file.user == "root" and key_file.group == "llama"
    args = cmdline(host, main_pid(host, 0))
    assert flag(args, "--host") == "::" and flag(args, "--alias") == alias
    body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    assert http(host, 8080, "/v1/chat/completions", body, address="[::1]")[0] == 401
    assert http(host, 8080, "/v1/chat/completions", body, key=secret, address="[::1]")[0] == 200
    status, models = http(host, 8080, "/v1/models", key=secret, address="[::1]")
    assert status == 200 and models["data"][0]["id"] == alias
    pid_a = main_pid(host, 0)

    # What an interrupted run of plan B leaves: its key file removed and drop-in written,
    # systemd reloaded, no restart.
    host.run_expect([0], "printf '%%s\\n' %s > %s && rm /etc/llm-fleet/llama-server/api-key && "
                    "systemctl daemon-reload" % (shlex.quote(saved), dropin))
    assert main_pid(host, 0) == pid_a
    result = run_playbook("playbooks/llama_server.yml", [ONE_GPU], tmp_path=tmp_path)
    assert result.returncode == 0, result.stdout[-3000:]
    # The drop-in and key were already plan B's: only the serving record can tell the role to restart.
    # (the timer callbacks print a line between a task's header and its result)
    written = re.search(r"TASK \[llama_server : Write the plan into the unit of GPU 0\].*?^(ok|changed|skipping):",
                        result.stdout, re.S | re.M)
    assert written and written.group(1) == "ok", result.stdout[-3000:]
    assert main_pid(host, 0) != pid_a, "the instance still runs the plan the interrupted run replaced"
    assert flag(cmdline(host, main_pid(host, 0)), "--host") == "127.0.0.1"
    assert not host.file("/etc/llm-fleet/llama-server/api-key").exists
    assert http(host, 8080, "/v1/chat/completions", body)[0] == 200


# The instances come back after a reboot: test_frontend.py's driver reboot of the
# two-GPU host (nvidia_stack drains the front, reboots; the units start at boot).
