"""Each edge job on its own: the body read (fake ASGI receive), inflation and the JSON checks,
table-driven; what a refusal says comes from the wording the caller passes."""

from __future__ import annotations

import asyncio
import gzip
import json
import zlib
from typing import Any

import pytest

from podium.edge.body import BodyWording, content_length, read_body, replay
from podium.edge.inflate import InflateWording, check_coding, inflate
from podium.edge.json_checks import depth_of, find_issue, may_hold_surrogates
from podium.errors import InvalidArgument, PayloadTooLarge, RequestTimeout


def _receive(*pieces: bytes, then: str = "hang") -> Any:
    """An ASGI receive handing out `pieces` as one body, then hanging or disconnecting."""
    messages = [{"type": "http.request", "body": p, "more_body": i < len(pieces) - 1}
                for i, p in enumerate(pieces)]
    if messages and then in ("hang", "leave"):  # the body never ends
        messages[-1]["more_body"] = True

    async def receive() -> dict[str, Any]:
        if messages:
            return messages.pop(0)
        if then == "leave":
            return {"type": "http.disconnect"}
        await asyncio.sleep(3600)
        raise AssertionError("unreachable")

    return receive


def _read(*pieces: bytes, then: str = "end", wording: BodyWording = BodyWording(),
          **kwargs: Any) -> bytes:
    return asyncio.run(read_body(_receive(*pieces, then=then), 100, wording=wording, **kwargs))


BODY_REFUSALS = {
    "declared-past-cap": (dict(pieces=(b"x",), declared=101), PayloadTooLarge,
                          "request body of 101 bytes exceeds the 100-byte limit "
                          "(--max-body-bytes)"),
    "sent-past-cap-in-one": (dict(pieces=(b"x" * 101,)), PayloadTooLarge,
                             "request body exceeds the 100-byte limit (--max-body-bytes)"),
    "sent-past-cap-in-pieces": (dict(pieces=(b"x" * 60, b"x" * 60)), PayloadTooLarge,
                                "request body exceeds the 100-byte limit"),
    "stalled": (dict(pieces=(b"x" * 10, b"x" * 10), then="hang", stall_s=0.05),
                RequestTimeout, "20 of its bytes came, then nothing for 0.05 s"),
    "client-left": (dict(pieces=(b"x" * 10, b"x"), then="leave", declared=50),
                    InvalidArgument, "closed the connection after 11 of 50 bytes"),
}


@pytest.mark.parametrize("case", list(BODY_REFUSALS))
def test_a_body_past_a_bound_is_refused_with_the_instance_wording(case: str) -> None:
    kwargs, error, words = BODY_REFUSALS[case]
    pieces = kwargs.pop("pieces")
    with pytest.raises(error) as caught:
        _read(*pieces, **kwargs)
    assert words in caught.value.message


def test_a_body_within_the_cap_is_read_whole() -> None:
    assert _read(b"a" * 50, b"b" * 50, declared=100, stall_s=1.0) == b"a" * 50 + b"b" * 50
    assert _read(b"") == b""


def test_a_wording_says_whose_limit_and_may_read_what_came_before_a_disconnect() -> None:
    class Lenient(BodyWording):
        def left(self, size: int, declared: int | None) -> None:
            return None

    api = Lenient(whose="the control API's ", flag="podium up --api-max-body-bytes",
                  declared_param="Content-Length")
    with pytest.raises(PayloadTooLarge) as caught:
        _read(b"x", declared=101, wording=api)
    assert caught.value.message == ("request body of 101 bytes exceeds the control API's "
                                    "100-byte limit (podium up --api-max-body-bytes)")
    assert caught.value.param == "Content-Length"
    assert _read(b"x" * 10, b"y", then="leave", wording=api) == b"x" * 10 + b"y"
    assert _read(then="leave", wording=api) == b""


def test_content_length_is_read_or_refused_as_the_wording_says() -> None:
    assert content_length([(b"host", b"t"), (b"content-length", b"42")]) == 42
    assert content_length([(b"content-length", b"4x")]) is None

    class Strict(BodyWording):
        def bad_length(self, value: str) -> InvalidArgument:
            return InvalidArgument(f"Content-Length={value!r} is not a byte count")

    with pytest.raises(InvalidArgument, match="'4x' is not a byte count"):
        content_length([(b"content-length", b"4x")], Strict())


def test_replay_hands_out_the_read_body_then_the_client() -> None:
    async def run() -> list[dict[str, Any]]:
        receive = replay(b"body", _receive(b"", then="leave"))
        return [await receive(), await receive(), await receive()]

    first, second, third = asyncio.run(run())
    assert first == {"type": "http.request", "body": b"body", "more_body": False}
    assert second["body"] == b"" and third["type"] == "http.disconnect"


PLAIN = json.dumps({"text": "hello " * 1000}).encode()
BOMB = b"\0" * (16 << 20)


def _raw_deflate(data: bytes) -> bytes:
    return zlib.compress(data, wbits=-zlib.MAX_WBITS)


@pytest.mark.parametrize(("coding", "packed"), [
    ("", PLAIN), ("identity", PLAIN), ("gzip", gzip.compress(PLAIN)),
    ("x-gzip", gzip.compress(PLAIN)), (" GZIP ", gzip.compress(PLAIN)),
    ("deflate", zlib.compress(PLAIN)), ("deflate", _raw_deflate(PLAIN)),
], ids=["none", "identity", "gzip", "x-gzip", "gzip-spaced-upper", "deflate-zlib",
        "deflate-raw"])
def test_a_compressed_body_inflates_to_what_was_packed(coding: str, packed: bytes) -> None:
    assert inflate(packed, coding, len(PLAIN)) == PLAIN


INFLATE_REFUSALS = {
    "gzip-bomb": ("gzip", gzip.compress(BOMB), PayloadTooLarge,
                  "gzip request body inflates past the gateway's limit of 1048576 bytes"),
    "deflate-bomb": ("deflate", zlib.compress(BOMB), PayloadTooLarge,
                     "deflate request body inflates past"),
    "raw-deflate-bomb": ("deflate", _raw_deflate(BOMB), PayloadTooLarge, "inflates past"),
    "one-byte-over": ("gzip", gzip.compress(b"x" * ((1 << 20) + 1)), PayloadTooLarge,
                      "inflates past"),
    "gzip-cut-short": ("gzip", gzip.compress(PLAIN)[:-12], InvalidArgument, "cut short"),
    "gzip-trailing": ("gzip", gzip.compress(PLAIN) + b"zz", InvalidArgument,
                      "has 2 bytes after the end of its compressed stream"),
    "not-gzip": ("gzip", b"plainly not gzip", InvalidArgument, "not valid gzip"),
    "not-deflate": ("deflate", b"plainly not deflate", InvalidArgument, "not valid deflate"),
    "unknown": ("br", b"{}", InvalidArgument, "Content-Encoding: br is not one the gateway"),
}


@pytest.mark.parametrize("case", list(INFLATE_REFUSALS))
def test_a_bomb_or_a_broken_stream_is_refused(case: str) -> None:
    coding, packed, error, words = INFLATE_REFUSALS[case]
    with pytest.raises(error) as caught:
        inflate(packed, coding, 1 << 20)
    assert words in caught.value.message
    assert caught.value.param == "Content-Encoding"


def test_a_wording_chooses_the_codings_it_reads_and_its_words() -> None:
    class Terse(InflateWording):
        def too_large(self, compressed: int, coding: str, max_bytes: int) -> PayloadTooLarge:
            return PayloadTooLarge(f"{coding} over {max_bytes}")

    terse = Terse(codings=frozenset({"gzip"}))
    assert check_coding("identity", terse) == ""
    with pytest.raises(InvalidArgument, match="x-gzip is not one"):
        check_coding("x-gzip", terse)
    with pytest.raises(PayloadTooLarge, match=r"^gzip over 1024$"):
        inflate(gzip.compress(BOMB), "gzip", 1024, terse)


JSON_ISSUES = {
    "past-depth": ({"a": [[[1]]]}, 3, "depth", ("a", 0, 0), "body.a[0][0]"),
    "object-past-depth": ({"a": {"b": {"c": {}}}}, 3, "depth", ("a", "b", "c"), "body.a.b.c"),
    "lone-high-surrogate": ({"m": [{"c": "ok \ud800"}]}, 8, "text", ("m", 0, "c"),
                            "body.m[0].c"),
    "surrogate-in-key": ({"a": {"\udfff": 1}}, 8, "text", ("a", "\udfff"), None),
    "surrogate-in-scalar-list": ({"data": ["a", "b\udc80"]}, 8, "text", ("data", 1),
                                 "body.data[1]"),
}


@pytest.mark.parametrize("case", list(JSON_ISSUES))
def test_json_past_depth_or_holding_a_lone_surrogate_is_found_with_its_place(case: str) -> None:
    value, max_depth, kind, path, place = JSON_ISSUES[case]
    issue = find_issue(value, max_depth=max_depth)
    assert issue is not None and (issue.kind, issue.path) == (kind, path)
    if place is not None:
        assert issue.place() == place
    if kind == "depth":
        assert issue.depth == max_depth + 1
    else:
        assert issue.bad.encode("utf-8", "surrogatepass")  # the bad run is a surrogate


def test_json_within_limits_has_no_issue_and_its_depth_is_counted() -> None:
    value = {"inputs": [{"data": list(range(10_000)), "name": "é ✓ 𝄞"}]}
    assert find_issue(value, max_depth=4) is None
    assert find_issue(value, max_depth=3) is not None
    assert find_issue(value, max_depth=4, check_text=False) is None
    assert (depth_of(value), depth_of(1), depth_of([]), depth_of([[[]]], stop_past=1)) == (
        4, 0, 1, 2)
    assert depth_of(json.loads("[" * 500 + "]" * 500)) == 500


def test_only_an_escape_can_bring_a_surrogate_into_json_bytes() -> None:
    assert may_hold_surrogates(b'{"a": "\\ud800"}')
    assert may_hold_surrogates(b'{"a": "\\uDFFF"}')
    assert not may_hold_surrogates('{"a": "é \\u00e9"}'.encode())
