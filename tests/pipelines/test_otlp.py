"""OTLP export, when a pipeline names an endpoint: its spans reach the collector over
OTLP/HTTP. Run in a child process so the exporter it installs stays out of this one."""

from __future__ import annotations

import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CHILD = '''
import asyncio, sys
from pathlib import Path
from podium.pipelines import trace
from tests.support.pipelines import FakeModels, build
steps = [{"name": "arm", "kind": "experiment", "key": "$input.member_id", "salt": "s",
          "variants": [{"name": "only", "weight": 1}]}]
pipeline = build(Path(sys.argv[1]), FakeModels(), steps, otlp_endpoint=sys.argv[2])
asyncio.run(pipeline.run({"member_id": "m"}, "otlp-1"))
assert trace.provider().force_flush(30_000)
'''


def test_spans_are_exported_over_otlp_http_when_configured(tmp_path: Path) -> None:
    bodies: list[tuple[str, bytes]] = []

    class Collector(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            bodies.append((self.path, self.rfile.read(int(self.headers["Content-Length"]))))
            self.send_response(200)
            self.send_header("Content-Type", "application/x-protobuf")
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args: object) -> None:
            return None

    server = HTTPServer(("127.0.0.1", 0), Collector)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        endpoint = f"http://127.0.0.1:{server.server_port}/v1/traces"
        child = subprocess.run([sys.executable, "-c", CHILD, str(tmp_path), endpoint],
                               capture_output=True, text=True, timeout=120, cwd=ROOT)
        assert child.returncode == 0, child.stderr[-3000:]
    finally:
        server.shutdown()
    assert bodies and all(path == "/v1/traces" for path, _ in bodies)
    exported = b"".join(body for _, body in bodies)
    assert b"pipeline p" in exported and b"step arm" in exported and b"otlp-1" in exported
