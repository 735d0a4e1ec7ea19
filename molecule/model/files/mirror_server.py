#!/usr/bin/env python3
"""The model scenario's mirror: serves a directory over HTTP with Range requests
(python3 -m http.server has none), at a limited rate so that a test can cut a
transfer mid-way. Standard library only: it runs in a container of the hosts'
image.

    mirror_server.py DIRECTORY [--port 8000] [--rate BYTES_PER_SECOND]
"""
import argparse
import os
import re
import sys
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

CHUNK = 64 * 1024


class Mirror(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    root = "."
    rate = 0

    def log_message(self, fmt, *args):
        sys.stderr.write("%s %s\n" % (self.address_string(), fmt % args))

    def _empty(self, code, headers=()):
        self.send_response(code)
        for key, value in headers:
            self.send_header(key, value)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def _file(self):
        name = os.path.basename(self.path.split("?")[0])
        path = os.path.join(self.root, name)
        return path if name and os.path.isfile(path) else None

    def do_HEAD(self):
        path = self._file()
        if not path:
            return self._empty(404)
        self.send_response(200)
        self.send_header("Content-Length", str(os.path.getsize(path)))
        self.send_header("Accept-Ranges", "bytes")
        self.end_headers()

    def do_GET(self):
        path = self._file()
        if not path:
            return self._empty(404)
        size = os.path.getsize(path)
        start = 0
        match = re.match(r"^bytes=(\d+)-$", self.headers.get("Range") or "")
        if match:
            start = int(match.group(1))
            if start >= size:
                return self._empty(416, [("Content-Range", "bytes */%d" % size)])
            self.send_response(206)
            self.send_header("Content-Range", "bytes %d-%d/%d" % (start, size - 1, size))
        else:
            self.send_response(200)
        self.send_header("Content-Length", str(size - start))
        self.send_header("Accept-Ranges", "bytes")
        self.end_headers()
        began, sent = time.time(), 0
        with open(path, "rb") as handle:
            handle.seek(start)
            for block in iter(lambda: handle.read(CHUNK), b""):
                self.wfile.write(block)
                sent += len(block)
                if self.rate:
                    ahead = sent / self.rate - (time.time() - began)
                    if ahead > 0:
                        time.sleep(ahead)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("directory")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--rate", type=int, default=0, help="bytes per second per transfer (0: unlimited)")
    args = parser.parse_args()
    Mirror.root, Mirror.rate = args.directory, args.rate
    ThreadingHTTPServer(("", args.port), Mirror).serve_forever()


if __name__ == "__main__":
    main()
