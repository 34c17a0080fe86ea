"""A fake instance on loopback whose /metrics counters grow at known rates."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

REQUESTS_PER_S = 4.0
TOKENS_PER_S = 100.0
PROMPT_TOKENS_PER_S = 250.0
TTFT_PER_S = 10.0  # observations/s: 90% in (0.05, 0.1], 10% in (0.2, 0.4] -> p50 78ms, p99 380ms
KV_CACHE = 0.42
ENGINE = 'engine="0",model_name="smol"'
REQUEST_LABELS = 'model="smol",version="1",protocol="openai",endpoint="/v1/completions",code="200"'


def exposition(elapsed: float) -> str:
    n = TTFT_PER_S * elapsed
    lines = [
        "# TYPE podium:requests counter",
        f"podium:requests_total{{{REQUEST_LABELS}}} {REQUESTS_PER_S * elapsed}",
        "# TYPE podium:ready gauge",
        "podium:ready 1.0",
        "# TYPE vllm:generation_tokens counter",
        f'vllm:generation_tokens_total{{engine="0",model_name="smol"}} {TOKENS_PER_S * elapsed}',
        "# TYPE vllm:prompt_tokens counter",
        f'vllm:prompt_tokens_total{{engine="0",model_name="smol"}} {PROMPT_TOKENS_PER_S * elapsed}',
        "# TYPE vllm:time_to_first_token_seconds histogram",
    ]
    for le, count in (("0.05", 0), ("0.1", 0.9 * n), ("0.2", 0.9 * n), ("0.4", n), ("+Inf", n)):
        lines.append(
            f"vllm:time_to_first_token_seconds_bucket{{{ENGINE},le={le!r}}} {count}".replace(
                "'", '"'
            )
        )
    lines += [
        f'vllm:time_to_first_token_seconds_count{{engine="0",model_name="smol"}} {n}',
        f'vllm:time_to_first_token_seconds_sum{{engine="0",model_name="smol"}} {0.1 * n}',
        "# TYPE vllm:kv_cache_usage_perc gauge",
        f'vllm:kv_cache_usage_perc{{engine="0",model_name="smol"}} {KV_CACHE}',
        "# TYPE vllm:num_requests_running gauge",
        'vllm:num_requests_running{engine="0",model_name="smol"} 3.0',
        "# TYPE vllm:num_requests_waiting gauge",
        'vllm:num_requests_waiting{engine="0",model_name="smol"} 1.0',
    ]
    return "\n".join(lines) + "\n"


@contextmanager
def fake_instance(api_key: str | None = None) -> Iterator[str]:
    """Serve the fake /metrics; yields the instance's base URL."""
    started = time.monotonic()

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            if api_key and self.headers.get("Authorization") != f"Bearer {api_key}":
                self.send_response(401)
                self.end_headers()
                return
            if self.path != "/metrics":
                self.send_response(404)
                self.end_headers()
                return
            body = exposition(time.monotonic() - started).encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
