"""dashboards/llm-fleet.json: current with its generator, and every metric a panel
queries is one that something of the fleet serves: the GPU exporter
(roles/gpu_exporter/files/gpu_exporter.py) or the pinned llama-server (its /metrics, recorded
from the build in tests/harness/recorded/)."""
import json
import re
import subprocess
import sys

from conftest import ROOT

sys.path[:0] = [str(ROOT / "roles" / "gpu_exporter" / "files"), str(ROOT / "module_utils")]
import gpu_exporter  # noqa: E402

DASHBOARD = ROOT / "dashboards" / "llm-fleet.json"
RECORDED = ROOT / "tests" / "harness" / "recorded" / "llama-server-metrics-0c1e57098bba.txt"
PROMQL_WORDS = {"sum", "by", "rate", "avg", "count", "or", "vector", "min", "instance", "e6"}


def served():
    names = set(gpu_exporter.HELP)
    names |= set(re.findall(r'"(llm_fleet_[a-z_]+)"', (ROOT / "roles" / "gpu_exporter" / "files" / "gpu_exporter.py").read_text()))
    names |= set(re.findall(r"^# TYPE (\S+) ", RECORDED.read_text(), re.M))
    return names


def test_the_dashboard_is_current():
    result = subprocess.run([sys.executable, str(ROOT / "scripts" / "grafana-dashboard.py"), "--check"],
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stdout


def test_every_queried_metric_is_served():
    dashboard = json.loads(DASHBOARD.read_text())
    exprs = [t["expr"] for p in dashboard["panels"] for t in p.get("targets", [])]
    assert len(exprs) >= 15
    known = served()
    assert "llamacpp:tokens_predicted_total" in known and "DCGM_FI_DEV_FB_USED" in known
    for expr in exprs:
        stripped = re.sub(r'\{[^}]*\}|\[[^]]*\]|"[^"]*"|\b\d+(\.\d+)?\b', " ", expr)
        for name in re.findall(r"[A-Za-z_:][A-Za-z0-9_:]*", stripped):
            assert name in known or name in PROMQL_WORDS, "%r queries %s, which nothing serves" % (expr, name)
    # the host variable filters on the exporter's Hostname label
    host = [v for v in dashboard["templating"]["list"] if v["name"] == "host"][0]
    assert "Hostname" in host["query"]["query"]
