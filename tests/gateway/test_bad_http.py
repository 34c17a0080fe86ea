"""Bad HTTP input at the gateway: each a clear 4xx, fast, and the next good request succeeds."""

from __future__ import annotations

import contextlib
import gzip
import json
import socket
import time
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import httpx
import pytest

from podium.gateway.http_server import bounded_head_protocol
from podium.gateway.limits import GatewayLimits
from podium.gateway.proxy import Gateway
from podium.routes.table import Endpoint
from tests.support.servers import Served, upstream

MiB = 1 << 20
LIMITS = GatewayLimits(body_timeout_s=0.5)  # the defaults but for a test-sized body timeout


class Front:
    """A gateway served as `podium up` serves it (bounded request head), one upstream behind."""

    def __init__(self, upstream_url: str) -> None:
        self.gateway = Gateway(limits=LIMITS, connect_timeout_s=1.0)
        self.gateway.table.add_endpoint("iris", "1", Endpoint("iris-1", upstream_url))
        self.gateway.table.set_split("iris", {"1": 100})
        self.served = Served(self.gateway.app(),
                             http=bounded_head_protocol(LIMITS.max_header_bytes))
        self.client = httpx.Client(base_url=self.served.url, timeout=10)

    def raw(self, request: bytes) -> tuple[int, str]:
        """Send `request` bytes as they are; the status and body of the first answer."""
        with socket.create_connection(("127.0.0.1", self.served.port), timeout=5) as conn:
            conn.sendall(request)
            received = b""
            while b"\r\n\r\n" not in received or len(received) < _answer_length(received):
                chunk = conn.recv(65536)
                if not chunk:
                    break
                received += chunk
        head, _, body = received.partition(b"\r\n\r\n")
        return int(head.split(b" ", 2)[1]), body.decode()

    def raw_slowly(self, request: bytes, piece: int) -> tuple[int, str]:
        """Send `request` in pieces of `piece` bytes until the gateway answers."""
        with socket.create_connection(("127.0.0.1", self.served.port), timeout=5) as conn:
            conn.setblocking(False)
            received = b""
            for start in range(0, len(request), piece):
                with contextlib.suppress(BlockingIOError):
                    received += conn.recv(65536)
                if received:
                    break
                conn.sendall(request[start:start + piece])
                time.sleep(0.001)
            conn.setblocking(True)
            while b"\r\n\r\n" not in received or len(received) < _answer_length(received):
                chunk = conn.recv(65536)
                if not chunk:
                    break
                received += chunk
        head, _, body = received.partition(b"\r\n\r\n")
        return int(head.split(b" ", 2)[1]), body.decode()

    def close(self) -> None:
        self.client.close()
        self.served.stop()


def _answer_length(received: bytes) -> int:
    head, _, _ = received.partition(b"\r\n\r\n")
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            return len(head) + 4 + int(value)
    return len(received) + 1  # no length: read until the server closes


@pytest.fixture(scope="module")
def instance() -> Iterator[Served]:
    served = Served(upstream("1"))
    yield served
    served.stop()


@pytest.fixture(scope="module")
def front(instance: Served) -> Iterator[Front]:
    f = Front(instance.url)
    yield f
    f.close()


def _post(path: str, headers: dict[str, str], body: bytes) -> bytes:
    lines = [f"POST {path} HTTP/1.1", "host: gateway", *(f"{k}: {v}" for k, v in headers.items())]
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


def _gzip(data: bytes) -> bytes:
    return gzip.compress(data, compresslevel=1, mtime=0)


def _chunks(total: int, size: int = MiB) -> Iterator[bytes]:
    for _ in range(total // size):
        yield b"x" * size


@dataclass(frozen=True)
class Bad:
    """One bad request: how to send it, the status it must get, words its message must hold."""

    send: Callable[[Front], tuple[int, str]]
    status: int
    says: tuple[str, ...]


def _httpx(method: str, path: str, **kwargs: object) -> Callable[[Front], tuple[int, str]]:
    def send(front: Front) -> tuple[int, str]:
        r = front.client.request(method, path, **kwargs)  # type: ignore[arg-type]
        return r.status_code, r.text
    return send


def _raw(request: bytes) -> Callable[[Front], tuple[int, str]]:
    return lambda front: front.raw(request)


INFER = "/v2/models/iris/infer"
CHAT = "/v1/chat/completions"
BAD = {
    "body-50MB-with-content-length": Bad(
        _httpx("POST", INFER, content=b"x" * (50 * MiB)), 413,
        ("52428800 bytes (Content-Length)", "limit of 16777216 bytes", "--max-body-bytes")),
    "body-50MB-chunked": Bad(
        _httpx("POST", INFER, content=_chunks(50 * MiB)), 413,
        ("limit of 16777216 bytes", "without a Content-Length", "--max-body-bytes")),
    "body-50MB-openai-shape": Bad(
        _httpx("POST", CHAT, content=b"x" * (50 * MiB)), 413, ("invalid_request_error",
                                                              "limit of 16777216 bytes")),
    "content-length-larger-than-the-body": Bad(
        _raw(_post(INFER, {"content-length": "100"}, b'{"inputs": []}')), 408,
        ("14 of the declared 100 bytes came", "nothing for 0.5 s", "--body-timeout")),
    "content-length-smaller-than-the-body": Bad(
        # the bytes past the length are read as a next request, which is not HTTP
        _raw(_post(CHAT, {"content-length": "5"}, b'{"model": "iris"}')), 400,
        ("Invalid HTTP request",)),
    "content-length-negative": Bad(
        _raw(_post(INFER, {"content-length": "-1"}, b"{}")), 400, ("Invalid HTTP request",)),
    "content-length-not-a-number": Bad(
        _raw(_post(INFER, {"content-length": "ten"}, b"{}")), 400, ("Invalid HTTP request",)),
    "content-length-and-chunked-at-once": Bad(
        _raw(_post(INFER, {"content-length": "2", "transfer-encoding": "chunked"},
                   b"2\r\n{}\r\n0\r\n\r\n")), 400, ("Invalid HTTP request",)),
    "header-of-100KB": Bad(
        _httpx("POST", INFER, json={}, headers={"x-big": "a" * 100_000}), 431,
        ("limit of 65536 bytes", "--max-header-bytes")),
    "header-of-100KB-openai-shape": Bad(
        _httpx("POST", CHAT, json={"model": "iris"}, headers={"x-big": "a" * 100_000}), 431,
        ("invalid_request_error", "limit of 65536 bytes")),
    "3000-small-headers": Bad(
        _httpx("POST", INFER, json={}, headers={f"x-h{i}": "v" * 20 for i in range(3000)}),
        431, ("limit of 65536 bytes",)),
    "url-of-100KB": Bad(
        _raw(b"GET /v2/models/iris?q=" + b"a" * 100_000 + b" HTTP/1.1\r\nhost: g\r\n\r\n"),
        431, ("limit of 65536 bytes",)),
    "header-of-1MB-sent-slowly": Bad(
        lambda front: front.raw_slowly(_post(INFER, {"x-big": "a" * MiB}, b""), 16384), 431,
        ("limit of 65536 bytes",)),
    "openai-body-not-json": Bad(
        _httpx("POST", CHAT, content=b"\x1f\x8b\x08 gzip?"), 400, ("not valid JSON",)),
    "openai-gzip-bomb-64MiB-of-zeros": Bad(
        lambda front: _httpx("POST", CHAT, content=_gzip(b"0" * (64 * MiB)),
                             headers={"content-encoding": "gzip"})(front), 413,
        ("request body inflates past the gateway's limit of 16777216 bytes",)),
    "openai-gzip-cut-short": Bad(
        _httpx("POST", CHAT, content=_gzip(b'{"model": "iris"}' * 100)[:-30],
               headers={"content-encoding": "gzip"}), 400, ("cut short",)),
    "openai-gzip-header-on-a-plain-body": Bad(
        _httpx("POST", CHAT, json={"model": "iris"}, headers={"content-encoding": "gzip"}), 400,
        ("not valid gzip",)),
    "openai-brotli": Bad(
        _httpx("POST", CHAT, content=b"\x8b\x02\x80", headers={"content-encoding": "br"}), 400,
        ("Content-Encoding: br is not one the gateway reads",)),
    "openai-body-without-a-model": Bad(
        _httpx("POST", CHAT, json={"messages": []}), 400, ("field 'model' is required",)),
}


@pytest.mark.parametrize("bad", BAD.values(), ids=BAD.keys())
def test_bad_input_is_a_clear_4xx_and_the_gateway_serves_on(front: Front, instance: Served,
                                                            bad: Bad) -> None:
    num_forwarded = len(instance.app.state.seen)
    started = time.monotonic()
    status, body = bad.send(front)
    assert time.monotonic() - started < 5  # answered, not hung
    assert status == bad.status, body[:500]
    for words in bad.says:
        assert words in body, body[:500]
    assert len(instance.app.state.seen) == num_forwarded  # refused at the gateway
    good = front.client.post(INFER, json={"inputs": []})
    assert good.status_code == 200 and good.json()["version"] == "1"


def test_a_body_just_under_the_limit_is_forwarded_whole(front: Front, instance: Served) -> None:
    body = json.dumps({"pad": "x" * (LIMITS.max_body_bytes - 100)}).encode()
    r = front.client.post(INFER, content=_chunks_of(body))
    assert r.status_code == 200 and r.json()["body"] == json.loads(body)


def _chunks_of(body: bytes) -> Iterator[bytes]:
    for start in range(0, len(body), MiB):
        yield body[start:start + MiB]


def test_a_client_leaving_mid_body_forwards_nothing(front: Front, instance: Served) -> None:
    num_forwarded = len(instance.app.state.seen)
    with socket.create_connection(("127.0.0.1", front.served.port)) as conn:
        conn.sendall(_post(INFER, {"content-length": "1000"}, b'{"inputs": ['))
        time.sleep(0.1)
    time.sleep(0.2)
    assert len(instance.app.state.seen) == num_forwarded
    assert front.client.post(INFER, json={}).status_code == 200


@pytest.mark.parametrize("encoding, compress", [
    ("gzip", _gzip), ("deflate", zlib.compress),
    ("deflate", lambda data: zlib.compress(data, wbits=-15)),
], ids=["gzip", "deflate", "raw-deflate"])
def test_a_compressed_openai_body_is_routed_and_forwarded_inflated(
        front: Front, encoding: str, compress: Callable[[bytes], bytes]) -> None:
    body = {"model": "iris@1", "messages": [{"role": "user", "content": "hi " * 1000}]}
    r = front.client.post(CHAT, content=compress(json.dumps(body).encode()),
                          headers={"content-encoding": encoding,
                                   "content-type": "application/json"})
    assert r.status_code == 200, r.text
    seen = r.json()
    assert seen["body"] == body | {"model": "iris"}
    assert "content-encoding" not in seen["headers"]  # the instance gets what it can read


def test_the_bounded_head_names_the_server_and_flag_it_is_given(instance: Served) -> None:
    served = Served(instance.app, http=bounded_head_protocol(
        2048, server="the control API", flag="--api-max-header-bytes"))
    try:
        with httpx.Client(base_url=served.url) as client:
            r = client.get("/v1/status", headers={"x-big": "a" * 4096})
            assert r.status_code == 431
            assert r.json()["error"]["message"].startswith(
                "the request line and headers exceed the control API's limit of 2048 bytes "
                "(--api-max-header-bytes)")
            assert client.get("/health/ready").status_code == 200
    finally:
        served.stop()
