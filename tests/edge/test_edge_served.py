"""The whole edge in front of a tiny app, served by uvicorn as every Podium server is: each bad
request is refused with its status and words, and the next good request on the same server is
answered."""

from __future__ import annotations

import gzip
import json
import socket
import zlib
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest

from podium.edge.body import BodyWording, read_request_body
from podium.edge.head import bounded_head_protocol
from podium.edge.inflate import InflateWording, inflate
from podium.edge.json_checks import find_issue
from podium.errors import InvalidArgument, PodiumError
from podium.errors.render import instance_shape, json_error
from tests.support.servers import Served

MAX_BODY = 4096
MAX_INFLATED = 64 * 1024
MAX_DEPTH = 8
MAX_HEAD = 2048
STALL_S = 0.3
WORDING = BodyWording(whose="the test's ", flag="--test-body", stall_flag="--test-stall")
INFLATE = InflateWording(server="the test", flag="--test-inflated")
GOOD = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}


async def _edge_app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    """Read, inflate, parse and check the body, as a surface does; answer its size."""
    if scope["type"] == "lifespan":
        while (await receive())["type"] != "lifespan.shutdown":
            await send({"type": "lifespan.startup.complete"})
        await send({"type": "lifespan.shutdown.complete"})
        return
    headers = dict(scope["headers"])
    try:
        raw = await read_request_body(scope, receive, MAX_BODY, stall_s=STALL_S,
                                      wording=WORDING)
        plain = inflate(raw, headers.get(b"content-encoding", b"").decode(), MAX_INFLATED,
                        INFLATE)
        try:
            value = json.loads(plain)
        except RecursionError:
            raise InvalidArgument(f"nested deeper than {MAX_DEPTH}") from None
        issue = find_issue(value, max_depth=MAX_DEPTH)
        if issue is not None:
            raise InvalidArgument(f"{issue.kind} at {issue.place(root=None)}")
        status, body = 200, json.dumps({"inflated": len(plain)}).encode()
    except PodiumError as exc:
        status, body = json_error(instance_shape(scope["path"]), exc)
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"),
                            (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})


@pytest.fixture(scope="module")
def served() -> Iterator[Served]:
    server = Served(_edge_app, http=bounded_head_protocol(MAX_HEAD, server="the test",
                                                          flag="--test-head"))
    yield server
    server.stop()


def _post(body: bytes, **headers: str) -> Callable[[Served], tuple[int, str]]:
    def send(served: Served) -> tuple[int, str]:
        r = httpx.post(f"{served.url}/v2/x", content=body, headers=headers, timeout=10)
        return r.status_code, r.text
    return send


def _chunked(body: bytes) -> Callable[[Served], tuple[int, str]]:
    def send(served: Served) -> tuple[int, str]:
        pieces = (body[i:i + 1024] for i in range(0, len(body), 1024))
        r = httpx.post(f"{served.url}/v2/x", content=pieces, timeout=10)
        return r.status_code, r.text
    return send


def _stalled(served: Served) -> tuple[int, str]:
    """Declare 100 bytes, send 10 in two pieces, then nothing."""
    with socket.create_connection(("127.0.0.1", served.port), timeout=5) as conn:
        conn.sendall(b"POST /v2/x HTTP/1.1\r\nhost: t\r\ncontent-length: 100\r\n\r\n{\"a\":")
        conn.sendall(b' "12')
        received = b""
        while b"\r\n\r\n" not in received or not received.endswith(b"}"):  # content-length set
            chunk = conn.recv(65536)
            if not chunk:
                break
            received += chunk
    head, _, body = received.partition(b"\r\n\r\n")
    return int(head.split(b" ", 2)[1]), body.decode()


def _nested(depth: int) -> bytes:
    return b'{"a": ' + b"[" * depth + b"1" + b"]" * depth + b"}"


BOMB = b'{"pad": "' + b"0" * (4 * MAX_INFLATED) + b'"}'

CASES: dict[str, tuple[Callable[[Served], tuple[int, str]], int, str]] = {
    "body-declared-past-cap": (_post(b" " * (MAX_BODY + 1)), 413,
                               "request body of 4097 bytes exceeds the test's 4096-byte limit"),
    "body-sent-past-cap": (_chunked(b" " * (MAX_BODY * 2)), 413,
                           "request body exceeds the test's 4096-byte limit (--test-body)"),
    "body-stalled": (_stalled, 408,
                     "of the declared 100 bytes came, then nothing for 0.3 s (--test-stall)"),
    "gzip-bomb": (_post(gzip.compress(BOMB), **{"content-encoding": "gzip"}), 413,
                  "inflates past the test's limit of 65536 bytes (--test-inflated)"),
    "deflate-bomb": (_post(zlib.compress(BOMB), **{"content-encoding": "deflate"}), 413,
                     "deflate request body inflates past the test's limit"),
    "gzip-not-gzip": (_post(b"plainly not gzip", **{"content-encoding": "gzip"}), 400,
                      "not valid gzip"),
    "unknown-coding": (_post(b"{}", **{"content-encoding": "br"}), 400,
                       "Content-Encoding: br is not one the test reads"),
    "json-30k-deep": (_post(gzip.compress(_nested(30_000)), **{"content-encoding": "gzip"}),
                      400, "nested deeper than 8"),
    "json-past-depth": (_post(_nested(MAX_DEPTH)), 400, "depth at a" + "[0]" * 7),
    "json-lone-surrogate": (_post(b'{"messages": [{"content": "a\\ud800"}]}'), 400,
                            "text at messages[0].content"),
    "head-past-cap": (lambda s: (lambda r: (r.status_code, r.text))(
        httpx.post(f"{s.url}/v2/x", json=GOOD, headers={"x-big": "a" * (2 * MAX_HEAD)})), 431,
        "exceed the test's limit of 2048 bytes (--test-head)"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_a_bad_request_is_refused_then_a_good_one_is_served(served: Served, case: str) -> None:
    send, status, words = CASES[case]
    got, text = send(served)
    assert got == status, text
    assert words in json.loads(text)["error"], text
    good = json.dumps(GOOD).encode()
    for coding, packed in (("", good), ("gzip", gzip.compress(good)),
                           ("deflate", zlib.compress(good)),
                           ("deflate", zlib.compress(good, wbits=-zlib.MAX_WBITS))):
        r = httpx.post(f"{served.url}/v2/x", content=packed,
                       headers={"content-encoding": coding} if coding else {})
        assert (r.status_code, r.json()) == (200, {"inflated": len(good)}), (coding, r.text)
