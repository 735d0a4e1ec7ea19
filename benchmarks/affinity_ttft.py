#!/usr/bin/env python3
"""What keeping a conversation on its instance buys (issue 32): the time to first
token of every turn of a long multi-turn conversation, routed three ways over
llama-server instances started from what the roles render:

  same       every turn to the instance that served the one before (what the
             front's affinity does): only the new turn is prefilled
  alternate  turns alternate between two instances (what leastconn does to a
             conversation on a two-GPU host): each prefills what the other served
  cold       every turn with cache_prompt off on one instance (a restarted or
             never-seen instance): the whole history is prefilled each turn

Each arm is its own conversation (a different first line, so no arm reuses
another's cache), of --turns turns of --turn-tokens tokens of words each, with
--n-predict generated tokens appended as the assistant's reply. The server's own
figures (timings.prompt_n: tokens prefilled, timings.cache_n: tokens reused) are
recorded beside the client's wait for the first streamed token.

    python3 benchmarks/affinity_ttft.py --servers http://127.0.0.1:8080,http://127.0.0.1:8081 \\
        --out results.json

Standard library only (it runs on the lent GPU machine's own Python)."""
import argparse
import http.client
import json
import random
import sys
import time
import urllib.parse

WORDS = ("the of and to in is was for on that with as by at from this be are or an it his which had not have "
         "were but has their its one all been they more who also would after first two new other when time "
         "into only can some years most over out such many these made up under where between may during "
         "three about later than state world city could both while then through year known part since well "
         "system people under water river market energy power school music history theory model data value "
         "network memory engine signal number report result method process figure table server request").split()


def post(url, path, body, stream=False, timeout=600):
    """(first_token_seconds or None, the final JSON) of one request; stream: read the SSE."""
    parts = urllib.parse.urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=timeout)
    payload = json.dumps(body).encode()
    start = time.monotonic()
    conn.request("POST", path, payload, {"Content-Type": "application/json"})
    resp = conn.getresponse()
    if resp.status != 200:
        raise RuntimeError("%s%s answered %d: %s" % (url, path, resp.status, resp.read()[:300]))
    if not stream:
        return None, json.loads(resp.read())
    first, text, last = None, [], {}
    for raw in resp:
        line = raw.decode("utf-8", "replace").strip()
        if not line.startswith("data: "):
            continue
        event = json.loads(line[6:])
        if event.get("content") and first is None:
            first = time.monotonic() - start
        text.append(event.get("content") or "")
        last = event
        if event.get("stop"):
            break
    conn.close()
    last["content"] = "".join(text)
    return first, last


def wait_healthy(url, seconds=300):
    """Until /health answers 200 (a server still loading its model answers 503)."""
    parts, deadline = urllib.parse.urlsplit(url), time.monotonic() + seconds
    while True:
        try:
            conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=5)
            conn.request("GET", "/health")
            if conn.getresponse().status == 200:
                return
        except OSError:
            pass
        if time.monotonic() > deadline:
            raise RuntimeError("%s did not become healthy in %d s" % (url, seconds))
        time.sleep(1)


def turn_text(rng, words_per_turn):
    return " ".join(rng.choice(WORDS) for _ in range(words_per_turn))


def words_for(url, tokens):
    """Words of WORDS that make about `tokens` tokens with this server's tokenizer."""
    sample = turn_text(random.Random(0), 1000)
    _, answer = post(url, "/tokenize", {"content": sample})
    per_word = len(answer["tokens"]) / 1000.0
    return max(1, int(tokens / per_word))


def run_arm(arm, servers, turns, words_per_turn, n_predict, seed):
    rng = random.Random(seed)
    history = "Conversation %s %d. The assistant answers the user.\n" % (arm, seed)
    rows = []
    for turn in range(1, turns + 1):
        history += "\nUser: %s\nAssistant:" % turn_text(rng, words_per_turn)
        url = servers[(turn - 1) % 2] if arm == "alternate" else servers[0]
        body = {"prompt": history, "n_predict": n_predict, "stream": True, "ignore_eos": True,
                "temperature": 0, "cache_prompt": arm != "cold"}
        start = time.monotonic()
        first, last = post(url, "/completion", body, stream=True)
        timings = last.get("timings") or {}
        rows.append({
            "arm": arm, "turn": turn, "server": url,
            "ttft_s": round(first, 3) if first is not None else None,
            "wall_s": round(time.monotonic() - start, 3),
            "prompt_tokens": (timings.get("prompt_n") or 0) + (timings.get("cache_n") or 0),
            "prefilled_tokens": timings.get("prompt_n"),
            "cached_tokens": timings.get("cache_n"),
            "prompt_ms": timings.get("prompt_ms"),
            "prompt_tps": round(timings["prompt_per_second"], 1) if timings.get("prompt_per_second") else None,
        })
        print("%-9s turn %d  %-24s prompt %5s tokens: %5s prefilled, %5s cached; first token %.3f s" % (
            arm, turn, url, rows[-1]["prompt_tokens"], rows[-1]["prefilled_tokens"], rows[-1]["cached_tokens"],
            first or -1), flush=True)
        history += last.get("content") or ""
    return rows


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--servers", required=True, help="two llama-server URLs, comma-separated")
    ap.add_argument("--turns", type=int, default=6)
    ap.add_argument("--turn-tokens", type=int, default=1100, help="tokens of each user turn")
    ap.add_argument("--n-predict", type=int, default=32, help="tokens of each reply")
    ap.add_argument("--arms", default="same,alternate,cold")
    ap.add_argument("--out", help="write the rows and the summary here (JSON)")
    args = ap.parse_args(argv)
    servers = [s.rstrip("/") for s in args.servers.split(",")]
    if len(servers) != 2:
        ap.error("--servers takes two URLs")
    for url in servers:  # load the weights' pages and the kernels before timing
        wait_healthy(url)
        post(url, "/completion", {"prompt": "warm up", "n_predict": 4, "cache_prompt": False})
    words = words_for(servers[0], args.turn_tokens)
    rows = []
    for n, arm in enumerate(args.arms.split(",")):
        rows += run_arm(arm, servers, args.turns, words, args.n_predict, seed=100 + n)
    summary = {}
    for arm in args.arms.split(","):
        mine = [r for r in rows if r["arm"] == arm]
        later = [r["ttft_s"] for r in mine if r["turn"] > 1 and r["ttft_s"] is not None]
        summary[arm] = {
            "ttft_s_by_turn": [r["ttft_s"] for r in mine],
            "prefilled_by_turn": [r["prefilled_tokens"] for r in mine],
            "ttft_s_mean_after_turn_1": round(sum(later) / len(later), 3) if later else None,
            "last_turn_prompt_tokens": mine[-1]["prompt_tokens"] if mine else None,
        }
    same = summary.get("same", {}).get("ttft_s_mean_after_turn_1")
    print("\nmean time to first token after turn 1:")
    for arm, s in summary.items():
        ratio = (" (%.1fx same)" % (s["ttft_s_mean_after_turn_1"] / same)) if same and s[
            "ttft_s_mean_after_turn_1"] else ""
        print("  %-9s %s s%s; by turn %s" % (arm, s["ttft_s_mean_after_turn_1"], ratio, s["ttft_s_by_turn"]))
    result = {"settings": vars(args), "words_per_turn": words, "rows": rows, "summary": summary}
    if args.out:
        with open(args.out, "w") as handle:
            json.dump(result, handle, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
