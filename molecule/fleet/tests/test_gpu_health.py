"""The GPU health gate of the llama_server stage, on the two-GPU host: its second card
gets an uncorrectable ECC error and a process of another program holding 14 GiB (the
mock NVML's volatile state, as the real driver would report them); the stage drains and
stops that card's instance, keeps the other serving, and says why. After a GPU reset
(the counters cleared) and the process gone, the next run brings the instance back."""
import shlex

from hostprobe import node, only_in_scenario, run_playbook, stage_fact
from test_llama_server import TWO_GPUS, http

pytestmark = only_in_scenario("fleet")

STATE = "/run/mock-nvml/state"
GIB = 1 << 30


def set_gpu_state(host, lines):
    """Append keys to the mock's volatile GPU state under its lock (NVML writers share it)."""
    text = "".join("%s\n" % line for line in lines)
    host.run_expect([0], "mkdir -p /run/mock-nvml && flock /run/mock-nvml/.lock sh -c %s"
                    % shlex.quote("printf %%s %s >> %s" % (shlex.quote(text), STATE)))


def drop_gpu_state(host, uuid):
    host.run_expect([0], "flock /run/mock-nvml/.lock sed -i '/^%s\\./d' %s" % (uuid, STATE))


def test_a_sick_gpu_keeps_its_instance_off_until_it_is_healthy(tmp_path):
    host = node(TWO_GPUS)
    plans = sorted(stage_fact(host, "model")["plans"], key=lambda p: p["gpu_index"])
    assert [p["gpu_index"] for p in plans] == [0, 1]
    sick = plans[1]["gpu_uuid"]
    squatter = int(host.check_output("nohup sleep 900 >/dev/null 2>&1 & echo $!"))
    try:
        set_gpu_state(host, ["%s.ecc_uncorrected_volatile=2" % sick,
                             "%s.processes=%d:%d" % (sick, squatter, 14 * GIB)])
        result = run_playbook("playbooks/llama_server.yml", [TWO_GPUS], tmp_path=tmp_path)
        assert result.returncode == 0, result.stdout[-3000:]
        out = " ".join(result.stdout.split())
        assert "2 uncorrectable ECC error(s) since boot" in out
        assert "PID %d (sleep) holds 14336 MiB of GPU memory" % squatter in out
        assert "Drain from the front (requests in flight finish) the instance of GPU 1" in out

        # the sick card's instance is stopped and stays off at boot; the healthy one serves
        assert not host.service("llama-server@1.service").is_running
        assert not host.service("llama-server@1.service").is_enabled
        assert not host.socket("tcp://127.0.0.1:8081").is_listening
        assert http(host, 8080, "/health")[0] == 200
        fact = stage_fact(host, "llama_server")
        assert [i["gpu_index"] for i in fact["instances"]] == [0]
        assert [(h["gpu_index"], [p["check"] for p in h["problems"]]) for h in fact["held"]] == \
            [(1, ["ecc_uncorrectable", "foreign_process"])]
        assert "GPU 1 HELD: ecc_uncorrectable, foreign_process" in fact["summary"]
    finally:
        host.run("kill %d" % squatter)
        drop_gpu_state(host, sick)  # what `nvidia-smi -r` (a GPU reset) does to the volatile counts

    result = run_playbook("playbooks/llama_server.yml", [TWO_GPUS], tmp_path=tmp_path)
    assert result.returncode == 0, result.stdout[-3000:]
    assert host.service("llama-server@1.service").is_running
    assert host.service("llama-server@1.service").is_enabled
    assert http(host, 8081, "/health")[0] == 200
    fact = stage_fact(host, "llama_server")
    assert [i["gpu_index"] for i in fact["instances"]] == [0, 1] and fact["held"] == []
