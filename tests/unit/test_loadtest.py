"""The verify stage's load-test script (roles/verify/files/llm_fleet_loadtest.py),
against a real llama-server: a CPU build of llama.cpp (the llama_cpp scenario's
artifact, or LLM_FLEET_LLAMA_BIN_DIR) serving tests/harness/tiny_model.py's model
on 127.0.0.1. Skips, saying why, when no build is at hand."""
import ast
import glob
import importlib.util
import json
import os
import socket
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "roles" / "verify" / "files" / "llm_fleet_loadtest.py"
ARTIFACT_GLOBS = [".cache/harness/llama_cpp-molecule/artifacts/*.tar.gz", ".cache/harness/*/artifacts/*.tar.gz"]


def load_script():
    spec = importlib.util.spec_from_file_location("llm_fleet_loadtest", str(SCRIPT))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


lt = load_script()


# --- a real llama-server -----------------------------------------------------------

def _usable(bin_dir):
    server = Path(bin_dir) / "llama-server"
    if not server.is_file():
        return "no llama-server in %s" % bin_dir
    try:
        out = subprocess.run([str(server), "--version"], capture_output=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as err:
        return "%s does not start: %s" % (server, err)
    if out.returncode != 0:
        return "%s --version exited %d: %s" % (server, out.returncode, out.stderr.decode(errors="replace")[-300:])
    return None


def find_llama_bin_dir(tmp_dir):
    """(bin dir, None) of a runnable CPU llama.cpp build, or (None, why not)."""
    reasons = []
    env_dir = os.environ.get("LLM_FLEET_LLAMA_BIN_DIR")
    if env_dir:
        why = _usable(env_dir)
        if why is None:
            return env_dir, None
        reasons.append("LLM_FLEET_LLAMA_BIN_DIR: %s" % why)
    artifacts = sorted(set(p for g in ARTIFACT_GLOBS for p in glob.glob(str(ROOT / g))), key=os.path.getmtime,
                       reverse=True)
    for artifact in artifacts:
        dest = Path(tmp_dir) / Path(artifact).name.split(".")[0]
        try:
            with tarfile.open(artifact) as tar:
                tar.extractall(dest, filter="tar") if hasattr(tarfile, "data_filter") else tar.extractall(dest)
        except (tarfile.TarError, OSError) as err:
            reasons.append("%s: %s" % (artifact, err))
            continue
        found = sorted(dest.rglob("llama-server"))
        if not found:
            reasons.append("%s holds no llama-server" % artifact)
            continue
        why = _usable(found[0].parent)
        if why is None:
            return str(found[0].parent), None
        reasons.append(why)
    if not artifacts:
        reasons.append("no llama.cpp build artifact under %s (the llama_cpp molecule scenario makes one)"
                       % ", ".join(ARTIFACT_GLOBS))
    return None, "; ".join(reasons) + "; set LLM_FLEET_LLAMA_BIN_DIR to a CPU build's bin directory to run"


def free_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class Server(object):
    def __init__(self, bin_dir, model, extra_args=(), tmp_dir="."):
        self.bin_dir = bin_dir
        self.model = model
        self.port = free_port()
        self.url = "http://127.0.0.1:%d" % self.port
        self.log_path = Path(tmp_dir) / ("llama-server-%d.log" % self.port)
        self.log = open(self.log_path, "wb")
        self.proc = subprocess.Popen(
            [str(Path(bin_dir) / "llama-server"), "-m", str(model), "--host", "127.0.0.1", "--port", str(self.port),
             "-c", "8192", "-np", "4", "-t", "2"] + list(extra_args),
            stdout=self.log, stderr=subprocess.STDOUT)
        try:
            lt.Client(self.url).wait_healthy(60)
        except lt.LoadTestError:
            self.stop()
            raise AssertionError("llama-server did not become healthy:\n%s" % self.log_path.read_text()[-3000:])

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        self.log.close()


@pytest.fixture(scope="session")
def llama_bin_dir(tmp_path_factory):
    bin_dir, why = find_llama_bin_dir(tmp_path_factory.mktemp("llama-cpp-build"))
    if bin_dir is None:
        pytest.skip(why)
    return bin_dir


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory):
    path = tmp_path_factory.mktemp("tiny-model") / "tiny.gguf"
    subprocess.run([sys.executable, str(ROOT / "tests" / "harness" / "tiny_model.py"), str(path)], check=True,
                   capture_output=True, timeout=120)
    return path


@pytest.fixture(scope="session")
def served(llama_bin_dir, tiny_model, tmp_path_factory):
    """A llama-server (4 slots of 2048 tokens) serving the tiny model on 127.0.0.1."""
    server = Server(llama_bin_dir, tiny_model, tmp_dir=tmp_path_factory.mktemp("server"))
    yield server
    server.stop()


# --- tests that need no server -------------------------------------------------------

def test_script_stays_python38_compatible():
    ast.parse(SCRIPT.read_text(), feature_version=(3, 8))


@pytest.mark.parametrize("url", ["http://10.0.0.5:8080", "http://example.com:8080", "https://127.0.0.1:8080",
                                 "http://0.0.0.0:8080"])
def test_refuses_anything_but_this_host(url):
    with pytest.raises(lt.LoadTestError, match="only"):
        lt.check_local(url)


@pytest.mark.parametrize("url,expected", [("http://127.0.0.1:8081", ("127.0.0.1", 8081)),
                                          ("http://localhost:9000/", ("localhost", 9000)),
                                          ("http://[::1]:8080", ("::1", 8080)),
                                          # an address of this host (an instance bound to it): 127.0.0.2 is on lo
                                          ("http://127.0.0.2:8080", ("127.0.0.2", 8080))])
def test_accepts_loopback(url, expected):
    assert lt.check_local(url) == expected


def test_through_a_router_every_request_names_its_model():
    """llama-server's router routes a GET by ?model= and a POST by the body's "model";
    /health is the router's own."""
    client = lt.Client("http://127.0.0.1:8180", model="code-7b.q4")
    assert client._path("/props") == "/props?model=code-7b.q4"
    assert client._path("/slots?fail_on_no_slot=1") == "/slots?fail_on_no_slot=1&model=code-7b.q4"
    assert client._path("/health") == "/health"
    assert client._payload({"prompt": "x"}) == {"prompt": "x", "model": "code-7b.q4"}
    plain = lt.Client("http://127.0.0.1:8080")
    assert plain._path("/props") == "/props" and plain._payload({"prompt": "x"}) == {"prompt": "x"}


def test_stream_levels():
    assert lt.parse_streams("1,4,slots", 8) == [1, 4, 8]
    assert lt.parse_streams("1, 4, slots", 4) == [1, 4]
    with pytest.raises(lt.LoadTestError, match="slot count"):
        lt.parse_streams("1,slots", None)
    with pytest.raises(lt.LoadTestError, match="whole numbers"):
        lt.parse_streams("1,many", 4)
    with pytest.raises(lt.LoadTestError, match="at least 1"):
        lt.parse_streams("0", 4)


def test_bounds_are_enforced():
    with pytest.raises(lt.LoadTestError, match="--first-token-tokens must be between 0"):
        lt.run("http://127.0.0.1:9", first_token_tokens=-1)
    with pytest.raises(lt.LoadTestError, match="--n-predict"):
        lt.run("http://127.0.0.1:9", n_predict=lt.MAX_N_PREDICT + 1)


def test_unreachable_server_is_reported_clearly():
    start = time.time()
    with pytest.raises(lt.LoadTestError, match="not healthy after 1 s"):
        lt.run("http://127.0.0.1:%d" % free_port(), health_timeout=1)
    assert time.time() - start < 10


def test_cli_prints_json_on_error():
    out = subprocess.run([sys.executable, str(SCRIPT), "--url", "http://192.0.2.1:8080"], capture_output=True,
                         text=True, timeout=30)
    assert out.returncode == 2
    payload = json.loads(out.stdout)
    assert payload["ok"] is False and payload["version"] == lt.VERSION
    assert "only 127.0.0.1" in payload["error"]


# --- against the real server -------------------------------------------------------------

def test_levels_against_a_real_server(served):
    report = lt.run(served.url, "1,4,slots", n_predict=16, budget_s=120)
    assert report["ok"], report
    assert report["total_slots"] == 4
    assert [l["concurrency"] for l in report["levels"]] == [1, 4]  # slots (4) already measured
    for level in report["levels"]:
        c = level["concurrency"]
        assert level["streams_ok"] == c and not level["errors"]
        assert level["tokens"] == 16 * c  # ignore_eos: exactly n_predict per stream
        assert level["aggregate_tps"] > 0 and level["per_stream_tps_mean"] > 0
        assert 0 < level["ttft_s_mean"] <= level["ttft_s_max"] < level["wall_s"] + 1e-6
        for stream in level["streams"]:
            assert stream["timings"]["predicted_n"] == 16
            assert stream["prompt_tokens"] > 100  # the fixed prompt, tokenised
    # the sum of decode rates is at least what the wall clock shows (TTFT is in the wall)
    four = lt.level(report, 4)
    assert four["aggregate_decode_tps"] >= four["aggregate_tps"] * 0.9


def test_the_first_token_of_a_long_prompt(served):
    # the prompt's own tokens repeated to the length asked, one token generated: the
    # server's prompt count is what was sent, and its timings give the prompt speed
    report = lt.run(served.url, "1", n_predict=4, warmup=False, first_token_tokens=1500)
    first = report["first_token"]
    assert first["error"] is None, first
    assert first["prompt_tokens_asked"] == 1500 and first["prompt_tokens"] == 1500
    assert first["ttft_s"] > 0 and first["prompt_tps"] > 0
    assert report["requests"] == 2 and report["ok"]
    # a prompt longer than a slot holds (8192 / 4 slots) is cut to fit, not refused by the server
    capped = lt.run(served.url, "1", n_predict=4, warmup=False, first_token_tokens=5000)["first_token"]
    assert capped["error"] is None and capped["prompt_tokens"] == 2048 - 8, capped
    # none asked, none measured
    assert "first_token" not in lt.run(served.url, "1", n_predict=4, warmup=False)


def test_request_cap_skips_levels_with_the_reason(served):
    report = lt.run(served.url, "1,4", n_predict=4, max_requests=3, warmup=False)
    assert [l["concurrency"] for l in report["levels"]] == [1]
    assert report["skipped"] == [{"concurrency": 4, "reason": "would exceed --max-requests (3)"}]
    assert not report["ok"]


def test_cli_against_a_real_server(served):
    out = subprocess.run([sys.executable, str(SCRIPT), "--url", served.url, "--streams", "2", "--n-predict", "8",
                          "--strip-streams"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    assert report["levels"][0]["concurrency"] == 2
    assert set(report["levels"][0]["streams"][0]) == {"ok", "tokens", "ttft_s", "decode_tps", "error"}
    assert "warmup" not in report
    assert report["prompt_id"] == "default"


def test_the_report_names_its_prompt():
    """The speed gate compares only measurements of the same prompt (module_utils/speed_gate.py)."""
    assert lt.prompt_id(lt.DEFAULT_PROMPT) == "default"
    assert lt.prompt_id("Rewrite this function.") == "dcd3a2187800"  # sha256's first 12 hex digits


def test_api_key(llama_bin_dir, tiny_model, tmp_path):
    key_file = tmp_path / "api-key"
    key_file.write_text("s3cret-key\n")
    server = Server(llama_bin_dir, tiny_model, ["--api-key-file", str(key_file)], tmp_dir=tmp_path)
    try:
        denied = lt.run(server.url, "1", n_predict=4, warmup=False)
        assert not denied["ok"]
        assert "HTTP 401" in denied["levels"][0]["errors"][0]
        allowed = lt.run(server.url, "1", n_predict=4, api_key=lt.read_api_key(str(key_file)), warmup=False)
        assert allowed["ok"], allowed
    finally:
        server.stop()
    empty = tmp_path / "empty"
    empty.write_text("")
    with pytest.raises(lt.LoadTestError, match="empty"):
        lt.read_api_key(str(empty))


def test_benchmark_reuses_the_script():
    """benchmarks/bench_configs.py imports this very script rather than a copy."""
    text = (ROOT / "benchmarks" / "bench_configs.py").read_text()
    assert "import llm_fleet_loadtest" in text
    assert not list((ROOT / "benchmarks").rglob("llm_fleet_loadtest.py"))
