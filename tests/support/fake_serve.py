"""A stand-in for `podium serve`: /health at once, /health/ready after a delay, may crash.

Run as `python tests/support/fake_serve.py PACKAGE_DIR HTTP_PORT`;
PACKAGE_DIR/behaviour.json holds
{"ready_after_s": float, "crash_after_s": float | null, "ignore_sigterm": bool}.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

behaviour = json.loads((Path(sys.argv[1]) / "behaviour.json").read_text())
port = int(sys.argv[2])
started = time.monotonic()


class Handler(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        ready = time.monotonic() - started >= behaviour.get("ready_after_s", 0)
        if self.path == "/health/ready" and not ready:
            self._send(503, {"ready": False})
        else:
            self._send(200, {"path": self.path, "pid": os.getpid()})

    def _send(self, status: int, body: dict) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, fmt: str, *args: object) -> None:
        print(fmt % args, flush=True)


if behaviour.get("ignore_sigterm"):
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
if behaviour.get("crash_after_s") is not None:
    threading.Timer(behaviour["crash_after_s"], lambda: os._exit(3)).start()
print(f"fake instance listening on {port}", flush=True)
ThreadingHTTPServer(("127.0.0.1", port), Handler).serve_forever()
