#!/usr/bin/env python3
# -*- coding: utf-8 -*-
"""Load test of one llama-server instance through its served API, on this host only.

Sends the same prompt to /completion with stream=true and ignore_eos at each
concurrency level (1, 4, the server's slot count, ...), every stream asking for
exactly --n-predict tokens, and prints one JSON document:

    per stream:  time to first token (first SSE event carrying content),
                 decode tok/s (tokens after the first / time after the first),
                 the server's own timings (prompt and predicted per second)
    per level:   aggregate tok/s (all tokens / wall time of the level, first
                 request sent to last stream done) and the sum of the streams'
                 decode rates, mean/min per-stream rate, mean/max TTFT, errors
    first token: with --first-token-tokens N, one request whose prompt is N tokens
                 (the fixed prompt's tokens repeated): the time to its first token
                 and the server's prompt tok/s

Bounded on purpose: only 127.0.0.1/localhost/::1, at most --max-streams
concurrent streams, --max-requests requests in all, --n-predict capped, a
deadline for the whole run (--budget-s) and a timeout per request.

Stdlib only and Python 3.8-compatible: it runs on the managed hosts (installed
by roles/verify) and is imported by benchmarks/bench_configs.py.

    llm_fleet_loadtest.py --url http://127.0.0.1:8080 --streams 1,4,slots [--api-key-file F]
"""
from __future__ import absolute_import, division, print_function

import argparse
import hashlib
import json
import socket
import sys
import threading
import time

try:  # Python 3
    import http.client as httplib
    from urllib.parse import quote, urlsplit
except ImportError:  # pragma: no cover - Python 2 is not supported, but fail clearly
    sys.exit("llm_fleet_loadtest needs Python 3")

VERSION = 1
LOCAL_HOSTS = ("127.0.0.1", "localhost", "::1")
MAX_STREAMS = 64
MAX_N_PREDICT = 4096
MAX_REQUESTS = 256
# The longest prompt the first-token measurement sends (llama.cpp's largest trained contexts).
MAX_FIRST_TOKEN_TOKENS = 262144
# A fixed prompt (the same text on every host and every run): about 110 words
# of plain English, so the prompt's token count is similar for every tokenizer.
DEFAULT_PROMPT = (
    "You are the operator of a fleet of servers with older data-centre GPUs. Write a careful, "
    "step-by-step account of how you would measure the speed of a language model served on one "
    "of them: which figures you would record, how you would keep the measurement fair from one "
    "run to the next, why decoding one token at a time is limited by how fast the card can read "
    "its memory, how many tokens per second a single stream can reach at best, and what changes "
    "when several users send requests at the same time. Explain each step in plain words, give "
    "concrete numbers where you can, and end with a short checklist."
)


class LoadTestError(Exception):
    """The server cannot be tested (not local, not healthy, wrong arguments)."""


def check_local(url):
    """(host, port) of url; refuses anything but this host over plain HTTP."""
    parts = urlsplit(url)
    if parts.scheme != "http":
        raise LoadTestError("only plain http:// URLs on this host are tested, got %r" % url)
    host = parts.hostname or ""
    if host not in LOCAL_HOSTS and not is_own_address(host):
        raise LoadTestError("refusing to load-test %r: only 127.0.0.1, localhost, ::1 or an address of this host "
                            "are allowed" % host)
    return host, parts.port or 80


def is_own_address(host):
    """True when `host` is an IP address of this machine (an instance bound to one
    address of the host): only a local address can be bound to."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    if host in ("0.0.0.0", "::"):
        return False  # binds anywhere, names no address
    try:
        socket.inet_pton(family, host)
        probe = socket.socket(family, socket.SOCK_STREAM)
    except (OSError, ValueError):
        return False
    try:
        probe.bind((host, 0))
        return True
    except OSError:
        return False
    finally:
        probe.close()


def read_api_key(path):
    if not path:
        return None
    try:
        with open(path) as handle:
            key = handle.read().strip()
    except (IOError, OSError) as err:
        raise LoadTestError("cannot read the API key file %s: %s" % (path, err))
    if not key:
        raise LoadTestError("the API key file %s is empty" % path)
    return key


class Client(object):
    """Minimal HTTP/1.1 client for one llama-server on this host."""

    def __init__(self, url, api_key=None, timeout=120.0, model=None):
        self.host, self.port = check_local(url)
        self.api_key = api_key
        self.timeout = float(timeout)
        # a router (llama-server --models-preset): every request names its model, in the
        # body of a POST and as ?model= of a GET; the router loads it first if it must
        self.model = model or None

    def _path(self, path):
        if not self.model or path == "/health":
            return path
        return "%s%smodel=%s" % (path, "&" if "?" in path else "?", quote(self.model, safe=""))

    def _payload(self, payload):
        return dict(payload, model=self.model) if self.model and isinstance(payload, dict) else payload

    def _headers(self, extra=None):
        headers = {"Accept": "application/json"}
        if self.api_key:
            headers["Authorization"] = "Bearer %s" % self.api_key
        headers.update(extra or {})
        return headers

    def connect(self, timeout=None):
        return httplib.HTTPConnection(self.host, self.port, timeout=timeout or self.timeout)

    def _json(self, method, path, payload=None, timeout=10.0):
        """(status, parsed body or None) of a request with an optional JSON body."""
        conn = self.connect(timeout)
        try:
            if payload is None:
                conn.request(method, self._path(path), headers=self._headers())
            else:
                conn.request(method, path, body=json.dumps(self._payload(payload)).encode("utf-8"),
                             headers=self._headers({"Content-Type": "application/json"}))
            resp = conn.getresponse()
            body = resp.read()
        finally:
            conn.close()
        try:
            return resp.status, json.loads(body.decode("utf-8"))
        except ValueError:
            return resp.status, None

    def get_json(self, path, timeout=10.0):
        return self._json("GET", path, timeout=timeout)

    def post_json(self, path, payload, timeout=30.0):
        return self._json("POST", path, payload, timeout)

    def wait_healthy(self, timeout=60.0):
        """Polls /health until 200; raises LoadTestError with the last answer."""
        deadline = time.time() + timeout
        last = "no answer"
        while True:
            try:
                status, body = self.get_json("/health", timeout=5.0)
                if status == 200:
                    return body
                last = "HTTP %s %s" % (status, body)
            except (socket.error, httplib.HTTPException) as err:
                last = str(err) or err.__class__.__name__
            if time.time() >= deadline:
                raise LoadTestError("llama-server at %s:%s is not healthy after %.0f s: %s"
                                    % (self.host, self.port, timeout, last))
            time.sleep(0.5)

    def props(self, timeout=10.0):
        try:
            status, body = self.get_json("/props", timeout=timeout)
        except (socket.error, httplib.HTTPException):
            return {}
        return body if status == 200 and isinstance(body, dict) else {}

    def stream_completion(self, payload):
        """POST /completion with stream=true; returns one stream's measurements."""
        body = json.dumps(self._payload(payload)).encode("utf-8")
        result = {"ok": False, "tokens": 0, "events": 0, "ttft_s": None, "total_s": None,
                  "decode_tps": None, "error": None, "timings": None, "prompt_tokens": None}
        start = time.time()
        first = None
        last_event = None
        conn = self.connect()
        try:
            conn.request("POST", "/completion", body=body,
                         headers=self._headers({"Content-Type": "application/json",
                                                "Accept": "text/event-stream"}))
            resp = conn.getresponse()
            if resp.status != 200:
                text = resp.read(2000).decode("utf-8", "replace")
                result["error"] = "HTTP %d: %s" % (resp.status, text.strip())
                return result
            while True:
                line = resp.readline()
                if not line:
                    break
                line = line.strip()
                if not line.startswith(b"data:"):
                    continue
                data = line[5:].strip()
                if data == b"[DONE]":
                    break
                try:
                    event = json.loads(data.decode("utf-8"))
                except ValueError:
                    continue
                if "error" in event:
                    result["error"] = "server error: %s" % json.dumps(event["error"])[:500]
                    return result
                now = time.time()
                result["events"] += 1
                has_token = bool(event.get("content")) or bool(event.get("tokens"))
                if first is None and has_token:
                    first = now
                last_event = event
                if event.get("stop"):
                    break
        except (socket.error, httplib.HTTPException) as err:
            result["error"] = "%s: %s" % (err.__class__.__name__, err)
            return result
        finally:
            conn.close()
        end = time.time()
        if last_event is None:
            result["error"] = "the stream ended without any event"
            return result
        timings = last_event.get("timings") or {}
        tokens = last_event.get("tokens_predicted") or timings.get("predicted_n") or result["events"]
        result.update({
            "ok": True,
            "tokens": int(tokens),
            "ttft_s": round(first - start, 4) if first is not None else None,
            "total_s": round(end - start, 4),
            "prompt_tokens": timings.get("prompt_n", last_event.get("tokens_evaluated")),
            "timings": dict((k, timings[k]) for k in ("prompt_n", "prompt_ms", "prompt_per_second",
                                                      "predicted_n", "predicted_ms", "predicted_per_second")
                            if k in timings) or None,
        })
        if first is not None and end > first and tokens > 1:
            result["decode_tps"] = round((int(tokens) - 1) / (end - first), 3)
        return result


def _mean(values):
    values = [v for v in values if v is not None]
    return round(sum(values) / len(values), 4) if values else None


def summarize_level(concurrency, streams, wall_s):
    """Figures of one concurrency level from its streams' results."""
    ok = [s for s in streams if s["ok"]]
    total_tokens = sum(s["tokens"] for s in ok)
    decode = [s["decode_tps"] for s in ok if s["decode_tps"] is not None]
    server = [(s["timings"] or {}).get("predicted_per_second") for s in ok]
    ttft = [s["ttft_s"] for s in ok if s["ttft_s"] is not None]
    return {
        "concurrency": concurrency,
        "streams_ok": len(ok),
        "errors": [s["error"] for s in streams if not s["ok"]],
        "wall_s": round(wall_s, 4),
        "tokens": total_tokens,
        "aggregate_tps": round(total_tokens / wall_s, 3) if wall_s > 0 and ok else None,
        "aggregate_decode_tps": round(sum(decode), 3) if decode else None,
        "per_stream_tps_mean": _mean(decode),
        "per_stream_tps_min": round(min(decode), 3) if decode else None,
        "server_predicted_tps_mean": _mean(server),
        "ttft_s_mean": _mean(ttft),
        "ttft_s_max": round(max(ttft), 4) if ttft else None,
        "streams": streams,
    }


def run_level(client, concurrency, payload, deadline):
    """Starts `concurrency` streams at once and waits for all; one level's summary."""
    results = [None] * concurrency
    barrier = threading.Barrier(concurrency)

    def worker(i):
        try:
            barrier.wait(timeout=30)
        except threading.BrokenBarrierError:
            pass
        results[i] = client.stream_completion(payload)

    threads = [threading.Thread(target=worker, args=(i,), name="stream-%d" % i) for i in range(concurrency)]
    start = time.time()
    for t in threads:
        t.daemon = True
        t.start()
    for t in threads:
        t.join(max(0.0, deadline - time.time()))
    wall = time.time() - start
    for i, r in enumerate(results):
        if r is None:
            results[i] = {"ok": False, "tokens": 0, "events": 0, "ttft_s": None, "total_s": None,
                          "decode_tps": None, "timings": None, "prompt_tokens": None,
                          "error": "still running at the run's deadline (--budget-s)"}
    return summarize_level(concurrency, results, wall)


def parse_streams(spec, slots):
    """'1,4,slots' -> [1, 4, slots] (deduplicated, in order); 'slots' needs the server's count."""
    levels = []
    for item in str(spec).split(","):
        item = item.strip().lower()
        if not item:
            continue
        if item in ("slots", "n", "parallel"):
            if not slots:
                raise LoadTestError("--streams names 'slots' but the server did not report its slot count (/props)")
            value = int(slots)
        else:
            try:
                value = int(item)
            except ValueError:
                raise LoadTestError("--streams takes whole numbers or 'slots', got %r" % item)
        if value < 1:
            raise LoadTestError("--streams levels must be at least 1, got %d" % value)
        if value not in levels:
            levels.append(value)
    if not levels:
        raise LoadTestError("--streams names no level")
    return levels


def build_payload(prompt, n_predict, seed=42):
    return {
        "prompt": prompt,
        "n_predict": int(n_predict),
        "ignore_eos": True,
        "stream": True,
        "cache_prompt": False,
        "temperature": 0.0,
        "seed": seed,
        "samplers": ["top_k"],
        "top_k": 1,
    }


def first_token(client, prompt, tokens, n_ctx):
    """One request whose prompt is `tokens` tokens long (the prompt's own tokens, from the
    server's /tokenize, repeated), one token generated: the wait for it, and the server's
    own prompt speed. Capped below the slot's context, which the prompt must fit in."""
    out = {"prompt_tokens_asked": int(tokens), "prompt_tokens": None, "ttft_s": None, "prompt_tps": None,
           "error": None}
    if n_ctx:
        tokens = min(int(tokens), int(n_ctx) - 8)
    if tokens < 1:
        out["error"] = "the slot's context (%s tokens) holds no prompt" % n_ctx
        return out
    try:
        status, body = client.post_json("/tokenize", {"content": prompt})
    except (socket.error, httplib.HTTPException) as err:
        status, body = None, "%s: %s" % (err.__class__.__name__, err)
    ids = (body or {}).get("tokens") if isinstance(body, dict) else None
    if status != 200 or not ids:
        out["error"] = "/tokenize answered %s %s" % (status, str(body)[:200])
        return out
    ids = [t if isinstance(t, int) else t.get("id") for t in ids]
    payload = build_payload((ids * (tokens // len(ids) + 1))[:tokens], 1)
    result = client.stream_completion(payload)
    timings = result.get("timings") or {}
    out.update(prompt_tokens=result.get("prompt_tokens"), ttft_s=result.get("ttft_s"),
               prompt_tps=round(timings["prompt_per_second"], 1) if timings.get("prompt_per_second") else None,
               error=result.get("error"))
    return out


def prompt_id(prompt):
    """'default' for the script's own prompt, else the first 12 hex digits of its sha256."""
    if prompt == DEFAULT_PROMPT:
        return "default"
    return hashlib.sha256(prompt.encode("utf-8")).hexdigest()[:12]


def run(url, streams="1,4,slots", n_predict=128, prompt=DEFAULT_PROMPT, api_key=None, timeout=120.0,
        budget_s=600.0, max_streams=MAX_STREAMS, max_requests=MAX_REQUESTS, health_timeout=60.0, warmup=True,
        first_token_tokens=0, model=None):
    """The whole load test as a dict (what the command line prints)."""
    n_predict = int(n_predict)
    if not 1 <= n_predict <= MAX_N_PREDICT:
        raise LoadTestError("--n-predict must be between 1 and %d, got %d" % (MAX_N_PREDICT, n_predict))
    if not 0 <= int(first_token_tokens) <= MAX_FIRST_TOKEN_TOKENS:
        raise LoadTestError("--first-token-tokens must be between 0 (none) and %d, got %d"
                            % (MAX_FIRST_TOKEN_TOKENS, int(first_token_tokens)))
    max_streams = min(int(max_streams), MAX_STREAMS)
    max_requests = min(int(max_requests), MAX_REQUESTS)
    client = Client(url, api_key=api_key, timeout=timeout, model=model)
    started = time.time()
    deadline = started + float(budget_s)
    client.wait_healthy(health_timeout)
    # through a router, the first request naming the model waits while it loads
    props = client.props(health_timeout if model else 10.0)
    slots = props.get("total_slots")
    n_ctx = (props.get("default_generation_settings") or {}).get("n_ctx")
    levels = parse_streams(streams, slots)
    skipped = []
    for level in list(levels):
        if level > max_streams:
            levels.remove(level)
            skipped.append({"concurrency": level, "reason": "above --max-streams (%d)" % max_streams})
    payload = build_payload(prompt, n_predict)
    report = {
        "version": VERSION,
        "url": "http://%s:%s" % (client.host, client.port),
        "model": props.get("model_alias") or props.get("model_path"),
        "total_slots": slots,
        "n_ctx": n_ctx,
        "build_info": props.get("build_info"),
        "n_predict": n_predict,
        "prompt_chars": len(prompt),
        # which prompt measured: speeds (and speculation's gain above all) differ by prompt, so
        # the speed gate compares only measurements of the same one (module_utils/speed_gate.py)
        "prompt_id": prompt_id(prompt),
        "levels": [],
        "skipped": skipped,
        "started_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(started)),
    }
    requests = 0
    if warmup:
        # one short request so the first measured level does not pay for CUDA
        # graph capture and first-use allocations
        requests += 1
        report["warmup"] = client.stream_completion(build_payload(prompt, min(8, n_predict)))
    for level in levels:
        if requests + level > max_requests:
            skipped.append({"concurrency": level, "reason": "would exceed --max-requests (%d)" % max_requests})
            continue
        if time.time() >= deadline:
            skipped.append({"concurrency": level, "reason": "the run's time budget (%.0f s) is spent" % budget_s})
            continue
        requests += level
        report["levels"].append(run_level(client, level, payload, deadline))
    if first_token_tokens and requests < max_requests and time.time() < deadline:
        requests += 1
        report["first_token"] = first_token(client, prompt, first_token_tokens, n_ctx)
    report["requests"] = requests
    report["duration_s"] = round(time.time() - started, 3)
    report["ok"] = bool(report["levels"]) and all(not l["errors"] for l in report["levels"]) and not skipped
    return report


def level(report, concurrency):
    """The summary of one concurrency level in a report, or None."""
    for entry in report.get("levels", []):
        if entry["concurrency"] == concurrency:
            return entry
    return None


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", default="http://127.0.0.1:8080", help="llama-server on this host")
    parser.add_argument("--streams", default="1,4,slots", help="concurrency levels; 'slots' = the server's slot count")
    parser.add_argument("--n-predict", type=int, default=128, help="tokens each stream generates (ignore_eos)")
    parser.add_argument("--prompt", default=DEFAULT_PROMPT, help="the fixed prompt")
    parser.add_argument("--api-key-file", default=None, help="file holding the server's API key")
    parser.add_argument("--timeout", type=float, default=120.0, help="seconds per request")
    parser.add_argument("--budget-s", type=float, default=600.0, help="seconds for the whole run")
    parser.add_argument("--health-timeout", type=float, default=60.0, help="seconds to wait for /health")
    parser.add_argument("--max-streams", type=int, default=MAX_STREAMS)
    parser.add_argument("--max-requests", type=int, default=MAX_REQUESTS)
    parser.add_argument("--no-warmup", action="store_true", help="skip the short warm-up request")
    parser.add_argument("--strip-streams", action="store_true", help="leave the per-stream details out")
    parser.add_argument("--model", default=None,
                        help="the model to name in every request (a router, llama-server --models-preset)")
    parser.add_argument("--first-token-tokens", type=int, default=0,
                        help="also time the first token of one prompt this many tokens long (0: no)")
    args = parser.parse_args(argv)
    try:
        report = run(args.url, args.streams, args.n_predict, args.prompt, read_api_key(args.api_key_file),
                     args.timeout, args.budget_s, args.max_streams, args.max_requests, args.health_timeout,
                     not args.no_warmup, args.first_token_tokens, args.model)
    except LoadTestError as err:
        print(json.dumps({"version": VERSION, "ok": False, "error": str(err)}))
        return 2
    if args.strip_streams:
        for entry in report["levels"]:
            entry["streams"] = [dict((k, v) for k, v in s.items() if k in ("ok", "tokens", "ttft_s", "decode_tps",
                                                                           "error")) for s in entry["streams"]]
        report.pop("warmup", None)
    print(json.dumps(report, sort_keys=True))
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
