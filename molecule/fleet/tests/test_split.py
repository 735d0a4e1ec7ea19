"""One model over both cards of the two-GPU host (issue 18), deployed by the model
and llama_server stages as an operator would: the policy asks for one instance
over the cards (prefer_split, layer split: a tensor split needs real GPUs, and the
simulated ones compute nothing, so the CPU serves) and samples in the model's graph
(backend_sampling, the throughput objective's default: forced here, since a
throughput plan would spend the simulated cards on slots the CPU then allocates), then
the default policy brings back one instance per GPU. What the CPU backend can show is checked: the plan, the
flags, the GPUs the unit sees and may open, the placement, and that it answers.
First, the GPU health gate on the same host: a sick second card keeps its instance
off and is re-admitted after a clean soak, a lost card is held, and a program's memory
is planned around (the split deploy is then the run after the card is healthy again)."""
import os
import re
import shlex
import time

import pytest

from hostprobe import node, only_in_scenario, run_playbook, stage_fact
from test_gpu_health import scrape
from test_prometheus import one
from test_prometheus import wait_for as wait_for_sample
from test_llama_server import TWO_GPUS, cmdline, flag, http, main_pid

pytestmark = [only_in_scenario("fleet"), pytest.mark.day_two]

# The harness policy (tests/harness/group_vars/all.yml) and one instance over both cards.
SPLIT_POLICY = {"min_ctx": 512, "target_ctx": 2048, "target_parallel": 2, "prefer_split": True,
                "split_modes": ["layer"], "backend_sampling": True}
STAGES = ("playbooks/model.yml", "playbooks/llama_server.yml")
DROPIN = "/etc/systemd/system/llama-server@0.service.d/plan.conf"
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))


def deploy(tmp_path, extra_vars=None, stages=STAGES):
    """The stages' own playbooks in one run (site.yml imports them the same way)."""
    playbook = tmp_path / "stages.yml"
    playbook.write_text("".join("- import_playbook: %s/%s\n" % (REPO, stage) for stage in stages))
    result = run_playbook(str(playbook), [TWO_GPUS], tmp_path=tmp_path, extra_vars=extra_vars)
    assert result.returncode == 0, result.stdout[-3000:]
    return result


STATE = "/run/mock-nvml/state"
XID_JOURNAL = "/run/llm-fleet-gpu-exporter/xid-events.jsonl"
GIB = 1 << 30


def set_gpu_state(host, lines):
    """Append keys to the mock's volatile GPU state under its lock (NVML writers share it)."""
    text = "".join("%s\n" % line for line in lines)
    host.run_expect([0], "mkdir -p /run/mock-nvml && flock /run/mock-nvml/.lock sh -c %s"
                    % shlex.quote("printf %%s %s >> %s" % (shlex.quote(text), STATE)))


def drop_gpu_state(host, uuid, names):
    """Remove those keys of one card (the rest of its state, persistence and clocks, stays)."""
    pattern = "\\|".join("%s\\.%s=" % (uuid, name) for name in names)
    host.run_expect([0], "flock /run/mock-nvml/.lock sed -i '/^\\(%s\\)/d' %s" % (pattern, STATE))


def wait_for(host, command, what, tries=50):
    for _ in range(tries):
        if host.run(command).rc == 0:
            return
        time.sleep(0.2)
    raise AssertionError("%s: `%s` never succeeded" % (what, command))


def test_a_sick_second_card_keeps_its_instance_off(tmp_path):
    """The GPU health gate (issue 16): the second card gets an uncorrectable ECC error, an
    Xid 48 that the driver raises (NVML's event API: the GPU exporter hears it and keeps it
    in its journal) and a process of another program holding 14 GiB (the mock NVML's
    volatile state, as the real driver reports them); the llama_server stage drains and
    stops that card's instance, keeps the other serving, says why, and the GPU exporter
    shows the same. The process gone, the counts stay (until a reset): a run with an hour's
    soak keeps the card held and says how long is left, a run with a soak of 1 s re-admits
    it (issue 29: its instance serves again, the counts it accepted recorded, the exporter
    agrees). Then the card is reset (counters cleared, its Xid lines deleted as the message
    says): the split deploy below is the next run, and its instance must use both cards
    again (first test of this file for CI time: one run less)."""
    host = node(TWO_GPUS)
    plans = sorted(stage_fact(host, "model")["plans"], key=lambda p: p["gpu_index"])
    assert [p["gpu_index"] for p in plans] == [0, 1]
    sick = plans[1]["gpu_uuid"]
    squatter = int(host.check_output("nohup sleep 900 >/dev/null 2>&1 & echo $!"))
    try:
        set_gpu_state(host, ["%s.ecc_uncorrected_volatile=2" % sick,
                             "%s.processes=%d:%d" % (sick, squatter, 14 * GIB)])
        host.run_expect([0], "echo '%s 48' >> /run/mock-nvml/xid_events" % sick)
        wait_for(host, "grep -q '\"xid\": 48' %s" % XID_JOURNAL, "the exporter journals the Xid")
        result = run_playbook("playbooks/llama_server.yml", [TWO_GPUS], tmp_path=tmp_path)
        assert result.returncode == 0, result.stdout[-3000:]
        out = " ".join(result.stdout.split())
        assert "2 uncorrectable ECC error(s) since boot" in out
        assert "Xid 48 (a double-bit ECC error) at " in out
        assert "PID %d (sleep) holds 14336 MiB of GPU memory" % squatter in out
        assert "Drain from the front (requests in flight finish) the instance of GPU 1" in out
        assert re.search(r"GPU 1 held at [-0-9: ]+ UTC: re-admitted by a run after [-0-9: ]+ UTC if no new ECC error, "
                         r"Xid or pending retirement comes \(soak 86400 s\)", out), out[-3000:]

        # the sick card's instance is stopped and stays off at boot; the healthy one serves
        assert not host.service("llama-server@1.service").is_running
        assert not host.service("llama-server@1.service").is_enabled
        assert not host.socket("tcp://127.0.0.1:8081").is_listening
        assert http(host, 8080, "/health")[0] == 200
        fact = stage_fact(host, "llama_server")
        assert [i["gpu_index"] for i in fact["instances"]] == [0]
        assert [(h["gpu_index"], [p["check"] for p in h["problems"]]) for h in fact["held"]] == \
            [(1, ["ecc_uncorrectable", "xid", "foreign_process"])]
        assert "GPU 1 HELD: ecc_uncorrectable, xid, foreign_process" in fact["summary"]
        # the exporter sees the same card (read at each scrape)
        metrics = scrape(host)
        assert metrics["DCGM_FI_DEV_ECC_DBE_VOL_TOTAL"]["1"][1] == 2
        assert metrics["DCGM_FI_DEV_XID_ERRORS"]["1"][1] == 48 and metrics["DCGM_FI_DEV_XID_ERRORS"]["0"][1] == 0
        assert metrics["llm_fleet_gpu_healthy"]["1"][1] == 0 and metrics["llm_fleet_gpu_healthy"]["0"][1] == 1
        labels, held = metrics["llm_fleet_gpu_process_memory_bytes"]["1"]
        assert (labels["pid"], labels["process"], held) == (str(squatter), "sleep", 14 * GIB)
        # and the fleet's Prometheus (test_prometheus.py) stores it: the verdict, the Xid, the instance down
        wait_for_sample("Prometheus stores GPU 1's verdict", lambda: one(host, 'llm_fleet_gpu_healthy{gpu="1"}') == 0)
        assert one(host, 'DCGM_FI_DEV_XID_ERRORS{gpu="1"}') == 48
        wait_for_sample("Prometheus finds GPU 1's instance down", lambda: one(
            host, 'up{job="llm-fleet-llama-server",host="%s",gpu="1"}' % TWO_GPUS) == 0)
        assert one(host, 'up{job="llm-fleet-llama-server",host="%s",gpu="0"}' % TWO_GPUS) == 1

        # re-admission: the process is gone, the ECC count and the Xid stay until a reset
        host.run("kill %d" % squatter)
        drop_gpu_state(host, sick, ["processes"])
        result = run_playbook("playbooks/llama_server.yml", [TWO_GPUS], tmp_path=tmp_path,
                              extra_vars={"llama_server_gpu_readmit_soak_s": 3600})
        assert result.returncode == 0, result.stdout[-3000:]
        out = " ".join(result.stdout.split())
        assert re.search(r"GPU 1 held: clean for \d+ s of the 3600 s soak; re-admitted by a run after ", out), out[-3000:]
        assert not host.service("llama-server@1.service").is_running
        fact = stage_fact(host, "llama_server")
        (held,) = fact["held"]
        assert [p["check"] for p in held["problems"]] == ["ecc_uncorrectable", "xid"]
        (card,) = held["cards"]
        assert card["counters"]["ecc_uncorrected_volatile"] == 2 and card["counters"]["xid"] == 48
        assert card["held_since"] == card["last_change"] and fact["readmitted"] == []

        result = run_playbook("playbooks/llama_server.yml", [TWO_GPUS], tmp_path=tmp_path,
                              extra_vars={"llama_server_gpu_readmit_soak_s": 1})
        assert result.returncode == 0, result.stdout[-3000:]
        out = " ".join(result.stdout.split())
        assert "GPU 1 re-admitted: no new ECC error, Xid or pending retirement for " in out
        assert "since it was held at " in out and "(soak 1 s)" in out
        assert host.service("llama-server@1.service").is_running and host.service("llama-server@1.service").is_enabled
        assert http(host, 8081, "/health")[0] == 200
        fact = stage_fact(host, "llama_server")
        assert fact["held"] == [] and sorted(i["gpu_index"] for i in fact["instances"]) == [0, 1]
        (readmitted,) = fact["readmitted"]
        assert (readmitted["gpu_index"], readmitted["accepted"], readmitted["held_since"]) == \
            (1, card["counters"], card["held_since"])
        assert "GPU 1 re-admitted" in fact["summary"]
        # the exporter judges it against the counts accepted (read at each scrape); the raw figures stay
        metrics = scrape(host)
        assert metrics["llm_fleet_gpu_healthy"]["1"][1] == 1 and metrics["DCGM_FI_DEV_ECC_DBE_VOL_TOTAL"]["1"][1] == 2
    finally:
        host.run("kill %d" % squatter)
        # what `nvidia-smi -r` (a GPU reset) does to the volatile counts; the process is gone
        drop_gpu_state(host, sick, ["ecc_uncorrected_volatile", "processes"])
        host.run_expect([0], "sed -i '/%s/d' %s" % (sick, XID_JOURNAL))
    assert "%s.ecc_uncorrected_volatile" % sick not in host.file(STATE).content_string
    assert "%s.persistence_mode=1" % sick in host.file(STATE).content_string  # what gpu_tuning set stays


def test_a_card_fallen_off_the_bus_is_held_and_the_other_serves(tmp_path):
    """Xid 79: the driver can no longer reach the second card (NVML counts it but answers
    GPU_IS_LOST, the mock's "<uuid>.lost=1"). The facts read the first card as usual and
    list the second apart; its instance is held (stopped, not enabled), GPU 0 serves, the
    exporter and Prometheus say which card is lost. A reboot brings a sound card back: the
    split deploy below is the next run (the key removed, as a reboot clears it)."""
    host = node(TWO_GPUS)
    plans = sorted(stage_fact(host, "model")["plans"], key=lambda p: p["gpu_index"])
    lost = plans[1]["gpu_uuid"]
    try:
        host.run_expect([0], "echo '%s 79' >> /run/mock-nvml/xid_events" % lost)
        wait_for(host, "grep -q '\"xid\": 79' %s" % XID_JOURNAL, "the exporter journals Xid 79")
        set_gpu_state(host, ["%s.lost=1" % lost])
        result = run_playbook("playbooks/llama_server.yml", [TWO_GPUS], tmp_path=tmp_path)
        assert result.returncode == 0, result.stdout[-3000:]
        assert "counts GPU 1 that it cannot reach (GPU is lost)" in " ".join(result.stdout.split())
        assert not host.service("llama-server@1.service").is_running
        assert http(host, 8080, "/health")[0] == 200
        fact = stage_fact(host, "llama_server")
        assert [(h["gpu_index"], [p["check"] for p in h["problems"]]) for h in fact["held"]] == [(1, ["gpu_lost"])]
        assert scrape(host)["llm_fleet_gpu_lost"]["1"][1] == 1
        wait_for_sample("Prometheus stores the lost card", lambda: one(host, 'llm_fleet_gpu_lost{gpu="1"}') == 1)
    finally:
        # what the reboot of a sound card clears: the lost state and the Xids since boot
        drop_gpu_state(host, lost, ["lost"])
        host.run_expect([0], "sed -i '/%s/d' %s" % (lost, XID_JOURNAL))


def test_a_process_of_another_program_is_planned_around_then_held_when_it_grows(tmp_path):
    """Foreign-process policy plan_around: a program holding 14 GiB of the second card is
    budgeted as taken by the model stage (the plan's memory says so and the card's plan
    is made in what is left), its instance serves beside it; when the program grows past
    what the plan left it, the llama_server stage holds the card and says to plan again.
    The process gone and the default policy back, the split deploy below plans both whole
    cards again."""
    host = node(TWO_GPUS)
    other = sorted(stage_fact(host, "model")["plans"], key=lambda p: p["gpu_index"])[1]["gpu_uuid"]
    squatter = int(host.check_output("nohup sleep 900 >/dev/null 2>&1 & echo $!"))
    around = {"llm_fleet_foreign_gpu_processes": "plan_around"}
    try:
        set_gpu_state(host, ["%s.processes=%d:%d" % (other, squatter, 14 * GIB)])
        out = " ".join(deploy(tmp_path, around).stdout.split())
        assert "GPU 1: planned around 14.00 GiB that other processes hold" in out
        plans = sorted(stage_fact(host, "model")["plans"], key=lambda p: p["gpu_index"])
        assert [p["memory"]["foreign_bytes"] for p in plans] == [0, 14 * GIB]
        assert plans[1]["memory"]["predicted_used_bytes"] <= plans[1]["memory"]["gpu_total_bytes"]
        # it serves beside the program, which is named but not held against it
        assert "PID %d (sleep) holds 14336 MiB of GPU memory, which the plan leaves to it" % squatter in out
        assert stage_fact(host, "llama_server")["held"] == []
        assert http(host, 8081, "/health")[0] == 200

        drop_gpu_state(host, other, ["processes"])
        set_gpu_state(host, ["%s.processes=%d:%d" % (other, squatter, 15 * GIB)])
        result = run_playbook("playbooks/llama_server.yml", [TWO_GPUS], tmp_path=tmp_path, extra_vars=around)
        assert result.returncode == 0, result.stdout[-3000:]
        out = " ".join(result.stdout.split())
        assert "other processes hold 15360 MiB of GPU memory (PID %d (sleep) 15360 MiB) and the plan left them " \
               "14336 MiB" % squatter in out
        assert [(h["gpu_index"], [p["check"] for p in h["problems"]])
                for h in stage_fact(host, "llama_server")["held"]] == [(1, ["foreign_process_grew"])]
        assert not host.service("llama-server@1.service").is_running
        assert http(host, 8080, "/health")[0] == 200
    finally:
        host.run("kill %d" % squatter)
        drop_gpu_state(host, other, ["processes"])


@pytest.fixture(scope="module")
def host(tmp_path_factory):
    deploy(tmp_path_factory.mktemp("split"), {"llm_model_policy": SPLIT_POLICY}, STAGES + ("playbooks/verify.yml",))
    return node(TWO_GPUS)


def test_the_plan_is_one_instance_over_both_cards(host):
    plan, = stage_fact(host, "model")["plans"]
    assert plan["split_mode"] == "layer" and plan["gpu_indices"] == [0, 1]
    assert plan["tensor_split"] == [0.5, 0.5]
    assert "policy.prefer_split" in plan["reason"]
    nvml_uuids = host.check_output("nvidia-smi --query-gpu=uuid --format=csv,noheader").split()
    assert plan["gpu_uuids"] == nvml_uuids
    shares = plan["memory"]["per_gpu"]
    assert [s["gpu_index"] for s in shares] == [0, 1]
    assert all(s["total_bytes"] <= s["gpu_total_bytes"] for s in shares)
    # as llama.cpp assigns them: both layers of the tiny model on the first card, the output on the second
    assert all(s["weights_bytes"] > 0 for s in shares)
    fact = stage_fact(host, "llama_server")
    instance, = fact["instances"]
    assert instance["gpu_indices"] == [0, 1] and instance["split_mode"] == "layer"
    # the second card, sick in the first test, passes its health check again
    assert fact["held"] == []


def test_it_runs_with_the_split_flags_and_sees_both_cards(host):
    plan, = stage_fact(host, "model")["plans"]
    args = cmdline(host, main_pid(host, 0))
    assert flag(args, "--split-mode") == "layer" and flag(args, "--tensor-split") == "0.5,0.5"
    assert plan["backend_sampling"] is True and "--backend-sampling" in args
    environ = host.check_output("systemctl show -P Environment llama-server@0.service").split()
    assert "CUDA_VISIBLE_DEVICES=%s" % ",".join(plan["gpu_uuids"]) in environ
    dropin = host.file(DROPIN).content_string
    assert "DeviceAllow=/dev/nvidia0 rw" in dropin and "DeviceAllow=/dev/nvidia1 rw" in dropin
    allowed = host.check_output("systemctl show -P DeviceAllow llama-server@0.service")
    assert "/dev/nvidia0 rw" in allowed and "/dev/nvidia1 rw" in allowed
    # the profile puts the cards on NUMA nodes 0 and 1: nothing is pinned
    assert "NUMAPolicy" not in dropin and "CPUAffinity" not in dropin


def test_the_second_card_has_no_instance_of_its_own(host):
    unit = host.service("llama-server@1.service")
    assert not unit.is_running and not unit.is_enabled
    assert not host.socket("tcp://127.0.0.1:8081").is_listening


def test_the_split_instance_answers(host):
    assert http(host, 8080, "/health") == [200, {"status": "ok"}]
    status, body = http(host, 8080, "/v1/chat/completions",
                        {"messages": [{"role": "user", "content": "Say hello"}], "max_tokens": 8})
    assert status == 200 and body["usage"]["completion_tokens"] >= 1


def test_verify_measures_the_split_card_by_card(host):
    record = stage_fact(host, "verify")
    instance, = record["instances"]
    assert instance["gpu_indices"] == [0, 1] and instance["split_mode"] == "layer"
    assert instance["ok"] and instance["single_stream_tps"] > 0
    assert [c["gpu_index"] for c in instance["vram"]["per_gpu"]] == [0, 1]
    # not one card's efficiency (and the CPU build's figures would be refused anyway)
    assert record["calibration"] == [] and "layer split over GPUs 0,1" in record["not_calibrated"][0]


# (A rerun of the split changing nothing is the idempotence step's check of the same
# fingerprint logic; left out here for CI time.)


def test_the_default_policy_brings_back_one_instance_per_gpu(host, tmp_path):
    deploy(tmp_path)
    plans = stage_fact(host, "model")["plans"]
    assert [(p["gpu_indices"], p["split_mode"]) for p in plans] == [([0], "none"), ([1], "none")]
    for index in (0, 1):
        assert host.service("llama-server@%d.service" % index).is_running
        assert http(host, 8080 + index, "/health")[0] == 200
        args = cmdline(host, main_pid(host, index))
        assert "--split-mode" not in args and "--backend-sampling" not in args
