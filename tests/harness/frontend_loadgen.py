"""Streaming chat completions through a host's front, as many clients would send
them, until a stop file appears; then one JSON line: how many requests were sent,
how many came back whole, and each failure (status, error, or a stream cut short).

Runs on the simulated host with its own python3 (no dependencies):
  python3 frontend_loadgen.py URL KEY CAFILE STOP_FILE [CLIENTS] [TOKENS] [PAUSE_S]
A response is whole when it is 200, its stream ends with `data: [DONE]`, and a
chunk before it carries a finish_reason."""
import http.client
import json
import os
import ssl
import sys
import threading
import time
from urllib.parse import urlsplit


def one_request(url, key, context, tokens):
    parts = urlsplit(url)
    if parts.scheme == "https":
        # the certificate is checked against the address (the front's names loopback too)
        connection = http.client.HTTPSConnection(parts.hostname, parts.port, timeout=120, context=context)
    else:
        connection = http.client.HTTPConnection(parts.hostname, parts.port, timeout=120)
    body = json.dumps({"messages": [{"role": "user", "content": "Count from one to ten."}],
                       "max_tokens": tokens, "stream": True})
    try:
        connection.request("POST", "/v1/chat/completions", body=body,
                           headers={"Content-Type": "application/json", "Authorization": "Bearer " + key})
        response = connection.getresponse()
        if response.status != 200:
            return "status %d: %s" % (response.status, response.read(300).decode(errors="replace"))
        finished = done = False
        for raw in response:
            line = raw.decode(errors="replace").strip()
            if line == "data: [DONE]":
                done = True
            elif line.startswith("data: "):
                chunk = json.loads(line[6:])
                finished = finished or any(choice.get("finish_reason") for choice in chunk.get("choices", []))
        if not (done and finished):
            return "stream cut short (finish_reason %s, [DONE] %s)" % (finished, done)
        return None
    except Exception as error:  # every failure a client would see counts
        return "%s: %s" % (type(error).__name__, error)
    finally:
        connection.close()


def main():
    url, key, cafile, stop_file = sys.argv[1:5]
    clients = int(sys.argv[5]) if len(sys.argv) > 5 else 8
    tokens = int(sys.argv[6]) if len(sys.argv) > 6 else 16
    # a client's think time between requests (leaves the host's CPUs some room)
    pause = float(sys.argv[7]) if len(sys.argv) > 7 else 0.0
    context = ssl.create_default_context(cafile=cafile)
    results = {"requests": 0, "whole": 0, "failures": []}
    lock = threading.Lock()

    def client():
        while not os.path.exists(stop_file):
            started = time.time()
            failure = one_request(url, key, context, tokens)
            with lock:
                results["requests"] += 1
                if failure:
                    results["failures"].append({"at": round(started, 3), "error": failure})
                else:
                    results["whole"] += 1
            time.sleep(pause)

    threads = [threading.Thread(target=client) for _ in range(clients)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    print(json.dumps(results))


if __name__ == "__main__":
    main()
