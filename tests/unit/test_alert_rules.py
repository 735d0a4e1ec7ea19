"""The fleet's alert rules (roles/prometheus/templates/llm-fleet-alerts.yml.j2, rendered with the
role's defaults in dashboards/llm-fleet-alerts.yml): current with the template, valid for promtool
(`promtool check rules`), each alert firing and staying quiet where it should (`promtool test rules`
on tests/unit/promtool/llm-fleet-alerts-test.yml), every metric it reads served by the fleet, and
the role's Prometheus configuration, rendered by Ansible with the fleet scenario's values, valid for
`promtool check config` as the role checks it. promtool comes from Debian's prometheus package
(scripts/setup.sh installs it)."""
import json
import os
import re
import shutil
import subprocess
import sys

import yaml

from conftest import ROOT

sys.path[:0] = [str(ROOT / "roles" / "gpu_exporter" / "files"), str(ROOT / "module_utils")]
import gpu_exporter  # noqa: E402
import gpu_health  # noqa: E402

RULES = ROOT / "dashboards" / "llm-fleet-alerts.yml"
TESTS = ROOT / "tests" / "unit" / "promtool" / "llm-fleet-alerts-test.yml"
SCRIPT = ROOT / "scripts" / "alert-rules.py"
ROLE = ROOT / "roles" / "prometheus"
RECORDED = ROOT / "tests" / "harness" / "recorded" / "llama-server-metrics-0c1e57098bba.txt"
# what Prometheus has of its own, and HAProxy's built-in exporter (no recording of it here)
OTHER_METRICS = {"up", "haproxy_backend_active_servers"}
PROMQL_WORDS = {"or", "and", "unless", "on", "by", "group_left", "count", "min", "rate", "floor", "label_replace"}


def promtool(*args, cwd=None):
    """promtool's output; the test fails with all of it when promtool does."""
    path = shutil.which("promtool")
    assert path, ("promtool not found: it comes with Debian's prometheus package "
                  "(scripts/setup.sh installs it: apt-get install --no-install-recommends prometheus)")
    result = subprocess.run([path] + list(args), capture_output=True, text=True, timeout=300, cwd=cwd)
    assert result.returncode == 0, "promtool %s failed:\n%s%s" % (" ".join(args), result.stdout, result.stderr)
    return result.stdout + result.stderr


def rules(path=RULES):
    return [rule for group in yaml.safe_load(path.read_text())["groups"] for rule in group["rules"]]


def test_the_rendered_copy_is_current():
    result = subprocess.run([sys.executable, str(SCRIPT), "--check"], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


def test_promtool_accepts_the_rules():
    assert "SUCCESS: 12 rules found" in promtool("check", "rules", str(RULES))


def test_each_alert_fires_and_stays_quiet_where_it_should():
    promtool("test", "rules", str(TESTS))


def test_every_alert_is_tested_firing_and_quiet():
    firing, quiet = set(), set()
    for group in yaml.safe_load(TESTS.read_text())["tests"]:
        for case in group["alert_rule_test"]:
            (firing if case.get("exp_alerts") else quiet).add(case["alertname"])
    names = {rule["alert"] for rule in rules()}
    assert len(names) == 12
    assert firing == names, "never tested firing: %s" % sorted(names - firing)
    assert quiet == names, "never tested quiet: %s" % sorted(names - quiet)


def test_every_alert_says_how_long_how_bad_and_what_to_do():
    for rule in rules():
        assert re.match(r"^\d+[smh]$", rule["for"]), rule["alert"]
        assert rule["labels"] == {"severity": rule["labels"]["severity"]}
        assert rule["labels"]["severity"] in ("critical", "warning"), rule["alert"]
        assert set(rule["annotations"]) == {"summary", "description"}, rule["alert"]
        # the host (and the GPU, for a card's alert) in the summary
        assert re.search(r"\$labels\.(Hostname|host)", rule["annotations"]["summary"]), rule["alert"]


def test_the_gpu_rules_are_the_health_gate_s():
    by_name = dict((rule["alert"], rule) for rule in rules())
    xids = re.findall(r"DCGM_FI_DEV_XID_ERRORS == (\d+)", by_name["LlmFleetGpuXid"]["expr"])
    assert sorted(int(x) for x in xids) == sorted(gpu_health.SERIOUS_XIDS)
    assert ">= %d" % gpu_health.MAX_RETIRED_PAGES in by_name["LlmFleetGpuMemoryRepairFailed"]["expr"]


def served():
    names = set(gpu_exporter.HELP)
    names |= set(re.findall(r'"(llm_fleet_[a-z_]+)"', (ROOT / "roles" / "gpu_exporter" / "files" / "gpu_exporter.py").read_text()))
    names |= set(re.findall(r"^# TYPE (\S+) ", RECORDED.read_text(), re.M))
    return names | OTHER_METRICS


def test_every_metric_a_rule_reads_is_served():
    known = served()
    assert {"llm_fleet_gpu_expected_count", "llm_fleet_plan_decode_tokens_per_second",
            "llm_fleet_model_filesystem_avail_bytes", "llamacpp:tokens_predicted_seconds_total"} <= known
    for rule in rules():
        # without label matchers, ranges, strings, numbers and the label lists of by/on/group_left
        expr = re.sub(r'\{[^}]*\}|\[[^]]*\]|"[^"]*"|\b\d+(\.\d+)?\b', " ", rule["expr"])
        expr = re.sub(r"\b(by|on|group_left)\s*\([^)]*\)", r"\1", expr)
        for name in re.findall(r"[A-Za-z_:][A-Za-z0-9_:]*", expr):
            assert name in known or name in PROMQL_WORDS, "%s reads %s, which nothing serves" % (rule["alert"], name)


def test_other_durations_and_thresholds_render_and_pass(tmp_path):
    out = tmp_path / "alerts.yml"
    subprocess.run([sys.executable, str(SCRIPT), "--set", "prometheus_alert_down_for=2s",
                    "--set", "prometheus_alert_decode_min_ratio=0.25", "-o", str(out)], check=True, capture_output=True)
    promtool("check", "rules", str(out))
    by_name = dict((rule["alert"], rule) for rule in rules(out))
    assert by_name["LlmFleetInstanceDown"]["for"] == "2s"
    assert "0.25 * min by (host, gpu)" in by_name["LlmFleetDecodeSlow"]["expr"]
    assert "under 25% of" in by_name["LlmFleetDecodeSlow"]["annotations"]["description"]


def _fleet_vars():
    """The prometheus_* values the fleet scenario's converge sets."""
    play, = yaml.safe_load((ROOT / "molecule" / "fleet" / "converge.yml").read_text())
    return dict((k, v) for k, v in play["vars"].items() if k.startswith("prometheus_"))


def _render_config(tmp_path, extra):
    """The role's prometheus.yml and alert rules, rendered by Ansible's template module with
    the role's defaults and vars and `extra`, the config dir under tmp_path."""
    config_dir = tmp_path / "llm-fleet"
    config_dir.mkdir()
    for name in ("api-key", "fronts-ca.pem", "gpus.json", "llama-servers.json", "frontends.json"):
        (config_dir / name).write_text("[]\n" if name.endswith(".json") else "x\n")
    variables = dict(extra, prometheus_config_dir=str(config_dir), prometheus_front_groups=[{"suffix": "", "key": "test-key"}],
                     prometheus_front_certificates=["x"], ansible_python_interpreter=sys.executable)
    playbook = tmp_path / "render.yml"
    playbook.write_text(yaml.safe_dump([{
        "name": "Render the role's templates", "hosts": "localhost", "connection": "local", "gather_facts": False,
        "vars_files": [str(ROLE / "defaults" / "main.yml"), str(ROLE / "vars" / "main.yml")],
        "tasks": [{"name": "Render %s" % src, "ansible.builtin.template": {
            "src": str(ROLE / "templates" / src), "dest": str(dest), "mode": "0644"}}
            for src, dest in (("prometheus.yml.j2", tmp_path / "prometheus.yml"),
                              ("llm-fleet-alerts.yml.j2", config_dir / "alerts.yml"),
                              ("alertmanager.yml.j2", tmp_path / "alertmanager.yml"))],
    }]))
    env = dict(os.environ, ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"), ANSIBLE_NOCOLOR="1")
    result = subprocess.run([os.path.join(os.path.dirname(sys.executable), "ansible-playbook"), "-i", "localhost,",
                             str(playbook), "-e", json.dumps(variables)], capture_output=True, text=True, env=env,
                            cwd=str(ROOT), timeout=300)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return tmp_path / "prometheus.yml"


def test_the_fleet_s_configuration_passes_promtool_as_the_role_checks_it(tmp_path):
    fleet = _fleet_vars()
    assert fleet["prometheus_evaluation_interval"] == "2s" and fleet["prometheus_alert_down_for"] == "2s"
    config = _render_config(tmp_path, fleet)
    out = promtool("check", "config", str(config))
    assert "SUCCESS: 12 rules found" in out
    rendered = yaml.safe_load(config.read_text())
    assert rendered["global"] == {"scrape_interval": "2s", "evaluation_interval": "2s"}
    assert rendered["rule_files"] == [str(tmp_path / "llm-fleet" / "alerts.yml")]
    assert "alerting" not in rendered  # no webhook: no Alertmanager
    assert {rule["for"] for rule in rules(tmp_path / "llm-fleet" / "alerts.yml")} == {"2s", "15m"}


def test_a_webhook_points_prometheus_at_its_alertmanager(tmp_path):
    url = "https://hooks.example.internal/llm-fleet?token=abc"
    config = _render_config(tmp_path, {"prometheus_alertmanager_webhook_url": url})
    promtool("check", "config", str(config))
    rendered = yaml.safe_load(config.read_text())
    assert rendered["alerting"] == {"alertmanagers": [{"static_configs": [{"targets": ["127.0.0.1:9093"]}]}]}
    manager = yaml.safe_load((tmp_path / "alertmanager.yml").read_text())
    assert manager["receivers"] == [{"name": "llm-fleet-webhook",
                                     "webhook_configs": [{"url": url, "send_resolved": True}]}]
    assert manager["route"]["receiver"] == "llm-fleet-webhook"
    amtool = shutil.which("amtool")  # Debian's prometheus-alertmanager, where installed
    if amtool:
        result = subprocess.run([amtool, "check-config", str(tmp_path / "alertmanager.yml")],
                                capture_output=True, text=True)
        assert result.returncode == 0, result.stdout + result.stderr
